//! The `metrics` bridge (feature `metrics`): the store's [`Stats`] as
//! counters and gauges of the `metrics` facade, and histograms of what
//! each commit and batch call carried. Every series has the label
//! `store` (the builder's `metrics_label`). The names, units and what a
//! restart does to each are in `docs/features.md`.
//!
//! Counters and gauges are published from `Stats` on every tick of the
//! background evictor and on [`Store::publish_metrics`]: counters as the
//! increase since the last publication (so a reopened store in the same
//! process keeps adding to the same series), gauges as set. Histograms
//! are recorded as the events happen: nothing on the hot path but the
//! facade's call, a no-op while no recorder is installed.

use std::time::Duration;

use ::metrics::{
    SharedString, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge,
    histogram,
};

use crate::engine::Engine;
use crate::sync::{Arc, Mutex};
use crate::{Stats, Store};

/// A counter: name, description, the `Stats` field.
type CounterDef = (&'static str, &'static str, fn(&Stats) -> u64);
/// A gauge: name, unit, description, the `Stats` field.
type GaugeDef = (&'static str, Unit, &'static str, fn(&Stats) -> f64);

/// The counters.
const COUNTERS: &[CounterDef] = &[
    ("dedupkv_new_keys_total", "keys recorded as new", |s| {
        s.new_keys
    }),
    ("dedupkv_duplicates_total", "inserts answered seen", |s| {
        s.duplicates
    }),
    ("dedupkv_started_total", "claims started", |s| s.started),
    (
        "dedupkv_replays_total",
        "begins answered from a finished record",
        |s| s.replays,
    ),
    (
        "dedupkv_in_progress_total",
        "begins answered in progress",
        |s| s.in_progress,
    ),
    ("dedupkv_completed_total", "claims completed", |s| {
        s.completed
    }),
    ("dedupkv_failed_total", "claims failed permanently", |s| {
        s.failed
    }),
    (
        "dedupkv_released_total",
        "claims released for a retry",
        |s| s.released,
    ),
    (
        "dedupkv_conflicts_total",
        "begins refused for a fingerprint mismatch",
        |s| s.conflicts,
    ),
    (
        "dedupkv_claims_lost_total",
        "finishes refused: the claim was lost",
        |s| s.fenced,
    ),
    (
        "dedupkv_stale_total",
        "entity updates answered stale",
        |s| s.versions_stale,
    ),
    (
        "dedupkv_takeovers_total",
        "claims taken over from an attempt that never answered",
        |s| s.takeovers,
    ),
    (
        "dedupkv_interrupted_total",
        "claims started interrupted",
        |s| s.interrupted,
    ),
    (
        "dedupkv_dead_lettered_total",
        "operations moved to the dead-letter area",
        |s| s.dead_lettered,
    ),
    (
        "dedupkv_evicted_keys_total",
        "keys removed by eviction",
        |s| s.evicted_keys,
    ),
    (
        "dedupkv_early_evicted_buckets_total",
        "buckets evicted before they expired (the window shrank)",
        |s| s.early_evicted_buckets,
    ),
    (
        "dedupkv_clock_behind_total",
        "clock readings behind the store's time",
        |s| s.clock_behind,
    ),
    ("dedupkv_commits_total", "durable commits", |s| s.commits),
    (
        "dedupkv_seq_parked_total",
        "early events parked by the sequencer",
        |s| s.seq_parked,
    ),
    (
        "dedupkv_seq_held_total",
        "parked events moved to the holding area",
        |s| s.seq_held,
    ),
];

