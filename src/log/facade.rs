//! The `Log` façade: what the engine calls. It opens the log on what
//! recovery found (the committer thread and the first commit), hands out
//! the open batch, reads rows and tables, and closes the file. Commits are
//! `commit.rs`'s; what a caller may be told, and the waits, are `ack.rs`'s.
//!
//! Invariants:
//! - `start` returns only after the first commit succeeded, with nothing in
//!   flight and no kick queued: that commit persists the fencing-token
//!   floor before any record of this run;
//! - an append is refused once the log is poisoned;
//! - a read sees the state of the last commit before it began; compaction
//!   alone takes the storage to itself (commits and reads wait);
//! - dropping the log stops the committer after its last commit, then
//!   closes the storage, keeping a panic of the storage engine inside.

use std::collections::{BTreeMap, BTreeSet};

use super::Storage;
use super::ack::Ack;
use super::batch::{Batch, InBatch, ROW_SPLIT_BYTES};
use super::commit::{Committed, Db, Lead, Shared, Tables, Writing, commit_pending, run};
use super::meta::Manifest;
use super::observe::CommitStats;
use super::ship::{AckTarget, Acks, Ship};
use super::summary::{self, Summary};
use crate::records::{FORMAT_VERSION, OLDEST_KEPT_FORMAT, RowReader, read_row};
use crate::sync::{
    Arc, AtomicBool, AtomicU32, AtomicU64, JoinHandle, MappedRwLockReadGuard, Mutex, MutexGuard,
    Ordering, RwLock, RwLockReadGuard, bounded,
};
use crate::{Durability, Error, Result};

/// How the log commits.
#[derive(Clone)]
pub(crate) struct LogSettings {
    pub durability: Durability,
    /// Where a row is closed (see [`ROW_SPLIT_BYTES`]).
    pub split_at: usize,
    /// How far the records' times may pass the persisted time floor before
    /// a commit rewrites it (the bucket granularity: a reopened store's
    /// time then starts at most this far behind the latest record's).
    pub time_step: u64,
    /// The replica, if any (`log::ship`).
    pub ship: Option<Ship>,
    /// Upgrade the file to the newest format in the first commit.
    pub upgrade: bool,
}

/// What open found in the file, for the log to go on from.
pub(crate) struct Found {
    /// The newest row on disk.
    pub last_row: u64,
    /// The live buckets' tables.
    pub buckets: BTreeSet<u64>,
    /// The manifest as checked at open.
    pub manifest: Manifest,
    /// Every bucket table's summary, as replay computed it from the rows.
    pub summaries: BTreeMap<u64, Summary>,
    /// The file's store format.
    pub format: u32,
}

/// The log: append under a shard lock, then wait for durability.
pub(crate) struct Log {
    pub(super) shared: Arc<Shared>,
    pub(super) durability: Durability,
    committer: Option<JoinHandle<()>>,
    /// The file's format once the open's first commit was made.
    opened_format: u32,
    /// Set once the log of a read-only open has made its start (in
    /// memory): the file, named by every refused append.
    pub(super) read_only: Option<std::path::PathBuf>,
}

impl Log {
    /// Starts the committer on what open `found` (the manifest, as
    /// checked at open, is rewritten by every commit that changes it).
    /// Returns after the first commit, which persists the fencing-token
    /// `token_floor` before any record of this run, and rewrites a file of
    /// format 1 or 2 as format 3 (or any older file as the newest format,
    /// with [`LogSettings::upgrade`]); its failure is the error
    /// ([`Error::Corrupt`] when the storage engine panicked, as it does on
    /// a damaged file).
    pub(crate) fn start(
        db: Storage,
        found: Found,
        token_floor: u64,
        settings: LogSettings,
    ) -> Result<Log> {
        let durability = settings.durability;
        let format = found.format;
        let (kick, kicked) = bounded(1);
        let shared = Arc::new(shared(db, found, token_floor, settings, kick));
        if let Some(ship) = &shared.ship {
            let target: crate::sync::Weak<dyn AckTarget> = Arc::downgrade(&shared) as _;
            ship.sink.attach(Acks(target));
        }
        let wait = match durability {
            Durability::Deferred { max_delay } => Some(max_delay),
            Durability::Immediate => None,
        };
        let s = Arc::clone(&shared);
        let committer = crate::sync::spawn("dedupkv-commit", move || run(&s, &kicked, wait))
            .map_err(|source| Error::Io {
                what: "starting the commit thread",
                source,
            })?;
        let mut log = Log {
            shared,
            durability,
            committer: Some(committer),
            opened_format: format,
            read_only: None,
        };
        // The first commit is made here, not by the committer: open reports
        // its failure, and returns with nothing in flight and no kick queued
        // (a queued kick would commit the next caller's batch early).
        let first = commit_pending(&log.shared, &mut log.shared.lead.lock());
        if let Committed::Failed(e) = first {
            if log.shared.db.panicked.load(Ordering::Acquire) {
                return Err(Error::Corrupt(
                    "the storage engine panicked in the first commit".into(),
                ));
            }
            return Err(e);
        }
        log.opened_format = log.format();
        Ok(log)
    }

