//! Durability that can be awaited as well as waited on.
//!
//! A blocking caller sleeps on the commit futex ([`Log::wait_durable`](super::Log::wait_durable)).
//! An async caller instead runs its call in a *deferring scope*
//! ([`deferring`]): on this thread, for the length of the call, the waits
//! an answer needs (its own records, and the records it was answered from)
//! are noted instead of waited for; the caller then awaits the noted row
//! through [`Log::poll_durable`](super::Log::poll_durable), whose waker sits in [`Wakers`] until the
//! commit that covers the row wakes it.
//!
//! Invariants:
//! - a deferring scope only changes *when* the caller is told, never what
//!   is recorded or in which order: the answer is withheld until the
//!   noted row is durable, which covers every record the call appended
//!   (rows of later appends are never smaller);
//! - a call that must read a row before it is durable (a replay of a
//!   record still in the open batch) blocks as before — unless nothing was
//!   appended yet in the scope and the caller can run the call again
//!   ([`Scope::Retry`]): then the read fails with `WouldBlock`, the row is
//!   noted as [`Deferred::unreadable`], and the caller awaits it and runs
//!   the call again, which is the same call, since nothing was recorded;
//! - a waker is registered before the durable row is checked again, and a
//!   commit publishes the durable row before it takes the list: a commit
//!   that covers the row either sees the waker or is seen by the check.
//!
//! Outside a scope (every blocking call) each hook is one thread-local
//! read, and a commit takes one uncontended lock to see the list empty.
//! Without the `async` feature nothing opens a scope or registers a waker.
#![cfg_attr(not(feature = "async"), allow(dead_code))]

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::task::Waker;

use crate::sync::{Arc, Mutex};

/// What a deferring scope noted.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Deferred {
    /// The newest row an answer given in the scope rests on (0: none):
    /// await it before acting on the answer.
    pub(crate) row: u64,
    /// The call could not read this row yet and recorded nothing: await
    /// it, then run the call again.
    pub(crate) unreadable: Option<u64>,
    /// Something was appended to the batch in the scope.
    appended: bool,
}

/// How a scope treats a read of a row that is not durable yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The caller can run the call again: fail the read if nothing was
    /// appended yet (see the module's invariants).
    Retry,
    /// The call runs once: a read blocks until its row is durable.
    Once,
}

#[derive(Clone, Copy)]
struct Active {
    noted: Deferred,
    scope: Scope,
}

thread_local! {
    static SCOPE: Cell<Option<Active>> = const { Cell::new(None) };
}

/// Puts back the scope that was active before (none, or an outer one).
struct Restore(Option<Active>);

impl Drop for Restore {
    fn drop(&mut self) {
        SCOPE.with(|s| s.set(self.0));
    }
}

/// Runs `f` in a deferring scope on this thread; returns its result and
/// what it noted. A scope inside another is its own (the outer one is
/// restored after, also if `f` panics).
pub(crate) fn deferring<T>(scope: Scope, f: impl FnOnce() -> T) -> (T, Deferred) {
    let restore = Restore(SCOPE.with(|s| {
        s.replace(Some(Active {
            noted: Deferred::default(),
            scope,
        }))
    }));
    let out = f();
    let noted = SCOPE.with(Cell::get).map(|a| a.noted).unwrap_or_default();
    drop(restore);
    (out, noted)
}

/// Runs `f` with no deferring scope, even inside one: for work whose waits
/// must really happen in order (eviction deletes tables only after what it
/// carried out of them is durable).
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    let _restore = Restore(SCOPE.with(|s| s.replace(None)));
    f()
}

/// Applies `change` to the active scope, if there is one; returns whether
/// there was one.
#[inline]
fn with_scope(change: impl FnOnce(&mut Active)) -> bool {
    SCOPE.with(|s| match s.get() {
        None => false,
        Some(mut a) => {
            change(&mut a);
            s.set(Some(a));
            true
        }
    })
}

/// Inside a scope, notes that an answer rests on `row` and returns `true`
/// (the caller does not wait); outside, `false`.
#[inline]
pub(crate) fn defer_answer(row: u64) -> bool {
    with_scope(|a| a.noted.row = a.noted.row.max(row))
}

/// Notes that the call appends to the batch (a later read blocks).
#[inline]
pub(crate) fn note_append() {
    with_scope(|a| a.noted.appended = true);
}

/// Inside a [`Scope::Retry`] scope in which nothing was appended, notes
/// `row` as unreadable and returns `true` (the read fails, the caller
/// runs the call again once the row is durable); otherwise `false` (the
/// read waits).
#[inline]
pub(crate) fn defer_read(row: u64) -> bool {
    let mut deferred = false;
    with_scope(|a| {
        if a.scope == Scope::Retry && !a.noted.appended && a.noted.unreadable.is_none() {
            a.noted.unreadable = Some(row);
            deferred = true;
        }
    });
    deferred
}

/// One awaiting caller: the row it waits for and its task's waker.
pub(crate) struct Waiting {
    row: u64,
    waker: Mutex<Option<Waker>>,
    /// In its list (changed under the list's lock): a caller woken and
    /// taken off the list that finds its row still not there registers
    /// again, and must be listed again to be woken again.
    listed: std::sync::atomic::AtomicBool,
}

