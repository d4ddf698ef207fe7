//! The write-ahead log: rows of records in one table per expiry bucket,
//! and a metadata table, kept by a `LogStore` (store/mod.rs) (redb,
//! see `store/redb.rs` for the layout). The records themselves are the
//! vocabulary of [`crate::records`].
//!
//! This file is the log's one door: everything outside `log/` uses what
//! it re-exports below, and the files behind it are private.
//!
//! - `facade.rs`: the `Log` the engine calls: start, the batch, reads;
//! - `batch.rs`: the open batch, which every record is appended to;
//! - `commit.rs`: group commit, the log's one write path;
//! - `ack.rs`: what a caller may be told (the durable and replicated
//!   watermarks, the poison and the fence), the waits and the polls;
//! - `durable.rs`: durability awaited by async callers (a waker list beside
//!   the commit futex);
//! - `meta.rs`: the settings fixed at creation and the manifest;
//! - `observe.rs`: what commits cost (totals, and an observer per commit);
//! - `summary.rs`: each bucket table's summary, which an open checks;
//! - `recovery.rs`: replay at open;
//! - `ship.rs`: the seam a replica (feature "replica") reads durable
//!   commits through, and rebuilds a file with;
//! - `store/`: the storage trait and its redb implementation;
//! - `error.rs`: what the storage reports, in the log's terms.
//!
//! Invariants: a row number is written by one commit only, and rows of
//! later commits have larger numbers; the tables in the file are exactly
//! the ones the manifest lists, as of every commit; in a format-5 file
//! each bucket table's rows are the ones its summary records, as of every
//! commit, so an open never yields fewer rows than the last commit
//! recorded.

mod ack;
mod batch;
mod commit;
mod durable;
mod error;
mod facade;
mod meta;
mod observe;
mod recovery;
mod ship;
mod store;
mod summary;

use std::path::Path;

use crate::{Error, Result};

pub(crate) use batch::{Batch, ROW_SPLIT_BYTES};
pub(crate) use durable::Waiting;
pub(crate) use facade::{Found, Log, LogSettings};
pub(crate) use meta::FileMeta;
pub(crate) use observe::CommitObserver;
pub(crate) use recovery::{Replay, Replayed, replay};
pub(crate) use ship::Ship;
#[cfg(feature = "replica")]
pub(crate) use ship::{Acks, LocalFile, Restorer, Shipped, Sink, inspect};
pub use store::PageBackend;
#[cfg(feature = "replica")]
pub(crate) use store::journal::journal_path;
pub(crate) use store::journal::{
    DEFAULT_BYTES as JOURNAL_BYTES, JournalSetting, fuzz_segment as fuzz_journal,
    segment_of_payload as journal_of_payload,
};
pub(crate) use store::redb::RedbOptions;
pub(crate) use store::{Location, LogStore};
#[cfg(feature = "replica")]
pub(crate) use store::{SUMMARY_ROW, View};

/// The log's storage, as the log holds it: one dynamic call per commit,
/// row read or table scan, never per record.
pub(crate) type Storage = Box<dyn LogStore>;

/// Opens (or creates) the storage at `location`. The composition root:
/// the one place that chooses the storage under the log.
/// A read-only location's storage answers every call under a guard that
/// turns a panic of the storage engine (a live writer changed the file
/// under it) into an error naming the file. The journal, if the options
/// ask for one or the store has one, goes in front (`store/journal/`).
fn open_store(location: Location, options: RedbOptions) -> Result<Storage> {
    let read_only = location
        .is_read_only()
        .then(|| location.path().map(Path::to_path_buf))
        .flatten();
    let path = location.path().map(Path::to_path_buf);
    let db: Storage = Box::new(store::redb::RedbStore::open(location, &options)?);
    let db: Storage = match &read_only {
        Some(path) => Box::new(store::read_only::Guarded::new(db, path.clone())),
        None => db,
    };
    store::journal::wrap(db, path.as_deref(), read_only.is_some(), options.journal)
}

/// Opens (or creates) the storage at `location` with a small page cache,
/// no page checks and no quick repair: for a file this process writes or
/// reads once (a restore, an inspection). `journal`: `None` for a file
/// made aside and renamed (its journal would keep the wrong name; an
/// existing one is settled); the default for a store to inspect, whose
/// journal stays on.
#[cfg(feature = "replica")]
fn open_plain(
    location: Location,
    cache_bytes: usize,
    journal: Option<JournalSetting>,
) -> Result<Storage> {
    open_store(
        location,
        RedbOptions {
            cache_bytes,
            verify_pages: false,
            quick_repair: false,
            journal,
        },
    )
}

/// Opens (or creates) the storage with `options`, and checks or writes its
/// metadata (a read-only location's is only checked: a file without it
/// is not a store).
pub(crate) fn open_database(
    location: Location,
    options: RedbOptions,
    wanted: &FileMeta,
    hashing_set: bool,
    granularity_set: bool,
) -> Result<(Storage, FileMeta)> {
    let read_only = location.is_read_only();
    let db = open_store(location, options)?;
    let meta = if read_only {
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
