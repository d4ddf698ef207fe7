//! The write-ahead log in redb.
//!
//! redb is used as a log, never as the index: random keys in a redb B-tree
//! copy a leaf page each, while one row per commit appended at an increasing
//! key is nearly free. Layout:
//!
//! - table `dedupkv.meta` (`&str -> &[u8]`): the settings fixed at
//!   creation under a checksum, and the manifest: every bucket table and
//!   the persisted floors (see [`meta`]);
//! - one table per expiry bucket, `log.<bucket>` (`u64 -> &[u8]`): row
//!   number to a row of records (see [`format`](mod@format)). Dropping a whole bucket is
//!   one `delete_table`.
//!
//! Invariants: a row number is written by one commit only, and rows of
//! later commits have larger numbers; the tables in the file are exactly
//! the ones the manifest lists, as of every commit.

pub(crate) mod commit;
pub(crate) mod format;
pub(crate) mod meta;
pub(crate) mod recovery;

use std::path::{Path, PathBuf};

use std::ops::Bound;

use redb::{Database, ReadableDatabase, StorageBackend, TableDefinition, TableHandle};

use crate::{Error, Result};

pub(crate) use commit::Log;
pub(crate) use meta::FileMeta;

const LOG_PREFIX: &str = "log.";
/// The first bytes of every redb file.
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// Where the store lives: a path (created if missing), a path that must
/// hold a store already, or a redb storage backend (tests, fault
/// injection).
pub(crate) enum Location {
    Path(PathBuf),
    Existing(PathBuf),
    Backend(Box<dyn redb::StorageBackend>),
}

impl Location {
    pub(crate) fn path(&self) -> Option<&Path> {
        match self {
            Location::Path(p) | Location::Existing(p) => Some(p),
            Location::Backend(_) => None,
        }
    }
}

/// Forwards every call to a boxed backend (redb takes backends by value).
#[derive(Debug)]
struct Boxed(Box<dyn StorageBackend>);

type Io<T> = std::result::Result<T, std::io::Error>;
type Lock<T> = std::result::Result<T, redb::BackendError>;

