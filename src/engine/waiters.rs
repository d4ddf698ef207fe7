//! Waiting for an in-flight result: callers that were told `InProgress`
//! wait, per key, for the claim to finish (complete, fail, release, dead
//! letter, dropped) or its lease to lapse, then `begin` again.
//!
//! Invariants:
//! - a key has an entry only while somebody waits on it: keys nobody
//!   waits on cost nothing, and a finished claim costs one load of
//!   [`KeyWaiters::keys`] when nobody waits anywhere;
//! - a waiter joins *before* the `begin` it then decides on, and reads the
//!   entry's generation before that `begin`; a finish bumps the
//!   generation after its record is appended under the shard lock. Either
//!   the `begin` sees the finish, or the finish (which took the shard lock
//!   after that `begin` released it) sees the waiter and bumps the
//!   generation, and the wait returns at once. No wake-up is missed, and
//!   nobody polls;
//! - one bump wakes each waiter of the key once (one condvar broadcast for
//!   the blocking ones, one `wake` per async one);
//! - a lease lapses by the store's time, which nothing announces: a
//!   waiter sleeps at most until the lease end it was told, and a pass of
//!   [`Engine::wake_lapsed`] (every eviction tick, and every
//!   `Store::evict_expired`, which a caller driving a manual clock calls)
//!   wakes the waiters of keys whose lease has lapsed by then;
//! - a poisoned log (a failed commit, or the replica's fence) wakes every
//!   waiter of every key at once ([`KeyWaiters::wake_all`], the log's
//!   poison hook): the poison is set before the wake, and a waiter's
//!   `begin` checks it, so each waiter answers the poison (such as
//!   `Fenced`) instead of sleeping out the lease.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;
#[cfg(feature = "async")]
use std::task::{Context, Poll};
use std::time::Duration;

use super::Engine;
use crate::key::KeyHash;
use crate::sync::{Arc, Condvar, Mutex};
use crate::{Key, Result};

/// The keys somebody waits on now.
///
/// `keys` is std's atomic and read `Relaxed`: the shard lock orders a
/// waiter's join before a finish that its `begin` did not see (see the
/// module's invariants), so no stronger ordering is needed.
#[derive(Default)]
pub(crate) struct KeyWaiters {
    keys: AtomicUsize,
    map: Mutex<HashMap<KeyHash, Arc<Waited>>>,
}

/// One waited-on key.
#[derive(Default)]
pub(crate) struct Waited {
    state: Mutex<WaitState>,
    changed: Condvar,
}

#[derive(Default)]
struct WaitState {
    /// Bumped by every finish of the key's claim (and lapse pass).
    generation: u64,
    /// Callers waiting on the key.
    waiters: usize,
    /// Of them, blocking callers asleep now.
    sleeping: usize,
    /// The latest lease end a waiter was told (ms): a lapse pass wakes
    /// the key once the store's time reaches it.
    lease_until: u64,
    /// Async waiters' wakers, by waiter id.
    wakers: Vec<(u64, Waker)>,
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    next_id: u64,
}

impl KeyWaiters {
    /// Callers asleep now, waiting for a finish, a lapse or their timeout
    /// (for `Stats`).
    pub(crate) fn waiting(&self) -> u64 {
        if self.keys.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.map
            .lock()
            .values()
            .map(|w| {
                let st = w.state.lock();
                (st.sleeping + st.wakers.len()) as u64
            })
            .sum()
    }

    /// Wakes the waiters of key `h`, if any: its claim finished.
    #[inline]
    pub(crate) fn notify(&self, h: KeyHash) {
        if self.keys.load(Ordering::Relaxed) == 0 {
            return;
        }
        let waited = self.map.lock().get(&h).cloned();
        if let Some(w) = waited {
            w.bump();
        }
    }

    /// Wakes the waiters of every key: the log is poisoned, so each
    /// waiter's next `begin` answers why.
    pub(crate) fn wake_all(&self) {
        let all: Vec<_> = self.map.lock().values().cloned().collect();
        for w in all {
            w.bump();
        }
    }

    fn join(&self, h: KeyHash) -> Arc<Waited> {
        let mut map = self.map.lock();
        let w = Arc::clone(map.entry(h).or_default());
        w.state.lock().waiters += 1;
        self.keys.store(map.len(), Ordering::Relaxed);
        w
    }

