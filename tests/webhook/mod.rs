//! A payment webhook that ships each paid order exactly once.
//!
//! A payment provider's webhook sender delivers "order paid" events to a
//! handler that creates one shipment per order through a carrier. The
//! carrier supports idempotency keys: a call with a key it has seen
//! returns the first label and ships nothing. The sender is unkind: it
//! redelivers (lost acks), sends some events to two workers at once,
//! retries when an answer is slow, and the handler's process is killed
//! (SIGKILL) right after the carrier accepted a call, before the handler
//! recorded the answer. A few orders are for an address the carrier always
//! rejects: after the retry policy's attempts they wait in the dead-letter
//! area, with the carrier's reason, for an operator.
//!
//! The handler is this program run again as a child process (with
//! `DEDUPKV_WEBHOOK_CHILD` set to the working directory); the parent plays
//! the sender, reads the handler's answers from a pipe, kills it and starts
//! it again. Each event is handled by `RetryPolicy::call`, the runner of
//! an external call, which does the whole safe sequence:
//!
//! 1. `begin_with_intent`: the claim and the intent to call the carrier,
//!    in one durable commit, before the call; then the policy's limits;
//! 2. if the claim took over an attempt that never answered
//!    (`interrupted()`, `unanswered_intent()`), the handler's lookup asks
//!    the carrier by the provider key first, and if it accepted, its label
//!    is recorded without calling again;
//! 3. otherwise the handler's call goes to the carrier with
//!    `provider_key()`; the runner records the answer (`mark_sent`) and
//!    completes with the label and the parcels shipped (counted per
//!    reconciliation window), or retries a refusal under the policy and
//!    dead-letters it when the policy gives up.
//!
//! The carrier is durable outside the store: a file with one line per
//! accepted call, `provider_key order label parcels`, each appended with
//! one `write(2)`. At the end the parent opens the store and checks it
//! against that file: one label per paid order, no order shipped twice, no
//! unanswered intent left, the dead letters and their reasons, and the
//! store's per-window counts equal to the carrier's.
//!
//! ```text
//! cargo test --release --test effects_webhook_sigkill
//! ```
//!
//! (It was `examples/webhook_shipping.rs`; the examples are now one idea
//! each, and this harness is a test.)
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dedupkv::{
    Claim, Effect, Error, ErrorClass, Fingerprint, Intent, Key, Listing, RetryPolicy, Run, Store,
    Tally,
};

const ORDERS: u64 = 200;
const WORKERS: usize = 4;
/// Kills, each right after the carrier accepted a call.
const KILLS: usize = 3;
/// Set (to the working directory) in the child process only.
const CHILD_ENV: &str = "DEDUPKV_WEBHOOK_CHILD";
const SCOPE: &str = "orders";
/// Short, so a slow carrier answer outlives the claim and the sender's
/// retry takes it over (and must reconcile before calling again).
const LEASE: Duration = Duration::from_millis(200);
/// How long the carrier sits on a slow answer (after accepting the call).
const SLOW_ANSWER: Duration = Duration::from_millis(400);
/// The sender retries a delivery with no answer after this long.
const SENDER_TIMEOUT: Duration = Duration::from_millis(150);
/// The sender's least wait before redelivering an event the handler
/// answered busy.
const BUSY_DELAY: Duration = Duration::from_millis(50);
/// Deliveries the sender keeps unanswered at a time.
const IN_FLIGHT: usize = 8;
const MAX_ATTEMPTS: u32 = 3;
const WINDOW: Duration = Duration::from_secs(3600);
const STORE_FILE: &str = "webhooks.redb";
const CARRIER_FILE: &str = "carrier.log";

/// The order's address: every 23rd is one the carrier cannot deliver to.
fn undeliverable(order: u64) -> bool {
    order % 23 == 5
}

/// Orders whose first accepted call is answered slowly.
fn slow(order: u64) -> bool {
    order % 50 == 17
}

fn parcels(order: u64) -> u64 {
    1 + order % 3
}

