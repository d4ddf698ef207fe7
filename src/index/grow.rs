//! Background growth of shard tables.
//!
//! Growing a slot table moves every slot into a larger table (3/4 full):
//! spread over the inserts that fill the quarter, the largest single cost
//! of inserting into a growing store (figures in `docs/performance.md`).
//! An insert that takes a shard past [`PRE_GROW`](super::table) asks the
//! grower thread to grow it, which it does on the otherwise idle core,
//! well before an insert would have to grow the table itself (at 90 %). It
//! holds the shard's lock only to move the slots: the new table's pages
//! are faulted in before it takes the lock and the old table is freed
//! after it let go, so callers wait only for the move.
//!
//! Invariants:
//! - the grow queue's lock is a leaf: it is taken while a shard lock is
//!   held, never the other way round;
//! - a shard is queued at most once until the grower handled it
//!   (`Shard::grow_queued`), so the queue holds at most one entry per shard;
//! - growth changes where slots sit, never which keys are present: a
//!   [`Probe`](super::Probe) is only used under the lock it was made under.

use crate::sync::{Arc, Condvar, JoinHandle, Mutex, Weak};

#[derive(Default)]
struct Requests {
    shards: Vec<u32>,
    stop: bool,
}

/// Shards waiting to be grown.
#[derive(Default)]
pub(crate) struct GrowQueue {
    requests: Mutex<Requests>,
    wake: Condvar,
}

impl GrowQueue {
    /// Queues shard `i`. Called with that shard's lock held.
    pub(crate) fn request(&self, i: u32) {
        self.requests.lock().shards.push(i);
        self.wake.notify_one();
    }

    /// Waits for requests; `None` once stopped.
    fn next(&self) -> Option<Vec<u32>> {
        let mut r = self.requests.lock();
        loop {
            if r.stop {
                return None;
            }
            if !r.shards.is_empty() {
                return Some(std::mem::take(&mut r.shards));
            }
            self.wake.wait(&mut r);
        }
    }

    fn stop(&self) {
        self.requests.lock().stop = true;
        self.wake.notify_one();
    }
}

/// The grower thread; dropping it stops and joins the thread.
pub(crate) struct Grower {
    queue: Arc<GrowQueue>,
    thread: Option<JoinHandle<()>>,
}

impl Grower {
    /// Starts growing the shards of `index` that its inserts queue.
    pub(crate) fn start<T: Send + Sync + 'static>(
        owner: Weak<T>,
        index: fn(&T) -> &super::ShardedIndex,
    ) -> std::io::Result<Grower> {
        let Some(strong) = owner.upgrade() else {
            return Err(std::io::Error::other("the store is gone"));
        };
        let queue = index(&strong).grow_queue();
        drop(strong);
        let q = Arc::clone(&queue);
        let thread = crate::sync::spawn("dedupkv-grow", move || {
            while let Some(shards) = q.next() {
                let Some(owner) = owner.upgrade() else { return };
                for i in shards {
                    grow(index(&owner), i as usize);
                }
            }
        })?;
        Ok(Grower {
            queue,
            thread: Some(thread),
        })
    }
}

/// Grows shard `i` as it asked. The shard lock is held only to move the
/// slots: the new table is allocated (and its pages faulted in) before,
/// the old one freed after, so inserts into the shard wait for the move
/// alone.
fn grow(index: &super::ShardedIndex, i: usize) {
    // No capacity: grown by an insert meanwhile (or emptied). The second
    // lock still clears the request, so that the shard can ask again.
    // Its own statement: the guard is gone before the allocation.
    let cap = index.lock_shard(i).queued_growth_cap();
    let blank = cap.map_or_else(Vec::new, super::table::SlotTable::blank);
    let old = index.lock_shard(i).grow_if_queued(blank);
    drop(old);
}

impl Drop for Grower {
    fn drop(&mut self) {
        self.queue.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
