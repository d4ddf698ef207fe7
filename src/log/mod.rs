//! The write-ahead log in redb.
//!
//! redb is used as a log, never as the index: random keys in a redb B-tree
//! copy a leaf page each, while one row per commit appended at an increasing
//! key is nearly free. Layout:
//!
//! - table `dedupkv.meta` (`&str -> &[u8]`): magic, format version, key-hash
//!   algorithm and secret, bucket granularity;
//! - one table per expiry bucket, `log.<bucket>` (`u64 -> &[u8]`): row
//!   number to a row of records (see [`format`](mod@format)). Dropping a whole bucket is
//!   one `delete_table`.
//!
//! Invariant: a row number is written by one commit only, and rows of later
//! commits have larger numbers.

pub(crate) mod commit;
pub(crate) mod format;
pub(crate) mod recovery;

use std::path::Path;

use std::ops::Bound;

use redb::{Database, ReadableDatabase, StorageBackend, TableDefinition, TableHandle};

use crate::key::{KeyHasher, KeyHashing};
use crate::{Error, Result};

pub(crate) use commit::Log;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("dedupkv.meta");
const MAGIC: &[u8] = b"dedupkv store";
/// The newest store format this build understands.
pub(crate) const FORMAT_VERSION: u32 = 1;
const LOG_PREFIX: &str = "log.";

/// The settings fixed when a store file is created.
#[derive(Clone)]
pub(crate) struct FileMeta {
    pub hasher: KeyHasher,
    pub granularity_ms: u64,
}

/// Where the store lives: a path, or a redb storage backend (tests, fault
/// injection).
pub(crate) enum Location {
    Path(std::path::PathBuf),
    Backend(Box<dyn redb::StorageBackend>),
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
        Location::Path(path) => open_path(&builder, &path)?,
        Location::Backend(backend) => builder
            .create_with_backend(Boxed(backend))
            .map_err(|e| not_a_store_or(e.into()))?,
    };
    let meta = read_or_init_meta(&db, wanted)?;
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

fn open_path(builder: &redb::Builder, path: &Path) -> Result<Database> {
    let existed = path.metadata().is_ok_and(|m| m.len() > 0);
    let res = if existed {
        builder.open(path)
    } else {
        builder.create(path)
    };
    res.map_err(|e| {
        let e = Error::from(e);
        if existed { not_a_store_or(e) } else { e }
    })
}

/// A file that redb cannot parse at all is reported as "not a store".
fn not_a_store_or(e: Error) -> Error {
    match e {
        Error::Corrupt(msg) => Error::NotAStore(format!("not a redb file ({msg})")),
        Error::Storage(redb::Error::UpgradeRequired(v)) => {
            Error::NotAStore(format!("redb file format {v} is not the one dedupkv uses"))
        }
        Error::Storage(redb::Error::Io(io)) if io.kind() == std::io::ErrorKind::InvalidData => {
            Error::NotAStore(io.to_string())
        }
        other => other,
    }
}

fn read_or_init_meta(db: &Database, wanted: &FileMeta) -> Result<FileMeta> {
    let read = db.begin_read()?;
    let table = match read.open_table(META) {
        Ok(t) => Some(t),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(e.into()),
    };
    if let Some(table) = table {
        let get = |k: &str| -> Result<Vec<u8>> {
            table
                .get(k)?
                .map(|v| v.value().to_vec())
                .ok_or_else(|| Error::Corrupt(format!("metadata entry {k:?} is missing")))
        };
        if get("magic")? != MAGIC {
            return Err(Error::NotAStore("wrong magic in dedupkv.meta".into()));
        }
        let version = u32::from_le_bytes(fixed(&get("format")?, "format")?);
        if version > FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let hashing = get("key_hashing")?;
        let kind = hashing
            .first()
            .and_then(|t| KeyHashing::from_tag(*t))
            .ok_or_else(|| Error::Corrupt("unknown key hashing tag".into()))?;
        let secret: [u8; 16] = fixed(&get("key_secret")?, "key_secret")?;
        let granularity_ms = u64::from_le_bytes(fixed(&get("granularity_ms")?, "granularity")?);
        if granularity_ms == 0 {
            return Err(Error::Corrupt("bucket granularity is zero".into()));
        }
        return Ok(FileMeta {
            hasher: KeyHasher::new(kind, secret),
            granularity_ms,
        });
    }
    // A redb file with tables but no metadata belongs to someone else.
    if read.list_tables()?.next().is_some() {
        return Err(Error::NotAStore(
            "a redb database without dedupkv metadata".into(),
        ));
    }
    drop(read);
    let txn = db.begin_write()?;
    {
        let mut t = txn.open_table(META)?;
        t.insert("magic", MAGIC)?;
        t.insert("format", FORMAT_VERSION.to_le_bytes().as_slice())?;
        t.insert("key_hashing", [wanted.hasher.kind().tag()].as_slice())?;
        t.insert("key_secret", wanted.hasher.secret().as_slice())?;
        t.insert(
            "granularity_ms",
            wanted.granularity_ms.to_le_bytes().as_slice(),
        )?;
    }
    txn.commit()?;
    Ok(wanted.clone())
}

fn fixed<const N: usize>(v: &[u8], what: &str) -> Result<[u8; N]> {
    v.try_into()
        .map_err(|_| Error::Corrupt(format!("metadata entry {what:?} has the wrong size")))
}

/// The persisted floor for fencing tokens (0 for a store that has none).
pub(crate) fn token_floor(db: &Database) -> Result<u64> {
    let read = db.begin_read()?;
    let table = read.open_table(META)?;
    let Some(v) = table.get("token_floor")? else {
        return Ok(0);
    };
    Ok(u64::from_le_bytes(fixed(v.value(), "token_floor")?))
}

/// Writes the fencing-token floor into an open write transaction.
pub(crate) fn put_token_floor(txn: &redb::WriteTransaction, floor: u64) -> Result<()> {
    let mut t = txn.open_table(META)?;
    t.insert("token_floor", floor.to_le_bytes().as_slice())?;
    Ok(())
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
