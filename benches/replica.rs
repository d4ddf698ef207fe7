//! The replica's cost and figures (docs/performance.md):
//! - `insert_if_absent` with 16 callers and `insert_batch` of 1,000 keys
//!   with 8 callers: no replica, an asynchronous and a synchronous replica
//!   in local files (and in an S3 API under `scripts/with-s3.sh`);
//! - the asynchronous lag under the 16-caller load, p50/p99;
//! - restore of `DEDUPKV_BENCH_KEYS` keys (default 1M): seconds, bytes read,
//!   bytes shipped per key beside the file's;
//! - `DEDUPKV_BENCH_ONLY=assign`: a partition written by
//!   `DEDUPKV_BENCH_COMMITS` (default 100,000) lone synchronous commits
//!   (one caller, one key each: one segment each), then
//!   `PartitionSet::assign` of it on another member, which restores it
//!   (`DEDUPKV_BENCH_RUNS` assigns, median and max).
//!
//! `cargo bench --bench replica --features replica` (add `replica-s3` and
//! run under `scripts/with-s3.sh` for moto's column). Without the feature
//! it measures the plain store only: run both to see the seam's cost.
//! `DEDUPKV_BENCH_SECS` per figure (default 3), `DEDUPKV_BENCH_RUNS`
//! (default 3, medians); `DEDUPKV_BENCH_ONLY=none` (the plain store only)
//! or `=restore`; `DEDUPKV_BENCH_JOURNAL=off`: every store `journal(None)`
//! (redb only; the default is the builder's, with the journal).
#![allow(missing_docs, clippy::unwrap_used, clippy::cast_precision_loss)]
#![allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

#[path = "common/mod.rs"]
mod common;
use common::{env_or, splitmix};

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dedupkv::{Key, Store, StoreBuilder};

#[derive(Clone, Copy, Debug)]
enum Mode {
    None,
    #[cfg(feature = "replica")]
    Async,
    #[cfg(feature = "replica")]
    Sync,
}

struct Place {
    _dir: tempfile::TempDir,
    #[cfg(feature = "replica")]
    objects: Arc<dyn dedupkv::replica::object_store::ObjectStore>,
    #[cfg(feature = "replica")]
    prefix: String,
    bucket: std::path::PathBuf,
}

#[cfg_attr(not(feature = "replica"), allow(unused_variables))]
fn place(tag: &str) -> Place {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    std::fs::create_dir(&bucket).unwrap();
    Place {
        #[cfg(feature = "replica")]
        objects: objects(&bucket),
        #[cfg(feature = "replica")]
        prefix: format!("bench-{}-{tag}", std::process::id()),
        bucket,
        _dir: dir,
    }
}

#[cfg(feature = "replica")]
fn objects(bucket: &std::path::Path) -> Arc<dyn dedupkv::replica::object_store::ObjectStore> {
    #[cfg(feature = "replica-s3")]
    if let Ok(endpoint) = std::env::var("DEDUPKV_S3_ENDPOINT") {
        use dedupkv::replica::object_store::aws::{AmazonS3Builder, S3ConditionalPut};
        return Arc::new(
            AmazonS3Builder::new()
                .with_endpoint(endpoint)
                .with_allow_http(true)
                .with_bucket_name("dedupkv-test")
                .with_region("us-east-1")
                .with_access_key_id("test")
                .with_secret_access_key("test")
                .with_conditional_put(S3ConditionalPut::ETagMatch)
                .build()
                .unwrap(),
        );
    }
    Arc::new(
        dedupkv::replica::object_store::local::LocalFileSystem::new_with_prefix(bucket).unwrap(),
    )
}

#[cfg_attr(not(feature = "replica"), allow(unused_variables))]
fn builder(p: &Place, mode: Mode) -> StoreBuilder {
    let mut b = Store::builder().background_eviction(false);
    if std::env::var("DEDUPKV_BENCH_JOURNAL").is_ok_and(|v| v == "off") {
        b = b.journal(None);
    }
    match mode {
        Mode::None => b,
        #[cfg(feature = "replica")]
        Mode::Async => b.replica(dedupkv::replica::Replica::new(
            Arc::clone(&p.objects),
            &p.prefix,
        )),
        #[cfg(feature = "replica")]
        Mode::Sync => b.replica(
            dedupkv::replica::Replica::new(Arc::clone(&p.objects), &p.prefix)
                .mode(dedupkv::replica::ReplicaMode::Synchronous),
        ),
    }
}

