//! Group commit: whoever holds the commit lock (a waiting caller that
//! leads, or the committer thread) turns everything appended since the last
//! commit into one storage commit, which syncs once, then wakes every caller
//! of that batch with one call (through `ack.rs`, which decides what
//! callers are told).
//!
//! Invariants:
//! - commits never overlap (the `lead` lock), and each takes the whole
//!   open batch, leaving an empty one whose rows follow it;
//! - a commit is published (the durable row, its callers woken) only after
//!   the storage commit returned `Ok`; after a failed commit the log is
//!   poisoned: nothing in or after the failed row is ever reported
//!   durable, and every later append fails;
//! - every bucket table's [`Summary`] is known as of the last commit, and a
//!   commit of a format-5 file writes the summary of every bucket it writes
//!   or trims (of every bucket, when it upgrades the file to format 5);
//! - the file's format changes only in a commit that carries an upgrade:
//!   implicitly from format 1 or 2 to 3 (the open's first commit), and
//!   otherwise only when the operator asks ([`Log::upgrade`](super::Log::upgrade));
//! - a replica is handed each durable commit, in commit order, before the
//!   commit's callers are woken.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::ack::Ack;
use super::batch::Batch;
use super::meta::{self, Manifest};
use super::observe::CommitStats;
use super::ship::{AckTarget, Ship, Shipped};
use super::store::Commit;
use super::summary::{Summary, summaries_to_store};
use super::{Log, Storage};
use crate::Durability;
use crate::sync::{
    Arc, AtomicBool, AtomicU32, AtomicU64, Mutex, Ordering, Receiver, RwLock, Sender,
};
use crate::{Error, Result};

/// How long the committer waits for stragglers when fewer records are
/// pending than the previous commit carried (Immediate mode only).
const GATHER: Duration = Duration::from_micros(500);

/// Held by whoever commits (the committer thread or a leading caller),
/// with what the previous commit carried.
#[derive(Default)]
pub(super) struct Lead {
    /// Callers' records in the previous commit (extras not counted).
    pub(super) last_records: u32,
    /// Callers that waited for the previous commit's row.
    pub(super) last_callers: u32,
}

/// The storage, as the committer and the readers share it.
pub(super) struct Db {
    /// Read-locked by every transaction; write-locked only by compaction,
    /// which needs the database to itself.
    pub(super) store: RwLock<Option<Storage>>,
    /// The storage engine panicked in a commit: its `Drop` may panic too,
    /// so the database is closed under `catch_unwind` (or leaked, when the
    /// log is dropped while a panic unwinds).
    pub(super) panicked: AtomicBool,
    /// The rows of the commit being made, until the storage holds them
    /// (taken before the batch's lock by the committer; readers never
    /// hold both).
    pub(super) flight: Mutex<Option<Flight>>,
}

/// The file's tables as of the last commit; only a commit changes them.
pub(super) struct Tables {
    /// Buckets that have a table on disk.
    pub(super) buckets: Mutex<BTreeSet<u64>>,
    /// The manifest (every bucket table, expired ones included, and the
    /// floors); only `write` takes it.
    pub(super) manifest: Mutex<Manifest>,
    /// Every bucket table's summary, whatever the file's format; only
    /// `write` takes it (after `manifest`).
    pub(super) summaries: Mutex<BTreeMap<u64, Summary>>,
    /// The file's store format.
    pub(super) format: AtomicU32,
}

/// How the committer writes.
pub(super) struct Writing {
    /// See [`LogSettings::time_step`](super::LogSettings::time_step).
    pub(super) time_step: u64,
}

/// The rows of the commit being made, sealed, from when it took the
/// batch until the storage holds them: a read of one of them meanwhile
/// is answered from here (see `Log::read_row_unsettled`).
pub(super) struct Flight {
    pub(super) rows: std::ops::RangeInclusive<u64>,
    /// (bucket, row, sealed bytes), as written.
    pub(super) parts: Vec<(u64, u64, Vec<u8>)>,
}

