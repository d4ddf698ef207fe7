//! The async front, measured in one run (docs/performance.md):
//!
//! 1. throughput: 16 tasks on a tokio multi-thread runtime (one worker per
//!    core) against 16 OS threads on the blocking API, for
//!    `insert_if_absent` and for `begin` + `complete`, `Immediate`
//!    durability, alternating, each on a fresh store; medians of ops/s and
//!    the ratio async / threads;
//! 2. the worst executor stall: a 1 ms ticker on a current-thread runtime
//!    beside 16 tasks making async store calls (and, for contrast, the
//!    same tasks calling the blocking API inline, with fewer calls);
//! 3. wake-up: from calling `complete` to an async waiter's
//!    `begin_or_wait` returning the outcome, p50/p99 (and the same with a
//!    blocking waiter thread).
//!
//! `cargo bench --bench async_front` (`DEDUPKV_BENCH_RUNS` rounds, default
//! 3; `DEDUPKV_ASYNC_OPS` operations per worker, default 300;
//! `DEDUPKV_BENCH_VERBOSE=1` prints each round and its records per commit;
//! `DEDUPKV_ASYNC_WORKERS` sets the tasks' runtime's workers, 0 for a
//! current-thread runtime; `DEDUPKV_BENCH_DIR=/dev/shm` puts the stores on
//! a tmpfs).
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss,
    clippy::cast_possible_truncation
)]

#[path = "common/mod.rs"]
mod common;
use common::env_or;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use dedupkv::{AsyncStore, Begin, Fingerprint, Key, Store};

const WORKERS: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Work {
    Insert,
    BeginComplete,
}

/// A fresh directory for a store: in `DEDUPKV_BENCH_DIR` if set (a tmpfs
/// such as /dev/shm takes the disk out: each sync is free, and what is left
/// is the front's own cost), else the system's temp dir.
fn tempdir() -> tempfile::TempDir {
    match std::env::var_os("DEDUPKV_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    }
}

fn open(dir: &tempfile::TempDir) -> Store {
    Store::builder()
        .background_eviction(false)
        .open(dir.path().join("s.redb"))
        .unwrap()
}

fn threads(work: Work, ops: usize) -> f64 {
    let dir = tempdir();
    let store = open(&dir);
    let barrier = Barrier::new(WORKERS);
    let t = Instant::now();
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (store, barrier) = (&store, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..ops {
                    let id = format!("{w}-{i}");
                    let key = Key::new("bench", &id);
                    match work {
                        Work::Insert => assert!(store.insert_if_absent(&key).unwrap()),
                        Work::BeginComplete => {
                            let Begin::Started(c) = store.begin(&key, Fingerprint::NONE).unwrap()
                            else {
                                panic!("fresh key")
                            };
                            store.complete(&c, b"ok").unwrap();
                        }
                    }
                }
            });
        }
    });
    let rate = (WORKERS * ops) as f64 / t.elapsed().as_secs_f64();
    if std::env::var_os("DEDUPKV_BENCH_VERBOSE").is_some() {
        let s = store.stats();
        eprintln!(
            "threads {work:?}: {rate:.0} ops/s, {:.2} records per commit",
            s.records_committed as f64 / s.commits as f64
        );
    }
    rate
}

