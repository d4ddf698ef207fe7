//! Group commit: whoever holds the commit lock (a waiting caller that
//! leads, or the committer thread) turns everything appended since the last
//! commit into one storage commit, which syncs once, then wakes every caller
//! of that batch with one call.
//!
//! Invariants:
//! - a record is appended while its key's shard lock is held, so per-key log
//!   order equals decision order; the row it lands in is known at append time;
//! - `durable_row` only grows, and only after `commit()` returned `Ok`: every
//!   row at or below it is on stable storage;
//! - after a failed commit the log is poisoned: nothing in or after the
//!   failed row is ever reported durable, and every later append fails;
//! - commits never overlap (the `lead` lock), and a waiter returns only once
//!   `durable_row` covers its row, whoever committed it;
//! - every bucket table's [`Summary`] is known as of the last commit, and a
//!   commit of a format-5 file writes the summary of every bucket it writes
//!   or trims (of every bucket, when it upgrades the file to format 5);
//! - the file's format changes only in a commit that carries an upgrade:
//!   implicitly from format 1 or 2 to 3 (the open's first commit), and
//!   otherwise only when the operator asks ([`Log::upgrade`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::Storage;
use super::decode::{RowReader, read_row};
use super::durable::{self, Wakers};
use super::format::RowWriter;
use super::meta::{self, FORMAT_VERSION, Manifest, OLDEST_KEPT_FORMAT, SUMMARIES_FORMAT};
use super::record::RecordRef;
use super::ship::{AckTarget, Acks, Ship, Shipped};
use super::store::Commit;
use super::summary::{self, Summary};
use crate::sync::{
    Arc, AtomicBool, AtomicU32, AtomicU64, Futex, JoinHandle, MappedRwLockReadGuard, Mutex,
    MutexGuard, Ordering, Receiver, RwLock, RwLockReadGuard, Sender, bounded,
};
use crate::{Durability, Error, Result};

/// Bytes buffered in `Deferred` mode before a commit is started early.
const DEFERRED_FLUSH_BYTES: usize = 4 << 20;
/// How long the committer waits for stragglers when fewer records are
/// pending than the previous commit carried (Immediate mode only).
const GATHER: Duration = Duration::from_micros(500);

/// A row is closed and the next one opened once it holds this many bytes,
/// so no row reaches redb's limit for one value (3 GiB), however many
/// callers share a commit: a row is at most this plus one record.
pub(crate) const ROW_SPLIT_BYTES: usize = 256 << 20;
const _: () = assert!(
    ROW_SPLIT_BYTES + super::record::FORMAT_MAX_RECORD < 3 << 30,
    "a row could pass redb's value limit"
);

/// Records appended since the last commit: rows `first_row..=row`, all
/// but the last closed (see [`ROW_SPLIT_BYTES`]); new records go to `row`.
pub(crate) struct Batch {
    row: u64,
    /// The first row of this batch (`row` unless a row was closed).
    first_row: u64,
    /// Bytes in the parts of `row`.
    row_bytes: usize,
    /// Close `row` once it holds this many bytes (`ROW_SPLIT_BYTES`, less
    /// in tests).
    split_at: usize,
    /// Closed rows, each with its parts per bucket.
    closed: Vec<(u64, Vec<(u64, RowWriter)>)>,
    /// Mirror of `row`, readable without the batch lock.
    open_row: Arc<AtomicU64>,
    /// Records in the batch (the next record's `idx`).
    next_idx: u32,
    /// Of them, records that ride with a caller's own record (a tally, an
    /// intent): group commit counts callers' records, not these.
    extras: u32,
    bytes: usize,
    parts: Vec<(u64, RowWriter)>,
    /// Bucket tables to delete in this commit, before its rows are written.
    drop_buckets: Vec<u64>,
    /// Log rows to delete from a bucket's table in this commit: a range
    /// of row numbers, and the summary of the rows in it (see
    /// [`Log::trim_bucket`]).
    trims: Vec<(u64, std::ops::RangeInclusive<u64>, Summary)>,
    /// Rewrite the file as this format in this commit (see
    /// [`Log::upgrade`]).
    upgrade_to: Option<u32>,
    /// A new fencing-token floor to persist with this commit.
    token_floor: Option<u64>,
    /// A new time floor (a clock reading, ms) to persist with this commit.
    time_floor: Option<u64>,
    /// The latest `at` of the batch's records: the commit persists it as
    /// the time floor once it passes the persisted one by `time_step`.
    max_at: u64,
    /// Commit even if nothing else is in the batch (a replica wants a
    /// view of the store, which it takes in a commit).
    touched: bool,
}