/// What the log's callers, its committer and its replica share.
pub(super) struct Shared {
    pub(super) db: Db,
    /// The open batch.
    pub(super) batch: Mutex<Batch>,
    /// Mirror of `batch.row`, readable without the batch lock (the batch
    /// moves it when it closes a row).
    pub(super) open_row: Arc<AtomicU64>,
    /// The commit lock; see [`Lead`].
    pub(super) lead: Mutex<Lead>,
    /// Wakes the committer.
    pub(super) kick: Sender<()>,
    pub(super) stop: AtomicBool,
    /// What callers may be told (see `ack.rs`).
    pub(super) ack: Ack,
    pub(super) tables: Tables,
    pub(super) writing: Writing,
    /// Durable commits made since open.
    pub(super) commits: AtomicU64,
    /// What commits cost (see `observe.rs`).
    pub(super) observed: CommitStats,
    /// The replica (`log::ship`), handed every durable commit; `None`
    /// without one.
    pub(super) ship: Option<Ship>,
}

impl AckTarget for Shared {
    fn replicated(&self, row: u64) {
        self.ack.replicated(row);
    }

    fn commit_soon(&self) {
        self.batch.lock().also.touched = true;
        let _ = self.kick.try_send(());
    }

    fn fence(&self, why: String) {
        self.ack.fence(why);
    }
}

