//! The sharded in-memory index: every lookup is answered here.
//!
//! Invariants:
//! - a key's slot is created or changed only under its shard's lock, and the
//!   log record for that change is appended before the lock is released, so
//!   the log's order for one key is the order of its decisions;
//! - the shard comes from the top bits of `hi`; the slot table places a key
//!   by `lo`, so the two never share bits;
//! - `pending` holds the details of keys whose slot is `Claimed`,
//!   `Released` (a few per worker) or `DeadLettered`, and the first-attempt
//!   time of keys whose slot is `Forgotten`, so the slot itself stays 24
//!   bytes.

pub(crate) mod counters;
pub(crate) mod entity;
mod grow;
pub(crate) mod intent;
mod slot;
mod table;
pub(crate) mod tally;

use hashbrown::HashTable;

use crate::key::{Key, KeyHash};
use crate::sync::{Arc, Mutex, MutexGuard};
pub(crate) use counters::Counters;
use entity::Entity;
use grow::GrowQueue;
pub(crate) use grow::Grower;
use intent::IntentSlot;
pub(crate) use slot::{MAX_BUCKET_SPAN, Slot, SlotState};
pub(crate) use table::Probe;
use table::SlotTable;

/// Details of a live or released claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    pub hash: KeyHash,
    pub attempt: u32,
    pub token: u64,
    pub first_at: u64,
    pub lease_until: u64,
    pub params: u128,
    /// The claim's lease (what a renewal extends it by), in ms.
    pub lease_ms: u64,
    /// The operation's retention, in ms: its records expire this long
    /// after they are written.
    pub retention_ms: u64,
    /// Released for a retry with any request: the next attempt may bring
    /// another fingerprint.
    pub any_request: bool,
    /// Released because its claim was dropped without an answer.
    pub abandoned: bool,
    /// Dead-lettered: when its last attempt failed (0 otherwise).
    pub failed_at: u64,
    /// The round of attempts this claim belongs to.
    pub round: Round,
}

/// A round of an operation's attempts: from its first attempt, and again
/// from each requeue. Retry limits count within a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Round {
    /// Attempts of earlier rounds (0 in the first round).
    pub before: u32,
    /// When the round began, in ms (the first attempt, or the requeue).
    pub since: u64,
    /// Attempts of this round, before the latest, that ended without an
    /// answer (their worker died, their lease lapsed, their claim was
    /// dropped).
    pub interrupted: u32,
    /// When the round's first failure came, in ms (0: none yet): a
    /// retryable failure, a dropped claim, or an attempt found stranded
    /// (its lease lapsed, its process gone). A dead letter reports it.
    pub first_failed_at: u64,
}

impl Round {
    /// The first round of an operation first claimed at `first_at`.
    pub(crate) fn first(first_at: u64) -> Round {
        Round {
            before: 0,
            since: first_at,
            interrupted: 0,
            first_failed_at: 0,
        }
    }
}

/// One shard: the slot table and the pending-claim details.
#[derive(Default)]
pub(crate) struct Shard {
    slots: SlotTable,
    pending: HashTable<Pending>,
    /// Intents of operations, by the operation's key hash.
    intents: HashTable<IntentSlot>,
    /// Entity states (versions, sequencers), in their own hash domain.
    entities: HashTable<Entity>,
    /// Operation counters, kept per shard so the hot path bumps a line it
    /// already owns.
    pub counters: Counters,
    /// Completions counted for reconciliation since the last fold (see
    /// [`tally`]).
    pub tallies: tally::ShardTallies,
    /// Where to ask for background growth, and this shard's number.
    grow: Option<(Arc<GrowQueue>, u32)>,
    /// Asked for growth, not yet grown.
    grow_queued: bool,
}

impl Shard {
    pub(crate) fn get(&self, h: KeyHash) -> Option<&Slot> {
        self.slots.get(h)
    }

    /// See [`SlotTable::touch`].
    pub(crate) fn touch(&self, h: KeyHash) -> u64 {
        self.slots.touch(h)
    }

    /// Sets the key's slot, creating it if needed.
    pub(crate) fn put(&mut self, h: KeyHash, state: SlotState, bucket: u64, row: u64) {
        self.put_at(self.probe(h), h, state, bucket, row);
    }

