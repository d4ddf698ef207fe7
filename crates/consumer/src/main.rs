//! The main job: a simulated at-least-once consumer, killed mid-stream.
//!
//! A broker delivers 4,000 events to 4 worker threads *at least once*: some
//! are redelivered (a lost ack), some are delivered to two workers at the
//! same time. Every event is an idempotent operation: `begin`, the effect,
//! then `complete`. Half are "count this" events, counted by a downstream
//! that keeps its own record; the other half are payments, sent to a
//! payment provider under the claim's `provider_key()`. Repeats get the
//! stored outcome back.
//!
//! The first life of the consumer is a child process (this program run
//! again with `DEDUPKV_CONSUMER_CHILD` set). The parent plays the broker and
//! the downstream systems: it reads the child's effects and acks from a
//! pipe and SIGKILLs it (`Child::kill`) in the middle of the stream, with
//! payments in flight. Then it reopens the store and runs the second life
//! itself: every unacknowledged event is redelivered, and so is a window of
//! acknowledged ones (their acks were lost with the process).
//!
//! At the end every effect must have happened exactly once. A claim the
//! killed process left in progress is taken over at once by the second
//! life, marked `interrupted()`: the effect may or may not have happened.
//! A payment is then charged again under the same provider key, which the
//! provider deduplicates; a count first asks the downstream whether it
//! already counted the event (reconciliation against the system of record).
//!
//! ```text
//! cargo run --release -p dedupkv-consumer
//! ```
//!
//! It needs nothing but the library (no features): `tests/consumer_example.rs`
//! runs this same file as a test, where the library's test dependencies are.
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
    interrupted: AtomicU64,
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

/// What a worker can do outside the store.
struct Env<'a> {
    emit: &'a (dyn Fn(Effect) + Sync),
    /// Asks the counting downstream whether it counted an event (the
    /// system of record, consulted only after an interrupted attempt).
    counted: &'a (dyn Fn(u64) -> bool + Sync),
}

/// Handles one delivery; `false` asks the broker to redeliver it later.
fn handle(store: &Store, ev: Event, env: &Env<'_>, tally: &Tally) -> bool {
    tally.deliveries.fetch_add(1, Ordering::Relaxed);
    let id = ev.id.to_string();
    let (key, request) = if ev.payment {
        (
            Key::new(PAYMENTS, &id),
            format!("charge {}", 100 + ev.id % 50),
        )
    } else {
        (Key::new(PLAIN, &id), "count".to_string())
    };
    match store.begin(&key, Fingerprint::of(request)).expect("begin") {
        Begin::Started(claim) => {
            if claim.interrupted() {
                tally.interrupted.fetch_add(1, Ordering::Relaxed);
            }
            let outcome = if ev.payment {
                // The provider deduplicates on this key: the same on every
                // attempt of the payment, even in another process. No key
                // (the store was closed or fenced): no charge; the claim
                // drops, released, and the event is redelivered.
                let Ok(provider_key) = claim.provider_key() else {
                    return false;
                };
                (env.emit)(Effect::Charge {
                    provider_key,
                    id: ev.id,
                });
                std::thread::sleep(Duration::from_millis(1)); // the provider's answer
                receipt(ev.id)
            } else {
                // An interrupted attempt may have counted it already: ask.
                if !(claim.interrupted() && (env.counted)(ev.id)) {
                    (env.emit)(Effect::Count(ev.id));
                }
                "counted".to_string()
            };
            store
                .complete(&claim, outcome.as_bytes())
                .expect("complete");
            (env.emit)(Effect::Ack(ev.id));
            true
        }
        Begin::Completed(record) => {
            let got = String::from_utf8_lossy(record.outcome().unwrap_or_default()).into_owned();
            if ev.payment {
                assert_eq!(got, receipt(ev.id), "replayed the original outcome");
                tally.replayed_receipts.fetch_add(1, Ordering::Relaxed);
            }
            tally.suppressed.fetch_add(1, Ordering::Relaxed);
            (env.emit)(Effect::Ack(ev.id));
            true
        }
        Begin::InProgress(_) => {
            // Another worker holds it: put it back (a nack).
            tally.in_progress_requeued.fetch_add(1, Ordering::Relaxed);
            false
        }
        // This consumer never dead-letters (it has no retry policy).
        Begin::DeadLettered(dl) => panic!("unexpected dead letter: {}", dl.key()),
    }
}

fn run_workers(store: &Store, queue: VecDeque<Event>, env: &Env<'_>, tally: &Tally) {
    let queue = Mutex::new(queue);
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            let queue = &queue;
            s.spawn(move || {
                loop {
                    let Some(ev) = queue.lock().unwrap().pop_front() else {
                        break;
                    };
                    if !handle(store, ev, env, tally) {
                        queue.lock().unwrap().push_back(ev);
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            });
        }
    });
}

fn open(path: &std::path::Path) -> dedupkv::Result<Store> {
    // The default lease (30 s): a slow worker is waited for, and the
    // claims the killed process left are taken over at once anyway.
    Store::builder().open(path)
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
    // A fresh store: no attempt is ever interrupted in the first life.
    let counted = |_: u64| unreachable!("the first life interrupts no attempt");
    let env = Env {
        emit: &emit,
        counted: &counted,
    };
    run_workers(
        &store,
        deliveries(0..FIRST_LIFE, 1),
        &env,
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

/// A directory of this run's own, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let name = format!("dedupkv-consumer-{}-{nanos}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir(&dir)?; // fails rather than reuse a store
        Ok(TempDir(dir))
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn main() -> dedupkv::Result<()> {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        return child(path.as_ref());
    }
    let dir = TempDir::new().expect("temp dir");
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
    let counted = |id: u64| downstream.lock().unwrap().counted.contains_key(&id);
    let env = Env {
        emit: &emit,
        counted: &counted,
    };
    run_workers(&store, queue, &env, &tally);

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
    let counted_once = (0..EVENTS)
        .filter(|i| i % 2 == 0)
        .all(|i| d.counted.get(&i) == Some(&1));

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
        "  interrupted attempts:         {} (left by the killed process, reconciled)",
        tally.interrupted.load(Ordering::Relaxed)
    );
    println!(
        "  charge requests repeated:     {absorbed} (same provider key: the provider charged once)"
    );
    println!("  elapsed:                      {:.2?}", start.elapsed());
    assert_eq!(repeated, 0, "an event was counted twice");
    assert!(counted_once, "an event was never counted");
    assert!(charged_once, "a payment was charged twice or never");
    println!("  every effect exactly once: yes");
    Ok(())
}
