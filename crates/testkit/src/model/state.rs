//! One key's and one entity's state in the model, and the steps that check
//! one call's answer against it and apply the call.
//!
//! The sequential harness (`model.rs`) and the linearizability checker
//! (`history.rs`) both step these, so the two share one statement of what
//! every call must answer. A step takes the time the store read (`now`);
//! the harness knows it, the checker tries every clock reading within the
//! call. Nothing here holds a claim handle or a store: answers come in as
//! values ([`Begun`], [`Refusal`]), so a recorded history can be replayed
//! in any order.
//!
//! Keys are independent: no step reads another key's state. What spans
//! keys — tokens above every earlier one, provider keys unique per
//! operation, tallies per scope — is checked by the callers.

use std::collections::BTreeMap;
use std::time::SystemTime;

use dedupkv::{
    Advance, Begin, Claim, DeadLetter, Error, Fingerprint, Forget, Handling, InProgress,
    IntentEntry, Record, Sequenced, State, Unacked,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::{ENTITY_RETENTION, Settings, TestResult, at, key};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Inserted,
    Claimed,
    Released,
    Completed,
    Failed,
    Forgotten,
    DeadLettered,
}

/// The latest record of a key, as the model expects `get` to report it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MRec {
    pub(crate) kind: Kind,
    pub(crate) fp: Fingerprint,
    pub(crate) attempt: u32,
    pub(crate) token: u64,
    pub(crate) first_at: u64,
    pub(crate) at: u64,
    pub(crate) expires: u64,
    pub(crate) bucket: u64,
    pub(crate) lease_until: u64,
    pub(crate) outcome: Vec<u8>,
    /// Released by a dropped claim: the next attempt is interrupted.
    pub(crate) abandoned: bool,
    /// Released by `Failure::RetryableAnyRequest`: the next attempt may
    /// bring another fingerprint.
    pub(crate) any: bool,
    /// The claim's lease (what `renew` extends by) and the operation's
    /// retention, for a claimed or released key. For a dead letter, the
    /// retention its requeue or resolution is written for: the
    /// operation's, and after a reopen its record's (`expires - at`).
    pub(crate) lease_ms: u64,
    pub(crate) retention_ms: u64,
    /// A dead letter's last failure time and payload (its reason is
    /// `outcome`).
    pub(crate) failed_at: u64,
    pub(crate) payload: Option<Vec<u8>>,
    /// The provider key the operation's claims have (`None` for an
    /// inserted key).
    pub(crate) provider: Option<String>,
}

impl MRec {
    pub(crate) fn inserted(now: u64) -> MRec {
        MRec {
            kind: Kind::Inserted,
            fp: Fingerprint::NONE,
            attempt: 0,
            token: 0,
            first_at: now,
            at: now,
            expires: 0,
            bucket: 0,
            lease_until: 0,
            outcome: Vec::new(),
            abandoned: false,
            any: false,
            lease_ms: 0,
            retention_ms: 0,
            failed_at: 0,
            payload: None,
            provider: None,
        }
    }

    /// A key recorded by `insert_if_absent`, or forgotten after it, is no
    /// operation: it has no fingerprint and no provider key.
    fn is_operation(&self) -> bool {
        match self.kind {
            Kind::Inserted => false,
            Kind::Forgotten => self.attempt > 0,
            _ => true,
        }
    }
}

/// A key's intent, as the model expects `intent` to report it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MIntent {
    /// Settled: the provider's answer (here always an acceptance,
    /// `mark_sent`) is recorded and no earlier call's fate is open.
    pub(crate) sent: bool,
    /// An earlier attempt's call got no recorded answer.
    pub(crate) open: bool,
    /// The first reference the provider gave the operation.
    pub(crate) reference: Option<Vec<u8>>,
    /// A duplicate candidate: a second reference, or an acceptance after
    /// a call of open fate.
    pub(crate) doubt: bool,
    pub(crate) target: String,
    /// The request while pending, the reference once sent.
    pub(crate) data: Vec<u8>,
    /// The provider key and attempt of the claim that last wrote it.
    pub(crate) provider: String,
    pub(crate) attempt: u32,
    pub(crate) recorded_at: u64,
    /// The bucket of its latest record.
    pub(crate) bucket: u64,
}

// ----------------------------------------------------------------- answers

/// A refused call, as far as the model tells refusals apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    ClaimLost,
    Mismatch {
        recorded: Fingerprint,
        requested: Fingerprint,
    },
    InvalidArgument,
    /// Anything else: never an answer the model expects.
    Other(String),
}

impl Refusal {
    pub(crate) fn of(e: &Error) -> Refusal {
        match e {
            Error::ClaimLost { .. } => Refusal::ClaimLost,
            Error::FingerprintMismatch {
                recorded,
                requested,
                ..
            } => Refusal::Mismatch {
                recorded: *recorded,
                requested: *requested,
            },
            Error::InvalidArgument { .. } => Refusal::InvalidArgument,
            other => Refusal::Other(other.to_string()),
        }
    }
}

/// `r` as the model compares it: its value, or its refusal.
pub(crate) fn answer<T: Clone>(r: &dedupkv::Result<T>) -> Result<T, Refusal> {
    match r {
        Ok(v) => Ok(v.clone()),
        Err(e) => Err(Refusal::of(e)),
    }
}

/// A claim as `begin` handed it out, without the handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimInfo {
    pub(crate) attempt: u32,
    pub(crate) interrupted: bool,
    pub(crate) token: u64,
    pub(crate) lease_until: SystemTime,
    pub(crate) first_seen: SystemTime,
    pub(crate) provider_key: String,
    pub(crate) unanswered_intent: bool,
}

