//! `cargo bench -p dedupkv-bench-compare --bench compare`: dedupkv against
//! raw redb, SQLite, PostgreSQL and an in-memory map, every contender behind
//! one small trait (`src/contender.rs`) running the same generated workloads.
//!
//! Run the full comparison with a throwaway PostgreSQL server:
//! `scripts/with-postgres.sh cargo bench -p dedupkv-bench-compare --bench compare -- --update-docs`.
//!
//! Options (after `--`): `--quick` (scale 0.1, one run), `--scenario NAME[,NAME]`,
//! `--contender ID[,ID]`, `--runs N`, `--secs S` (time budget per timed
//! run), `--quiet-wait S` (how long the whole run may wait for other
//! processes to go quiet and re-run scenarios they disturbed; default 300,
//! 0 with `--quick`), `--update-docs` (also write `docs/bench/compare.svg`).
//! Scenarios named `…-pN` (`key-w16-p4`) run their workers as N processes
//! on one shared database (the binary runs itself with
//! `--worker-process`, see `src/processes.rs`); contenders whose store one
//! process owns are n/a there.
//! Environment: `DEDUPKV_BENCH_SCALE`, `DEDUPKV_BENCH_RUNS`,
//! `DEDUPKV_BENCH_SECS`, `DEDUPKV_BENCH_QUIET_WAIT`,
//! `DEDUPKV_BENCH_UPDATE_DOCS=1`, `DEDUPKV_PG_URL`,
//! `DEDUPKV_BENCH_SQLITE_BUSY_WAIT=1` (see `src/sqlite.rs`). Unknown
//! arguments are ignored.
//!
//! Results go to stdout as markdown, progress to stderr, and CSV, JSON and
//! an SVG chart to `target/bench-compare/`. Started without cargo bench's
//! `--bench` flag (`cargo test -p dedupkv-bench-compare --benches`), it only smoke-tests: scale
//! 0.01, one run, no files written.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL, SQLite) are not code

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use dedupkv_bench_compare::contender::{Contender, Result};
use dedupkv_bench_compare::machine::{self, QUIET_CORES, clock, others_cpu, wait_for_quiet};
use dedupkv_bench_compare::options::{self, Options};
use dedupkv_bench_compare::report::{self, Row, ScenarioReport, median, thousands};
use dedupkv_bench_compare::scenarios::{self, Scenario};
use dedupkv_bench_compare::workload::Workload;
use dedupkv_bench_compare::{lineup, pg, processes, runner, svg, targets, workspace_root};

/// What went wrong, kept to decide the exit code after every output is
/// written.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    fn add(&mut self, msg: String) {
        eprintln!("{} {msg}", clock());
        self.0.push(msg);
    }
}

/// Runs one contender on one scenario: the check run (the same keys for
/// every contender, run to the end), then `runs` timed runs over the whole
/// sequence, each stopped by the time budget.
fn bench_contender(
    c: &dyn Contender,
    sc: &Scenario,
    w: &Workload,
    check_n: usize,
    opts: &Options,
    failures: &mut Failures,
) -> Result<Option<Row>> {
    let run = |n: usize, budget: Option<Duration>| -> Result<runner::Measured> {
        let inst = c.open(n)?;
        if sc.processes > 1 {
            processes::run(c, &*inst, sc, w, opts.scale, n, budget)
        } else {
            runner::run(&*inst, w, n, budget)
        }
    };
    let check = run(check_n, None)?;
    if check.new_keys != check.expected_new {
        failures.add(format!(
            "MISMATCH [{}] {}: reported {} new keys for the {check_n}-key check workload; the model \
             (distinct keys, what every correct contender reports) is {}",
            sc.name,
            c.name(),
            check.new_keys,
            check.expected_new
        ));
        return Ok(None);
    }
    eprintln!(
        "{} [{}] {}: check ok ({} new of {check_n} keys, {} ops/s)",
        clock(),
        sc.name,
        c.name(),
        check.new_keys,
        thousands(check.ops_per_sec()),
    );
    let budget = Duration::from_secs_f64(opts.secs);
    let mut measured = Vec::with_capacity(opts.runs);
    for i in 0..opts.runs {
        let m = run(w.keys.len(), Some(budget))?;
        if m.new_keys != m.expected_new {
            failures.add(format!(
                "MISMATCH [{}] {} run {}: reported {} new keys for {} keys; the model says {}",
                sc.name,
                c.name(),
                i + 1,
                m.new_keys,
                m.ops,
                m.expected_new
            ));
            return Ok(None);
        }
        eprintln!(
            "{} [{}] {}: run {}/{}: {} keys in {:.2} s, {} ops/s",
            clock(),
            sc.name,
            c.name(),
            i + 1,
            opts.runs,
            thousands(report::count(m.ops)),
            m.elapsed.as_secs_f64(),
            thousands(m.ops_per_sec())
        );
        measured.push(m);
    }
    let rates: Vec<f64> = measured.iter().map(runner::Measured::ops_per_sec).collect();
    let med = median(&rates);
    let mid = measured
        .iter()
        .min_by(|a, b| {
            (a.ops_per_sec() - med)
                .abs()
                .total_cmp(&(b.ops_per_sec() - med).abs())
        })
        .ok_or("no runs")?;
    Ok(Some(Row {
        id: c.id().to_owned(),
        name: c.name(),
        durability: c.durability().to_owned(),
        ops_per_run: mid.ops,
        runs: rates,
        median: med,
        p50_ns: mid.latency_ns(0.50),
        p99_ns: mid.latency_ns(0.99),
        p999_ns: mid.latency_ns(0.999),
        new_keys: mid.new_keys,
    }))
}

