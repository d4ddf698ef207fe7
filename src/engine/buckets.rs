//! Buckets and expiry: which time bucket (log table) a record goes to.
//!
//! A record goes to the bucket its expiry falls in, but never to an earlier
//! bucket than the one its key (or entity) was last written to — so if any
//! record of a key is live, its latest record is live — and never to a
//! bucket an early eviction has closed. Its expiry is widened to match.

use super::Engine;
use super::write::Batch;
use crate::index::{MAX_BUCKET_SPAN, Slot};
use crate::records::RecordRef;
use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};

/// The buckets' shared state: where records go now, and how far eviction
/// closed and evicted.
pub(crate) struct Buckets {
    /// The latest bucket `bucket_of` computed.
    current: AtomicU64,
    /// The current bucket at the last complete eviction pass (at open: at
    /// replay): no slot points at an earlier bucket. Slots keep 24 bits
    /// of their bucket, so a clock that jumps far past this must evict
    /// before any slot is read (see [`Engine::time`]).
    pub(super) evicted_through: AtomicU64,
    /// No record is written into this bucket or an earlier one: an early
    /// eviction closes its victims here before it reads them (see
    /// [`Engine::writable_bucket`]). Only grows.
    pub(super) closed: AtomicU64,
    /// One eviction pass at a time.
    pub(super) evicting: Mutex<()>,
    /// Set when tables were deleted (at open, by eviction): only then can
    /// the file have grown free space worth the automatic compaction check,
    /// which walks every page under the write lock.
    pub(super) compact_due: AtomicBool,
}

impl Buckets {
    /// A store's buckets after replay at bucket `now_bucket`.
    pub(super) fn after_replay(now_bucket: u64) -> Self {
        Self {
            current: AtomicU64::new(0),
            evicted_through: AtomicU64::new(now_bucket),
            // Replay wrote nothing before the current bucket: it is closed
            // already (an eviction pass need not flush for it).
            closed: AtomicU64::new(now_bucket.saturating_sub(1)),
            evicting: Mutex::new(()),
            compact_due: AtomicBool::new(true),
        }
    }
}

impl Engine {
    /// The bucket of a time. The current bucket and its start are cached, so
    /// the hot path compares instead of dividing.
    #[inline]
    pub(crate) fn bucket_of(&self, ms: u64) -> u64 {
        let cached = self.buckets.current.load(Ordering::Relaxed);
        let g = self.cfg.granularity_ms;
        let start = cached.saturating_mul(g);
        if ms >= start && ms - start < g {
            return cached;
        }
        let b = ms / g;
        if b > cached {
            self.buckets.current.store(b, Ordering::Relaxed);
        }
        b
    }

    /// Appends `rec` to the bucket its expiry falls in, no earlier than
    /// `floor` (the bucket of the key's or entity's previous record) and
    /// no earlier than the first open bucket; widens its expiry to match.
    /// Returns the bucket and the row. The caller holds the batch lock
    /// (and the shard lock of whatever the record is about).
    #[inline]
    pub(crate) fn place(
        &self,
        batch: &mut Batch,
        floor: Option<u64>,
        rec: &mut RecordRef<'_>,
    ) -> (u64, u64) {
        self.place_as(batch, floor, rec, false)
    }

    /// [`place`](Self::place) of a record that rides with the caller's
    /// own (`extra`: not counted as a caller's record by group commit).
    #[inline]
    pub(crate) fn place_as(
        &self,
        batch: &mut Batch,
        floor: Option<u64>,
        rec: &mut RecordRef<'_>,
        extra: bool,
    ) -> (u64, u64) {
        let g = self.cfg.granularity_ms;
        let mut bucket = rec.expires / g;
        if let Some(pb) = floor
            && pb > bucket
        {
            bucket = pb;
            rec.expires = rec.expires.max(pb.saturating_mul(g));
        }
        let bucket = self.writable_bucket(bucket, rec);
        let row = if extra {
            batch.push_extra(bucket, rec)
        } else {
            batch.push(bucket, rec)
        };
        (bucket, row)
    }

    /// `bucket`, unless an early eviction has closed it: then the first
    /// open bucket, with `rec` expiring no earlier than it. A record with a
    /// per-call (or entity) retention shorter than the store's can aim at a
    /// bucket that eviction is deleting; written there after eviction read
    /// the bucket, it would be deleted under a live slot. The caller holds
    /// the batch lock, which orders this read after an eviction's
    /// close-then-flush.
    #[inline]
    pub(crate) fn writable_bucket(&self, bucket: u64, rec: &mut RecordRef<'_>) -> u64 {
        let closed = self.buckets.closed.load(Ordering::Acquire);
        if bucket > closed {
            return bucket;
        }
        let open = closed.saturating_add(1);
        rec.expires = rec
            .expires
            .max(open.saturating_mul(self.cfg.granularity_ms));
        open
    }
}

/// Whether a slot's latest record has not expired at `now_bucket`. No live
/// record is further out than the longest retention; a bucket that widens
/// past it is a long-expired one wrapping.
#[inline]
pub(crate) fn unexpired(slot: &Slot, now_bucket: u64) -> bool {
    let b = slot.bucket(now_bucket);
    b >= now_bucket && b - now_bucket < MAX_BUCKET_SPAN
}
