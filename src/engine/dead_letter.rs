//! The dead-letter area: operations whose retries were exhausted
//! (`Failure::Exhausted`), kept until an operator requeues or resolves
//! them (or forgets the key).
//!
//! A dead letter is the key's latest record, a `DeadLetter` record, and
//! its slot is `DeadLettered` with its details in `pending`. So it is in
//! the same file and the same commits as every other record, and `begin`
//! answers it from the index like any finished key.
//!
//! Invariants:
//! - a dead letter is never evicted silently: eviction re-logs (carries)
//!   a dead letter out of a bucket it deletes, in the open batch, so it is
//!   committed no later than the deletion; a store closed past the
//!   bucket's expiry does the same at open (recovery keeps the dead
//!   letters of expired tables whose key has no later record, and carries
//!   them before the tables are deleted);
//! - a dead letter leaves only by a later record of its key: `requeue`
//!   (a Release: the next `begin` is attempt n + 1), `resolve` (a Complete
//!   or a Fail record), or `forget`;
//! - listings read a snapshot shard by shard, oldest first by the time of
//!   the last failure, then by key hash, so a cursor pages without repeats.

use std::collections::HashMap;

use super::Engine;
use super::claims::fields;
use super::listings::{ListingKind, page};
use super::reconcile::Completion;
use super::write::{Next, Write};
use crate::codec::TAG_RAW;
use crate::index::{Pending, Round, SlotState};
use crate::key::KeyHash;
use crate::records::{ClaimFields, Kind, RecordRef};
use crate::types::{self as contract, Basis, DeadLetter, Listing, Page, Resolution};
use crate::{Key, Result};

/// A dead letter read from an expired table at open, kept until replay
/// shows whether a later record of its key supersedes it.
pub(crate) struct ExpiredDeadLetter {
    pub scope: Vec<u8>,
    pub id: Vec<u8>,
    pub claim: ClaimFields,
    pub body: Vec<u8>,
    pub failed_at: u64,
}

/// Dead letters of expired tables found at open, by key hash.
pub(crate) type ExpiredDeadLetters = HashMap<KeyHash, ExpiredDeadLetter>;

impl Engine {
    /// A page of the dead-letter area.
    pub(crate) fn dead_letters(&self, listing: &Listing) -> Result<Page<DeadLetter>> {
        self.check_readable()?;
        let found = self.keys_listed((listing, ListingKind::DeadLetters), |p, state| {
            (state == Some(SlotState::DeadLettered)).then_some(p.failed_at)
        })?;
        page(
            listing,
            found,
            |(h, bucket, row)| {
                // A record written meanwhile into the same row (a requeue, a
                // resolve) is the key's latest: no longer a dead letter.
                let found = self.load_hashed((h, false), bucket, row, |r| {
                    (r.kind == Kind::DeadLetter)
                        .then(|| self.dead_letter_of(r))
                        .transpose()
                })?;
                Ok(found.flatten())
            },
            |d| d.key().scope(),
        )
    }

    /// Requeues a dead letter: the key becomes claimable again, its next
    /// attempt numbered after the last. `false` if it is not dead-lettered.
    pub(crate) fn requeue(&self, key: &Key<'_>) -> Result<contract::Pending<bool>> {
        self.leave_dead_letter(key, |p, scope, id, at| {
            let p = Pending {
                lease_until: 0,
                failed_at: 0,
                round: Round::requeued(p.attempt, at.0),
                ..p
            };
            (
                Next::Released(p),
                RecordRef::release(scope, id, at, fields(&p), TAG_RAW),
            )
        })
    }

    /// Resolves a dead letter with a final outcome or a note. `false` if
    /// it is not dead-lettered.
    pub(crate) fn resolve(
        &self,
        key: &Key<'_>,
        resolution: Resolution<'_>,
    ) -> Result<contract::Pending<bool>> {
        let (kind_done, bytes): (bool, &[u8]) = match resolution {
            Resolution::Completed(outcome) => (true, outcome),
            Resolution::Abandoned(note) => (false, note.as_bytes()),
        };
        self.check_outcome(bytes)?;
        self.leave_dead_letter(key, |p, scope, id, at| {
            let c = ClaimFields {
                lease_until: 0,
                ..fields(&p)
            };
            if kind_done {
                (
                    Next::Completed,
                    RecordRef::complete(scope, id, at, c, (TAG_RAW, bytes)),
                )
            } else {
                (
                    Next::Failed,
                    RecordRef::fail(scope, id, at, c, (TAG_RAW, bytes)),
                )
            }
        })
    }

