//! Store-wide counters (those not kept per shard) and the
//! [`Stats`] snapshot.

use std::time::Duration;

use super::Engine;
use crate::sync::{AtomicU64, Ordering};
use crate::types::Stats;

/// Store-wide counters that are not per shard.
#[derive(Default)]
pub(crate) struct StoreCounters {
    pub early_buckets: AtomicU64,
    pub evicted_keys: AtomicU64,
    pub clock_behind: AtomicU64,
    /// `begin` calls answered from a finished key's record.
    pub replays: AtomicU64,
    /// Batch calls, and the items in them.
    pub batch_calls: AtomicU64,
    pub batch_items: AtomicU64,
    /// Stranded claims at the last count (a warning marks each rise from 0).
    pub stranded: AtomicU64,
}

/// Called with the engine on every tick of the background evictor.
pub(crate) type TickHook = Box<dyn Fn(&Engine) + Send + Sync>;

impl Engine {
    /// Sets the hook called on every eviction tick (once: a second is
    /// ignored).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn on_tick(&self, hook: TickHook) {
        let _ = self.tick_hook.set(hook);
    }

    /// Runs the tick hook, if one is set.
    pub(crate) fn ticked(&self) {
        if let Some(hook) = self.tick_hook.get() {
            hook(self);
        }
    }

    /// Sets the observer told of every durable commit.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn observe_commits(&self, observer: super::CommitObserver) {
        self.log.observed().observe(observer);
    }

    /// Counts a batch call of `items` items.
    pub(crate) fn count_batch(&self, items: usize) {
        self.counters.batch_calls.fetch_add(1, Ordering::Relaxed);
        self.counters
            .batch_items
            .fetch_add(items as u64, Ordering::Relaxed);
    }

    /// Claims whose lease lapsed by `now` (or whose process is gone) that
    /// nobody finished or took over.
    fn stranded_count(&self, now: u64) -> u64 {
        let mut n = 0;
        for i in 0..self.cfg.shards {
            let shard = self.index.lock_shard(i);
            n += shard
                .pending_entries()
                .filter(|(p, state)| {
                    *state == Some(crate::index::SlotState::Claimed)
                        && (p.lease_until <= now || self.orphaned(p.token))
                })
                .count() as u64;
        }
        if n > 0 && self.counters.stranded.swap(n, Ordering::Relaxed) == 0 {
            tracing::warn!(
                stranded = n,
                "dedupkv: claims are stranded: their lease lapsed and nobody came back to \
                 finish them (Store::stranded_claims lists them)"
            );
        } else if n == 0 {
            self.counters.stranded.store(0, Ordering::Relaxed);
        }
        n
    }

    /// Counters and sizes, shard by shard.
    pub(crate) fn stats(&self) -> Stats {
        let (keys, bytes, counters) = self.index.usage();
        let mut s = Stats {
            keys: keys as u64,
            index_bytes: bytes as u64,
            commits: self.log.commits(),
            commit_time: self.log.observed().time(),
            records_committed: self.log.observed().records(),
            format: self.log.format(),
            ..Stats::default()
        };
        counters.copy_into(&mut s);
        let (keys, bytes) = self.tally_usage();
        (s.reconcile_keys, s.reconcile_bytes) = (keys as u64, bytes as u64);
        let now = self.now();
        let g = self.cfg.granularity_ms;
        let oldest = self.log.buckets().into_iter().find(|b| *b >= now / g);
        s.effective_window = oldest.map_or(Duration::from_millis(self.cfg.retention_ms), |b| {
            Duration::from_millis(
                now.saturating_add(self.cfg.retention_ms)
                    .saturating_sub(b.saturating_mul(g)),
            )
        });
        s.retention = Duration::from_millis(self.cfg.retention_ms);
        let [entities, parked, held, unacked] = self.index.entity_usage();
        s.entities = entities as u64;
        s.parked_now = parked as u64;
        s.held_now = held as u64;
        s.unacked_now = unacked as u64;
        s.evicted_keys = self.counters.evicted_keys.load(Ordering::Relaxed);
        s.early_evicted_buckets = self.counters.early_buckets.load(Ordering::Relaxed);
        s.clock_behind = self.counters.clock_behind.load(Ordering::Relaxed);
        s.replays = self.counters.replays.load(Ordering::Relaxed);
        s.intents_pending = self.pending_intent_count();
        s.waiting = self.waiting();
        s.stranded_claims = self.stranded_count(now);
        s.batch_calls = self.counters.batch_calls.load(Ordering::Relaxed);
        s.batch_items = self.counters.batch_items.load(Ordering::Relaxed);
        let (dead, oldest) = self.dead_letter_usage();
        s.dead_letters_now = dead;
        s.oldest_dead_letter = oldest.map(|at| Duration::from_millis(now.saturating_sub(at)));
        s
    }
}
