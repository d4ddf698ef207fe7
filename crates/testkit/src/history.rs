//! A linearizability check of the store's concurrent calls, the way
//! Jepsen's Knossos and Porcupine check recorded histories.
//!
//! [`run`] starts a store with a manual clock (1 s leases, 5 s retention,
//! 1 s buckets) and several worker threads making every call — `begin`
//! and its options (per-call lease and retention, an intent),
//! `begin_batch`, `complete` and its variants (`complete_value`,
//! `complete_with_amount`, `complete_batch`), `fail` with every
//! [`Failure`](dedupkv::Failure), `renew`, dropped claims, `mark_sent`,
//! `forget`, `requeue`, `resolve`, `insert_if_absent`, `get`, `intent`,
//! the listings (`dead_letters`, `stranded_claims`, `pending_intents`),
//! and on entities `sequence`, `ack`, `advance` and `unacked` — on a few
//! keys, while a driver moves the clock, an evictor calls
//! `evict_expired` and `compact`, and a lister lists. Every call is
//! recorded with its invocation and response in one global order and the
//! clock's reading at both.
//!
//! Then each key (and entity) is checked on its own: there must be an
//! order of its calls, consistent with real time, that the model of
//! [`crate::model`] (the same per-key steps the proptest model runs)
//! accepts, each call at one of the clock readings it could have seen. A
//! listing counts as one call per key: an entry it shows must be the
//! key's state at some point of the call, and a key it leaves out must
//! not be listable then (unless the key was written meanwhile). Tokens
//! must grow across keys, and each provider key belong to one operation.
//! A call that panics, or does not return within [`Run::hang`], fails the
//! run naming it (a hang detector, not a speed bound).
//!
//! A failing key is printed as a short history: the shortest failing
//! prefix of its calls, without the observations and evictions the
//! failure does not need, the longest order the model accepts, and why
//! each call that could come next does not fit.

mod check;
mod record;
pub(crate) mod workload;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedupkv::{ManualClock, Store};

use crate::model::state::{End, Leave};
use crate::model::{ENTITY_RETENTION, T0, key};
use crate::{FaultBackend, tempdir};
use record::{Answer, Call, Recorder, Target};
use workload::{Worker, World};

/// One run's set-up.
///
/// # Examples
///
/// ```
/// use dedupkv_testkit::history::Run;
///
/// let run = Run { calls: 20, ..Run::seed(7) };
/// assert_eq!(run.seed, 7);
/// ```
#[derive(Debug, Clone)]
pub struct Run {
    /// Chooses every call (not the threads' interleaving, which is the
    /// machine's).
    pub seed: u64,
    /// Worker threads. Default: 6.
    pub workers: usize,
    /// Calls per worker. Default: 250.
    pub calls: usize,
    /// Keys of the model's pool used (at most 8, one scope). Default: 6.
    pub keys: usize,
    /// Entities used. Default: 2.
    pub entities: usize,
    /// A store file in a temporary directory, rather than an in-memory
    /// `FaultBackend`. Default: every fourth seed.
    pub file: bool,
    /// How long one call may take before the run fails as hung. Default:
    /// 20 s.
    pub hang: Duration,
    /// Released claims of other keys put in the store first (before a
    /// reopen). Default: 2000.
    pub filler: usize,
    /// Which mix of calls the workers make: 0 every call, 1 the
    /// dead-letter area (begin, exhaust, requeue, list), 2 claims against
    /// `forget`. Default: the seed's remainder by 3.
    pub mix: usize,
}

impl Run {
    /// The default run of `seed`.
    ///
    /// # Examples
    ///
    /// ```
    /// let run = dedupkv_testkit::history::Run::seed(3);
    /// assert!(run.file);
    /// ```
    pub fn seed(seed: u64) -> Run {
        Run {
            seed,
            workers: 6,
            calls: 250,
            keys: 6,
            entities: 2,
            file: seed % 4 == 3,
            hang: Duration::from_secs(20),
            filler: 2_000,
            mix: (seed % 3) as usize,
        }
    }
}

/// What a run that passed did.
///
/// # Examples
///
/// ```
/// use dedupkv_testkit::history::{Run, run};
///
/// let done = run(&Run { workers: 2, calls: 30, filler: 0, ..Run::seed(1) })?;
/// assert!(done.calls > 0);
/// # Ok::<(), dedupkv_testkit::history::Failure>(())
/// ```
#[derive(Debug, Clone)]
pub struct Summary {
    /// Calls recorded (a batch or a listing counts once per key).
    pub calls: usize,
    /// Keys and entities checked.
    pub targets: usize,
    /// How far the clock moved, in ms.
    pub clock_ms: u64,
    /// How long the run and its check took.
    pub took: Duration,
}

/// A run that failed: the seed and a readable report (a history, a hang,
/// a panic).
///
/// # Examples
///
/// ```
/// use dedupkv_testkit::history::{Run, run};
///
/// if let Err(failure) = run(&Run { workers: 2, calls: 10, filler: 0, ..Run::seed(2) }) {
///     eprintln!("{failure}");
/// }
/// ```
pub struct Failure {
    /// The run's seed.
    pub seed: u64,
    report: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.report)
    }
}