impl ClaimInfo {
    pub(crate) fn of(c: &Claim) -> ClaimInfo {
        ClaimInfo {
            attempt: c.attempt(),
            interrupted: c.interrupted(),
            token: c.token(),
            lease_until: c.lease_expires_at(),
            first_seen: c.first_seen_at(),
            // Kept already (begin waited for it): a failure shows as a mismatch.
            provider_key: c
                .provider_key()
                .unwrap_or_else(|e| format!("(no provider key: {e})")),
            unanswered_intent: c.unanswered_intent(),
        }
    }
}

/// `begin`'s answer without the claim handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Begun {
    Started(ClaimInfo),
    Completed(Record),
    InProgress(InProgress),
    DeadLettered(DeadLetter),
    Refused(Refusal),
}

impl Begun {
    pub(crate) fn of(r: &dedupkv::Result<Begin>) -> Begun {
        match r {
            Ok(Begin::Started(c)) => Begun::Started(ClaimInfo::of(c)),
            Ok(Begin::Completed(rec)) => Begun::Completed(rec.clone()),
            Ok(Begin::InProgress(i)) => Begun::InProgress(*i),
            Ok(Begin::DeadLettered(d)) => Begun::DeadLettered(d.clone()),
            Err(e) => Begun::Refused(Refusal::of(e)),
        }
    }
}

/// What a `begin` asks for: the fingerprint, the operation's (lease,
/// retention) in ms, and the intent (target, request) to record.
#[derive(Debug, Clone)]
pub(crate) struct BeginReq {
    pub(crate) fp: Fingerprint,
    pub(crate) lease_ms: u64,
    pub(crate) retention_ms: u64,
    pub(crate) intent: Option<(String, Vec<u8>)>,
}

/// A `begin` that started an attempt, as the model numbered it.
pub(crate) struct Started {
    pub(crate) attempt: u32,
    pub(crate) first_at: u64,
    /// The attempt brought another fingerprint after `RetryableAnyRequest`:
    /// a new provider operation.
    pub(crate) corrected: bool,
}

/// How a claim is finished.
#[derive(Debug, Clone)]
pub(crate) enum End {
    Complete(Vec<u8>),
    Retryable,
    AnyRequest,
    Permanent(Vec<u8>),
    Exhausted {
        reason: String,
        payload: Option<Vec<u8>>,
    },
}

/// How a dead letter leaves: `requeue`, or `resolve` with an outcome or a
/// note.
#[derive(Debug, Clone)]
pub(crate) enum Leave {
    Requeue,
    Completed(Vec<u8>),
    Abandoned(String),
}

fn want_ok<T: std::fmt::Debug>(got: &Result<T, Refusal>, what: &str, k: usize) -> TestResult {
    match got {
        Ok(_) => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!(
            "{what} of key {k}: unexpected error: {e:?}"
        ))),
    }
}

// --------------------------------------------------------------- key state

/// One key of the model: its latest record and its intent, and the last
/// bucket an eviction has closed to writers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct KeyState {
    pub(crate) rec: Option<MRec>,
    pub(crate) intent: Option<MIntent>,
    /// Eviction closes the buckets it is about to delete: a record whose
    /// bucket is one of them (a write that read the time before the
    /// eviction did) goes to the next one, its expiry widened to match.
    pub(crate) closed: u64,
}

impl KeyState {
    /// A key the store never saw.
    pub(crate) const EMPTY: KeyState = KeyState {
        rec: None,
        intent: None,
        closed: 0,
    };

    /// The bucket a record of natural bucket `b` goes to, and the
    /// expiry `expires` widened to it.
    fn writable(&self, s: &Settings, b: u64, expires: u64) -> (u64, u64) {
        if b > self.closed {
            return (b, expires);
        }
        let open = self.closed + 1;
        (open, expires.max(open * s.granularity))
    }

    /// The key's latest record, if it has not expired: what `get` answers.
    pub(crate) fn live(&self, s: &Settings, now: u64) -> Option<&MRec> {
        self.rec
            .as_ref()
            .filter(|r| r.kind == Kind::DeadLettered || now / s.granularity <= r.bucket)
    }

    /// The key's latest record if the key is present: live and not
    /// forgotten.
    pub(crate) fn present(&self, s: &Settings, now: u64) -> Option<&MRec> {
        self.live(s, now).filter(|r| r.kind != Kind::Forgotten)
    }

    /// A new operation's first-attempt time: now, but after a forgotten
    /// operation's (so the two never share a provider key).
    fn first_at_after_forget(&self, s: &Settings, now: u64) -> u64 {
        self.live(s, now)
            .filter(|r| r.kind == Kind::Forgotten)
            .map_or(now, |r| now.max(r.first_at + 1))
    }

    /// The bucket of the key's forget record, if that is live: a new record
    /// of the key goes no earlier.
    pub(crate) fn forgotten_bucket(&self, s: &Settings, now: u64) -> Option<u64> {
        self.live(s, now)
            .filter(|r| r.kind == Kind::Forgotten)
            .map(|r| r.bucket)
    }

    /// Stores `rec` as the key's latest record, written at `now` with the
    /// natural expiry `expires`; its bucket never moves before `prev`.
    pub(crate) fn write(
        &mut self,
        s: &Settings,
        mut rec: MRec,
        now: u64,
        expires: u64,
        prev: Option<u64>,
    ) {
        let g = s.granularity;
        rec.at = now;
        rec.expires = expires;
        rec.bucket = expires / g;
        if let Some(pb) = prev
            && pb > rec.bucket
        {
            rec.bucket = pb;
            rec.expires = rec.expires.max(pb * g);
        }
        (rec.bucket, rec.expires) = self.writable(s, rec.bucket, rec.expires);
        self.rec = Some(rec);
    }

