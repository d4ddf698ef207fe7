//! The conformance suite of the operation-level contract
//! ([`dedupkv::contract`]): a driver generic over the contract that runs
//! seeded random sequences of its calls against a backend and against the
//! specification below, and fails at the first answer they disagree on.
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
//! Each answer is told through both faces of [`Settle`]: the blocking
//! [`Settle::tell`] and, for every other call, the future of
//! [`Settle::settled`] run to completion on this thread; both must give
//! the same value.
//!
//! The specification is the contract's meaning for one key, stated as
//! plain data ([`Spec`]): `insert` is new unless the key has a live
//! record; `begin` starts attempt 1 on an absent or forgotten key, replays
//! an inserted or finished one, answers `InProgress` while a live lease
//! holds it, and otherwise starts the next attempt (interrupted when the
//! last one never answered); a finish is refused unless its claim is the
//! key's active one; `forget` refuses a key held by a live lease. The
//! full model (`model.rs`, `history.rs`) checks the engine far deeper
//! (crashes, eviction, the ordering calls); this suite is what any
//! backend of the contract must pass.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use dedupkv::contract::{Outcome, Pending, Read, Write};
use dedupkv::{
    Begin, BeginOptions, Claim, Error, Failure, Fingerprint, Forget, Key, ManualClock, State,
};

use crate::model::T0;

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
/// until the case ends.
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
    B: Write,
{
    for case in 0..suite.cases {
        let clock = ManualClock::new(T0);
        let (backend, _keep) =
            open(clock.clone()).map_err(|e| format!("case {case}: open failed: {e}"))?;
        let mut driver = Driver {
            backend: &backend,
            clock: &clock,
            spec: Spec::default(),
            claims: Vec::new(),
            rng: case.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            now: T0,
            calls: 0,
        };
        for step in 0..suite.steps {
            driver
                .step()
                .map_err(|e| format!("case {case}, step {step}: {e}"))?;
        }
    }
    Ok(())
}

/// What the specification holds for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Inserted,
    Claimed,
    Released,
    Completed,
    Failed,
    Forgotten,
}

#[derive(Clone, Debug)]
struct Rec {
    kind: Kind,
    fp: Fingerprint,
    attempt: u32,
    lease_until: u64,
    /// The last attempt never answered (its claim was dropped).
    abandoned: bool,
    outcome: Vec<u8>,
}

/// The specification: each key's latest record.
#[derive(Default, Debug)]
pub struct Spec {
    keys: HashMap<usize, Rec>,
}

/// What `begin` must answer.
#[derive(Debug, PartialEq, Eq)]
enum Want {
    Started {
        attempt: u32,
        interrupted: bool,
    },
    Replay {
        state: State,
        attempts: u32,
        outcome: Option<Vec<u8>>,
    },
    InProgress {
        attempt: u32,
    },
    Mismatch,
}

impl Spec {
    fn present(&self, k: usize) -> Option<&Rec> {
        self.keys.get(&k).filter(|r| r.kind != Kind::Forgotten)
    }

    fn insert(&mut self, k: usize) -> bool {
        if self.present(k).is_some() {
            return false;
        }
        self.keys.insert(
            k,
            Rec {
                kind: Kind::Inserted,
                fp: Fingerprint::NONE,
                attempt: 0,
                lease_until: 0,
                abandoned: false,
                outcome: Vec::new(),
            },
        );
        true
    }

    fn begin(&mut self, k: usize, fp: Fingerprint, now: u64) -> Want {
        let (attempt, interrupted) = match self.present(k) {
            None => (1, false),
            Some(r) if r.kind == Kind::Inserted => {
                return Want::Replay {
                    state: State::Inserted,
                    attempts: 0,
                    outcome: None,
                };
            }
            Some(r) if r.fp != fp => return Want::Mismatch,
            Some(r) if r.kind == Kind::Completed || r.kind == Kind::Failed => {
                return Want::Replay {
                    state: if r.kind == Kind::Completed {
                        State::Completed
                    } else {
                        State::Failed
                    },
                    attempts: r.attempt,
                    outcome: Some(r.outcome.clone()),
                };
            }
            Some(r) if r.kind == Kind::Claimed && now < r.lease_until => {
                return Want::InProgress { attempt: r.attempt };
            }
            Some(r) => (r.attempt + 1, r.kind == Kind::Claimed || r.abandoned),
        };
        self.keys.insert(
            k,
            Rec {
                kind: Kind::Claimed,
                fp,
                attempt,
                lease_until: now + LEASE_MS,
                abandoned: false,
                outcome: Vec::new(),
            },
        );
        Want::Started {
            attempt,
            interrupted,
        }
    }