    /// Writes the record `make` gives for a dead-lettered key (under its
    /// shard lock, like every write); `false` if the key is not one.
    fn leave_dead_letter<'k>(
        &self,
        key: &'k Key<'_>,
        make: impl FnOnce(Pending, &'k [u8], &'k [u8], (u64, u64)) -> (Next, RecordRef<'k>),
    ) -> Result<contract::Pending<bool>> {
        let (h, now, nb) = self.write_start(key)?;
        let mut shard = self.index.lock(h);
        let w = Write::new(&mut shard, h, nb);
        let Some(p) = w
            .live()
            .filter(|s| s.state() == SlotState::DeadLettered)
            .and_then(|_| w.pending())
        else {
            return Ok(contract::Pending::settled(false));
        };
        let at = (now, now.saturating_add(p.retention_ms));
        let (next, rec) = make(p, key.scope(), key.id(), at);
        // A requeue's Release record carries the round it starts.
        let round = match &next {
            Next::Released(p) => Some(self.round_bytes(p)),
            _ => None,
        };
        let mut rec = match &round {
            Some(r) => rec.with_round(r.as_slice()),
            None => rec,
        };
        let settled = !matches!(next, Next::Released(_));
        let completed = matches!(next, Next::Completed);
        let row = {
            let mut batch = self.log.batch()?;
            let mut row = w.append(self, &mut batch, next, &mut rec);
            if completed {
                let done = Completion {
                    scope: key.scope(),
                    id: key.id(),
                    provider_key: crate::key::provider_key(
                        &self.hasher.secret(),
                        key.scope(),
                        key.id(),
                        p.first_at,
                        p.params,
                    ),
                    at,
                    amount: 0,
                };
                row = row.max(self.count_completion(&mut shard, &mut batch, &done));
            }
            if settled {
                let key = (h, key.scope(), key.id());
                row = row.max(self.close_intent(
                    &mut shard,
                    &mut batch,
                    (key, false),
                    fields(&p),
                    at,
                ));
            }
            row
        };
        drop(shard);
        Ok(contract::Pending::new(true, Basis::written(row)))
    }

    /// How many dead letters there are, and when the oldest failed.
    pub(crate) fn dead_letter_usage(&self) -> (u64, Option<u64>) {
        let mut n = 0;
        let mut oldest: Option<u64> = None;
        for i in 0..self.cfg.shards {
            let shard = self.index.lock_shard(i);
            for (p, state) in shard.pending_entries() {
                if state == Some(SlotState::DeadLettered) {
                    n += 1;
                    oldest = Some(oldest.map_or(p.failed_at, |o| o.min(p.failed_at)));
                }
            }
        }
        (n, oldest)
    }

    /// Re-logs the dead letter `rec` (read from bucket `b`, which is being
    /// evicted) into the open batch, if its key's slot still points at it.
    /// The caller holds the key's shard lock (`w`).
    pub(crate) fn carry_dead_letter(
        &self,
        w: Write<'_>,
        rec: &RecordRef<'_>,
        now: u64,
    ) -> Result<()> {
        let Some(p) = w.pending() else {
            return Ok(());
        };
        let mut carried = RecordRef::dead_letter(
            rec.scope,
            rec.id,
            (
                now,
                now.saturating_add(p.retention_ms.max(self.cfg.retention_ms)),
            ),
            rec.claim_fields(),
            rec.outcome,
        );
        let mut batch = self.log.batch()?;
        w.append(self, &mut batch, Next::DeadLettered(p), &mut carried);
        Ok(())
    }

    /// At open: puts the dead letters of expired tables that no later
    /// record superseded back into the index, each carried into the open
    /// batch (committed with or before the expired tables' deletion).
    pub(crate) fn carry_expired_dead_letters(&self, found: ExpiredDeadLetters) -> Result<()> {
        let now = self.now();
        let nb = self.bucket_of(now);
        for (h, d) in found {
            let mut shard = self.index.lock(h);
            let w = Write::new(&mut shard, h, nb);
            if w.recorded().is_some() {
                continue; // a live record of the key came later
            }
            let p = Pending {
                hash: h,
                attempt: d.claim.attempt,
                token: d.claim.token,
                first_at: d.claim.first_at,
                lease_until: 0,
                params: d.claim.params,
                lease_ms: self.cfg.lease_ms,
                retention_ms: self.cfg.retention_ms,
                any_request: false,
                abandoned: false,
                failed_at: d.failed_at,
                round: Round::first(d.claim.first_at),
            };
            let mut rec = RecordRef::dead_letter(
                &d.scope,
                &d.id,
                (now, now.saturating_add(p.retention_ms)),
                d.claim,
                &d.body,
            );
            let mut batch = self.log.batch()?;
            w.append(self, &mut batch, Next::DeadLettered(p), &mut rec);
        }
        Ok(())
    }
}
