//! What the log needs from the storage under it, and nothing more: a
//! metadata table of named entries, one table of rows per expiry bucket
//! (row number to row bytes, and the bucket's summary), and commits that
//! change several of them at once, durably. `redb.rs` implements it;
//! nothing outside this folder names the storage engine but the log's
//! composition root (`log/mod.rs`, which opens it). A caller may hand in
//! the medium under it as a [`PageBackend`] (`pages.rs`), dedupkv's own
//! trait.
//!
//! Invariants an implementation keeps:
//! - a [`Commit`] is applied whole or not at all, and is on stable storage
//!   when [`LogStore::commit`] returns `Ok`;
//! - within a commit, bucket tables are dropped first, then trimmed, then
//!   rows are written, then summaries, then metadata: a bucket dropped and
//!   written in one commit keeps the new rows;
//! - a bucket's summary lives in its table, under [`SUMMARY_ROW`]: it is
//!   deleted with the table, and never read as a row;
//! - reads see the state of the last successful commit.

pub(crate) mod journal;
pub(crate) mod pages;
pub(crate) mod read_only;
pub(crate) mod redb;

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use super::error::LogError;
pub use pages::PageBackend;

/// The result of a storage call.
pub(crate) type StoreResult<T> = std::result::Result<T, LogError>;

/// The metadata table's name. Part of the file format: a damaged file is
/// recognised by it, and the bucket tables' names sit beside it.
pub(crate) const META_NAME: &str = "dedupkv.meta";
const LOG_PREFIX: &str = "log.";

/// The key of a bucket's summary in its table (part of the file format,
/// from format 5): before every row, so rows are still appended after the
/// table's last key (redb then starts a new leaf when the last one is
/// full; an insert before a last key splits the leaf in halves, and the
/// left half is never filled again).
pub(crate) const SUMMARY_ROW: u64 = 0;
/// The first row number a commit can use (rows start at 1).
pub(crate) const FIRST_ROW: u64 = 1;

/// The name of `bucket`'s table (part of the file format).
pub(crate) fn table_name(bucket: u64) -> String {
    format!("{LOG_PREFIX}{bucket:012}")
}

/// The bucket of a bucket table's name, if it is one.
pub(crate) fn parse_table_name(name: &str) -> Option<u64> {
    name.strip_prefix(LOG_PREFIX)?.parse().ok()
}

/// Whether `name` is shaped like a bucket table's name.
pub(crate) fn is_log_table_name(name: &str) -> bool {
    name.starts_with(LOG_PREFIX)
}

/// Where the store lives: a path (created if missing), a path that must
/// hold a store already, a path read without writing to it (its commits
/// kept in memory, see [`read_only`]), or the pages a caller supplies (in
/// memory, fault injection).
pub(crate) enum Location {
    Path(PathBuf),
    Existing(PathBuf),
    ReadOnly(PathBuf),
    Backend(Box<dyn PageBackend>),
}

impl Location {
    pub(crate) fn path(&self) -> Option<&Path> {
        match self {
            Location::Path(p) | Location::Existing(p) | Location::ReadOnly(p) => Some(p),
            Location::Backend(_) => None,
        }
    }

    /// Whether nothing may be written to the file (commits stay in memory).
    pub(crate) fn is_read_only(&self) -> bool {
        matches!(self, Location::ReadOnly(_))
    }
}

/// The metadata entries as stored: (name, value).
pub(crate) type MetaEntries = Vec<(String, Vec<u8>)>;

