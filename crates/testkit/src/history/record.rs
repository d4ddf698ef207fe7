//! Recording a concurrent history: each call's invocation and response get
//! a place in one global order (an atomic counter read before the call and
//! after it returns) and the clock's reading at both ends; a call that
//! panics or never returns is a failure naming it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dedupkv::{Advance, DeadLetter, Forget, IntentEntry, ManualClock, Record, Sequenced, Unacked};
use parking_lot::Mutex;

use crate::model::state::{BeginReq, Begun, End, Leave, Refusal};
use crate::model::{T0, key};

/// What a call was about: a key or an entity of the pool, by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Target {
    Key(usize),
    Entity(usize),
}

/// One call, as one key or entity saw it. A batch is one call per item,
/// a listing one call per key of the pool, an eviction too.
#[derive(Debug)]
pub(crate) enum Call {
    Insert,
    Begin(BeginReq),
    /// `amount` counts in the tallies if a completion succeeds.
    Finish {
        token: u64,
        end: End,
        amount: i64,
    },
    Renew {
        token: u64,
        by: Option<u64>,
    },
    Drop {
        token: u64,
    },
    MarkSent {
        token: u64,
        provider: String,
        reference: Vec<u8>,
    },
    Get,
    Intent,
    Forget,
    Leave(Leave),
    ListDeadLetters,
    ListStranded,
    ListPendingIntents,
    /// `evict_expired` closing the expired buckets to writers.
    CloseBuckets,
    /// `evict_expired`'s pass over the expired buckets.
    Evict,
    Sequence {
        seq: u64,
        payload: Vec<u8>,
    },
    Ack {
        upto: u64,
    },
    Advance {
        version: u64,
    },
    Unacked,
}

impl Call {
    /// Whether the call only reads: no answer of it changes the state.
    pub(crate) fn reads(&self) -> bool {
        matches!(
            self,
            Call::Get
                | Call::Intent
                | Call::ListDeadLetters
                | Call::ListStranded
                | Call::ListPendingIntents
                | Call::Unacked
        )
    }
}

/// A call's answer.
#[derive(Debug)]
pub(crate) enum Answer {
    None,
    Bool(bool),
    Begun(Begun),
    Unit(Result<(), Refusal>),
    Renewed(Result<SystemTime, Refusal>),
    Record(Option<Record>),
    Intent(Option<IntentEntry>),
    Forget(Forget),
    DeadLetter(Option<DeadLetter>),
    Stranded(Option<Record>),
    PendingIntent(Option<IntentEntry>),
    Sequenced(Sequenced),
    Acked(usize),
    Advanced(Advance),
    Unacked(Vec<Unacked>),
    /// An error where the model expects none.
    Refused(Refusal),
}

/// Where a call sits in the history: its invocation and response in the
/// global order, and the clock's reading (ms) at both.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub(crate) inv: u64,
    pub(crate) resp: u64,
    pub(crate) t_inv: u64,
    pub(crate) t_resp: u64,
}

/// One recorded call.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) id: usize,
    /// The thread that made it ("w2", "lister", "end").
    pub(crate) thread: &'static str,
    /// The store call it was part of (`begin_batch`, `dead_letters`).
    pub(crate) name: &'static str,
    pub(crate) target: Target,
    pub(crate) call: Call,
    pub(crate) answer: Answer,
    pub(crate) span: Span,
}

/// The shared recorder: the global order, the clock and every value the
/// driver gave it, the events, what each thread is in the middle of, and
/// the first failure.
pub(crate) struct Recorder {
    pub(crate) clock: ManualClock,
    seq: AtomicU64,
    /// Every reading the clock has had, ascending.
    times: Mutex<Vec<u64>>,
    events: Mutex<Vec<Event>>,
    /// Per thread: since when, and which call, it is inside the store.
    inflight: Mutex<Vec<Option<(Instant, String)>>>,
    failure: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Recorder {
    pub(crate) fn new(clock: ManualClock, threads: usize) -> Recorder {
        let now = dedupkv::Clock::now_millis(&clock);
        Recorder {
            clock,
            seq: AtomicU64::new(0),
            times: Mutex::new(vec![now]),
            events: Mutex::new(Vec::new()),
            inflight: Mutex::new(vec![None; threads]),
            failure: Mutex::new(None),
            stop: AtomicBool::new(false),
        }
    }

    /// The clock's reading, in ms.
    pub(crate) fn now(&self) -> u64 {
        dedupkv::Clock::now_millis(&self.clock)
    }

    /// Moves the clock `ms` forward (the driver's job: the only writer).
    pub(crate) fn advance(&self, ms: u64) {
        let to = self.now() + ms;
        // Listed before it is readable, so every reading a call can see
        // is a candidate.
        self.times.lock().push(to);
        self.clock.advance(Duration::from_millis(ms));
    }

    /// How many invocations and responses there have been.
    pub(crate) fn progress(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    /// Every reading the clock has had, ascending.
    pub(crate) fn times(&self) -> Vec<u64> {
        self.times.lock().clone()
    }

    /// Runs `f` as the store call `what` of thread `slot`, and returns its
    /// value with its span; `None` if it panicked (recorded as the
    /// failure).
    pub(crate) fn call<T>(
        &self,
        slot: usize,
        what: impl FnOnce() -> String,
        f: impl FnOnce() -> T,
    ) -> Option<(T, Span)> {
        let what = what();
        self.inflight.lock()[slot] = Some((Instant::now(), what.clone()));
        let inv = self.seq.fetch_add(1, Ordering::SeqCst);
        let t_inv = self.now();
        let out = catch_unwind(AssertUnwindSafe(f));
        let t_resp = self.now();
        let resp = self.seq.fetch_add(1, Ordering::SeqCst);
        self.inflight.lock()[slot] = None;
        match out {
            Ok(v) => Some((
                v,
                Span {
                    inv,
                    resp,
                    t_inv,
                    t_resp,
                },
            )),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                self.fail(format!(
                    "{what} panicked (at +{} ms): {msg}",
                    t_inv.saturating_sub(T0)
                ));
                None
            }
        }
    }

    /// Records one call of `target`.
    pub(crate) fn push(
        &self,
        (thread, name): (&'static str, &'static str),
        target: Target,
        call: Call,
        answer: Answer,
        span: Span,
    ) {
        let mut events = self.events.lock();
        let id = events.len();
        events.push(Event {
            id,
            thread,
            name,
            target,
            call,
            answer,
            span,
        });
    }

    /// Records the run's failure (the first one counts) and stops it.
    pub(crate) fn fail(&self, msg: String) {
        self.failure.lock().get_or_insert(msg);
        self.stop();
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// A call that has been inside the store longer than `bound`: which
    /// thread slot, the call, and for how long.
    pub(crate) fn hung(&self, bound: Duration) -> Option<(usize, String, Duration)> {
        let inflight = self.inflight.lock();
        inflight.iter().enumerate().find_map(|(slot, c)| {
            let (since, what) = c.as_ref()?;
            let took = since.elapsed();
            (took > bound).then(|| (slot, what.clone(), took))
        })
    }

    /// The recorded events (the recorder is done with).
    pub(crate) fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock())
    }
}

/// `k`'s name, as a listing or an error shows it.
pub(crate) fn key_name(k: usize) -> String {
    key(k).to_string()
}

/// A store time as ms after the run's start.
pub(crate) fn rel(t: SystemTime) -> i128 {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_millis()).unwrap_or(i128::MAX));
    ms - i128::from(T0)
}