    fn db(&self) -> Result<MappedRwLockReadGuard<'_, Storage>> {
        RwLockReadGuard::try_map(self.shared.db.store.read(), Option::as_ref)
            .map_err(|_| Error::Closed)
    }

    /// Row `row` of `bucket`'s table as stored, if it is there.
    pub(crate) fn read_row(&self, bucket: u64, row: u64) -> Result<Option<Vec<u8>>> {
        let found = self.db()?.read_row(bucket, row)?;
        // Nothing is deleted from a read-only store: a row asked for is
        // one the index points at, there unless the file changed.
        if found.is_none()
            && let Some(path) = &self.read_only
        {
            return Err(Error::Corrupt(format!(
                "log row {row} of bucket {bucket} is missing from {}: a writer changed the \
                 file under this read-only handle (reopen it), or the file is damaged",
                path.display()
            )));
        }
        Ok(found)
    }

    /// Row `row` of `bucket` as it is or will be stored, whether its
    /// commit is made or not: from the open batch (the records in it so
    /// far; with `close`, the row is closed first, so no record joins it
    /// after this read), from the commit being made, or from the storage.
    /// An answer read from a row whose commit is not durable yet must rest
    /// on it ([`Basis::read`](crate::contract::Basis::read)): the caller
    /// tells it only once the row is durable. `None`: the row has no part
    /// for `bucket` (its table was deleted: expired).
    pub(crate) fn read_row_unsettled(
        &self,
        bucket: u64,
        row: u64,
        close: bool,
    ) -> Result<Option<Vec<u8>>> {
        let s = &*self.shared;
        if !s.ack.is_durable(row) {
            if let InBatch::Here(found) = s.batch.lock().read_row(bucket, row, close) {
                return Ok(found);
            }
            if let Some(f) = &*s.db.flight.lock()
                && f.rows.contains(&row)
            {
                let part = f.parts.iter().find(|p| p.0 == bucket && p.1 == row);
                let found = part.map(|p| p.2.clone());
                // Not from a commit that failed (it poisons before it
                // clears the flight).
                self.check_readable()?;
                return Ok(found);
            }
            // Committed since (the commit cleared the flight only after
            // the storage had it), unless it failed.
            self.check_readable()?;
        }
        let found = self.read_row(bucket, row)?;
        if found.is_none() {
            self.check_readable()?;
        }
        Ok(found)
    }

    /// Calls `each(row, bytes, records)` for every row of `bucket`'s table,
    /// in row order, with the row's stored size and its records; nothing
    /// if the bucket has no table. Commits are not paused meanwhile: the
    /// scan reads the state of the last commit before it began.
    pub(crate) fn scan_bucket(
        &self,
        bucket: u64,
        mut each: impl FnMut(u64, usize, RowReader<'_>) -> Result<()>,
    ) -> Result<()> {
        for row in self.db()?.row_range(bucket, 0..=u64::MAX)? {
            let (n, bytes) = row?;
            each(n, bytes.len(), read_row(&bytes)?)?;
        }
        Ok(())
    }

    /// The file's store format as of the last commit.
    pub(crate) fn format(&self) -> u32 {
        self.shared.tables.format.load(Ordering::Acquire)
    }

    /// The file's store format once the open's first commit was made (an
    /// upgrade at open included, [`upgrade`](Self::upgrade) on the open
    /// log not).
    pub(crate) fn opened_format(&self) -> u32 {
        self.opened_format
    }

    /// Rewrites the file as the newest format in the next commit (format
    /// 5: every bucket table gets its summary) and waits for it. Returns
    /// whether the file was older; from then on a build that knows only
    /// the older format refuses it as `UnsupportedVersion`.
    pub(crate) fn upgrade(&self) -> Result<bool> {
        if self.format() >= FORMAT_VERSION {
            self.check()?;
            return Ok(false);
        }
        self.commit_with(|b| b.also.upgrade_to = Some(FORMAT_VERSION))?;
        Ok(true)
    }

    /// Reads every bucket table as one snapshot and checks each against
    /// the summary stored beside it, and every row against its checksum;
    /// returns the rows read. Only a file of format 5 or later has the
    /// summaries (the caller checks the format).
    pub(crate) fn verify(&self) -> Result<u64> {
        let mut rows = 0;
        for (bucket, table) in self.db()?.tables()? {
            let mut seen = Summary::default();
            for row in table.rows {
                let (n, bytes) = row?;
                for rec in read_row(&bytes)? {
                    rec?;
                }
                seen.add(bucket, n, &bytes);
            }
            summary::check(bucket, table.summary.as_deref(), &seen)?;
            rows += seen.rows;
        }
        Ok(rows)
    }

    /// Bytes of the file in use (the rest is free space), if the storage
    /// can compact.
    pub(crate) fn used_bytes(&self) -> Result<Option<u64>> {
        Ok(self.db()?.used_bytes()?)
    }

    /// Compacts the file: waits for the commit in flight and pauses the
    /// next ones (and reads from disk) until it is done. Returns whether
    /// anything was compacted (never, on a storage that cannot compact).
    pub(crate) fn compact(&self) -> Result<bool> {
        self.check()?;
        let _span = tracing::debug_span!("dedupkv.compact").entered();
        let mut db = self.shared.db.store.write();
        let db = db.as_mut().ok_or(Error::Closed)?;
        Ok(db.compact()?.unwrap_or(false))
    }

    /// The batch to append to. Fails if the log is poisoned.
    pub(crate) fn batch(&self) -> Result<MutexGuard<'_, Batch>> {
        self.check()?;
        Ok(self.shared.batch.lock())
    }

    /// The row appends currently land in: every row a slot points at is at
    /// most this.
    pub(crate) fn open_row(&self) -> u64 {
        self.shared.open_row.load(Ordering::Acquire)
    }

    /// Wakes the committer without waiting for it.
    pub(crate) fn kick(&self) {
        let _ = self.shared.kick.try_send(());
    }

    /// Commits everything appended so far and waits for it.
    pub(crate) fn flush(&self) -> Result<()> {
        self.wait_durable(self.last_row())
    }

    /// The row that holds the newest record appended so far.
    pub(crate) fn last_row(&self) -> u64 {
        let b = self.shared.batch.lock();
        if b.is_empty() { b.row - 1 } else { b.row }
    }

    /// Deletes the tables of `buckets` in the next commit and waits for it.
    pub(crate) fn drop_buckets(&self, buckets: &[u64]) -> Result<()> {
        if buckets.is_empty() {
            return Ok(());
        }
        self.commit_with(|b| b.also.drop_buckets.extend_from_slice(buckets))
    }

    /// Deletes the rows numbered `rows` from the table of `bucket` in the
    /// next commit and waits for it. Eviction deletes a large bucket this
    /// way, a slice per commit, before it deletes the table: redb frees a
    /// deleted table's pages inside one commit, and every writer waits for
    /// that commit. The slice is read first, off the commit path, for the
    /// summary of what it deletes (its rows are committed, and a row is
    /// never rewritten).
    pub(crate) fn trim_bucket(
        &self,
        bucket: u64,
        rows: std::ops::RangeInclusive<u64>,
    ) -> Result<()> {
        let mut gone = Summary::default();
        for row in self.db()?.row_range(bucket, rows.clone())? {
            let (n, bytes) = row?;
            gone.add(bucket, n, &bytes);
        }
        self.commit_with(|b| b.also.trims.push((bucket, rows, gone)))
    }

    /// Adds `change` to the open batch and waits for its commit.
    fn commit_with(&self, change: impl FnOnce(&mut Batch)) -> Result<()> {
        let row = {
            let mut b = self.batch()?;
            change(&mut b);
            b.row
        };
        self.wait_durable(row)
    }

    /// The buckets that have a table on disk, oldest first.
    pub(crate) fn buckets(&self) -> Vec<u64> {
        self.shared.tables.buckets.lock().iter().copied().collect()
    }

    /// Durable commits made since open.
    pub(crate) fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    /// What commits cost since open (totals, and the per-commit observer).
    pub(crate) fn observed(&self) -> &CommitStats {
        &self.shared.observed
    }
}