fn tasks(rt: &tokio::runtime::Runtime, work: Work, ops: usize) -> f64 {
    let dir = tempdir();
    let store = AsyncStore::new(open(&dir));
    rt.block_on(async {
        let t = Instant::now();
        let mut handles = Vec::new();
        for w in 0..WORKERS {
            let store = store.clone();
            handles.push(tokio::spawn(async move {
                for i in 0..ops {
                    let id = format!("{w}-{i}");
                    let key = Key::new("bench", &id);
                    match work {
                        Work::Insert => assert!(store.insert_if_absent(&key).await.unwrap()),
                        Work::BeginComplete => {
                            let Begin::Started(c) =
                                store.begin(&key, Fingerprint::NONE).await.unwrap()
                            else {
                                panic!("fresh key")
                            };
                            store.complete(&c, b"ok").await.unwrap();
                        }
                    }
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        let rate = (WORKERS * ops) as f64 / t.elapsed().as_secs_f64();
        if std::env::var_os("DEDUPKV_BENCH_VERBOSE").is_some() {
            let s = store.store().stats();
            eprintln!(
                "tasks {work:?}: {rate:.0} ops/s, {:.2} records per commit",
                s.records_committed as f64 / s.commits as f64
            );
        }
        rate
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// The worst and p99 gap of a 1 ms ticker (in ms, past its 1 ms), alone
/// for `for_` (the machine's own scheduling jitter, the control).
fn stall_alone(for_: Duration) -> (f64, f64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.tick().await;
        let (start, mut last) = (Instant::now(), Instant::now());
        let mut gaps = Vec::new();
        while start.elapsed() < for_ {
            tick.tick().await;
            gaps.push(last.elapsed().as_secs_f64() * 1e3 - 1.0);
            last = Instant::now();
        }
        let worst = gaps.iter().copied().fold(0.0, f64::max);
        (worst.max(0.0), pct(&mut gaps, 0.99).max(0.0))
    })
}

/// The worst and p99 gap of a 1 ms ticker (in ms, past its 1 ms), beside
/// 16 tasks doing `ops` insert + begin + complete each, async or inline.
fn stall(ops: usize, inline: bool) -> (f64, f64) {
    let dir = tempdir();
    let store = AsyncStore::new(open(&dir));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = {
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                let mut last = Instant::now();
                let mut gaps = Vec::new();
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    tick.tick().await;
                    gaps.push(last.elapsed().as_secs_f64() * 1e3 - 1.0);
                    last = Instant::now();
                }
                gaps
            })
        };
        let mut handles = Vec::new();
        for w in 0..WORKERS {
            let store = store.clone();
            handles.push(tokio::spawn(async move {
                for i in 0..ops {
                    let id = format!("{w}-{i}");
                    let (plain, op) = (Key::new("plain", &id), Key::new("op", &id));
                    if inline {
                        let s = store.store();
                        s.insert_if_absent(&plain).unwrap();
                        let Begin::Started(c) = s.begin(&op, Fingerprint::NONE).unwrap() else {
                            panic!()
                        };
                        s.complete(&c, b"ok").unwrap();
                        tokio::task::yield_now().await;
                    } else {
                        store.insert_if_absent(&plain).await.unwrap();
                        let Begin::Started(c) = store.begin(&op, Fingerprint::NONE).await.unwrap()
                        else {
                            panic!()
                        };
                        store.complete(&c, b"ok").await.unwrap();
                    }
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut gaps = ticker.await.unwrap();
        gaps.remove(0); // the first tick fires at once
        let worst = gaps.iter().copied().fold(0.0, f64::max);
        (worst.max(0.0), pct(&mut gaps, 0.99).max(0.0))
    })
}

/// `complete` → waiter's answer, in ms: p50, p99 over `n` keys.
fn wakeup(n: usize, blocking: bool) -> (f64, f64) {
    let dir = tempdir();
    let store = AsyncStore::new(open(&dir));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("w-{i}");
        let key = Key::new("wake", &id).into_owned();
        let claim = match rt.block_on(store.begin(&key, Fingerprint::NONE)).unwrap() {
            Begin::Started(c) => c,
            other => panic!("{other:?}"),
        };
        let done_at = if blocking {
            let s = store.store().clone();
            let k = key.clone();
            let waiter = std::thread::spawn(move || {
                let a = s.begin_or_wait(&k, Fingerprint::NONE, Duration::from_secs(30));
                (a.unwrap(), Instant::now())
            });
            while store.store().stats().waiting == 0 {
                std::thread::yield_now();
            }
            let t0 = Instant::now();
            store.store().complete(&claim, b"ok").unwrap();
            let (answer, at) = waiter.join().unwrap();
            assert!(matches!(answer, Begin::Completed(_)));
            at - t0
        } else {
            rt.block_on(async {
                let s = store.clone();
                let k = key.clone();
                let waiter = tokio::spawn(async move {
                    let a = s
                        .begin_or_wait(&k, Fingerprint::NONE, Duration::from_secs(30))
                        .await;
                    (a.unwrap(), Instant::now())
                });
                while store.store().stats().waiting == 0 {
                    tokio::task::yield_now().await;
                }
                let t0 = Instant::now();
                store.complete(&claim, b"ok").await.unwrap();
                let (answer, at) = waiter.await.unwrap();
                assert!(matches!(answer, Begin::Completed(_)));
                at - t0
            })
        };
        lat.push(done_at.as_secs_f64() * 1e3);
    }
    (pct(&mut lat, 0.5), pct(&mut lat, 0.99))
}

fn main() {
    let runs = env_or("DEDUPKV_BENCH_RUNS", 3);
    let ops = env_or("DEDUPKV_ASYNC_OPS", 300);
    // Workers of the tasks' runtime: tokio's default (one per core), or
    // DEDUPKV_ASYNC_WORKERS (0: a current-thread runtime).
    let rt = match std::env::var("DEDUPKV_ASYNC_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(0) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build()
    .unwrap();
    println!(
        "## 16 tasks (async front) vs 16 threads (blocking), Immediate, {ops} ops per worker, {runs} rounds\n"
    );
    println!("| workload | threads ops/s | tasks ops/s | tasks / threads |");
    println!("|---|---:|---:|---:|");
    for work in [Work::Insert, Work::BeginComplete] {
        let (mut th, mut ta) = (Vec::new(), Vec::new());
        for r in 0..runs {
            if r % 2 == 0 {
                th.push(threads(work, ops));
                ta.push(tasks(&rt, work, ops));
            } else {
                ta.push(tasks(&rt, work, ops));
                th.push(threads(work, ops));
            }
        }
        let ratios: Vec<f64> = th.iter().zip(&ta).map(|(t, a)| a / t).collect();
        let name = match work {
            Work::Insert => "insert_if_absent",
            Work::BeginComplete => "begin + complete",
        };
        println!(
            "| {name} | {:.0} | {:.0} | {:.2}x |",
            median(th),
            median(ta),
            median(ratios)
        );
    }
    println!("\n## executor stall: a 1 ms ticker on a current-thread runtime beside 16 tasks\n");
    println!("| calls | per task | worst stall ms | p99 stall ms |");
    println!("|---|---:|---:|---:|");
    let per = (ops / 6).max(10);
    let (worst, p99) = stall_alone(Duration::from_secs(1));
    println!("| none (the ticker alone, 1 s: the machine's jitter) | 0 | {worst:.2} | {p99:.2} |");
    let (worst, p99) = stall(per, false);
    println!("| async front | {per} × 3 | {worst:.2} | {p99:.2} |");
    let (worst, _) = stall(5, true);
    println!("| blocking, inline | 5 × 3 | {worst:.2} | (a burst after each stall) |");
    println!("\n## complete → waiter's answer (begin_or_wait), 200 keys\n");
    println!("| waiter | p50 ms | p99 ms |");
    println!("|---|---:|---:|");
    let (p50, p99) = wakeup(200, false);
    println!("| async task | {p50:.2} | {p99:.2} |");
    let (p50, p99) = wakeup(200, true);
    println!("| blocking thread | {p50:.2} | {p99:.2} |");
}
