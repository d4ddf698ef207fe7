//! The conformance suite of the operation-level contract
//! ([`dedupkv::contract`]): a driver generic over the contract that runs
//! seeded random sequences of its calls against a backend and, side by
//! side, against the specification ([`Spec`], itself an in-memory
//! implementation of the contract), and fails at the first answer they
//! disagree on.
//!
//! A backend passes the suite, or does not land. Running it is one call:
//!
//! ```
//! use dedupkv::Store;
//! use dedupkv_testkit::conformance;
//!
//! conformance::run(|clock| {
//!     let dir = dedupkv_testkit::tempdir();
//!     let store = Store::builder().clock(clock).open(dir.path().join("s.redb"))?;
//!     Ok((store, dir)) // the directory lives as long as the store
//! }, conformance::Suite { cases: 2, steps: 50 })
//! .unwrap();
//! ```
//!
//! What a backend must do to be driven: start empty, take its time from
//! the given [`ManualClock`] (so leases lapse when the driver moves it),
//! and keep the store's defaults that the specification assumes
//! ([`LEASE_MS`], a retention of at least [`MIN_RETENTION_MS`]).
//!
//! After each case's sequence, 8 threads race on fresh keys, 20 rounds:
//! exactly one is told `Started` per key, the others `InProgress`, and
//! once the winner completes every racer's `begin` replays its outcome
//! (so a backend must be `Sync`, its claims `Send`).
//!
//! [`history()`] is the concurrent half: 8 threads make the contract's
//! calls at once on a few keys while the clock moves between rounds (by a
//! whole lease, often), and each key's recorded calls must have an order,
//! consistent with real time, in which [`Spec`] answers as the backend
//! did: races, lease takeovers and zombies' refused `complete`s included.
//!
//! Each answer is told through both faces of [`Settle`]: the blocking
//! [`Settle::tell`] and, for every other call, the future of
//! [`Settle::settled`] run to completion on this thread; both must give
//! the same value.
//!
//! The specification ([`Spec`], `conformance/spec.rs`) states the
//! contract's meaning per key; the driver compares what both answer as
//! plain views (which variant, attempt, interruption, state, attempts,
//! outcome, lease end, which error), never a backend's tokens, times of
//! its own or provider keys. The full model (`model.rs`, `history.rs`)
//! checks the engine far deeper (crashes, eviction, the ordering calls);
//! this suite is what any backend of the contract must pass.

use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, SystemTime};

use dedupkv::contract::{Handle, Outcome, Pending, Read, Settle, Write};
use dedupkv::{
    Began, BeginOptions, Error, Failure, Fingerprint, Forget, Key, ManualClock, Record, State,
};

use crate::model::T0;

mod history;
mod intents;
mod order;
mod spec;
mod tallies;

use crate::history::workload::Rng;

pub use history::{Checked, History, histories, history};
pub use intents::{Listings, intent_histories, intents};
pub use order::{HANDBACK_LEASE_MS, MAX_HOLD_MS, sequencer, versions};
pub use spec::{Spec, SpecClaim};
pub use tallies::{key_reconciliation, tallies};

/// The claim lease the specification assumes (the store's default).
pub const LEASE_MS: u64 = 30_000;
/// The shortest retention the specification assumes (no record expires
/// within a case).
pub const MIN_RETENTION_MS: u64 = 86_400_000;
const KEYS: usize = 4;

/// How much to run.
///
/// # Examples
/// ```
/// let suite = dedupkv_testkit::conformance::Suite::default();
/// assert!(suite.cases > 0);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Suite {
    /// Cases, each a fresh backend and its own seed (0, 1, ...).
    pub cases: u64,
    /// Calls per case.
    pub steps: usize,
}

impl Default for Suite {
    fn default() -> Self {
        Suite {
            cases: 16,
            steps: 200,
        }
    }
}

