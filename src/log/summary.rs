//! Bucket summaries (store format 5): what the last commit recorded about
//! each bucket table, so an open that finds rows missing says so instead
//! of opening a smaller store.
//!
//! Each bucket table holds, besides its rows, one entry under the row
//! number [`SUMMARY_ROW`](super::store::SUMMARY_ROW) (0, before every
//! row):
//!
//! ```text
//! summary := version:u8 (=1) | bucket:u64 LE | rows:u64 LE | last_row:u64 LE
//!            | digest:u64 LE | checksum:u64 LE
//! digest   = wrapping sum, over the table's rows, of
//!            xxh3-64(bucket:u64 LE | row number:u64 LE | the row's checksum:u64 LE)
//! checksum = xxh3-64 of every byte before it
//! ```
//!
//! `rows` counts the table's rows; `last_row` is the highest row number
//! ever written to it (a trim does not lower it). The digest is a sum, so
//! a row adds its term when it is written and a trim subtracts the terms
//! of the rows it deletes; it covers each row's number and, through the
//! row's own checksum, its bytes. The bucket is in the entry so that a
//! table read under another table's name is caught.
//!
//! Invariants:
//! - the log keeps every bucket table's summary in memory, exact as of the
//!   last commit (computed by replay at open, then updated by each
//!   commit), for files of every format;
//! - in a format-5 file every commit that writes or trims rows of a bucket
//!   writes that bucket's summary in the same storage commit, into the
//!   same table, and a deleted table takes its summary with it: every
//!   bucket table has a summary that matches its rows after every commit;
//! - an open never yields fewer rows than the last commit recorded: replay
//!   recomputes each table's summary from the rows it read and compares it
//!   with the stored one (a missing, damaged or different summary is
//!   [`Error::Corrupt`] naming the table).

use std::collections::{BTreeMap, BTreeSet};

use super::store::table_name;
use crate::records::SUMMARIES_FORMAT;
use crate::{Error, Result};

const VERSION: u8 = 1;
/// The encoded length: version, four u64 fields, checksum.
const LEN: usize = 1 + 8 * 5;

/// A bucket table's rows, summarised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Rows in the table.
    pub rows: u64,
    /// The highest row number written to it (0 before the first).
    pub last_row: u64,
    /// The wrapping sum of the rows' terms (see the module docs).
    pub digest: u64,
}

/// The term row `row` of `bucket`'s table adds to the digest: its bucket,
/// its number and its checksum (a row's last 8 bytes; a row too short to
/// have one is hashed whole, and fails its own check when decoded).
fn term(bucket: u64, row: u64, bytes: &[u8]) -> u64 {
    let sum = match bytes.len().checked_sub(8) {
        Some(at) => u64::from_le_bytes(bytes[at..].try_into().unwrap_or_default()),
        None => xxhash_rust::xxh3::xxh3_64(bytes),
    };
    let mut buf = [0u8; 24];
    buf[..8].copy_from_slice(&bucket.to_le_bytes());
    buf[8..16].copy_from_slice(&row.to_le_bytes());
    buf[16..].copy_from_slice(&sum.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&buf)
}

impl Summary {
    /// Counts row `row` (its stored bytes) of `bucket`'s table in.
    pub(crate) fn add(&mut self, bucket: u64, row: u64, bytes: &[u8]) {
        self.rows += 1;
        self.last_row = self.last_row.max(row);
        self.digest = self.digest.wrapping_add(term(bucket, row, bytes));
    }

    /// Takes rows out: `gone` summarises rows of this table being deleted.
    pub(crate) fn remove(&mut self, gone: &Summary) {
        self.rows = self.rows.saturating_sub(gone.rows);
        self.digest = self.digest.wrapping_sub(gone.digest);
    }