fn request(order: u64) -> String {
    let address = if undeliverable(order) {
        "1 Nowhere Lane"
    } else {
        "12 Harbour Road"
    };
    format!(
        "ship order {order}: {} parcels to {address}",
        parcels(order)
    )
}

// ---------------------------------------------------------------- carrier

/// One call the carrier accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shipment {
    provider_key: String,
    order: u64,
    label: String,
    parcels: u64,
}

impl Shipment {
    fn line(&self) -> String {
        format!(
            "{} {} {} {}\n",
            self.provider_key, self.order, self.label, self.parcels
        )
    }

    fn parse(line: &str) -> Option<Shipment> {
        let mut w = line.split(' ');
        let s = Shipment {
            provider_key: w.next()?.to_string(),
            order: w.next()?.parse().ok()?,
            label: w.next()?.to_string(),
            parcels: w.next()?.parse().ok()?,
        };
        w.next().is_none().then_some(s)
    }
}

/// Every call the carrier accepted, from its file (a torn last line,
/// impossible with one `write(2)` per line, would be rejected here).
fn accepted_calls(path: &Path) -> Vec<Shipment> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| Shipment::parse(l).unwrap_or_else(|| panic!("carrier file line {l:?}")))
        .collect()
}

/// The simulated carrier: deduplicates on the idempotency key, durably.
struct Carrier {
    path: PathBuf,
    /// Accepted calls by provider key.
    seen: Mutex<HashMap<String, Shipment>>,
}

impl Carrier {
    fn open(path: PathBuf) -> Carrier {
        let seen = accepted_calls(&path)
            .into_iter()
            .map(|s| (s.provider_key.clone(), s))
            .collect();
        Carrier {
            path,
            seen: Mutex::new(seen),
        }
    }

    /// What the carrier says about a key: the label, if it accepted a call.
    fn lookup(&self, provider_key: &str) -> Option<String> {
        let seen = self.seen.lock().unwrap();
        seen.get(provider_key).map(|s| s.label.clone())
    }

    /// Creates a shipment, or returns the one this key created before.
    /// `Ok((label, fresh))`, where `fresh` says the call shipped something.
    fn create(&self, provider_key: &str, order: u64) -> Result<(String, bool), String> {
        if undeliverable(order) {
            return Err("carrier rejected the address: undeliverable".to_string());
        }
        let mut seen = self.seen.lock().unwrap();
        if let Some(s) = seen.get(provider_key) {
            return Ok((s.label.clone(), false));
        }
        let s = Shipment {
            provider_key: provider_key.to_string(),
            order,
            label: format!("1Z{:06}", seen.len() + 1),
            parcels: parcels(order),
        };
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .expect("carrier file");
        file.write_all(s.line().as_bytes()).expect("carrier write"); // one write(2)
        let label = s.label.clone();
        seen.insert(s.provider_key.clone(), s);
        Ok((label, true))
    }
}

// ---------------------------------------------------------------- handler

/// What the sender tells the handler: deliver an event (`hold`: freeze
/// right after the carrier accepts, so the kill lands exactly there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Delivery {
    order: u64,
    twin: bool,
    hold: bool,
}

impl Delivery {
    fn line(self) -> String {
        let verb = if self.twin { "TWIN" } else { "DELIVER" };
        let hold = if self.hold { " hold" } else { "" };
        format!("{verb} {}{hold}\n", self.order)
    }

    fn parse(line: &str) -> Option<Delivery> {
        let mut w = line.split(' ');
        let twin = match w.next()? {
            "TWIN" => true,
            "DELIVER" => false,
            _ => return None,
        };
        let order = w.next()?.parse().ok()?;
        let hold = match w.next() {
            None => false,
            Some("hold") => true,
            Some(_) => return None,
        };
        Some(Delivery { order, twin, hold })
    }
}

/// The handler's answer to one delivery, as it tells the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// Shipped now, with this label.
    Shipped(u64, String),
    /// Shipped before: the stored label.
    Replayed(u64, String),
    /// Another attempt holds the order: deliver again after its lease
    /// (in ms).
    Busy(u64, u64),
    /// In the dead-letter area.
    DeadLettered(u64),
    /// Another attempt took the order over during this one.
    Lost(u64),
}