    /// The operation finished (complete, permanent failure, resolution): a
    /// pending intent is closed, a sent one stays.
    fn close_pending_intent(&mut self) {
        if self.intent.as_ref().is_some_and(|i| !i.sent) {
            self.intent = None;
        }
    }

    /// The key's record if claim `token` is still its active claim
    /// (`None`: a handle of a store that was closed).
    pub(crate) fn active(&self, s: &Settings, now: u64, token: Option<u64>) -> Option<MRec> {
        let token = token?;
        self.live(s, now)
            .filter(|r| r.kind == Kind::Claimed && r.token == token)
            .cloned()
    }

    /// Re-logs a dead letter whose bucket expired at `now`, as eviction
    /// (`at_open` false: for the longer of its own retention and the
    /// store's) and open (`true`: the store's, which its requeue then uses)
    /// do.
    pub(crate) fn carry_dead_letter(&mut self, s: &Settings, now: u64, at_open: bool) {
        let Some(r) = self.rec.as_mut() else { return };
        if r.kind != Kind::DeadLettered || now / s.granularity <= r.bucket {
            return;
        }
        let retention = if at_open {
            r.retention_ms = s.retention;
            s.retention
        } else {
            r.retention_ms.max(s.retention)
        };
        r.at = now;
        r.expires = now + retention;
        r.bucket = r.expires / s.granularity;
    }

    /// What eviction at `now` does to the key: it closes the expired
    /// buckets to writers, then an expired record leaves the index (a dead
    /// letter is carried instead), a pending intent of an expired bucket
    /// is re-logged for the store's retention and a sent one goes.
    pub(crate) fn evicted(&mut self, s: &Settings, now: u64) {
        self.close(s, now);
        self.evict_pass(s, now);
    }

    /// Eviction at `now` closes the buckets before the current one.
    pub(crate) fn close(&mut self, s: &Settings, now: u64) {
        self.closed = self.closed.max((now / s.granularity).saturating_sub(1));
    }

    /// Eviction's pass over the key's expired buckets at `now`.
    pub(crate) fn evict_pass(&mut self, s: &Settings, now: u64) {
        self.carry_dead_letter(s, now, false);
        self.expire(s, now);
    }

    /// What eviction and an open do to what expired by `now`, but the dead
    /// letter (carried by the caller).
    pub(crate) fn expire(&mut self, s: &Settings, now: u64) {
        let nb = now / s.granularity;
        if self
            .rec
            .as_ref()
            .is_some_and(|r| r.kind != Kind::DeadLettered && r.bucket < nb)
        {
            self.rec = None;
        }
        if self
            .intent
            .as_ref()
            .is_some_and(|i| i.bucket < nb && i.sent)
        {
            self.intent = None;
        }
        if let Some(i) = self.intent.as_mut()
            && i.bucket < nb
        {
            i.bucket = (now + s.retention) / s.granularity;
        }
    }

    /// `insert_if_absent` answered `got` at `now`.
    pub(crate) fn insert(&mut self, s: &Settings, k: usize, now: u64, got: bool) -> TestResult {
        let want = self.present(s, now).is_none();
        prop_assert_eq!(got, want, "insert_if_absent of key {}", k);
        if want {
            self.inserted(s, now);
        }
        Ok(())
    }

    /// Records the key, absent at `now`, as inserted.
    pub(crate) fn inserted(&mut self, s: &Settings, now: u64) {
        let prev = self.forgotten_bucket(s, now);
        self.write(s, MRec::inserted(now), now, now + s.retention, prev);
    }

    /// `begin` of `req` answered `got` at `now`; claims with tokens up to
    /// `run_floor` belong to a process that is gone. Returns the attempt
    /// it started, if any (the caller checks what spans keys: tokens and
    /// provider keys).
    pub(crate) fn begin(
        &mut self,
        s: &Settings,
        k: usize,
        now: u64,
        req: &BeginReq,
        got: &Begun,
        run_floor: u64,
    ) -> TestResult<Option<Started>> {
        let prev = self.present(s, now).cloned();
        let Some((attempt, first_at, prev_bucket)) =
            self.begin_decided(s, (k, now), req.fp, got, run_floor)?
        else {
            return Ok(None);
        };
        let fp = req.fp;
        let interrupted = prev
            .as_ref()
            .is_some_and(|r| r.kind == Kind::Claimed || r.abandoned);
        let Begun::Started(claim) = got else {
            return Err(TestCaseError::fail(format!(
                "begin on key {k} (model {prev:?}): want Started, got {got:?}"
            )));
        };
        let lease_until = now + req.lease_ms;
        prop_assert_eq!(claim.attempt, attempt, "attempt of key {}", k);
        prop_assert_eq!(claim.interrupted, interrupted, "interrupted, key {}", k);
        prop_assert_eq!(claim.lease_until, at(lease_until), "lease of key {}", k);
        prop_assert_eq!(claim.first_seen, at(first_at), "first attempt of key {}", k);
        if let Some(r) = &self.rec {
            prop_assert!(
                claim.token > r.token,
                "token {} of key {} not above its record's {}",
                claim.token,
                k,
                r.token
            );
        }
        let corrected = prev.as_ref().is_some_and(|r| r.fp != fp);
        if let Some(known) = prev.as_ref().and_then(|r| r.provider.as_ref())
            && !corrected
        {
            prop_assert_eq!(
                &claim.provider_key,
                known,
                "provider key of attempt {} of key {}",
                attempt,
                k
            );
        }
        self.started_intent(s, k, claim, (now, req.retention_ms), req.intent.clone())?;
        let rec = MRec {
            kind: Kind::Claimed,
            fp,
            attempt,
            token: claim.token,
            first_at,
            lease_until,
            lease_ms: req.lease_ms,
            retention_ms: req.retention_ms,
            provider: Some(claim.provider_key.clone()),
            ..MRec::inserted(now)
        };
        let expires = (now + req.retention_ms).max(lease_until);
        self.write(s, rec, now, expires, prev_bucket);
        Ok(Some(Started {
            attempt,
            first_at,
            corrected,
        }))
    }

