//! The `metrics` bridge: a test recorder sees the documented counters,
//! gauges and histograms move for a scripted sequence, with the same
//! numbers as `stats()`.

// A test recorder: counts are small integers (exact in f64, compared
// exactly), a poisoned lock is a failed test, and the script is one story.
#![allow(
    clippy::cast_precision_loss,
    clippy::float_cmp,
    clippy::too_many_lines,
    clippy::unwrap_used,
    clippy::many_single_char_names
)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dedupkv::{
    BeginOptions, Failure, Fingerprint, Intent, Key, ManualClock, Result, Sequenced, Store,
};
use dedupkv_testkit::{started, tempdir};
use metrics::{
    Counter, Gauge, Histogram, Key as MKey, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// Every series by `name{label=value,...}`: counters and gauges as their
/// value, histograms as their samples.
#[derive(Default)]
struct Series {
    values: HashMap<String, f64>,
    samples: HashMap<String, Vec<f64>>,
}

#[derive(Default, Clone)]
struct TestRecorder(Arc<Mutex<Series>>);

struct Handle(Arc<Mutex<Series>>, String);

impl metrics::CounterFn for Handle {
    fn increment(&self, v: u64) {
        *self
            .0
            .lock()
            .unwrap()
            .values
            .entry(self.1.clone())
            .or_default() += v as f64;
    }
    fn absolute(&self, v: u64) {
        self.0
            .lock()
            .unwrap()
            .values
            .insert(self.1.clone(), v as f64);
    }
}

impl metrics::GaugeFn for Handle {
    fn increment(&self, v: f64) {
        *self
            .0
            .lock()
            .unwrap()
            .values
            .entry(self.1.clone())
            .or_default() += v;
    }
    fn decrement(&self, v: f64) {
        *self
            .0
            .lock()
            .unwrap()
            .values
            .entry(self.1.clone())
            .or_default() -= v;
    }
    fn set(&self, v: f64) {
        self.0.lock().unwrap().values.insert(self.1.clone(), v);
    }
}

impl metrics::HistogramFn for Handle {
    fn record(&self, v: f64) {
        self.0
            .lock()
            .unwrap()
            .samples
            .entry(self.1.clone())
            .or_default()
            .push(v);
    }
}

fn name(key: &MKey) -> String {
    let mut labels: Vec<_> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &MKey, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Handle(Arc::clone(&self.0), name(key))))
    }
    fn register_gauge(&self, key: &MKey, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(Handle(Arc::clone(&self.0), name(key))))
    }
    fn register_histogram(&self, key: &MKey, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Handle(Arc::clone(&self.0), name(key))))
    }
}

fn recorder() -> &'static TestRecorder {
    static R: OnceLock<TestRecorder> = OnceLock::new();
    R.get_or_init(|| {
        let r = TestRecorder::default();
        metrics::set_global_recorder(r.clone()).expect("the only recorder");
        r
    })
}

fn value(series: &str) -> f64 {
    recorder()
        .0
        .lock()
        .unwrap()
        .values
        .get(series)
        .copied()
        .unwrap_or(-1.0)
}

fn samples(series: &str) -> Vec<f64> {
    recorder()
        .0
        .lock()
        .unwrap()
        .samples
        .get(series)
        .cloned()
        .unwrap_or_default()
}

const T0: u64 = 1_700_000_000_000;

