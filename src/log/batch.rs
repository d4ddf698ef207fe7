//! The open batch: the records appended since the last commit, in the
//! rows they will be committed as, and what else the next commit carries
//! (tables to drop or trim, floors to raise, an upgrade).
//!
//! Invariants:
//! - a record is appended while its key's shard lock is held (and the
//!   batch lock), so per-key log order equals decision order; the row it
//!   lands in is known at append time and never changes;
//! - rows `first_row..row` are closed and `row` is open: a row is closed
//!   once it holds `split_at` bytes, so no row passes
//!   [`ROW_SPLIT_BYTES`] plus one record;
//! - `open_row` mirrors `row` (readable without the batch lock), and moves
//!   only forward;
//! - `next_idx` orders the batch's records across every bucket's part.

use super::summary::Summary;
use crate::records::{RecordRef, RowWriter};
use crate::sync::{Arc, AtomicU64, Ordering};

/// A row is closed and the next one opened once it holds this many bytes,
/// so no row reaches the storage's limit for one value (redb's is 3 GiB,
/// which `store/redb.rs` asserts), however many callers share a commit: a
/// row is at most this plus one record.
pub(crate) const ROW_SPLIT_BYTES: usize = 256 << 20;

/// Records appended since the last commit: rows `first_row..=row`, all
/// but the last closed (see [`ROW_SPLIT_BYTES`]); new records go to `row`.
pub(crate) struct Batch {
    pub(super) row: u64,
    /// The first row of this batch (`row` unless a row was closed).
    pub(super) first_row: u64,
    /// Bytes in the parts of `row`.
    pub(super) row_bytes: usize,
    /// Close `row` once it holds this many bytes (`ROW_SPLIT_BYTES`, less
    /// in tests).
    pub(super) split_at: usize,
    /// Closed rows, each with its parts per bucket.
    pub(super) closed: Vec<(u64, Vec<(u64, RowWriter)>)>,
    /// Mirror of `row`, readable without the batch lock.
    pub(super) open_row: Arc<AtomicU64>,
    /// Records in the batch (the next record's `idx`).
    pub(super) next_idx: u32,
    /// Of them, records that ride with a caller's own record (a tally, an
    /// intent): group commit counts callers' records, not these.
    pub(super) extras: u32,
    pub(super) bytes: usize,
    pub(super) parts: Vec<(u64, RowWriter)>,
    /// The latest `at` of the batch's records: the commit persists it as
    /// the time floor once it passes the persisted one by `time_step`.
    pub(super) max_at: u64,
    /// What else the commit carries.
    pub(super) also: Also,
}

/// What a commit carries besides the records.
#[derive(Default)]
pub(super) struct Also {
    /// Bucket tables to delete in this commit, before its rows are written.
    pub(super) drop_buckets: Vec<u64>,
    /// Log rows to delete from a bucket's table in this commit: a range
    /// of row numbers, and the summary of the rows in it (see
    /// [`Log::trim_bucket`](super::Log::trim_bucket)).
    pub(super) trims: Vec<(u64, std::ops::RangeInclusive<u64>, Summary)>,
    /// Rewrite the file as this format in this commit (see
    /// [`Log::upgrade`](super::Log::upgrade)).
    pub(super) upgrade_to: Option<u32>,
    /// A new fencing-token floor to persist with this commit.
    pub(super) token_floor: Option<u64>,
    /// A new time floor (a clock reading, ms) to persist with this commit.
    pub(super) time_floor: Option<u64>,
    /// Commit even if nothing else is in the batch (a replica wants a
    /// view of the store, which it takes in a commit).
    pub(super) touched: bool,
}

impl Also {
    fn is_empty(&self) -> bool {
        self.drop_buckets.is_empty()
            && self.trims.is_empty()
            && self.upgrade_to.is_none()
            && self.token_floor.is_none()
            && self.time_floor.is_none()
            && !self.touched
    }
}

impl Batch {
    /// An empty batch whose records go to `row`.
    pub(super) fn new(row: u64, split_at: usize, open_row: &Arc<AtomicU64>) -> Batch {
        Batch {
            row,
            first_row: row,
            row_bytes: 0,
            split_at,
            closed: Vec::new(),
            open_row: Arc::clone(open_row),
            next_idx: 0,
            extras: 0,
            bytes: 0,
            parts: Vec::new(),
            max_at: 0,
            also: Also::default(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.parts.is_empty() && self.closed.is_empty() && self.also.is_empty()
    }

    /// Persists `floor` as the lowest token a reopened store may issue,
    /// in this commit.
    pub(crate) fn raise_token_floor(&mut self, floor: u64) {
        self.also.token_floor = Some(self.also.token_floor.map_or(floor, |f| f.max(floor)));
    }

    /// Persists `ms` as the lowest clock reading the store may trust after
    /// a reopen (the persisted floor becomes the larger of the old one and
    /// `ms`), in this commit. Read back at open as
    /// [`FileMeta::time_floor`](super::FileMeta::time_floor).
    #[cfg(test)]
    pub(crate) fn raise_time_floor(&mut self, ms: u64) {
        self.also.time_floor = Some(self.also.time_floor.map_or(ms, |f| f.max(ms)));
    }

    /// [`push`](Self::push) of a record that rides with the caller's own
    /// (a tally with a completion, an intent with a claim): the same bytes,
    /// but not counted as a caller's record by group commit.
    pub(crate) fn push_extra(&mut self, bucket: u64, rec: &mut RecordRef<'_>) -> u64 {
        self.extras += 1;
        self.push(bucket, rec)
    }

    /// The callers' records in the batch (all but the extras).
    pub(super) fn own_records(&self) -> u32 {
        self.next_idx - self.extras
    }

    /// Appends a record to the part for `bucket`; returns the row number.
    /// The caller holds the key's shard lock.
    pub(crate) fn push(&mut self, bucket: u64, rec: &mut RecordRef<'_>) -> u64 {
        if self.row_bytes >= self.split_at {
            let parts = std::mem::take(&mut self.parts);
            self.closed.push((self.row, parts));
            self.row += 1;
            self.row_bytes = 0;
            self.open_row.store(self.row, Ordering::Release);
        }
        self.max_at = self.max_at.max(rec.at);
        rec.idx = self.next_idx;
        self.next_idx += 1;
        let part = if let Some(i) = self.parts.iter().position(|(b, _)| *b == bucket) {
            &mut self.parts[i].1
        } else {
            self.parts.push((bucket, RowWriter::new()));
            let last = self.parts.len() - 1;
            &mut self.parts[last].1
        };
        let before = part.len();
        part.push(rec);
        self.bytes += part.len() - before;
        self.row_bytes += part.len() - before;
        self.row
    }
}
