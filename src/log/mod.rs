//! The write-ahead log: rows of records in one table per expiry bucket,
//! and a metadata table, kept by a `LogStore` (store/mod.rs) (redb,
//! see [`store::redb`] for the layout).
//!
//! - [`record`]: what a record says, with a constructor per kind;
//! - [`format`](mod@format) and [`decode`]: a row's bytes, written and read;
//! - [`commit`]: group commit, the log's one write path;
//! - [`durable`]: durability awaited by async callers (a waker list beside
//!   the commit futex, and the deferring scope);
//! - [`meta`]: the settings fixed at creation and the manifest;
//! - [`observe`]: what commits cost (totals, and an observer per commit);
//! - [`summary`]: each bucket table's summary, which an open checks;
//! - [`recovery`]: replay at open;
//! - [`ship`]: the seam a replica (feature "replica") reads durable
//!   commits through, and rebuilds a file with;
//! - [`store`]: the storage trait and its redb implementation;
//! - [`error`]: what the storage reports, in the log's terms.
//!
//! Invariants: a row number is written by one commit only, and rows of
//! later commits have larger numbers; the tables in the file are exactly
//! the ones the manifest lists, as of every commit; in a format-5 file
//! each bucket table's rows are the ones its summary records, as of every
//! commit, so an open never yields fewer rows than the last commit
//! recorded.

pub(crate) mod body;
pub(crate) mod commit;
pub(crate) mod decode;
pub(crate) mod durable;
pub(crate) mod error;
pub(crate) mod format;
pub(crate) mod meta;
pub(crate) mod observe;
pub(crate) mod record;
pub(crate) mod recovery;
pub(crate) mod ship;
pub(crate) mod store;
pub(crate) mod summary;

use std::path::Path;

use crate::error::StorageError;
use crate::{Error, Result};

pub(crate) use commit::Log;
pub(crate) use meta::FileMeta;
pub(crate) use store::Location;
use store::LogStore;

/// The log's storage, as the log holds it: one dynamic call per commit,
/// row read or table scan, never per record.
pub(crate) type Storage = Box<dyn LogStore>;

/// Opens (or creates) the storage, with a page cache of `cache_bytes` and
/// redb's check of every page if `verify_pages`, and checks or writes its
/// metadata (a read-only location's is only checked: a file without it
/// is not a store).
pub(crate) fn open_database(
    location: Location,
    (cache_bytes, verify_pages): (usize, bool),
    wanted: &FileMeta,
    hashing_set: bool,
    granularity_set: bool,
) -> Result<(Storage, FileMeta)> {
    let read_only = location
        .is_read_only()
        .then(|| location.path().map(Path::to_path_buf))
        .flatten();
    let mut db: Storage = Box::new(store::redb::RedbStore::open(
        location,
        cache_bytes,
        verify_pages,
    )?);
    if let Some(path) = &read_only {
        db = Box::new(store::read_only::Guarded::new(db, path.clone()));
    }
    let meta = if read_only.is_some() {
        meta::read_existing(&*db)?
    } else {
        meta::read_or_init(&*db, wanted)?
    };
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

/// `e`, with the path in its message if it is an I/O error.
pub(crate) fn at_path(e: Error, path: Option<&Path>) -> Error {
    match (e, path) {
        (Error::Storage(s), Some(p)) => match s.as_io() {
            Some(io) => Error::Storage(io_at(p, io)),
            None => Error::Storage(s),
        },
        (e, _) => e,
    }
}

/// An I/O error with the path in its message.
pub(crate) fn io_at(path: &Path, e: &std::io::Error) -> StorageError {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display())).into()
}