/// A metadata change: `Some` writes the entry, `None` removes it.
pub(crate) type MetaChange = (&'static str, Option<Vec<u8>>);

/// One durable commit: everything the log changes at once.
#[derive(Default)]
pub(crate) struct Commit<'a> {
    /// Bucket tables to delete, first.
    pub drop_buckets: &'a [u64],
    /// Rows to delete from a bucket's table (created if missing), next.
    pub trims: Vec<(u64, RangeInclusive<u64>)>,
    /// Rows to write, as (bucket, row number, sealed row bytes).
    pub rows: Vec<(u64, u64, Vec<u8>)>,
    /// Bucket summaries to write, as (bucket, encoded summary), under
    /// [`SUMMARY_ROW`] of the bucket's table, after the rows.
    pub summaries: Vec<(u64, Vec<u8>)>,
    /// Metadata entries to write or remove, last.
    pub meta: Vec<MetaChange>,
    /// Metadata entries by any name, after `meta`: a restore writes the
    /// entries its replica recorded (`log::ship`).
    pub raw_meta: Vec<(String, Option<Vec<u8>>)>,
}

/// Everything a store holds, as of one commit: its metadata entries and
/// each bucket table's rows (a replica's snapshot reads it while commits
/// go on).
#[cfg_attr(not(feature = "replica"), allow(dead_code))]
pub(crate) struct View {
    pub meta: MetaEntries,
    pub tables: Vec<(u64, Rows)>,
}

/// The rows of one bucket table in row order, each as (row number, bytes).
pub(crate) type Rows = Box<dyn Iterator<Item = StoreResult<(u64, Vec<u8>)>> + Send>;

/// One bucket table as a read sees it.
pub(crate) struct Table {
    /// Its summary as stored (none in a file older than format 5).
    pub summary: Option<Vec<u8>>,
    /// Its rows, the summary excluded.
    pub rows: Rows,
}

/// The storage under the log. One call per commit, per row read, or per
/// table scanned: nothing is called per record. Every error is a
/// [`LogError`]: damage is `Corrupt`, never a smaller answer.
pub(crate) trait LogStore: Send + Sync {
    /// The metadata entries, or `None` when the file has no metadata table.
    fn read_meta(&self) -> StoreResult<Option<MetaEntries>>;

    /// The name of every table in the file, the metadata table included.
    fn table_names(&self) -> StoreResult<Vec<String>>;

    /// Checks that `bucket`'s table opens as a bucket table.
    fn check_bucket(&self, bucket: u64) -> StoreResult<()>;

    /// One row of a bucket table, if it is there.
    fn read_row(&self, bucket: u64, row: u64) -> StoreResult<Option<Vec<u8>>>;

    /// Every bucket table, ascending by bucket, as of one snapshot; each
    /// row it yields is also found where a lookup of its number looks
    /// (else [`LogError::Corrupt`] naming the table and row), so what
    /// replay read is what later reads of single rows find.
    fn tables(&self) -> StoreResult<Vec<(u64, Table)>>;

    /// The rows numbered `rows` of `bucket`'s table, in row order, the
    /// summary excluded (none if it has no table).
    fn row_range(&self, bucket: u64, rows: RangeInclusive<u64>) -> StoreResult<Rows>;

    /// The metadata and every bucket table's rows, as of one snapshot.
    #[cfg_attr(not(feature = "replica"), allow(dead_code))]
    fn view(&self) -> StoreResult<View>;

    /// The newest row number in any bucket table (0 when there is none).
    #[cfg_attr(not(feature = "replica"), allow(dead_code))]
    fn last_row(&self) -> StoreResult<u64>;

    /// Applies `commit` durably (see the module's invariants).
    fn commit(&self, commit: Commit<'_>) -> StoreResult<()>;

    /// Applies `commits` in order as one durable commit (a journal's
    /// checkpoint). Default: one commit each.
    fn commit_all(&self, commits: Vec<Commit<'_>>) -> StoreResult<()> {
        for c in commits {
            self.commit(c)?;
        }
        Ok(())
    }

    /// Bytes of the file in use (the rest is free space compaction could
    /// give back); `None` if the store cannot compact. Default: `None`.
    fn used_bytes(&self) -> StoreResult<Option<u64>> {
        Ok(None)
    }

    /// Gives free space back to the file system: whether anything was, or
    /// `None` if the store cannot compact (a capability it may lack).
    /// Default: `None`.
    fn compact(&mut self) -> StoreResult<Option<bool>> {
        Ok(None)
    }
}
