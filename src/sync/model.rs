//! Loom stand-ins for the `parking_lot`, `crossbeam-channel` and `std` names
//! [`crate::sync`] exports. Compiled only under `cfg(dedupkv_loom)`.
//!
//! Differences from the normal build, all deliberate:
//! - Loom has no clock. A timed wait ([`Condvar::wait_for`],
//!   [`Receiver::recv_timeout`]) is a wait that may time out at any
//!   scheduling point: it releases the lock, yields to loom's scheduler and
//!   reports a timeout (unless a message is already there). Callers re-check
//!   their condition after a timeout anyway, so loom explores both "woken in
//!   time" and "timed out first", and never reports a deadlock that a real
//!   timeout would have broken.
//! - The channel is a `VecDeque` under a loom mutex and condvar, with the
//!   operations the committer uses; `bounded(0)` (rendezvous) is not
//!   supported.
//! - [`MappedRwLockReadGuard`] keeps the whole read guard and re-applies the
//!   mapping on each dereference, since loom's guards cannot be mapped.
//! - `parking_lot` has no lock poisoning, so the shims hand out guards
//!   directly (loom's locks never report poisoning either).
//! - Threads get a 2 MiB stack (loom's default of 32 KiB is too small for a
//!   redb commit), and the channel's `Drop` skips its bookkeeping while a
//!   failed model unwinds (see `Receiver`'s `Drop`).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
pub(crate) use loom::thread::JoinHandle;

/// Stack for threads the store spawns, in the machine words loom's
/// `generator` threads count in (2 MiB): the default 32 KiB is too small for
/// a redb commit.
const STACK_WORDS: usize = 1 << 18;

/// Spawns a named loom thread with a stack large enough for redb.
pub(crate) fn spawn<F>(name: &str, f: F) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    loom::thread::Builder::new()
        .name(name.into())
        .stack_size(STACK_WORDS)
        .spawn(f)
}

/// A mutex whose `lock` returns the guard directly, as `parking_lot`'s does.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    inner: loom::sync::Mutex<T>,
}

/// The guard of a [`Mutex`]. `None` only inside [`Condvar`] waits.
pub(crate) struct MutexGuard<'a, T> {
    lock: &'a Mutex<T>,
    guard: Option<loom::sync::MutexGuard<'a, T>>,
}

impl<T> Mutex<T> {
    /// A new unlocked mutex.
    pub(crate) fn new(value: T) -> Self {
        Self {
            inner: loom::sync::Mutex::new(value),
        }
    }

    /// Blocks until the lock is held.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard {
            lock: self,
            guard: Some(self.raw_lock()),
        }
    }

    /// Takes the lock if it is free, as `parking_lot`'s `try_lock` does.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let guard = match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(MutexGuard {
            lock: self,
            guard: Some(guard),
        })
    }

    fn raw_lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.guard
            .as_deref()
            .expect("a mutex guard is held outside a wait")
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard
            .as_deref_mut()
            .expect("a mutex guard is held outside a wait")
    }
}

/// A condition variable waited on through `&mut` [`MutexGuard`].
#[derive(Debug, Default)]
pub(crate) struct Condvar {
    inner: loom::sync::Condvar,
}

/// Whether a [`Condvar::wait_for`] timed out (under loom: always).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// Whether the wait ended by timeout rather than notification.
    #[allow(dead_code)] // API parity with parking_lot; no caller reads it today.
    pub(crate) fn timed_out(self) -> bool {
        self.0
    }
}

impl Condvar {
    /// A new condition variable.
    pub(crate) fn new() -> Self {
        Self {
            inner: loom::sync::Condvar::new(),
        }
    }

