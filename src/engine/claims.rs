//! Claims: begin, complete, fail, renew, and the takeover of a dead
//! attempt's claim.
//!
//! Invariants:
//! - exactly one caller is told `Started` for a key at a time: the claim is
//!   decided and recorded under the key's shard lock;
//! - a claim finishes (complete, fail, renew) only while it is the key's
//!   active claim: its fencing token is the one the index holds; any other
//!   finish is refused (`ClaimLost`) and counted as fenced;
//! - a claim whose lease lapsed, whose process is gone (token below this
//!   run's first), or that was dropped without an answer is taken over,
//!   and the next attempt is told it was interrupted.

use std::time::SystemTime;

use super::Engine;
use super::input::{CLAIM_BYTES, key_bytes};
use super::intents::IntentWrite;
use super::reconcile::Completion;
use super::time::Op;
use super::write::{Batch, Next, Write};
use crate::clock::to_system_time;
use crate::codec::TAG_RAW;
use crate::index::intent::IntentState;
use crate::index::{Pending, Round, Shard, SlotState};
use crate::key::KeyHash;
use crate::records::{
    ClaimFields, DeadLetterBody, Kind, RELEASE_ABANDONED, RELEASE_ANY_REQUEST, RecordRef,
};
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering, Weak};
use crate::types::{self as contract, Basis};
use crate::types::{BeginOptions, DeadLetter, Failure, InProgress, Intent, Record, State};
use crate::{Error, Fingerprint, Key, Result};

/// The engine's side of a claim handle: which attempt of which key, its
/// fencing token and lease, and whether it was finished. Dropped
/// unfinished, it releases the key (the next attempt is interrupted).
pub(crate) struct Ticket {
    engine: Weak<Engine>,
    pub(crate) key: Key<'static>,
    pub(crate) hash: KeyHash,
    pub(crate) attempt: u32,
    pub(crate) token: u64,
    /// The provider key, given out only once its claim record is kept.
    provider: ProviderKey,
    pub(crate) first_at: u64,
    lease_until: AtomicU64,
    finished: AtomicBool,
    pub(crate) interrupted: bool,
    /// An earlier attempt recorded an intent nobody marked answered.
    pub(crate) unanswered_intent: bool,
    /// The round of attempts this one belongs to.
    pub(crate) round: Round,
}

/// A claim's provider key, and the log row of the claim record it
/// derives from (which carries the `first_at` and fingerprint it hashes).
struct ProviderKey {
    key: u128,
    row: u64,
    /// `row` was seen kept: the key is given out without asking the log.
    kept: AtomicBool,
}

impl Ticket {
    /// The lease expiry, in ms since the epoch.
    pub(crate) fn lease_until(&self) -> u64 {
        self.lease_until.load(Ordering::Acquire)
    }

    /// The provider key, once the claim record it derives from is where
    /// the store's next owner reads (`Log::wait_kept`): every later owner
    /// then restores that record and derives the same key. Never a key
    /// that record could still be lost with.
    pub(crate) fn provider_key(&self) -> Result<u128> {
        let provider = &self.provider;
        if !provider.kept.load(Ordering::Acquire) {
            let engine = self.engine.upgrade().ok_or(Error::Closed)?;
            engine.log.wait_kept(provider.row)?;
            provider.kept.store(true, Ordering::Release);
        }
        Ok(provider.key)
    }

    /// The provider key's parts for an awaited [`Ticket::provider_key`]:
    /// the store, the row to await (0 once kept), the key.
    #[cfg(feature = "async")]
    pub(crate) fn provider_key_parts(&self) -> (Weak<Engine>, u64, u128) {
        let provider = &self.provider;
        let row = if provider.kept.load(Ordering::Acquire) {
            0
        } else {
            provider.row
        };
        (self.engine.clone(), row, provider.key)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.finished.swap(true, Ordering::AcqRel)
            && let Some(engine) = self.engine.upgrade()
        {
            engine.release_dropped(self);
        }
    }
}

/// What a begin meets on its key (see [`Engine::next_attempt`]).
enum Attempt {
    /// A new attempt: its number, the operation's first claim time,
    /// whether it takes over an interrupted one, and its round.
    Start((u32, u64, bool, Round)),
    /// A finished record, answered from the log: its state and place.
    Recorded((SlotState, u64, u64)),
    /// A live attempt of another caller, and the row of its claim.
    Running(InProgress, u64),
}

