//! What a caller may be told, decided in one place: the durable and the
//! replicated watermarks, the poison and the replica's fence; the blocking
//! wait on them (a futex per row parity) and the async poll (a waker list).
//!
//! Invariants:
//! - `durable_row` only grows, and only after a commit returned `Ok`: every
//!   row at or below it is on stable storage; `replicated_row` only grows,
//!   and only for rows whose commit returned `Ok`;
//! - a caller is told its answer once the *acknowledged* row covers it:
//!   `durable_row`, or with a synchronous replica `replicated_row`; a row
//!   is *kept* (for the store's next owner) once it is in the replica, or
//!   without one, durable;
//! - once poisoned (a failed commit, or the replica's fence) the log stays
//!   poisoned, nothing more is acknowledged, and every waiter is woken to
//!   be told so;
//! - a watermark or the poison is published before the word a blocking
//!   waiter sleeps on changes, and the waiter reads that word before it
//!   checks: no wake-up is missed. Async waiters: see `durable.rs`.

use std::sync::OnceLock;

#[cfg(feature = "async")]
use super::durable::Waiting;
use super::durable::Wakers;
use super::{Log, Ship};
#[cfg(feature = "async")]
use crate::sync::Arc;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Futex, Mutex, Ordering};
use crate::{Durability, Error, Result};

/// Bytes buffered in `Deferred` mode before a commit is started early.
const DEFERRED_FLUSH_BYTES: usize = 4 << 20;

/// See [`Log::on_poison`].
pub(crate) type PoisonHook = Box<dyn Fn() + Send + Sync>;

/// How a replica bears on what callers are told.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Replica {
    /// No replica: acknowledged and kept mean durable.
    None,
    /// Acknowledged means durable; kept means in the replica.
    Async,
    /// Acknowledged and kept mean in the replica.
    Sync,
}

impl Replica {
    pub(super) fn of(ship: Option<&Ship>) -> Replica {
        match ship {
            None => Replica::None,
            Some(s) if s.synchronous => Replica::Sync,
            Some(_) => Replica::Async,
        }
    }
}

/// Why the log refuses: set once, by a failed commit or the fence.
struct Poison {
    poisoned: AtomicBool,
    /// The poison is the replica's fencing ([`Error::Fenced`]).
    fenced: AtomicBool,
    /// Why (set before `poisoned`).
    why: Mutex<Option<String>>,
    /// Told once the log is poisoned, after `poisoned` is set: the engine
    /// wakes every caller waiting for a key's in-flight result, whose next
    /// `begin` then answers the poison.
    hook: OnceLock<PoisonHook>,
}

/// The watermarks, the poison, and who waits on them.
pub(super) struct Ack {
    /// The newest durable row.
    durable_row: AtomicU64,
    /// With a replica: the newest row in it. A synchronous replica's
    /// callers wait for it instead of `durable_row` (a shipped row is one
    /// whose commit returned `Ok`, so it is durable even before
    /// `durable_row` says so).
    replicated_row: AtomicU64,
    replica: Replica,
    poison: Poison,
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
    /// Async callers awaiting the acknowledged row (see `durable.rs`).
    wakers: Wakers,
    /// Async callers awaiting a row's upload to an asynchronous replica
    /// ([`Log::poll_kept`]); woken by [`Ack::replicated`].
    kept_wakers: Wakers,
}

impl Ack {
    /// Rows up to `last_row` are durable; with a replica `behind`, none of
    /// them is in it yet.
    pub(super) fn new(last_row: u64, ship: Option<&Ship>) -> Ack {
        let replicated = match ship {
            Some(s) if s.behind => 0,
            _ => last_row,
        };
        Ack {
            durable_row: AtomicU64::new(last_row),
            replicated_row: AtomicU64::new(replicated),
            replica: Replica::of(ship),
            poison: Poison {
                poisoned: AtomicBool::new(false),
                fenced: AtomicBool::new(false),
                why: Mutex::new(None),
                hook: OnceLock::new(),
            },
            woke: Default::default(),
            callers: Default::default(),
            wakers: Wakers::default(),
            kept_wakers: Wakers::default(),
        }
    }

    /// The row callers are acknowledged up to: the durable row, or with a
    /// synchronous replica the replicated one.
    #[inline]
    pub(super) fn acked_row(&self) -> u64 {
        match self.replica {
            Replica::Sync => self.replicated_row.load(Ordering::Acquire),
            _ => self.durable_row.load(Ordering::Acquire),
        }
    }