/// The gauges.
#[allow(clippy::cast_precision_loss)] // gauges are f64 in the facade
const GAUGES: &[GaugeDef] = &[
    ("dedupkv_keys", Unit::Count, "keys held in the index", |s| {
        s.keys as f64
    }),
    (
        "dedupkv_effective_window_seconds",
        Unit::Seconds,
        "how far back the store remembers",
        |s| s.effective_window.as_secs_f64(),
    ),
    (
        "dedupkv_oldest_dead_letter_seconds",
        Unit::Seconds,
        "age of the oldest dead letter (0: none)",
        |s| s.oldest_dead_letter.map_or(0.0, |d| d.as_secs_f64()),
    ),
    (
        "dedupkv_dead_letters",
        Unit::Count,
        "operations in the dead-letter area",
        |s| s.dead_letters_now as f64,
    ),
    (
        "dedupkv_stranded_claims",
        Unit::Count,
        "lapsed claims nobody finished",
        |s| s.stranded_claims as f64,
    ),
    (
        "dedupkv_intents_pending",
        Unit::Count,
        "intents nobody marked answered",
        |s| s.intents_pending as f64,
    ),
    (
        "dedupkv_parked_events",
        Unit::Count,
        "events parked by the sequencer",
        |s| s.parked_now as f64,
    ),
    (
        "dedupkv_held_events",
        Unit::Count,
        "events in the holding area",
        |s| s.held_now as f64,
    ),
    (
        "dedupkv_unacked_events",
        Unit::Count,
        "handed-back events not acknowledged",
        |s| s.unacked_now as f64,
    ),
    (
        "dedupkv_waiting",
        Unit::Count,
        "callers waiting for an in-flight result",
        |s| s.waiting as f64,
    ),
    (
        "dedupkv_reconcile_keys",
        Unit::Count,
        "completed keys the reconciliation windows hold",
        |s| s.reconcile_keys as f64,
    ),
    (
        "dedupkv_reconcile_bytes",
        Unit::Bytes,
        "heap bytes the reconciliation windows hold",
        |s| s.reconcile_bytes as f64,
    ),
];

const COMMIT_SECONDS: &str = "dedupkv_commit_duration_seconds";
const COMMIT_RECORDS: &str = "dedupkv_commit_records";
const BATCH_SIZE: &str = "dedupkv_batch_size";

/// A replica gauge: name, unit, description, the status field.
#[cfg(feature = "replica")]
type ReplicaGaugeDef = (
    &'static str,
    Unit,
    &'static str,
    fn(&crate::replica::ReplicaStatus) -> f64,
);

/// The replica's gauges (feature "replica"), from its status.
#[cfg(feature = "replica")]
#[allow(clippy::cast_precision_loss)] // gauges are f64 in the facade
const REPLICA_GAUGES: &[ReplicaGaugeDef] = &[
    (
        "dedupkv_replica_epoch",
        Unit::Count,
        "the ownership epoch this store holds",
        |r| r.epoch as f64,
    ),
    (
        "dedupkv_replica_lag_seconds",
        Unit::Seconds,
        "how long the oldest commit not shipped yet has waited",
        |r| r.lag.as_secs_f64(),
    ),
    (
        "dedupkv_replica_lag_bytes",
        Unit::Bytes,
        "bytes of commits not shipped yet",
        |r| r.lag_bytes as f64,
    ),
    (
        "dedupkv_replica_upload_failures",
        Unit::Count,
        "uploads that failed and were retried, since the open",
        |r| r.upload_failures as f64,
    ),
    (
        "dedupkv_replica_fenced",
        Unit::Count,
        "1 once a later owner fenced this one (every call fails)",
        |r| f64::from(u8::from(r.fenced)),
    ),
];

/// One store's bridge: its label and what was last published.
pub(crate) struct Bridge {
    label: SharedString,
    last: Mutex<Stats>,
    /// The replica's uploader, once the store has one.
    #[cfg(feature = "replica")]
    replica: std::sync::OnceLock<crate::sync::Weak<crate::replica::uploader::Uploader>>,
}

impl Bridge {
    /// Describes the series and starts recording `engine`'s commits and
    /// publishing its counters on every eviction tick.
    pub(crate) fn install(engine: &Arc<Engine>) -> Arc<Bridge> {
        let bridge = Arc::new(Bridge {
            label: SharedString::from_owned(engine.config().metrics_label.clone()),
            last: Mutex::new(Stats::default()),
            #[cfg(feature = "replica")]
            replica: std::sync::OnceLock::new(),
        });
        for (name, help, _) in COUNTERS {
            describe_counter!(*name, Unit::Count, *help);
        }
        for (name, unit, help, _) in GAUGES {
            describe_gauge!(*name, *unit, *help);
        }
        describe_histogram!(
            COMMIT_SECONDS,
            Unit::Seconds,
            "latency of one durable commit"
        );
        describe_histogram!(COMMIT_RECORDS, Unit::Count, "callers' records per commit");
        describe_histogram!(BATCH_SIZE, Unit::Count, "items per batch call");
        let label = bridge.label.clone();
        engine.observe_commits(Box::new(move |took: Duration, records: u64| {
            histogram!(COMMIT_SECONDS, "store" => label.clone()).record(took.as_secs_f64());
            #[allow(clippy::cast_precision_loss)]
            histogram!(COMMIT_RECORDS, "store" => label.clone()).record(records as f64);
        }));
        let b = Arc::downgrade(&bridge);
        engine.on_tick(Box::new(move |e: &Engine| {
            if let Some(b) = b.upgrade() {
                b.publish(&e.stats());
            }
        }));
        bridge
    }