impl Batch {
    /// An empty batch whose records go to `row`.
    fn new(row: u64, split_at: usize, open_row: &Arc<AtomicU64>) -> Batch {
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
            drop_buckets: Vec::new(),
            trims: Vec::new(),
            upgrade_to: None,
            token_floor: None,
            time_floor: None,
            max_at: 0,
            touched: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.parts.is_empty()
            && self.closed.is_empty()
            && self.drop_buckets.is_empty()
            && self.trims.is_empty()
            && self.upgrade_to.is_none()
            && self.token_floor.is_none()
            && self.time_floor.is_none()
            && !self.touched
    }

    /// Persists `floor` as the lowest token a reopened store may issue,
    /// in this commit.
    pub(crate) fn raise_token_floor(&mut self, floor: u64) {
        self.token_floor = Some(self.token_floor.map_or(floor, |f| f.max(floor)));
    }

    /// Persists `ms` as the lowest clock reading the store may trust after
    /// a reopen (the persisted floor becomes the larger of the old one and
    /// `ms`), in this commit. Read back at open as
    /// [`FileMeta::time_floor`](super::FileMeta::time_floor).
    #[cfg(test)]
    pub(crate) fn raise_time_floor(&mut self, ms: u64) {
        self.time_floor = Some(self.time_floor.map_or(ms, |f| f.max(ms)));
    }

    /// [`push`](Self::push) of a record that rides with the caller's own
    /// (a tally with a completion, an intent with a claim): the same bytes,
    /// but not counted as a caller's record by group commit.
    pub(crate) fn push_extra(&mut self, bucket: u64, rec: &mut RecordRef<'_>) -> u64 {
        self.extras += 1;
        self.push(bucket, rec)
    }

    /// The callers' records in the batch (all but the extras).
    fn own_records(&self) -> u32 {
        self.next_idx - self.extras
    }

