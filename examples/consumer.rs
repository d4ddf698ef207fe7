//! The main job: a simulated at-least-once consumer, killed mid-stream.
//!
//! A broker delivers 4,000 events to 4 worker threads *at least once*: some
//! are redelivered (a lost ack), some are delivered to two workers at the
//! same time. Half the events are plain "count this" events deduplicated with
//! `insert_if_absent`; the other half are payments run as idempotent
//! operations with `begin`/`complete`, sent to a payment provider under the
//! claim's `provider_key()`; their repeats get the stored receipt back.
//!
//! The first life of the consumer is a child process (this program run
//! again with `DEDUPKV_CONSUMER_CHILD` set). The parent plays the broker and
//! the downstream systems: it reads the child's effects and acks from a
//! pipe and SIGKILLs it (`Child::kill`) in the middle of the stream, with
//! payments in flight. Then it reopens the store and runs the second life
//! itself: every unacknowledged event is redelivered, and so is a window of
//! acknowledged ones (their acks were lost with the process).
//!
//! At the end no effect may have happened twice, and every payment must be
//! charged exactly once at the provider. A payment killed between its charge
//! and `complete` is taken over when its lease lapses and charged again
//! under the same provider key, which the provider deduplicates. A plain
//! event is recorded *before* it is handled, so a kill between the two
//! skips its effect rather than repeating it; the run reports such events.
//!
//! ```text
//! cargo run --release --example consumer
//! ```
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dedupkv::{Begin, Fingerprint, Key, Store};

const EVENTS: u64 = 4_000;
const WORKERS: usize = 4;
/// The first life handles events `0..FIRST_LIFE`.
const FIRST_LIFE: u64 = EVENTS * 6 / 10;
/// Set (to the store's path) in the child process only.
const CHILD_ENV: &str = "DEDUPKV_CONSUMER_CHILD";
/// Short, so the second life takes over the killed payments soon.
const LEASE: Duration = Duration::from_secs(2);
const PLAIN: &str = "shop-42/events";
const PAYMENTS: &str = "shop-42/payments";

#[derive(Clone, Copy, Debug)]
struct Event {
    id: u64,
    payment: bool,
}

/// What a worker does outside the store: the downstream systems see these.
enum Effect {
    /// A plain event was counted.
    Count(u64),
    /// A charge request to the payment provider, under an idempotency key.
    Charge { provider_key: String, id: u64 },
    /// The event is handled: the broker may forget it.
    Ack(u64),
}

impl Effect {
    fn line(&self) -> String {
        match self {
            Effect::Count(id) => format!("COUNT {id}"),
            Effect::Charge { provider_key, id } => format!("CHARGE {provider_key} {id}"),
            Effect::Ack(id) => format!("ACK {id}"),
        }
    }

    fn parse(line: &str) -> Option<Effect> {
        let mut words = line.split(' ');
        let effect = match (words.next()?, words.next()?, words.next()) {
            ("COUNT", id, None) => Effect::Count(id.parse().ok()?),
            ("ACK", id, None) => Effect::Ack(id.parse().ok()?),
            ("CHARGE", key, Some(id)) => Effect::Charge {
                provider_key: key.to_string(),
                id: id.parse().ok()?,
            },
            _ => return None,
        };
        Some(effect)
    }
}

/// The downstream systems, which outlive the consumer's process.
#[derive(Default)]
struct Downstream {
    counted: HashMap<u64, u32>,
    /// The provider: charges by idempotency key, with the payment they are
    /// for and how many requests carried the key.
    charges: HashMap<String, (u64, u32)>,
    acked: HashSet<u64>,
}

impl Downstream {
    fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::Count(id) => *self.counted.entry(id).or_default() += 1,
            Effect::Charge { provider_key, id } => {
                self.charges.entry(provider_key).or_insert((id, 0)).1 += 1;
            }
            Effect::Ack(id) => {
                self.acked.insert(id);
            }
        }
    }
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

