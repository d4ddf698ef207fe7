//! The Redis Streams group run (`examples/redis_streams.rs`) as a test,
//! one test per replica mode: member processes of one consumer group,
//! each with a partition set whose stores ship to a shared replica; the
//! scenarios SIGKILL mid-charge, rolling deploy and lost disk, each with
//! a dropped ack reclaimed with XAUTOCLAIM. Zero double charges, zero
//! lost orders, every entry acknowledged, the stores' tallies reconciled
//! with the provider's ledger. Built without the harness: the run
//! re-executes this binary as its members.
//!
//! Needs `DEDUPKV_REDIS_URL` (`scripts/with-redis.sh` starts a server and
//! sets it; `scripts/test.sh` runs the test under it). Without it the
//! test says so and is skipped — except under CI, where it fails.

use std::process::ExitCode;

#[path = "../../../tests/child/mod.rs"]
mod child;

fn run(mode: &str) -> dedupkv::Result<()> {
    let io = |e: String| dedupkv::Error::Io {
        what: "the Redis Streams group run",
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
    let reports =
        dedupkv_redis_streams::run_mode(&exe, &url, mode).map_err(|e| io(e.to_string()))?;
    let mut wrong = Vec::new();
    for r in &reports {
        eprintln!("{r}");
        if let Err(e) = r.check() {
            wrong.push(e);
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(io(wrong.join("; ")))
    }
}

fn main() -> ExitCode {
    child::main(
        dedupkv_redis_streams::CHILD_ENV,
        || {
            if dedupkv_redis_streams::main() != ExitCode::SUCCESS {
                std::process::exit(1);
            }
        },
        &[
            ("redis_streams_group_run_mode_sync", || run("sync")),
            ("redis_streams_group_run_mode_async", || run("async")),
        ],
    )
}