/// As `Display`, so a test returning `Result<(), Failure>` prints the
/// report readably.
impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.report)
    }
}

impl std::error::Error for Failure {}

/// Runs `r` and checks its history.
///
/// # Errors
///
/// A [`Failure`] naming the seed and what broke: a key whose calls no
/// order the model accepts explains (with the history), a call that hung
/// or panicked, an unexpected error, tallies that do not add up.
///
/// # Examples
///
/// See [`Summary`].
pub fn run(r: &Run) -> Result<Summary, Failure> {
    let start = Instant::now();
    let fail = |report: String| Failure {
        seed: r.seed,
        report: format!(
            "linearizability run, seed {} ({} workers × {} calls on {} keys, mix {}, {} store): \
             {report}\nreproduce the choices with DEDUPKV_LIN_SEEDS={}",
            r.seed,
            r.workers,
            r.calls,
            r.keys,
            r.mix,
            if r.file { "file" } else { "in-memory" },
            r.seed
        ),
    };
    let s = workload::settings(r.file);
    let clock = ManualClock::new(T0);
    let dir = tempdir();
    let store = open(r, &clock, dir.path()).map_err(|e| fail(format!("open: {e}")))?;
    let values = value_bytes(&store).map_err(|e| fail(format!("complete_value: {e}")))?;
    // Slots: the workers, the evictor, the lister, the end checks.
    let rec = Arc::new(Recorder::new(clock, r.workers + 3));
    let world = Arc::new(World {
        store,
        rec: Arc::clone(&rec),
        s,
        keys: r.keys.min(crate::model::IDS),
        entities: r.entities,
        values,
    });
    watch(r, &world).map_err(&fail)?;
    if let Some(msg) = rec.failure() {
        // The calls that returned still tell: check them too.
        let checked = check::check(&rec.take_events(), &s, &rec.times());
        return Err(fail(match checked {
            Ok(_) => msg,
            Err(more) => format!("{msg}\nand the calls that returned before it:\n{more}"),
        }));
    }
    end_checks(&world, r.workers + 2).map_err(&fail)?;
    let events = rec.take_events();
    let times = rec.times();
    let checked = check::check(&events, &s, &times).map_err(&fail)?;
    tallies(&world, &events).map_err(&fail)?;
    Ok(Summary {
        calls: events.len(),
        targets: checked.targets,
        clock_ms: rec.now() - T0,
        took: start.elapsed(),
    })
}