impl Log {
    /// Commits the open batch on this thread if nobody is committing, the
    /// previous commit woke at most one waiting caller, and the batch
    /// already holds as many records as that commit: a lone caller (an
    /// `insert_batch` loop, a single thread) thus skips the two thread
    /// hand-offs through the committer thread. Otherwise wakes the
    /// committer, which waits briefly for stragglers ([`gather`]) first:
    /// callers woken together by a commit fill the next one fuller that way
    /// than if the first of them to be ready committed at once.
    pub(super) fn lead_or_kick(&self) {
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
}

/// The committer loop: commits what callers left for it (in `Immediate`
/// mode, batches whose callers did not commit them themselves; in
/// `Deferred` mode, everything, at least every `max_delay`).
pub(super) fn run(s: &Shared, kicked: &Receiver<()>, wait: Option<Duration>) {
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
pub(super) enum Committed {
    Nothing,
    Row,
    /// The commit failed (or an earlier one had) and the log is poisoned.
    Failed(Error),
}

/// Commits the open batch, if it has anything, then wakes its callers.
/// The caller holds the commit lock (`lead`), so commits never overlap.
pub(super) fn commit_pending(s: &Shared, lead: &mut Lead) -> Committed {
    if let Err(e) = s.ack.check() {
        return Committed::Failed(e);
    }
    // Held from before the batch is taken until its rows are in it, so a
    // reader that finds a row gone from the batch finds it here (or, once
    // the storage holds it, there).
    let mut flight = s.db.flight.lock();
    let mut batch = {
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
    let rows = batch.seal();
    *flight = Some(Flight {
        rows: first_row..=row,
        parts: rows.clone(),
    });
    drop(flight);
    lead.last_records = batch.own_records();
    let span = tracing::trace_span!(
        "dedupkv.commit",
        row,
        records = batch.own_records(),
        bytes = batch.bytes
    );
    let _entered = span.enter();
    let started = std::time::Instant::now();
    let dropped = batch.also.drop_buckets.clone();
    let written: Vec<u64> = rows.iter().map(|(b, _, _)| *b).collect();
    // A panic inside the storage engine must poison the store, not leave
    // every waiter blocked forever.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(s, batch, rows)))
        .unwrap_or_else(|_| {
            s.db.panicked.store(true, Ordering::Release);
            Err(Error::Storage(
                std::io::Error::other("the storage engine panicked during a commit").into(),
            ))
        });
    match outcome {
        Ok(()) => {
            {
                let mut set = s.tables.buckets.lock();
                for b in &dropped {
                    set.remove(b);
                }
                set.extend(written);
            }
            s.commits.fetch_add(1, Ordering::Relaxed);
            s.observed
                .committed(started.elapsed(), u64::from(lead.last_records));
            lead.last_callers = s.ack.committed(first_row, row);
            *s.db.flight.lock() = None;
            Committed::Row
        }
        Err(e) => {
            tracing::error!(row, error = %e, "dedupkv commit failed; store poisoned");
            s.ack.failed(format!("commit of log row {row} failed: {e}"));
            *s.db.flight.lock() = None;
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
fn write(s: &Shared, batch: Batch, rows: Vec<(u64, u64, Vec<u8>)>) -> Result<()> {
    let db = s.db.store.read();
    let db = db.as_ref().ok_or(Error::Closed)?;
    let mut manifest = s.tables.manifest.lock();
    let mut summaries = s.tables.summaries.lock();
    let format = s.tables.format.load(Ordering::Acquire);
    let upgrade = batch.also.upgrade_to.filter(|to| *to > format);
    let mut next = manifest.clone();
    if let Some(floor) = batch.also.token_floor {
        next.token_floor = next.token_floor.max(floor);
    }
    if let Some(floor) = batch.also.time_floor {
        next.time_floor = next.time_floor.max(floor);
    }
    if batch.max_at >= next.time_floor.saturating_add(s.writing.time_step) {
        next.time_floor = batch.max_at;
    }
    let last_row = batch.row;
    let plan = Plan::of(batch, rows, &mut next, &summaries);
    let stored = summaries_to_store(format, upgrade, &next.buckets, &plan.changed, &summaries);
    let meta = match upgrade {
        Some(to) => meta::upgrade_changes(&**db, &next, to)?,
        None if next != *manifest => vec![meta::manifest_change(&next)],
        None => Vec::new(),
    };
    let commit = Commit {
        drop_buckets: &plan.drops,
        trims: plan.trims,
        rows: plan.rows,
        summaries: stored,
        meta,
        raw_meta: Vec::new(),
    };
    // The replica's copy (`log::ship`): only when there is one.
    let shipped = s.ship.as_ref().map(|_| Shipped::of(last_row, &commit));
    db.commit(commit)?;
    *manifest = next;
    for (b, sum) in plan.changed {
        match sum {
            Some(sum) => summaries.insert(b, sum),
            None => summaries.remove(&b),
        };
    }
    if let Some(to) = upgrade {
        s.tables.format.store(to, Ordering::Release);
    }
    if let (Some(ship), Some(shipped)) = (&s.ship, shipped) {
        ship.sink.shipped(shipped, &**db);
    }
    Ok(())
}

/// A batch laid out as one storage commit's changes.
struct Plan {
    drops: Vec<u64>,
    trims: Vec<(u64, std::ops::RangeInclusive<u64>)>,
    /// (bucket, row, sealed bytes).
    rows: Vec<(u64, u64, Vec<u8>)>,
    /// The summaries this commit changes; `None`: the table is deleted.
    changed: BTreeMap<u64, Option<Summary>>,
}

impl Plan {
    /// Lays out `batch` and its sealed `rows`, noting in `next` the tables
    /// it creates or deletes.
    fn of(
        batch: Batch,
        rows: Vec<(u64, u64, Vec<u8>)>,
        next: &mut Manifest,
        summaries: &BTreeMap<u64, Summary>,
    ) -> Plan {
        let mut changed: BTreeMap<u64, Option<Summary>> = BTreeMap::new();
        let also = batch.also;
        // Deletions first: a bucket dropped and written in one commit keeps
        // the new rows.
        for bucket in &also.drop_buckets {
            next.buckets.remove(bucket);
            changed.insert(*bucket, None);
        }
        let mut trims = Vec::with_capacity(also.trims.len());
        for (bucket, rows, gone) in also.trims {
            // Trimming would create a table deleted in this commit.
            if also.drop_buckets.contains(&bucket) {
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
        for (bucket, row, bytes) in &rows {
            changed
                .entry(*bucket)
                .or_insert_with(|| summaries.get(bucket).copied())
                .get_or_insert_default()
                .add(*bucket, *row, bytes);
            next.buckets.insert(*bucket);
        }
        Plan {
            drops: also.drop_buckets,
            trims,
            rows,
            changed,
        }
    }
}