    /// What `begin` at `now` finds: the (attempt, first-attempt time,
    /// bucket floor) of the attempt it must start, or `None` when it must
    /// answer without one (and `got` is that answer).
    fn begin_decided(
        &self,
        s: &Settings,
        (k, now): (usize, u64),
        fp: Fingerprint,
        got: &Begun,
        run_floor: u64,
    ) -> TestResult<Option<(u32, u64, Option<u64>)>> {
        let prev = self.present(s, now);
        Ok(Some(match prev {
            // A new operation; after a forget, first claimed no earlier
            // than a millisecond after the forgotten one (so its provider
            // key differs).
            None => (
                1,
                self.first_at_after_forget(s, now),
                self.forgotten_bucket(s, now),
            ),
            Some(r) if r.kind == Kind::Inserted => {
                let Begun::Completed(rec) = got else {
                    return Err(TestCaseError::fail(format!(
                        "begin on inserted key {k}: want Completed, got {got:?}"
                    )));
                };
                check_record(k, rec, r)?;
                return Ok(None);
            }
            Some(r) if r.fp != fp && !(r.kind == Kind::Released && r.any) => {
                let Begun::Refused(Refusal::Mismatch {
                    recorded,
                    requested,
                }) = got
                else {
                    return Err(TestCaseError::fail(format!(
                        "begin on key {k} with another fingerprint: got {got:?}"
                    )));
                };
                prop_assert_eq!(*recorded, r.fp);
                prop_assert_eq!(*requested, fp);
                return Ok(None);
            }
            Some(r) if matches!(r.kind, Kind::Completed | Kind::Failed) => {
                let Begun::Completed(rec) = got else {
                    return Err(TestCaseError::fail(format!(
                        "begin on finished key {k}: want Completed, got {got:?}"
                    )));
                };
                check_record(k, rec, r)?;
                return Ok(None);
            }
            Some(r) if r.kind == Kind::DeadLettered => {
                let Begun::DeadLettered(dl) = got else {
                    return Err(TestCaseError::fail(format!(
                        "begin on dead-lettered key {k} (model {r:?}): want DeadLettered, \
                         got {got:?}"
                    )));
                };
                check_dead_letter(k, dl, r)?;
                return Ok(None);
            }
            Some(r) if r.kind == Kind::Claimed && now < r.lease_until && r.token > run_floor => {
                let Begun::InProgress(info) = got else {
                    return Err(TestCaseError::fail(format!(
                        "begin on claimed key {k}: want InProgress, got {got:?}"
                    )));
                };
                prop_assert_eq!(info.attempt(), r.attempt);
                prop_assert_eq!(info.lease_expires_at(), at(r.lease_until));
                prop_assert_eq!(info.first_seen_at(), at(r.first_at));
                return Ok(None);
            }
            // Released (with this fingerprint, or any after
            // `RetryableAnyRequest`), or claimed with a lapsed lease or by
            // a process that is gone: a new attempt, with this fingerprint.
            Some(r) => (r.attempt + 1, r.first_at, Some(r.bucket)),
        }))
    }

    /// A `Started` claim says whether a pending intent was there, and
    /// records `intent` (target, request), keeping a pending one's
    /// first-recorded time, for the operation's retention.
    fn started_intent(
        &mut self,
        s: &Settings,
        k: usize,
        claim: &ClaimInfo,
        (now, retention_ms): (u64, u64),
        intent: Option<(String, Vec<u8>)>,
    ) -> TestResult {
        let pending = self.intent.as_ref().filter(|i| !i.sent);
        prop_assert_eq!(
            claim.unanswered_intent,
            pending.is_some(),
            "unanswered_intent of key {} (model {:?})",
            k,
            self.intent
        );
        if let Some((target, data)) = intent {
            let natural = ((now + retention_ms) / s.granularity)
                .max(self.intent.as_ref().map_or(0, |i| i.bucket));
            let bucket = self.writable(s, natural, 0).0;
            let recorded_at = pending.map_or(now, |i| i.recorded_at);
            // The calls so far: a new operation starts afresh (an earlier
            // one's unanswered call stays open); a later attempt keeps the
            // reference and doubt, its predecessor's call open if
            // unanswered.
            let (reference, doubt) = match &self.intent {
                Some(e) if claim.attempt > 1 => (e.reference.clone(), e.doubt),
                _ => (None, false),
            };
            self.intent = Some(MIntent {
                sent: false,
                open: pending.is_some(),
                reference,
                doubt,
                target,
                data,
                provider: claim.provider_key.clone(),
                attempt: claim.attempt,
                recorded_at,
                bucket,
            });
        }
        Ok(())
    }

