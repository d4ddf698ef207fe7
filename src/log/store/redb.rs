//! [`LogStore`] in redb.
//!
//! redb is used as a log, never as the index: random keys in a redb B-tree
//! copy a leaf page each, while one row per commit appended at an
//! increasing key is nearly free. Layout:
//!
//! - table `dedupkv.meta` (`&str -> &[u8]`): the entries of
//!   [`meta`](crate::log::meta);
//! - one table per expiry bucket, `log.<bucket>` (`u64 -> &[u8]`): row
//!   number to a row of records (see [`records`](crate::records)),
//!   and under [`SUMMARY_ROW`] the bucket's summary (see
//!   [`summary`](crate::log::summary)). Dropping a whole bucket, summary
//!   included, is one `delete_table`.
//!
//! redb's errors become [`LogError`]s here: `Corrupted` is damage,
//! `DatabaseAlreadyOpen` is [`LogError::AlreadyOpen`], I/O errors keep
//! their kind, anything else is an opaque storage error with redb's as
//! its source.

use std::path::Path;

use redb::{
    Database, MultimapTableHandle, ReadableDatabase, ReadableTable, StorageBackend,
    TableDefinition, TableHandle,
};

use super::{
    Commit, FIRST_ROW, Location, LogStore, META_NAME, MetaEntries, PageBackend, Rows, SUMMARY_ROW,
    StoreResult, Table, View, parse_table_name, table_name,
};
use crate::error::StorageError;
use crate::log::error::LogError;

/// The first bytes of every redb file.
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
const META: TableDefinition<&str, &[u8]> = TableDefinition::new(META_NAME);
// The log closes a row at `ROW_SPLIT_BYTES`, so a row is at most that plus
// one record: below redb's limit for one value (3 GiB).
const _: () = assert!(
    crate::log::ROW_SPLIT_BYTES + crate::records::FORMAT_MAX_RECORD < 3 << 30,
    "a row could pass redb's value limit"
);

fn log_table(name: &str) -> TableDefinition<'_, u64, &'static [u8]> {
    TableDefinition::new(name)
}

