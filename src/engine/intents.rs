//! Intents before external calls (an outbox): an operation records what it
//! is about to call, in its claim's commit, before the call; records what
//! the provider answered (accepted with its reference, refused, no answer;
//! or, asked before calling again, found or not); and an unanswered one
//! stays findable — after a crash, a takeover, past retention — until it
//! is answered or its operation finishes. What the answers say about
//! duplicate effects is [`answers`](super::answers)'.
//!
//! Invariants:
//! - an intent is recorded in the same commit as the claim it rides with
//!   (`begin_with_intent`), under the key's shard lock: no claim with an
//!   intent is durable without it;
//! - `Intent` records are self-contained and the latest one of a key wins
//!   (their buckets never move earlier): pending, settled (answered, or a
//!   duplicate candidate whose operation finished), or closed (the
//!   operation finished without an answer; written in the finishing
//!   record's commit);
//! - what the provider answered so far (`Calls`) is in every record and
//!   in the intent's slot, so `begin_with_intent` writes the next record
//!   under the shard lock without reading a row;
//! - an unanswered intent is never evicted silently: eviction carries it
//!   out of a bucket it deletes, and recovery keeps the pending intents of
//!   expired tables that no later `Intent` record superseded, and carries
//!   them before the tables go;
//! - a settled intent is kept until its record expires (a duplicate
//!   candidate for `duplicate_candidates`): an early eviction (`max_keys`)
//!   carries it with its own expiry instead of dropping it.

use std::collections::HashMap;

use super::Engine;
use super::claims::{Ticket, fields};
use super::listings::{ListingKind, page};
use super::write::Batch;
use crate::index::Shard;
use crate::index::intent::{IntentSlot, IntentState};
use crate::index::{Pending, SlotState};
use crate::key::KeyHash;
use crate::records::{
    ClaimFields, INTENT_CLOSED, INTENT_PENDING, INTENT_SETTLED, IntentBody, RecordRef,
};
use crate::types::intent::{Answered, Calls, Doubt};
use crate::types::{
    self as contract, Answer, Basis, Duplicate, Intent, IntentEntry, Listing, Page,
};
use crate::{Error, Key, Result};

/// A pending intent read from an expired table at open, kept until replay
/// shows whether a later `Intent` record of its key supersedes it.
pub(crate) struct ExpiredIntent {
    pub scope: Vec<u8>,
    pub id: Vec<u8>,
    pub claim: ClaimFields,
    pub body: Vec<u8>,
}

/// Pending intents of expired tables found at open, by key hash.
pub(crate) type ExpiredIntents = HashMap<KeyHash, ExpiredIntent>;

/// What an `Intent` record is written as: its state and tag, and whether
/// it rides with the caller's own record (`extra`, for group commit).
#[derive(Clone, Copy)]
pub(crate) struct IntentWrite {
    tag: u8,
    extra: bool,
}

impl IntentWrite {
    /// The record of a new attempt's intent, in its claim's commit.
    pub(crate) const BEGUN: IntentWrite = IntentWrite {
        tag: INTENT_PENDING,
        extra: true,
    };
}

impl Engine {
    /// Whether the open file holds what store format 4 adds to `Intent`
    /// and `DeadLetter` bodies (the provider's answers; first failure
    /// times) and to reconciliation (`Engine::counting`: completions
    /// counted from their own records, `Keys` and `Amount` records): the
    /// one place this build decides it. A file keeps its format until an
    /// explicit upgrade, so this is "the file's records follow format 4
    /// or later" ([`Engine::records_format`], decided at open): otherwise
    /// the writers fall back to format 3's bodies, and `mark_answered`
    /// refuses the answers only format 4 can hold.
    pub(crate) fn has_format_4_bodies(&self) -> bool {
        self.records_format() >= crate::records::BODIES_FORMAT
    }

