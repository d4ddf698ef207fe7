//! A Redis Streams consumer group on dedupkv's async front and partition
//! set, end to end: a producer publishes orders with duplicates to six
//! streams; member processes, each with a `PartitionSet` whose stores
//! ship to a shared replica, charge each order through a provider that
//! deduplicates by the claim's provider key and acknowledge after the
//! store's record; the parent assigns and moves the streams. Scenarios,
//! in both replica modes: a member killed (`SIGKILL`) mid-charge, a rolling deploy,
//! a lost disk; in each, one ack is dropped and reclaimed with XAUTOCLAIM.
//! The crate's docs (`src/lib.rs`) say how.
//!
//! Run it against a throwaway server:
//! `scripts/with-redis.sh cargo run -p dedupkv-redis-streams --example redis_streams`
//! (`DEDUPKV_REDIS_MODES=sync` and `DEDUPKV_REDIS_SCENARIOS=kill,rolling`
//! pick).

fn main() -> std::process::ExitCode {
    dedupkv_redis_streams::main()
}