impl From<redb::Error> for LogError {
    fn from(e: redb::Error) -> Self {
        match e {
            redb::Error::Corrupted(msg) => LogError::Corrupt(msg),
            // redb reads only inside the file: a page past its end is one
            // a damaged pointer names.
            redb::Error::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                LogError::Corrupt(format!("a page lies past the end of the file ({io})"))
            }
            redb::Error::DatabaseAlreadyOpen => LogError::AlreadyOpen,
            redb::Error::Io(io) => LogError::Storage(io.into()),
            other => LogError::Storage(StorageError::engine(other)),
        }
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for LogError {
            fn from(err: $t) -> Self {
                LogError::from(redb::Error::from(err))
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::CompactionError
);

/// redb's options, which only this store reads.
#[derive(Clone, Debug)]
pub(crate) struct RedbOptions {
    /// The page cache's size.
    pub cache_bytes: usize,
    /// redb checks the checksum of every page of the committed trees at
    /// open and rebuilds its allocator state from them, instead of
    /// trusting a cleanly closed file.
    pub verify_pages: bool,
    /// redb's quick repair: one more sync per commit, for a fast reopen
    /// after a crash.
    pub quick_repair: bool,
    /// The journal in front of the file, if any (see `journal/`).
    pub journal: Option<super::journal::JournalSetting>,
}

/// The log's storage: one redb database.
pub(crate) struct RedbStore {
    db: Database,
    quick_repair: bool,
}

impl RedbStore {
    /// Opens (or creates) the database at `location` with `options`.
    pub(crate) fn open(location: Location, options: &RedbOptions) -> StoreResult<RedbStore> {
        let mut builder = redb::Builder::new();
        builder.set_cache_size(options.cache_bytes);
        builder.set_check_integrity_on_open(options.verify_pages);
        let db = match location {
            Location::Path(path) => open_path(&builder, &path, true)?,
            Location::Existing(path) => open_path(&builder, &path, false)?,
            Location::ReadOnly(path) => open_read_only(&builder, &path)?,
            Location::Backend(backend) => {
                let backend: std::sync::Arc<dyn PageBackend> = backend.into();
                builder
                    .create_with_backend(Pages(std::sync::Arc::clone(&backend)))
                    .map_err(|e| {
                        let ours = looks_like_a_store(|at, buf| read_some(&*backend, at, buf));
                        not_a_store_or(e.into(), ours)
                    })?
            }
        };
        Ok(RedbStore {
            db,
            quick_repair: options.quick_repair,
        })
    }
}

impl LogStore for RedbStore {
    fn read_meta(&self) -> StoreResult<Option<MetaEntries>> {
        meta_in(&self.db.begin_read()?)
    }

    fn table_names(&self) -> StoreResult<Vec<String>> {
        let read = self.db.begin_read()?;
        let mut names: Vec<String> = read.list_tables()?.map(|t| t.name().to_string()).collect();
        names.extend(read.list_multimap_tables()?.map(|t| t.name().to_string()));
        Ok(names)
    }

    fn check_bucket(&self, bucket: u64) -> StoreResult<()> {
        let read = self.db.begin_read()?;
        let name = table_name(bucket);
        read.open_table(log_table(&name))
            .map_err(|e| damaged_table(&name, e))?;
        Ok(())
    }

    fn read_row(&self, bucket: u64, row: u64) -> StoreResult<Option<Vec<u8>>> {
        if row == SUMMARY_ROW {
            return Ok(None);
        }
        let read = self.db.begin_read()?;
        let name = table_name(bucket);
        let table = match read.open_table(log_table(&name)) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(table.get(row)?.map(|v| v.value().to_vec()))
    }

    fn tables(&self) -> StoreResult<Vec<(u64, Table)>> {
        let read = self.db.begin_read()?;
        let buckets = buckets_in(&read)?;
        let mut out = Vec::with_capacity(buckets.len());
        for bucket in buckets {
            let name = table_name(bucket);
            let table = read
                .open_table(log_table(&name))
                .map_err(|e| damaged_table(&name, e))?;
            let summary = table.get(SUMMARY_ROW)?.map(|v| v.value().to_vec());
            let range = table.range(FIRST_ROW..)?;
            let rows: Rows = Box::new(Routed {
                name,
                table,
                range,
                last: None,
            });
            out.push((bucket, Table { summary, rows }));
        }
        Ok(out)
    }

    fn view(&self) -> StoreResult<View> {
        let read = self.db.begin_read()?;
        let meta = meta_in(&read)?.unwrap_or_default();
        let buckets = buckets_in(&read)?;
        let mut tables = Vec::with_capacity(buckets.len());
        for bucket in buckets {
            let name = table_name(bucket);
            let table = read.open_table(log_table(&name))?;
            // The range keeps the read transaction alive.
            let rows = table.range::<u64>(..)?.map(|entry| {
                let (k, v) = entry?;
                Ok((k.value(), v.value().to_vec()))
            });
            tables.push((bucket, Box::new(rows) as Rows));
        }
        Ok(View { meta, tables })
    }

    fn last_row(&self) -> StoreResult<u64> {
        let read = self.db.begin_read()?;
        let mut last = 0;
        for t in read.list_tables()? {
            if parse_table_name(t.name()).is_none() {
                continue;
            }
            let table = read.open_table(log_table(t.name()))?;
            if let Some((k, _)) = table.last()? {
                last = last.max(k.value());
            }
        }
        Ok(last)
    }

    fn row_range(&self, bucket: u64, rows: std::ops::RangeInclusive<u64>) -> StoreResult<Rows> {
        let read = self.db.begin_read()?;
        let name = table_name(bucket);
        let table = match read.open_table(log_table(&name)) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Box::new(std::iter::empty())),
            Err(e) => return Err(e.into()),
        };
        let (start, end) = ((*rows.start()).max(FIRST_ROW), *rows.end());
        Ok(rows_of(table.range(start..=end)?))
    }

    fn commit(&self, commit: Commit<'_>) -> StoreResult<()> {
        self.commit_all(vec![commit])
    }

    fn commit_all(&self, commits: Vec<Commit<'_>>) -> StoreResult<()> {
        let mut txn = self.db.begin_write()?;
        txn.set_quick_repair(self.quick_repair);
        for commit in commits {
            apply(&txn, commit)?;
        }
        txn.commit()?;
        Ok(())
    }

    fn used_bytes(&self) -> StoreResult<Option<u64>> {
        let txn = self.db.begin_write()?;
        let st = txn.stats()?;
        txn.abort()?;
        Ok(Some(st.allocated_pages() * st.page_size() as u64))
    }