fn key(order: &str) -> Key<'_> {
    Key::new(SCOPE, order)
}

struct Handler<'a> {
    store: &'a Store,
    carrier: &'a Carrier,
    policy: &'a RetryPolicy,
    say: &'a (dyn Fn(String) + Sync),
}

impl Handler<'_> {
    /// Handles one delivery to its answer: `RetryPolicy::call` does the
    /// safe sequence of each attempt, and a refusal is retried under the
    /// policy until it gives up (a dead letter).
    fn handle(&self, d: Delivery) -> dedupkv::Result<Answer> {
        let id = d.order.to_string();
        let key = key(&id);
        let req = request(d.order);
        let intent = Intent {
            target: "carrier",
            request: req.as_bytes(),
        };
        let amount = i64::try_from(parcels(d.order)).expect("small");
        loop {
            let effect = Effect::new(
                intent,
                |claim: &Claim| self.lookup(claim, d.order),
                |claim: &Claim| self.ship(claim, d),
                // The carrier's refusal may pass (an address fixed at its
                // end): retried, then dead-lettered with its reason.
                |_: &String| ErrorClass::Retryable,
            )
            .amount(amount);
            let run = match self
                .policy
                .call(self.store, &key, Fingerprint::of(&req), effect)
            {
                Ok(run) => run,
                Err(Error::ClaimLost { .. }) => return Ok(Answer::Lost(d.order)),
                Err(e) => return Err(e),
            };
            let text = |label: Vec<u8>| String::from_utf8(label).expect("a label");
            return Ok(match run {
                Run::Done(label) | Run::Reconciled(label) => Answer::Shipped(d.order, text(label)),
                Run::Replayed(label) => Answer::Replayed(d.order, text(label)),
                Run::InProgress { retry_after, .. } => {
                    let ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
                    Answer::Busy(d.order, ms)
                }
                Run::RetryAfter { after, .. } => {
                    std::thread::sleep(after);
                    continue;
                }
                Run::GaveUp {
                    dead_lettered: true,
                    ..
                }
                | Run::Exhausted { .. }
                | Run::DeadLettered(_) => Answer::DeadLettered(d.order),
                other => panic!("order {}: {other:?}", d.order),
            });
        }
    }

    /// Asks the carrier about the call made with the claim's provider
    /// key (after an interrupted attempt, or one whose answer is unknown).
    /// (This carrier always answers its lookups; one that can fail to
    /// answer would return `Err`, and the runner would retry later.)
    fn lookup(&self, claim: &Claim, order: u64) -> Result<Option<Vec<u8>>, String> {
        // The runner took the key before calling: this answers at once.
        let provider_key = claim.provider_key().map_err(|e| e.to_string())?;
        let found = self.carrier.lookup(&provider_key);
        if claim.interrupted() {
            let what = if found.is_some() {
                "accepted"
            } else {
                "absent"
            };
            (self.say)(format!("RECONCILED {order} {what}"));
        }
        Ok(found.map(String::into_bytes))
    }

    /// Calls the carrier with the claim's provider key.
    fn ship(&self, claim: &Claim, d: Delivery) -> Result<Vec<u8>, String> {
        let provider_key = claim.provider_key().map_err(|e| e.to_string())?;
        let (label, fresh) = self.carrier.create(&provider_key, d.order)?;
        if fresh {
            (self.say)(format!("ACCEPTED {}", d.order));
            if d.hold {
                // Frozen between the carrier's accept and mark_sent: the
                // sender kills the process here.
                loop {
                    std::thread::park();
                }
            }
            if slow(d.order) {
                std::thread::sleep(SLOW_ANSWER); // past the lease
            }
        }
        Ok(label.into_bytes())
    }
}