/// The run's store: its clock, 4 or 16 shards, whole or small log rows
/// (by seed), in a file in `dir` or in memory. Opened first with an hour's
/// retention to take `r.filler` released claims of other keys (scope
/// `fill`), as a store in production holds: every listing then walks them,
/// shard by shard, while the run's writes go on.
fn open(r: &Run, clock: &ManualClock, dir: &std::path::Path) -> dedupkv::Result<Store> {
    let s = workload::settings(r.file);
    let builder = || {
        Store::builder()
            .clock(clock.clone())
            // More shards make a listing's pass over them longer.
            .shards(if (r.seed / 2).is_multiple_of(2) {
                4
            } else {
                16
            })
            .background_eviction(false)
            .lease(Duration::from_millis(s.lease))
            .handback_lease(Duration::from_millis(s.lease))
            .bucket_granularity(Duration::from_millis(s.granularity))
            .entity_retention(Duration::from_millis(ENTITY_RETENTION))
            .max_hold(Duration::from_secs(10 * 365 * 86_400))
            // Rows of a few records on some seeds: more rows, more row edges.
            .row_split_bytes([256 << 20, 512, 4_096][((r.seed / 3) % 3) as usize])
    };
    let backend = FaultBackend::new();
    let open = |b: dedupkv::StoreBuilder| {
        if r.file {
            b.open(dir.join("lin.redb"))
        } else {
            b.open_with_backend(backend.clone())
        }
    };
    if r.filler > 0 {
        let store = open(builder().retention(Duration::from_secs(3_600)))?;
        let keys: Vec<(dedupkv::Key<'static>, dedupkv::Fingerprint)> = (0..r.filler)
            .map(|i| {
                let id = format!("f{i}").into_bytes();
                (
                    dedupkv::Key::owned(b"fill".to_vec(), id),
                    dedupkv::Fingerprint::NONE,
                )
            })
            .collect();
        // Dropped unfinished: released, their details kept for the retry;
        // closing the store commits the releases.
        drop(store.begin_batch(&keys)?);
    }
    open(builder().retention(Duration::from_millis(s.retention)))
}

/// Runs the workers and the driver, evictor and lister, and watches them:
/// stops the helpers once the workers are done; fails if a call hangs
/// (leaving its threads running: they cannot be joined).
fn watch(r: &Run, world: &Arc<World>) -> Result<(), String> {
    let rec = &world.rec;
    let mut handles = Vec::new();
    for i in 0..r.workers {
        let world = Arc::clone(world);
        let seed = r.seed.wrapping_mul(1_000).wrapping_add(i as u64);
        let (calls, mix) = (r.calls, r.mix);
        handles.push(std::thread::spawn(move || {
            let name: &'static str = WORKER_NAMES.get(i).copied().unwrap_or("w");
            Worker::new(&world, (i, name), mix, seed).run(calls);
        }));
    }
    let helpers = {
        let (w1, w2, rec) = (Arc::clone(world), Arc::clone(world), Arc::clone(rec));
        let (evictor, lister) = (r.workers, r.workers + 1);
        let seed = r.seed;
        vec![
            std::thread::spawn(move || workload::drive(&rec, seed)),
            std::thread::spawn(move || workload::evict(&w1, evictor)),
            std::thread::spawn(move || workload::lister(&w2, lister)),
        ]
    };
    loop {
        if let Some((_, what, took)) = rec.hung(r.hang) {
            rec.fail(String::new());
            return Err(format!(
                "hang: `{what}` has not returned after {} s (threads are left running; \
                 this is a hang detector, not a speed bound)\nstats: {:?}",
                took.as_secs(),
                world.store.stats()
            ));
        }
        if handles.iter().all(std::thread::JoinHandle::is_finished) {
            rec.stop();
        }
        if handles
            .iter()
            .chain(&helpers)
            .all(std::thread::JoinHandle::is_finished)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for h in handles.into_iter().chain(helpers) {
        if h.join().is_err() {
            rec.fail("a thread of the run panicked outside a store call".to_owned());
        }
    }
    Ok(())
}

/// The outcome bytes `complete_value` stores for 0, 1 and 2 (the codec's
/// business, so asked of the store, on keys of scope `fill`).
fn value_bytes(store: &Store) -> dedupkv::Result<[Vec<u8>; 3]> {
    let mut out: [Vec<u8>; 3] = Default::default();
    for (n, bytes) in (0u32..).zip(out.iter_mut()) {
        let k = dedupkv::Key::owned(b"fill".to_vec(), format!("value{n}").into_bytes());
        let claim = crate::started(store.begin(&k, dedupkv::Fingerprint::NONE)?);
        store.complete_value(&claim, &n)?;
        *bytes = store
            .get(&k)?
            .and_then(|r| r.outcome().map(<[u8]>::to_vec))
            .unwrap_or_default();
    }
    Ok(out)
}

const WORKER_NAMES: [&str; 16] = [
    "w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10", "w11", "w12", "w13", "w14",
    "w15",
];

/// With the run quiet: every key's `get`, `intent` and the three listings
/// once more (now a key left out must not be listable), recorded.
fn end_checks(w: &World, slot: usize) -> Result<(), String> {
    let rec = &w.rec;
    for k in 0..w.keys {
        for (name, call) in [("get", Call::Get), ("intent", Call::Intent)] {
            let Some((got, span)) = rec.call(
                slot,
                || format!("end: {name} of key {}", key(k)),
                || match call {
                    Call::Get => w.store.get(&key(k)).map(Answer::Record),
                    _ => w.store.intent(&key(k)).map(Answer::Intent),
                },
            ) else {
                break;
            };
            let answer = got.map_err(|e| format!("end: {name} of key {} failed: {e}", key(k)))?;
            rec.push(("end", name), Target::Key(k), call, answer, span);
        }
    }
    for which in 0..3 {
        workload::list(w, (slot, "end"), which);
    }
    rec.failure().map_or(Ok(()), Err)
}

/// Each scope's tallies, summed over windows, count every completion the
/// history acknowledged (complete and its variants, `resolve` with
/// `Completed`) and add up their amounts.
fn tallies(w: &World, events: &[record::Event]) -> Result<(), String> {
    let mut want: BTreeMap<Vec<u8>, (u64, i128)> = BTreeMap::new();
    for e in events {
        let Target::Key(k) = e.target else { continue };
        let amount = match (&e.call, &e.answer) {
            (
                Call::Finish {
                    end: End::Complete(_),
                    amount,
                    ..
                },
                Answer::Unit(Ok(())),
            ) => *amount,
            (Call::Leave(Leave::Completed(_)), Answer::Bool(true)) => 0,
            _ => continue,
        };
        let t = want.entry(key(k).scope().to_vec()).or_default();
        t.0 += 1;
        t.1 += i128::from(amount);
    }
    for (scope, (count, sum)) in want {
        let got = w
            .store
            .tallies(&scope)
            .map_err(|e| format!("tallies failed: {e}"))?;
        let (c, a) = got
            .iter()
            .fold((0, 0), |(c, a), t| (c + t.count, a + t.amount));
        if (c, a) != (count, sum) {
            return Err(format!(
                "tallies of scope {:?}: {c} completions, amount {a}; the history acknowledged \
                 {count}, amount {sum}",
                String::from_utf8_lossy(&scope)
            ));
        }
    }
    Ok(())
}