#[test]
fn a_test_recorder_sees_the_documented_series_move() -> Result<()> {
    recorder();
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .background_eviction(false)
        .metrics_label("orders")
        .open(dir.path().join("s.redb"))?;
    let k = |id: &str| Key::new("t", id).into_owned();

    assert!(store.insert_if_absent(&k("a"))?); // new
    assert!(!store.insert_if_absent(&k("a"))?); // duplicate
    store.insert_batch(&[k("b"), k("c")])?; // 2 new, a batch of 2
    let c = started(store.begin(&k("x"), Fingerprint::NONE)?);
    store.complete(&c, b"ok")?;
    let _ = store.begin(&k("x"), Fingerprint::NONE)?; // replayed
    let y = started(store.begin(&k("y"), Fingerprint::NONE)?);
    let _ = store.begin(&k("y"), Fingerprint::NONE)?; // in progress
    assert!(store.begin(&k("y"), Fingerprint::of("other")).is_err()); // conflict
    let dl = started(store.begin(&k("dl"), Fingerprint::NONE)?);
    store.fail(
        &dl,
        Failure::Exhausted {
            reason: "gave up",
            payload: None,
        },
    )?; // dead letter
    assert!(store.complete(&dl, b"late").is_err()); // fenced
    let intent = Intent {
        target: "carrier",
        request: b"r",
    };
    let pending = started(store.begin_with_intent(
        &k("i"),
        Fingerprint::NONE,
        &BeginOptions::new(),
        intent,
    )?);
    assert!(matches!(
        store.sequence(&k("entity"), 2, b"e2")?,
        Sequenced::Parked
    ));
    // y's worker dies: its lease lapses (stranded), then a takeover.
    std::mem::forget(y);
    clock.advance(Duration::from_secs(31));
    store.publish_metrics();
    let s = store.stats();
    assert_eq!(s.stranded_claims, 2, "y, and i's claim, lapsed unfinished");
    assert_eq!(value("dedupkv_stranded_claims{store=orders}"), 2.0);
    let taken = started(store.begin(&k("y"), Fingerprint::NONE)?);
    assert!(taken.interrupted());
    store.complete(&taken, b"")?;
    store.publish_metrics();
    let s = store.stats();

    let l = "{store=orders}";
    for (series, want) in [
        ("dedupkv_new_keys_total", s.new_keys),
        ("dedupkv_duplicates_total", s.duplicates),
        ("dedupkv_replays_total", s.replays),
        ("dedupkv_in_progress_total", s.in_progress),
        ("dedupkv_conflicts_total", s.conflicts),
        ("dedupkv_claims_lost_total", s.fenced),
        ("dedupkv_dead_lettered_total", s.dead_lettered),
        ("dedupkv_takeovers_total", s.takeovers),
        ("dedupkv_interrupted_total", s.interrupted),
        ("dedupkv_commits_total", s.commits),
        ("dedupkv_seq_parked_total", s.seq_parked),
    ] {
        assert_eq!(value(&format!("{series}{l}")), want as f64, "{series}");
    }
    assert_eq!(
        (
            s.new_keys,
            s.duplicates,
            s.replays,
            s.in_progress,
            s.conflicts
        ),
        (3, 1, 1, 1, 1)
    );
    assert_eq!(
        (s.fenced, s.dead_lettered, s.takeovers, s.interrupted),
        (1, 1, 1, 1)
    );
    assert_eq!(value(&format!("dedupkv_keys{l}")), s.keys as f64);
    assert_eq!(value(&format!("dedupkv_dead_letters{l}")), 1.0);
    assert_eq!(
        value(&format!("dedupkv_oldest_dead_letter_seconds{l}")),
        31.0
    );
    assert_eq!(value(&format!("dedupkv_intents_pending{l}")), 1.0);
    assert_eq!(
        value(&format!("dedupkv_stranded_claims{l}")),
        1.0,
        "y was taken over"
    );
    assert_eq!(value(&format!("dedupkv_parked_events{l}")), 1.0);
    assert!(value(&format!("dedupkv_effective_window_seconds{l}")) > 0.0);
    let commits = samples(&format!("dedupkv_commit_duration_seconds{l}"));
    assert!(
        commits.len() as u64 >= s.commits - 1,
        "one sample per commit after open"
    );
    let records: f64 = samples(&format!("dedupkv_commit_records{l}")).iter().sum();
    assert_eq!(records, s.records_committed as f64);
    assert_eq!(
        samples("dedupkv_batch_size{call=insert_batch,store=orders}"),
        vec![2.0]
    );
    assert_eq!((s.batch_calls, s.batch_items), (1, 2));

    // Retention: the keys' buckets expire and are evicted.
    drop(pending);
    clock.advance(Duration::from_secs(2 * 86_400));
    let evicted = store.evict_expired()?;
    store.publish_metrics();
    assert!(evicted.keys > 0);
    assert_eq!(
        value(&format!("dedupkv_evicted_keys_total{l}")),
        store.stats().evicted_keys as f64
    );
    Ok(())
}

#[test]
fn early_evictions_are_counted() -> Result<()> {
    recorder();
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = Store::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .max_keys(1)
        .metrics_label("small")
        .open(dir.path().join("s.redb"))?;
    for i in 0..3 {
        store.insert_if_absent(&Key::new("t", &format!("k{i}")))?;
        clock.advance(Duration::from_secs(3_600));
    }
    store.evict_expired()?;
    store.publish_metrics();
    let s = store.stats();
    assert!(s.early_evicted_buckets > 0);
    assert_eq!(
        value("dedupkv_early_evicted_buckets_total{store=small}"),
        s.early_evicted_buckets as f64
    );
    Ok(())
}

