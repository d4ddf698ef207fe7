//! The main job: a simulated at-least-once consumer.
//!
//! A broker delivers 4,000 events to 4 worker threads *at least once*: some
//! are redelivered (a lost ack), some are delivered to two workers at the
//! same time, and halfway through the consumer restarts (the store is closed
//! and reopened while redeliveries of already-handled events are still
//! queued). Half the events are plain "count this" events deduplicated with
//! `insert_if_absent`; the other half are payments run as idempotent
//! operations with `begin`/`complete`, whose repeats get the stored receipt
//! back. At the end every side effect must have happened exactly once.
//!
//! ```text
//! cargo run --release --example consumer
//! ```
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dedupkv::{Begin, Fingerprint, Key, Store};

const EVENTS: u64 = 4_000;
const WORKERS: usize = 4;

#[derive(Clone, Copy, Debug)]
struct Event {
    id: u64,
    payment: bool,
}

/// The side effects, as the downstream system would see them.
#[derive(Default)]
struct Effects {
    counted: HashMap<u64, u32>,
    charged: HashMap<u64, u32>,
}

#[derive(Default)]
struct Tally {
    deliveries: AtomicU64,
    suppressed: AtomicU64,
    replayed_receipts: AtomicU64,
    in_progress_requeued: AtomicU64,
}

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Every event once, plus redeliveries and near-simultaneous duplicates, shuffled.
fn deliveries(range: std::ops::Range<u64>, seed: u64) -> VecDeque<Event> {
    let mut s = seed;
    let mut out = Vec::new();
    for id in range {
        let ev = Event {
            id,
            payment: id % 2 == 1,
        };
        out.push(ev);
        match splitmix(&mut s) % 10 {
            0..=2 => out.push(ev), // a redelivery after a lost ack
            3 => {
                out.push(ev); // delivered to several workers at once
                out.push(ev);
            }
            _ => {}
        }
    }
    for i in (1..out.len()).rev() {
        // Shuffle, but keep duplicates close so workers race on them.
        let j = i.saturating_sub((splitmix(&mut s) % 8) as usize);
        out.swap(i, j);
    }
    out.into()
}

fn handle(store: &Store, ev: Event, effects: &Mutex<Effects>, tally: &Tally) -> bool {
    tally.deliveries.fetch_add(1, Ordering::Relaxed);
    let id = ev.id.to_string();
    if !ev.payment {
        // Record first; count only if new.
        if store
            .insert_if_absent(&Key::new("shop-42/events", &id))
            .expect("insert")
        {
            *effects.lock().unwrap().counted.entry(ev.id).or_default() += 1;
        } else {
            tally.suppressed.fetch_add(1, Ordering::Relaxed);
        }
        return true;
    }
    let amount = 100 + ev.id % 50;
    let key = Key::new("shop-42/payments", &id);
    match store
        .begin(&key, Fingerprint::of(format!("charge {amount}")))
        .expect("begin")
    {
        Begin::Started(claim) => {
            *effects.lock().unwrap().charged.entry(ev.id).or_default() += 1;
            let receipt = format!("receipt-{id}-{amount}");
            store
                .complete(&claim, receipt.as_bytes())
                .expect("complete");
            true
        }
        Begin::Completed(record) => {
            let receipt =
                String::from_utf8_lossy(record.outcome().unwrap_or_default()).into_owned();
            assert_eq!(
                receipt,
                format!("receipt-{id}-{amount}"),
                "replayed the original outcome"
            );
            tally.suppressed.fetch_add(1, Ordering::Relaxed);
            tally.replayed_receipts.fetch_add(1, Ordering::Relaxed);
            true
        }
        Begin::InProgress(_) => {
            // Another worker is charging right now: put it back (a nack).
            tally.in_progress_requeued.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

fn run_workers(store: &Store, queue: VecDeque<Event>, effects: &Mutex<Effects>, tally: &Tally) {
    let queue = Mutex::new(queue);
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            let queue = &queue;
            s.spawn(move || {
                loop {
                    let Some(ev) = queue.lock().unwrap().pop_front() else {
                        break;
                    };
                    if !handle(store, ev, effects, tally) {
                        queue.lock().unwrap().push_back(ev);
                        std::thread::yield_now();
                    }
                }
            });
        }
    });
}

fn main() -> dedupkv::Result<()> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = std::env::var_os("DEDUPKV_PATH")
        .map_or_else(|| dir.path().join("consumer.redb"), Into::into);
    let effects = Arc::new(Mutex::new(Effects::default()));
    let tally = Tally::default();
    let start = std::time::Instant::now();

    // First life of the consumer: the first 60% of events, with redeliveries.
    let store = Store::open(&path)?;
    run_workers(&store, deliveries(0..EVENTS * 6 / 10, 1), &effects, &tally);
    let before = store.stats();
    drop(store); // restart

    // Second life: the broker redelivers a window of already-handled events
    // (their acks were lost in the restart), then the rest of the stream.
    let store = Store::open(&path)?;
    let mut queue = deliveries(EVENTS * 4 / 10..EVENTS * 6 / 10, 2);
    queue.extend(deliveries(EVENTS * 6 / 10..EVENTS, 3));
    run_workers(&store, queue, &effects, &tally);
    let after = store.stats();

    let effects = effects.lock().unwrap();
    let counted_once = (0..EVENTS)
        .filter(|i| i % 2 == 0)
        .all(|i| effects.counted.get(&i) == Some(&1));
    let charged_once = (0..EVENTS)
        .filter(|i| i % 2 == 1)
        .all(|i| effects.charged.get(&i) == Some(&1));
    println!(
        "dedupkv at-least-once consumer ({WORKERS} workers, one restart) at {}",
        path.display()
    );
    println!("  events:                       {EVENTS}");
    println!(
        "  deliveries:                   {}",
        tally.deliveries.load(Ordering::Relaxed)
    );
    println!(
        "  duplicates suppressed:        {}",
        tally.suppressed.load(Ordering::Relaxed)
    );
    println!(
        "    of which receipts replayed: {}",
        tally.replayed_receipts.load(Ordering::Relaxed)
    );
    println!(
        "  in-progress answers requeued: {}",
        tally.in_progress_requeued.load(Ordering::Relaxed)
    );
    println!(
        "  durable commits:              {} before restart, {} after",
        before.commits, after.commits
    );
    println!("  elapsed:                      {:.2?}", start.elapsed());
    let exactly_once = counted_once && charged_once;
    println!(
        "  every effect exactly once:    {}",
        if exactly_once { "yes" } else { "NO" }
    );
    assert!(exactly_once, "an effect happened twice or never");
    Ok(())
}