fn bench_scenario(
    sc: &Scenario,
    lineup: &[Box<dyn Contender>],
    skipped: &[String],
    opts: &Options,
    failures: &mut Failures,
) -> ScenarioReport {
    let w = Workload::generate(sc.spec(opts.scale));
    let check_n = w.fit(sc.check_ops(opts.scale));
    let mut rep = ScenarioReport {
        name: sc.name.to_owned(),
        title: sc.title.to_owned(),
        workers: sc.workers,
        batch: sc.batch,
        dup_ratio: sc.dup_ratio,
        repeats: sc.repeats.label(),
        latency_unit: sc.latency_unit(),
        check_ops: check_n,
        check_new: w.expected_new(check_n),
        rows: Vec::new(),
        notes: skipped.to_vec(),
        other_cpu_cores: None,
    };
    // CPU seconds other processes used, and wall seconds, while the
    // in-process contenders ran (PostgreSQL's own server is "other").
    let mut others = (0.0, 0.0);
    for c in lineup {
        if sc.processes > 1 && !c.shared() {
            rep.notes.push(format!(
                "{}: n/a as several processes (one process owns its store)",
                c.name()
            ));
            continue;
        }
        let (res, used) = others_cpu(|| bench_contender(&**c, sc, &w, check_n, opts, failures));
        if let Some((cpu, secs)) = used.filter(|_| c.id() != "postgres") {
            others = (others.0 + cpu, others.1 + secs);
        }
        match res {
            Ok(Some(row)) => rep.rows.push(row),
            Ok(None) => rep
                .notes
                .push(format!("{}: new-key count mismatch, see stderr", c.name())),
            Err(e) => {
                failures.add(format!("ERROR [{}] {}: {e}", sc.name, c.name()));
                rep.notes.push(format!("{} failed: {e}", c.name()));
            }
        }
    }
    rep.other_cpu_cores = (others.1 > 0.0).then(|| others.0 / others.1);
    rep
}

/// Runs a scenario; if other processes disturbed it (a shared machine),
/// waits for quiet and runs it again, up to three attempts while the
/// allowance for waiting and re-running lasts. Keeps the least disturbed
/// attempt.
fn bench_scenario_quietly(
    sc: &Scenario,
    lineup: &[Box<dyn Contender>],
    skipped: &[String],
    opts: &Options,
    failures: &mut Failures,
    allowance: &mut Duration,
) -> ScenarioReport {
    let mut attempts: Vec<ScenarioReport> = Vec::new();
    loop {
        if !allowance.is_zero() {
            wait_for_quiet(allowance);
        }
        let start = Instant::now();
        attempts.push(bench_scenario(sc, lineup, skipped, opts, failures));
        let others = attempts
            .last()
            .and_then(|r| r.other_cpu_cores)
            .unwrap_or(0.0);
        if others < QUIET_CORES || allowance.is_zero() || attempts.len() == 3 {
            break;
        }
        *allowance = allowance.saturating_sub(start.elapsed());
        eprintln!(
            "{} [{}] other processes used {others:.2} cores; running the scenario again",
            clock(),
            sc.name
        );
    }
    let load = |r: &ScenarioReport| r.other_cpu_cores.unwrap_or(0.0);
    let best = (0..attempts.len())
        .min_by(|&a, &b| load(&attempts[a]).total_cmp(&load(&attempts[b])))
        .unwrap_or(0);
    let mut rep = attempts.swap_remove(best);
    if !attempts.is_empty() {
        let list: Vec<String> = attempts.iter().map(|r| format!("{:.2}", load(r))).collect();
        rep.notes.push(format!(
            "Also run {} more time(s), discarded: other processes used more CPU then ({} cores).",
            attempts.len(),
            list.join(", ")
        ));
    }
    rep
}

fn out_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
        .join("bench-compare")
}

