//! A Redis Streams consumer group on dedupkv's async front, end to end:
//! a producer publishes orders with duplicates; one consumer process per
//! partition claims each order, charges it through a provider that
//! deduplicates by idempotency key, and acknowledges after the store's
//! commit; partition 0's consumer is killed (`SIGKILL`) mid-batch and its successor
//! reclaims the pending entries with XAUTOCLAIM; one ack is dropped on
//! purpose and redelivered. The crate's docs (`src/lib.rs`) say how.
//!
//! Run it against a throwaway server:
//! `scripts/with-redis.sh cargo run -p dedupkv-redis-streams --example redis_streams`

fn main() -> std::process::ExitCode {
    dedupkv_redis_streams::main()
}
