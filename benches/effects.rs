//! The outbox's cost: begin + intent + mark-sent + complete per operation
//! against plain begin + complete, and complete with a tallied amount, with
//! 1 and 16 workers, all under `Durability::Immediate` (and the intent
//! without `mark_sent`, to split the outbox's cost). The shapes run
//! alternately in one process, each on a fresh store and distinct keys;
//! the table gives medians of ops/s, durable commits per operation and the
//! ratios to plain begin + complete measured in the same round (the order
//! rotates from round to round).
//!
//! `cargo bench --bench effects` (`DEDUPKV_BENCH_RUNS` runs per figure,
//! default 5; `DEDUPKV_EFFECTS_OPS_1` and `DEDUPKV_EFFECTS_OPS_16`
//! operations per worker, defaults 1,000 and 500;
//! `DEDUPKV_EFFECTS_DEFERRED=1` for `Durability::Deferred` (10 ms), which
//! takes the syncs out and leaves the engine's own cost;
//! `DEDUPKV_EFFECTS_PLAIN_ONLY=1` runs only `begin` + `complete` and
//! `begin` + `complete_with_amount`).
#![allow(missing_docs, clippy::unwrap_used, clippy::cast_precision_loss)]

#[path = "common/mod.rs"]
mod common;
use common::env_or;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use dedupkv::{Begin, BeginOptions, Durability, Fingerprint, Intent, Key, Store};

const SCOPE: &[u8] = b"bench";
const OUTCOME: [u8; 64] = [0x5a; 64];
const REQUEST: [u8; 64] = [0xa5; 64];
const REFERENCE: [u8; 16] = [0x3c; 16];

/// What one operation does, from `begin` to its outcome.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `begin` + `complete`.
    Plain,
    /// `begin_with_intent` + `mark_sent` + `complete`.
    Outbox,
    /// `begin_with_intent` + `complete`: the intent alone, no answer
    /// recorded (splits the outbox's cost between the intent and
    /// `mark_sent`).
    IntentOnly,
    /// `begin` + `complete_with_amount`.
    Tallied,
}

impl Shape {
    const ALL: [Shape; 4] = [
        Shape::Plain,
        Shape::Outbox,
        Shape::IntentOnly,
        Shape::Tallied,
    ];

    fn name(self) -> &'static str {
        match self {
            Shape::Plain => "begin + complete",
            Shape::Outbox => "begin_with_intent + mark_sent + complete",
            Shape::IntentOnly => "begin_with_intent + complete (no mark_sent)",
            Shape::Tallied => "begin + complete_with_amount",
        }
    }

    fn run(self, store: &Store, id: &[u8]) {
        let key = Key::new(SCOPE, id);
        let begun = match self {
            Shape::Outbox | Shape::IntentOnly => {
                let intent = Intent {
                    target: "carrier",
                    request: &REQUEST,
                };
                store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent)
            }
            Shape::Plain | Shape::Tallied => store.begin(&key, Fingerprint::NONE),
        };
        let Begin::Started(claim) = begun.unwrap() else {
            panic!("a fresh key was not started");
        };
        match self {
            Shape::Plain | Shape::IntentOnly => store.complete(&claim, &OUTCOME).unwrap(),
            Shape::Outbox => {
                store.mark_sent(&claim, &REFERENCE).unwrap();
                store.complete(&claim, &OUTCOME).unwrap();
            }
            Shape::Tallied => store.complete_with_amount(&claim, &OUTCOME, 1_250).unwrap(),
        }
    }
}

/// One run: `workers` threads, `per` operations each on distinct keys, on
/// a fresh store. Returns (ops/s, durable commits per op).
fn run(dir: &Path, shape: Shape, workers: usize, per: usize, tag: usize) -> (f64, f64) {
    let store = Store::builder()
        .durability(durability())
        .open(dir.join(format!("effects-{tag}.redb")))
        .unwrap();
    let barrier = Barrier::new(workers);
    let commits0 = store.stats().commits;
    let start = Instant::now();
    std::thread::scope(|s| {
        for w in 0..workers {
            let (store, barrier) = (&store, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..per {
                    let id = ((w as u64) << 32 | i as u64).to_le_bytes();
                    shape.run(store, &id);
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let ops = (workers * per) as f64;
    let commits = store.stats().commits - commits0;
    assert_eq!(store.stats().completed, (workers * per) as u64);
    (ops / secs, commits as f64 / ops)
}

fn durability() -> Durability {
    if env_or("DEDUPKV_EFFECTS_DEFERRED", 0) == 1 {
        Durability::Deferred {
            max_delay: Duration::from_millis(10),
        }
    } else {
        Durability::Immediate
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Alternates the shapes `runs` times with `workers` workers; table rows.
fn bench(workers: usize, per: usize, runs: usize) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let shapes: Vec<Shape> = Shape::ALL
        .into_iter()
        .filter(|s| {
            env_or("DEDUPKV_EFFECTS_PLAIN_ONLY", 0) == 0
                || matches!(s, Shape::Plain | Shape::Tallied)
        })
        .collect();
    let n = shapes.len();
    let (mut rate, mut commits) = (vec![vec![]; n], vec![vec![]; n]);
    let mut ratio = vec![vec![]; n];
    for r in 0..runs {
        // Each round starts one shape later, so none always follows another.
        let mut round = vec![0.0; n];
        for j in 0..n {
            let i = (r + j) % n;
            let (ops, c) = run(dir.path(), shapes[i], workers, per, r * n + i);
            round[i] = ops;
            rate[i].push(ops);
            commits[i].push(c);
        }
        for i in 0..n {
            ratio[i].push(round[i] / round[0]);
        }
    }
    let plain_commits = median(commits[0].clone());
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, shape)| {
            let c = median(commits[i].clone());
            let (lo, hi) = ratio[i]
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
            format!(
                "| {workers} | {} | {:.0} | {c:.2} | {:.3} ({lo:.2}–{hi:.2}) | {:+.2} |",
                shape.name(),
                median(rate[i].clone()),
                median(ratio[i].clone()),
                c - plain_commits,
            )
        })
        .collect()
}

fn main() {
    let runs = env_or("DEDUPKV_BENCH_RUNS", 5);
    let per_1 = env_or("DEDUPKV_EFFECTS_OPS_1", 1_000);
    let per_16 = env_or("DEDUPKV_EFFECTS_OPS_16", 500);
    let mut out = String::new();
    let mut row = |line: String| {
        println!("{line}");
        writeln!(out, "{line}").unwrap();
    };
    let mode = match durability() {
        Durability::Immediate => "Immediate",
        _ => "Deferred 10 ms",
    };
    row(format!(
        "dedupkv effects bench: {mode}, {per_1} ops (1 worker) / {per_16} ops per worker (16 workers), {runs} alternating runs, medians"
    ));
    row(String::new());
    row("| workers | per operation | ops/s | commits/op | ops/s ÷ begin + complete, same round (range) | commits/op − begin + complete |".into());
    row("|---|---|---|---|---|---|".into());
    for (workers, per) in [(1, per_1), (16, per_16)] {
        for r in bench(workers, per, runs) {
            row(r);
        }
    }
    let dirp = Path::new("target/bench-effects");
    let _ = std::fs::create_dir_all(dirp);
    let _ = std::fs::write(dirp.join("effects.md"), out);
}
