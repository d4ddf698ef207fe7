//! One member of the group, run as a child process: poll a batch →
//! `begin_batch` → the effect (the provider, idempotent on the claim's
//! provider key) → `complete_batch` → commit the offsets.
//!
//! Why this order is safe, at a crash between each pair of steps:
//! - after the claim, before the effect: the claim is in the store (and,
//!   in synchronous mode, in the replica); the next owner takes it over at
//!   once as interrupted and does the effect;
//! - after the effect, before the complete: the same, and the handler
//!   reconciles: the provider honours an idempotency key (the event's
//!   id, the same across attempts and owners), so the effect is not
//!   repeated;
//! - after the complete, before the commit: Kafka redelivers the batch;
//!   the store answers `Completed` for each (a duplicate caught);
//! - after the commit: nothing is redelivered.
//!
//! Offsets are committed only after `complete_batch`, so Kafka never skips
//! a message whose effect is not recorded; the store is only ever ahead of
//! the offsets, never behind, and the lead is what dedup absorbs.
//!
//! In asynchronous mode a member killed before its uploader shipped its
//! last commits loses them from the replica: the next owner sees those
//! keys as new, and only the provider's idempotency catches them. The run
//! counts those ("missed").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dedupkv::partitions::PartitionSet;
use dedupkv::replica::object_store::{ObjectStore, local::LocalFileSystem};
use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{Begin, Durability, Error, Fingerprint, Key, Store};
use dedupkv_kafka::{GroupContext, GroupEvent};
use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{GROUP, TOPIC, now_us};

/// An append-only log of what this member did, one line per fact, read by
/// the parent.
struct Log(Mutex<std::fs::File>);

impl Log {
    fn line(&self, s: &str) {
        let mut f = self.0.lock();
        // One write per line (O_APPEND): a SIGKILL leaves whole lines.
        f.write_all(format!("{s}\n").as_bytes()).expect("log line");
    }
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} is set by the parent"))
}

