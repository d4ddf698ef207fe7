//! The sink the log hands each durable commit to, and the thread that
//! ships them: commits queue here (bounded: a commit that finds the queue
//! over `max_lag_bytes` waits, and its writers with it), and the uploader
//! cuts them into segments — by time and size asynchronously, whenever no
//! upload is in flight synchronously — and creates each at the next place
//! of the segment sequence.
//!
//! Invariants:
//! - segments are created one at a time, in commit order, each at the
//!   place after the previous one; a place found taken by another owner
//!   fences this one: it tells the log (which then acknowledges nothing)
//!   and ships nothing more;
//! - a commit is reported replicated only once the segment holding it (or
//!   the snapshot and RESET segment covering it) is in the object store;
//! - a row a caller waits for (`Sink::hurry`, a claim's provider key) is
//!   cut into a segment as soon as its commit is handed over, whatever the
//!   interval;
//! - a snapshot's view is taken in the commit it follows, so the segment
//!   cut right after that commit ends exactly where the snapshot stands;
//! - the local state file says "clean" only when every commit of this
//!   run was shipped and the store is closing.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::format::{self, Local, RESET, SegmentHead};
use super::objects::{Created, Objects, segment_name};
use super::snapshot;
use super::{ReplicaMode, ReplicaStatus, Restored};
use crate::log::{Acks, LogStore, Shipped, Sink, View};
use crate::{Error, Result};

/// What a restore pays for reading one more object, in bytes of reading
/// (one request's latency at an object store's throughput): the snapshot
/// policy counts each segment as this many bytes as well as its own.
const OBJECT_COST: u64 = 256 << 10;

/// Lag samples kept for [`Uploader::lag_samples`].
const LAG_SAMPLES: usize = 1 << 17;

/// What the uploader needs to know, fixed at open.
pub(crate) struct Settings {
    pub mode: ReplicaMode,
    pub interval: Duration,
    pub segment_bytes: usize,
    pub max_lag_bytes: usize,
    pub snapshot_after: Option<u64>,
    pub snapshot_after_segments: Option<u64>,
    pub snapshot_interval: Duration,
    pub close_timeout: Duration,
    pub epoch: u64,
    /// The local state file.
    pub local: PathBuf,
}

enum Item {
    Commit(Shipped, Instant),
    /// A view of the store right after the commit before it.
    View(View),
}

/// The uploader's state, under one lock.
#[derive(Default)]
struct State {
    queue: Queue,
    chain: Chain,
    control: Control,
    health: Health,
    snap: Snapshots,
    /// The segment being uploaded, kept whole until it is in the object
    /// store: a retry sends the same bytes (see `Cut`).
    cut: Option<Cut>,
    /// A RESET segment whose snapshot is written, kept until it is in the
    /// object store: a retry creates only it, the same bytes again.
    reset_cut: Option<ResetCut>,
}

/// The commits and views handed over and not yet shipped.
#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    bytes: usize,
    /// Views in the queue.
    views: usize,
}

/// Where the chain of segments stands.
#[derive(Default)]
struct Chain {
    /// The place of the next segment.
    next_seq: u64,
    /// The newest row any shipped commit wrote (see `SegmentHead::max_row`).
    max_row: u64,
    /// The row of the last commit handed over.
    handed_row: u64,
    /// The row of the last commit in the object store.
    shipped_row: u64,
    /// The next view starts the chain afresh (a RESET segment).
    reset_pending: bool,
}

/// What callers asked of the thread, and its end.
#[derive(Default)]
#[allow(clippy::struct_excessive_bools)] // independent conditions of one thread
struct Control {
    /// A caller waits for everything handed over (`sync_replica`).
    flush: bool,
    /// A caller waits for this row (`Sink::hurry`): ship without waiting
    /// for a full segment or the interval until it is shipped.
    wanted: u64,
    closed: bool,
    /// Give up: close timed out.
    stop: bool,
    /// Closing waits for the uploader until then at the latest (see
    /// [`Uploader::close_by`]).
    close_by: Option<Instant>,
    /// The thread has exited.
    done: bool,
}