/// Runs the suite: `open` makes a fresh, empty backend whose time is the
/// clock it is given; what else it returns (a temporary directory) is kept
/// until the case ends. Each case also runs on a fresh [`Spec`] on the
/// same clock, and every answer of the backend must be the spec's.
///
/// # Errors
/// The first disagreement with the specification, naming the case, the
/// step, the call and both answers.
///
/// # Examples
/// See the [module](self).
pub fn run<B, G>(
    mut open: impl FnMut(ManualClock) -> dedupkv::Result<(B, G)>,
    suite: Suite,
) -> Result<(), String>
where
    B: Write + Sync,
    B::Claim: Send,
{
    for case in 0..suite.cases {
        let clock = ManualClock::new(T0);
        let (backend, _keep) =
            open(clock.clone()).map_err(|e| format!("case {case}: open failed: {e}"))?;
        let spec = Spec::new(clock.clone());
        let mut driver = Driver {
            backend: &backend,
            spec: &spec,
            clock: &clock,
            claims: Vec::new(),
            rng: Rng::new(case.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
            calls: 0,
        };
        for step in 0..suite.steps {
            driver
                .step()
                .map_err(|e| format!("case {case}, step {step}: {e}"))?;
        }
        drop(driver);
        race(&backend, case).map_err(|e| format!("case {case}, race: {e}"))?;
    }
    Ok(())
}

/// Threads that race on one key each round.
const RACERS: usize = 8;
const ROUNDS: usize = 20;

/// [`RACERS`] threads begin the same fresh key at once, [`ROUNDS`] times:
/// exactly one is told `Started` and the others `InProgress`; the winner
/// completes, and then every racer's `begin` replays its outcome.
fn race<B>(backend: &B, case: u64) -> Result<(), String>
where
    B: Write + Sync,
    B::Claim: Send,
{
    let barrier = std::sync::Barrier::new(RACERS);
    let keys: Vec<Key<'static>> = (0..ROUNDS)
        .map(|r| Key::owned(b"race".to_vec(), format!("c{case}-r{r}").into_bytes()))
        .collect();
    let begin = |key: &Key<'_>| {
        backend
            .begin(key, Fingerprint::NONE, &BeginOptions::new(), None)
            .and_then(|p| backend.tell(p))
    };
    // Each racer reaches every barrier whatever it is told, so one
    // failing racer fails the run instead of hanging the others.
    let answers: Vec<Result<Vec<BeginView>, String>> = std::thread::scope(|s| {
        let racers: Vec<_> = (0..RACERS)
            .map(|_| {
                s.spawn(|| {
                    let mut seen = Vec::with_capacity(ROUNDS);
                    let mut failed = None;
                    for key in &keys {
                        barrier.wait();
                        let answer = begin(key);
                        seen.push(view(&answer, begin_view));
                        barrier.wait();
                        if let Ok(Began::Started(claim)) = answer
                            && let Err(e) = backend
                                .complete(&claim, Outcome::raw(key.id()))
                                .and_then(|p| backend.tell(p))
                        {
                            failed = Some(format!("complete of {key:?}: {e}"));
                        }
                        barrier.wait();
                        let again = view(&begin(key), begin_view);
                        let done = (State::Completed, 1, Some(key.id().to_vec()));
                        if again != Ok(BeginView::Completed(done)) {
                            failed = Some(format!("begin of {key:?} after the race: {again:?}"));
                        }
                    }
                    match failed {
                        Some(e) => Err(e),
                        None => seen.into_iter().collect(),
                    }
                })
            })
            .collect();
        racers
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("a racer panicked".into())))
            .collect()
    });
    let answers = answers.into_iter().collect::<Result<Vec<_>, String>>()?;
    for (r, key) in keys.iter().enumerate() {
        let started = answers
            .iter()
            .filter(|seen| {
                matches!(
                    seen[r],
                    BeginView::Started {
                        attempt: 1,
                        interrupted: false
                    }
                )
            })
            .count();
        let waiting = answers
            .iter()
            .filter(|seen| matches!(seen[r], BeginView::InProgress { attempt: 1, .. }))
            .count();
        if started != 1 || waiting != RACERS - 1 {
            return Err(format!(
                "{key:?}: {started} racers started it and {waiting} saw it in progress; want 1 \
                 and {}",
                RACERS - 1
            ));
        }
    }
    Ok(())
}

/// A record as compared: state, attempts, outcome.
type RecordView = (State, u32, Option<Vec<u8>>);

fn record_view(r: &Record) -> RecordView {
    (r.state(), r.attempts(), r.outcome().map(<[u8]>::to_vec))
}

/// An answer of `begin` as compared.
#[derive(Clone, Debug, PartialEq, Eq)]
enum BeginView {
    Started { attempt: u32, interrupted: bool },
    Completed(RecordView),
    InProgress { attempt: u32, lease_end: SystemTime },
    DeadLettered,
}

fn begin_views<C: Handle>(all: &[dedupkv::Result<Began<C>>]) -> Vec<Result<BeginView, String>> {
    all.iter().map(|r| view(r, begin_view)).collect()
}

fn begin_view<C: Handle>(b: &Began<C>) -> BeginView {
    match b {
        Began::Started(c) => BeginView::Started {
            attempt: c.attempt(),
            interrupted: c.interrupted(),
        },
        Began::Completed(r) => BeginView::Completed(record_view(r)),
        Began::InProgress(p) => BeginView::InProgress {
            attempt: p.attempt(),
            lease_end: p.lease_expires_at(),
        },
        Began::DeadLettered(_) => BeginView::DeadLettered,
    }
}