/// The replica's gauges (features "metrics" and "replica"; scripts/test.sh
/// runs this file with "replica" too).
#[cfg(feature = "replica")]
#[test]
fn a_store_with_a_replica_publishes_its_epoch_lag_and_fencing() -> Result<()> {
    use dedupkv::replica::object_store::local::LocalFileSystem;
    use dedupkv::replica::{Replica, ReplicaMode};
    recorder();
    let dir = tempdir();
    let bucket = dir.path().join("bucket");
    std::fs::create_dir(&bucket).expect("bucket");
    let objects = Arc::new(LocalFileSystem::new_with_prefix(&bucket).expect("local"));
    let store = Store::builder()
        .background_eviction(false)
        .metrics_label("replicated")
        .replica(Replica::new(objects, "s").mode(ReplicaMode::Synchronous))
        .open(dir.path().join("s.redb"))?;
    store.insert_if_absent(&Key::new("t", "a"))?;
    store.publish_metrics();
    assert_eq!(value("dedupkv_replica_epoch{store=replicated}"), 1.0);
    assert_eq!(value("dedupkv_replica_fenced{store=replicated}"), 0.0);
    assert_eq!(value("dedupkv_replica_lag_bytes{store=replicated}"), 0.0);
    assert_eq!(
        value("dedupkv_replica_upload_failures{store=replicated}"),
        0.0
    );
    assert!(value("dedupkv_replica_lag_seconds{store=replicated}") >= 0.0);
    // A store without a replica publishes none of them.
    let plain = Store::builder()
        .background_eviction(false)
        .metrics_label("plain")
        .open(dir.path().join("p.redb"))?;
    plain.publish_metrics();
    assert_eq!(value("dedupkv_replica_epoch{store=plain}"), -1.0);
    Ok(())
}

/// A partition set's stores publish under a label each (`partition-P`),
/// so their gauges do not overwrite each other; a builder's own label
/// stays.
#[cfg(feature = "replica")]
#[test]
fn each_store_of_a_partition_set_publishes_under_its_partition() -> Result<()> {
    use dedupkv::partitions::PartitionSet;
    use dedupkv::replica::object_store::local::LocalFileSystem;
    use dedupkv::replica::{Replica, ReplicaMode};
    recorder();
    let dir = tempdir();
    let bucket = dir.path().join("bucket");
    std::fs::create_dir(&bucket).expect("bucket");
    let objects: Arc<LocalFileSystem> =
        Arc::new(LocalFileSystem::new_with_prefix(&bucket).expect("local"));
    let set = PartitionSet::new(dir.path().join("set"), move |p| {
        let replica =
            Replica::new(objects.clone(), &format!("orders/{p}")).mode(ReplicaMode::Synchronous);
        let builder = Store::builder().background_eviction(false).replica(replica);
        Ok(if p == 2 {
            builder.metrics_label("mine")
        } else {
            builder
        })
    });
    for p in 0..3 {
        set.assign(p)?;
    }
    for (p, keys) in [(0, 3), (1, 5), (2, 1)] {
        let work = set.work(p)?;
        for i in 0..keys {
            work.insert_if_absent(&Key::new("t", &format!("p{p}-{i}")))?;
        }
        work.with(|s| {
            s.publish_metrics();
            Ok(())
        })?;
    }
    assert_eq!(value("dedupkv_keys{store=partition-0}"), 3.0);
    assert_eq!(value("dedupkv_keys{store=partition-1}"), 5.0);
    assert_eq!(value("dedupkv_keys{store=mine}"), 1.0);
    assert_eq!(value("dedupkv_keys{store=partition-2}"), -1.0);
    Ok(())
}

/// A partition set publishes its assigned partitions (a gauge) and how
/// long each assign and revoke took (histograms, by outcome), under the
/// label `set` (its base directory).
#[cfg(feature = "replica")]
#[test]
fn a_partition_set_publishes_its_assignments_and_their_durations() -> Result<()> {
    use dedupkv::partitions::PartitionSet;
    use dedupkv::replica::Replica;
    use dedupkv::replica::object_store::memory::InMemory;
    recorder();
    let dir = tempdir();
    let base = dir.path().join("assignments");
    let objects = Arc::new(InMemory::new());
    let set = PartitionSet::new(&base, move |p| {
        let replica = Replica::new(objects.clone(), &format!("orders/{p}"));
        Ok(Store::builder().background_eviction(false).replica(replica))
    });
    let label = base.display().to_string();
    let gauge = format!("dedupkv_partitions_assigned{{set={label}}}");
    let series = |op: &str, outcome: &str| {
        samples(&format!(
            "dedupkv_partition_{op}_duration_seconds{{outcome={outcome},set={label}}}"
        ))
    };
    set.assign(0)?;
    set.assign(1)?;
    assert_eq!(value(&gauge), 2.0);
    assert!(set.assign(1).is_err(), "assigned already");
    set.revoke(0, Duration::from_secs(5))?;
    assert_eq!(value(&gauge), 1.0);
    assert_eq!(series("assign", "ok").len(), 2);
    assert_eq!(series("assign", "error").len(), 1);
    assert_eq!(series("revoke", "ok").len(), 1);
    assert!(series("assign", "ok").iter().all(|s| *s >= 0.0));
    set.revoke_all(Duration::from_secs(5));
    assert_eq!(value(&gauge), 0.0);
    assert_eq!(series("revoke", "ok").len(), 2);
    Ok(())
}