    /// Finishing claim `token` as `end` answered `got` at `now` (an
    /// exhausted failure read the clock at `failed_at`); returns whether
    /// it wrote.
    pub(crate) fn finish(
        &mut self,
        s: &Settings,
        (k, now, token): (usize, u64, Option<u64>),
        end: &End,
        failed_at: u64,
        got: &Result<(), Refusal>,
    ) -> TestResult<bool> {
        let Some(prev) = self.active(s, now, token) else {
            prop_assert!(
                matches!(got, Err(Refusal::ClaimLost)),
                "{:?} with a stale claim on key {}: got {:?}",
                end,
                k,
                got
            );
            return Ok(false);
        };
        want_ok(got, "complete/fail", k)?;
        let (kind, outcome, any) = match end {
            End::Complete(o) => (Kind::Completed, o.clone(), false),
            End::Permanent(p) => (Kind::Failed, p.clone(), false),
            End::Retryable => (Kind::Released, Vec::new(), false),
            End::AnyRequest => (Kind::Released, Vec::new(), true),
            End::Exhausted { reason, .. } => {
                (Kind::DeadLettered, reason.clone().into_bytes(), false)
            }
        };
        if matches!(kind, Kind::Completed | Kind::Failed) {
            self.close_pending_intent();
        }
        let (failed_at, payload) = match end {
            End::Exhausted { payload, .. } => (failed_at, payload.clone()),
            _ => (prev.failed_at, prev.payload.clone()),
        };
        let rec = MRec {
            kind,
            outcome,
            any,
            failed_at,
            payload,
            ..prev.clone()
        };
        self.write(s, rec, now, now + prev.retention_ms, Some(prev.bucket));
        Ok(true)
    }

    /// `renew` (`by` `None`: by the claim's lease) or `renew_for` of claim
    /// `token` answered `got` at `now`; returns the new lease expiry if it
    /// renewed.
    pub(crate) fn renew(
        &mut self,
        s: &Settings,
        (k, now, token): (usize, u64, Option<u64>),
        by: Option<u64>,
        got: &Result<SystemTime, Refusal>,
    ) -> TestResult<Option<u64>> {
        let Some(prev) = self.active(s, now, token) else {
            prop_assert!(
                matches!(got, Err(Refusal::ClaimLost)),
                "renew with a stale claim on key {}: got {:?}",
                k,
                got
            );
            return Ok(None);
        };
        want_ok(got, "renew", k)?;
        let lease_ms = by.unwrap_or(prev.lease_ms);
        let lease_until = now + lease_ms;
        prop_assert_eq!(got, &Ok(at(lease_until)), "renewed lease of key {}", k);
        let rec = MRec {
            lease_until,
            lease_ms,
            ..prev.clone()
        };
        let expires = (now + prev.retention_ms).max(lease_until);
        self.write(s, rec, now, expires, Some(prev.bucket));
        Ok(Some(lease_until))
    }

    /// Dropping claim `token` at `now`: an unfinished, active claim
    /// releases the key. Returns the record it replaced.
    pub(crate) fn drop_claim(
        &mut self,
        s: &Settings,
        now: u64,
        token: Option<u64>,
    ) -> Option<MRec> {
        let prev = self.active(s, now, token)?;
        let rec = MRec {
            kind: Kind::Released,
            abandoned: true,
            any: false,
            ..prev.clone()
        };
        self.write(s, rec, now, now + prev.retention_ms, Some(prev.bucket));
        Some(prev)
    }

    /// `get` answered `got` at `now`.
    pub(crate) fn get(&self, s: &Settings, k: usize, now: u64, got: Option<&Record>) -> TestResult {
        match (got, self.live(s, now)) {
            (None, None) => Ok(()),
            (Some(rec), Some(want)) => check_record(k, rec, want),
            (got, want) => Err(TestCaseError::fail(format!(
                "get of key {k}: store {got:?}, model {want:?}"
            ))),
        }
    }

    /// `forget` answered `got` at `now`: it removes a present key unless a
    /// live attempt of this run holds it; the forget record keeps what it
    /// replaced, for the store's retention from now, in no earlier bucket.
    /// Claims on the key are fenced. Returns whether it wrote.
    pub(crate) fn forget(
        &mut self,
        s: &Settings,
        (k, now): (usize, u64),
        got: &Forget,
        run_floor: u64,
    ) -> TestResult<bool> {
        let Some(prev) = self.present(s, now).cloned() else {
            prop_assert!(
                matches!(got, Forget::NotFound),
                "forget of absent key {}: got {:?}",
                k,
                got
            );
            return Ok(false);
        };
        if prev.kind == Kind::Claimed && now < prev.lease_until && prev.token > run_floor {
            let Forget::InProgress(info) = got else {
                return Err(TestCaseError::fail(format!(
                    "forget of claimed key {k} (model {prev:?}): want InProgress, got {got:?}"
                )));
            };
            prop_assert_eq!(info.attempt(), prev.attempt);
            prop_assert_eq!(info.lease_expires_at(), at(prev.lease_until));
            prop_assert_eq!(info.first_seen_at(), at(prev.first_at));
            return Ok(false);
        }
        let Forget::Forgotten(old) = got else {
            return Err(TestCaseError::fail(format!(
                "forget of key {k} (model {prev:?}): want Forgotten, got {got:?}"
            )));
        };
        check_record(k, old, &prev)?;
        let rec = MRec {
            kind: Kind::Forgotten,
            lease_until: 0,
            outcome: Vec::new(),
            any: false,
            payload: None,
            ..prev.clone()
        };
        self.write(s, rec, now, now + s.retention, Some(prev.bucket));
        self.intent = None;
        Ok(true)
    }