/// An error as compared: which one, not its wording.
fn error_view(e: &Error) -> String {
    match e {
        Error::ClaimLost { .. } => "ClaimLost".into(),
        Error::FingerprintMismatch { .. } => "FingerprintMismatch".into(),
        other => format!("{other}"),
    }
}

fn view<T, V>(r: &dedupkv::Result<T>, f: impl FnOnce(&T) -> V) -> Result<V, String> {
    r.as_ref().map(f).map_err(error_view)
}

fn forget_view(f: &Forget) -> String {
    match f {
        Forget::Forgotten(r) => format!("Forgotten({:?})", record_view(r)),
        Forget::InProgress(p) => format!("InProgress({})", p.attempt()),
        _ => "NotFound".into(),
    }
}

/// One held attempt: the key, the backend's claim and the spec's.
struct Held<C> {
    key: usize,
    claim: C,
    spec: SpecClaim,
}

struct Driver<'a, B: Write> {
    backend: &'a B,
    spec: &'a Spec,
    clock: &'a ManualClock,
    claims: Vec<Held<B::Claim>>,
    rng: Rng,
    calls: u64,
}

fn key(k: usize) -> Key<'static> {
    Key::owned(b"conf".to_vec(), format!("k{k}").into_bytes())
}

fn fingerprint(f: u64) -> Fingerprint {
    if f == 0 {
        Fingerprint::NONE
    } else {
        Fingerprint::of("params-1")
    }
}

/// The specification's answer: settled when given.
fn told<T>(spec: &Spec, r: dedupkv::Result<Pending<T>>) -> dedupkv::Result<T> {
    r.and_then(|p| spec.tell(p))
}

/// Wakes the thread that runs a future to completion.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn same<V: PartialEq + std::fmt::Debug>(what: &str, got: &V, want: &V) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{what}: the backend answered {got:?}, the specification {want:?}"
        ))
    }
}