/// The wakers of async callers waiting for rows to become durable.
///
/// `len` mirrors the list's length so a commit with nobody awaiting skips
/// the lock. It is std's atomic, not the model checker's: the loom models
/// run blocking callers only, and this keeps the commit path they explore
/// as it was. A `SeqCst` fence on each side (after a waker is counted,
/// before its caller checks the durable row again; after a commit
/// publishes the durable row, before it reads the count) forbids both
/// sides missing each other.
#[derive(Default)]
pub(crate) struct Wakers {
    list: Mutex<Vec<Arc<Waiting>>>,
    len: AtomicUsize,
}

impl Wakers {
    /// Registers (or refreshes) the waker of the caller waiting for `row`;
    /// the caller then checks the durable row again.
    pub(crate) fn register(&self, slot: &mut Option<Arc<Waiting>>, row: u64, waker: &Waker) {
        if let Some(w) = slot {
            {
                let mut held = w.waker.lock();
                if !held.as_ref().is_some_and(|h| h.will_wake(waker)) {
                    *held = Some(waker.clone());
                }
            }
            // Woken (and so taken off the list) by a row below its own —
            // a replica's acknowledgement ahead of the durable row — it
            // goes back on, or nothing would wake it again.
            if !w.listed.load(Ordering::Acquire) {
                let mut list = self.list.lock();
                if !w.listed.swap(true, Ordering::AcqRel) {
                    list.push(Arc::clone(w));
                    self.len.store(list.len(), Ordering::Relaxed);
                }
            }
        } else {
            let w = Arc::new(Waiting {
                row,
                waker: Mutex::new(Some(waker.clone())),
                listed: std::sync::atomic::AtomicBool::new(true),
            });
            let mut list = self.list.lock();
            list.push(Arc::clone(&w));
            self.len.store(list.len(), Ordering::Relaxed);
            drop(list);
            *slot = Some(w);
        }
        fence(Ordering::SeqCst);
    }

    /// Forgets a caller that stopped waiting (its future was dropped).
    pub(crate) fn remove(&self, w: &Arc<Waiting>) {
        let mut list = self.list.lock();
        list.retain(|x| !Arc::ptr_eq(x, w));
        w.listed.store(false, Ordering::Release);
        self.len.store(list.len(), Ordering::Relaxed);
    }

    /// Wakes every caller waiting for a row at or below `durable`.
    /// The commit published `durable` before this call.
    pub(crate) fn wake_through(&self, durable: u64) {
        fence(Ordering::SeqCst);
        if self.len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut woken = Vec::new();
        {
            let mut list = self.list.lock();
            list.retain(|w| {
                if w.row <= durable {
                    w.listed.store(false, Ordering::Release);
                    woken.push(Arc::clone(w));
                    false
                } else {
                    true
                }
            });
            self.len.store(list.len(), Ordering::Relaxed);
        }
        wake(woken);
    }

    /// Wakes every caller (the log is poisoned: nothing more becomes durable).
    pub(crate) fn wake_all(&self) {
        let woken = {
            let mut list = self.list.lock();
            self.len.store(0, Ordering::Relaxed);
            for w in list.iter() {
                w.listed.store(false, Ordering::Release);
            }
            std::mem::take(&mut *list)
        };
        wake(woken);
    }
}

fn wake(woken: Vec<Arc<Waiting>>) {
    for w in woken {
        let waker = w.waker.lock().take();
        if let Some(k) = waker {
            k.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_caller_woken_early_that_registers_again_is_woken_again() {
        let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let wakers = Wakers::default();
        let mut slot = None;
        wakers.register(&mut slot, 5, &waker);
        // A replica's acknowledgement wakes it before the durable row
        // says 5: its future finds itself not ready and registers again.
        wakers.wake_through(5);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        wakers.register(&mut slot, 5, &waker);
        wakers.wake_through(5);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            2,
            "the second wake is not lost"
        );
        // Removed when its future drops, it stays off the list.
        wakers.register(&mut slot, 5, &waker);
        if let Some(w) = &slot {
            wakers.remove(w);
        }
        wakers.wake_through(5);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(wakers.len.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_scope_notes_the_newest_row_and_restores_the_outer_one() {
        let ((), outer) = deferring(Scope::Retry, || {
            assert!(defer_answer(4));
            let ((), inner) = deferring(Scope::Once, || {
                assert!(defer_answer(9));
                note_append();
                assert!(!defer_read(9), "a Once scope blocks on reads");
            });
            assert_eq!(inner.row, 9);
            assert!(defer_answer(2));
            assert!(defer_read(5), "nothing appended in the outer scope yet");
            assert!(!defer_read(6), "only the first unreadable row is noted");
        });
        assert_eq!((outer.row, outer.unreadable), (4, Some(5)));
        assert!(!defer_answer(1), "no scope outside");
    }

    #[test]
    fn a_read_after_an_append_blocks() {
        let (read, noted) = deferring(Scope::Retry, || {
            note_append();
            defer_read(3)
        });
        assert!(!read);
        assert_eq!(noted.unreadable, None);
    }

    #[test]
    fn blocking_suspends_the_scope() {
        let (inside, _) = deferring(Scope::Retry, || blocking(|| defer_answer(1)));
        assert!(!inside);
    }
}