    /// `requeue` or `resolve` (`how`) answered `got` at `now`: `true` and
    /// a Released, Completed or Failed record, written for the dead
    /// letter's retention in no earlier bucket, if the key is a dead
    /// letter; else `false` and nothing written. Returns whether it wrote.
    pub(crate) fn leave_dead_letter(
        &mut self,
        s: &Settings,
        (k, now): (usize, u64),
        how: &Leave,
        got: bool,
    ) -> TestResult<bool> {
        let prev = self
            .present(s, now)
            .filter(|r| r.kind == Kind::DeadLettered)
            .cloned();
        prop_assert_eq!(
            got,
            prev.is_some(),
            "{:?} of key {} (model {:?})",
            how,
            k,
            self.live(s, now)
        );
        let Some(prev) = prev else {
            return Ok(false);
        };
        let (kind, outcome) = match how {
            Leave::Requeue => (Kind::Released, Vec::new()),
            Leave::Completed(o) => (Kind::Completed, o.clone()),
            Leave::Abandoned(n) => (Kind::Failed, n.clone().into_bytes()),
        };
        if !matches!(how, Leave::Requeue) {
            self.close_pending_intent();
        }
        let rec = MRec {
            kind,
            outcome,
            lease_until: 0,
            abandoned: false,
            any: false,
            failed_at: 0,
            payload: None,
            ..prev.clone()
        };
        self.write(s, rec, now, now + prev.retention_ms, Some(prev.bucket));
        Ok(true)
    }

    /// `mark_sent` of claim `token` (whose provider key is `provider`)
    /// with `reference` answered `got` at `now`: the key's active claim
    /// with an intent marks it sent, as of its own attempt and provider
    /// key. Returns whether it wrote.
    pub(crate) fn mark_sent(
        &mut self,
        s: &Settings,
        (k, now, token): (usize, u64, Option<u64>),
        (provider, reference): (&str, &[u8]),
        got: &Result<(), Refusal>,
    ) -> TestResult<bool> {
        let Some(prev) = self.active(s, now, token) else {
            prop_assert!(
                matches!(got, Err(Refusal::ClaimLost)),
                "mark_sent with a stale claim on key {}: got {:?}",
                k,
                got
            );
            return Ok(false);
        };
        let Some(earlier) = self.intent.clone() else {
            prop_assert!(
                matches!(got, Err(Refusal::InvalidArgument)),
                "mark_sent on key {} without an intent: got {:?}",
                k,
                got
            );
            return Ok(false);
        };
        want_ok(got, "mark_sent", k)?;
        let natural = ((now + prev.retention_ms) / s.granularity).max(earlier.bucket);
        let doubt = earlier.doubt
            || match &earlier.reference {
                Some(first) => first.as_slice() != reference,
                None => earlier.open,
            };
        self.intent = Some(MIntent {
            sent: true,
            open: false,
            reference: Some(
                earlier
                    .reference
                    .clone()
                    .unwrap_or_else(|| reference.to_vec()),
            ),
            doubt,
            data: reference.to_vec(),
            provider: provider.to_owned(),
            attempt: prev.attempt,
            bucket: self.writable(s, natural, 0).0,
            ..earlier
        });
        Ok(true)
    }

    /// `intent` answered `got`.
    pub(crate) fn intent(&self, k: usize, got: Option<&IntentEntry>) -> TestResult {
        match (got, &self.intent) {
            (None, None) => Ok(()),
            (Some(got), Some(want)) => check_intent(k, got, want),
            (got, want) => Err(TestCaseError::fail(format!(
                "intent of key {k}: store {got:?}, model {want:?}"
            ))),
        }
    }

    /// The dead-letter listing shows the key as `got` (`None`: not
    /// listed): listed exactly while it is a dead letter.
    pub(crate) fn dead_letter_listed(&self, k: usize, got: Option<&DeadLetter>) -> TestResult {
        let want = self.rec.as_ref().filter(|r| r.kind == Kind::DeadLettered);
        match (got, want) {
            (None, None) => Ok(()),
            (Some(got), Some(want)) => check_dead_letter(k, got, want),
            (got, want) => Err(TestCaseError::fail(format!(
                "dead_letters lists key {k} as {got:?}, model {:?}",
                want.or(self.rec.as_ref())
            ))),
        }
    }

    /// `stranded_claims`, as of `now`, shows the key as `got` (`None`: not
    /// listed): a claim whose lease lapsed (or whose process is gone, token
    /// up to `run_floor`) is listed until it is finished or evicted; one
    /// that expired may be evicted already.
    pub(crate) fn stranded_listed(
        &self,
        s: &Settings,
        (k, now): (usize, u64),
        got: Option<&Record>,
        run_floor: u64,
    ) -> TestResult {
        let want = self
            .rec
            .as_ref()
            .filter(|r| r.kind == Kind::Claimed && (r.lease_until <= now || r.token <= run_floor));
        match (got, want) {
            (None, None) => Ok(()),
            (Some(got), Some(want)) => check_record(k, got, want),
            (None, Some(_)) if self.live(s, now).is_none() => Ok(()),
            (got, want) => Err(TestCaseError::fail(format!(
                "stranded_claims lists key {k} as {got:?}, model {:?}",
                want.or(self.rec.as_ref())
            ))),
        }
    }

    /// `pending_intents` shows the key's intent as `got` (`None`: not
    /// listed): listed exactly while one is pending.
    pub(crate) fn pending_intent_listed(&self, k: usize, got: Option<&IntentEntry>) -> TestResult {
        let want = self.intent.as_ref().filter(|i| !i.sent);
        match (got, want) {
            (None, None) => Ok(()),
            (Some(got), Some(want)) => check_intent(k, got, want),
            (got, want) => Err(TestCaseError::fail(format!(
                "pending_intents lists key {k} as {got:?}, model {:?}",
                want.or(self.intent.as_ref())
            ))),
        }
    }
}

