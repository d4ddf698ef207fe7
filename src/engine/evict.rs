//! Time-bucketed retention: whole buckets leave the index and the disk.
//!
//! Invariants:
//! - a bucket is evicted from the index before its table is deleted, so a
//!   crash in between leaves a table whose event keys recovery skips (they
//!   have expired) and nothing expired comes back; its entity records are
//!   replayed, and those of entities that still had events were carried
//!   forward before the deletion began;
//! - victims are deleted one bucket at a time, oldest first, so the part of
//!   the log a crash mid-way has deleted is a prefix in (bucket, row)
//!   order: a Park record left behind was consumed, if at all, by a core
//!   record that was left behind too;
//! - a large bucket's table is deleted a slice of rows per commit
//!   (`evict_slice_bytes`), oldest first, then dropped: redb frees a
//!   dropped table's pages inside one commit, which every writer waits for.
//!   A crash part-way leaves part of an expired table, which recovery
//!   treats like a whole one (only its entity records are applied); part of an *early*-evicted (still live) table brings
//!   those of its keys back into the index, which only widens the window;
//! - the index is evicted key by key from the bucket's own log rows (the
//!   per-bucket key list lives on disk, not in memory), each key under its
//!   shard lock for a moment, so concurrent callers never wait long;
//! - only slots still pointing at the evicted bucket are removed: a key that
//!   was written again since lives in a later bucket and stays;
//! - a live bucket evicted early is closed to writers first (later records
//!   go to the next open bucket), and what was written to it before is
//!   committed before it is read, so its deletion takes no record that its
//!   index pass did not see;
//! - a size bound evicts the oldest *live* buckets early, never the bucket
//!   currently being written, and never a claim whose lease is alive: such
//!   a claim's record is carried into the open batch, so it is durable
//!   elsewhere before its bucket is deleted;
//! - the size bound counts every key but the dead letters, which are never
//!   evicted (early or not), so they cannot drive early eviction of live
//!   buckets.
//! - the reconciliation windows still kept that a deleted bucket's records
//!   count in, and the keys it holds, are written again (a Tally record
//!   per window, Keys records) into the open batch before the first
//!   deletion commit (see `reconcile`).
use super::Engine;
use super::claims::claim_record;
use super::reconcile::{TallyCarry, note_leaving};
use super::write::{Next, Write};
use crate::Result;
use crate::index::SlotState;
use crate::records::{Kind, RecordRef};
use crate::types::Eviction;

impl Engine {
    /// Evicts every expired bucket, and, over the size bound, the oldest
    /// live ones; then deletes their tables in one commit.
    pub(crate) fn evict(&self) -> Result<Eviction> {
        self.log.check()?;
        let _one_at_a_time = self.buckets.evicting.lock();
        let _span = tracing::debug_span!("dedupkv.evict").entered();
        let now = self.now();
        let g = self.cfg.granularity_ms;
        let nb = now / g;
        let write_bucket = now.saturating_add(self.cfg.retention_ms) / g;
        self.close_expired(nb)?;
        // Windows that ended leave the shards; those past their retention go.
        self.fold_tallies(now, nb);
        let buckets = self.log.buckets();
        let mut out = Eviction::default();
        let mut victims = Vec::new();
        let mut slices = Vec::new();
        let mut tallies = TallyCarry::default();
        for &b in buckets.iter().filter(|b| **b < nb) {
            out.keys += self.evict_index(b, now, false, (&mut slices, &mut tallies))?;
            victims.push(b);
        }
        if let Some(max) = self.cfg.max_keys {
            let mut keys = self.bounded_keys();
            for &b in buckets
                .iter()
                .filter(|b| **b >= nb && **b + 1 < write_bucket)
            {
                if keys <= max {
                    break;
                }
                // A live bucket can still be written to (by a short per-call
                // or entity retention): close it, and commit what was
                // written before, so the read below sees every record the
                // deletion will take.
                self.buckets
                    .closed
                    .fetch_max(b, crate::sync::Ordering::SeqCst);
                self.log.flush()?;
                let removed = self.evict_index(b, now, true, (&mut slices, &mut tallies))?;
                keys = keys.saturating_sub(removed);
                out.keys += removed;
                out.early_buckets += 1;
                victims.push(b);
            }
            if out.early_buckets > 0 {
                self.counters
                    .early_buckets
                    .fetch_add(out.early_buckets as u64, crate::sync::Ordering::Relaxed);
                tracing::warn!(
                    buckets = out.early_buckets,
                    max_keys = max,
                    "dedupkv evicted live buckets early to stay under max_keys: the dedup window shrank"
                );
            }
        }
        out.buckets = victims.len();
        self.buckets
            .evicted_through
            .fetch_max(nb, crate::sync::Ordering::Relaxed);
        self.counters
            .evicted_keys
            .fetch_add(out.keys, crate::sync::Ordering::Relaxed);
        // The counts and keys of kept windows these buckets hold go into
        // the open batch: committed by the first deletion below, or before.
        self.carry_tallies(&tallies, now)?;
        self.delete_evicted(&victims, &slices)?;
        tracing::debug!(
            keys = out.keys,
            buckets = out.buckets,
            "dedupkv eviction pass"
        );
        Ok(out)
    }

