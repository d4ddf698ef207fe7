//! The write primitive: every write of an event key — insert, batch
//! insert, claim, renew, finish, forget, and eviction carrying a live
//! claim — goes through one [`Write`].
//!
//! A `Write` holds the key's shard (its lock is held by the caller for as
//! long as the `Write` lives) and the one probe of the key's slot run, so a
//! write walks the run once. It answers what the key's slot says (with the
//! expiry rule applied), and [`Write::append`] appends the record and
//! updates the slot and the pending-claim details together.
//!
//! Invariants kept here:
//! - the decision and the record are made under the same shard lock, and
//!   the record is appended before the lock is released;
//! - a key's record never goes to an earlier bucket than its previous
//!   record's (see [`buckets`](super::buckets));
//! - `pending` holds details exactly for keys whose slot is `Claimed`,
//!   `Released`, `Forgotten` or `DeadLettered`: [`Next`] carries them for
//!   those states and
//!   only for those, and every other append removes them.

/// The log's open batch: what every room of the engine appends its
/// records to, through this write primitive.
pub(crate) use super::Batch;
use super::Engine;
use super::buckets::unexpired;
use crate::index::{Pending, Probe, Shard, Slot, SlotState};
use crate::key::KeyHash;
use crate::records::RecordRef;
use crate::{Key, Result};

/// A key's state after a write, with the details the index keeps for it.
#[derive(Clone, Copy)]
pub(crate) enum Next {
    Inserted,
    Completed,
    Failed,
    Claimed(Pending),
    Released(Pending),
    /// Keeps the forgotten operation's first-attempt time (a new operation
    /// on the key must start later, so its provider key differs).
    Forgotten(Pending),
    /// Keeps the last attempt's details and when it failed.
    DeadLettered(Pending),
}

/// One key's write: the key's shard (borrowed from the guard of its lock,
/// which the caller holds) and the one probe of its slot run.
pub(crate) struct Write<'s> {
    shard: &'s mut Shard,
    h: KeyHash,
    probe: Probe,
    now_bucket: u64,
}

impl Engine {
    /// The key's hash (the event-key domain).
    #[inline]
    pub(crate) fn hash(&self, key: &Key<'_>) -> KeyHash {
        self.hasher.hash(key.scope(), key.id())
    }

    /// What every write on an event key starts with: validate the key,
    /// refuse if poisoned, hash it, read the clock. Returns the hash, now
    /// and the current bucket.
    #[inline]
    pub(crate) fn write_start(&self, key: &Key<'_>) -> Result<(KeyHash, u64, u64)> {
        self.check_key(key)?;
        self.log.check()?;
        let (now, nb) = self.time()?;
        Ok((self.hash(key), now, nb))
    }
}

impl<'s> Write<'s> {
    /// Starts a write of key `h` in `shard` (whose lock the caller holds),
    /// at bucket `now_bucket`: walks the key's slot run once.
    #[inline]
    pub(crate) fn new(shard: &'s mut Shard, h: KeyHash, now_bucket: u64) -> Self {
        let probe = shard.probe(h);
        Write {
            shard,
            h,
            probe,
            now_bucket,
        }
    }

    /// The key's slot if its latest record has not expired (a dead letter
    /// never does: eviction carries it), forgotten or not.
    #[inline]
    pub(crate) fn recorded(&self) -> Option<Slot> {
        self.shard
            .slot(self.probe)
            .copied()
            .filter(|s| unexpired(s, self.now_bucket) || s.state() == SlotState::DeadLettered)
    }

    /// The key's slot if the key is present: recorded, not expired, not
    /// forgotten.
    #[inline]
    pub(crate) fn live(&self) -> Option<Slot> {
        self.recorded()
            .filter(|s| s.state() != SlotState::Forgotten)
    }

    /// Whether the key's latest (unexpired) record is a forget record.
    #[inline]
    pub(crate) fn forgotten(&self) -> bool {
        self.recorded()
            .is_some_and(|s| s.state() == SlotState::Forgotten)
    }

    /// The bucket this write is made in.
    #[inline]
    pub(crate) fn now_bucket(&self) -> u64 {
        self.now_bucket
    }

    /// The key's pending details (see [`Next`]).
    #[inline]
    pub(crate) fn pending(&self) -> Option<Pending> {
        self.shard.pending(self.h).copied()
    }

    /// The shard, for its counters.
    #[inline]
    pub(crate) fn shard(&mut self) -> &mut Shard {
        self.shard
    }

    /// Appends `rec` as the key's latest record and points its slot at it,
    /// in state `next` (whose details replace the pending ones). The caller
    /// holds the batch lock. Returns the record's row.
    #[inline]
    pub(crate) fn append(
        self,
        engine: &Engine,
        batch: &mut Batch,
        next: Next,
        rec: &mut RecordRef<'_>,
    ) -> u64 {
        let floor = self.recorded().map(|s| s.bucket(self.now_bucket));
        let (bucket, row) = engine.place(batch, floor, rec);
        let (state, pending) = match next {
            Next::Inserted => (SlotState::Inserted, None),
            Next::Completed => (SlotState::Completed, None),
            Next::Failed => (SlotState::Failed, None),
            Next::Claimed(p) => (SlotState::Claimed, Some(p)),
            Next::Released(p) => (SlotState::Released, Some(p)),
            Next::Forgotten(p) => (SlotState::Forgotten, Some(p)),
            Next::DeadLettered(p) => (SlotState::DeadLettered, Some(p)),
        };
        self.shard.put_at(self.probe, self.h, state, bucket, row);
        match pending {
            Some(p) => self.shard.set_pending(p),
            None => self.shard.remove_pending(self.h),
        }
        row
    }
}