/// What `begin` found.
pub(crate) enum Begun {
    Started(Ticket),
    Completed(Record),
    InProgress(InProgress),
    DeadLettered(DeadLetter),
}

/// The log rows a call's answers rest on: `new`, its own records (made
/// durable as the durability mode requires); `seen`, records written
/// before that its answers were read from (durable before it answers, in
/// `Immediate` mode).
#[derive(Default)]
struct Waits {
    new: u64,
    seen: u64,
}

impl Waits {
    fn basis(&self) -> Basis {
        Basis::written(self.new).and(Basis::read(self.seen))
    }
}

impl Engine {
    /// Starts an operation, or tells what became of it.
    pub(crate) fn begin(
        this: &Arc<Engine>,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
    ) -> Result<contract::Pending<Begun>> {
        let op = this.op(options)?;
        Self::begin_op(this, key, fingerprint, op)
    }

    /// `begin`, recording `intent` in the claim's commit if it starts one.
    pub(crate) fn begin_with_intent(
        this: &Arc<Engine>,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Intent<'_>,
    ) -> Result<contract::Pending<Begun>> {
        this.check_intent_len(intent.target, intent.request)?;
        let op = Op {
            intent: Some(intent),
            ..this.op(options)?
        };
        Self::begin_op(this, key, fingerprint, op)
    }

    fn begin_op(
        this: &Arc<Engine>,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        op: Op<'_>,
    ) -> Result<contract::Pending<Begun>> {
        let mut waits = Waits::default();
        let answer = Self::begin_waiting(this, key, fingerprint, op, &mut waits)?;
        Ok(contract::Pending::new(answer, waits.basis()))
    }

