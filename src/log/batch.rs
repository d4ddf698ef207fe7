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
//!   [`ROW_SPLIT_BYTES`] plus one record, or once it is read;
//! - `open_row` mirrors `row` (readable without the batch lock), and moves
//!   only forward;
//! - `next_idx` orders the batch's records across every bucket's part;
//! - closed rows are `first_row..row` in order (`closed[i]` is row
//!   `first_row + i`); a row read before its commit with `close` is closed
//!   when read, so that reader reads all it will ever hold.

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

/// A read of a row in the open batch.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum InBatch {
    /// The row is not in the batch (committed, or being committed).
    Elsewhere,
    /// The row's part for the bucket read (`None`: the row has none).
    Here(Option<Vec<u8>>),
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

    /// Closes the open row: later records go to the next one.
    fn close_row(&mut self) {
        let parts = std::mem::take(&mut self.parts);
        self.closed.push((self.row, parts));
        self.row += 1;
        self.row_bytes = 0;
        self.open_row.store(self.row, Ordering::Release);
    }

    /// Row `row`'s part for `bucket`, sealed as the records in it so far,
    /// if `row` is in this batch (at least `first_row`). With `close`, the open row is
    /// closed first, so no record joins the row after it was read, as none
    /// joins a committed one; that costs a row number (see the slot's
    /// widening), so only a reader that needs it asks.
    pub(super) fn read_row(&mut self, bucket: u64, row: u64, close: bool) -> InBatch {
        if row < self.first_row || row > self.row {
            return InBatch::Elsewhere;
        }
        if close && row == self.row && !self.parts.is_empty() {
            self.close_row();
        }
        let parts = if row == self.row {
            self.parts.as_slice()
        } else {
            usize::try_from(row - self.first_row)
                .ok()
                .and_then(|i| self.closed.get(i))
                .map_or(&[][..], |(_, parts)| parts.as_slice())
        };
        InBatch::Here(
            parts
                .iter()
                .find(|(b, _)| *b == bucket)
                .map(|(_, part)| part.sealed_copy()),
        )
    }

    /// Takes every row's parts out of the batch, sealed, as (bucket, row,
    /// bytes) in row order: what the commit writes.
    pub(super) fn seal(&mut self) -> Vec<(u64, u64, Vec<u8>)> {
        let last = (self.row, std::mem::take(&mut self.parts));
        std::mem::take(&mut self.closed)
            .into_iter()
            .chain(std::iter::once(last))
            .flat_map(|(row, parts)| {
                parts
                    .into_iter()
                    .map(move |(bucket, part)| (bucket, row, part.finish()))
            })
            .collect()
    }

    /// Appends a record to the part for `bucket`; returns the row number.
    /// The caller holds the key's shard lock.
    pub(crate) fn push(&mut self, bucket: u64, rec: &mut RecordRef<'_>) -> u64 {
        if self.row_bytes >= self.split_at {
            self.close_row();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{Kind, read_row, sample};

    fn ids(bytes: &[u8]) -> Vec<u32> {
        read_row(bytes)
            .expect("a sealed row")
            .map(|r| r.expect("a record").idx)
            .collect()
    }

    #[test]
    fn a_row_read_before_its_commit_closing_it_takes_no_later_record() {
        let open_row = Arc::new(AtomicU64::new(7));
        let mut b = Batch::new(7, ROW_SPLIT_BYTES, &open_row);
        assert_eq!(b.push(3, &mut sample(Kind::Insert, 0, b"")), 7);
        assert_eq!(b.push(4, &mut sample(Kind::Insert, 0, b"")), 7);
        // Read without closing: the records so far; the row stays open.
        let InBatch::Here(Some(prefix)) = b.read_row(4, 7, false) else {
            panic!("bucket 4's part of row 7")
        };
        assert_eq!(ids(&prefix), [1]);
        assert_eq!(open_row.load(Ordering::Acquire), 7);
        let InBatch::Here(Some(read)) = b.read_row(3, 7, true) else {
            panic!("bucket 3's part of row 7")
        };
        assert_eq!(ids(&read), [0]);
        assert_eq!(
            open_row.load(Ordering::Acquire),
            8,
            "the read row is closed"
        );
        // A record appended after the read never joins the row it read.
        assert_eq!(b.push(3, &mut sample(Kind::Complete, 0, b"ok")), 8);
        assert_eq!(b.read_row(3, 7, false), InBatch::Here(Some(read)));
        assert_eq!(
            b.read_row(9, 7, false),
            InBatch::Here(None),
            "no part for bucket 9"
        );
        assert_eq!(
            b.read_row(3, 6, false),
            InBatch::Elsewhere,
            "before the batch"
        );
        assert_eq!(
            b.read_row(3, 9, false),
            InBatch::Elsewhere,
            "past the open row"
        );
        // The commit writes every row, each part as read.
        let rows: Vec<(u64, u64, Vec<u32>)> = b
            .seal()
            .iter()
            .map(|(bk, r, v)| (*bk, *r, ids(v)))
            .collect();
        assert_eq!(rows, [(3, 7, vec![0]), (4, 7, vec![1]), (3, 8, vec![2])]);
    }
}
