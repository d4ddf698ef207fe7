//! Durability that can be awaited as well as waited on.
//!
//! A blocking caller sleeps on the commit futex ([`Log::wait_durable`](super::Log::wait_durable)).
//! An async caller awaits the row its answer rests on (every call of the
//! contract returns it, never waiting itself) through
//! [`Log::poll_durable`](super::Log::poll_durable), whose waker sits in
//! [`Wakers`] until the commit that covers the row wakes it.
//!
//! Invariant: a waker is registered before the durable row is checked
//! again, and a commit publishes the durable row before it takes the list:
//! a commit that covers the row either sees the waker or is seen by the
//! check. A commit with nobody awaiting takes no lock (one atomic read).
//! Without the `async` feature nothing registers a waker.
#![cfg_attr(not(feature = "async"), allow(dead_code))]

use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::task::Waker;

use crate::sync::{Arc, Mutex};

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
}
