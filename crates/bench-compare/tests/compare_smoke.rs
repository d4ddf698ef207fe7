//! The comparison harness of `benches/compare.rs`, run tiny: every contender
//! reports the model's count of new keys for the same workload. PostgreSQL
//! takes part when `DEDUPKV_PG_URL` is set (`scripts/with-postgres.sh cargo
//! test -p dedupkv-bench-compare`, which `scripts/test.sh` runs); under
//! `CI=true` its absence is a failure, not a skip.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL, SQLite) are not code

use std::collections::HashSet;

use dedupkv_bench_compare::contender::{Contender, Result};
use dedupkv_bench_compare::workload::{self, OpKind, Repeats, Spec, Workload, Zipf};
use dedupkv_bench_compare::{lineup, memory, runner};

/// Every contender that can run here. Under CI (`CI` set, and not `false`
/// or `0`) none may be skipped: `scripts/test.sh` starts PostgreSQL there.
fn lineup() -> Result<Vec<Box<dyn Contender>>> {
    let l = lineup::all(lineup::pg_url_from_env().as_deref())?;
    let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "false" | "0"));
    if ci && !l.skipped.is_empty() {
        return Err(format!("CI must run every contender: {}", l.skipped.join("; ")).into());
    }
    for s in &l.skipped {
        println!("skip: {s}");
    }
    Ok(l.contenders)
}

fn spec(batch: usize, kind: OpKind, repeats: Repeats) -> Spec {
    Spec {
        ops: 200,
        dup_ratio: 0.1,
        repeats,
        workers: 2,
        batch,
        kind,
        seed: 42,
    }
}

#[test]
fn every_contender_reports_the_model_count() -> Result<()> {
    let contenders = lineup()?;
    let workloads = [
        spec(1, OpKind::Insert, Repeats::Uniform),
        spec(50, OpKind::Insert, Repeats::Zipf(0.99)),
        spec(1, OpKind::BeginComplete, Repeats::Uniform),
    ]
    .map(Workload::generate);
    for w in &workloads {
        let n = w.keys.len();
        let distinct = w.keys.iter().collect::<HashSet<_>>().len() as u64;
        assert_eq!(w.expected_new(n), distinct);
        assert!(distinct < n as u64, "the workload must contain duplicates");
        for c in &contenders {
            let inst = c.open(n)?;
            let m = runner::run(&*inst, w, n, None)?;
            assert_eq!(m.ops, n);
            assert_eq!(m.expected_new, distinct);
            assert_eq!(
                m.new_keys,
                distinct,
                "{} (batch {}, {:?}) disagrees with the model",
                c.name(),
                w.spec.batch,
                w.spec.kind
            );
        }
    }
    Ok(())
}

#[test]
fn a_run_cut_by_its_time_budget_is_checked_on_what_it_covered() -> Result<()> {
    let w = Workload::generate(spec(50, OpKind::Insert, Repeats::Uniform));
    let inst = memory::Memory.open(200)?;
    // A zero budget: each of the two workers stops after its first batch.
    let m = runner::run(&*inst, &w, 200, Some(std::time::Duration::ZERO))?;
    assert_eq!(m.ops, 100);
    assert_eq!(m.latencies_ns.len(), 2);
    assert_eq!(m.expected_new, w.expected_new(100));
    assert_eq!(m.new_keys, m.expected_new);
    Ok(())
}

#[test]
fn a_key_repeated_inside_a_batch_is_new_once() -> Result<()> {
    let (a, b) = ([1u8; 16], [2u8; 16]);
    for c in lineup()? {
        let inst = c.open(4)?;
        let mut w = inst.worker()?;
        assert_eq!(w.insert_batch(&[a, b, a])?, 2, "{}", c.name());
        assert_eq!(w.insert_batch(&[b, a])?, 0, "{}", c.name());
        assert_eq!(w.insert_batch(&[a])?, 0, "{}", c.name());
        assert!(w.begin_complete(&[3u8; 16], &[7u8; 64])?, "{}", c.name());
        assert!(!w.begin_complete(&[3u8; 16], &[7u8; 64])?, "{}", c.name());
    }
    Ok(())
}

#[test]
fn workloads_are_deterministic_and_prefixes_count_exactly() {
    let s = Spec {
        ops: 5_000,
        dup_ratio: 0.3,
        repeats: Repeats::Zipf(0.99),
        workers: 4,
        batch: 10,
        kind: OpKind::Insert,
        seed: 7,
    };
    let a = Workload::generate(s.clone());
    let b = Workload::generate(s);
    assert_eq!(a.keys, b.keys);
    for n in [0, 1, 17, 4_999, 5_000] {
        let set: HashSet<_> = a.keys[..n].iter().collect();
        assert_eq!(a.expected_new(n), set.len() as u64);
    }
    assert_eq!(a.fit(1), 40);
    assert_eq!(a.fit(95), 80);
    assert_eq!(a.fit(1_000_000), 5_000);
}

#[test]
fn zipf_stays_below_the_bound_and_favours_low_ranks() {
    let z = Zipf::new(1_000, 0.99);
    let mut rng = workload::SplitMix64::new(1);
    let mut counts = [0u32; 10];
    for _ in 0..20_000 {
        let r = z.sample_below(10, rng.next_f64());
        counts[r] += 1;
    }
    assert!(counts.windows(2).all(|p| p[0] > p[1] / 2), "{counts:?}");
    assert!(counts[0] > counts[9] * 5, "{counts:?}");
    assert_eq!(z.sample_below(1, 0.999), 0);
}