    /// Whether `row` is durable (the replica aside).
    pub(super) fn is_durable(&self, row: u64) -> bool {
        self.durable_row.load(Ordering::Acquire) >= row
    }

    /// Whether `row` is where the store's next owner reads: in the
    /// replica (either mode), or without one, durable.
    pub(super) fn is_kept(&self, row: u64) -> bool {
        let kept = if self.replica == Replica::None {
            &self.durable_row
        } else {
            &self.replicated_row
        };
        kept.load(Ordering::Acquire) >= row
    }

    /// Fails if the log is poisoned.
    #[inline]
    pub(super) fn check(&self) -> Result<()> {
        if self.poison.poisoned.load(Ordering::Acquire) {
            return Err(self.poisoned_error());
        }
        Ok(())
    }

    /// A poisoned log reports why.
    fn poisoned_error(&self) -> Error {
        let why = self
            .poison
            .why
            .lock()
            .clone()
            .unwrap_or_else(|| "unknown".into());
        if self.poison.fenced.load(Ordering::Acquire) {
            return Error::Fenced(why);
        }
        Error::Poisoned(why)
    }

    /// See [`Log::on_poison`].
    pub(super) fn on_poison(&self, hook: PoisonHook) {
        let _ = self.poison.hook.set(hook);
    }

    /// The commit of rows `first_row..=row` returned `Ok`: publishes it and
    /// wakes its callers. Returns how many callers waited for it.
    pub(super) fn committed(&self, first_row: u64, row: u64) -> u32 {
        self.durable_row.store(row, Ordering::Release);
        let parity = (row % 2) as usize;
        let mut callers = self.callers[parity].swap(0, Ordering::Relaxed);
        self.woke[parity].wake_all();
        if first_row < row {
            // A batch of several rows has callers of both parities (and
            // may wake some of the open row early: they wait again).
            let other = 1 - parity;
            callers += self.callers[other].swap(0, Ordering::Relaxed);
            self.woke[other].wake_all();
        }
        self.wakers.wake_through(self.acked_row());
        callers
    }

    /// A commit failed: poisons the log with `why`.
    pub(super) fn failed(&self, why: String) {
        *self.poison.why.lock() = Some(why);
        self.poison.poisoned.store(true, Ordering::Release);
        self.poisoned_now();
    }