/// Operations per second of `threads` callers for `secs`, each call
/// `batch` fresh random keys.
fn run(store: &Store, threads: usize, batch: usize, secs: u64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, stop, done) = (store.clone(), Arc::clone(&stop), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut seed = (t as u64 + 1) * 0x9E37_79B9;
                while !stop.load(Ordering::Relaxed) {
                    let ids: Vec<[u8; 16]> = (0..batch)
                        .map(|_| {
                            let mut id = [0u8; 16];
                            id[..8].copy_from_slice(&splitmix(&mut seed).to_le_bytes());
                            id[8..].copy_from_slice(&splitmix(&mut seed).to_le_bytes());
                            id
                        })
                        .collect();
                    let keys: Vec<Key<'_>> = ids.iter().map(|id| Key::new("bench", id)).collect();
                    if batch == 1 {
                        store.insert_if_absent(&keys[0]).unwrap();
                    } else {
                        store.insert_batch(&keys).unwrap();
                    }
                    done.fetch_add(batch as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn modes() -> Vec<Mode> {
    if std::env::var("DEDUPKV_BENCH_ONLY").is_ok_and(|v| v == "none") {
        return vec![Mode::None];
    }
    #[cfg(feature = "replica")]
    return vec![Mode::None, Mode::Async, Mode::Sync];
    #[cfg(not(feature = "replica"))]
    vec![Mode::None]
}

fn main() {
    let secs = env_or("DEDUPKV_BENCH_SECS", 3) as u64;
    let runs = env_or("DEDUPKV_BENCH_RUNS", 3);
    let target = if std::env::var_os("DEDUPKV_S3_ENDPOINT").is_some() {
        "moto (S3 API)"
    } else {
        "local files"
    };
    println!(
        "replica objects: {target}; feature replica: {}",
        cfg!(feature = "replica")
    );
    let only_restore = std::env::var("DEDUPKV_BENCH_ONLY").is_ok_and(|v| v == "restore");
    let only_assign = std::env::var("DEDUPKV_BENCH_ONLY").is_ok_and(|v| v == "assign");
    let loads: &[(&str, usize, usize)] = if only_restore || only_assign {
        &[]
    } else {
        &[
            ("insert_if_absent, 16 callers", 16, 1),
            ("insert_batch of 1,000, 8 callers", 8, 1000),
        ]
    };
    for &(what, threads, batch) in loads {
        let mut base = 0.0;
        let ms = modes();
        let mut figures = vec![Vec::new(); ms.len()];
        #[allow(unused_mut)]
        let mut lags: Vec<Vec<Duration>> = vec![Vec::new(); ms.len()];
        // Modes interleaved run by run, so a noisy moment hits them alike.
        for r in 0..runs {
            for (i, mode) in ms.iter().enumerate() {
                let p = place(&format!("{threads}-{batch}-{mode:?}-{r}"));
                let store = builder(&p, *mode).open(p.bucket.join("../s.redb")).unwrap();
                figures[i].push(run(&store, threads, batch, secs));
                #[cfg(feature = "replica")]
                lags[i].extend(store.replica_lag_samples());
            }
        }
        for (i, mode) in ms.into_iter().enumerate() {
            let mut lags = std::mem::take(&mut lags[i]);
            let m = median(std::mem::take(&mut figures[i]));
            if matches!(mode, Mode::None) {
                base = m;
            }
            let mut line = format!("{what:<36} {mode:<6?} {m:>12.0} keys/s  ({:.2}x)", m / base);
            if !lags.is_empty() {
                lags.sort();
                let q = |f: f64| lags[((lags.len() - 1) as f64 * f) as usize];
                let _ = write!(
                    line,
                    "  lag p50 {:?} p99 {:?} ({} segments)",
                    q(0.5),
                    q(0.99),
                    lags.len()
                );
            }
            println!("{line}");
        }
    }
    #[cfg(feature = "replica")]
    if std::env::var("DEDUPKV_BENCH_ONLY").is_ok_and(|v| v == "assign") {
        assign(env_or("DEDUPKV_BENCH_COMMITS", 100_000), runs);
        return;
    }
    #[cfg(feature = "replica")]
    if std::env::var("DEDUPKV_BENCH_ONLY").is_err() || only_restore {
        restore(env_or("DEDUPKV_BENCH_KEYS", 1_000_000));
    }
}

#[cfg(feature = "replica")]
fn dir_bytes(p: &std::path::Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let m = e.metadata().unwrap();
        n += if m.is_dir() {
            dir_bytes(&e.path())
        } else {
            m.len()
        };
    }
    n
}

#[cfg(feature = "replica")]
fn restore(keys: usize) {
    let p = place("restore");
    let path = p.bucket.join("../a.redb");
    let file_bytes;
    {
        let store = builder(&p, Mode::Async)
            .expected_keys(keys)
            .open(&path)
            .unwrap();
        let mut seed = 7;
        let mut left = keys;
        while left > 0 {
            let n = left.min(1000);
            let ids: Vec<[u8; 16]> = (0..n)
                .map(|_| {
                    let mut id = [0u8; 16];
                    id[..8].copy_from_slice(&splitmix(&mut seed).to_le_bytes());
                    id[8..].copy_from_slice(&splitmix(&mut seed).to_le_bytes());
                    id
                })
                .collect();
            let ks: Vec<Key<'_>> = ids.iter().map(|id| Key::new("bench", id)).collect();
            store.insert_batch(&ks).unwrap();
            left -= n;
        }
        store.sync_replica().unwrap();
        file_bytes = std::fs::metadata(&path).unwrap().len();
    }
    let shipped = dir_bytes(&p.bucket);
    let t0 = Instant::now();
    let store = builder(&p, Mode::Async)
        .expected_keys(keys)
        .open(p.bucket.join("../b.redb"))
        .unwrap();
    let open = t0.elapsed();
    let r = store.replica_status().unwrap().restored.unwrap();
    drop(store);
    // The restored file and the file the store wrote itself (closed
    // normally), each reopened the same way: their opens should match.
    for (what, file) in [("restored", "b.redb"), ("written and closed", "a.redb")] {
        let t1 = Instant::now();
        drop(
            builder(&p, Mode::None)
                .expected_keys(keys)
                .open(p.bucket.join("..").join(file))
                .unwrap(),
        );
        println!(
            "the {what} file reopened without a replica: {:.2} s",
            t1.elapsed().as_secs_f64()
        );
    }
    println!(
        "restore of {keys} keys: {:.2} s to rebuild the file ({} bytes read, {} rows), {:.2} s \
         with the store's open; replica holds {} bytes ({:.1} per key), the file {} ({:.1} per key)",
        r.duration.as_secs_f64(),
        r.bytes,
        r.rows,
        open.as_secs_f64(),
        shipped,
        shipped as f64 / keys as f64,
        file_bytes,
        file_bytes as f64 / keys as f64
    );
}

#[cfg(feature = "replica")]
fn assign(commits: usize, runs: usize) {
    use dedupkv::partitions::PartitionSet;
    let p = place("assign");
    let (objects, prefix) = (Arc::clone(&p.objects), p.prefix.clone());
    let stores = move |part: i32| {
        Ok(Store::builder().replica(
            dedupkv::replica::Replica::new(Arc::clone(&objects), &format!("{prefix}/{part}"))
                .mode(dedupkv::replica::ReplicaMode::Synchronous),
        ))
    };
    let t0 = Instant::now();
    let first = PartitionSet::new(p.bucket.join("../member-0"), stores.clone());
    first.assign(0).unwrap();
    let mut seed = 11;
    for _ in 0..commits {
        let id = splitmix(&mut seed).to_le_bytes();
        first
            .work(0)
            .unwrap()
            .insert_if_absent(&Key::new("bench", &id))
            .unwrap();
    }
    let status = first
        .work(0)
        .unwrap()
        .with(|s| Ok(s.replica_status()))
        .unwrap()
        .unwrap();
    first.revoke(0, Duration::from_secs(60)).unwrap();
    println!(
        "{commits} lone synchronous commits in {:.1} s ({} snapshots)",
        t0.elapsed().as_secs_f64(),
        status.snapshots
    );
    let mut took = Vec::new();
    for r in 0..runs.max(1) {
        let member = PartitionSet::new(
            p.bucket.join(format!("../member-{}", r + 1)),
            stores.clone(),
        );
        let t = Instant::now();
        let a = member.assign(0).unwrap();
        took.push(t.elapsed().as_secs_f64());
        let restored = a.restored.expect("a new member restores");
        println!(
            "assign {}: {:.3} s (restore {:.3} s: a snapshot and {} segments, {} bytes)",
            r + 1,
            took[r],
            restored.duration.as_secs_f64(),
            restored.segments,
            restored.bytes
        );
        member.revoke(0, Duration::from_secs(60)).unwrap();
    }
    let max = took.iter().copied().fold(0.0, f64::max);
    println!(
        "assign after {commits} lone synchronous commits: median {:.3} s, max {max:.3} s ({} runs)",
        median(took.clone()),
        took.len()
    );
}