/// What the replica's status reports: fencing, failures, lag.
#[derive(Default)]
struct Health {
    fenced: Option<String>,
    last_segment: Option<u64>,
    failures: u64,
    last_error: Option<String>,
    lag_samples: Vec<Duration>,
}

/// The snapshots: when the next is due, and how the last went.
#[derive(Default)]
struct Snapshots {
    since_snapshot: u64,
    /// Segments shipped since the last snapshot.
    since_segments: u64,
    /// When the last snapshot was whole (or the uploader started).
    last_snapshot_at: Option<Instant>,
    last_snapshot_bytes: u64,
    snapshotting: bool,
    /// Snapshots made whole.
    taken: u64,
}

/// A segment cut from the front of the queue. An upload whose response
/// was lost may have landed: its retry must send exactly these bytes, so
/// that finding its place taken by an identical object means "ours"
/// (rebuilt from a queue that has grown since, it would differ, and be
/// taken for another owner's).
struct Cut {
    seq: u64,
    body: Vec<u8>,
    /// Commits at the front of the queue it holds, and their bytes.
    commits: usize,
    bytes: usize,
    row: u64,
    max_row: u64,
    oldest: Option<Instant>,
}

/// A RESET segment waiting to be created (its snapshot is whole).
struct ResetCut {
    seq: u64,
    body: Vec<u8>,
    max_row: u64,
    snapshot_bytes: u64,
}

/// The replica's sink and uploader for one open store.
pub(crate) struct Uploader {
    objects: Objects,
    cfg: Settings,
    state: Mutex<State>,
    /// The uploader waits here for work.
    more: Condvar,
    /// Writers wait here for room, `sync_replica` and close for progress.
    progress: Condvar,
    /// The next commit takes a view for a snapshot.
    want_view: AtomicBool,
    acks: OnceLock<Acks>,
    restored: Option<Restored>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    snapshot_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    stop_snapshot: Arc<AtomicBool>,
}

impl Uploader {
    /// An uploader whose next segment goes to `next_seq`. With `reset`,
    /// the first commit's view becomes a snapshot and a RESET segment
    /// before anything else is shipped (the chain does not hold what the
    /// file holds).
    pub(crate) fn start(
        objects: Objects,
        cfg: Settings,
        next_seq: u64,
        max_row: u64,
        reset: bool,
        restored: Option<Restored>,
    ) -> Result<Arc<Uploader>> {
        let up = Arc::new(Uploader {
            objects,
            cfg,
            state: Mutex::new(State {
                chain: Chain {
                    next_seq,
                    max_row,
                    reset_pending: reset,
                    ..Chain::default()
                },
                snap: Snapshots {
                    last_snapshot_at: Some(Instant::now()),
                    ..Snapshots::default()
                },
                ..State::default()
            }),
            more: Condvar::new(),
            progress: Condvar::new(),
            want_view: AtomicBool::new(reset),
            acks: OnceLock::new(),
            restored,
            thread: Mutex::new(None),
            snapshot_thread: Mutex::new(None),
            stop_snapshot: Arc::new(AtomicBool::new(false)),
        });
        let me = Arc::clone(&up);
        let h = std::thread::Builder::new()
            .name("dedupkv-replica".into())
            .spawn(move || me.run())
            .map_err(|source| Error::Io {
                what: "starting the replica's uploader thread",
                source,
            })?;
        *up.thread.lock() = Some(h);
        Ok(up)
    }

    fn synchronous(&self) -> bool {
        self.cfg.mode == ReplicaMode::Synchronous
    }

    /// Waits until every commit handed over so far is in the object store.
    pub(crate) fn sync(&self) -> Result<()> {
        self.sync_until(None).map(drop)
    }