    fn leave(&self, h: KeyHash, w: &Arc<Waited>, id: Option<u64>) {
        let mut map = self.map.lock();
        let last = {
            let mut st = w.state.lock();
            st.waiters -= 1;
            if let Some(id) = id {
                st.wakers.retain(|(i, _)| *i != id);
            }
            st.waiters == 0
        };
        if last {
            map.remove(&h);
        }
        self.keys.store(map.len(), Ordering::Relaxed);
    }
}

impl Waited {
    fn bump(&self) {
        let wakers = {
            let mut st = self.state.lock();
            st.generation += 1;
            std::mem::take(&mut st.wakers)
        };
        self.changed.notify_all();
        for (_, w) in wakers {
            w.wake();
        }
    }
}

/// A caller waiting on one key: joined on creation, gone when dropped (a
/// cancelled async waiter leaves nothing behind).
pub(crate) struct KeyWaiter<'e> {
    engine: &'e Engine,
    h: KeyHash,
    waited: Arc<Waited>,
    /// This waiter's id among the key's async wakers, once it has one.
    id: Option<u64>,
}

impl Engine {
    /// Joins the waiters of `key`; `begin` again after this, then wait.
    pub(crate) fn wait_on(&self, key: &Key<'_>) -> Result<KeyWaiter<'_>> {
        self.check_key(key)?;
        let h = self.hash(key);
        Ok(KeyWaiter {
            engine: self,
            h,
            waited: self.waiters.join(h),
            id: None,
        })
    }

    /// Wakes the waiters of every key whose lease (as its waiters were
    /// told) has lapsed by the store's time now.
    pub(crate) fn wake_lapsed(&self) {
        if self.waiters.keys.load(Ordering::Relaxed) == 0 {
            return;
        }
        let now = self.now();
        let lapsed: Vec<_> = self
            .waiters
            .map
            .lock()
            .values()
            .filter(|w| w.state.lock().lease_until <= now)
            .cloned()
            .collect();
        for w in lapsed {
            w.bump();
        }
    }

    /// Callers asleep in `begin_or_wait` now.
    pub(crate) fn waiting(&self) -> u64 {
        self.waiters.waiting()
    }

    /// Wakes the waiters of key `h`: its claim was just finished.
    #[inline]
    pub(crate) fn notify_waiters(&self, h: KeyHash) {
        self.waiters.notify(h);
    }
}

impl KeyWaiter<'_> {
    /// The key's generation: read it before the `begin` that decides to
    /// wait, and pass it to the wait.
    pub(crate) fn generation(&self) -> u64 {
        self.waited.state.lock().generation
    }

    /// How long until a lease ending at `lease_until` (ms, the store's
    /// time) lapses, by the store's time now; noted for lapse passes.
    pub(crate) fn until_lapse(&self, lease_until: u64) -> Duration {
        {
            let mut st = self.waited.state.lock();
            st.lease_until = st.lease_until.max(lease_until);
        }
        Duration::from_millis(lease_until.saturating_sub(self.engine.now()))
    }

    /// Sleeps until the generation moves past `seen` or `at_most` passes.
    pub(crate) fn wait(&self, seen: u64, at_most: Duration) {
        let mut st = self.waited.state.lock();
        if st.generation == seen {
            st.sleeping += 1;
            self.waited.changed.wait_for(&mut st, at_most);
            st.sleeping -= 1;
        }
    }

    /// Ready once the generation moved past `seen`; otherwise registers
    /// the task's waker (replacing its earlier one).
    #[cfg(feature = "async")]
    pub(crate) fn poll_changed(&mut self, seen: u64, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.waited.state.lock();
        if st.generation != seen {
            return Poll::Ready(());
        }
        let id = if let Some(id) = self.id {
            id
        } else {
            st.next_id += 1;
            self.id = Some(st.next_id);
            st.next_id
        };
        match st.wakers.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) if w.will_wake(cx.waker()) => {}
            Some((_, w)) => w.clone_from(cx.waker()),
            None => st.wakers.push((id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for KeyWaiter<'_> {
    fn drop(&mut self) {
        self.engine.waiters.leave(self.h, &self.waited, self.id);
    }
}