    fn compact(&mut self) -> StoreResult<Option<bool>> {
        Ok(Some(self.db.compact()?))
    }
}

/// Applies `commit` inside `txn` (see the trait's order).
fn apply(txn: &redb::WriteTransaction, commit: Commit<'_>) -> StoreResult<()> {
    for bucket in commit.drop_buckets {
        let name = table_name(*bucket);
        txn.delete_table(log_table(&name))?;
    }
    for (bucket, rows) in commit.trims {
        let name = table_name(bucket);
        let mut table = txn.open_table(log_table(&name))?;
        table.retain_in(rows, |_, _| false)?;
    }
    // Each table opened once: its rows, then its summary.
    let mut rows = commit.rows;
    rows.sort_by_key(|(bucket, row, _)| (*bucket, *row));
    let mut summaries = commit.summaries;
    summaries.sort_by_key(|(bucket, _)| *bucket);
    let mut summaries = summaries.into_iter().peekable();
    let mut rows = rows.into_iter().peekable();
    while let Some(bucket) = match (rows.peek(), summaries.peek()) {
        (Some(r), Some(s)) => Some(r.0.min(s.0)),
        (Some(r), None) => Some(r.0),
        (None, Some(s)) => Some(s.0),
        (None, None) => None,
    } {
        let name = table_name(bucket);
        let mut table = txn.open_table(log_table(&name))?;
        while let Some((_, row, bytes)) = rows.next_if(|r| r.0 == bucket) {
            table.insert(row, bytes.as_slice())?;
        }
        if let Some((_, summary)) = summaries.next_if(|s| s.0 == bucket) {
            table.insert(SUMMARY_ROW, summary.as_slice())?;
        }
    }
    if !commit.meta.is_empty() || !commit.raw_meta.is_empty() {
        let mut table = txn.open_table(META)?;
        let raw = commit.raw_meta.iter().map(|(k, v)| (k.as_str(), v));
        for (k, v) in commit.meta.iter().map(|(k, v)| (*k, v)).chain(raw) {
            match v {
                Some(v) => {
                    table.insert(k, v.as_slice())?;
                }
                None => {
                    table.remove(k)?;
                }
            }
        }
    }
    Ok(())
}

/// A bucket table's rows as iteration reads them, with the first and the
/// last row of every leaf also found by a lookup of its number.
///
/// redb does not check a cleanly closed file's branch pages as it reads
/// them: a damaged separator key sends lookups of the keys between its old
/// and its new value to the wrong child, while iteration, which walks the
/// children in order, still reads every row. The engine reads single rows
/// by lookup, so what replay read must be found that way too. If any
/// existing key is misrouted, so is the first key of the leftmost leaf
/// right of the separator (a separator raised) or the last key of the
/// rightmost leaf left of it (lowered): looking up each leaf's first and
/// last row finds every damaged separator that matters, at two lookups a
/// leaf instead of one a row. A leaf ends where the next value does not
/// start where the previous one ended (a leaf stores its values back to
/// back, and no two pages touch that way); were the values not where the
/// page holds them, every row would be looked up.
struct Routed {
    name: String,
    table: redb::ReadOnlyTable<u64, &'static [u8]>,
    range: redb::Range<'static, u64, &'static [u8]>,
    /// The row read last: its number, its bytes' length, checksum and end
    /// address, and whether it was looked up.
    last: Option<Last>,
}

struct Last {
    row: u64,
    len: usize,
    tail: [u8; 8],
    end: usize,
    found: bool,
}

impl Routed {
    /// Looks up `row` and checks that it is the row read (same length and
    /// checksum, its last 8 bytes).
    fn look_up(&self, row: u64, len: usize, tail: &[u8]) -> StoreResult<()> {
        match self.table.get(row)? {
            Some(v) if v.value().len() == len && v.value().ends_with(tail) => Ok(()),
            _ => Err(LogError::Corrupt(format!(
                "the table {:?} holds row {row}, but a lookup of it does not find it \
                 (a damaged branch page)",
                self.name
            ))),
        }
    }
}

