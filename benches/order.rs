//! Ordering throughput: the version gate over 1M entities (random
//! versions, 10% stale) and the sequencer with 5% reordering, both under
//! `Immediate` with concurrent callers.
//!
//! `cargo bench --bench order` (`DEDUPKV_ORDER_ENTITIES`, default 1,000,000;
//! `DEDUPKV_ORDER_SECS` per figure, default 3).
#![allow(missing_docs, clippy::unwrap_used, clippy::cast_precision_loss)]
// n, s, v, i, e: the usual names in a numeric bench loop.
#![allow(clippy::many_single_char_names)]

#[path = "common/mod.rs"]
mod common;
use common::{env_or, splitmix};

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dedupkv::{Advance, Durability, Key, Sequenced, Store};

fn entity(i: u64) -> String {
    format!("entity-{i}")
}

/// Runs `op(thread, i)` on `threads` threads until `secs` pass; ops/s.
fn timed(threads: usize, secs: f64, op: &(dyn Fn(usize, u64) + Sync)) -> f64 {
    let barrier = Barrier::new(threads);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let done = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (barrier, done) = (&barrier, &done);
            s.spawn(move || {
                barrier.wait();
                let mut i = 0;
                while Instant::now() < deadline {
                    op(t, i);
                    i += 1;
                }
                done.fetch_add(i, Ordering::Relaxed);
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let n = env_or("DEDUPKV_ORDER_ENTITIES", 1_000_000) as u64;
    let secs = env_or("DEDUPKV_ORDER_SECS", 3) as f64;
    let threads = 16;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("order.redb");
    // Preload every entity at version 1 (deferred commits, then flushed).
    {
        let store = Store::builder()
            .durability(Durability::Deferred {
                max_delay: Duration::from_millis(50),
            })
            .open(&path)
            .unwrap();
        for i in 0..n {
            store.advance(&Key::new("bench", &entity(i)), 1).unwrap();
        }
        store.flush().unwrap();
    }
    let opened = Instant::now();
    let store = Store::open(&path).unwrap();
    let reopen = opened.elapsed();
    let version = AtomicU64::new(2);
    let stale = AtomicU64::new(0);
    let advance_rate = timed(threads, secs, &|thread, i| {
        let mut s = (thread as u64) << 32 | i;
        let r = splitmix(&mut s);
        let e = entity(r % n);
        // 10% of updates carry an old version.
        let v = if r.is_multiple_of(10) {
            1
        } else {
            version.fetch_add(1, Ordering::Relaxed)
        };
        if let Advance::Stale { .. } | Advance::Duplicate =
            store.advance(&Key::new("bench", &e), v).unwrap()
        {
            stale.fetch_add(1, Ordering::Relaxed);
        }
    });
    // Sequencer: each thread feeds its own entities 1, 2, 3, ... with 5% of
    // adjacent pairs swapped, and acknowledges what is handed back.
    let delivered = AtomicU64::new(0);
    let seq_rate = timed(threads, secs, &|thread, i| {
        let ent = format!("stream-{thread}-{}", i / 1_000);
        let pos = i % 1_000 + 1;
        let mut s = i / 2;
        let swap = splitmix(&mut s).is_multiple_of(20) && pos < 1_000; // pair (2k+1, 2k+2)
        let seq = if swap && !pos.is_multiple_of(2) {
            pos + 1
        } else if swap_prev(i) {
            pos - 1
        } else {
            pos
        };
        let key = Key::new("bench", &ent);
        if let Sequenced::Delivered(v) = store.sequence(&key, seq, b"payload").unwrap() {
            delivered.fetch_add(v.len() as u64, Ordering::Relaxed);
            // The consumer's loop: handled, acknowledged.
            if let Some(last) = v.last() {
                store.ack(&key, last.seq).unwrap();
            }
        }
    });
    let st = store.stats();
    println!(
        "dedupkv ordering bench: {n} entities, {threads} threads, Immediate, {secs} s per figure"
    );
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!("| `advance`, random entity of {n}, 10% stale versions (ops/s) | {advance_rate:.0} |");
    println!(
        "| of those answered stale/duplicate | {} |",
        stale.load(Ordering::Relaxed)
    );
    println!("| `sequence`, 5% of adjacent events swapped (events/s) | {seq_rate:.0} |");
    println!(
        "| events parked on the way / delivered | {} / {} |",
        st.seq_parked,
        delivered.load(Ordering::Relaxed)
    );
    println!(
        "| reopen with {n} entities | {:.2} s |",
        reopen.as_secs_f64()
    );
}

/// Whether op `i` is the second half of a swapped pair.
fn swap_prev(i: u64) -> bool {
    let pos = i % 1_000 + 1;
    if !pos.is_multiple_of(2) {
        return false;
    }
    let mut s = (i - 1) / 2;
    splitmix(&mut s).is_multiple_of(20)
}
