//! Replay at open: every bucket table, merged in log order.
//!
//! Log order is `(row, idx)`: rows grow with each commit and `idx` orders
//! the records of one commit across the bucket tables it wrote. Because
//! every record is self-contained, the last record of a key is its state.
//! The records of tables of buckets that have already expired are handed
//! over too, flagged expired: their event keys have expired, but parked,
//! held and unacknowledged events and dead letters are never dropped,
//! however long the store was closed, so the caller keeps those and
//! carries them forward before it deletes the tables.
//!
//! Replay summarises each table's rows as it reads them (see
//! [`summary`]): in a format-5 file each summary must
//! match the one the last commit stored beside the rows, so an open never
//! yields fewer rows than that commit recorded; the summaries are the
//! log's from then on, whatever the format.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::Storage;
use super::store::table_name;
use super::summary::{self, Summary};
use crate::records::{RecordRef, read_row};
use crate::{Error, Result};

/// What replay found.
pub(crate) struct Replayed {
    /// The newest row number seen in any table (0 when there is none).
    pub last_row: u64,
    /// Buckets whose tables are expired at `now_bucket`.
    pub expired: Vec<u64>,
    /// Records applied.
    pub records: u64,
    /// Buckets with a live table, oldest first.
    pub live: Vec<u64>,
    /// Every table's summary, from the rows read.
    pub summaries: BTreeMap<u64, Summary>,
}

/// One record handed over by [`replay`].
pub(crate) struct Replay<'a> {
    /// The bucket whose table holds it.
    pub bucket: u64,
    /// Whether that bucket is expired (before `now_bucket`).
    pub expired: bool,
    pub rec: RecordRef<'a>,
}

/// Records handed to `replay`'s caller at a time.
const CHUNK: usize = 256;

/// Calls `apply(row, records)` for every record of every bucket table, in
/// log order, up to [`CHUNK`] consecutive records of one row number at a
/// time; a record's `expired` says its bucket is before `now_bucket`.
/// Many records at a time let the caller read ahead (the engine reads the
/// index slots of their keys before it applies them). With `checked` (a
/// format-5 file), each table's rows must match its stored summary.
pub(crate) fn replay(
    db: &Storage,
    now_bucket: u64,
    checked: bool,
    mut apply: impl FnMut(u64, &[Replay<'_>]) -> Result<()>,
) -> Result<Replayed> {
    let tables = db.tables()?;
    let all: Vec<u64> = tables.iter().map(|(b, _)| *b).collect();
    let names: Vec<String> = all.iter().map(|b| table_name(*b)).collect();
    let (stored, mut iters): (Vec<_>, Vec<_>) =
        tables.into_iter().map(|(_, t)| (t.summary, t.rows)).unzip();
    let mut seen = vec![Summary::default(); all.len()];
    let mut heads: Vec<Option<(u64, Vec<u8>)>> = Vec::with_capacity(iters.len());
    let mut heap = BinaryHeap::new();
    for (i, it) in iters.iter_mut().enumerate() {
        let first = it.next().transpose()?;
        if let Some((row, bytes)) = &first {
            seen[i].add(all[i], *row, bytes);
            heap.push(Reverse((*row, i)));
        }
        heads.push(first);
    }
    let mut out = Replayed {
        last_row: 0,
        expired: all.iter().copied().filter(|b| *b < now_bucket).collect(),
        records: 0,
        live: all.iter().copied().filter(|b| *b >= now_bucket).collect(),
        summaries: BTreeMap::new(),
    };
    let mut last_row = 0;
    let mut group: Vec<(usize, Vec<u8>)> = Vec::new();
    while let Some(Reverse((row, _))) = heap.peek().copied() {
        group.clear();
        while let Some(Reverse((r, i))) = heap.peek().copied() {
            if r != row {
                break;
            }
            heap.pop();
            if let Some((_, bytes)) = heads[i].take() {
                group.push((i, bytes));
            }
            if let Some(next) = iters[i].next() {
                let (k, v) = next?;
                if k <= row {
                    return Err(Error::Corrupt(format!(
                        "log rows out of order in {}",
                        names[i]
                    )));
                }
                seen[i].add(all[i], k, &v);
                heads[i] = Some((k, v));
                heap.push(Reverse((k, i)));
            }
        }
        last_row = last_row.max(row);
        let replay_of = |i: usize, rec| Replay {
            bucket: all[i],
            expired: all[i] < now_bucket,
            rec,
        };
        if group.len() == 1 {
            // Decoded as it is applied: a row can hold millions of records.
            let (i, bytes) = &group[0];
            let mut recs = Vec::with_capacity(CHUNK);
            for rec in read_row(bytes)? {
                recs.push(replay_of(*i, rec?));
                if recs.len() == CHUNK {
                    apply(row, &recs)?;
                    out.records += CHUNK as u64;
                    recs.clear();
                }
            }
            if !recs.is_empty() {
                apply(row, &recs)?;
                out.records += recs.len() as u64;
            }
        } else {
            let mut recs = Vec::new();
            for (i, bytes) in &group {
                for rec in read_row(bytes)? {
                    recs.push(replay_of(*i, rec?));
                }
            }
            recs.sort_by_key(|r| r.rec.idx);
            for chunk in recs.chunks(CHUNK) {
                apply(row, chunk)?;
            }
            out.records += recs.len() as u64;
        }
    }
    out.last_row = last_row;
    for (i, &bucket) in all.iter().enumerate() {
        if checked {
            summary::check(bucket, stored[i].as_deref(), &seen[i])?;
        }
        out.summaries.insert(bucket, seen[i]);
    }
    Ok(out)
}
