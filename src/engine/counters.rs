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
}

impl Engine {
    /// Counters and sizes, shard by shard.
    pub(crate) fn stats(&self) -> Stats {
        let (keys, bytes, counters) = self.index.usage();
        let mut s = Stats {
            keys: keys as u64,
            index_bytes: bytes as u64,
            commits: self.log.commits(),
            ..Stats::default()
        };
        counters.copy_into(&mut s);
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
        let (dead, oldest) = self.dead_letter_usage();
        s.dead_letters_now = dead;
        s.oldest_dead_letter = oldest.map(|at| Duration::from_millis(now.saturating_sub(at)));
        s
    }
}