impl Answer {
    fn line(&self) -> String {
        match self {
            Answer::Shipped(o, l) => format!("SHIPPED {o} {l}"),
            Answer::Replayed(o, l) => format!("REPLAYED {o} {l}"),
            Answer::Busy(o, ms) => format!("BUSY {o} {ms}"),
            Answer::DeadLettered(o) => format!("DEAD {o}"),
            Answer::Lost(o) => format!("LOST {o}"),
        }
    }

    fn parse(line: &str) -> Option<Answer> {
        let mut w = line.split(' ');
        let verb = w.next()?;
        let order = w.next()?.parse().ok()?;
        let answer = match (verb, w.next()) {
            ("SHIPPED", Some(l)) => Answer::Shipped(order, l.to_string()),
            ("REPLAYED", Some(l)) => Answer::Replayed(order, l.to_string()),
            ("BUSY", Some(ms)) => Answer::Busy(order, ms.parse().ok()?),
            ("DEAD", None) => Answer::DeadLettered(order),
            ("LOST", None) => Answer::Lost(order),
            _ => return None,
        };
        Some(answer)
    }

    fn order(&self) -> u64 {
        match self {
            Answer::Shipped(o, _)
            | Answer::Replayed(o, _)
            | Answer::Busy(o, _)
            | Answer::DeadLettered(o)
            | Answer::Lost(o) => *o,
        }
    }
}

fn open(dir: &Path) -> dedupkv::Result<Store> {
    Store::builder()
        .lease(LEASE)
        .reconcile_window(WINDOW)
        .open(dir.join(STORE_FILE))
}

/// The handler process: reads deliveries from stdin, hands them to the
/// first idle of its workers (a twin to two at once), writes every answer
/// to stdout.
fn child(dir: &Path) -> dedupkv::Result<()> {
    let store = open(dir)?;
    let carrier = Carrier::open(dir.join(CARRIER_FILE));
    let policy = RetryPolicy::builder()
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(10))
        .max_attempts(MAX_ATTEMPTS)
        .build()?;
    let out = Mutex::new(std::io::stdout());
    let say = |line: String| {
        let mut out = out.lock().unwrap();
        writeln!(out, "{line}").expect("stdout");
        out.flush().expect("stdout");
    };
    let handler = Handler {
        store: &store,
        carrier: &carrier,
        policy: &policy,
        say: &say,
    };
    std::thread::scope(|s| {
        let (queue, rx) = crossbeam_channel::unbounded::<Delivery>();
        for _ in 0..WORKERS {
            let rx = rx.clone();
            let handler = &handler;
            s.spawn(move || {
                for d in rx {
                    let answer = handler.handle(d).expect("the store failed");
                    (handler.say)(answer.line());
                }
            });
        }
        say("READY".to_string());
        for line in std::io::stdin().lock().lines() {
            let line = line.expect("stdin");
            let d = Delivery::parse(&line).unwrap_or_else(|| panic!("sender said {line:?}"));
            let copies = if d.twin { 2 } else { 1 };
            for _ in 0..copies {
                queue.send(d).expect("worker");
            }
        }
        drop(queue); // stdin closed: finish what was delivered, then exit
    });
    Ok(())
}

// ---------------------------------------------------------------- sender

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Every order once, some redelivered later, some sent to two workers at
/// once, shuffled locally; `KILLS` first deliveries of plain orders spread
/// over the stream are marked to hold after the carrier's accept.
fn stream(seed: u64) -> VecDeque<Delivery> {
    let mut s = seed;
    let mut out = Vec::new();
    for order in 0..ORDERS {
        let one = Delivery {
            order,
            twin: false,
            hold: false,
        };
        match splitmix(&mut s) % 10 {
            0..=1 => out.extend([one, one]), // redelivered (a lost ack)
            2 => out.push(Delivery { twin: true, ..one }),
            _ => out.push(one),
        }
    }
    for i in (1..out.len()).rev() {
        let j = i.saturating_sub((splitmix(&mut s) % 6) as usize);
        out.swap(i, j);
    }
    let mut first = HashSet::new();
    let mut holds = 0;
    for i in 0..out.len() {
        let d = out[i];
        let fresh = first.insert(d.order);
        let due = i * (KILLS + 1) >= out.len() * (holds + 1);
        if holds < KILLS && due && fresh && !d.twin && !undeliverable(d.order) && !slow(d.order) {
            out[i].hold = true;
            holds += 1;
        }
    }
    assert_eq!(holds, KILLS, "the stream has room for every kill");
    out.into()
}