/// Checks `got` against the record the model expects.
pub(crate) fn check_record(k: usize, got: &Record, want: &MRec) -> TestResult {
    let state = match want.kind {
        Kind::Inserted => State::Inserted,
        Kind::Claimed => State::InProgress,
        Kind::Released => State::Retryable,
        Kind::Completed => State::Completed,
        Kind::Failed => State::Failed,
        Kind::Forgotten => State::Forgotten,
        Kind::DeadLettered => State::DeadLettered,
    };
    // A dead letter's outcome is its reason.
    let finished = matches!(
        want.kind,
        Kind::Completed | Kind::Failed | Kind::DeadLettered
    );
    prop_assert_eq!(got.key(), &key(k));
    prop_assert_eq!(got.state(), state, "key {} want {:?}", k, want);
    prop_assert_eq!(got.attempts(), want.attempt, "attempts of key {}", k);
    prop_assert_eq!(got.token(), want.token, "token of key {}", k);
    prop_assert_eq!(
        got.first_seen_at(),
        at(want.first_at),
        "first_seen of {}",
        k
    );
    prop_assert_eq!(got.updated_at(), at(want.at), "updated of key {}", k);
    prop_assert_eq!(got.expires_at(), at(want.expires), "expires of key {}", k);
    prop_assert_eq!(
        got.lease_expires_at(),
        (want.kind == Kind::Claimed).then(|| at(want.lease_until)),
        "lease of key {}",
        k
    );
    prop_assert_eq!(
        got.fingerprint(),
        want.is_operation().then_some(want.fp),
        "fingerprint of key {}",
        k
    );
    prop_assert_eq!(
        got.provider_key().is_some(),
        want.is_operation(),
        "provider key of key {}",
        k
    );
    if let (Some(got), Some(want)) = (got.provider_key(), &want.provider) {
        prop_assert_eq!(&got, want, "provider key of key {}", k);
    }
    prop_assert_eq!(
        got.outcome(),
        finished.then_some(want.outcome.as_slice()),
        "outcome of key {}",
        k
    );
    prop_assert_eq!(got.is_failure(), want.kind == Kind::Failed);
    Ok(())
}

/// A dead letter as the listing or `begin` gives it, against the model's.
pub(crate) fn check_dead_letter(k: usize, got: &DeadLetter, want: &MRec) -> TestResult {
    prop_assert_eq!(want.kind, Kind::DeadLettered, "key {} is no dead letter", k);
    prop_assert_eq!(got.key(), &key(k));
    prop_assert_eq!(
        got.attempts(),
        want.attempt,
        "attempts of dead letter {}",
        k
    );
    prop_assert_eq!(
        got.reason().as_bytes(),
        want.outcome.as_slice(),
        "reason of dead letter {}",
        k
    );
    prop_assert_eq!(
        got.payload(),
        want.payload.as_deref(),
        "payload of dead letter {}",
        k
    );
    prop_assert_eq!(got.failed_at(), at(want.failed_at), "failed_at of {}", k);
    prop_assert_eq!(
        got.first_attempt_at(),
        at(want.first_at),
        "first attempt of dead letter {}",
        k
    );
    check_record(k, got.record(), want)
}

/// An intent as `intent` or a listing gives it, against the model's.
pub(crate) fn check_intent(k: usize, got: &IntentEntry, want: &MIntent) -> TestResult {
    prop_assert_eq!(got.key(), &key(k));
    prop_assert_eq!(got.is_sent(), want.sent, "sent, key {} want {:?}", k, want);
    prop_assert_eq!(got.target(), want.target.as_str(), "target of key {}", k);
    let (request, reference) = if want.sent {
        (None, Some(want.data.as_slice()))
    } else {
        (Some(want.data.as_slice()), None)
    };
    prop_assert_eq!(got.request(), request, "request of key {}", k);
    prop_assert_eq!(got.reference(), reference, "reference of key {}", k);
    prop_assert_eq!(&got.provider_key(), &want.provider, "provider key of {}", k);
    prop_assert_eq!(got.attempt(), want.attempt, "attempt of intent {}", k);
    prop_assert_eq!(
        got.recorded_at(),
        at(want.recorded_at),
        "recorded_at of intent {}",
        k
    );
    Ok(())
}

// ------------------------------------------------------------ entity state

/// An entity's sequencer state and version, as the model expects the store
/// to keep them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct MEntity {
    /// The next expected sequence number.
    pub(crate) next: u64,
    /// Parked events (at or past `next`).
    pub(crate) parked: BTreeMap<u64, Vec<u8>>,
    /// Handed back, not acknowledged.
    pub(crate) unacked: BTreeMap<u64, Vec<u8>>,
    /// The lease end of the hand-back holding each unacknowledged event,
    /// given in this run (memory only).
    pub(crate) handed: BTreeMap<u64, u64>,
    /// The version `advance` last applied.
    pub(crate) version: Option<u64>,
    /// The bucket of its latest core record.
    pub(crate) bucket: u64,
}

impl MEntity {
    fn fresh() -> MEntity {
        MEntity {
            next: 1,
            ..MEntity::default()
        }
    }
}

/// One entity of the model (`None`: never written, or expired).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct EntityState(pub(crate) Option<MEntity>);

impl EntityState {
    /// The entity's state, if it has not expired: one with parked or
    /// unacknowledged events never does, another expires
    /// `ENTITY_RETENTION` after its last write.
    pub(crate) fn live(&self, s: &Settings, now: u64) -> Option<&MEntity> {
        self.0.as_ref().filter(|m| {
            !m.parked.is_empty() || !m.unacked.is_empty() || now / s.granularity <= m.bucket
        })
    }

    /// The entity's core record was written at `now`.
    fn wrote(&mut self, s: &Settings, m: MEntity, now: u64) {
        let bucket = ((now + ENTITY_RETENTION) / s.granularity).max(m.bucket);
        self.0 = Some(MEntity { bucket, ..m });
    }

    /// A reopen or crash: the hand-backs (memory only) end with the
    /// process that held them.
    pub(crate) fn reopened(&mut self) {
        if let Some(m) = self.0.as_mut() {
            m.handed.clear();
        }
    }