    /// Where the key's slot is, or would go: one walk that a following
    /// [`put_at`](Self::put_at) reuses.
    pub(crate) fn probe(&self, h: KeyHash) -> Probe {
        self.slots.probe(h)
    }

    /// The key's slot from a probe.
    pub(crate) fn slot(&self, probe: Probe) -> Option<&Slot> {
        match probe {
            Probe::Found(pos) => Some(self.slots.at(pos)),
            Probe::Vacant { .. } => None,
        }
    }

    /// [`put`](Self::put) where `probe` was made for `h` with no change to
    /// this shard since.
    pub(crate) fn put_at(
        &mut self,
        probe: Probe,
        h: KeyHash,
        state: SlotState,
        bucket: u64,
        row: u64,
    ) {
        match probe {
            Probe::Found(pos) => self.slots.at_mut(pos).set(state, bucket, row),
            Probe::Vacant { .. } => {
                self.slots
                    .insert_vacant(probe, Slot::new(h, state, bucket, row));
                if !self.grow_queued
                    && self.slots.wants_growth()
                    && let Some((queue, i)) = &self.grow
                {
                    self.grow_queued = true;
                    queue.request(*i);
                }
            }
        }
    }

    /// The capacity to allocate for the growth this shard asked the
    /// grower for, if it still wants it.
    pub(crate) fn queued_growth_cap(&self) -> Option<usize> {
        if self.grow_queued {
            self.slots.early_growth_cap()
        } else {
            None
        }
    }

    /// Grows the table into `blank` (see [`SlotTable::grow_early`]) if it
    /// asked the grower to; returns the allocation to free.
    pub(crate) fn grow_if_queued(&mut self, blank: Vec<Slot>) -> Vec<Slot> {
        if std::mem::take(&mut self.grow_queued) {
            self.slots.grow_early(blank)
        } else {
            blank
        }
    }

    pub(crate) fn remove(&mut self, h: KeyHash) {
        self.slots.remove(h);
        self.remove_pending(h);
    }

    pub(crate) fn pending(&self, h: KeyHash) -> Option<&Pending> {
        self.pending.find(h.lo, |p| p.hash == h)
    }

    pub(crate) fn set_pending(&mut self, p: Pending) {
        match self.pending.find_mut(p.hash.lo, |q| q.hash == p.hash) {
            Some(q) => *q = p,
            None => {
                self.pending.insert_unique(p.hash.lo, p, |q| q.hash.lo);
            }
        }
    }