impl Iterator for Routed {
    type Item = StoreResult<(u64, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        let entry = match self.range.next() {
            Some(Ok(entry)) => entry,
            Some(Err(e)) => return Some(Err(e.into())),
            None => {
                // The last row of the last leaf.
                let last = self.last.take()?;
                if !last.found
                    && let Err(e) = self.look_up(last.row, last.len, &last.tail)
                {
                    return Some(Err(e));
                }
                return None;
            }
        };
        let (row, bytes) = (entry.0.value(), entry.1.value());
        let start = bytes.as_ptr() as usize;
        let tail: [u8; 8] = bytes
            .len()
            .checked_sub(8)
            .and_then(|at| bytes[at..].try_into().ok())
            .unwrap_or_default();
        let first_of_leaf = self.last.as_ref().is_none_or(|l| l.end != start);
        if first_of_leaf {
            if let Some(l) = self.last.as_ref().filter(|l| !l.found)
                && let Err(e) = self.look_up(l.row, l.len, &l.tail)
            {
                return Some(Err(e));
            }
            if let Err(e) = self.look_up(row, bytes.len(), &tail) {
                return Some(Err(e));
            }
        }
        self.last = Some(Last {
            row,
            len: bytes.len(),
            tail,
            end: start + bytes.len(),
            found: first_of_leaf,
        });
        Some(Ok((row, bytes.to_vec())))
    }
}

fn rows_of(range: redb::Range<'static, u64, &'static [u8]>) -> Rows {
    Box::new(range.map(|entry| {
        let (k, v) = entry?;
        Ok((k.value(), v.value().to_vec()))
    }))
}

/// The metadata entries as `read` sees them; `None` without the table.
fn meta_in(read: &redb::ReadTransaction) -> StoreResult<Option<MetaEntries>> {
    let table = match read.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(damaged_table(META_NAME, e)),
    };
    let mut out = Vec::new();
    for entry in table.iter()? {
        let (k, v) = entry?;
        out.push((k.value().to_string(), v.value().to_vec()));
    }
    Ok(Some(out))
}

/// Every bucket that has a table, ascending, as `read` sees them.
fn buckets_in(read: &redb::ReadTransaction) -> StoreResult<Vec<u64>> {
    let mut buckets: Vec<u64> = read
        .list_tables()?
        .filter_map(|t| parse_table_name(t.name()))
        .collect();
    buckets.sort_unstable();
    Ok(buckets)
}

/// A table that exists but cannot be opened as ours is damage.
fn damaged_table(name: &str, e: redb::TableError) -> LogError {
    match e {
        redb::TableError::Storage(s) => LogError::from(s),
        other => LogError::Corrupt(format!("the table {name:?} cannot be opened: {other}")),
    }
}

/// A caller's pages as redb's backend: redb takes backends by value, and
/// an open that fails looks at the bytes after redb gave them back. One
/// dynamic call per page read or write, as redb's own trait costs; redb's
/// range locks keep their defaults (unsupported), as for its in-memory
/// backend.
#[derive(Debug)]
struct Pages(std::sync::Arc<dyn PageBackend>);

type Io<T> = std::result::Result<T, std::io::Error>;

impl StorageBackend for Pages {
    fn len(&self) -> Io<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Io<()> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Io<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Io<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Io<()> {
        self.0.write(offset, data)
    }
}

/// Opens the file at `path`; a missing one is created only if `create`.
/// An empty file is refused: it is not a store, but it may be a truncated
/// one, and making it a new empty store would hide that.
fn open_path(builder: &redb::Builder, path: &Path, create: bool) -> StoreResult<Database> {
    let res = match path.metadata() {
        Ok(m) if m.is_file() && m.len() == 0 => {
            return Err(LogError::NotAStore(format!(
                "{} is an empty file (maybe a truncated store); remove it to start a new store",
                path.display()
            )));
        }
        Ok(_) => builder.open(path).map_err(|e| {
            let ours = std::fs::File::open(path).and_then(|mut f| {
                use std::io::{Read, Seek, SeekFrom};
                looks_like_a_store(|at, buf| {
                    f.seek(SeekFrom::Start(at))?;
                    f.read(buf)
                })
            });
            not_a_store_or(e.into(), ours)
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => {
            return Err(io_at(
                path,
                &std::io::Error::new(
                    e.kind(),
                    "no store file here (open_existing never creates one)",
                ),
            ));
        }
        Err(_) => builder
            .create(path)
            .map_err(LogError::from)
            .and_then(|db| owner_only(path).map(|()| db)),
    };
    res.map_err(|e| with_path(path, e))
}

/// Opens the file at `path` for reading only, under an image in memory
/// that takes whatever redb writes (see [`read_only`](super::read_only)).
/// Never creates a file; a directory, or an empty file, is not a store.
fn open_read_only(builder: &redb::Builder, path: &Path) -> StoreResult<Database> {
    let file = std::fs::File::open(path).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::NotFound {
            "no store file here (a read-only open never creates one)".to_string()
        } else {
            e.to_string()
        };
        io_at(path, &std::io::Error::new(e.kind(), why))
    })?;
    let found = file.metadata().map_err(|e| io_at(path, &e))?;
    if found.is_dir() {
        return Err(LogError::NotAStore(format!(
            "{} is a directory, not a store file",
            path.display()
        )));
    }
    if found.len() == 0 {
        return Err(LogError::NotAStore(format!(
            "{} is an empty file (maybe a truncated store)",
            path.display()
        )));
    }
    let image: std::sync::Arc<dyn PageBackend> =
        std::sync::Arc::new(super::read_only::Image::new(file, found.len()));
    builder
        .create_with_backend(Pages(std::sync::Arc::clone(&image)))
        .map_err(|e| {
            let ours = looks_like_a_store(|at, buf| read_some(&*image, at, buf));
            match with_path(path, not_a_store_or(e.into(), ours)) {
                LogError::Corrupt(why) => LogError::Corrupt(format!("{}: {why}", path.display())),
                e => e,
            }
        })
}

