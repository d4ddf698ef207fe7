//! The Redis Streams run (`examples/redis_streams.rs`) as a test: consumer
//! processes of one group, one killed (`SIGKILL`) mid-batch and reclaimed with
//! XAUTOCLAIM, a dropped ack redelivered; ledger rows = unique orders,
//! zero duplicate effects, every entry acknowledged, the stores' tallies
//! reconciled. Built without the harness: the run re-executes this binary
//! as its consumer processes.
//!
//! Needs `DEDUPKV_REDIS_URL` (`scripts/with-redis.sh` starts a server and
//! sets it; `scripts/test.sh` runs the suite under it). Without it the
//! test says so and is skipped — except under CI, where it fails.

use std::process::ExitCode;

#[path = "../../../tests/child/mod.rs"]
mod child;

fn run() -> dedupkv::Result<()> {
    let io = |e: String| dedupkv::Error::Io {
        what: "the Redis Streams run",
        source: std::io::Error::other(e),
    };
    let Ok(url) = std::env::var("DEDUPKV_REDIS_URL") else {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        if ci {
            return Err(io(
                "DEDUPKV_REDIS_URL is not set under CI (run scripts/with-redis.sh)".into(),
            ));
        }
        eprintln!(
            "redis_streams: DEDUPKV_REDIS_URL is not set; skipped (scripts/with-redis.sh sets it)"
        );
        return Ok(());
    };
    let exe = std::env::current_exe().map_err(|e| io(e.to_string()))?;
    let report = dedupkv_redis_streams::orchestrate(&exe, &url).map_err(|e| io(e.to_string()))?;
    eprintln!("{report:#?}");
    report.check().map_err(io)
}

fn main() -> ExitCode {
    child::main(
        dedupkv_redis_streams::CHILD_ENV,
        || {
            if dedupkv_redis_streams::main() != ExitCode::SUCCESS {
                std::process::exit(1);
            }
        },
        &[("redis_streams_consumer_group_survives_a_sigkill", run)],
    )
}
