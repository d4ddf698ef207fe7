//! Concurrent calls are linearizable: many threads make every call on a
//! few keys with a manual clock, an evictor and a lister, and each key's
//! recorded history must have an order, consistent with real time, that
//! the model accepts (`dedupkv_testkit::history`). A call that hangs or
//! panics fails the run naming it.
//!
//! By default a fixed set of seeds. `DEDUPKV_LIN_SEEDS=3,17` runs those
//! seeds instead; `DEDUPKV_LIN_SECS=600` keeps running fresh seeds (from
//! the first given, or 1) until that many seconds have passed — the soak
//! (`scripts/soak.sh`) does that. Every failure names its seed.

use std::time::{Duration, Instant};

use dedupkv_testkit::history::{Failure, Run, run};

/// The seeds CI runs: together every mix of calls (`Run::mix`), 4 and 16
/// shards, whole, small and tiny log rows, in-memory stores and a file.
const SEEDS: [u64; 6] = [1, 2, 3, 4, 5, 6];

fn env_u64s(name: &str) -> Option<Vec<u64>> {
    let v = std::env::var(name).ok()?;
    Some(
        v.split(',')
            .map(|s| s.trim().parse().expect("a number"))
            .collect(),
    )
}

#[test]
fn concurrent_calls_are_linearizable() -> Result<(), Failure> {
    let seeds = env_u64s("DEDUPKV_LIN_SEEDS").unwrap_or_else(|| SEEDS.to_vec());
    let secs = env_u64s("DEDUPKV_LIN_SECS").and_then(|v| v.first().copied());
    let start = Instant::now();
    let mut done = 0;
    let mut next = seeds.first().copied().unwrap_or(1);
    let mut calls = 0;
    loop {
        let seed = match secs {
            None if done < seeds.len() => seeds[done],
            None => break,
            Some(s) if start.elapsed() >= Duration::from_secs(s) => break,
            Some(_) => {
                let seed = next;
                next += 1;
                seed
            }
        };
        let summary = run(&Run::seed(seed))?;
        calls += summary.calls;
        done += 1;
        eprintln!(
            "seed {seed}: {} calls on {} keys and entities, clock +{} ms, {:?}",
            summary.calls, summary.targets, summary.clock_ms, summary.took
        );
    }
    eprintln!(
        "{done} runs, {calls} calls checked in {:?}",
        start.elapsed()
    );
    Ok(())
}