/// `e`, with `path` in its message if it is an I/O error.
fn with_path(path: &Path, e: LogError) -> LogError {
    match e {
        LogError::Storage(s) => match s.as_io() {
            Some(io) => io_at(path, io),
            None => LogError::Storage(s),
        },
        e => e,
    }
}

/// Makes a file this process just created readable and writable by its
/// owner only (on Unix): it will hold the store's key secret and every
/// key. Done before the first commit writes either.
fn owner_only(path: &Path) -> StoreResult<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io_at(path, &e))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// An I/O error with the path in its message.
fn io_at(path: &Path, e: &std::io::Error) -> LogError {
    LogError::Storage(crate::error::io_at(path, e))
}

/// A file that redb cannot parse: damaged if it starts as a redb file does
/// or holds a dedupkv table name (`ours`, as [`looks_like_a_store`] found),
/// otherwise not a store.
fn not_a_store_or(e: redb::Error, ours: std::io::Result<bool>) -> LogError {
    let why = match &e {
        redb::Error::Corrupted(msg) => msg.clone(),
        redb::Error::UpgradeRequired(v) => {
            format!("redb file format {v} is not the one dedupkv uses")
        }
        redb::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => io.to_string(),
        _ => return e.into(),
    };
    match ours {
        Ok(true) => LogError::Corrupt(format!("redb cannot open the file: {why}")),
        Ok(false) => LogError::NotAStore(format!("not a redb file ({why})")),
        Err(io) => LogError::Storage(io.into()),
    }
}

/// Up to `buf.len()` bytes of `backend` from `at`; 0 past its end.
fn read_some(backend: &dyn PageBackend, at: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let len = backend.len()?;
    let n = usize::try_from(len.saturating_sub(at)).map_or(buf.len(), |left| left.min(buf.len()));
    backend.read(at, &mut buf[..n])?;
    Ok(n)
}

/// Whether the bytes (read by `read_at(offset, buf)`, which answers how
/// many it read, 0 at the end) start with redb's header, or hold the name
/// of dedupkv's metadata table anywhere (the header may be what is
/// damaged).
fn looks_like_a_store(
    mut read_at: impl FnMut(u64, &mut [u8]) -> std::io::Result<usize>,
) -> std::io::Result<bool> {
    const NEEDLE: &[u8] = META_NAME.as_bytes();
    let mut buf = vec![0u8; 1 << 20];
    let mut kept = 0;
    let mut at = 0u64;
    loop {
        let n = read_at(at, &mut buf[kept..])?;
        if n == 0 {
            return Ok(false);
        }
        let filled = kept + n;
        if at == 0 && buf[..filled].starts_with(&REDB_MAGIC) {
            return Ok(true);
        }
        at += n as u64;
        if buf[..filled].windows(NEEDLE.len()).any(|w| w == NEEDLE) {
            return Ok(true);
        }
        // Keep the tail, in case the name straddles two reads.
        kept = (NEEDLE.len() - 1).min(filled);
        buf.copy_within(filled - kept..filled, 0);
    }
}