    /// Releases the guard's lock until notified, then takes it again.
    pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let held = guard.guard.take().expect("a condvar wait holds the lock");
        let held = self
            .inner
            .wait(held)
            .unwrap_or_else(PoisonError::into_inner);
        guard.guard = Some(held);
    }

    /// A timed wait: releases the lock, yields to loom's scheduler, takes
    /// the lock again and reports a timeout (see the module docs).
    #[allow(clippy::unused_self)] // a method, as in parking_lot
    pub(crate) fn wait_for<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        _timeout: Duration,
    ) -> WaitTimeoutResult {
        drop(guard.guard.take());
        loom::thread::yield_now();
        guard.guard = Some(guard.lock.raw_lock());
        WaitTimeoutResult(true)
    }

    /// Wakes every waiter.
    pub(crate) fn notify_all(&self) {
        self.inner.notify_all();
    }

    /// Wakes one waiter.
    pub(crate) fn notify_one(&self) {
        self.inner.notify_one();
    }
}

/// A reader-writer lock whose `read` and `write` return guards directly.
#[derive(Debug)]
pub(crate) struct RwLock<T> {
    inner: loom::sync::RwLock<T>,
}

/// Shared access to an [`RwLock`].
pub(crate) struct RwLockReadGuard<'a, T> {
    inner: loom::sync::RwLockReadGuard<'a, T>,
}

impl<T> RwLock<T> {
    /// A new unlocked lock.
    pub(crate) fn new(value: T) -> Self {
        Self {
            inner: loom::sync::RwLock::new(value),
        }
    }

    /// Blocks until shared access is held.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
        RwLockReadGuard {
            inner: self.inner.read().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Blocks until exclusive access is held.
    pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Deref for RwLockReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<'a, T: 'a> RwLockReadGuard<'a, T> {
    /// Narrows the guard to a part of the data, or gives it back if `f`
    /// finds none. `f` is re-applied on every dereference, so it must be a
    /// pure projection (such as `Option::as_ref`).
    pub(crate) fn try_map<U, F>(guard: Self, f: F) -> Result<MappedRwLockReadGuard<'a, U>, Self>
    where
        U: ?Sized + 'a,
        F: Fn(&T) -> Option<&U> + 'a,
    {
        if f(&guard).is_none() {
            return Err(guard);
        }
        Ok(MappedRwLockReadGuard {
            inner: Box::new(Mapped {
                guard,
                f,
                _target: PhantomData,
            }),
        })
    }
}

/// A read guard narrowed by [`RwLockReadGuard::try_map`].
pub(crate) struct MappedRwLockReadGuard<'a, U: ?Sized> {
    inner: Box<dyn Deref<Target = U> + 'a>,
}

impl<U: ?Sized> Deref for MappedRwLockReadGuard<'_, U> {
    type Target = U;

    fn deref(&self) -> &U {
        &self.inner
    }
}

/// A read guard and the projection `try_map` checked.
struct Mapped<'a, T, U: ?Sized, F> {
    guard: RwLockReadGuard<'a, T>,
    f: F,
    _target: PhantomData<fn(&U)>,
}

impl<T, U: ?Sized, F> Deref for Mapped<'_, T, U, F>
where
    F: Fn(&T) -> Option<&U>,
{
    type Target = U;

    fn deref(&self) -> &U {
        (self.f)(&self.guard).expect("try_map checked the projection")
    }
}

/// The sending half of [`bounded`].
pub(crate) struct Sender<T> {
    chan: Arc<Chan<T>>,
}

/// The receiving half of [`bounded`].
pub(crate) struct Receiver<T> {
    chan: Arc<Chan<T>>,
}

struct Chan<T> {
    state: Mutex<ChanState<T>>,
    ready: Condvar,
    cap: usize,
}

struct ChanState<T> {
    queue: VecDeque<T>,
    senders: usize,
    receivers: usize,
}

/// Why [`Sender::try_send`] failed; the message comes back.
#[derive(Debug)]
#[allow(dead_code)] // as crossbeam's; the committer's kick ignores the message.
pub(crate) enum TrySendError<T> {
    /// The channel holds `cap` messages already.
    Full(T),
    /// Every receiver is gone.
    Disconnected(T),
}

/// [`Receiver::recv`] failed: every sender is gone and the channel is empty.
#[derive(Debug)]
pub(crate) struct RecvError;

