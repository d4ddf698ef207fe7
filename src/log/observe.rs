//! What commits cost, for `Stats` and for a metrics bridge: total time
//! spent committing and records committed, and an optional observer told
//! of each commit (the `metrics` feature's histograms). Nothing is
//! observed until an observer is set; the totals are two relaxed adds per
//! commit. std's atomics, not `crate::sync`'s: these totals steer nothing,
//! so the model checker need not follow them.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Told of each durable commit: how long it took and how many callers'
/// records it carried.
pub(crate) type CommitObserver = Box<dyn Fn(Duration, u64) + Send + Sync>;

#[derive(Default)]
pub(crate) struct CommitStats {
    nanos: AtomicU64,
    records: AtomicU64,
    observer: OnceLock<CommitObserver>,
}

impl CommitStats {
    /// Counts one durable commit.
    pub(crate) fn committed(&self, took: Duration, records: u64) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        self.records.fetch_add(records, Ordering::Relaxed);
        if let Some(observe) = self.observer.get() {
            observe(took, records);
        }
    }

    /// Time spent in durable commits since open.
    pub(crate) fn time(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Callers' records made durable since open.
    pub(crate) fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }

    /// Sets the observer (once: a second one is ignored).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn observe(&self, observer: CommitObserver) {
        let _ = self.observer.set(observer);
    }
}