    /// Appends a record to the part for `bucket`; returns the row number.
    /// The caller holds the key's shard lock.
    pub(crate) fn push(&mut self, bucket: u64, rec: &mut RecordRef<'_>) -> u64 {
        if self.row_bytes >= self.split_at {
            let parts = std::mem::take(&mut self.parts);
            self.closed.push((self.row, parts));
            self.row += 1;
            self.row_bytes = 0;
            self.open_row.store(self.row, Ordering::Release);
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

/// Held by whoever commits (the committer thread or a leading caller),
/// with what the previous commit carried.
#[derive(Default)]
struct Lead {
    /// Callers' records in the previous commit (extras not counted).
    last_records: u32,
    /// Callers that waited for the previous commit's row.
    last_callers: u32,
}

struct Shared {
    /// Read-locked by every transaction; write-locked only by compaction,
    /// which needs the database to itself.
    db: RwLock<Option<Storage>>,
    /// The storage engine panicked in a commit: its `Drop` may panic too,
    /// so the database is closed under `catch_unwind` (or leaked, when the
    /// log is dropped while a panic unwinds).
    panicked: AtomicBool,
    batch: Mutex<Batch>,
    /// Why the log is poisoned (set with `poisoned`).
    poison: Mutex<Option<String>>,
    /// The commit lock; see [`Lead`].
    lead: Mutex<Lead>,
    poisoned: AtomicBool,
    stop: AtomicBool,
    kick: Sender<()>,
    commits: AtomicU64,
    /// Mirror of `batch.row`, readable without the batch lock (the batch
    /// moves it when it closes a row).
    open_row: Arc<AtomicU64>,
    /// The newest durable row.
    durable_row: AtomicU64,
    /// Callers of row `r` sleep on `woke[r % 2]`, and the commit of row `r`
    /// wakes them all in one call. Only two rows can have callers waiting
    /// (the one being committed and the open one: a row opens only when
    /// the one before it is taken for commit, and commits never overlap),
    /// so a commit wakes its own callers and nobody else.
    woke: [Futex; 2],
    /// Callers that waited for row `r`, counted in `callers[r % 2]` and
    /// reset by its commit; read by [`Log::lead_or_kick`]. A caller that
    /// counts itself just after its row was committed is counted in row
    /// `r + 2` instead: the count only steers who commits, never what is
    /// acknowledged.
    callers: [AtomicU32; 2],
    quick_repair: bool,
    /// See [`LogSettings::time_step`].
    time_step: u64,
    /// Buckets that have a table on disk (as of the last commit).
    buckets: Mutex<BTreeSet<u64>>,
    /// The manifest as of the last commit (every bucket table, expired
    /// ones included, and the floors); only `write` takes it.
    manifest: Mutex<Manifest>,
    /// Async callers awaiting a row (see `durable.rs`).
    wakers: Wakers,
    /// Async callers awaiting a row's upload to an asynchronous replica
    /// ([`Log::poll_kept`]); woken by [`AckTarget::replicated`].
    kept_wakers: Wakers,
    /// What commits cost (see `observe.rs`).
    observed: super::observe::CommitStats,
    /// The replica (`log::ship`), handed every durable commit; `None`
    /// without one.
    ship: Option<Ship>,
    /// With a synchronous replica: the newest row in the replica, which
    /// callers wait for instead of `durable_row` (a shipped row is one
    /// whose commit returned `Ok`, so it is durable even before
    /// `durable_row` says so).
    replicated_row: AtomicU64,
    /// The poison is the replica's fencing ([`Error::Fenced`]).
    fenced: AtomicBool,
    /// Every bucket table's summary as of the last commit, whatever the
    /// file's format; only `write` takes it (after `manifest`).
    summaries: Mutex<BTreeMap<u64, Summary>>,
    /// The file's store format as of the last commit.
    format: AtomicU32,
    /// Told once the log is poisoned (a failed commit, or the replica's
    /// fence), after `poisoned` is set: the engine wakes every caller
    /// waiting for a key's in-flight result, whose next `begin` then
    /// answers the poison.
    on_poison: std::sync::OnceLock<PoisonHook>,
}

/// See [`Log::on_poison`].
pub(crate) type PoisonHook = Box<dyn Fn() + Send + Sync>;

impl Shared {
    /// The row callers are acknowledged up to: the durable row, or with a
    /// synchronous replica the replicated one.
    #[inline]
    fn acked_row(&self) -> u64 {
        match &self.ship {
            Some(ship) if ship.synchronous => self.replicated_row.load(Ordering::Acquire),
            _ => self.durable_row.load(Ordering::Acquire),
        }
    }
}

impl AckTarget for Shared {
    fn replicated(&self, row: u64) {
        // Only rows whose commit returned `Ok` are shipped, so `row` is on
        // stable storage, though `durable_row` may not say so yet.
        if self.replicated_row.fetch_max(row, Ordering::AcqRel) < row {
            for w in &self.woke {
                w.wake_all();
            }
            // Async callers wait for the acknowledged row (the durable
            // one, without a synchronous replica), kept ones for this.
            self.wakers.wake_through(self.acked_row());
            self.kept_wakers.wake_through(row);
        }
    }

    fn commit_soon(&self) {
        self.batch.lock().touched = true;
        let _ = self.kick.try_send(());
    }

    fn fence(&self, why: String) {
        {
            let mut p = self.poison.lock();
            if p.is_none() {
                *p = Some(why);
            }
        }
        self.fenced.store(true, Ordering::Release);
        self.poisoned.store(true, Ordering::Release);
        self.poisoned_now();
    }
}

impl Shared {
    /// Wakes everyone waiting on the log (the log was just poisoned), and
    /// tells the hook.
    fn poisoned_now(&self) {
        for w in &self.woke {
            w.wake_all();
        }
        self.wakers.wake_all();
        self.kept_wakers.wake_all();
        if let Some(hook) = self.on_poison.get() {
            hook();
        }
    }
}

/// How the log commits.
#[derive(Clone)]
pub(crate) struct LogSettings {
    pub durability: Durability,
    /// redb's quick repair: one more sync per commit, fast reopen.
    pub quick_repair: bool,
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
    shared: Arc<Shared>,
    durability: Durability,
    committer: Option<JoinHandle<()>>,
    /// The file's format once the open's first commit was made.
    opened_format: u32,
    /// Set once the log of a read-only open has made its start (in
    /// memory): the file, named by every refused append.
    read_only: Option<std::path::PathBuf>,
}

/// A poisoned log reports why.
fn poisoned_error(s: &Shared) -> Error {
    let why = s.poison.lock().clone().unwrap_or_else(|| "unknown".into());
    if s.fenced.load(Ordering::Acquire) {
        return Error::Fenced(why);
    }
    Error::Poisoned(why)
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
        let LogSettings {
            durability,
            quick_repair,
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
        let replicated = match &ship {
            Some(s) if s.behind => 0,
            _ => last_row,
        };
        let (kick, kicked) = bounded(1);
        let open_row = Arc::new(AtomicU64::new(last_row + 1));
        let mut first = Batch::new(last_row + 1, split_at.min(ROW_SPLIT_BYTES), &open_row);
        first.token_floor = Some(token_floor);
        first.upgrade_to = if upgrade {
            Some(FORMAT_VERSION)
        } else {
            Some(OLDEST_KEPT_FORMAT)
        }
        .filter(|to| *to > format);
        let shared = Arc::new(Shared {
            db: RwLock::new(Some(db)),
            panicked: AtomicBool::new(false),
            batch: Mutex::new(first),
            poison: Mutex::new(None),
            woke: Default::default(),
            callers: Default::default(),
            lead: Mutex::new(Lead::default()),
            poisoned: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            kick,
            commits: AtomicU64::new(0),
            open_row,
            durable_row: AtomicU64::new(last_row),
            quick_repair,
            time_step,
            buckets: Mutex::new(buckets),
            manifest: Mutex::new(manifest),
            wakers: Wakers::default(),
            kept_wakers: Wakers::default(),
            observed: super::observe::CommitStats::default(),
            ship,
            replicated_row: AtomicU64::new(replicated),
            fenced: AtomicBool::new(false),
            summaries: Mutex::new(summaries),
            format: AtomicU32::new(format),
            on_poison: std::sync::OnceLock::new(),
        });
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
            if log.shared.panicked.load(Ordering::Acquire) {
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
        RwLockReadGuard::try_map(self.shared.db.read(), Option::as_ref).map_err(|_| Error::Closed)
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

    /// Calls `each(row, bytes, records)` for every row of `bucket`'s table,
    /// in row order, with the row's stored size and its records; nothing
    /// if the bucket has no table. Commits are not paused meanwhile: the
    /// scan reads the state of the last commit before it began.
    pub(crate) fn scan_bucket(
        &self,
        bucket: u64,
        mut each: impl FnMut(u64, usize, RowReader<'_>) -> Result<()>,
    ) -> Result<()> {
        let Some(table) = self.db()?.table(bucket)? else {
            return Ok(());
        };
        for row in table.rows {
            let (n, bytes) = row?;
            each(n, bytes.len(), read_row(&bytes)?)?;
        }
        Ok(())
    }

    /// The file's store format as of the last commit.
    pub(crate) fn format(&self) -> u32 {
        self.shared.format.load(Ordering::Acquire)
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
        self.commit_with(|b| b.upgrade_to = Some(FORMAT_VERSION))?;
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

    /// Bytes of the file in use (the rest is free space).
    pub(crate) fn used_bytes(&self) -> Result<u64> {
        Ok(self.db()?.used_bytes()?)
    }

    /// Compacts the file: waits for the commit in flight and pauses the
    /// next ones (and reads from disk) until it is done. Returns whether
    /// anything was compacted.
    pub(crate) fn compact(&self) -> Result<bool> {
        self.check()?;
        let _span = tracing::debug_span!("dedupkv.compact").entered();
        let mut db = self.shared.db.write();
        let db = db.as_mut().ok_or(Error::Closed)?;
        Ok(db.compact()?)
    }

    /// The batch to append to. Fails if the log is poisoned.
    pub(crate) fn batch(&self) -> Result<MutexGuard<'_, Batch>> {
        self.check()?;
        durable::note_append();
        Ok(self.shared.batch.lock())
    }

    /// Sets what the log tells once it is poisoned (once; a second hook
    /// is ignored). A poison before the hook is set is not told: whoever
    /// sets it checks the log afterwards.
    pub(crate) fn on_poison(&self, hook: PoisonHook) {
        let _ = self.shared.on_poison.set(hook);
    }

    /// Fails if an earlier commit failed, or if the log is read-only:
    /// what every append checks first.
    pub(crate) fn check(&self) -> Result<()> {
        self.check_readable()?;
        if let Some(path) = &self.read_only {
            return Err(Error::ReadOnly { path: path.clone() });
        }
        Ok(())
    }

    /// Fails if an earlier commit failed: what every read checks first.
    pub(crate) fn check_readable(&self) -> Result<()> {
        if self.shared.poisoned.load(Ordering::Acquire) {
            return Err(poisoned_error(&self.shared));
        }
        Ok(())
    }

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

    /// The row appends currently land in: every row a slot points at is at
    /// most this.
    pub(crate) fn open_row(&self) -> u64 {
        self.shared.open_row.load(Ordering::Acquire)
    }

    /// Wakes the committer without waiting for it.
    pub(crate) fn kick(&self) {
        let _ = self.shared.kick.try_send(());
    }

    /// Makes `row` durable as the durability mode requires: in `Immediate`
    /// mode waits for its commit; in `Deferred` mode only nudges the
    /// committer when enough is buffered.
    pub(crate) fn settle(&self, row: u64) -> Result<()> {
        match self.durability {
            Durability::Immediate => self.wait_answer(row),
            Durability::Deferred { .. } => {
                if self.shared.batch.lock().bytes >= DEFERRED_FLUSH_BYTES {
                    let _ = self.shared.kick.try_send(());
                }
                self.check()
            }
        }
    }

    /// Returns once `row` is durable, whatever the mode.
    ///
    /// `row` must exist (at most the open row, read after the record it
    /// stands for was appended): a wait for a row that is never committed
    /// would never return. Should a caller ever get that wrong, the wait is
    /// for the newest row instead (every record is in it or before it),
    /// and debug builds stop at the mistake.
    pub(crate) fn wait_durable(&self, row: u64) -> Result<()> {
        let s = &*self.shared;
        if s.acked_row() >= row {
            return Ok(());
        }
        let row = if row > s.open_row.load(Ordering::Acquire) {
            debug_assert!(false, "a wait for log row {row}, which does not exist");
            let b = s.batch.lock();
            if b.is_empty() { b.row - 1 } else { b.row }
        } else {
            row
        };
        if s.acked_row() >= row {
            return Ok(());
        }
        let parity = (row % 2) as usize;
        s.callers[parity].fetch_add(1, Ordering::Relaxed);
        self.lead_or_kick();
        // The committer publishes `durable_row` (or `poisoned`) before it
        // changes the word it wakes through, and the word is read here
        // before the check: a commit after the check has changed the word,
        // so the wait returns at once instead of missing the wake-up.
        loop {
            let seen = s.woke[parity].load();
            if s.acked_row() >= row {
                return Ok(());
            }
            if s.poisoned.load(Ordering::Acquire) {
                return Err(poisoned_error(s));
            }
            s.woke[parity].wait(seen);
        }
    }

    /// Commits the open batch on this thread if nobody is committing, the
    /// previous commit woke at most one waiting caller, and the batch
    /// already holds as many records as that commit: a lone caller (an
    /// `insert_batch` loop, a single thread) thus skips the two thread
    /// hand-offs through the committer thread. Otherwise wakes the
    /// committer, which waits briefly for stragglers ([`gather`]) first:
    /// callers woken together by a commit fill the next one fuller that way
    /// than if the first of them to be ready committed at once.
    fn lead_or_kick(&self) {
        let s = &*self.shared;
        if self.durability == Durability::Immediate
            && let Some(mut lead) = s.lead.try_lock()
            && lead.last_callers <= 1
        {
            // Its own statement: no batch guard outlives the count.
            let pending = s.batch.lock().own_records();
            if pending >= lead.last_records {
                commit_pending(s, &mut lead);
                return;
            }
        }
        let _ = s.kick.try_send(());
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
        self.commit_with(|b| b.drop_buckets.extend_from_slice(buckets))
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
        self.commit_with(|b| b.trims.push((bucket, rows, gone)))
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
        self.shared.buckets.lock().iter().copied().collect()
    }

    /// Durable commits made since open.
    pub(crate) fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }
}

// Awaitable durability (see `durable.rs`): the deferring scope's hooks
// and the async wait. Blocking callers never reach past a thread-local read.
impl Log {
    /// Waits until `row` is durable, as an answer resting on it requires;
    /// inside a deferring scope, notes it for the caller to await instead.
    pub(crate) fn wait_answer(&self, row: u64) -> Result<()> {
        if durable::defer_answer(row) {
            return Ok(());
        }
        self.wait_durable(row)
    }

    /// Waits until `row` is durable, so it can be read. Inside a deferring
    /// scope that may run its call again and has recorded nothing, fails
    /// with `WouldBlock` instead, the row noted for the caller to await.
    pub(crate) fn wait_readable(&self, row: u64) -> Result<()> {
        if self.shared.durable_row.load(Ordering::Acquire) >= row {
            return Ok(());
        }
        if durable::defer_read(row) {
            return Err(Error::Io {
                what: "reading a log row before its commit",
                source: std::io::ErrorKind::WouldBlock.into(),
            });
        }
        self.wait_durable(row)
    }

    #[cfg(feature = "async")]
    /// Polls for `row` to be durable without blocking: registers the
    /// task's waker in `slot` (kept by the caller's future, and passed to
    /// [`Log::stop_waiting`] when it is dropped) and wakes the committer.
    /// The committer, not this thread, commits: a commit syncs the disk.
    pub(crate) fn poll_durable(
        &self,
        row: u64,
        slot: &mut Option<Arc<durable::Waiting>>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<()>> {
        let s = &*self.shared;
        // Answers rest on the acknowledged row (with a synchronous
        // replica, the replicated one): the committer and the replica wake
        // the waker list through it.
        self.poll_row((row, slot, cx), &s.wakers, || s.acked_row() >= row, || {})
    }

    #[cfg(feature = "async")]
    /// The body of the polls: `Ready` once `reached()` (or the log is
    /// poisoned), else the task's waker registered in `list` under `row`
    /// (the first time also kicking the committer and `on_first`).
    fn poll_row(
        &self,
        (row, slot, cx): (
            u64,
            &mut Option<Arc<durable::Waiting>>,
            &mut std::task::Context<'_>,
        ),
        list: &Wakers,
        reached: impl Fn() -> bool,
        on_first: impl FnOnce(),
    ) -> std::task::Poll<Result<()>> {
        use std::task::Poll;
        let s = &*self.shared;
        let ready = || {
            if reached() {
                return Some(Ok(()));
            }
            if s.poisoned.load(Ordering::Acquire) {
                return Some(Err(poisoned_error(s)));
            }
            None
        };
        if let Some(r) = ready() {
            return Poll::Ready(r);
        }
        let first = slot.is_none();
        list.register(slot, row, cx.waker());
        if first {
            self.kick();
            on_first();
        }
        match ready() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }

    /// What commits cost since open (totals, and the per-commit observer).
    pub(crate) fn observed(&self) -> &super::observe::CommitStats {
        &self.shared.observed
    }

    /// Forgets the waker of a future that stopped waiting.
    #[cfg(feature = "async")]
    pub(crate) fn stop_waiting(&self, slot: &Arc<durable::Waiting>) {
        self.shared.wakers.remove(slot);
    }
}

// Rows kept for the store's next owner (see `Claim::provider_key`): the
// replica's copy with one, the durable file without.
impl Log {
    /// An asynchronous replica, if the log ships to one.
    fn async_ship(&self) -> Option<&Ship> {
        self.shared.ship.as_ref().filter(|s| !s.synchronous)
    }

    /// Whether `row` is where the store's next owner reads: in the
    /// replica (either mode), or without one, durable.
    pub(crate) fn is_kept(&self, row: u64) -> bool {
        let s = &*self.shared;
        let kept = if s.ship.is_some() {
            &s.replicated_row
        } else {
            &s.durable_row
        };
        kept.load(Ordering::Acquire) >= row
    }

    /// Returns once `row` [is kept](Self::is_kept). An asynchronous
    /// replica is asked to ship it now instead of at its segment interval;
    /// while its uploads fail this waits (the uploader retries). Fails
    /// once the log is poisoned or fenced, unless the row was kept first.
    pub(crate) fn wait_kept(&self, row: u64) -> Result<()> {
        let s = &*self.shared;
        let Some(ship) = self.async_ship() else {
            // Acknowledged is kept: the durable row, or with a
            // synchronous replica the replicated one.
            return self.wait_durable(row);
        };
        if self.is_kept(row) {
            return Ok(());
        }
        self.check()?;
        // Committed (at once under `Deferred`), then shipped at once.
        self.kick();
        ship.sink.hurry(row);
        // `replicated` and a poisoning change both words before they wake.
        let parity = (row % 2) as usize;
        loop {
            let seen = s.woke[parity].load();
            if self.is_kept(row) {
                return Ok(());
            }
            if s.poisoned.load(Ordering::Acquire) {
                return Err(poisoned_error(s));
            }
            s.woke[parity].wait(seen);
        }
    }

    #[cfg(feature = "async")]
    /// [`wait_kept`](Self::wait_kept) as a poll, its waker kept in `slot`
    /// as [`Log::poll_durable`] does (passed to [`Log::stop_waiting_kept`]
    /// when the caller's future is dropped).
    pub(crate) fn poll_kept(
        &self,
        row: u64,
        slot: &mut Option<Arc<durable::Waiting>>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<()>> {
        let Some(ship) = self.async_ship() else {
            return self.poll_durable(row, slot, cx);
        };
        self.poll_row(
            (row, slot, cx),
            &self.shared.kept_wakers,
            || self.is_kept(row),
            || ship.sink.hurry(row),
        )
    }

    /// Forgets the waker of a [`poll_kept`](Self::poll_kept) future that
    /// stopped waiting.
    #[cfg(feature = "async")]
    pub(crate) fn stop_waiting_kept(&self, slot: &Arc<durable::Waiting>) {
        if self.async_ship().is_some() {
            self.shared.kept_wakers.remove(slot);
        } else {
            self.shared.wakers.remove(slot);
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.stop_committer();
        if let Some(ship) = &self.shared.ship {
            ship.sink.closed();
        }
        let Some(db) = self.shared.db.write().take() else {
            return;
        };
        let panicked = self.shared.panicked.load(Ordering::Acquire);
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

/// The committer loop: commits what callers left for it (in `Immediate`
/// mode, batches whose callers did not commit them themselves; in
/// `Deferred` mode, everything, at least every `max_delay`).
fn run(s: &Shared, kicked: &Receiver<()>, wait: Option<Duration>) {
    loop {
        let stopping = s.stop.load(Ordering::Acquire);
        if !stopping {
            match wait {
                None => {
                    let _ = kicked.recv();
                }
                Some(d) => {
                    let _ = kicked.recv_timeout(d);
                }
            }
        }
        if wait.is_none() && !stopping {
            let last = s.lead.lock().last_records;
            gather(s, kicked, last);
        }
        match commit_pending(s, &mut s.lead.lock()) {
            Committed::Nothing if stopping => return,
            Committed::Nothing | Committed::Row => {}
            Committed::Failed(_) => return,
        }
    }
}

/// What [`commit_pending`] did.
enum Committed {
    Nothing,
    Row,
    /// The commit failed (or an earlier one had) and the log is poisoned.
    Failed(Error),
}

/// Commits the open batch, if it has anything, then wakes its callers.
/// The caller holds the commit lock (`lead`), so commits never overlap.
fn commit_pending(s: &Shared, lead: &mut Lead) -> Committed {
    if s.poisoned.load(Ordering::Acquire) {
        return Committed::Failed(poisoned_error(s));
    }
    let batch = {
        let mut b = s.batch.lock();
        if b.is_empty() {
            return Committed::Nothing;
        }
        let mut next = Batch::new(b.row + 1, b.split_at, &s.open_row);
        next.parts.reserve(b.parts.len());
        s.open_row.store(next.row, Ordering::Release);
        std::mem::replace(&mut *b, next)
    };
    let (first_row, row) = (batch.first_row, batch.row);
    lead.last_records = batch.own_records();
    let span = tracing::trace_span!(
        "dedupkv.commit",
        row,
        records = batch.own_records(),
        bytes = batch.bytes
    );
    let _entered = span.enter();
    let started = std::time::Instant::now();
    let dropped = batch.drop_buckets.clone();
    let written: Vec<u64> = batch
        .closed
        .iter()
        .flat_map(|(_, parts)| parts)
        .chain(&batch.parts)
        .map(|(b, _)| *b)
        .collect();
    // A panic inside the storage engine must poison the store, not leave
    // every waiter blocked forever.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(s, batch)))
        .unwrap_or_else(|_| {
            s.panicked.store(true, Ordering::Release);
            Err(Error::Storage(
                std::io::Error::other("the storage engine panicked during a commit").into(),
            ))
        });
    match outcome {
        Ok(()) => {
            {
                let mut set = s.buckets.lock();
                for b in &dropped {
                    set.remove(b);
                }
                set.extend(written);
            }
            s.commits.fetch_add(1, Ordering::Relaxed);
            s.observed
                .committed(started.elapsed(), u64::from(lead.last_records));
            s.durable_row.store(row, Ordering::Release);
            let parity = (row % 2) as usize;
            lead.last_callers = s.callers[parity].swap(0, Ordering::Relaxed);
            s.woke[parity].wake_all();
            if first_row < row {
                // A batch of several rows has callers of both parities (and
                // may wake some of the open row early: they wait again).
                let other = 1 - parity;
                lead.last_callers += s.callers[other].swap(0, Ordering::Relaxed);
                s.woke[other].wake_all();
            }
            s.wakers.wake_through(s.acked_row());
            Committed::Row
        }
        Err(e) => {
            tracing::error!(row, error = %e, "dedupkv commit failed; store poisoned");
            *s.poison.lock() = Some(format!("commit of log row {row} failed: {e}"));
            s.poisoned.store(true, Ordering::Release);
            s.poisoned_now();
            Committed::Failed(e)
        }
    }
}

/// Adaptive group commit: callers woken by the previous commit are still
/// appending their next records when the committer wakes. If fewer records
/// are pending than the last commit carried, wait for their kicks (at most
/// [`GATHER`] in all) so they land in this commit instead of costing one of
/// their own. A lone caller (last commit of one record) never waits.
///
/// Under `cfg(dedupkv_loom)` it never waits either: loom has no wall time,
/// and gathering only decides which commit a record joins, never what is
/// acknowledged; loom's own scheduling already tries the committer taking
/// the batch early and late.
fn gather(s: &Shared, kicked: &Receiver<()>, last_records: u32) {
    if last_records <= 1 || cfg!(dedupkv_loom) {
        return;
    }
    // Every waiting caller kicks after appending; sleep between kicks
    // rather than spin, so the callers have the processors to themselves.
    let deadline = std::time::Instant::now() + GATHER;
    while s.batch.lock().own_records() < last_records {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || kicked.recv_timeout(left).is_err() {
            break;
        }
    }
}

/// One storage commit for the batch. The manifest is rewritten in it
/// whenever the batch creates or deletes a bucket table or raises a floor,
/// so the file's tables are the manifest's after every commit; in a
/// format-5 file, so is the summary of every bucket the batch writes or
/// trims.
fn write(s: &Shared, batch: Batch) -> Result<()> {
    let db = s.db.read();
    let db = db.as_ref().ok_or(Error::Closed)?;
    let mut manifest = s.manifest.lock();
    let mut summaries = s.summaries.lock();
    let format = s.format.load(Ordering::Acquire);
    let upgrade = batch.upgrade_to.filter(|to| *to > format);
    let mut next = manifest.clone();
    if let Some(floor) = batch.token_floor {
        next.token_floor = next.token_floor.max(floor);
    }
    if let Some(floor) = batch.time_floor {
        next.time_floor = next.time_floor.max(floor);
    }
    if batch.max_at >= next.time_floor.saturating_add(s.time_step) {
        next.time_floor = batch.max_at;
    }
    // The summaries this commit changes; `None`: the table is deleted.
    let mut changed: BTreeMap<u64, Option<Summary>> = BTreeMap::new();
    // Deletions first: a bucket dropped and written in one commit keeps the
    // new rows.
    for bucket in &batch.drop_buckets {
        next.buckets.remove(bucket);
        changed.insert(*bucket, None);
    }
    let mut trims = Vec::with_capacity(batch.trims.len());
    for (bucket, rows, gone) in batch.trims {
        // Trimming would create a table deleted in this commit.
        if batch.drop_buckets.contains(&bucket) {
            continue;
        }
        trims.push((bucket, rows));
        next.buckets.insert(bucket);
        changed
            .entry(bucket)
            .or_insert_with(|| summaries.get(&bucket).copied())
            .get_or_insert_default()
            .remove(&gone);
    }
    let mut rows = Vec::with_capacity(batch.parts.len());
    let last = (batch.row, batch.parts);
    for (row, parts) in batch.closed.into_iter().chain(std::iter::once(last)) {
        for (bucket, part) in parts {
            let bytes = part.finish();
            changed
                .entry(bucket)
                .or_insert_with(|| summaries.get(&bucket).copied())
                .get_or_insert_default()
                .add(bucket, row, &bytes);
            rows.push((bucket, row, bytes));
            next.buckets.insert(bucket);
        }
    }
    let stored = summaries_to_store(format, upgrade, &next.buckets, &changed, &summaries);
    let meta = match upgrade {
        Some(to) => meta::upgrade_changes(&**db, &next, to)?,
        None if next != *manifest => vec![meta::manifest_change(&next)],
        None => Vec::new(),
    };
    let commit = Commit {
        quick_repair: s.quick_repair,
        drop_buckets: &batch.drop_buckets,
        trims,
        rows,
        summaries: stored,
        meta,
        raw_meta: Vec::new(),
    };
    // The replica's copy (`log::ship`): only when there is one.
    let shipped = s.ship.as_ref().map(|_| Shipped::of(batch.row, &commit));
    db.commit(commit)?;
    *manifest = next;
    for (b, sum) in changed {
        match sum {
            Some(sum) => summaries.insert(b, sum),
            None => summaries.remove(&b),
        };
    }
    if let Some(to) = upgrade {
        s.format.store(to, Ordering::Release);
    }
    if let (Some(ship), Some(shipped)) = (&s.ship, shipped) {
        ship.sink.shipped(shipped, &**db);
    }
    Ok(())
}

/// The summaries a commit writes: those of the tables it changes, or with
/// an upgrade to the summaries' format, every table's; none below it.
fn summaries_to_store(
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
    use crate::key::{KeyHasher, KeyHashing};
    use crate::log::{FileMeta, Location, open_database};

    fn open(path: &std::path::Path) -> Result<(Storage, FileMeta)> {
        let wanted = FileMeta::new(KeyHasher::new(KeyHashing::Xxh3, [7; 16]), 60_000);
        open_database(
            Location::Path(path.to_path_buf()),
            (1 << 20, false),
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
                quick_repair: false,
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