    /// [`sync`](Self::sync), giving up at `deadline` (`None`: never):
    /// `Ok(false)` when the deadline passed first (the rest stays queued,
    /// and in the local file).
    pub(crate) fn sync_until(&self, deadline: Option<Instant>) -> Result<bool> {
        let mut st = self.state.lock();
        let target = st.chain.handed_row;
        st.control.flush = true;
        self.more.notify_all();
        loop {
            if let Some(why) = &st.health.fenced {
                return Err(Error::Fenced(why.clone()));
            }
            if st.chain.shipped_row >= target && !st.chain.reset_pending {
                st.control.flush = false;
                return Ok(true);
            }
            if st.control.done {
                return Err(Error::Closed);
            }
            match deadline {
                None => self.progress.wait(&mut st),
                Some(d) => {
                    if self.progress.wait_until(&mut st, d).timed_out() {
                        return Ok(false);
                    }
                }
            }
        }
    }

    /// Closing the store waits for the uploader until `at` at the latest
    /// (or the close timeout, if that ends sooner).
    pub(crate) fn close_by(&self, at: Instant) {
        let mut st = self.state.lock();
        st.control.close_by = Some(st.control.close_by.map_or(at, |c| c.min(at)));
    }

    /// Stops the uploader of a store whose open failed (the log never
    /// started, so nothing will close it).
    pub(crate) fn abandon(&self) {
        let mut st = self.state.lock();
        st.control.stop = true;
        self.more.notify_all();
        drop(st);
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }

    /// What the replica is doing.
    pub(crate) fn status(&self) -> ReplicaStatus {
        let st = self.state.lock();
        let lag = st.queue.items.iter().find_map(|i| match i {
            Item::Commit(_, at) => Some(at.elapsed()),
            Item::View(_) => None,
        });
        ReplicaStatus {
            epoch: self.cfg.epoch,
            restored: self.restored.clone(),
            last_segment: st.health.last_segment,
            lag_bytes: st.queue.bytes as u64,
            lag: lag.unwrap_or_default(),
            upload_failures: st.health.failures,
            last_error: st.health.last_error.clone(),
            snapshots: st.snap.taken,
            fenced: st.health.fenced.is_some(),
        }
    }

    /// How long each shipped segment's oldest commit waited (the latest
    /// samples), for the lag measurement.
    pub(crate) fn lag_samples(&self) -> Vec<Duration> {
        self.state.lock().health.lag_samples.clone()
    }

