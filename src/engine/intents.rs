//! Intents before external calls (an outbox): an operation records what it
//! is about to call, in its claim's commit, before the call; marks it sent
//! with the provider's reference when the provider answers; and an
//! unanswered one stays findable — after a crash, a takeover, past
//! retention — until it is answered or its operation finishes.
//!
//! Invariants:
//! - an intent is recorded in the same commit as the claim it rides with
//!   (`begin_with_intent`), under the key's shard lock: no claim with an
//!   intent is durable without it;
//! - `Intent` records are self-contained and the latest one of a key wins
//!   (their buckets never move earlier): pending, sent (with the
//!   reference), or closed (the operation finished without a `mark_sent`;
//!   written in the finishing record's commit);
//! - an unanswered intent is never evicted silently: eviction carries it
//!   out of a bucket it deletes, and recovery keeps the pending intents of
//!   expired tables that no later `Intent` record superseded, and carries
//!   them before the tables go;
//! - a sent intent is kept until its record expires, for the listing of
//!   operations whose effect may have happened twice.

use std::collections::HashMap;

use super::Engine;
use super::claims::{Ticket, fields};
use super::listings::page;
use crate::index::Shard;
use crate::index::intent::{IntentSlot, IntentState};
use crate::index::{Pending, SlotState};
use crate::key::KeyHash;
use crate::log::body::IntentBody;
use crate::log::commit::Batch;
use crate::log::record::{ClaimFields, INTENT_PENDING, INTENT_SENT, RecordRef};
use crate::types::{IntentEntry, Listing, Page};
use crate::{Error, Key, Result};

/// The `outcome_tag` of an `Intent` record closed without an answer.
pub(crate) const INTENT_CLOSED: u8 = 2;

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