/// Every event in `ids` once, plus redeliveries and near-simultaneous
/// duplicates, shuffled.
fn deliveries(ids: impl IntoIterator<Item = u64>, seed: u64) -> VecDeque<Event> {
    let mut s = seed;
    let mut out = Vec::new();
    for id in ids {
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

fn receipt(id: u64) -> String {
    format!("receipt-{id}-{}", 100 + id % 50)
}

/// Handles one delivery; `false` asks the broker to redeliver it later.
fn handle(store: &Store, ev: Event, emit: &(dyn Fn(Effect) + Sync), tally: &Tally) -> bool {
    tally.deliveries.fetch_add(1, Ordering::Relaxed);
    let id = ev.id.to_string();
    if !ev.payment {
        // Record first; count only if new.
        if store
            .insert_if_absent(&Key::new(PLAIN, &id))
            .expect("insert")
        {
            emit(Effect::Count(ev.id));
        } else {
            tally.suppressed.fetch_add(1, Ordering::Relaxed);
        }
        emit(Effect::Ack(ev.id));
        return true;
    }
    let key = Key::new(PAYMENTS, &id);
    let amount = 100 + ev.id % 50;
    match store
        .begin(&key, Fingerprint::of(format!("charge {amount}")))
        .expect("begin")
    {
        Begin::Started(claim) => {
            // The provider deduplicates on this key: the same on every
            // attempt of the payment, even in another process.
            emit(Effect::Charge {
                provider_key: claim.provider_key(),
                id: ev.id,
            });
            std::thread::sleep(Duration::from_millis(1)); // the provider's answer
            store
                .complete(&claim, receipt(ev.id).as_bytes())
                .expect("complete");
            emit(Effect::Ack(ev.id));
            true
        }
        Begin::Completed(record) => {
            let got = String::from_utf8_lossy(record.outcome().unwrap_or_default()).into_owned();
            assert_eq!(got, receipt(ev.id), "replayed the original outcome");
            tally.suppressed.fetch_add(1, Ordering::Relaxed);
            tally.replayed_receipts.fetch_add(1, Ordering::Relaxed);
            emit(Effect::Ack(ev.id));
            true
        }
        Begin::InProgress(_) => {
            // Another worker (or a killed process, until its lease lapses)
            // holds it: put it back (a nack).
            tally.in_progress_requeued.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

fn run_workers(
    store: &Store,
    queue: VecDeque<Event>,
    emit: &(dyn Fn(Effect) + Sync),
    tally: &Tally,
) {
    let queue = Mutex::new(queue);
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            let queue = &queue;
            s.spawn(move || {
                loop {
                    let Some(ev) = queue.lock().unwrap().pop_front() else {
                        break;
                    };
                    if !handle(store, ev, emit, tally) {
                        queue.lock().unwrap().push_back(ev);
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            });
        }
    });
}

fn open(path: &std::path::Path) -> dedupkv::Result<Store> {
    Store::builder().lease(LEASE).open(path)
}

/// The first life: handles events until the parent kills it, writing every
/// effect to stdout (one line each, so the parent sees what happened).
fn child(path: &std::path::Path) -> dedupkv::Result<()> {
    let store = open(path)?;
    let out = Mutex::new(std::io::stdout());
    let emit = |e: Effect| {
        let mut out = out.lock().unwrap();
        writeln!(out, "{}", e.line()).expect("stdout");
        out.flush().expect("stdout");
    };
    run_workers(
        &store,
        deliveries(0..FIRST_LIFE, 1),
        &emit,
        &Tally::default(),
    );
    Ok(())
}

/// The first life: this program again as a child process, killed (SIGKILL) after
/// a third of its effects (it has more than twice as many to go), with
/// payments in flight. Returns how many effects it saw before the kill.
fn first_life(path: &std::path::Path, downstream: &Mutex<Downstream>) -> usize {
    let mut child = Command::new(std::env::current_exe().expect("this program"))
        .env(CHILD_ENV, path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the first life");
    let kill_after = usize::try_from(FIRST_LIFE / 3).expect("small");
    let mut seen = 0;
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    for line in lines.by_ref() {
        let line = line.expect("read the child's output");
        let effect = Effect::parse(&line).unwrap_or_else(|| panic!("child said {line:?}"));
        downstream.lock().unwrap().apply(effect);
        seen += 1;
        if seen == kill_after {
            break;
        }
    }
    child.kill().expect("SIGKILL the first life"); // SIGKILL on Unix
    let status = child.wait().expect("wait for the first life");
    assert!(!status.success(), "the first life was killed, not finished");
    // What it wrote before it died is still in the pipe.
    for line in lines {
        let Ok(line) = line else { break };
        if let Some(effect) = Effect::parse(&line) {
            downstream.lock().unwrap().apply(effect);
        }
    }
    seen
}

pub fn main() -> dedupkv::Result<()> {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        return child(path.as_ref());
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = std::env::var_os("DEDUPKV_PATH")
        .map_or_else(|| dir.path().join("consumer.redb"), Into::into);
    let start = std::time::Instant::now();
    let downstream = Mutex::new(Downstream::default());

    let seen = first_life(&path, &downstream);
    let acked_before = downstream.lock().unwrap().acked.len();

    // Second life: reopen the store. The broker redelivers what was never
    // acked, a window of acked events (acks lost with the process), then
    // the rest of the stream.
    let store = open(&path)?;
    let unacked: Vec<u64> = {
        let d = downstream.lock().unwrap();
        (0..FIRST_LIFE).filter(|id| !d.acked.contains(id)).collect()
    };
    let mut queue = deliveries(unacked, 2);
    queue.extend(deliveries(EVENTS * 2 / 10..FIRST_LIFE, 3));
    queue.extend(deliveries(FIRST_LIFE..EVENTS, 4));
    let tally = Tally::default();
    let emit = |e: Effect| downstream.lock().unwrap().apply(e);
    run_workers(&store, queue, &emit, &tally);

    let d = downstream.into_inner().unwrap();
    let repeated = d.counted.values().filter(|n| **n > 1).count();
    let mut keys_per_payment: HashMap<u64, u32> = HashMap::new();
    for (id, _) in d.charges.values() {
        *keys_per_payment.entry(*id).or_default() += 1;
    }
    let payments = (0..EVENTS).filter(|i| i % 2 == 1);
    let charged_once = payments
        .clone()
        .all(|i| keys_per_payment.get(&i) == Some(&1));
    let absorbed: u32 = d.charges.values().map(|(_, n)| n - 1).sum();
    // Recorded, then killed before the count: skipped, never repeated.
    let lost: Vec<u64> = (0..EVENTS)
        .filter(|i| i % 2 == 0 && !d.counted.contains_key(i))
        .collect();
    for id in &lost {
        let key = Key::owned(PLAIN.into(), id.to_string().into_bytes());
        assert!(store.get(&key)?.is_some(), "event {id} was never recorded");
    }

    println!(
        "dedupkv at-least-once consumer ({WORKERS} workers, SIGKILLed mid-stream) at {}",
        path.display()
    );
    println!("  events:                       {EVENTS}");
    println!("  first life (killed):          {seen} effects read, {acked_before} events acked");
    println!(
        "  second life deliveries:       {}",
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
        "  plain events skipped:         {} (recorded, then killed before the count)",
        lost.len()
    );
    println!(
        "  charge requests repeated:     {absorbed} (same provider key: the provider charged once)"
    );
    println!("  elapsed:                      {:.2?}", start.elapsed());
    assert_eq!(repeated, 0, "a plain event was counted twice");
    assert!(charged_once, "a payment was charged twice or never");
    assert!(
        lost.len() <= WORKERS,
        "more counts lost than events in flight"
    );
    println!("  no effect twice, every payment charged exactly once: yes");
    Ok(())
}