    /// Closes the expired buckets to writers and commits what was written
    /// to them before: a caller that read the time before this pass (or
    /// an entity retention shorter than a bucket) could otherwise append
    /// to a bucket after its index pass read it, and its deletion would
    /// take a record nobody re-logs. After the flush, every bucket with
    /// a record is listed, so `evicted_through` below holds for slots.
    fn close_expired(&self, nb: u64) -> Result<()> {
        if nb > 0 && self.buckets.closed.load(crate::sync::Ordering::Acquire) < nb - 1 {
            self.buckets
                .closed
                .fetch_max(nb - 1, crate::sync::Ordering::SeqCst);
            self.log.flush()?;
        }
        Ok(())
    }

    /// Deletes the evicted buckets' rows and tables, bucket by bucket,
    /// oldest first: what a crash part-way has deleted is a prefix of the
    /// log in (bucket, row) order, so an expired Park record outlives no
    /// later record that consumed it (recovery applies the entity records
    /// of expired tables).
    fn delete_evicted(
        &self,
        victims: &[u64],
        slices: &[(u64, std::ops::RangeInclusive<u64>)],
    ) -> Result<()> {
        for &b in victims {
            for (_, rows) in slices.iter().filter(|(sb, _)| *sb == b) {
                self.log.trim_bucket(b, rows.clone())?;
            }
            self.log.drop_buckets(&[b])?;
        }
        if !victims.is_empty() {
            self.buckets
                .compact_due
                .store(true, crate::sync::Ordering::Release);
        }
        Ok(())
    }

    /// The keys `max_keys` bounds: every key's slot but the dead letters'.
    /// Eviction carries a dead letter instead of removing it, so counting
    /// them would make a store whose dead letters alone exceed the bound
    /// evict its live buckets early on every pass, to no end.
    fn bounded_keys(&self) -> u64 {
        (0..self.cfg.shards)
            .map(|i| {
                let shard = self.index.lock_shard(i);
                let dead = shard
                    .pending_entries()
                    .filter(|(_, state)| *state == Some(SlotState::DeadLettered))
                    .count();
                shard.len().saturating_sub(dead) as u64
            })
            .sum()
    }

    /// Removes from the index the keys whose latest record is in bucket `b`;
    /// returns how many. Adds to `slices` the ranges of `b`'s rows to delete
    /// a commit at a time, each holding at least `evict_slice_bytes` of log;
    /// the rest, less than that, goes with the table. Notes in `tallies`
    /// the reconciliation windows and keys `b` holds.
    fn evict_index(
        &self,
        b: u64,
        now: u64,
        early: bool,
        (slices, tallies): (
            &mut Vec<(u64, std::ops::RangeInclusive<u64>)>,
            &mut TallyCarry,
        ),
    ) -> Result<u64> {
        let (nb, secret) = (now / self.cfg.granularity_ms, self.hasher.secret());
        let mut removed = 0;
        let (mut first, mut bytes) = (None, 0);
        self.log.scan_bucket(b, |n, len, records| {
            let first_row = *first.get_or_insert(n);
            bytes += len;
            if bytes >= self.cfg.evict_slice_bytes {
                slices.push((b, first_row..=n));
                (first, bytes) = (None, 0);
            }
            // Newest first: a key with several records in this row is
            // decided (carried or removed) from its latest one.
            let records = records.collect::<Result<Vec<_>>>()?;
            for rec in records.iter().rev() {
                if rec.kind.is_entity() {
                    removed += self.evict_entity_record(b, now, rec)?;
                    continue;
                }
                if rec.kind.is_tally() || rec.kind == Kind::Complete {
                    note_leaving(&self.cfg, &secret, tallies, rec, nb)?;
                    if rec.kind.is_tally() {
                        continue;
                    }
                }
                let h = self.hasher.hash(rec.scope, rec.id);
                let mut shard = self.index.lock(h);
                if rec.kind == Kind::Intent {
                    // Beside the key's state: an unanswered one is carried.
                    self.evict_intent(&mut shard, h, (b, n), rec, now)?;
                    continue;
                }
                let Some(slot) = shard.get(h).copied() else {
                    continue;
                };
                // Widened against `b` itself: exact however far the time
                // jumped since the slot was written (see `Engine::time`).
                if slot.bucket(b) != b {
                    continue;
                }
                if slot.state() == SlotState::DeadLettered {
                    // Never evicted: carried out of the bucket from its own
                    // (latest) record; older records of the key are skipped.
                    if rec.kind == Kind::DeadLetter && slot.row(self.log.open_row()) == n {
                        let w = Write::new(&mut shard, h, self.bucket_of(now));
                        self.carry_dead_letter(w, rec, now)?;
                    }
                    continue;
                }
                if early
                    && slot.state() == SlotState::Claimed
                    && let Some(p) = shard.pending(h).filter(|p| p.lease_until > now).copied()
                {
                    // A live claim stays, and so must its record: carried
                    // into the open batch, it is committed no later than
                    // this bucket's deletion (like an entity's core record).
                    let mut batch = self.log.batch()?;
                    let round = self.round_bytes(&p);
                    let mut carried =
                        claim_record(rec.scope, rec.id, &p, now).with_round(round.as_slice());
                    Write::new(&mut shard, h, self.bucket_of(now)).append(
                        self,
                        &mut batch,
                        Next::Claimed(p),
                        &mut carried,
                    );
                    continue;
                }
                shard.remove(h);
                removed += 1;
            }
            Ok(())
        })?;
        Ok(removed)
    }
}