impl Engine {
    /// Appends an `Intent` record for the operation `c` of `key` and sets
    /// its intent slot (`extra`: it rides with the caller's own record). The caller holds the key's shard lock and the
    /// batch lock.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn log_intent(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        (h, scope, id): (KeyHash, &[u8], &[u8]),
        c: ClaimFields,
        (now, retention_ms): (u64, u64),
        (state, tag, extra): (IntentState, u8, bool),
        body: &[u8],
    ) -> u64 {
        let previous = shard.intent(h).copied();
        let mut rec = RecordRef::intent(
            scope,
            id,
            (now, now.saturating_add(retention_ms)),
            c,
            (tag, body),
        );
        let (bucket, row) = self.place_as(batch, previous.map(|i| i.bucket), &mut rec, extra);
        let recorded_at = IntentBody::decode(body).map_or(now, |b| b.recorded_at);
        if tag == INTENT_CLOSED {
            shard.remove_intent(h);
        } else {
            shard.set_intent(IntentSlot {
                hash: h,
                bucket,
                row,
                recorded_at,
                attempt: c.attempt,
                state,
            });
        }
        row
    }

    /// The body of a new pending intent of `h` at `now` (keeping the
    /// first-recorded time of an earlier pending one).
    pub(crate) fn intent_body(
        shard: &Shard,
        h: KeyHash,
        now: u64,
        target: &str,
        request: &[u8],
    ) -> Vec<u8> {
        let recorded_at = shard
            .intent(h)
            .filter(|i| i.state == IntentState::Pending)
            .map_or(now, |i| i.recorded_at);
        IntentBody {
            recorded_at,
            target,
            data: request,
        }
        .encode()
    }

    /// Closes the operation's pending intent in the commit of the record
    /// that finishes it (complete, fail, resolve; `forget` closes a sent
    /// one too, so it never sticks to the key's next operation); returns
    /// the row (0: none to close). The caller holds the shard and batch
    /// locks.
    pub(crate) fn close_intent(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        (key, sent_too): ((KeyHash, &[u8], &[u8]), bool),
        c: ClaimFields,
        at: (u64, u64),
    ) -> u64 {
        if !shard
            .intent(key.0)
            .is_some_and(|i| sent_too || i.state == IntentState::Pending)
        {
            return 0;
        }
        let body = IntentBody {
            recorded_at: at.0,
            target: "",
            data: &[],
        }
        .encode();
        let retention = at.1.saturating_sub(at.0);
        self.log_intent(
            shard,
            batch,
            key,
            c,
            (at.0, retention),
            (IntentState::Pending, INTENT_CLOSED, true),
            &body,
        )
    }

    /// Records that the provider answered the claim's intent, with its
    /// reference (a tracking number, a charge id).
    pub(crate) fn mark_sent(&self, claim: &Ticket, reference: &[u8]) -> Result<()> {
        self.log.check()?;
        // Before any shard lock: refusing another store's claim counts it
        // under that lock.
        self.check_owner(claim)?;
        let h = claim.hash;
        loop {
            // The target is read from the intent's record before the
            // shard lock is taken (a row read, not to be done under it).
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
            let target = self
                .load_of((&claim.key, true), slot.bucket, slot.row, |r| {
                    Ok(r.intent_body()?.target.to_owned())
                })?
                .unwrap_or_default();
            self.check_intent_len(&target, reference)?;
            let (now, nb) = self.time()?;
            let mut shard = self.index.lock(h);
            let p = Self::active_claim(&mut shard, h, nb, claim)?;
            if shard.intent(h) != Some(&slot) {
                continue; // carried or rewritten meanwhile: read it again
            }
            let body = IntentBody {
                recorded_at: slot.recorded_at,
                target: &target,
                data: reference,
            }
            .encode();
            let row = {
                let mut batch = self.log.batch()?;
                self.log_intent(
                    &mut shard,
                    &mut batch,
                    (h, claim.key.scope(), claim.key.id()),
                    fields(&p),
                    (now, p.retention_ms),
                    (IntentState::Sent, INTENT_SENT, false),
                    &body,
                )
            };
            drop(shard);
            return self.log.settle(row);
        }
    }

    /// The operation's intent, if it recorded one that is pending or sent.
    pub(crate) fn intent(&self, key: &Key<'_>) -> Result<Option<IntentEntry>> {
        self.check_readable()?;
        self.check_key(key)?;
        let h = self.hash(key);
        let Some(slot) = self.index.lock(h).intent(h).copied() else {
            return Ok(None);
        };
        self.load_intent(h, slot)
    }

    /// The entry of the intent at `slot`.
    fn load_intent(&self, h: KeyHash, slot: IntentSlot) -> Result<Option<IntentEntry>> {
        self.load_hashed((h, true), slot.bucket, slot.row, |r| {
            let body = r.intent_body()?;
            let c = r.claim_fields();
            Ok(IntentEntry {
                key: Key::owned(r.scope.to_vec(), r.id.to_vec()),
                target: body.target.to_owned(),
                sent: r.intent_sent(),
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
            })
        })
    }

    /// A page of intents in state `want` (`attempt_over`: only those of an
    /// attempt past that number), by when they were recorded.
    pub(crate) fn intents_listed(
        &self,
        listing: &Listing,
        want: IntentState,
        attempt_over: u32,
    ) -> Result<Page<IntentEntry>> {
        self.check_readable()?;
        let found = self.items_listed(listing, |shard, out| {
            for i in shard.intents() {
                if i.state == want && i.attempt > attempt_over {
                    out.push((i.recorded_at, i.hash, 0, *i));
                }
            }
        });
        page(
            listing,
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

    /// Re-logs the intent `rec` (read from bucket `b`, being evicted) into
    /// the open batch if it is its key's latest and unanswered; forgets a
    /// sent one whose record expires. The caller holds the shard lock.
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
        if slot.state != IntentState::Pending {
            shard.remove_intent(h);
            return Ok(());
        }
        let mut batch = self.log.batch()?;
        self.log_intent(
            shard,
            &mut batch,
            (h, rec.scope, rec.id),
            rec.claim_fields(),
            (now, self.cfg.retention_ms),
            (IntentState::Pending, INTENT_PENDING, false),
            rec.outcome,
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
            let mut batch = self.log.batch()?;
            self.log_intent(
                &mut shard,
                &mut batch,
                (h, &d.scope, &d.id),
                d.claim,
                (now, self.cfg.retention_ms),
                (IntentState::Pending, INTENT_PENDING, false),
                &d.body,
            );
        }
        Ok(())
    }

    /// The claim's pending details if it is its key's active claim (for
    /// `mark_sent`, which does not finish it). The caller checked that the
    /// claim is this store's.
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
