//! A Kafka consumer group end to end, against librdkafka's mock cluster
//! (nothing to install): this process hosts the cluster and a topic of 6
//! partitions fed with duplicated events; consumer *processes* (this
//! binary again, `DEDUPKV_KAFKA_ROLE=consumer`) form a group, each with a
//! partition set whose stores ship to one replica directory. Scenarios, in
//! both replica modes:
//! - `kill`: a member killed (SIGKILL) mid-batch (half its effects done, none
//!   completed); its partitions move and the new owner restores and
//!   catches the redelivered tail;
//! - `rolling`: a rolling deploy: members join and old ones leave
//!   gracefully, one at a time;
//! - `lost-disk`: a member killed (SIGKILL), its local directory removed, and the
//!   member back on the empty disk.
//!
//! Each checks: the ledger holds every unique event once (zero duplicate
//! effects), every produced message's offset was committed, duplicates
//! were caught across rebalances; in synchronous mode no key was missed,
//! in asynchronous mode the keys missed (acknowledged, not yet shipped
//! when the member died) are counted, and were all the dead member's.
//! Prints the hand-over times (revoke to the next owner's first answer).
//!
//! `DEDUPKV_KAFKA_SCENARIOS=kill,rolling` picks scenarios,
//! `DEDUPKV_KAFKA_MODES=sync` modes.

mod consumer;
mod parent;

/// The topic and group of the run.
const TOPIC: &str = "events";
const GROUP: &str = "dedup";

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn main() -> std::process::ExitCode {
    if std::env::var("DEDUPKV_KAFKA_ROLE").as_deref() == Ok("consumer") {
        consumer::run();
        return std::process::ExitCode::SUCCESS;
    }
    parent::run()
}