impl StorageBackend for Boxed {
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
    fn close(&self) -> Io<()> {
        self.0.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Lock<bool> {
        self.0.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Lock<bool> {
        self.0.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Lock<()> {
        self.0.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Lock<()> {
        self.0.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Lock<()> {
        self.0.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Lock<bool> {
        self.0.query_lock_range(start, end)
    }
}

pub(crate) fn table_name(bucket: u64) -> String {
    format!("{LOG_PREFIX}{bucket:012}")
}

pub(crate) fn parse_table_name(name: &str) -> Option<u64> {
    name.strip_prefix(LOG_PREFIX)?.parse().ok()
}

pub(crate) fn log_table(name: &str) -> TableDefinition<'_, u64, &'static [u8]> {
    TableDefinition::new(name)
}

/// Opens (or creates) the redb database and checks or writes its metadata.
pub(crate) fn open_database(
    location: Location,
    cache_bytes: usize,
    wanted: &FileMeta,
    hashing_set: bool,
    granularity_set: bool,
) -> Result<(Database, FileMeta)> {
    let mut builder = redb::Builder::new();
    builder.set_cache_size(cache_bytes);
    let db = match location {
        Location::Path(path) => open_path(&builder, &path, true)?,
        Location::Existing(path) => open_path(&builder, &path, false)?,
        Location::Backend(backend) => builder
            .create_with_backend(Boxed(backend))
            .map_err(|e| not_a_store_or(e.into(), None))?,
    };
    let meta = meta::read_or_init(&db, wanted)?;
    if hashing_set && meta.hasher.kind() != wanted.hasher.kind() {
        return Err(Error::InvalidConfig(format!(
            "the store was created with key hashing {:?}, not {:?}; it cannot change",
            meta.hasher.kind(),
            wanted.hasher.kind()
        )));
    }
    if granularity_set && meta.granularity_ms != wanted.granularity_ms {
        return Err(Error::InvalidConfig(format!(
            "the store was created with a bucket granularity of {} ms, not {} ms; it cannot change",
            meta.granularity_ms, wanted.granularity_ms
        )));
    }
    Ok((db, meta))
}

/// Opens the file at `path`; a missing one is created only if `create`.
/// An empty file is refused: it is not a store, but it may be a truncated
/// one, and making it a new empty store would hide that.
fn open_path(builder: &redb::Builder, path: &Path, create: bool) -> Result<Database> {
    let res = match path.metadata() {
        Ok(m) if m.is_file() && m.len() == 0 => {
            return Err(Error::NotAStore(format!(
                "{} is an empty file (maybe a truncated store); remove it to start a new store",
                path.display()
            )));
        }
        Ok(_) => builder
            .open(path)
            .map_err(|e| not_a_store_or(e.into(), Some(path))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => {
            return Err(io_at(
                path,
                &std::io::Error::new(
                    e.kind(),
                    "no store file here (open_existing never creates one)",
                ),
            ));
        }
        Err(_) => builder.create(path).map_err(Error::from),
    };
    res.map_err(|e| at_path(e, Some(path)))
}

/// `e`, with the path in its message if it is an I/O error.
pub(crate) fn at_path(e: Error, path: Option<&Path>) -> Error {
    match (e, path) {
        (Error::Storage(redb::Error::Io(io)), Some(p)) => io_at(p, &io),
        (e, _) => e,
    }
}

/// An I/O error with the path in its message.
pub(crate) fn io_at(path: &Path, e: &std::io::Error) -> Error {
    Error::Storage(redb::Error::Io(std::io::Error::new(
        e.kind(),
        format!("{}: {e}", path.display()),
    )))
}

/// A file that redb cannot parse: damaged if it starts as a redb file does
/// or holds a dedupkv table name, otherwise not a store.
fn not_a_store_or(e: Error, path: Option<&Path>) -> Error {
    let why = match &e {
        Error::Corrupt(msg) => msg.clone(),
        Error::Storage(redb::Error::UpgradeRequired(v)) => {
            format!("redb file format {v} is not the one dedupkv uses")
        }
        Error::Storage(redb::Error::Io(io)) if io.kind() == std::io::ErrorKind::InvalidData => {
            io.to_string()
        }
        _ => return e,
    };
    let Some(path) = path else {
        return Error::NotAStore(format!("not a redb file ({why})"));
    };
    match looks_like_a_store(path) {
        Ok(true) => Error::Corrupt(format!("redb cannot open the file: {why}")),
        Ok(false) => Error::NotAStore(format!("not a redb file ({why})")),
        Err(io) => io_at(path, &io),
    }
}

/// Whether the file starts with redb's header, or holds the name of
/// dedupkv's metadata table anywhere (the header may be what is damaged).
fn looks_like_a_store(path: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    const NEEDLE: &[u8] = meta::META_NAME.as_bytes();
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut kept = 0;
    let mut first = true;
    loop {
        let n = file.read(&mut buf[kept..])?;
        if n == 0 {
            return Ok(false);
        }
        let filled = kept + n;
        if first && buf[..filled].starts_with(&REDB_MAGIC) {
            return Ok(true);
        }
        first = false;
        if buf[..filled].windows(NEEDLE.len()).any(|w| w == NEEDLE) {
            return Ok(true);
        }
        // Keep the tail, in case the name straddles two reads.
        kept = (NEEDLE.len() - 1).min(filled);
        buf.copy_within(filled - kept..filled, 0);
    }
}

/// Reads one row from a bucket table, if it is there.
pub(crate) fn read_row(db: &Database, bucket: u64, row: u64) -> Result<Option<Vec<u8>>> {
    let read = db.begin_read()?;
    let name = table_name(bucket);
    let table = match read.open_table(log_table(&name)) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(table.get(row)?.map(|v| v.value().to_vec()))
}

/// The bucket numbers that have a log table.
pub(crate) fn buckets(db: &Database) -> Result<Vec<u64>> {
    let read = db.begin_read()?;
    let mut out: Vec<u64> = read
        .list_tables()?
        .filter_map(|t| parse_table_name(t.name()))
        .collect();
    out.sort_unstable();
    Ok(out)
}