    /// The thread: cut and ship segments until closed and drained.
    fn run(self: &Arc<Self>) {
        let mut backoff = Duration::from_millis(10);
        loop {
            let mut st = self.state.lock();
            // Wait for a segment's worth, its time, a view, or the end.
            loop {
                if st.control.stop || st.health.fenced.is_some() {
                    return self.exit(st, false);
                }
                if st.queue.items.is_empty() {
                    if st.control.closed {
                        return self.exit(st, true);
                    }
                    self.more.wait(&mut st);
                    continue;
                }
                let age = match st.queue.items.front() {
                    Some(Item::Commit(_, at)) => at.elapsed(),
                    _ => Duration::MAX,
                };
                let due = st.control.closed
                    || st.control.flush
                    || st.control.wanted > st.chain.shipped_row
                    || st.chain.reset_pending
                    || self.synchronous()
                    || st.queue.bytes >= self.cfg.segment_bytes
                    || age >= self.cfg.interval
                    || st.queue.views > 0;
                if due {
                    break;
                }
                let left = self.cfg.interval.saturating_sub(age);
                self.more.wait_for(&mut st, left);
            }
            let shipped = if st.chain.reset_pending {
                self.ship_reset(st)
            } else {
                self.ship_segment(st)
            };
            match shipped {
                Ok(true) => backoff = Duration::from_millis(10),
                Ok(false) => {}
                Err(e) => {
                    {
                        let mut st = self.state.lock();
                        st.health.failures += 1;
                        st.health.last_error = Some(e.to_string());
                    }
                    tracing::warn!(error = %e, "dedupkv replica upload failed; retrying");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Ships the commits at the front of the queue as one segment (up to
    /// `segment_bytes`, and never past a view), then starts the snapshot
    /// of a view right after them. Returns whether it shipped.
    fn ship_segment(self: &Arc<Self>, mut st: parking_lot::MutexGuard<'_, State>) -> Result<bool> {
        if st.cut.is_none() {
            let Some(cut) = self.cut(&st) else {
                // A view with nothing before it: its commit was shipped.
                self.take_view(&mut st);
                return Ok(false);
            };
            st.cut = Some(cut);
        }
        let (seq, body) = match &st.cut {
            Some(c) => (c.seq, c.body.clone()),
            None => return Ok(false),
        };
        drop(st);
        let len = body.len() as u64;
        self.create_segment(seq, &body)?;
        let mut st = self.state.lock();
        let Some(Cut {
            commits,
            bytes,
            row,
            max_row,
            oldest,
            ..
        }) = st.cut.take()
        else {
            return Ok(false);
        };
        for _ in 0..commits {
            st.queue.items.pop_front();
        }
        st.queue.bytes -= bytes;
        st.chain.next_seq += 1;
        st.chain.max_row = max_row;
        st.chain.shipped_row = st.chain.shipped_row.max(row);
        st.health.last_segment = Some(seq);
        st.snap.since_snapshot += len;
        st.snap.since_segments += 1;
        if let Some(at) = oldest {
            if st.health.lag_samples.len() >= LAG_SAMPLES {
                st.health.lag_samples.clear();
            }
            st.health.lag_samples.push(at.elapsed());
        }
        self.take_view(&mut st);
        if self.snapshot_due(&st) && !st.snap.snapshotting {
            self.want_view.store(true, Ordering::Release);
        }
        self.progress.notify_all();
        drop(st);
        if let Some(a) = self.acks.get() {
            a.replicated(row);
        }
        Ok(true)
    }

    /// Whether the segments shipped since the last snapshot call for a new
    /// one. By default: once restoring them would cost about as much as
    /// restoring the snapshot (at least 64 MiB), counting each segment as
    /// [`OBJECT_COST`] bytes as well as its own — a restore pays a
    /// request per object, so many small segments (lone synchronous
    /// commits) are as slow to read as a few large ones. Also once the
    /// last snapshot is older than the snapshot interval, so expired
    /// records leave the replica too.
    fn snapshot_due(&self, st: &State) -> bool {
        let by_bytes = if let Some(n) = self.cfg.snapshot_after {
            st.snap.since_snapshot >= n
        } else {
            let cost = st
                .snap
                .since_snapshot
                .saturating_add(st.snap.since_segments.saturating_mul(OBJECT_COST));
            cost >= st.snap.last_snapshot_bytes.max(64 << 20)
        };
        let by_count = self
            .cfg
            .snapshot_after_segments
            .is_some_and(|n| st.snap.since_segments >= n);
        let by_age = st.snap.since_segments > 0
            && st
                .snap
                .last_snapshot_at
                .is_some_and(|at| at.elapsed() >= self.cfg.snapshot_interval);
        by_bytes || by_count || by_age
    }

    /// Cuts the commits at the front of the queue (up to `segment_bytes`,
    /// and never past a view) into the next segment; `None` when a view
    /// is at the front.
    fn cut(&self, st: &State) -> Option<Cut> {
        let mut commits = Vec::new();
        let mut bytes = 0;
        let mut oldest = None;
        let mut max_row = st.chain.max_row;
        for item in &st.queue.items {
            let Item::Commit(c, at) = item else { break };
            if !commits.is_empty() && bytes + c.bytes() > self.cfg.segment_bytes {
                break;
            }
            bytes += c.bytes();
            oldest.get_or_insert(*at);
            max_row = c.rows.iter().map(|r| r.1).fold(max_row, u64::max);
            commits.push(c);
        }
        let row = commits.last()?.row;
        let head = SegmentHead {
            flags: 0,
            epoch: self.cfg.epoch,
            seq: st.chain.next_seq,
            max_row,
            commits: commits.len() as u32,
        };
        Some(Cut {
            seq: head.seq,
            body: format::segment_of(head, commits.iter().copied()),
            commits: commits.len(),
            bytes,
            row,
            max_row,
            oldest,
        })
    }

    /// A view at the front of the queue becomes a snapshot of the last
    /// segment shipped (on a thread of its own); a second one while a
    /// snapshot is being written is dropped.
    fn take_view(self: &Arc<Self>, st: &mut State) {
        if !matches!(st.queue.items.front(), Some(Item::View(_))) {
            return;
        }
        let Some(Item::View(view)) = st.queue.items.pop_front() else {
            return;
        };
        st.queue.views -= 1;
        let (Some(seq), false) = (st.health.last_segment, st.snap.snapshotting) else {
            return;
        };
        st.snap.snapshotting = true;
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("dedupkv-snapshot".into())
            .spawn(move || me.snapshot(view, seq));
        match spawned {
            Ok(h) => {
                if let Some(old) = self.snapshot_thread.lock().replace(h) {
                    let _ = old.join();
                }
            }
            Err(e) => {
                st.snap.snapshotting = false;
                tracing::warn!(error = %e, "dedupkv replica could not start a snapshot");
            }
        }
    }

    /// Writes the snapshot of `seq` from `view`, then prunes what it
    /// supersedes.
    fn snapshot(&self, view: View, seq: u64) {
        let _span = tracing::info_span!("dedupkv.replica.snapshot", seq).entered();
        let written = snapshot::write(
            &self.objects,
            view,
            seq,
            self.cfg.epoch,
            &self.stop_snapshot,
        );
        let mut st = self.state.lock();
        st.snap.snapshotting = false;
        match written {
            Ok(ix) => {
                st.snap.taken += 1;
                st.snap.last_snapshot_bytes = ix.bytes;
                st.snap.since_snapshot = 0;
                st.snap.since_segments = 0;
                st.snap.last_snapshot_at = Some(Instant::now());
                drop(st);
                if let Err(e) = snapshot::prune(&self.objects, seq) {
                    tracing::warn!(error = %e, "dedupkv replica could not prune");
                }
            }
            Err(e) => {
                st.health.last_error = Some(e.to_string());
                tracing::warn!(error = %e, "dedupkv replica snapshot failed; the next one retries");
            }
        }
    }

    /// Starts the chain afresh from the store as it is: the commits before
    /// the first view are in it, so they are dropped; the view becomes the
    /// snapshot of the next place, then a RESET segment there says so.
    fn ship_reset(self: &Arc<Self>, mut st: parking_lot::MutexGuard<'_, State>) -> Result<bool> {
        if let Some(cut) = st.reset_cut.take() {
            // The snapshot is whole; only its RESET segment is left to
            // create (again, the same bytes: it may have landed).
            drop(st);
            return self.create_reset(cut);
        }
        let mut row = 0;
        let mut view = None;
        while let Some(item) = st.queue.items.pop_front() {
            match item {
                Item::Commit(c, _) => {
                    st.queue.bytes -= c.bytes();
                    row = row.max(c.row);
                    st.chain.handed_row = st.chain.handed_row.max(c.row);
                }
                Item::View(v) => {
                    st.queue.views -= 1;
                    view = Some(v);
                    break;
                }
            }
        }
        // Commits dropped here are in the coming view; what it covers.
        st.chain.shipped_row = st.chain.shipped_row.max(row);
        let Some(view) = view else {
            // The view is still to come: with the commit being handed
            // over, or with one the log makes for it.
            self.want_view.store(true, Ordering::Release);
            drop(st);
            if let Some(a) = self.acks.get() {
                a.commit_soon();
            }
            std::thread::sleep(Duration::from_millis(1));
            return Ok(false);
        };
        let seq = st.chain.next_seq;
        drop(st);
        let ix = match snapshot::write(
            &self.objects,
            view,
            seq,
            self.cfg.epoch,
            &self.stop_snapshot,
        ) {
            Ok(ix) => ix,
            Err(e) => {
                // The view is spent: the next commit brings another.
                self.want_view.store(true, Ordering::Release);
                if let Some(a) = self.acks.get() {
                    a.commit_soon();
                }
                return Err(e);
            }
        };
        let head = SegmentHead {
            flags: RESET,
            epoch: self.cfg.epoch,
            seq,
            max_row: ix.max_row,
            commits: 0,
        };
        self.create_reset(ResetCut {
            seq,
            body: format::segment(head, &[]),
            max_row: ix.max_row,
            snapshot_bytes: ix.bytes,
        })
    }

    /// Creates the RESET segment of a whole snapshot; kept for the retry
    /// when that fails.
    fn create_reset(&self, cut: ResetCut) -> Result<bool> {
        if let Err(e) = self.create_segment(cut.seq, &cut.body) {
            self.state.lock().reset_cut = Some(cut);
            return Err(e);
        }
        let seq = cut.seq;
        let mut st = self.state.lock();
        st.chain.reset_pending = false;
        st.chain.next_seq = seq + 1;
        st.chain.max_row = cut.max_row;
        st.health.last_segment = Some(seq);
        st.snap.taken += 1;
        st.snap.last_snapshot_bytes = cut.snapshot_bytes;
        st.snap.since_snapshot = 0;
        st.snap.since_segments = 0;
        st.snap.last_snapshot_at = Some(Instant::now());
        let row = st.chain.shipped_row;
        self.progress.notify_all();
        drop(st);
        if let Err(e) = snapshot::prune(&self.objects, seq) {
            tracing::warn!(error = %e, "dedupkv replica could not prune");
        }
        if let Some(a) = self.acks.get() {
            a.replicated(row);
        }
        Ok(true)
    }

    /// Creates segment `seq`; a place taken by another owner fences this
    /// one (an error that is never retried: the thread stops).
    fn create_segment(&self, seq: u64, body: &[u8]) -> Result<()> {
        let _span =
            tracing::debug_span!("dedupkv.replica.upload", seq, bytes = body.len()).entered();
        let name = segment_name(seq);
        match self.objects.create(&name, body.to_vec())? {
            Created::Created => Ok(()),
            Created::Exists => {
                // Ours, if an earlier attempt went through unseen.
                let there = self.objects.get(&name)?;
                if there.as_deref() == Some(body) {
                    return Ok(());
                }
                let theirs = there
                    .as_deref()
                    .and_then(|b| format::segment_head(b, &name).ok())
                    .map_or_else(
                        || "another owner".to_string(),
                        |h| format!("epoch {}", h.epoch),
                    );
                let why = format!(
                    "{theirs} took over the replica at {} (segment {seq} is its); this owner \
                     (epoch {}) acknowledges nothing more: close this store",
                    self.objects.path(""),
                    self.cfg.epoch
                );
                tracing::error!(%why, "dedupkv replica fenced");
                // The log is poisoned under the state lock: whoever hears
                // of the fencing here finds the store refusing every call.
                let mut st = self.state.lock();
                st.health.fenced = Some(why.clone());
                if let Some(a) = self.acks.get() {
                    a.fence(why.clone());
                }
                self.progress.notify_all();
                drop(st);
                Err(Error::Fenced(why))
            }
        }
    }

    /// The thread ends: with `drained`, the file holds exactly the chain,
    /// which the local state file then says.
    fn exit(&self, mut st: parking_lot::MutexGuard<'_, State>, drained: bool) {
        if drained && !st.chain.reset_pending {
            let local = Local {
                epoch: self.cfg.epoch,
                seq: st.chain.next_seq.saturating_sub(1),
                clean: true,
                claiming: 0,
            };
            if let Err(e) = write_local(&self.cfg.local, local) {
                tracing::warn!(error = %e, "dedupkv replica could not record its clean close");
            }
        }
        st.control.done = true;
        self.progress.notify_all();
    }
}

impl Sink for Uploader {
    fn attach(&self, acks: Acks) {
        let _ = self.acks.set(acks);
    }

    fn shipped(&self, commit: Shipped, store: &dyn LogStore) {
        let view = if self.want_view.swap(false, Ordering::AcqRel) {
            match store.view() {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(error = %e, "dedupkv replica could not read a snapshot view");
                    self.want_view.store(true, Ordering::Release);
                    None
                }
            }
        } else {
            None
        };
        let mut st = self.state.lock();
        st.chain.handed_row = st.chain.handed_row.max(commit.row);
        while st.queue.bytes >= self.cfg.max_lag_bytes
            && st.health.fenced.is_none()
            && !st.control.done
        {
            self.progress.wait(&mut st);
        }
        if st.health.fenced.is_some() || st.control.done {
            return;
        }
        // The uploader needs waking only when this changes what it waits
        // for: a first commit (its interval starts), a full segment, a
        // view, or any commit of a synchronous replica.
        let was_empty = st.queue.items.is_empty();
        let was_short = st.queue.bytes < self.cfg.segment_bytes;
        st.queue.bytes += commit.bytes();
        st.queue
            .items
            .push_back(Item::Commit(commit, Instant::now()));
        let wake = self.synchronous()
            || was_empty
            || st.control.flush
            || st.control.wanted > st.chain.shipped_row
            || view.is_some()
            || (was_short && st.queue.bytes >= self.cfg.segment_bytes);
        if let Some(v) = view {
            st.queue.items.push_back(Item::View(v));
            st.queue.views += 1;
        }
        if wake {
            self.more.notify_one();
        }
    }

    fn hurry(&self, row: u64) {
        let mut st = self.state.lock();
        if row > st.control.wanted {
            st.control.wanted = row;
            self.more.notify_all();
        }
    }

    fn closed(&self) {
        let mut st = self.state.lock();
        st.control.closed = true;
        self.more.notify_all();
        // A close timeout too long to add to now is no limit.
        let deadline = match (
            Instant::now().checked_add(self.cfg.close_timeout),
            st.control.close_by,
        ) {
            (Some(t), Some(c)) => Some(t.min(c)),
            (t, c) => t.or(c),
        };
        while !st.control.done {
            let timed_out = if let Some(d) = deadline {
                self.progress.wait_until(&mut st, d).timed_out()
            } else {
                self.progress.wait(&mut st);
                false
            };
            if timed_out && !st.control.done {
                tracing::error!(
                    "dedupkv replica: the uploader did not finish within the close timeout; \
                     the unshipped tail stays in the local file until its next open"
                );
                st.control.stop = true;
                self.more.notify_all();
                break;
            }
        }
        let done = st.control.done;
        drop(st);
        self.stop_snapshot.store(true, Ordering::Release);
        if let Some(h) = self.snapshot_thread.lock().take() {
            let _ = h.join();
        }
        if done && let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

/// Writes the local state file, durably (a temporary file renamed over it).
pub(crate) fn write_local(path: &std::path::Path, local: Local) -> Result<()> {
    use std::io::Write;
    let io = |e: std::io::Error| Error::Storage(crate::error::io_at(path, &e));
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&format::local(local)).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(())
}

/// Reads the local state file; `None` when there is none.
pub(crate) fn read_local(path: &std::path::Path) -> Result<Option<Local>> {
    match std::fs::read(path) {
        Ok(b) => format::read_local(&b, &path.display().to_string()).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Storage(crate::error::io_at(path, &e))),
    }
}