/// Files smaller than this are never compacted automatically.
const COMPACT_MIN_FILE: u64 = 64 << 20;

impl Engine {
    /// Compacts the file if more than `compact_when_free` of it is free
    /// (and it is at least 64 MiB). Returns whether it compacted.
    ///
    /// Measuring the free space walks every page of the file under redb's
    /// write lock, stalling commits meanwhile, so it runs only when tables
    /// were deleted since the last check: appending log rows does not leave
    /// free space behind (redb reuses the pages its copy-on-write frees).
    pub(crate) fn maybe_compact(&self) -> Result<bool> {
        let (Some(path), Some(threshold)) = (&self.path, self.cfg.compact_when_free) else {
            return Ok(false);
        };
        if !self
            .buckets
            .compact_due
            .swap(false, crate::sync::Ordering::AcqRel)
        {
            return Ok(false);
        }
        let file = std::fs::metadata(path).map_or(0, |m| m.len());
        if file < COMPACT_MIN_FILE {
            return Ok(false);
        }
        let Some(used) = self.log.used_bytes()? else {
            return Ok(false); // the storage cannot compact
        };
        // Per-mille, in integers: exact enough for a threshold.
        let free =
            1.0 - f64::from(u32::try_from(used.min(file) * 1000 / file).unwrap_or(1000)) / 1000.0;
        if free <= threshold {
            return Ok(false);
        }
        let t = std::time::Instant::now();
        let done = self.log.compact()?;
        tracing::info!(
            free_fraction = free,
            file_bytes = file,
            took_ms = t.elapsed().as_millis() as u64,
            "dedupkv compacted its file"
        );
        Ok(done)
    }

    /// Handles one entity record of the bucket being evicted: an entity
    /// whose latest core record is here is removed, unless it still has
    /// parked, held or unacknowledged events; then its core record, like the
    /// record of any such event still here, is re-logged into the open batch,
    /// so it is committed no later than the bucket's deletion. Returns 1 if
    /// an entity was removed.
    fn evict_entity_record(&self, b: u64, now: u64, rec: &RecordRef<'_>) -> Result<u64> {
        let h = self.hasher.hash_entity(rec.scope, rec.id);
        let mut shard = self.index.lock(h);
        let Some(e) = shard.entity_raw(h) else {
            return Ok(0);
        };
        match rec.kind {
            Kind::Entity if e.bucket == b => {
                if !e.has_events() {
                    shard.remove_entity(h);
                    return Ok(1);
                }
                let mut batch = self.log.batch()?;
                self.log_core(&mut batch, e, now);
            }
            Kind::Park | Kind::Hold => {
                let key = e.key.clone();
                // The event's latest record may be of the other kind (a
                // parked event held since); it is re-logged once, as that.
                if let Some(ev) = e.event_mut(rec.event_seq())
                    && ev.bucket == b
                {
                    let mut batch = self.log.batch()?;
                    ev.bucket = self.log_event(&mut batch, &key, rec.event_seq(), ev, now);
                }
            }
            _ => {}
        }
        Ok(0)
    }
}