    /// `sequence(seq, payload)` answered `got` at `now`, with hand-backs
    /// held for `handback_ms`; returns whether it wrote.
    pub(crate) fn sequence(
        &mut self,
        s: &Settings,
        (e, now): (usize, u64),
        (seq, payload, handback_ms): (u64, &[u8], u64),
        got: &Sequenced,
    ) -> TestResult<bool> {
        let until = now + handback_ms;
        let mut m = self.live(s, now).cloned().unwrap_or_else(MEntity::fresh);
        let (want, wrote) = if m.unacked.contains_key(&seq) {
            if let Some(&live) = m.handed.get(&seq).filter(|u| **u > now) {
                let Sequenced::Handling(h) = got else {
                    return Err(TestCaseError::fail(format!(
                        "sequence {seq} of entity {e}: want Handling until {live}, got {got:?}"
                    )));
                };
                prop_assert_eq!(
                    h.lease_expires_at(),
                    at(live),
                    "lease of {} of entity {}",
                    seq,
                    e
                );
                return Ok(false);
            }
            let mut out = vec![(seq, payload.to_vec())];
            for (s, p) in m.unacked.range(seq + 1..) {
                if m.handed.get(s).is_some_and(|u| *u > now) {
                    break;
                }
                out.push((*s, p.clone()));
            }
            for (s, _) in &out {
                m.handed.insert(*s, until);
            }
            // Memory only: no record, but the hand-backs are new.
            if let Some(stored) = self.0.as_mut() {
                stored.handed.clone_from(&m.handed);
            }
            (Some(out), false)
        } else if seq < m.next || m.parked.contains_key(&seq) {
            (None, false)
        } else if seq == m.next {
            let mut out = vec![(seq, payload.to_vec())];
            m.unacked.insert(seq, payload.to_vec());
            m.handed.insert(seq, until);
            let mut n = seq + 1;
            while let Some(p) = m.parked.remove(&n) {
                out.push((n, p.clone()));
                m.unacked.insert(n, p);
                m.handed.insert(n, until);
                n += 1;
            }
            m.next = n;
            (Some(out), true)
        } else {
            m.parked.insert(seq, payload.to_vec());
            prop_assert_eq!(got, &Sequenced::Parked, "sequence {} of entity {}", seq, e);
            self.wrote(s, m, now);
            return Ok(true);
        };
        match want {
            None => prop_assert_eq!(
                got,
                &Sequenced::Duplicate,
                "sequence {} of entity {}",
                seq,
                e
            ),
            Some(out) => {
                let Sequenced::Delivered(got) = got else {
                    return Err(TestCaseError::fail(format!(
                        "sequence {seq} of entity {e}: want {out:?}, got {got:?}"
                    )));
                };
                let got: Vec<(u64, Vec<u8>)> =
                    got.iter().map(|d| (d.seq, d.payload.clone())).collect();
                prop_assert_eq!(got, out, "sequence {} of entity {}", seq, e);
            }
        }
        if wrote {
            self.wrote(s, m, now);
        }
        Ok(wrote)
    }

    /// `ack(upto)` answered `got` at `now`; returns whether it wrote.
    pub(crate) fn ack(
        &mut self,
        s: &Settings,
        (e, now): (usize, u64),
        upto: u64,
        got: usize,
    ) -> TestResult<bool> {
        let Some(mut m) = self.live(s, now).cloned() else {
            prop_assert_eq!(got, 0, "ack of an expired entity {}", e);
            return Ok(false);
        };
        let mark = upto.saturating_add(1).min(m.next);
        let still = m.unacked.split_off(&mark);
        let want = std::mem::replace(&mut m.unacked, still).len();
        m.handed = m.handed.split_off(&mark);
        prop_assert_eq!(got, want, "ack {} of entity {}", upto, e);
        if want > 0 {
            self.wrote(s, m, now);
        }
        Ok(want > 0)
    }

    /// `advance(version)` answered `got` at `now`: a newer version (or the
    /// first) is applied; returns whether it wrote.
    pub(crate) fn advance(
        &mut self,
        s: &Settings,
        (e, now): (usize, u64),
        version: u64,
        got: Advance,
    ) -> TestResult<bool> {
        let mut m = self.live(s, now).cloned().unwrap_or_else(MEntity::fresh);
        let want = match m.version {
            Some(cur) if version < cur => Advance::Stale { current: cur },
            Some(cur) if version == cur => Advance::Duplicate,
            previous => Advance::Applied { previous },
        };
        prop_assert_eq!(got, want, "advance {} of entity {}", version, e);
        if !matches!(want, Advance::Applied { .. }) {
            return Ok(false);
        }
        m.version = Some(version);
        self.wrote(s, m, now);
        Ok(true)
    }

    /// `unacked` answered `got` at `now`: each event with the end of the
    /// live hand-back holding it, if any.
    pub(crate) fn unacked(
        &self,
        s: &Settings,
        (e, now): (usize, u64),
        got: &[Unacked],
    ) -> TestResult {
        let got: Vec<(u64, Vec<u8>, Option<SystemTime>)> = got
            .iter()
            .map(|d| {
                (
                    d.seq,
                    d.payload.clone(),
                    d.handling.as_ref().map(Handling::lease_expires_at),
                )
            })
            .collect();
        let want: Vec<(u64, Vec<u8>, Option<SystemTime>)> = self
            .live(s, now)
            .map(|m| {
                m.unacked
                    .iter()
                    .map(|(seq, p)| {
                        let live = m.handed.get(seq).filter(|u| **u > now);
                        (*seq, p.clone(), live.map(|u| at(*u)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        prop_assert_eq!(got, want, "unacked of entity {}", e);
        Ok(())
    }
}