/// The handler process as the sender sees it.
/// Dropped early (the sender panicked), it kills the process, so no frozen
/// handler outlives the run.
struct Life {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Life {
    fn start(dir: &Path) -> Life {
        let mut child = Command::new(std::env::current_exe().expect("this program"))
            .env(CHILD_ENV, dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the handler");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let life = Life {
            child,
            stdin: Some(stdin),
            lines,
            reader: Some(reader),
        };
        // libtest may print in front of READY when this is a test binary.
        let start = Instant::now();
        loop {
            let left = Duration::from_secs(60).saturating_sub(start.elapsed());
            let said = life.lines.recv_timeout(left).expect("the handler starts");
            if said.ends_with("READY") {
                return life;
            }
        }
    }

    /// Closes the handler's input (`kill`: SIGKILLs it first), waits for it
    /// and returns the lines it wrote that were not read yet.
    fn end(mut self, kill: bool) -> (std::process::ExitStatus, Vec<String>) {
        if kill {
            self.child.kill().expect("SIGKILL the handler");
        }
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for the handler");
        if let Some(reader) = self.reader.take() {
            reader.join().expect("reader");
        }
        (status, self.lines.try_iter().collect())
    }
}

impl Drop for Life {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What the sender saw.
#[derive(Default)]
struct Sender {
    queue: VecDeque<Delivery>,
    later: Vec<(Instant, Delivery)>,
    /// Per order: answers still due, and when it was last sent.
    in_flight: HashMap<u64, (usize, Instant, bool)>,
    acked: HashSet<u64>,
    acked_order: Vec<u64>,
    labels: HashMap<u64, String>,
    holds: HashSet<u64>,
    kills: usize,
    deliveries: usize,
    retries: usize,
    busy: usize,
    lost: usize,
    replayed: usize,
    reconciled_accepted: usize,
    reconciled_absent: usize,
}

impl Sender {
    fn outstanding(&self) -> usize {
        self.in_flight.values().map(|(n, _, _)| n).sum()
    }

    fn send(&mut self, life: &mut Life, d: Delivery) {
        life.stdin
            .as_mut()
            .expect("the handler's input is open")
            .write_all(d.line().as_bytes())
            .expect("write to the handler");
        let copies = if d.twin { 2 } else { 1 };
        self.deliveries += copies;
        let e = self
            .in_flight
            .entry(d.order)
            .or_insert((0, Instant::now(), false));
        e.0 += copies;
        e.1 = Instant::now();
    }

    /// Reads one line of the handler; `true` if it says a held call was
    /// accepted (time to kill).
    fn read(&mut self, line: &str) -> bool {
        if let Some(rest) = line.strip_prefix("ACCEPTED ") {
            let order: u64 = rest.parse().expect("order");
            return self.holds.remove(&order);
        }
        if let Some(rest) = line.strip_prefix("RECONCILED ") {
            match rest.split_once(' ') {
                Some((_, "accepted")) => self.reconciled_accepted += 1,
                Some((_, "absent")) => self.reconciled_absent += 1,
                _ => panic!("handler said {line:?}"),
            }
            return false;
        }
        let answer = Answer::parse(line).unwrap_or_else(|| panic!("handler said {line:?}"));
        let order = answer.order();
        if let Some(e) = self.in_flight.get_mut(&order) {
            e.0 = e.0.saturating_sub(1);
            if e.0 == 0 {
                self.in_flight.remove(&order);
            }
        }
        match answer {
            Answer::Shipped(o, label) | Answer::Replayed(o, label) => {
                if line.starts_with("REPLAYED ") {
                    self.replayed += 1;
                }
                let first = self.labels.entry(o).or_insert_with(|| label.clone());
                assert_eq!(*first, label, "order {o} answered with two labels");
                self.ack(o);
            }
            Answer::DeadLettered(o) => self.ack(o),
            Answer::Busy(o, ms) => {
                self.busy += 1;
                if !self.acked.contains(&o) {
                    let d = Delivery {
                        order: o,
                        twin: false,
                        hold: false,
                    };
                    // After the running attempt's lease: then it is done,
                    // or free to take over.
                    let wait = Duration::from_millis(ms).max(BUSY_DELAY);
                    self.later.push((Instant::now() + wait, d));
                }
            }
            Answer::Lost(_) => self.lost += 1,
        }
        false
    }