/// The state the log starts with: the first batch carries the token
/// floor, and the format's implicit (or asked for) upgrade.
fn shared(
    db: Storage,
    found: Found,
    token_floor: u64,
    settings: LogSettings,
    kick: crate::sync::Sender<()>,
) -> Shared {
    let LogSettings {
        durability: _,
        split_at,
        time_step,
        upgrade,
        ship,
    } = settings;
    let Found {
        last_row,
        buckets,
        manifest,
        summaries,
        format,
    } = found;
    let open_row = Arc::new(AtomicU64::new(last_row + 1));
    let mut first = Batch::new(last_row + 1, split_at.min(ROW_SPLIT_BYTES), &open_row);
    first.also.token_floor = Some(token_floor);
    first.also.upgrade_to = if upgrade {
        Some(FORMAT_VERSION)
    } else {
        Some(OLDEST_KEPT_FORMAT)
    }
    .filter(|to| *to > format);
    Shared {
        db: Db {
            store: RwLock::new(Some(db)),
            panicked: AtomicBool::new(false),
            flight: Mutex::new(None),
        },
        batch: Mutex::new(first),
        open_row,
        lead: Mutex::new(Lead::default()),
        kick,
        stop: AtomicBool::new(false),
        ack: Ack::new(last_row, ship.as_ref()),
        tables: Tables {
            buckets: Mutex::new(buckets),
            manifest: Mutex::new(manifest),
            summaries: Mutex::new(summaries),
            format: AtomicU32::new(format),
        },
        writing: Writing { time_step },
        commits: AtomicU64::new(0),
        observed: CommitStats::default(),
        ship,
    }
}