    /// Whether attempt `attempt` of key `k` is its active claim.
    fn active(&self, k: usize, attempt: u32) -> bool {
        self.keys
            .get(&k)
            .is_some_and(|r| r.kind == Kind::Claimed && r.attempt == attempt)
    }

    /// Finishes the active claim `attempt` of `k` as `kind`; `false` if it
    /// is not the active one.
    fn finish(&mut self, k: usize, attempt: u32, kind: Kind, outcome: &[u8]) -> bool {
        if !self.active(k, attempt) {
            return false;
        }
        if let Some(r) = self.keys.get_mut(&k) {
            r.kind = kind;
            r.outcome = outcome.to_vec();
            r.abandoned = false;
        }
        true
    }

    fn dropped(&mut self, k: usize, attempt: u32) {
        if self.finish(k, attempt, Kind::Released, b"")
            && let Some(r) = self.keys.get_mut(&k)
        {
            r.abandoned = true;
        }
    }

    fn renew(&mut self, k: usize, attempt: u32, now: u64) -> Option<u64> {
        if !self.active(k, attempt) {
            return None;
        }
        let r = self.keys.get_mut(&k)?;
        r.lease_until = now + LEASE_MS;
        Some(r.lease_until)
    }

    /// `Some(true)`: forgotten; `Some(false)`: refused (held); `None`: not found.
    fn forget(&mut self, k: usize, now: u64) -> Option<bool> {
        let r = self.present(k)?;
        if r.kind == Kind::Claimed && now < r.lease_until {
            return Some(false);
        }
        if let Some(r) = self.keys.get_mut(&k) {
            r.kind = Kind::Forgotten;
        }
        Some(true)
    }

    fn state(&self, k: usize) -> Option<State> {
        self.keys.get(&k).map(|r| match r.kind {
            Kind::Inserted => State::Inserted,
            Kind::Claimed => State::InProgress,
            Kind::Released => State::Retryable,
            Kind::Completed => State::Completed,
            Kind::Failed => State::Failed,
            Kind::Forgotten => State::Forgotten,
        })
    }
}

struct Driver<'a, B> {
    backend: &'a B,
    clock: &'a ManualClock,
    spec: Spec,
    /// Claims held: (key, attempt, claim).
    claims: Vec<(usize, u32, Claim)>,
    rng: u64,
    now: u64,
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

/// Wakes the thread that runs a future to completion.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