impl<B: Write> Driver<'_, B> {
    fn next(&mut self, n: u64) -> u64 {
        self.rng.next() % n
    }

    /// Tells the backend's `pending` value through the blocking face or,
    /// every other call, the async one.
    fn tell<T>(&mut self, pending: dedupkv::Result<Pending<T>>) -> dedupkv::Result<T> {
        let pending = pending?;
        self.calls += 1;
        if self.calls.is_multiple_of(2) {
            return self.backend.tell(pending);
        }
        let (value, basis) = pending.into_parts();
        let mut fut = std::pin::pin!(self.backend.settled(basis));
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                r?;
                return Ok(value);
            }
            std::thread::park_timeout(Duration::from_millis(50));
        }
    }

    fn step(&mut self) -> Result<(), String> {
        let k = self.next(KEYS as u64) as usize;
        let (backend, spec) = (self.backend, self.spec);
        match self.next(14) {
            0 => {
                let got = self.tell(backend.insert(&key(k), None));
                let want = told(spec, spec.insert(&key(k), None));
                same(
                    &format!("insert k{k}"),
                    &view(&got, |v| *v),
                    &view(&want, |v| *v),
                )
            }
            1 => {
                let got = self.tell(backend.get(&key(k)));
                let want = told(spec, spec.get(&key(k)));
                let v = |r: &Option<Record>| r.as_ref().map(record_view);
                same(&format!("get k{k}"), &view(&got, v), &view(&want, v))
            }
            2..=4 => {
                let fp = fingerprint(self.next(2));
                let opts = BeginOptions::new();
                let got = self.tell(backend.begin(&key(k), fp, &opts, None));
                let want = told(spec, spec.begin(&key(k), fp, &opts, None));
                same(
                    &format!("begin k{k}"),
                    &view(&got, begin_view),
                    &view(&want, begin_view),
                )?;
                if let (Ok(Began::Started(claim)), Ok(Began::Started(spec))) = (got, want) {
                    self.claims.push(Held {
                        key: k,
                        claim,
                        spec,
                    });
                }
                Ok(())
            }
            5 | 6 => self.finish(),
            7 => {
                let Some(i) = self.pick() else { return Ok(()) };
                let by = [None, Some(Duration::from_secs(45))][self.next(2) as usize];
                let h = &self.claims[i];
                let (what, want) = (
                    format!("renew k{} attempt {} by {by:?}", h.key, h.spec.attempt()),
                    told(spec, spec.renew(&h.spec, by)),
                );
                let pending = backend.renew(&self.claims[i].claim, by);
                let got = self.tell(pending);
                same(&what, &view(&got, |t| *t), &view(&want, |t| *t))
            }
            8 => {
                // A dropped claim: both release the key.
                let Some(i) = self.pick() else { return Ok(()) };
                drop(self.claims.swap_remove(i));
                Ok(())
            }
            9 => {
                let got = self.tell(backend.forget(&key(k)));
                let want = told(spec, spec.forget(&key(k)));
                same(
                    &format!("forget k{k}"),
                    &view(&got, forget_view),
                    &view(&want, forget_view),
                )
            }
            10 => {
                let keys: Vec<_> = (0..3)
                    .map(|_| key(self.next(KEYS as u64) as usize))
                    .collect();
                let got = self.tell(backend.insert_batch(&keys));
                let want = told(spec, spec.insert_batch(&keys));
                same(
                    "insert_batch",
                    &view(&got, Clone::clone),
                    &view(&want, Clone::clone),
                )
            }
            11 => self.begin_batch(),
            12 => self.complete_batch(),
            _ => {
                // Lease ends are met exactly as often as passed.
                let ms = [1, 1_000, 10_000, LEASE_MS - 1, LEASE_MS][self.next(5) as usize];
                self.clock.advance(Duration::from_millis(ms));
                Ok(())
            }
        }
    }

    /// `begin_batch` of three random keys, each with a random fingerprint.
    fn begin_batch(&mut self) -> Result<(), String> {
        let items: Vec<(usize, Fingerprint)> = (0..3)
            .map(|_| {
                let k = self.next(KEYS as u64) as usize;
                (k, fingerprint(self.next(2)))
            })
            .collect();
        let batch: Vec<_> = items.iter().map(|&(k, f)| (key(k), f)).collect();
        let (backend, spec) = (self.backend, self.spec);
        let got = self.tell(backend.begin_batch(&batch));
        let want = told(spec, spec.begin_batch(&batch));
        let got_v = view(&got, |a| begin_views(a));
        let want_v = view(&want, |a| begin_views(a));
        same(&format!("begin_batch {items:?}"), &got_v, &want_v)?;
        if let (Ok(got), Ok(want)) = (got, want) {
            for ((g, w), (k, _)) in got.into_iter().zip(want).zip(items) {
                if let (Ok(Began::Started(claim)), Ok(Began::Started(spec))) = (g, w) {
                    self.claims.push(Held {
                        key: k,
                        claim,
                        spec,
                    });
                }
            }
        }
        Ok(())
    }

    /// `complete_batch` of up to three held claims.
    fn complete_batch(&mut self) -> Result<(), String> {
        let n = self.next(3) as usize + 1;
        let mut held = Vec::new();
        while held.len() < n {
            let Some(i) = self.pick() else { break };
            held.push(self.claims.swap_remove(i));
        }
        let outcomes: Vec<Vec<u8>> = held
            .iter()
            .map(|h| format!("batch-{}-{}", h.key, h.spec.attempt()).into_bytes())
            .collect();
        let ours: Vec<_> = held
            .iter()
            .zip(&outcomes)
            .map(|(h, o)| (&h.claim, &o[..]))
            .collect();
        let theirs: Vec<_> = held
            .iter()
            .zip(&outcomes)
            .map(|(h, o)| (&h.spec, &o[..]))
            .collect();
        let (backend, spec) = (self.backend, self.spec);
        let got = self.tell(backend.complete_batch(&ours));
        let want = told(spec, spec.complete_batch(&theirs));
        let views = |all: &Vec<dedupkv::Result<()>>| -> Vec<_> {
            all.iter().map(|r| view(r, |()| ())).collect()
        };
        let what: Vec<_> = held.iter().map(|h| (h.key, h.spec.attempt())).collect();
        same(
            &format!("complete_batch {what:?}"),
            &view(&got, |a| views(a)),
            &view(&want, |a| views(a)),
        )
    }

    fn pick(&mut self) -> Option<usize> {
        if self.claims.is_empty() {
            return None;
        }
        Some(self.next(self.claims.len() as u64) as usize)
    }

    /// Completes or fails a held claim (permanently or for a retry).
    fn finish(&mut self) -> Result<(), String> {
        let Some(i) = self.pick() else { return Ok(()) };
        let h = self.claims.swap_remove(i);
        let outcome = format!("out-{}-{}", h.key, h.spec.attempt()).into_bytes();
        let (b, s) = (self.backend, self.spec);
        let (what, got, want) = match self.next(3) {
            0 => (
                "complete",
                b.complete(&h.claim, Outcome::raw(&outcome)),
                s.complete(&h.spec, Outcome::raw(&outcome)),
            ),
            1 => (
                "fail (permanent)",
                b.fail(&h.claim, Failure::Permanent(&outcome)),
                s.fail(&h.spec, Failure::Permanent(&outcome)),
            ),
            _ => (
                "fail (retryable)",
                b.fail(&h.claim, Failure::Retryable),
                s.fail(&h.spec, Failure::Retryable),
            ),
        };
        let got = self.tell(got);
        let want = told(s, want);
        let what = format!("{what} of k{} attempt {}", h.key, h.spec.attempt());
        same(&what, &view(&got, |()| ()), &view(&want, |()| ()))
    }
}
