//! The packed index slot: 24 bytes per key.
//!
//! ```text
//! lo:u64 | hi:u64 | meta:u64
//! meta = state:3 (bits 61..64) | bucket:24 (bits 37..61) | row:37 (bits 0..37)
//! ```
//! `bucket` and `row` keep only their low bits; [`Slot::bucket`] and
//! [`Slot::row`] widen them against the current bucket and row, which is
//! exact while a record is within 2^23 buckets of now and 2^37 rows of the
//! newest row (the builder caps retention so the first always holds).

use crate::key::KeyHash;

const ROW_BITS: u32 = 37;
const BUCKET_BITS: u32 = 24;
const ROW_MASK: u64 = (1 << ROW_BITS) - 1;
const BUCKET_MASK: u64 = (1 << BUCKET_BITS) - 1;
/// The widest retention, in buckets, that the slot can represent.
pub(crate) const MAX_BUCKET_SPAN: u64 = 1 << (BUCKET_BITS - 2);

/// What the latest record of a key says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    Inserted = 1,
    Claimed = 2,
    Released = 3,
    Completed = 4,
    Failed = 5,
    /// Forgotten on purpose: absent to every call but `get`.
    Forgotten = 6,
    /// In the dead-letter area: retries exhausted, kept until requeued,
    /// resolved or forgotten.
    DeadLettered = 7,
}

impl SlotState {
    fn from_bits(b: u64) -> SlotState {
        match b {
            1 => SlotState::Inserted,
            2 => SlotState::Claimed,
            3 => SlotState::Released,
            4 => SlotState::Completed,
            6 => SlotState::Forgotten,
            7 => SlotState::DeadLettered,
            _ => SlotState::Failed,
        }
    }
}

/// One key in the index.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    pub lo: u64,
    pub hi: u64,
    meta: u64,
}

impl Slot {
    /// An unused table slot (no state is 0).
    pub(crate) const EMPTY: Slot = Slot {
        lo: 0,
        hi: 0,
        meta: 0,
    };

    pub(crate) fn is_empty(&self) -> bool {
        self.meta == 0
    }

    pub(crate) fn new(h: KeyHash, state: SlotState, bucket: u64, row: u64) -> Slot {
        let mut s = Slot {
            lo: h.lo,
            hi: h.hi,
            meta: 0,
        };
        s.set(state, bucket, row);
        s
    }

    pub(crate) fn set(&mut self, state: SlotState, bucket: u64, row: u64) {
        self.meta =
            ((state as u64) << 61) | ((bucket & BUCKET_MASK) << ROW_BITS) | (row & ROW_MASK);
    }

    pub(crate) fn is(&self, h: KeyHash) -> bool {
        self.lo == h.lo && self.hi == h.hi
    }

    pub(crate) fn state(&self) -> SlotState {
        SlotState::from_bits(self.meta >> 61)
    }

    /// The full bucket number, widened against `now_bucket`.
    pub(crate) fn bucket(&self, now_bucket: u64) -> u64 {
        let stored = (self.meta >> ROW_BITS) & BUCKET_MASK;
        let base = now_bucket.saturating_sub(1 << (BUCKET_BITS - 1));
        base + (stored.wrapping_sub(base) & BUCKET_MASK)
    }

    /// Whether the slot points at (`bucket`, `row`): exact for a place
    /// within the slot's span of now, and safe against any `bucket` and
    /// `row` (which need not be the newest; nothing is widened).
    pub(crate) fn is_at(&self, bucket: u64, row: u64) -> bool {
        let stored = self.meta & ((BUCKET_MASK << ROW_BITS) | ROW_MASK);
        stored == ((bucket & BUCKET_MASK) << ROW_BITS) | (row & ROW_MASK)
    }

    /// The full row number, widened against `newest_row` (rows only grow).
    ///
    /// `newest_row` must be at least the row the slot was last written
    /// with: the log's open row read while holding the slot's shard lock.
    pub(crate) fn row(&self, newest_row: u64) -> u64 {
        let stored = self.meta & ROW_MASK;
        let back = newest_row.wrapping_sub(stored) & ROW_MASK;
        debug_assert!(
            back <= newest_row,
            "slot row {stored} widened against an older row"
        );
        newest_row.saturating_sub(back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_is_24_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 24);
    }

    #[test]
    fn fields_round_trip_and_widen() {
        let h = KeyHash { hi: 1, lo: 2 };
        let now_bucket = 29_000_000; // minutes since 1970, past 2^24
        for bucket in [now_bucket - 5, now_bucket, now_bucket + 1_000_000] {
            for row in [0, 1, (1 << 37) + 5, u64::from(u32::MAX) * 100] {
                let s = Slot::new(h, SlotState::Completed, bucket, row);
                assert_eq!(s.state(), SlotState::Completed);
                assert_eq!(s.bucket(now_bucket), bucket);
                assert_eq!(s.row(row + 1000), row);
                assert!(s.is_at(bucket, row));
                assert!(!s.is_at(bucket, row + 1));
                assert!(!s.is_at(bucket + 1, row));
            }
        }
    }
}