    /// Begins every item, the claims in one commit (usually).
    pub(crate) fn begin_batch(
        this: &Arc<Engine>,
        items: &[(Key<'_>, Fingerprint)],
    ) -> Result<contract::Pending<Vec<Result<Begun>>>> {
        this.check_batch(
            items
                .iter()
                .map(|(k, _)| this.check_key(k).map(|()| key_bytes(k) + CLAIM_BYTES)),
        )?;
        this.log.check()?;
        let op = this.op(&BeginOptions::new())?;
        let mut waits = Waits::default();
        let mut out = Vec::with_capacity(items.len());
        for (key, fingerprint) in items {
            match Self::begin_waiting(this, key, *fingerprint, op, &mut waits) {
                Ok(answer) => out.push(Ok(answer)),
                Err(e @ Error::FingerprintMismatch { .. }) => out.push(Err(e)),
                Err(e) => return Err(e),
            }
        }
        Ok(contract::Pending::new(out, waits.basis()))
    }

    /// Completes many claims, each with its outcome, in one commit
    /// (usually).
    pub(crate) fn complete_batch(
        &self,
        items: &[(&Ticket, &[u8])],
    ) -> Result<contract::Pending<Vec<Result<()>>>> {
        self.check_batch(
            items
                .iter()
                .map(|(c, outcome)| Ok(key_bytes(&c.key) + CLAIM_BYTES + outcome.len())),
        )?;
        let mut last = 0;
        let mut out = Vec::with_capacity(items.len());
        for (claim, outcome) in items {
            match self.finish(claim, Kind::Complete, (TAG_RAW, outcome), None, 0) {
                Ok(row) => {
                    last = last.max(row);
                    out.push(Ok(()));
                }
                Err(e @ (Error::ClaimLost { .. } | Error::InvalidInput { .. })) => out.push(Err(e)),
                Err(e) => return Err(e),
            }
        }
        Ok(contract::Pending::new(out, Basis::written(last)))
    }

    /// `begin` without waiting for durability: the rows its answer waits
    /// for go into `waits`.
    fn begin_waiting(
        this: &Arc<Engine>,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        op: Op<'_>,
        waits: &mut Waits,
    ) -> Result<Begun> {
        loop {
            // `None`: the key's record was evicted between the lookup and
            // the read (it just expired); look again.
            if let Some(answer) = Self::begin_once(this, key, fingerprint, op, waits)? {
                return Ok(answer);
            }
        }
    }

    fn begin_once(
        this: &Arc<Engine>,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        op: Op<'_>,
        waits: &mut Waits,
    ) -> Result<Option<Begun>> {
        let (h, now, nb) = this.write_start(key)?;
        let mut shard = this.index.lock(h);
        let mut w = Write::new(&mut shard, h, nb);
        let (attempt, first_at, interrupted, round) =
            match this.next_attempt(&mut w, key, fingerprint, now)? {
                Attempt::Start(start) => start,
                Attempt::Recorded(recorded) => {
                    drop(shard);
                    // Its record may be on its way to the storage still.
                    waits.seen = waits.seen.max(recorded.2);
                    return this.replay(key, h, recorded, fingerprint);
                }
                Attempt::Running(running, row) => {
                    drop(shard);
                    waits.seen = waits.seen.max(row);
                    return Ok(Some(Begun::InProgress(running)));
                }
            };
        let unanswered = w
            .shard()
            .intent(h)
            .is_some_and(|i| i.state == IntentState::Pending);
        let (row, p) = {
            let mut batch = this.log.batch()?;
            let token = this.next_token(&mut batch);
            let p = Pending {
                hash: h,
                attempt,
                token,
                first_at,
                lease_until: now.saturating_add(op.lease_ms),
                params: fingerprint.0,
                lease_ms: op.lease_ms,
                retention_ms: op.retention_ms,
                any_request: false,
                abandoned: false,
                failed_at: 0,
                round,
            };
            let round = this.round_bytes(&p);
            let mut rec = claim_record(key.scope(), key.id(), &p, now).with_round(round.as_slice());
            let mut row = w.append(this, &mut batch, Next::Claimed(p), &mut rec);
            if let Some(intent) = op.intent {
                // In the claim's commit: no claim is durable without it.
                let body = Engine::intent_body(&shard, h, (now, attempt), intent);
                row = row.max(this.log_intent(
                    &mut shard,
                    &mut batch,
                    (h, key.scope(), key.id()),
                    fields(&p),
                    (now, op.retention_ms),
                    IntentWrite::BEGUN,
                    &body,
                ));
            }
            (row, p)
        };
        shard.counters.started += 1;
        drop(shard);
        waits.new = waits.new.max(row);
        Ok(Some(Begun::Started(Self::ticket(
            this,
            (key, row),
            &p,
            (interrupted, unanswered),
        ))))
    }

    /// What a begin on the key `w` points at meets: a new attempt to
    /// start (its number, the operation's first claim time, whether it
    /// takes over an interrupted one, its round), a finished record to
    /// answer from, or a live attempt still running (and its row).
    fn next_attempt(
        &self,
        w: &mut Write<'_>,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        now: u64,
    ) -> Result<Attempt> {
        let this = self;
        let start = match w.recorded() {
            None => (1, now, false, Round::first(now)),
            // A new operation, first claimed later than the forgotten one
            // (even within its millisecond, or while the store's time
            // stands still), so its provider key differs.
            Some(s) if s.state() == SlotState::Forgotten => {
                let after = w.pending().map_or(0, |p| p.first_at.saturating_add(1));
                let first_at = now.max(after);
                (1, first_at, false, Round::first(first_at))
            }
            Some(s) if !matches!(s.state(), SlotState::Claimed | SlotState::Released) => {
                let (bucket, row) = (s.bucket(w.now_bucket()), s.row(this.log.open_row()));
                return Ok(Attempt::Recorded((s.state(), bucket, row)));
            }
            Some(s) => {
                let p = w.pending().ok_or_else(|| super::read::lost_details(key))?;
                let freed = s.state() == SlotState::Released && p.any_request;
                if p.params != fingerprint.0 && !freed {
                    w.shard().counters.conflicts += 1;
                    return Err(mismatch(key, Fingerprint(p.params), fingerprint));
                }
                // A claim of an earlier process is taken over at once: its
                // holder is gone, and waiting out its lease only stalls
                // the restarted consumer.
                if s.state() == SlotState::Claimed && now < p.lease_until && !this.orphaned(p.token)
                {
                    w.shard().counters.in_progress += 1;
                    let running = InProgress {
                        attempt: p.attempt,
                        lease_until: p.lease_until,
                        first_at: p.first_at,
                    };
                    return Ok(Attempt::Running(running, s.row(this.log.open_row())));
                }
                // An attempt that never answered: its process died, its
                // lease lapsed, or its claim was dropped.
                let interrupted = s.state() == SlotState::Claimed || p.abandoned;
                if interrupted {
                    took_over(w, key, s.state(), &p, now);
                }
                let mut round = p.round.next(interrupted);
                if s.state() == SlotState::Claimed {
                    // It failed when it became stranded (a released one's
                    // failure came with its release).
                    round = round.failed(this.stranded_since(p.token, p.lease_until).min(now));
                }
                (p.attempt.saturating_add(1), p.first_at, interrupted, round)
            }
        };
        Ok(Attempt::Start(start))
    }

    /// The handle of claim `p` just recorded on `key`, in log row `row`.
    fn ticket(
        this: &Arc<Engine>,
        (key, row): (&Key<'_>, u64),
        p: &Pending,
        (interrupted, unanswered_intent): (bool, bool),
    ) -> Ticket {
        Ticket {
            engine: Arc::downgrade(this),
            key: key.clone().into_owned(),
            hash: p.hash,
            attempt: p.attempt,
            token: p.token,
            provider: ProviderKey {
                key: crate::key::provider_key(
                    &this.hasher.secret(),
                    key.scope(),
                    key.id(),
                    p.first_at,
                    p.params,
                ),
                row,
                kept: AtomicBool::new(false),
            },
            first_at: p.first_at,
            lease_until: AtomicU64::new(p.lease_until),
            finished: AtomicBool::new(false),
            interrupted,
            unanswered_intent,
            round: p.round,
        }
    }

    /// Completes a claim with `outcome` (tagged `tag`), kept for
    /// `retention_ms` (the operation's if `None`).
    pub(crate) fn complete(
        &self,
        claim: &Ticket,
        (tag, outcome): (u8, &[u8]),
        retention_ms: Option<u64>,
        amount: i64,
    ) -> Result<contract::Pending<()>> {
        let row = self.finish(claim, Kind::Complete, (tag, outcome), retention_ms, amount)?;
        Ok(contract::Pending::new((), Basis::written(row)))
    }

    /// Fails a claim.
    pub(crate) fn fail(
        &self,
        claim: &Ticket,
        failure: Failure<'_>,
    ) -> Result<contract::Pending<()>> {
        let res = match failure {
            Failure::Retryable => self.finish(claim, Kind::Release, (TAG_RAW, &[]), None, 0),
            Failure::RetryableAnyRequest => {
                self.finish(claim, Kind::Release, (RELEASE_ANY_REQUEST, &[]), None, 0)
            }
            Failure::Permanent(payload) => {
                self.finish(claim, Kind::Fail, (TAG_RAW, payload), None, 0)
            }
            Failure::Exhausted { reason, payload } => {
                self.check_dead_letter(reason, payload)?;
                // Its first failure is the round's, filled in by `finish`.
                let body = DeadLetterBody {
                    failed_at: self.now(),
                    first_failed_at: 0,
                    reason,
                    payload,
                }
                .encode();
                self.finish(claim, Kind::DeadLetter, (TAG_RAW, &body), None, 0)
            }
        };
        Ok(contract::Pending::new((), Basis::written(res?)))
    }

    /// Extends a claim's lease to now + `lease_ms` (the claim's own lease
    /// if `None`); returns the new expiry.
    pub(crate) fn renew(
        &self,
        claim: &Ticket,
        lease_ms: Option<u64>,
    ) -> Result<contract::Pending<SystemTime>> {
        self.log.check()?;
        let (now, nb) = self.time()?;
        self.check_owner(claim)?;
        let h = claim.hash;
        let mut shard = self.index.lock(h);
        let mut w = Write::new(&mut shard, h, nb);
        let p = Self::active(&mut w, claim)?;
        let lease_ms = lease_ms.unwrap_or(p.lease_ms);
        let lease_until = now.saturating_add(lease_ms);
        let p = Pending {
            lease_until,
            lease_ms,
            ..p
        };
        let round = self.round_bytes(&p);
        let mut rec =
            claim_record(claim.key.scope(), claim.key.id(), &p, now).with_round(round.as_slice());
        let row = {
            let mut batch = self.log.batch()?;
            w.append(self, &mut batch, Next::Claimed(p), &mut rec)
        };
        claim.lease_until.store(lease_until, Ordering::Release);
        drop(shard);
        Ok(contract::Pending::new(
            to_system_time(lease_until),
            Basis::written(row),
        ))
    }

    /// Fails for a claim made by another store.
    pub(crate) fn check_owner(&self, claim: &Ticket) -> Result<()> {
        if std::ptr::eq(claim.engine.as_ptr(), self) {
            return Ok(());
        }
        Err(self.fenced(claim, "the claim was made by another store"))
    }

    /// Counts a refused `complete`, `fail` or `renew` in `Stats::fenced`
    /// and returns its error. The caller does not hold the shard lock.
    fn fenced(&self, claim: &Ticket, reason: &'static str) -> Error {
        self.index.lock(claim.hash).counters.fenced += 1;
        lost(claim, reason)
    }

    /// The claim's pending details, if it is still the key's active claim;
    /// else counts it as fenced and says why not.
    fn active(w: &mut Write<'_>, claim: &Ticket) -> Result<Pending> {
        let reason = match w.live() {
            None if w.forgotten() => "the key was forgotten",
            None => "the key expired",
            Some(s) => match s.state() {
                SlotState::Claimed => match w.pending() {
                    Some(p) if p.token == claim.token => return Ok(p),
                    _ => "its lease lapsed and a newer attempt took the key over",
                },
                SlotState::Released => "the key was released for a retry",
                SlotState::Completed => "the key was already completed",
                SlotState::Failed => "the key already failed permanently",
                SlotState::Inserted => "the key was recorded by insert_if_absent",
                SlotState::DeadLettered => "the key is in the dead-letter area",
                SlotState::Forgotten => "the key was forgotten",
            },
        };
        w.shard().counters.fenced += 1;
        Err(lost(claim, reason))
    }

    /// Writes a Complete, Fail or Release record for an active claim;
    /// returns its row (not yet settled).
    fn finish(
        &self,
        claim: &Ticket,
        kind: Kind,
        (tag, outcome): (u8, &[u8]),
        retention_ms: Option<u64>,
        amount: i64,
    ) -> Result<u64> {
        // A dead letter's body frames what `fail` checked.
        if kind != Kind::DeadLetter {
            self.check_outcome(outcome)?;
        }
        self.log.check()?;
        self.check_owner(claim)?;
        if claim.finished.load(Ordering::Acquire) {
            return Err(self.fenced(claim, "this claim was already finished"));
        }
        let (now, nb) = self.time()?;
        let h = claim.hash;
        let mut shard = self.index.lock(h);
        let mut w = Write::new(&mut shard, h, nb);
        let p = Self::active(&mut w, claim)?;
        let at = (
            now,
            now.saturating_add(retention_ms.unwrap_or(p.retention_ms)),
        );
        let (scope, id) = (claim.key.scope(), claim.key.id());
        let next = next_state(&p, kind, (tag, outcome), now);
        let dead_body = (kind == Kind::DeadLetter)
            .then(|| self.dead_letter_body(outcome, p.round))
            .flatten();
        let outcome = dead_body.as_deref().unwrap_or(outcome);
        let round = match &next {
            Next::Released(released) => self.round_bytes(released),
            _ => self.round_bytes(&p),
        };
        let mut rec = match kind {
            Kind::Complete => RecordRef::complete(scope, id, at, fields(&p), (tag, outcome)),
            Kind::Fail => RecordRef::fail(scope, id, at, fields(&p), (tag, outcome)),
            Kind::DeadLetter => RecordRef::dead_letter(scope, id, at, fields(&p), outcome),
            _ => RecordRef::release(scope, id, at, fields(&p), tag).with_round(round.as_slice()),
        };
        let row = {
            let mut batch = self.log.batch()?;
            let row = w.append(self, &mut batch, next, &mut rec);
            row.max(self.settle_records(&mut shard, &mut batch, claim, (kind, &p), at, amount))
        };
        match kind {
            Kind::Complete => shard.counters.completed += 1,
            Kind::Fail => shard.counters.failed += 1,
            Kind::DeadLetter => shard.counters.dead_lettered += 1,
            _ => shard.counters.released += 1,
        }
        claim.finished.store(true, Ordering::Release);
        self.finished(claim, kind);
        Ok(row)
    }

    /// The records a finish writes beside its own in the same commit: a
    /// completion counted for reconciliation, the operation's intent
    /// closed or settled. Returns the highest row written (0 if none).
    fn settle_records(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        claim: &Ticket,
        (kind, p): (Kind, &Pending),
        at: (u64, u64),
        amount: i64,
    ) -> u64 {
        let (scope, id) = (claim.key.scope(), claim.key.id());
        let key = (claim.hash, scope, id);
        match kind {
            // Counted for reconciliation, with the outcome.
            Kind::Complete => {
                let provider_key = claim.provider.key;
                let done = Completion {
                    scope,
                    id,
                    provider_key,
                    at,
                    amount,
                };
                let counted = self.count_completion(shard, batch, &done);
                counted.max(self.close_intent(shard, batch, (key, false), fields(p), at))
            }
            // The operation is settled: its intent is no longer open.
            Kind::Fail => self.close_intent(shard, batch, (key, false), fields(p), at),
            // Given up after asking: nothing happened.
            Kind::DeadLetter => self.settle_asked_intent(shard, batch, key, fields(p), at),
            _ => 0,
        }
    }

    /// After a claim's finish is appended (the caller still holds the
    /// shard lock): its key's waiters are woken (see `waiters.rs`), and a
    /// dead letter is logged (its key, never its payload).
    fn finished(&self, claim: &Ticket, kind: Kind) {
        self.notify_waiters(claim.hash);
        if kind == Kind::DeadLetter {
            tracing::warn!(
                key = %claim.key,
                attempt = claim.attempt,
                "dedupkv: operation moved to the dead-letter area"
            );
        }
    }

    /// The body of a dead letter of `round` from the one `fail` encoded:
    /// with the round's first failure (or, none before, its own) beside
    /// its last, in the file's format.
    fn dead_letter_body(&self, encoded: &[u8], round: Round) -> Option<Vec<u8>> {
        let b = DeadLetterBody::decode(encoded)?;
        let body = DeadLetterBody {
            first_failed_at: round.failed(b.failed_at).first_failed_at,
            ..b
        };
        Some(if self.has_format_4_bodies() {
            body.encode()
        } else {
            body.encode_v1()
        })
    }

    /// Releases a claim dropped without an answer. Does not wait: if the
    /// record is lost in a crash, the lease lapses instead.
    fn release_dropped(&self, claim: &Ticket) {
        claim.finished.store(false, Ordering::Release);
        match self.finish(claim, Kind::Release, (RELEASE_ABANDONED, &[]), None, 0) {
            Ok(_) => self.log.kick(),
            Err(e) => tracing::debug!(key = %claim.key, error = %e, "dropped claim not released"),
        }
    }

    /// Answers `begin` on a finished key from its log record.
    /// The answer to a `begin` of a key whose slot was seen in `state` at
    /// (`bucket`, `row`): read from that row (the answer rests on it). Other
    /// records of the key may have joined the row after the slot was seen
    /// (a requeue, a new claim), so the answer is built only from a record
    /// of the state decided on; otherwise `None`, and the caller decides
    /// again. `Completed` thus only ever carries a record that was the
    /// key's latest, in a finished state, during the call.
    fn replay(
        &self,
        key: &Key<'_>,
        h: KeyHash,
        (state, bucket, row): (SlotState, u64, u64),
        fingerprint: Fingerprint,
    ) -> Result<Option<Begun>> {
        let loaded = self.load_with(key, bucket, row, |r| {
            if r.kind != kind_of(state) {
                return Ok(None);
            }
            let dead = match r.kind {
                Kind::DeadLetter => Some(self.dead_letter_of(r)?),
                _ => None,
            };
            Ok(Some((self.record_of(r), dead)))
        })?;
        let Some(loaded) = loaded else {
            // Its bucket was deleted under us: the key expired (or, a dead
            // letter, was carried to another bucket). Drop the
            // slot if nobody rewrote it meanwhile, so the retry sees it
            // absent (and the retry loop ends).
            let mut shard = self.index.lock(h);
            if shard.get(h).is_some_and(|s| s.is_at(bucket, row)) {
                shard.remove(h);
            }
            return Ok(None);
        };
        // Written meanwhile: decide again.
        let Some((rec, dead)) = loaded else {
            return Ok(None);
        };
        if rec.state != State::Inserted && rec.fingerprint != Some(fingerprint) {
            self.index.lock(h).counters.conflicts += 1;
            return Err(mismatch(
                key,
                rec.fingerprint.unwrap_or(Fingerprint::NONE),
                fingerprint,
            ));
        }
        if let Some(dead) = dead {
            return Ok(Some(Begun::DeadLettered(dead)));
        }
        // Counted store-wide: a replay needs no second visit to its shard.
        self.counters.replays.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Begun::Completed(rec)))
    }
}

/// Counts and logs a claim started over an attempt that never answered
/// (a lapsed or orphaned claim, or a dropped one) on the key `w` writes.
/// The state a finish of `kind` leaves the key in, from the claim `p`
/// it finishes (a dead letter's time comes from its body).
fn next_state(p: &Pending, kind: Kind, (tag, outcome): (u8, &[u8]), now: u64) -> Next {
    match kind {
        Kind::Complete => Next::Completed,
        Kind::Fail => Next::Failed,
        Kind::DeadLetter => Next::DeadLettered(Pending {
            lease_until: 0,
            any_request: false,
            abandoned: false,
            failed_at: DeadLetterBody::decode(outcome).map_or(now, |b| b.failed_at),
            ..*p
        }),
        // A retryable failure, or a dropped claim: the round failed.
        _ => Next::Released(Pending {
            lease_until: 0,
            any_request: tag == RELEASE_ANY_REQUEST,
            abandoned: tag == RELEASE_ABANDONED,
            failed_at: 0,
            round: p.round.failed(now),
            ..*p
        }),
    }
}

fn took_over(w: &mut Write<'_>, key: &Key<'_>, state: SlotState, p: &Pending, now: u64) {
    let counters = &mut w.shard().counters;
    counters.interrupted += 1;
    if state == SlotState::Claimed {
        counters.takeovers += 1;
    }
    tracing::info!(
        key = %key,
        attempt = p.attempt.saturating_add(1),
        interrupted = true,
        lapsed = state == SlotState::Claimed && now >= p.lease_until,
        "dedupkv: an attempt that never answered is taken over"
    );
}

/// The record kind a key's slot in `state` points at (for the states a
/// `begin` answers from a record).
fn kind_of(state: SlotState) -> Kind {
    match state {
        SlotState::Inserted => Kind::Insert,
        SlotState::Claimed => Kind::Claim,
        SlotState::Released => Kind::Release,
        SlotState::Completed => Kind::Complete,
        SlotState::Failed => Kind::Fail,
        SlotState::Forgotten => Kind::Forget,
        SlotState::DeadLettered => Kind::DeadLetter,
    }
}

/// The record of claim `p` on (`scope`, `id`), written at `now`: by
/// `begin`, by `renew`, and by eviction carrying a live claim out of a
/// bucket it deletes.
#[inline]
pub(crate) fn claim_record<'k>(
    scope: &'k [u8],
    id: &'k [u8],
    p: &Pending,
    now: u64,
) -> RecordRef<'k> {
    let expires = now.saturating_add(p.retention_ms).max(p.lease_until);
    RecordRef::claim(scope, id, (now, expires), fields(p))
}

/// The claim fields a record of claim `p` carries.
#[inline]
pub(crate) fn fields(p: &Pending) -> ClaimFields {
    ClaimFields {
        attempt: p.attempt,
        token: p.token,
        first_at: p.first_at,
        lease_until: p.lease_until,
        params: p.params,
    }
}

/// The error for a claim that is not (or no longer) the key's active one.
fn lost(claim: &Ticket, reason: &'static str) -> Error {
    Error::ClaimLost {
        key: claim.key.to_string(),
        attempt: claim.attempt,
        token: claim.token,
        reason,
    }
}

fn mismatch(key: &Key<'_>, recorded: Fingerprint, requested: Fingerprint) -> Error {
    Error::FingerprintMismatch {
        key: key.to_string(),
        recorded,
        requested,
    }
}
