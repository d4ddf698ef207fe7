//! Per-shard operation counters: kept in the shard, so the hot path bumps
//! a cache line it already owns; summed into [`Stats`] on demand.

use crate::types::Stats;

/// Declares the per-shard counters once: the struct, summing two of them,
/// and copying them into the [`Stats`] fields of the same names.
macro_rules! counters {
    ($($name:ident),+ $(,)?) => {
        /// Per-shard operation counters (summed by
        /// [`Store::stats`](crate::Store::stats)).
        #[derive(Debug, Clone, Copy, Default)]
        pub(crate) struct Counters {
            $(pub $name: u64,)+
        }

        impl Counters {
            pub(crate) fn add(&mut self, o: &Counters) {
                $(self.$name += o.$name;)+
            }

            pub(crate) fn copy_into(&self, s: &mut Stats) {
                $(s.$name = self.$name;)+
            }
        }
    };
}

counters!(
    new_keys,
    duplicates,
    started,
    takeovers,
    interrupted,
    in_progress,
    completed,
    failed,
    released,
    conflicts,
    fenced,
    versions_applied,
    versions_stale,
    seq_delivered,
    seq_parked,
    seq_duplicates,
    seq_held,
    forgotten,
    dead_lettered,
);