    /// Every commit up to `row` is in the replica.
    pub(super) fn replicated(&self, row: u64) {
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

    /// Another owner took the replica over: poisons the log as fenced.
    pub(super) fn fence(&self, why: String) {
        {
            let mut p = self.poison.why.lock();
            if p.is_none() {
                *p = Some(why);
            }
        }
        self.poison.fenced.store(true, Ordering::Release);
        self.poison.poisoned.store(true, Ordering::Release);
        self.poisoned_now();
    }

    /// Wakes everyone waiting on the log (the log was just poisoned), and
    /// tells the hook.
    fn poisoned_now(&self) {
        for w in &self.woke {
            w.wake_all();
        }
        self.wakers.wake_all();
        self.kept_wakers.wake_all();
        if let Some(hook) = self.poison.hook.get() {
            hook();
        }
    }

    /// Counts a blocking caller of `row` (see `callers`).
    fn count_caller(&self, row: u64) {
        self.callers[(row % 2) as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Sleeps until `reached()` or the poison; `Ok` if reached first.
    fn sleep_until(&self, row: u64, reached: impl Fn() -> bool) -> Result<()> {
        let parity = (row % 2) as usize;
        // The committer publishes `durable_row` (or `poisoned`) before it
        // changes the word it wakes through, and the word is read here
        // before the check: a commit after the check has changed the word,
        // so the wait returns at once instead of missing the wake-up.
        loop {
            let seen = self.woke[parity].load();
            if reached() {
                return Ok(());
            }
            if self.poison.poisoned.load(Ordering::Acquire) {
                return Err(self.poisoned_error());
            }
            self.woke[parity].wait(seen);
        }
    }
}

// The blocking waits and the async polls.
impl Log {
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
        self.shared.ack.check()
    }

    /// Sets what the log tells once it is poisoned (once; a second hook
    /// is ignored). A poison before the hook is set is not told: whoever
    /// sets it checks the log afterwards.
    pub(crate) fn on_poison(&self, hook: PoisonHook) {
        self.shared.ack.on_poison(hook);
    }

    /// Makes `row` durable as the durability mode requires: in `Immediate`
    /// mode waits for its commit; in `Deferred` mode only nudges the
    /// committer when enough is buffered.
    pub(crate) fn settle(&self, row: u64) -> Result<()> {
        match self.durability {
            Durability::Immediate => self.wait_durable(row),
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
        if s.ack.acked_row() >= row {
            return Ok(());
        }
        let row = if row > s.open_row.load(Ordering::Acquire) {
            debug_assert!(false, "a wait for log row {row}, which does not exist");
            let b = s.batch.lock();
            if b.is_empty() { b.row - 1 } else { b.row }
        } else {
            row
        };
        if s.ack.acked_row() >= row {
            return Ok(());
        }
        s.ack.count_caller(row);
        self.lead_or_kick();
        s.ack.sleep_until(row, || s.ack.acked_row() >= row)
    }

    /// An asynchronous replica, if the log ships to one.
    fn async_ship(&self) -> Option<&Ship> {
        self.shared.ship.as_ref().filter(|s| !s.synchronous)
    }

    /// Whether `row` is where the store's next owner reads: in the
    /// replica (either mode), or without one, durable.
    pub(crate) fn is_kept(&self, row: u64) -> bool {
        self.shared.ack.is_kept(row)
    }

    /// Returns once `row` [is kept](Self::is_kept). An asynchronous
    /// replica is asked to ship it now instead of at its segment interval;
    /// while its uploads fail this waits (the uploader retries). Fails
    /// once the log is poisoned or fenced, unless the row was kept first.
    pub(crate) fn wait_kept(&self, row: u64) -> Result<()> {
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
        self.shared.ack.sleep_until(row, || self.is_kept(row))
    }

    #[cfg(feature = "async")]
    /// Polls for `row` to be durable without blocking: registers the
    /// task's waker in `slot` (kept by the caller's future, and passed to
    /// [`Log::stop_waiting`] when it is dropped) and wakes the committer.
    /// The committer, not this thread, commits: a commit syncs the disk.
    pub(crate) fn poll_durable(
        &self,
        row: u64,
        slot: &mut Option<Arc<Waiting>>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<()>> {
        let ack = &self.shared.ack;
        // Answers rest on the acknowledged row (with a synchronous
        // replica, the replicated one): the committer and the replica wake
        // the waker list through it.
        self.poll_row(
            (row, slot, cx),
            &ack.wakers,
            || ack.acked_row() >= row,
            || {},
        )
    }

    #[cfg(feature = "async")]
    /// [`wait_kept`](Self::wait_kept) as a poll, its waker kept in `slot`
    /// as [`Log::poll_durable`] does (passed to [`Log::stop_waiting_kept`]
    /// when the caller's future is dropped).
    pub(crate) fn poll_kept(
        &self,
        row: u64,
        slot: &mut Option<Arc<Waiting>>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<()>> {
        let Some(ship) = self.async_ship() else {
            return self.poll_durable(row, slot, cx);
        };
        self.poll_row(
            (row, slot, cx),
            &self.shared.ack.kept_wakers,
            || self.is_kept(row),
            || ship.sink.hurry(row),
        )
    }

    #[cfg(feature = "async")]
    /// The body of the polls: `Ready` once `reached()` (or the log is
    /// poisoned), else the task's waker registered in `list` under `row`
    /// (the first time also kicking the committer and `on_first`).
    fn poll_row(
        &self,
        (row, slot, cx): (u64, &mut Option<Arc<Waiting>>, &mut std::task::Context<'_>),
        list: &Wakers,
        reached: impl Fn() -> bool,
        on_first: impl FnOnce(),
    ) -> std::task::Poll<Result<()>> {
        use std::task::Poll;
        let ack = &self.shared.ack;
        let ready = || {
            if reached() {
                return Some(Ok(()));
            }
            if ack.poison.poisoned.load(Ordering::Acquire) {
                return Some(Err(ack.poisoned_error()));
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

    /// Forgets the waker of a future that stopped waiting.
    #[cfg(feature = "async")]
    pub(crate) fn stop_waiting(&self, slot: &Arc<Waiting>) {
        self.shared.ack.wakers.remove(slot);
    }

    /// Forgets the waker of a [`poll_kept`](Self::poll_kept) future that
    /// stopped waiting.
    #[cfg(feature = "async")]
    pub(crate) fn stop_waiting_kept(&self, slot: &Arc<Waiting>) {
        if self.async_ship().is_some() {
            self.shared.ack.kept_wakers.remove(slot);
        } else {
            self.shared.ack.wakers.remove(slot);
        }
    }
}