    fn ack(&mut self, order: u64) {
        if self.acked.insert(order) {
            self.acked_order.push(order);
        }
    }

    fn done(&self) -> bool {
        self.queue.is_empty() && self.later.is_empty() && self.acked.len() == ORDERS as usize
    }

    /// Retries deliveries whose answer is slow, once each, and moves due
    /// busy redeliveries to the queue.
    fn tick(&mut self) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = self.later.drain(..).partition(|(t, _)| *t <= now);
        self.later = later;
        self.queue.extend(due.into_iter().map(|(_, d)| d));
        for (order, (n, at, retried)) in &mut self.in_flight {
            if *n > 0 && !*retried && now.duration_since(*at) >= SENDER_TIMEOUT {
                *retried = true;
                self.retries += 1;
                self.queue.push_front(Delivery {
                    order: *order,
                    twin: false,
                    hold: false,
                });
            }
        }
    }

    /// After a kill: what was never answered is delivered again, and so
    /// are the last few acked orders (their acks died with the process).
    fn redeliver(&mut self) {
        let mut again: Vec<u64> = self.in_flight.drain().map(|(o, _)| o).collect();
        again.sort_unstable();
        again.extend(self.acked_order.iter().rev().take(5));
        for order in again {
            self.queue.push_front(Delivery {
                order,
                twin: false,
                hold: false,
            });
        }
    }
}

/// Runs the sender against handler lives until every order is answered.
fn send_all(dir: &Path) -> Sender {
    let mut sender = Sender {
        queue: stream(7),
        ..Sender::default()
    };
    sender.holds = sender
        .queue
        .iter()
        .filter(|d| d.hold)
        .map(|d| d.order)
        .collect();
    let mut life = Life::start(dir);
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the sender is stuck: {} of {ORDERS} orders answered",
            sender.acked.len()
        );
        while sender.outstanding() < IN_FLIGHT {
            let Some(d) = sender.queue.pop_front() else {
                break;
            };
            sender.send(&mut life, d);
        }
        if sender.done() {
            break;
        }
        match life.lines.recv_timeout(Duration::from_millis(20)) {
            Ok(said) => {
                if sender.read(&said) {
                    let (status, rest) = life.end(true);
                    assert!(!status.success(), "the handler was killed");
                    // What it wrote before it died is still in the pipe.
                    for line in rest {
                        sender.read(&line);
                    }
                    sender.kills += 1;
                    sender.redeliver();
                    life = Life::start(dir);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => panic!("the handler died on its own"),
        }
        sender.tick();
    }
    // Every order answered: close the stream, let the handler finish.
    let (status, rest) = life.end(false);
    assert!(status.success(), "the handler failed: {status}");
    for line in rest {
        sender.read(&line);
    }
    sender
}

// ---------------------------------------------------------------- report

/// What the run found, checked against the carrier's file.
#[derive(Debug)]
pub struct Report {
    pub orders: usize,
    pub shipments: usize,
    pub expected_shipments: usize,
    pub duplicate_labels: usize,
    /// Takeovers of an interrupted attempt whose call the carrier had
    /// accepted: recorded without calling again.
    pub reconciled_accepted: usize,
    /// Takeovers whose earlier attempt never reached the carrier.
    pub reconciled_absent: usize,
    pub pending_intents: usize,
    /// Operations a later attempt marked sent, each checked against the
    /// carrier: one label each.
    pub duplicate_candidates: usize,
    pub kills: usize,
    /// The dead letters' orders and reasons.
    pub dead_letters: Vec<(u64, String)>,
    pub undeliverable: Vec<u64>,
    pub reconciliation_clean: bool,
    /// Every completed order's stored label is the carrier's.
    pub labels_match: bool,
    pub deliveries: usize,
    pub sender_retries: usize,
    pub busy: usize,
    pub replayed: usize,
    pub lost: usize,
    pub elapsed: Duration,
}

impl Report {
    /// Whether every shipment happened exactly once and everything
    /// ambiguous was settled.
    pub fn exactly_once(&self) -> bool {
        self.shipments == self.expected_shipments
            && self.duplicate_labels == 0
            && self.pending_intents == 0
            && self.reconciled_accepted >= self.kills
            && self
                .dead_letters
                .iter()
                .map(|(o, _)| *o)
                .collect::<Vec<_>>()
                == self.undeliverable
            && self.dead_letters.iter().all(|(_, r)| dead_letter_reason(r))
            && self.reconciliation_clean
            && self.labels_match
    }
}

/// The carrier's refusal, as the runner gives up on it after the third
/// attempt.
pub const REFUSED: &str =
    "gave up after 3 attempts (max_attempts): carrier rejected the address: undeliverable";

/// Whether `r` is a reason an undeliverable order's dead letter may give:
/// the carrier's refusal, or — when a kill interrupted the order's third
/// attempt — the limit found before a fourth, which the runner does not
/// make (it asks the carrier first, which has no such call).
pub fn dead_letter_reason(r: &str) -> bool {
    r == REFUSED
        || (r.starts_with("gave up after 3 attempts, ")
            && r.ends_with(" interrupted (max_attempts); attempt 4 not started"))
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "dedupkv payment webhook -> shipments ({WORKERS} workers, {} SIGKILLs after the carrier accepted)",
            self.kills
        )?;
        writeln!(
            f,
            "  deliveries: {} ({} sender retries on slow answers, {} busy, {} replayed, {} lost to a takeover)",
            self.deliveries, self.sender_retries, self.busy, self.replayed, self.lost
        )?;
        writeln!(f, "orders: {}", self.orders)?;
        writeln!(f, "shipments: {}", self.shipments)?;
        writeln!(f, "duplicate labels: {}", self.duplicate_labels)?;
        writeln!(
            f,
            "ambiguous calls reconciled: {} (carrier had accepted: not called again; {} more never reached it; {} pending)",
            self.reconciled_accepted, self.reconciled_absent, self.pending_intents
        )?;
        writeln!(
            f,
            "duplicate candidates checked: {} (none shipped twice)",
            self.duplicate_candidates
        )?;
        let mut reasons: Vec<&str> = self.dead_letters.iter().map(|(_, r)| r.as_str()).collect();
        reasons.sort_unstable();
        reasons.dedup();
        writeln!(
            f,
            "dead letters: {} ({})",
            self.dead_letters.len(),
            reasons.join("; ")
        )?;
        for (order, _) in &self.dead_letters {
            writeln!(f, "  order {order}")?;
        }
        writeln!(
            f,
            "reconciliation clean: {}",
            yes(self.reconciliation_clean)
        )?;
        writeln!(f, "  elapsed: {:.2?}", self.elapsed)?;
        write!(
            f,
            "every shipment exactly once: {}",
            yes(self.exactly_once())
        )
    }
}