    /// Publishes `now`: counters by their increase since the last call,
    /// gauges as they are.
    pub(crate) fn publish(&self, now: &Stats) {
        let mut last = self.last.lock();
        for (name, _, field) in COUNTERS {
            let grew = field(now).saturating_sub(field(&last));
            if grew > 0 {
                counter!(*name, "store" => self.label.clone()).increment(grew);
            }
        }
        for (name, _, _, field) in GAUGES {
            gauge!(*name, "store" => self.label.clone()).set(field(now));
        }
        #[cfg(feature = "replica")]
        if let Some(up) = self.replica.get().and_then(crate::sync::Weak::upgrade) {
            let status = up.status();
            for (name, _, _, field) in REPLICA_GAUGES {
                gauge!(*name, "store" => self.label.clone()).set(field(&status));
            }
        }
        *last = *now;
    }

    /// Publishes the replica's gauges too, from now on.
    #[cfg(feature = "replica")]
    pub(crate) fn watch_replica(&self, up: &Arc<crate::replica::uploader::Uploader>) {
        for (name, unit, help, _) in REPLICA_GAUGES {
            describe_gauge!(*name, *unit, *help);
        }
        let _ = self.replica.set(Arc::downgrade(up));
    }

    /// Records the size of a batch call.
    pub(crate) fn batch(&self, call: &'static str, items: usize) {
        #[allow(clippy::cast_precision_loss)]
        histogram!(BATCH_SIZE, "store" => self.label.clone(), "call" => call).record(items as f64);
    }
}

/// A partition set's assigned partitions (gauge).
#[cfg(feature = "replica")]
const PARTITIONS_ASSIGNED: &str = "dedupkv_partitions_assigned";
/// How long a partition set's assigns took (histogram).
#[cfg(feature = "replica")]
const PARTITION_ASSIGN_SECONDS: &str = "dedupkv_partition_assign_duration_seconds";
/// How long a partition set's revokes took (histogram).
#[cfg(feature = "replica")]
const PARTITION_REVOKE_SECONDS: &str = "dedupkv_partition_revoke_duration_seconds";

/// A partition set's assign (`revoke: false`) or revoke that took `took`
/// and ended `ok` or not, leaving `assigned` partitions: published under
/// the label `set` (the set's base directory).
#[cfg(feature = "replica")]
pub(crate) fn partition_change(
    base: &std::path::Path,
    revoke: bool,
    (took, ok): (Duration, bool),
    assigned: usize,
) {
    describe_gauge!(
        PARTITIONS_ASSIGNED,
        Unit::Count,
        "partitions assigned to the set"
    );
    describe_histogram!(
        PARTITION_ASSIGN_SECONDS,
        Unit::Seconds,
        "duration of a partition's assign"
    );
    describe_histogram!(
        PARTITION_REVOKE_SECONDS,
        Unit::Seconds,
        "duration of a partition's revoke"
    );
    let set = SharedString::from_owned(base.display().to_string());
    let outcome = if ok { "ok" } else { "error" };
    let name = if revoke {
        PARTITION_REVOKE_SECONDS
    } else {
        PARTITION_ASSIGN_SECONDS
    };
    histogram!(name, "set" => set.clone(), "outcome" => outcome).record(took.as_secs_f64());
    #[allow(clippy::cast_precision_loss)]
    gauge!(PARTITIONS_ASSIGNED, "set" => set).set(assigned as f64);
}

#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
impl Store {
    /// Publishes the store's counters and gauges to the `metrics` recorder
    /// now (feature `metrics`). The background evictor does this on every
    /// tick; call it yourself with `background_eviction(false)`, or before
    /// a scrape that must see the latest numbers. The same numbers, without
    /// a recorder, are in [`stats`](Self::stats).
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::builder()
    ///     .metrics_label("orders")
    ///     .open(dir.path().join("s.redb"))?;
    /// store.publish_metrics(); // a no-op until a recorder is installed
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn publish_metrics(&self) {
        if let Some(m) = self.metrics() {
            m.publish(&self.stats());
        }
    }
}