impl<B: Write> Driver<'_, B> {
    fn next(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }

    /// Tells `pending`'s value through the blocking face or, every other
    /// call, the async one.
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
        match self.next(12) {
            0 => {
                let got = self.tell(Write::insert(self.backend, &key(k), None));
                let want = self.spec.insert(k);
                same(
                    &format!("insert k{k}"),
                    &got.map_err(|e| e.to_string()),
                    &Ok(want),
                )
            }
            1 => {
                let got = self.tell(Read::get(self.backend, &key(k)));
                let got = got.map(|r| r.map(|r| r.state())).map_err(|e| e.to_string());
                same(&format!("get k{k}"), &got, &Ok(self.spec.state(k)))
            }
            2..=4 => {
                let fp = fingerprint(self.next(2));
                let got = self.tell(Write::begin(
                    self.backend,
                    &key(k),
                    fp,
                    &BeginOptions::new(),
                    None,
                ));
                let want = self.spec.begin(k, fp, self.now);
                self.check_begin(k, got, &want)
            }
            5 | 6 => self.finish(),
            7 => {
                // Renew a held claim.
                let Some(i) = self.pick() else { return Ok(()) };
                let (k, attempt) = (self.claims[i].0, self.claims[i].1);
                let got = self.tell(Write::renew(self.backend, &self.claims[i].2, None));
                let want = self.spec.renew(k, attempt, self.now);
                match (got, want) {
                    (Ok(_), Some(_)) | (Err(Error::ClaimLost { .. }), None) => Ok(()),
                    (got, want) => Err(format!(
                        "renew k{k} attempt {attempt}: got {got:?}, want {want:?}"
                    )),
                }
            }
            8 => {
                let Some(i) = self.pick() else { return Ok(()) };
                let (k, attempt, claim) = self.claims.swap_remove(i);
                drop(claim);
                self.spec.dropped(k, attempt);
                Ok(())
            }
            9 => {
                let got = self.tell(Write::forget(self.backend, &key(k)));
                let want = self.spec.forget(k, self.now);
                match (got, want) {
                    (Ok(Forget::NotFound), None)
                    | (Ok(Forget::InProgress(_)), Some(false))
                    | (Ok(Forget::Forgotten(_)), Some(true)) => Ok(()),
                    (got, want) => Err(format!("forget k{k}: got {got:?}, want {want:?}")),
                }
            }
            10 => {
                let keys: Vec<_> = (0..3).map(|_| self.next(KEYS as u64) as usize).collect();
                let batch: Vec<_> = keys.iter().map(|&k| key(k)).collect();
                let got = self.tell(Write::insert_batch(self.backend, &batch));
                let want: Vec<_> = keys.iter().map(|&k| self.spec.insert(k)).collect();
                same("insert_batch", &got.map_err(|e| e.to_string()), &Ok(want))
            }
            _ => {
                let ms = [1_000, 10_000, LEASE_MS][self.next(3) as usize];
                self.clock.advance(Duration::from_millis(ms));
                self.now += ms;
                Ok(())
            }
        }
    }

    fn pick(&mut self) -> Option<usize> {
        if self.claims.is_empty() {
            return None;
        }
        Some(self.next(self.claims.len() as u64) as usize)
    }

    fn check_begin(
        &mut self,
        k: usize,
        got: dedupkv::Result<Begin>,
        want: &Want,
    ) -> Result<(), String> {
        let what = format!("begin k{k}");
        match (got, want) {
            (
                Ok(Begin::Started(c)),
                Want::Started {
                    attempt,
                    interrupted,
                },
            ) if c.attempt() == *attempt && c.interrupted() == *interrupted => {
                self.claims.push((k, *attempt, c));
                Ok(())
            }
            (
                Ok(Begin::Completed(r)),
                Want::Replay {
                    state,
                    attempts,
                    outcome,
                },
            ) if r.state() == *state
                && r.attempts() == *attempts
                && outcome
                    .as_ref()
                    .is_none_or(|o| r.outcome() == Some(o.as_slice())) =>
            {
                Ok(())
            }
            (Ok(Begin::InProgress(p)), Want::InProgress { attempt }) if p.attempt() == *attempt => {
                Ok(())
            }
            (Err(Error::FingerprintMismatch { .. }), Want::Mismatch) => Ok(()),
            (Ok(Begin::Started(c)), want) => Err(format!(
                "{what}: got Started {{ attempt: {}, interrupted: {} }}, want {want:?}",
                c.attempt(),
                c.interrupted()
            )),
            (got, want) => Err(format!("{what}: got {got:?}, want {want:?}")),
        }
    }

    /// Completes or fails a held claim (permanently or for a retry).
    fn finish(&mut self) -> Result<(), String> {
        let Some(i) = self.pick() else { return Ok(()) };
        let (k, attempt, claim) = self.claims.swap_remove(i);
        let how = self.next(3);
        let outcome = format!("out-{k}-{attempt}").into_bytes();
        let (got, kind) = match how {
            0 => (
                self.tell(Write::complete(
                    self.backend,
                    &claim,
                    Outcome::raw(&outcome),
                )),
                Kind::Completed,
            ),
            1 => (
                self.tell(Write::fail(
                    self.backend,
                    &claim,
                    Failure::Permanent(&outcome),
                )),
                Kind::Failed,
            ),
            _ => (
                self.tell(Write::fail(self.backend, &claim, Failure::Retryable)),
                Kind::Released,
            ),
        };
        let stored: &[u8] = if kind == Kind::Released {
            b""
        } else {
            &outcome
        };
        let want = self.spec.finish(k, attempt, kind.clone(), stored);
        match (got, want) {
            (Ok(()), true) | (Err(Error::ClaimLost { .. }), false) => Ok(()),
            (got, want) => Err(format!(
                "{kind:?} of k{k} attempt {attempt}: got {got:?}, want {}",
                if want { "Ok" } else { "ClaimLost" }
            )),
        }
    }
}

fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &T, want: &T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}