    /// Every key's slot in this shard (the listing of live records).
    pub(crate) fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter()
    }

    /// Every pending entry with its key's slot state.
    pub(crate) fn pending_entries(&self) -> impl Iterator<Item = (&Pending, Option<SlotState>)> {
        self.pending
            .iter()
            .map(|p| (p, self.slots.get(p.hash).map(Slot::state)))
    }

    pub(crate) fn remove_pending(&mut self, h: KeyHash) {
        // Most shards hold no claim at all (plain dedup): skip the lookup.
        if self.pending.is_empty() {
            return;
        }
        if let Ok(e) = self.pending.find_entry(h.lo, |p| p.hash == h) {
            e.remove();
        }
    }

    /// The operation's intent, if it recorded one.
    pub(crate) fn intent(&self, h: KeyHash) -> Option<&IntentSlot> {
        if self.intents.is_empty() {
            return None;
        }
        self.intents.find(h.lo, |i| i.hash == h)
    }

    /// Sets the operation's intent.
    pub(crate) fn set_intent(&mut self, i: IntentSlot) {
        match self.intents.find_mut(i.hash.lo, |q| q.hash == i.hash) {
            Some(q) => *q = i,
            None => {
                self.intents.insert_unique(i.hash.lo, i, |q| q.hash.lo);
            }
        }
    }

    /// Forgets the operation's intent.
    pub(crate) fn remove_intent(&mut self, h: KeyHash) {
        if self.intents.is_empty() {
            return;
        }
        if let Ok(e) = self.intents.find_entry(h.lo, |i| i.hash == h) {
            e.remove();
        }
    }

    /// Every intent in the shard.
    pub(crate) fn intents(&self) -> impl Iterator<Item = &IntentSlot> {
        self.intents.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The entity's state if it has one that has not expired (an entity
    /// with parked, held or unacknowledged events never expires).
    pub(crate) fn entity(&self, h: KeyHash, now_bucket: u64) -> Option<&Entity> {
        self.entities
            .find(h.lo, |e| e.hash == h)
            .filter(|e| e.bucket >= now_bucket || e.has_events())
    }

    /// The entity's state if it has one that has not expired, to change.
    pub(crate) fn entity_live_mut(&mut self, h: KeyHash, now_bucket: u64) -> Option<&mut Entity> {
        self.entities
            .find_mut(h.lo, |e| e.hash == h)
            .filter(|e| e.bucket >= now_bucket || e.has_events())
    }

    /// The entity's state, created fresh if it has none or it expired.
    pub(crate) fn entity_mut(&mut self, h: KeyHash, now_bucket: u64, key: &Key<'_>) -> &mut Entity {
        let e = match self.entities.entry(h.lo, |e| e.hash == h, |e| e.hash.lo) {
            hashbrown::hash_table::Entry::Occupied(o) => o.into_mut(),
            hashbrown::hash_table::Entry::Vacant(v) => v.insert(Entity::new(h, key)).into_mut(),
        };
        if e.bucket < now_bucket && !e.has_events() && e.row != 0 {
            *e = Entity::new(h, key);
        }
        e
    }

    /// The entity's state for recovery and eviction, without expiry checks.
    pub(crate) fn entity_raw(&mut self, h: KeyHash) -> Option<&mut Entity> {
        self.entities.find_mut(h.lo, |e| e.hash == h)
    }

    pub(crate) fn remove_entity(&mut self, h: KeyHash) {
        if let Ok(e) = self.entities.find_entry(h.lo, |e| e.hash == h) {
            e.remove();
        }
    }

    /// Entities with parked, held or unacknowledged events.
    pub(crate) fn entities_with_events(&mut self) -> impl Iterator<Item = &mut Entity> {
        self.entities.iter_mut().filter(|e| e.has_events())
    }

    /// After replay: drops the events each entity's core state consumed,
    /// then every entity left without events whose state expired before
    /// `now_bucket`.
    pub(crate) fn settle_entities(&mut self, now_bucket: u64) {
        for e in &mut self.entities {
            e.trim();
        }
        self.entities
            .retain(|e| e.has_events() || e.bucket >= now_bucket);
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.slots.allocation_size() + self.pending.allocation_size()
    }

    /// Counts of entities, and of parked, held and unacknowledged events.
    pub(crate) fn entity_usage(&self) -> [usize; 4] {
        self.entities.iter().fold([0; 4], |[n, p, h, u], e| {
            [
                n + 1,
                p + e.parked.len(),
                h + e.held.len(),
                u + e.unacked.len(),
            ]
        })
    }

    pub(crate) fn reserve(&mut self, additional: usize) {
        self.slots.reserve(additional);
    }
}

/// A shard padded to its own cache lines, so two shard locks never share one.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

/// Power-of-two shards of [`Shard`], each behind a mutex from `crate::sync`
/// (`parking_lot`'s, or loom's under `cfg(dedupkv_loom)`).
pub(crate) struct ShardedIndex {
    shards: Box<[Padded]>,
    shift: u32,
    grow: Arc<GrowQueue>,
    /// Reconciliation windows folded out of the shards (see [`tally`]).
    tallies: Mutex<tally::Tallies>,
    /// Held by whoever moves windows between the shards and `tallies`, or
    /// reads both (see [`tally`]).
    tally_fold: Mutex<()>,
}

impl ShardedIndex {
    /// `shards` must be a power of two (the builder checks).
    pub(crate) fn new(shards: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        let bits = shards.trailing_zeros();
        let grow = Arc::new(GrowQueue::default());
        Self {
            shards: (0..shards)
                .map(|i| {
                    Padded(Mutex::new(Shard {
                        grow: Some((Arc::clone(&grow), i as u32)),
                        ..Shard::default()
                    }))
                })
                .collect(),
            shift: if bits == 0 { 64 } else { 64 - bits },
            grow,
            tallies: Mutex::new(tally::Tallies::new()),
            tally_fold: Mutex::new(()),
        }
    }