    /// The encodings a typed outcome may be written in, in order of
    /// preference: CBOR (tag 3) needs format 4, so a format-3 file not yet
    /// upgraded gets JSON, which the build before reads (a value JSON
    /// cannot hold, such as NaN, is then refused with `Codec`).
    pub(crate) fn outcome_tags(&self) -> &'static [u8] {
        if self.has_format_4_bodies() {
            crate::codec::WRITE_TAGS
        } else {
            &[crate::codec::TAG_JSON]
        }
    }

    /// Appends an `Intent` record of `body` for the operation `c` of `key`
    /// and sets (or, closed, removes) its intent slot. The caller holds
    /// the key's shard lock and the batch lock.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn log_intent(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        (h, scope, id): (KeyHash, &[u8], &[u8]),
        c: ClaimFields,
        (now, retention_ms): (u64, u64),
        how: IntentWrite,
        body: &IntentBody<'_>,
    ) -> u64 {
        let previous = shard.intent(h).copied();
        let bytes = if self.has_format_4_bodies() {
            body.encode()
        } else {
            body.encode_v1()
        };
        let mut rec = RecordRef::intent(
            scope,
            id,
            (now, now.saturating_add(retention_ms)),
            c,
            (how.tag, &bytes),
        );
        let (bucket, row) = self.place_as(batch, previous.map(|i| i.bucket), &mut rec, how.extra);
        if how.tag == INTENT_CLOSED {
            shard.remove_intent(h);
        } else {
            shard.set_intent(IntentSlot {
                hash: h,
                bucket,
                row,
                recorded_at: body.recorded_at,
                attempt: c.attempt,
                state: if how.tag == INTENT_PENDING {
                    IntentState::Pending
                } else {
                    IntentState::Settled
                },
                calls: body.calls,
            });
        }
        row
    }

    /// The body of the intent a new attempt of `h` records at `now`
    /// (`attempt` 1: a new operation): its calls move on from the previous
    /// intent's, and it keeps the first-recorded time of a pending one.
    pub(crate) fn intent_body<'a>(
        shard: &Shard,
        h: KeyHash,
        (now, attempt): (u64, u32),
        intent: Intent<'a>,
    ) -> IntentBody<'a> {
        let previous = shard.intent(h);
        let pending = previous.filter(|i| i.state == IntentState::Pending);
        let calls = match previous {
            None => Calls::FIRST,
            // A finished operation's candidate says nothing of this one.
            Some(i) if attempt == 1 && i.state == IntentState::Settled => Calls::FIRST,
            Some(i) => i.calls.next_attempt(attempt == 1),
        };
        IntentBody {
            recorded_at: pending.map_or(now, |i| i.recorded_at),
            target: intent.target,
            calls,
            data: intent.request,
        }
    }

    /// Closes the operation's pending intent in the commit of the record
    /// that finishes it (complete, fail, resolve; `forget` closes a
    /// settled one too, so it never sticks to the key's next operation);
    /// returns the row (0: none written). A pending intent that is a
    /// duplicate candidate is settled instead, kept until its record
    /// expires (without its target and request, which only its record
    /// holds). The caller holds the shard and batch locks.
    pub(crate) fn close_intent(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        (key, sent_too): ((KeyHash, &[u8], &[u8]), bool),
        c: ClaimFields,
        at: (u64, u64),
    ) -> u64 {
        let Some(i) = shard.intent(key.0).copied() else {
            return 0;
        };
        let tag = match (sent_too, i.state, i.calls.doubted()) {
            (true, _, _) | (false, IntentState::Pending, false) => INTENT_CLOSED,
            (false, IntentState::Pending, true) => INTENT_SETTLED,
            (false, IntentState::Settled, _) => return 0,
        };
        let body = IntentBody {
            recorded_at: if tag == INTENT_CLOSED {
                at.0
            } else {
                i.recorded_at
            },
            target: "",
            calls: i.calls,
            data: &[],
        };
        let retention = at.1.saturating_sub(at.0);
        self.log_intent(
            shard,
            batch,
            key,
            c,
            (at.0, retention),
            IntentWrite { tag, extra: true },
            &body,
        )
    }

    /// Settles the operation's intent in the commit of its dead letter
    /// if the last attempt only asked the provider, which had no call
    /// (`NotFound`, and no call answered since): nothing happened, so it
    /// is not left unanswered. Returns the row (0: none written). The
    /// caller holds the shard and batch locks.
    pub(crate) fn settle_asked_intent(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        key: (KeyHash, &[u8], &[u8]),
        c: ClaimFields,
        at: (u64, u64),
    ) -> u64 {
        let Some(i) = shard
            .intent(key.0)
            .copied()
            .filter(|i| i.state == IntentState::Pending && i.calls.only_asked())
        else {
            return 0;
        };
        let body = IntentBody {
            recorded_at: i.recorded_at,
            target: "",
            calls: i.calls,
            data: &[],
        };
        self.log_intent(
            shard,
            batch,
            key,
            c,
            (at.0, at.1.saturating_sub(at.0)),
            IntentWrite {
                tag: INTENT_SETTLED,
                extra: true,
            },
            &body,
        )
    }

    /// Records what the provider answered the claim's intent (see
    /// [`Answer`]): one durable commit.
    pub(crate) fn mark_answered(
        &self,
        claim: &Ticket,
        answer: &Answer<'_>,
    ) -> Result<contract::Pending<()>> {
        self.log.check()?;
        // Before any shard lock: refusing another store's claim counts it
        // under that lock.
        self.check_owner(claim)?;
        if !matches!(answer, Answer::Accepted(_) | Answer::Found(_)) {
            self.require_format(
                "mark_answered with a refused, unknown or not-found answer (only an accepted \
                 or found reference fits format 3; an upgrade of the open store takes effect \
                 at its next open)",
                crate::records::BODIES_FORMAT,
                true,
            )?;
        }
        let h = claim.hash;
        loop {
            let (slot, target, data) = self.recorded_intent(claim)?;
            let calls = slot.calls.answered(answer);
            let data: &[u8] = match *answer {
                Answer::Accepted(reference) | Answer::Found(reference) => reference,
                Answer::Refused(reason) => reason.as_bytes(),
                // The data stays while it means the same: the request
                // (none or an unknown answer), or the reference or reason
                // of an answer a lookup did not change.
                Answer::Unknown | Answer::NotFound => {
                    let request =
                        |a| matches!(a, Answered::None | Answered::Unknown | Answered::Absent);
                    if request(slot.calls.answer) == request(calls.answer) {
                        &data
                    } else {
                        &[]
                    }
                }
            };
            self.check_intent_len(&target, data)?;
            let (now, nb) = self.time()?;
            let mut shard = self.index.lock(h);
            let p = Self::active_claim(&mut shard, h, nb, claim)?;
            if shard.intent(h) != Some(&slot) {
                continue; // carried or rewritten meanwhile: read it again
            }
            let body = IntentBody {
                recorded_at: slot.recorded_at,
                target: &target,
                calls,
                data,
            };
            let tag = if calls.unanswered() {
                INTENT_PENDING
            } else {
                INTENT_SETTLED
            };
            let row = {
                let mut batch = self.log.batch()?;
                self.log_intent(
                    &mut shard,
                    &mut batch,
                    (h, claim.key.scope(), claim.key.id()),
                    fields(&p),
                    (now, p.retention_ms),
                    IntentWrite { tag, extra: false },
                    &body,
                )
            };
            drop(shard);
            return Ok(contract::Pending::new((), Basis::written(row)));
        }
    }

    /// The intent `claim`'s operation recorded, and its target and data
    /// from the intent's latest record. The record is read before the
    /// shard lock is taken again (a row read, not to be done under it):
    /// the caller checks the slot is still the same once it holds it.
    fn recorded_intent(&self, claim: &Ticket) -> Result<(IntentSlot, String, Vec<u8>)> {
        let h = claim.hash;
        let slot = {
            let (_, nb) = self.time()?;
            let mut shard = self.index.lock(h);
            Self::active_claim(&mut shard, h, nb, claim)?;
            shard.intent(h).copied()
        };
        let Some(slot) = slot else {
            return Err(Error::InvalidArgument {
                what: "claim",
                reason: format!(
                    "{} recorded no intent (begin it with begin_with_intent)",
                    claim.key
                ),
            });
        };
        let (target, data) = self
            .load_of((&claim.key, true), slot.bucket, slot.row, |r| {
                let b = r.intent_body()?;
                Ok((b.target.to_owned(), b.data.to_vec()))
            })?
            .unwrap_or_default();
        Ok((slot, target, data))
    }

    /// The operation's intent, if it recorded one that is pending or
    /// settled.
    pub(crate) fn intent(&self, key: &Key<'_>) -> Result<Option<IntentEntry>> {
        self.check_readable()?;
        self.check_key(key)?;
        let h = self.hash(key);
        loop {
            let Some(slot) = self.index.lock(h).intent(h).copied() else {
                return Ok(None);
            };
            if let Some(entry) = self.load_intent(h, slot)? {
                return Ok(Some(entry));
            }
            // Evicted, or rewritten in the same row (closed, answered):
            // gone if the index still says what it said.
            if self.index.lock(h).intent(h) == Some(&slot) {
                return Ok(None);
            }
        }
    }

    /// The entry of the intent at `slot`; `None` if its bucket was evicted
    /// meanwhile, or if the row's latest Intent record of the key is no
    /// longer in the slot's state: a later record of the key (the close
    /// of a `complete`, an answer) joined the row after the slot was read,
    /// and is the key's intent now.
    fn load_intent(&self, h: KeyHash, slot: IntentSlot) -> Result<Option<IntentEntry>> {
        let tag = match slot.state {
            IntentState::Pending => INTENT_PENDING,
            IntentState::Settled => INTENT_SETTLED,
        };
        let found = self.load_hashed((h, true), slot.bucket, slot.row, |r| {
            if r.outcome_tag != tag {
                return Ok(None);
            }
            let body = r.intent_body()?;
            let c = r.claim_fields();
            Ok(Some(IntentEntry {
                key: Key::owned(r.scope.to_vec(), r.id.to_vec()),
                target: body.target.to_owned(),
                answer: body.calls.answer,
                unanswered: body.calls.unanswered(),
                duplicate: match body.calls.doubt {
                    Doubt::None => None,
                    Doubt::AfterUnknown => Some(Duplicate::AfterUnknown),
                    Doubt::TwoReferences => Some(Duplicate::TwoReferences),
                    Doubt::Unrecorded => Some(Duplicate::Unrecorded),
                },
                data: body.data.to_vec(),
                provider_key: crate::key::provider_key(
                    &self.hasher.secret(),
                    r.scope,
                    r.id,
                    c.first_at,
                    c.params,
                ),
                recorded_at: body.recorded_at,
                attempt: c.attempt,
            }))
        })?;
        Ok(found.flatten())
    }

    /// A page of the unanswered intents, by when they were recorded.
    pub(crate) fn pending_intents(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        self.intents_listed((listing, ListingKind::PendingIntents), |i| {
            i.state == IntentState::Pending
        })
    }

    /// A page of the duplicate candidates, by when they were recorded.
    pub(crate) fn duplicate_candidates(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        self.intents_listed((listing, ListingKind::DuplicateCandidates), |i| {
            i.calls.doubted()
        })
    }

    /// A page of the intents `want` picks, by when they were recorded.
    fn intents_listed(
        &self,
        listing: (&Listing, ListingKind),
        want: impl Fn(&IntentSlot) -> bool,
    ) -> Result<Page<IntentEntry>> {
        self.check_readable()?;
        let found = self.items_listed(listing, |shard, out| {
            for i in shard.intents() {
                if want(i) {
                    out.push((i.recorded_at, i.hash, 0, *i));
                }
            }
        })?;
        page(
            listing.0,
            found,
            |i: IntentSlot| self.load_intent(i.hash, i),
            |e| e.key().scope(),
        )
    }

    /// How many intents are unanswered.
    pub(crate) fn pending_intent_count(&self) -> u64 {
        let mut n = 0;
        for i in 0..self.cfg.shards {
            let shard = self.index.lock_shard(i);
            n += shard
                .intents()
                .filter(|i| i.state == IntentState::Pending)
                .count() as u64;
        }
        n
    }

    /// Handles the intent `rec` of bucket `b` (row `n`), being evicted, if
    /// it is its key's latest: an unanswered one is re-logged into the
    /// open batch; a settled one too while its record has not expired (an
    /// early eviction), with its own expiry, and forgotten otherwise. The
    /// caller holds the shard lock.
    pub(crate) fn evict_intent(
        &self,
        shard: &mut Shard,
        h: KeyHash,
        (b, n): (u64, u64),
        rec: &RecordRef<'_>,
        now: u64,
    ) -> Result<()> {
        let Some(slot) = shard.intent(h).copied() else {
            return Ok(());
        };
        if slot.bucket != b || slot.row != n {
            return Ok(());
        }
        let (retention_ms, tag) = match slot.state {
            IntentState::Pending => (self.cfg.retention_ms, INTENT_PENDING),
            IntentState::Settled if rec.expires > now => {
                (rec.expires.saturating_sub(now), INTENT_SETTLED)
            }
            IntentState::Settled => {
                shard.remove_intent(h);
                return Ok(());
            }
        };
        let body = rec.intent_body()?;
        let mut batch = self.log.batch()?;
        self.log_intent(
            shard,
            &mut batch,
            (h, rec.scope, rec.id),
            rec.claim_fields(),
            (now, retention_ms),
            IntentWrite { tag, extra: false },
            &body,
        );
        Ok(())
    }

    /// At open: the pending intents of expired tables that no later
    /// `Intent` record superseded, each carried into the open batch.
    pub(crate) fn carry_expired_intents(&self, found: ExpiredIntents) -> Result<()> {
        let now = self.now();
        for (h, d) in found {
            let mut shard = self.index.lock(h);
            if shard.intent(h).is_some() {
                continue; // a live record of it came later
            }
            let body = IntentBody::decode(&d.body, false, d.claim.attempt).ok_or_else(|| {
                Error::Corrupt(format!(
                    "the Intent record of {} has a malformed {}-byte body",
                    crate::error::show_key(&d.scope, &d.id),
                    d.body.len()
                ))
            })?;
            let mut batch = self.log.batch()?;
            self.log_intent(
                &mut shard,
                &mut batch,
                (h, &d.scope, &d.id),
                d.claim,
                (now, self.cfg.retention_ms),
                IntentWrite {
                    tag: INTENT_PENDING,
                    extra: false,
                },
                &body,
            );
        }
        Ok(())
    }

    /// The claim's pending details if it is its key's active claim (for
    /// `mark_answered`, which does not finish it). The caller checked that
    /// the claim is this store's.
    fn active_claim(shard: &mut Shard, h: KeyHash, nb: u64, claim: &Ticket) -> Result<Pending> {
        let w = super::write::Write::new(shard, h, nb);
        match (w.live().map(|s| s.state()), w.pending()) {
            (Some(SlotState::Claimed), Some(p)) if p.token == claim.token => Ok(p),
            _ => {
                shard.counters.fenced += 1;
                Err(Error::ClaimLost {
                    key: claim.key.to_string(),
                    attempt: claim.attempt,
                    token: claim.token,
                    reason: "it is no longer the key's active claim",
                })
            }
        }
    }
}
