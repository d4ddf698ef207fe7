//! Sustained ingest with retention: N keys per simulated minute through a
//! window of W minutes, with eviction running beside the inserts. Prints
//! keys/s, peak RSS, file size after the first window and at the end, and
//! `insert_batch` latencies while a bucket was being evicted and otherwise
//! (p50, p99, max, and the median of each eviction's worst).
//!
//! `cargo bench --bench retention` (50 minutes × 1,000,000 keys through a
//! 5-minute window = 50M keys, 5M retained). Scale with
//! `DEDUPKV_RET_PER_MINUTE` and `DEDUPKV_RET_MINUTES`.
#![allow(missing_docs, clippy::unwrap_used, clippy::cast_precision_loss)]
// One scenario, read top to bottom.
#![allow(clippy::too_many_lines)]

#[path = "common/mod.rs"]
mod common;
use common::env_or;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dedupkv::{Key, ManualClock, Store};

fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

/// p50 / p99 / max of latencies in ms.
fn spread(ms: &mut [f64]) -> String {
    ms.sort_by(f64::total_cmp);
    let at = |per_mille: usize| {
        ms.get(ms.len().saturating_sub(1) * per_mille / 1000)
            .copied()
            .unwrap_or(0.0)
    };
    format!("{:.1} / {:.1} / {:.1} ms", at(500), at(990), at(1000))
}

fn main() {
    let per_minute = env_or("DEDUPKV_RET_PER_MINUTE", 1_000_000);
    let minutes = env_or("DEDUPKV_RET_MINUTES", 50);
    let window = 5;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ret.redb");
    let clock = ManualClock::new(1_700_000_040_000);
    let store = Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .retention(Duration::from_secs(60 * window as u64))
        .bucket_granularity(Duration::from_secs(60))
        .background_eviction(false)
        .expected_keys(per_minute * (window + 1))
        .open(&path)
        .unwrap();
    let evicting = AtomicBool::new(false);
    // `insert_batch` latencies (ms) while a bucket was being evicted, and
    // otherwise; and each eviction's worst one.
    let mut during_ms: Vec<f64> = Vec::new();
    let mut otherwise_ms: Vec<f64> = Vec::new();
    let mut worst_per_eviction: Vec<f64> = Vec::new();
    let mut first_window_file = 0;
    let mut file_sizes = Vec::new();
    let mut evicted_keys = 0;
    let mut evict_secs: Vec<f64> = Vec::new();
    let start = Instant::now();
    let mut id = [0u8; 16];
    for minute in 0..minutes {
        // Evict the bucket that expired at the start of this minute while
        // this minute's inserts run.
        std::thread::scope(|s| {
            let evictor = s.spawn(|| {
                evicting.store(true, Ordering::SeqCst);
                let t = Instant::now();
                let ev = store.evict_expired().unwrap();
                let secs = t.elapsed().as_secs_f64();
                evicting.store(false, Ordering::SeqCst);
                (ev.keys, secs)
            });
            let mut n = 0u64;
            let mut worst_here = 0f64;
            while n < per_minute as u64 {
                let keys: Vec<[u8; 16]> = (0..1_000)
                    .map(|i| {
                        id[..8].copy_from_slice(&(minute as u64).to_le_bytes());
                        id[8..].copy_from_slice(&(n + i).to_le_bytes());
                        id
                    })
                    .collect();
                let batch: Vec<Key<'_>> = keys.iter().map(|k| Key::new("ret", k)).collect();
                let during = evicting.load(Ordering::SeqCst);
                let t = Instant::now();
                store.insert_batch(&batch).unwrap();
                let lat = t.elapsed().as_secs_f64() * 1000.0;
                if during {
                    during_ms.push(lat);
                    worst_here = worst_here.max(lat);
                } else {
                    otherwise_ms.push(lat);
                }
                n += 1_000;
            }
            let (k, secs) = evictor.join().unwrap();
            evicted_keys += k;
            if k > 0 {
                evict_secs.push(secs);
                worst_per_eviction.push(worst_here);
            }
        });
        clock.advance(Duration::from_secs(60));
        let file = std::fs::metadata(&path).map_or(0, |m| m.len());
        if minute + 1 == window + 1 {
            first_window_file = file;
        }
        if (minute + 1) % 5 == 0 {
            file_sizes.push(format!("{}: {} MiB", minute + 1, file >> 20));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let total = per_minute * minutes;
    let stats = store.stats();
    let end_file = std::fs::metadata(&path).map_or(0, |m| m.len());
    evict_secs.sort_by(f64::total_cmp);
    let median_evict = evict_secs.get(evict_secs.len() / 2).copied().unwrap_or(0.0);
    println!(
        "dedupkv retention bench: {total} keys, {per_minute} per simulated minute, {window}-minute window"
    );
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| sustained ingest, `insert_batch` of 1,000, Immediate, eviction running | {:.0} keys/s |",
        total as f64 / secs
    );
    println!(
        "| keys retained at the end | {} (window: {}) |",
        stats.keys,
        per_minute * window
    );
    println!("| keys evicted | {evicted_keys} |");
    println!(
        "| eviction of one {per_minute}-key bucket (median) | {:.0} ms |",
        median_evict * 1000.0
    );
    println!(
        "| `insert_batch` latency while a bucket was evicted: p50 / p99 / max | {} |",
        spread(&mut during_ms)
    );
    println!(
        "| `insert_batch` latency otherwise: p50 / p99 / max | {} |",
        spread(&mut otherwise_ms)
    );
    worst_per_eviction.sort_by(f64::total_cmp);
    println!(
        "| worst `insert_batch` of each eviction, median over the {} evictions | {:.1} ms |",
        worst_per_eviction.len(),
        worst_per_eviction
            .get(worst_per_eviction.len() / 2)
            .copied()
            .unwrap_or(0.0)
    );
    println!("| peak RSS | {} MiB |", peak_rss_mib());
    println!(
        "| file size after the first window / at the end | {} MiB / {} MiB |",
        first_window_file >> 20,
        end_file >> 20
    );
    println!(
        "| file size by simulated minute | {} |",
        file_sizes.join(", ")
    );
    println!(
        "| index bytes per retained key | {:.1} |",
        stats.index_bytes as f64 / stats.keys.max(1) as f64
    );
}
