//! The specification: the operation-level contract's meaning, as an
//! in-memory implementation of the contract itself. Every answer is
//! settled when given (nothing to make durable); a dropped claim releases
//! its key at once, as the engine's does.
//!
//! Per key, its latest record: `insert` is new unless the key has a
//! present record (a forgotten one is absent); `begin` starts attempt 1
//! on an absent key, replays an inserted or finished one, refuses
//! another fingerprint (after a retryable release too), answers
//! `InProgress` while a live lease holds it, and otherwise starts the
//! next attempt, interrupted when the last one never answered; a finish
//! or renewal is refused (`ClaimLost`) unless its claim is the key's
//! active one (by its fencing token: an attempt number repeats after a
//! forget), lease lapsed or not; a renewal with its own lease makes it
//! the claim's lease for later ones; `forget` refuses a key held by a
//! live lease. No record expires: the driver keeps its cases well inside the
//! retention it requires.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::contract::{Basis, BegunBatch, Handle, Outcome, Pending, Read, Settle, Write};
use dedupkv::{
    Began, BeginOptions, Clock, Error, Failure, Fingerprint, Forget, InProgress, Intent, Key,
    ManualClock, Record, Result, State,
};
use parking_lot::Mutex;

use super::LEASE_MS;

#[derive(Clone, Debug)]
struct Rec {
    state: State,
    fp: Fingerprint,
    attempt: u32,
    /// The fencing token of the attempt that wrote it: a claim is the
    /// key's active one only with this token (an attempt number repeats
    /// after a forget).
    token: u64,
    first_at: u64,
    lease_until: u64,
    /// The claim's lease, which a renewal without its own extends by
    /// (`renew` with a lease makes that the claim's).
    lease_ms: u64,
    /// The last attempt never answered (its claim was dropped).
    abandoned: bool,
    outcome: Vec<u8>,
}

#[derive(Clone, Debug, Default)]
struct Keys {
    recs: HashMap<Key<'static>, Rec>,
    /// The last fencing token given out.
    token: u64,
}

type Shared = Mutex<Keys>;

/// The specification, as a backend of the contract: each key's latest
/// record in a map, time from a [`ManualClock`].
///
/// # Examples
/// ```
/// use dedupkv::contract::{Settle, Write};
/// use dedupkv::{Key, ManualClock};
/// use dedupkv_testkit::conformance::Spec;
///
/// let spec = Spec::new(ManualClock::new(1_700_000_000_000));
/// assert!(spec.tell(spec.insert(&Key::new("t", "a"), None)?)?);
/// assert!(!spec.tell(spec.insert(&Key::new("t", "a"), None)?)?);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug)]
pub struct Spec {
    clock: ManualClock,
    keys: Arc<Shared>,
}

/// A started attempt of the specification. Dropped unfinished, it
/// releases its key (the next attempt is interrupted).
#[derive(Debug)]
pub struct SpecClaim {
    key: Key<'static>,
    attempt: u32,
    token: u64,
    interrupted: bool,
    keys: Weak<Shared>,
}

impl Handle for SpecClaim {
    fn key(&self) -> &Key<'static> {
        &self.key
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn interrupted(&self) -> bool {
        self.interrupted
    }
}

impl Drop for SpecClaim {
    fn drop(&mut self) {
        if let Some(keys) = self.keys.upgrade() {
            release(&keys, &self.key, self.token);
        }
    }
}

/// What a dropped claim does: an unfinished, active one releases its key
/// (the next attempt is interrupted).
fn release(keys: &Shared, key: &Key<'static>, token: u64) {
    if let Some(r) = keys.lock().recs.get_mut(key)
        && r.state == State::InProgress
        && r.token == token
    {
        r.state = State::Retryable;
        r.abandoned = true;
    }
}

/// A claim of the specification as the history check keeps it between
/// the calls it replays: no handle, so nothing is released when the
/// check drops it.
#[derive(Clone, Debug)]
pub(super) struct Detached {
    key: Key<'static>,
    attempt: u32,
    token: u64,
    interrupted: bool,
}

impl SpecClaim {
    /// The claim without its handle: dropping what is returned releases
    /// nothing (the history check drops claims only when a drop is
    /// replayed, by [`Spec::release`]).
    pub(super) fn detach(mut self) -> Detached {
        self.keys = Weak::new();
        Detached {
            key: self.key.clone(),
            attempt: self.attempt,
            token: self.token,
            interrupted: self.interrupted,
        }
    }
}