    /// The entry stored for `bucket`'s table.
    pub(crate) fn encode(&self, bucket: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(LEN);
        out.push(VERSION);
        for v in [bucket, self.rows, self.last_row, self.digest] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Reads `bucket`'s stored entry; says what is wrong with it.
    fn decode(bucket: u64, bytes: &[u8]) -> std::result::Result<Summary, String> {
        if bytes.len() != LEN {
            return Err(format!("is {} bytes, not {LEN}", bytes.len()));
        }
        let (body, sum) = bytes.split_at(LEN - 8);
        let u64_at =
            |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        if xxhash_rust::xxh3::xxh3_64(body) != u64_at(sum, 0) {
            return Err("fails its checksum".into());
        }
        if body[0] != VERSION {
            return Err(format!("has unknown version {}", body[0]));
        }
        let of = u64_at(body, 1);
        if of != bucket {
            return Err(format!("is the summary of {:?}", table_name(of)));
        }
        Ok(Summary {
            rows: u64_at(body, 9),
            last_row: u64_at(body, 17),
            digest: u64_at(body, 25),
        })
    }
}

/// Compares what a read of `bucket`'s table found (`seen`, from its rows)
/// with the summary stored beside them: anything but a match is
/// [`Error::Corrupt`] naming the table.
pub(crate) fn check(bucket: u64, stored: Option<&[u8]>, seen: &Summary) -> Result<()> {
    let name = table_name(bucket);
    let bad = |why: String| Err(Error::Corrupt(format!("the table {name:?} {why}")));
    let Some(stored) = stored else {
        return bad("has no summary (every bucket table of a format-5 file has one)".into());
    };
    let want = match Summary::decode(bucket, stored) {
        Ok(s) => s,
        Err(why) => return bad(format!("has a damaged summary: it {why}")),
    };
    if seen.rows < want.rows {
        return bad(format!(
            "holds {} rows, but the last commit recorded {} (up to row {}): {} rows are missing",
            seen.rows,
            want.rows,
            want.last_row,
            want.rows - seen.rows
        ));
    }
    if seen.rows > want.rows || seen.last_row > want.last_row {
        return bad(format!(
            "holds {} rows up to row {}, more than the last commit recorded ({} up to row {})",
            seen.rows, seen.last_row, want.rows, want.last_row
        ));
    }
    if seen.digest != want.digest {
        return bad(format!(
            "holds the {} rows its summary records, but not the same ones: a row's number \
             or checksum changed",
            seen.rows
        ));
    }
    Ok(())
}

/// The summaries a commit writes: those of the tables it changes, or with
/// an upgrade to the summaries' format, every table's; none below it.
pub(super) fn summaries_to_store(
    format: u32,
    upgrade: Option<u32>,
    buckets: &BTreeSet<u64>,
    changed: &BTreeMap<u64, Option<Summary>>,
    summaries: &BTreeMap<u64, Summary>,
) -> Vec<(u64, Vec<u8>)> {
    if upgrade.unwrap_or(format) < SUMMARIES_FORMAT {
        Vec::new()
    } else if upgrade.is_some() && format < SUMMARIES_FORMAT {
        // Every table gets its summary with the upgrade.
        buckets
            .iter()
            .map(|b| {
                debug_assert!(
                    changed.contains_key(b) || summaries.contains_key(b),
                    "bucket {b} has a table but no summary"
                );
                let sum = match changed.get(b) {
                    Some(c) => c.unwrap_or_default(),
                    None => summaries.get(b).copied().unwrap_or_default(),
                };
                (*b, sum.encode(*b))
            })
            .collect()
    } else {
        changed
            .iter()
            .filter_map(|(b, sum)| sum.map(|sum| (*b, sum.encode(*b))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: u8) -> Vec<u8> {
        vec![n; 20]
    }

    fn summary(bucket: u64, rows: &[(u64, Vec<u8>)]) -> Summary {
        let mut s = Summary::default();
        for (n, bytes) in rows {
            s.add(bucket, *n, bytes);
        }
        s
    }

    #[test]
    fn a_trim_takes_out_exactly_what_its_rows_added() {
        let rows: Vec<(u64, Vec<u8>)> = (1..=6).map(|n| (n * 3, row(n as u8))).collect();
        let mut all = summary(7, &rows);
        all.remove(&summary(7, &rows[..2]));
        let rest = summary(7, &rows[2..]);
        assert_eq!((all.rows, all.digest), (rest.rows, rest.digest));
        assert_eq!(all.last_row, 18, "the high-water mark stays");
    }

    #[test]
    fn a_table_that_lost_changed_or_gained_a_row_fails_its_check() {
        let rows: Vec<(u64, Vec<u8>)> = (1..=5).map(|n| (n, row(n as u8))).collect();
        let stored = summary(3, &rows).encode(3);
        assert!(check(3, Some(&stored), &summary(3, &rows)).is_ok());
        let lost = summary(3, &rows[1..]);
        let mut renumbered = rows.clone();
        renumbered[2].0 = 40;
        let mut changed = rows.clone();
        changed[4].1[19] ^= 1;
        let mut more = rows.clone();
        more.push((6, row(6)));
        for (what, seen) in [
            ("lost", lost),
            ("renumbered", summary(3, &renumbered)),
            ("changed", summary(3, &changed)),
            ("more", summary(3, &more)),
            ("another table's", summary(4, &rows)),
        ] {
            let err = check(3, Some(&stored), &seen).expect_err(what);
            assert!(
                matches!(&err, Error::Corrupt(m) if m.contains("log.000000000003")),
                "{what}: {err}"
            );
        }
        let err = check(3, Some(&stored), &lost).expect_err("lost");
        assert!(err.to_string().contains("1 rows are missing"), "{err}");
    }

    #[test]
    fn a_missing_damaged_or_misplaced_summary_is_damage() {
        let seen = summary(9, &[(1, row(1))]);
        let stored = seen.encode(9);
        assert!(
            matches!(check(9, None, &seen), Err(Error::Corrupt(m)) if m.contains("no summary"))
        );
        for i in 0..stored.len() {
            for bit in 0..8 {
                let mut bad = stored.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    matches!(check(9, Some(&bad), &seen), Err(Error::Corrupt(_))),
                    "byte {i} bit {bit}"
                );
            }
        }
        for len in 0..stored.len() {
            assert!(check(9, Some(&stored[..len]), &seen).is_err(), "{len}");
        }
        let err = check(8, Some(&stored), &summary(8, &[(1, row(1))])).expect_err("misplaced");
        assert!(
            err.to_string().contains("summary of \"log.000000000009\""),
            "{err}"
        );
    }
}