/// The header: machine, versions, options, method.
fn header(meta: &[(String, String)], skipped: &[String]) -> String {
    let mut out = String::from("# dedupkv comparison\n\n");
    for (k, v) in meta {
        let _ = writeln!(out, "- {k}: {v}");
    }
    out.push_str(
        "\nEvery contender runs the same seeded key sequence per scenario: first a check run of \
         the same leading keys for all (its new-key count must equal the model's, the number of \
         distinct keys), then timed runs from an empty store, each stopped when the time budget \
         runs out (or the sequence ends), so slower contenders cover fewer keys (column \
         keys/run); each timed run's new-key count is checked against the model too.\n\n",
    );
    for s in skipped {
        let _ = writeln!(out, "_{s}_\n");
    }
    out
}

/// CSV, JSON and SVG to `target/bench-compare/`, and the SVG to
/// `docs/bench/` when asked; returns a line per file written.
fn write_outputs(
    meta: &[(String, String)],
    reports: &[ScenarioReport],
    outcomes: &[targets::Outcome],
    opts: &Options,
) -> Result<Vec<String>> {
    let fact = |key: &str| {
        meta.iter()
            .find(|(k, _)| k == key)
            .map_or("", |(_, v)| v.as_str())
    };
    let dir = out_dir();
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("compare.csv"), report::csv(reports))?;
    std::fs::write(
        dir.join("compare.json"),
        report::json(meta, reports, outcomes),
    )?;
    let subtitle = format!(
        "median of {} run(s); {}; {}",
        opts.runs,
        fact("cpu"),
        fact("date")
    );
    let chart = svg::chart(reports, &subtitle);
    std::fs::write(dir.join("compare.svg"), &chart)?;
    let mut written = vec![format!("Wrote {}/compare.{{csv,json,svg}}", dir.display())];
    if opts.update_docs {
        let docs = workspace_root().join("docs/bench");
        std::fs::create_dir_all(&docs)?;
        std::fs::write(docs.join("compare.svg"), &chart)?;
        written.push(format!("Wrote {}/compare.svg", docs.display()));
    }
    Ok(written)
}

fn real_main() -> Result<ExitCode> {
    if processes::is_child() {
        processes::child_main()?;
        return Ok(ExitCode::SUCCESS);
    }
    let opts = options::parse_options()?;
    let pg_url = lineup::pg_url_from_env();
    let mut lineup = lineup::all(pg_url.as_deref())?;
    if !opts.contenders.is_empty() {
        lineup
            .contenders
            .retain(|c| opts.contenders.iter().any(|f| f == c.id()));
    }
    let pg = pg_url.as_deref().map(pg::Postgres::connect).transpose()?;
    let chosen: Vec<Scenario> = scenarios::all()
        .into_iter()
        .filter(|s| opts.scenarios.is_empty() || opts.scenarios.iter().any(|f| f == s.name))
        .collect();
    if chosen.is_empty() {
        let names: Vec<_> = scenarios::all().iter().map(|s| s.name).collect();
        return Err(format!(
            "no scenario matches {:?}; known: {}",
            opts.scenarios,
            names.join(", ")
        )
        .into());
    }

    let mut meta = machine::machine_facts(pg.as_ref());
    meta.push((
        "options".to_owned(),
        format!(
            "scale {}, {} timed run(s) per contender, time budget {:.2} s per run, \
             up to {:.0} s of waiting for a quiet machine",
            opts.scale, opts.runs, opts.secs, opts.quiet_wait
        ),
    ));
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    meta.push((
        "command".to_owned(),
        format!(
            "scripts/with-postgres.sh cargo bench -p dedupkv-bench-compare --bench compare -- {}",
            args.join(" ")
        )
        .trim_end()
        .to_owned(),
    ));
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{}", header(&meta, &lineup.skipped))?;
    stdout.flush()?;

    let mut failures = Failures::default();
    let mut reports = Vec::new();
    let mut allowance = Duration::from_secs_f64(opts.quiet_wait);
    for sc in &chosen {
        let rep = bench_scenario_quietly(
            sc,
            &lineup.contenders,
            &lineup.skipped,
            &opts,
            &mut failures,
            &mut allowance,
        );
        writeln!(stdout, "{}", report::markdown(&rep, opts.runs))?;
        stdout.flush()?;
        reports.push(rep);
    }
    let outcomes = targets::evaluate(&reports);
    writeln!(stdout, "{}", targets::block(&outcomes))?;
    if opts.test_mode {
        writeln!(
            stdout,
            "Test mode (started without --bench): tiny workloads, no files written; \
             run `cargo bench -p dedupkv-bench-compare --bench compare` for numbers."
        )?;
    } else {
        for line in write_outputs(&meta, &reports, &outcomes, &opts)? {
            writeln!(stdout, "{line}")?;
        }
    }
    if failures.0.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(stdout, "\n{} failure(s):", failures.0.len())?;
    for f in &failures.0 {
        writeln!(stdout, "- {f}")?;
    }
    Ok(ExitCode::FAILURE)
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("compare: {e}");
            ExitCode::FAILURE
        }
    }
}