impl Detached {
    /// A handle for one replayed call; dropped, it releases nothing.
    pub(super) fn claim(&self) -> SpecClaim {
        SpecClaim {
            key: self.key.clone(),
            attempt: self.attempt,
            token: self.token,
            interrupted: self.interrupted,
            keys: Weak::new(),
        }
    }
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn record(key: &Key<'static>, r: &Rec) -> Record {
    let rec = Record::new(key.clone(), r.state).with_attempts(r.attempt);
    match r.state {
        State::Completed | State::Failed => rec.with_outcome(r.outcome.clone()),
        _ => rec,
    }
}

fn lost(claim: &SpecClaim) -> Error {
    Error::ClaimLost {
        key: format!("{:?}", claim.key),
        attempt: claim.attempt,
        token: 0,
        reason: "another attempt holds the key, or this one finished",
    }
}

impl Spec {
    /// An empty specification whose time is `clock`'s.
    ///
    /// # Examples
    /// See [`Spec`].
    pub fn new(clock: ManualClock) -> Spec {
        Spec {
            clock,
            keys: Arc::default(),
        }
    }

    fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    /// A copy of the records whose time is `now` (ms since the epoch) on a
    /// clock of its own: the history check tries each order of calls on
    /// a copy.
    pub(super) fn fork_at(&self, now: u64) -> Spec {
        Spec {
            clock: ManualClock::new(now),
            keys: Arc::new(Mutex::new(self.keys.lock().clone())),
        }
    }

    /// A fork of this specification at its own time.
    pub(super) fn fork(&self) -> Spec {
        self.fork_at(self.now())
    }

    /// The records, as text that is equal for equal records (the history
    /// check keeps each distinct state once).
    pub(super) fn digest(&self) -> String {
        let keys = self.keys.lock();
        let mut recs: Vec<_> = keys.recs.iter().collect();
        recs.sort_by(|a, b| (a.0.scope(), a.0.id()).cmp(&(b.0.scope(), b.0.id())));
        format!("{recs:?}")
    }

    /// What dropping `claim`'s handle does.
    pub(super) fn release(&self, claim: &Detached) {
        release(&self.keys, &claim.key, claim.token);
    }

    /// Finishes the active attempt `claim` as `state` with `outcome`.
    fn finish(&self, claim: &SpecClaim, state: State, outcome: &[u8]) -> Result<Pending<()>> {
        let mut keys = self.keys.lock();
        match keys.recs.get_mut(&claim.key) {
            Some(r) if r.state == State::InProgress && r.token == claim.token => {
                r.state = state;
                r.outcome = outcome.to_vec();
                r.abandoned = false;
                Ok(Pending::settled(()))
            }
            _ => Err(lost(claim)),
        }
    }

    fn begin_one(&self, key: &Key<'_>, fp: Fingerprint, lease_ms: u64) -> Result<Began<SpecClaim>> {
        let key = key.clone().into_owned();
        let now = self.now();
        let mut keys = self.keys.lock();
        let present = keys.recs.get(&key).filter(|r| r.state != State::Forgotten);
        let (attempt, first_at, interrupted) = match present {
            None => (1, now, false),
            Some(r) if r.state == State::Inserted => {
                return Ok(Began::Completed(record(&key, r)));
            }
            Some(r) if r.fp != fp => {
                return Err(Error::FingerprintMismatch {
                    key: format!("{key:?}"),
                    recorded: r.fp,
                    requested: fp,
                });
            }
            Some(r) if matches!(r.state, State::Completed | State::Failed) => {
                return Ok(Began::Completed(record(&key, r)));
            }
            Some(r) if r.state == State::InProgress && now < r.lease_until => {
                return Ok(Began::InProgress(InProgress::new(
                    r.attempt,
                    at(r.lease_until),
                    at(r.first_at),
                )));
            }
            Some(r) => (
                r.attempt + 1,
                r.first_at,
                r.state == State::InProgress || r.abandoned,
            ),
        };
        keys.token += 1;
        let token = keys.token;
        keys.recs.insert(
            key.clone(),
            Rec {
                state: State::InProgress,
                fp,
                attempt,
                token,
                first_at,
                lease_until: now + lease_ms,
                lease_ms,
                abandoned: false,
                outcome: Vec::new(),
            },
        );
        Ok(Began::Started(SpecClaim {
            key,
            attempt,
            token,
            interrupted,
            keys: Arc::downgrade(&self.keys),
        }))
    }