/// The start of the reconciliation window holding `at`.
fn window_of(at: SystemTime) -> SystemTime {
    let ms = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let w = WINDOW.as_millis();
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms / w * w).expect("time"))
}

/// Opens the store after the last life and checks it against the carrier.
fn check(dir: &Path, sender: &Sender, elapsed: Duration) -> dedupkv::Result<Report> {
    let store = open(dir)?;
    let calls = accepted_calls(&dir.join(CARRIER_FILE));
    let mut per_order: HashMap<u64, Vec<&Shipment>> = HashMap::new();
    for s in &calls {
        per_order.entry(s.order).or_default().push(s);
    }
    let duplicate_labels = per_order.values().map(|v| v.len() - 1).sum::<usize>()
        + (calls.len() - calls.iter().map(|s| &s.label).collect::<HashSet<_>>().len());
    let undeliverable_orders: Vec<u64> = (0..ORDERS).filter(|o| undeliverable(*o)).collect();

    // The carrier's invoice, per window: each label counted in the window
    // our record says its order completed in (not by the carrier's clock,
    // which may put a call just before an hour its completion is after).
    // A label with no completed record of the same label is a mismatch.
    let mut labels_match = true;
    let mut invoice: HashMap<SystemTime, (u64, i128)> = HashMap::new();
    for s in &calls {
        let id = s.order.to_string();
        let rec = store.get(&key(&id))?;
        let at = match &rec {
            Some(r) if r.outcome() == Some(s.label.as_bytes()) => r.updated_at(),
            _ => {
                labels_match = false;
                SystemTime::now()
            }
        };
        let e = invoice.entry(window_of(at)).or_default();
        e.0 += 1;
        e.1 += i128::from(s.parcels);
    }
    let theirs: Vec<Tally> = invoice
        .into_iter()
        .map(|(w, (n, amount))| Tally::new(w, n, amount))
        .collect();
    let reconciliation = store.reconcile(SCOPE, &theirs)?;

    let mut dead_letters = Vec::new();
    let mut listing = Listing::new().scope(SCOPE);
    loop {
        let page = store.dead_letters(&listing)?;
        for dl in &page.items {
            let order = String::from_utf8_lossy(dl.key().id())
                .parse()
                .expect("order");
            dead_letters.push((order, dl.reason().to_string()));
        }
        match page.next {
            Some(c) => listing = listing.after(c),
            None => break,
        }
    }
    dead_letters.sort_unstable();

    let pending_intents = store
        .pending_intents(&Listing::new().limit(10_000))?
        .items
        .len();
    let candidates = store.duplicate_candidates(&Listing::new().limit(10_000))?;
    // Each candidate for a duplicate effect, checked against the carrier:
    // one label under its provider key, or none for a rejected order.
    for c in &candidates.items {
        let order: u64 = String::from_utf8_lossy(c.key().id())
            .parse()
            .expect("order");
        let shipped = per_order.get(&order).map_or(&[][..], Vec::as_slice);
        if undeliverable(order) {
            assert!(shipped.is_empty(), "undeliverable order {order} shipped");
        } else {
            assert_eq!(shipped.len(), 1, "duplicate candidate {order}");
            assert_eq!(shipped[0].provider_key, c.provider_key(), "order {order}");
        }
    }

    Ok(Report {
        orders: sender.acked.len(),
        shipments: per_order.len(),
        expected_shipments: ORDERS as usize - undeliverable_orders.len(),
        duplicate_labels,
        reconciled_accepted: sender.reconciled_accepted,
        reconciled_absent: sender.reconciled_absent,
        pending_intents,
        duplicate_candidates: candidates.items.len(),
        kills: sender.kills,
        dead_letters,
        undeliverable: undeliverable_orders,
        reconciliation_clean: reconciliation.is_clean(),
        labels_match,
        deliveries: sender.deliveries,
        sender_retries: sender.retries,
        busy: sender.busy,
        replayed: sender.replayed,
        lost: sender.lost,
        elapsed,
    })
}

/// The whole run: the sender against killed and restarted handlers, then
/// the check against the carrier. Does not assert; see [`Report`].
pub fn run() -> dedupkv::Result<Report> {
    let dir = tempfile::tempdir().expect("temp dir");
    let start = Instant::now();
    let sender = send_all(dir.path());
    check(dir.path(), &sender, start.elapsed())
}

pub fn main() -> dedupkv::Result<()> {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        return child(dir.as_ref());
    }
    let report = run()?;
    println!("{report}");
    assert!(report.exactly_once(), "{report:#?}");
    Ok(())
}