impl Log {
    /// Makes the log read-only once the start of a read-only open is made
    /// (its commits went to memory, never to `path`): stops the committer,
    /// and every later append fails with [`Error::ReadOnly`] naming `path`.
    pub(crate) fn stop_writing(&mut self, path: std::path::PathBuf) {
        self.stop_committer();
        self.read_only = Some(path);
    }

    /// Stops the committer once it has committed what is pending, and
    /// joins it.
    fn stop_committer(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.kick.try_send(());
        if let Some(h) = self.committer.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.stop_committer();
        if let Some(ship) = &self.shared.ship {
            ship.sink.closed();
        }
        let Some(db) = self.shared.db.store.write().take() else {
            return;
        };
        let panicked = self.shared.db.panicked.load(Ordering::Acquire);
        if std::thread::panicking() {
            if panicked {
                // A second panic while unwinding would abort the process.
                std::mem::forget(db);
            }
            return;
        }
        // redb closes without writing after a transaction it unwound from,
        // and otherwise writes its allocator state, which on a damaged file
        // can panic: the panic stays here and the file handle still
        // closes, so the store can be reopened (and its damage reported).
        let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db)));
        if closed.is_err() {
            tracing::error!(
                earlier_panic = panicked,
                "dedupkv: the storage engine panicked while closing the file"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{KeyHasher, KeyHashing};
    use crate::log::{FileMeta, Location, RedbOptions, open_database};

    fn open(path: &std::path::Path) -> Result<(Storage, FileMeta)> {
        let wanted = FileMeta::new(KeyHasher::new(KeyHashing::Xxh3, [7; 16]), 60_000);
        open_database(
            Location::Path(path.to_path_buf()),
            RedbOptions {
                cache_bytes: 1 << 20,
                verify_pages: false,
                quick_repair: false,
                journal: None,
            },
            &wanted,
            false,
            false,
        )
    }

    fn start(db: Storage, meta: &FileMeta) -> Result<Log> {
        Log::start(
            db,
            Found {
                last_row: 0,
                buckets: BTreeSet::new(),
                manifest: meta.manifest.clone(),
                summaries: BTreeMap::new(),
                format: meta.format,
            },
            meta.token_floor,
            LogSettings {
                durability: Durability::Immediate,
                split_at: ROW_SPLIT_BYTES,
                time_step: u64::MAX,
                upgrade: false,
                ship: None,
            },
        )
    }

    #[test]
    fn the_time_floor_persists_its_highest_value() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Storage(e.into()))?;
        let path = dir.path().join("t.redb");
        let (db, meta) = open(&path)?;
        assert_eq!(meta.time_floor, 0, "a new file has none");
        let log = start(db, &meta)?;
        log.batch()?.raise_time_floor(500);
        log.batch()?.raise_time_floor(200);
        log.flush()?;
        log.batch()?.raise_time_floor(300); // lower than the persisted floor
        log.flush()?;
        drop(log);
        let (db, meta) = open(&path)?;
        assert_eq!(meta.time_floor, 500);
        let log = start(db, &meta)?;
        log.batch()?.raise_time_floor(900);
        log.flush()?;
        drop(log);
        assert_eq!(open(&path)?.1.time_floor, 900);
        Ok(())
    }
}