/// The provider: applies an effect once per idempotency key, across
/// members and processes: the key's file is created create-only.
fn provide(ledger: &Path, provider_key: &str, id: &str) -> bool {
    let name: String = provider_key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(ledger.join(name))
    {
        Ok(mut f) => {
            f.write_all(id.as_bytes()).expect("ledger");
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => panic!("ledger: {e}"),
    }
}

/// Stops here, for the parent's SIGKILL: logs the replica lag of every
/// store of the set (bytes summed, the oldest unshipped commit's wait at
/// most) and says `PAUSED` on stdout.
fn pause(log: &Log, set: &PartitionSet, work: &dedupkv::partitions::Work) -> ! {
    let (mut bytes, mut oldest) = (0, 0);
    for q in set.assigned() {
        let status = if q == work.partition() {
            work.with(|s| Ok(s.replica_status()))
        } else {
            set.work(q).and_then(|w| w.with(|s| Ok(s.replica_status())))
        };
        if let Ok(Some(s)) = status {
            bytes += s.lag_bytes;
            oldest = oldest.max(s.lag.as_micros());
        }
    }
    log.line(&format!(
        "pause {} {} lag_bytes={bytes} lag_us={oldest}",
        work.partition(),
        now_us(),
    ));
    println!("PAUSED");
    std::io::stdout().flush().expect("stdout");
    loop {
        std::thread::park();
    }
}

#[allow(clippy::too_many_lines)] // one member's whole life, in order
pub fn run() {
    let member = env("DEDUPKV_KAFKA_MEMBER");
    let mode = match env("DEDUPKV_KAFKA_MODE").as_str() {
        "sync" => ReplicaMode::Synchronous,
        _ => ReplicaMode::Asynchronous,
    };
    let base = PathBuf::from(env("DEDUPKV_KAFKA_BASE"));
    let ledger = PathBuf::from(env("DEDUPKV_KAFKA_LEDGER"));
    let stop = PathBuf::from(env("DEDUPKV_KAFKA_STOP"));
    // Once this file exists, the next batch stops at `point` for the
    // parent's SIGKILL.
    let arm = std::env::var("DEDUPKV_KAFKA_ARM").ok().map(PathBuf::from);
    let point = std::env::var("DEDUPKV_KAFKA_PAUSE_POINT").unwrap_or_default();
    let log = Arc::new(Log(Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(env("DEDUPKV_KAFKA_OUT"))
            .expect("member log"),
    )));
    let objects: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(env("DEDUPKV_KAFKA_BUCKET")).expect("bucket"));
    let label = member.clone();
    let set = PartitionSet::new(&base, move |p| {
        let replica = Replica::new(Arc::clone(&objects), &format!("events/{p}"))
            .mode(mode)
            .owner_label(&label);
        Ok(Store::builder()
            .durability(Durability::Immediate)
            .replica(replica))
    });
    // Partitions assigned and not answered yet (for the hand-over time),
    // and each partition's assignment count in this process.
    let fresh: Arc<Mutex<HashSet<i32>>> = Arc::default();
    let generation: Arc<Mutex<HashMap<i32, u64>>> = Arc::default();
    let ctx = {
        let (log, fresh, generation) = (
            Arc::clone(&log),
            Arc::clone(&fresh),
            Arc::clone(&generation),
        );
        GroupContext::new(set.clone(), TOPIC, Duration::from_secs(60)).observe(move |e| match e {
            GroupEvent::RevokeStarted { partition, .. } => {
                fresh.lock().remove(partition);
                log.line(&format!("revoke_start {partition} {}", now_us()));
            }
            GroupEvent::Revoked { partition, result } => log.line(&format!(
                "revoke_done {partition} {} {}",
                now_us(),
                match result {
                    Ok(r) => format!("ok abandoned={}", r.abandoned),
                    Err(e) => format!("err {}", e.to_string().replace(' ', "_")),
                }
            )),
            GroupEvent::Assigned { partition, result } => {
                let what = match result {
                    Ok(a) => {
                        *generation.lock().entry(*partition).or_default() += 1;
                        fresh.lock().insert(*partition);
                        match &a.restored {
                            Some(r) => format!(
                                "ok epoch={} restored={:?} records={} took_us={}",
                                a.epoch,
                                r.reason,
                                r.records,
                                a.took.as_micros()
                            ),
                            None => format!(
                                "ok epoch={} restored=none took_us={}",
                                a.epoch,
                                a.took.as_micros()
                            ),
                        }
                    }
                    Err(e) => format!("err {}", e.to_string().replace(' ', "_")),
                };
                log.line(&format!("assign {partition} {} {what}", now_us()));
            }
            _ => {}
        })
    };
    let consumer: BaseConsumer<GroupContext> = ClientConfig::new()
        .set("bootstrap.servers", env("DEDUPKV_KAFKA_BOOTSTRAP"))
        .set("group.id", GROUP)
        .set("client.id", &member)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "3000")
        .set("heartbeat.interval.ms", "200")
        .set("fetch.wait.max.ms", "20")
        .set("partition.assignment.strategy", "roundrobin")
        .create_with_context(ctx)
        .expect("consumer");
    consumer.subscribe(&[TOPIC]).expect("subscribe");
    log.line(&format!("start {member} {}", now_us()));
    let mine = |p: i32| {
        format!(
            "{}/{p}/{}",
            std::process::id(),
            generation.lock().get(&p).copied().unwrap_or(0)
        )
    };
    while !stop.exists() {
        // Poll a batch (the messages are copied out: nothing borrows the
        // consumer while the batch is handled).
        let mut batch: Vec<(i32, i64, String)> = Vec::new();
        let mut next = consumer.poll(Duration::from_millis(100));
        while let Some(m) = next {
            let m = m.expect("message");
            let id = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            batch.push((m.partition(), m.offset(), id));
            if batch.len() >= 32 {
                break;
            }
            next = consumer.poll(Duration::ZERO);
        }
        if batch.is_empty() {
            continue;
        }
        let mut by_partition: BTreeMap<i32, Vec<(i64, String)>> = BTreeMap::new();
        for (p, off, id) in batch {
            by_partition.entry(p).or_default().push((off, id));
        }
        let mut offsets = TopicPartitionList::new();
        let mut committed = Vec::new();
        for (p, msgs) in by_partition {
            // The handle keeps a revoke of p waiting until the batch is
            // recorded; a revoke that came first refuses it.
            let Ok(work) = set.work(p) else {
                log.line(&format!("skip {p} not_assigned"));
                continue;
            };
            let mut ids: Vec<&str> = Vec::new();
            for (_, id) in &msgs {
                if ids.contains(&id.as_str()) {
                    log.line(&format!("caught {id} batch {p}"));
                } else {
                    ids.push(id);
                }
            }
            let items: Vec<(Key<'_>, Fingerprint)> = ids
                .iter()
                .map(|id| (Key::new("events", *id), Fingerprint::of(id)))
                .collect();
            // 1. The claims, durable (and shipped, in synchronous mode)
            //    before any effect.
            let answers = match work.begin_batch(&items) {
                Ok(a) => a,
                Err(Error::NotAssigned { .. } | Error::Fenced(_)) => {
                    log.line(&format!("skip {p} revoked"));
                    continue;
                }
                Err(e) => panic!("begin_batch on {p}: {e}"),
            };
            if fresh.lock().remove(&p) {
                log.line(&format!("first {p} {}", now_us()));
            }
            let me = mine(p);
            let mut started = Vec::new();
            let mut refused = false;
            for (id, answer) in ids.iter().zip(answers) {
                match answer {
                    Ok(Begin::Started(c)) => started.push((*id, c)),
                    Ok(Begin::Completed(r)) => {
                        let by =
                            String::from_utf8_lossy(r.outcome().unwrap_or_default()).into_owned();
                        let across = if by == me { "same" } else { "across" };
                        log.line(&format!("caught {id} {across} {p}"));
                    }
                    Ok(other) => panic!("{id} on {p}: {other:?}"),
                    Err(Error::NotAssigned { .. } | Error::Fenced(_)) => refused = true,
                    Err(e) => panic!("{id} on {p}: {e}"),
                }
            }
            if refused {
                log.line(&format!("skip {p} revoked"));
                continue;
            }
            // 2. The effects, each idempotent on an idempotency key.
            let armed = arm.as_ref().is_some_and(|a| a.exists());
            for (i, (id, c)) in started.iter().enumerate() {
                if armed && point == "mid" && started.len() >= 2 && i == started.len() / 2 {
                    // Half the effects done, none completed.
                    pause(&log, &set, &work);
                }
                // The claim's provider key is the provider's idempotency
                // key, as the README's quick start says: with an
                // asynchronous replica it is handed out only once the claim
                // is in the replica, so every later owner derives it again.
                // No key (the partition was fenced or revoked meanwhile):
                // no call; the next owner takes the claim over.
                let key = match c.provider_key() {
                    Ok(k) => k,
                    Err(e @ (Error::NotAssigned { .. } | Error::Fenced(_) | Error::Closed)) => {
                        log.line(&format!("skip {p} no_key {e}"));
                        refused = true;
                        break;
                    }
                    Err(e) => panic!("{id} on {p}: provider key: {e}"),
                };
                let applied = provide(&ledger, &key, id);
                log.line(&format!(
                    "effect {id} {} attempt={} interrupted={} {p} {}",
                    if applied { "applied" } else { "dup" },
                    c.attempt(),
                    c.interrupted(),
                    now_us()
                ));
            }
            if refused {
                continue;
            }
            // 3. The outcomes.
            let outcomes: Vec<(&dedupkv::Claim, &[u8])> =
                started.iter().map(|(_, c)| (c, me.as_bytes())).collect();
            match work.complete_batch(&outcomes) {
                Ok(rs) => {
                    if rs.iter().any(Result::is_err) {
                        log.line(&format!("skip {p} complete_refused"));
                        continue;
                    }
                }
                Err(Error::NotAssigned { .. } | Error::Fenced(_)) => {
                    log.line(&format!("skip {p} complete_refused"));
                    continue;
                }
                Err(e) => panic!("complete_batch on {p}: {e}"),
            }
            if armed && point == "complete" {
                // Completed, the offsets not committed.
                pause(&log, &set, &work);
            }
            drop(work);
            let last = msgs.iter().map(|(o, _)| *o).max().unwrap_or(0);
            offsets
                .add_partition_offset(TOPIC, p, Offset::Offset(last + 1))
                .expect("offset");
            committed.push((p, last + 1));
        }
        // 4. The offsets, after the outcomes.
        if !committed.is_empty() {
            match consumer.commit(&offsets, CommitMode::Sync) {
                Ok(()) => {
                    for (p, o) in committed {
                        log.line(&format!("commit {p} {o}"));
                    }
                }
                Err(e) => log.line(&format!(
                    "commit_failed {}",
                    e.to_string().replace(' ', "_")
                )),
            }
        }
    }
    // Leave gracefully: closing the consumer runs the revoke callback
    // (each partition's tail shipped, its store closed).
    drop(consumer);
    for (p, r) in set.revoke_all(Duration::from_secs(60)) {
        log.line(&format!("late_revoke {p} {}", r.is_ok()));
    }
    log.line(&format!("exit {member} {}", now_us()));
}