    fn insert_one(&self, key: &Key<'_>) -> bool {
        let mut keys = self.keys.lock();
        if keys
            .recs
            .get(key)
            .is_some_and(|r| r.state != State::Forgotten)
        {
            return false;
        }
        keys.recs.insert(
            key.clone().into_owned(),
            Rec {
                state: State::Inserted,
                fp: Fingerprint::NONE,
                attempt: 0,
                token: 0,
                first_at: self.now(),
                lease_until: 0,
                lease_ms: 0,
                abandoned: false,
                outcome: Vec::new(),
            },
        );
        true
    }
}

impl Settle for Spec {
    type Waiter = ();

    fn wait(&self, _basis: Basis) -> Result<()> {
        Ok(())
    }

    fn poll_settled(&self, _: Basis, (): &mut (), _: &mut Context<'_>) -> Poll<Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn stop_waiting(&self, (): &mut ()) {}
}

impl Read for Spec {
    fn get(&self, key: &Key<'_>) -> Result<Pending<Option<Record>>> {
        let key = key.clone().into_owned();
        let keys = self.keys.lock();
        Ok(Pending::settled(
            keys.recs.get(&key).map(|r| record(&key, r)),
        ))
    }
}

impl Write for Spec {
    type Claim = SpecClaim;

    fn insert(&self, key: &Key<'_>, _retention: Option<Duration>) -> Result<Pending<bool>> {
        Ok(Pending::settled(self.insert_one(key)))
    }

    fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Pending<Vec<bool>>> {
        Ok(Pending::settled(
            keys.iter().map(|k| self.insert_one(k)).collect(),
        ))
    }

    fn forget(&self, key: &Key<'_>) -> Result<Pending<Forget>> {
        let key = key.clone().into_owned();
        let now = self.now();
        let mut keys = self.keys.lock();
        let Some(r) = keys
            .recs
            .get_mut(&key)
            .filter(|r| r.state != State::Forgotten)
        else {
            return Ok(Pending::settled(Forget::NotFound));
        };
        if r.state == State::InProgress && now < r.lease_until {
            let busy = InProgress::new(r.attempt, at(r.lease_until), at(r.first_at));
            return Ok(Pending::settled(Forget::InProgress(busy)));
        }
        let old = record(&key, r);
        r.state = State::Forgotten;
        r.abandoned = false;
        Ok(Pending::settled(Forget::Forgotten(old)))
    }

    fn begin(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        _options: &BeginOptions,
        _intent: Option<Intent<'_>>,
    ) -> Result<Pending<Began<SpecClaim>>> {
        self.begin_one(key, fingerprint, LEASE_MS)
            .map(Pending::settled)
    }

    fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<BegunBatch<SpecClaim>> {
        Ok(Pending::settled(
            items
                .iter()
                .map(|(k, fp)| self.begin_one(k, *fp, LEASE_MS))
                .collect(),
        ))
    }

    fn complete(&self, claim: &SpecClaim, outcome: Outcome<'_>) -> Result<Pending<()>> {
        self.finish(claim, State::Completed, outcome.bytes())
    }

    fn complete_batch(&self, items: &[(&SpecClaim, &[u8])]) -> Result<Pending<Vec<Result<()>>>> {
        Ok(Pending::settled(
            items
                .iter()
                .map(|(c, o)| self.finish(c, State::Completed, o).map(|_| ()))
                .collect(),
        ))
    }

    fn fail(&self, claim: &SpecClaim, failure: Failure<'_>) -> Result<Pending<()>> {
        // Dead letters and `RetryableAnyRequest`'s freed fingerprint are
        // not specified here yet (the driver does not make them): both
        // release the key like a retryable failure.
        match failure {
            Failure::Permanent(payload) => self.finish(claim, State::Failed, payload),
            _ => self.finish(claim, State::Retryable, b""),
        }
    }

    fn renew(&self, claim: &SpecClaim, by: Option<Duration>) -> Result<Pending<SystemTime>> {
        let now = self.now();
        let mut keys = self.keys.lock();
        match keys.recs.get_mut(&claim.key) {
            Some(r) if r.state == State::InProgress && r.token == claim.token => {
                let ms = by.map_or(r.lease_ms, |d| {
                    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
                });
                r.lease_ms = ms;
                r.lease_until = now + ms;
                Ok(Pending::settled(at(r.lease_until)))
            }
            _ => Err(lost(claim)),
        }
    }
}