    /// The store-wide reconciliation windows: the innermost lock, taken
    /// last and held briefly.
    pub(crate) fn tallies(&self) -> MutexGuard<'_, tally::Tallies> {
        self.tallies.lock()
    }

    /// The fold lock of the reconciliation windows: the outermost lock,
    /// never taken by a completion.
    pub(crate) fn tally_fold(&self) -> MutexGuard<'_, ()> {
        self.tally_fold.lock()
    }

    /// Every shard, locked in ascending order (as two-shard calls lock
    /// theirs, so neither deadlocks the other).
    pub(crate) fn lock_all(&self) -> Vec<MutexGuard<'_, Shard>> {
        self.shards.iter().map(|s| s.0.lock()).collect()
    }

    /// [`new`](Self::new), with room for `keys` keys spread evenly.
    pub(crate) fn with_capacity(shards: usize, keys: usize) -> Self {
        let index = Self::new(shards);
        if keys > 0 {
            let per = keys.div_ceil(shards);
            for i in 0..shards {
                index.lock_shard(i).reserve(per);
            }
        }
        index
    }

    /// The queue the shards ask for growth on (see [`Grower`]).
    pub(crate) fn grow_queue(&self) -> Arc<GrowQueue> {
        Arc::clone(&self.grow)
    }

    /// How many shards there are.
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub(crate) fn shard_of(&self, h: KeyHash) -> usize {
        h.hi.checked_shr(self.shift).unwrap_or(0) as usize
    }

    pub(crate) fn lock(&self, h: KeyHash) -> MutexGuard<'_, Shard> {
        self.shards[self.shard_of(h)].0.lock()
    }

    pub(crate) fn lock_shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i].0.lock()
    }

    /// Shard `i`, if its lock is free.
    pub(crate) fn try_lock_shard(&self, i: usize) -> Option<MutexGuard<'_, Shard>> {
        self.shards[i].0.try_lock()
    }

    /// Entities, and parked, held and unacknowledged events, one shard at
    /// a time.
    pub(crate) fn entity_usage(&self) -> [usize; 4] {
        self.shards.iter().fold([0; 4], |mut sum, s| {
            let one = s.0.lock().entity_usage();
            for (t, x) in sum.iter_mut().zip(one) {
                *t += x;
            }
            sum
        })
    }

    /// Total keys and heap bytes, one shard at a time (not a snapshot).
    pub(crate) fn usage(&self) -> (usize, usize, Counters) {
        let mut c = Counters::default();
        let (k, b) = self.shards.iter().fold((0, 0), |(k, b), s| {
            let g = s.0.lock();
            c.add(&g.counters);
            (k + g.len(), b + g.heap_bytes())
        });
        (k, b, c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_choice_uses_top_bits_of_hi() {
        let idx = ShardedIndex::new(64);
        assert_eq!(
            idx.shard_of(KeyHash {
                hi: u64::MAX,
                lo: 0
            }),
            63
        );
        assert_eq!(
            idx.shard_of(KeyHash {
                hi: 1 << 58,
                lo: u64::MAX
            }),
            1
        );
        assert_eq!(
            ShardedIndex::new(1).shard_of(KeyHash {
                hi: u64::MAX,
                lo: 1
            }),
            0
        );
    }

    #[test]
    fn put_get_remove_with_pending() {
        let mut s = Shard::default();
        let h = KeyHash { hi: 3, lo: 4 };
        assert!(s.get(h).is_none());
        s.put(h, SlotState::Claimed, 10, 20);
        s.set_pending(Pending {
            hash: h,
            attempt: 1,
            token: 9,
            first_at: 0,
            lease_until: 5,
            params: 0,
            lease_ms: 5,
            retention_ms: 10,
            any_request: false,
            abandoned: false,
            failed_at: 0,
            round: Round::first(0),
        });
        assert_eq!(s.get(h).map(Slot::state), Some(SlotState::Claimed));
        assert_eq!(s.pending(h).map(|p| p.token), Some(9));
        s.put(h, SlotState::Completed, 11, 21);
        assert_eq!(s.get(h).map(|x| x.row(100)), Some(21));
        s.remove(h);
        assert!(s.get(h).is_none() && s.pending(h).is_none());
    }
}