/// Why [`Receiver::recv_timeout`] returned without a message.
#[derive(Debug)]
pub(crate) enum RecvTimeoutError {
    /// The (modelled) timeout fired first.
    Timeout,
    /// Every sender is gone and the channel is empty.
    Disconnected,
}

/// A channel holding at most `cap` messages (`cap` > 0).
pub(crate) fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    debug_assert!(cap > 0, "the loom channel has no rendezvous mode");
    let chan = Arc::new(Chan {
        state: Mutex::new(ChanState {
            queue: VecDeque::with_capacity(cap),
            senders: 1,
            receivers: 1,
        }),
        ready: Condvar::new(),
        cap,
    });
    (
        Sender {
            chan: Arc::clone(&chan),
        },
        Receiver { chan },
    )
}

impl<T> Sender<T> {
    /// Queues `msg` unless the channel is full or has no receiver.
    pub(crate) fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        let mut s = self.chan.state.lock();
        if s.receivers == 0 {
            return Err(TrySendError::Disconnected(msg));
        }
        if s.queue.len() >= self.chan.cap {
            return Err(TrySendError::Full(msg));
        }
        s.queue.push_back(msg);
        drop(s);
        self.chan.ready.notify_all();
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.chan.state.lock().senders += 1;
        Self {
            chan: Arc::clone(&self.chan),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return; // see `Receiver`'s `Drop`
        }
        let mut s = self.chan.state.lock();
        s.senders -= 1;
        if s.senders == 0 {
            drop(s);
            self.chan.ready.notify_all();
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // A failed model unwinds every thread; a loom lock taken in a
        // destructor then panics again, and the double panic aborts the test
        // binary instead of reporting the failure.
        if std::thread::panicking() {
            return;
        }
        self.chan.state.lock().receivers -= 1;
    }
}

impl<T> Receiver<T> {
    /// Blocks until a message arrives or every sender is gone.
    pub(crate) fn recv(&self) -> Result<T, RecvError> {
        let mut s = self.chan.state.lock();
        loop {
            if let Some(msg) = s.queue.pop_front() {
                return Ok(msg);
            }
            if s.senders == 0 {
                return Err(RecvError);
            }
            self.chan.ready.wait(&mut s);
        }
    }

    /// As [`recv`](Self::recv), but the wait may time out at any scheduling
    /// point (see the module docs).
    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        let mut s = self.chan.state.lock();
        if s.queue.is_empty() && s.senders > 0 {
            self.chan.ready.wait_for(&mut s, timeout);
        }
        if let Some(msg) = s.queue.pop_front() {
            return Ok(msg);
        }
        if s.senders == 0 {
            return Err(RecvTimeoutError::Disconnected);
        }
        Err(RecvTimeoutError::Timeout)
    }
}

/// A futex word, as `crate::sync::Futex`: a loom atomic, with a loom mutex
/// and condition variable for the sleeping. The word is read under the
/// mutex before sleeping and changed before the mutex is taken to wake, so,
/// as with a real futex, a change between a caller's check and its sleep is
/// never missed.
pub(crate) struct Futex {
    word: AtomicU32,
    lock: loom::sync::Mutex<()>,
    wake: loom::sync::Condvar,
}

impl Default for Futex {
    fn default() -> Self {
        Futex {
            word: AtomicU32::new(0),
            lock: loom::sync::Mutex::new(()),
            wake: loom::sync::Condvar::new(),
        }
    }
}

impl Futex {
    /// The current value.
    pub(crate) fn load(&self) -> u32 {
        self.word.load(Ordering::Acquire)
    }

    /// Sleeps unless the word has changed from `seen`.
    pub(crate) fn wait(&self, seen: u32) {
        let guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        if self.word.load(Ordering::Acquire) == seen {
            drop(
                self.wake
                    .wait(guard)
                    .unwrap_or_else(PoisonError::into_inner),
            );
        }
    }

    /// Changes the word and wakes every sleeper.
    pub(crate) fn wake_all(&self) {
        self.word.fetch_add(1, Ordering::Release);
        drop(self.lock.lock().unwrap_or_else(PoisonError::into_inner));
        self.wake.notify_all();
    }
}
