//! The parent: hosts the mock cluster, produces the events, starts,
//! SIGKILLs and stops the members, and checks the ledger and the logs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::{TOPIC, now_us};

const PARTITIONS: i32 = 6;
/// How long any one condition may take before the run fails (generous:
/// both cores may be busy with other work).
const PATIENCE: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Kill,
    Rolling,
    LostDisk,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Kill => "kill",
            Scenario::Rolling => "rolling",
            Scenario::LostDisk => "lost-disk",
        }
    }
}

/// One run's place: the replica bucket, the ledger, the members' logs.
struct Run {
    dir: PathBuf,
    /// Removes `dir` when the run ends, unless it failed (then the logs
    /// stay for a look).
    guard: Option<tempfile::TempDir>,
    bootstrap: String,
    mode: &'static str,
    members: HashMap<String, Child>,
}

impl Run {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn base(&self, member: &str) -> PathBuf {
        self.path(&format!("disk-{member}"))
    }

    /// Starts member `name` (a consumer process); with a pause point, it
    /// stops there in its first batch after the file `arm-NAME` appears,
    /// and prints `PAUSED`.
    fn spawn(&mut self, name: &str, pause: Option<&str>) -> Option<std::sync::mpsc::Receiver<()>> {
        let exe = std::env::current_exe().expect("this binary");
        let mut cmd = Command::new(exe);
        cmd.env("DEDUPKV_KAFKA_ROLE", "consumer")
            .env("DEDUPKV_KAFKA_MEMBER", name)
            .env("DEDUPKV_KAFKA_MODE", self.mode)
            .env("DEDUPKV_KAFKA_BASE", self.base(name))
            .env("DEDUPKV_KAFKA_BUCKET", self.path("bucket"))
            .env("DEDUPKV_KAFKA_LEDGER", self.path("ledger"))
            .env("DEDUPKV_KAFKA_STOP", self.path(&format!("stop-{name}")))
            .env("DEDUPKV_KAFKA_OUT", self.path(&format!("log-{name}")))
            .env("DEDUPKV_KAFKA_BOOTSTRAP", &self.bootstrap)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(point) = pause {
            cmd.env("DEDUPKV_KAFKA_ARM", self.path(&format!("arm-{name}")))
                .env("DEDUPKV_KAFKA_PAUSE_POINT", point);
        }
        let mut child = cmd.spawn().expect("spawn a member");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                if line.is_ok_and(|l| l == "PAUSED") {
                    let _ = tx.send(());
                }
            }
        });
        self.members.insert(name.to_string(), child);
        pause.map(|_| rx)
    }

    /// SIGKILLs member `name` (std's `Child::kill` is SIGKILL on Unix).
    fn kill(&mut self, name: &str) -> u64 {
        let mut child = self.members.remove(name).expect("a live member");
        child.kill().expect("SIGKILL");
        let at = now_us();
        let status = child.wait().expect("reap");
        assert!(!status.success(), "{name} was killed: {status:?}");
        at
    }

    /// Asks member `name` to leave the group gracefully and waits for it.
    fn stop(&mut self, name: &str) {
        std::fs::write(self.path(&format!("stop-{name}")), b"").expect("stop file");
        let mut child = self.members.remove(name).expect("a live member");
        let status = child.wait().expect("reap");
        assert!(status.success(), "{name} left cleanly: {status:?}");
    }

    /// Every line of every member's log, as (member, fields).
    fn lines(&self) -> Vec<(String, Vec<String>)> {
        let mut all = Vec::new();
        for e in std::fs::read_dir(&self.dir).expect("run dir").flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(member) = name.strip_prefix("log-") else {
                continue;
            };
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            for l in text.lines() {
                all.push((
                    member.to_string(),
                    l.split(' ').map(str::to_string).collect(),
                ));
            }
        }
        all
    }

    /// Waits until `cond` holds over the logs.
    fn wait_for(&mut self, what: &str, cond: impl Fn(&[(String, Vec<String>)]) -> bool) {
        let start = Instant::now();
        loop {
            if cond(&self.lines()) {
                return;
            }
            for (name, child) in &mut self.members {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("{name} exited ({status:?}) while waiting for {what}");
                }
            }
            assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(g) = self.guard.take()
        {
            eprintln!(
                "group_run: the failed run's logs are in {}",
                g.keep().display()
            );
        }
        for (_, mut c) in self.members.drain() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn is(l: &[String], what: &str) -> bool {
    l.first().is_some_and(|w| w == what)
}

fn field<T: std::str::FromStr>(l: &[String], i: usize) -> T {
    l.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("field {i} of {l:?}"))
}

/// The partitions `member` owns now, by its assigns and revokes in order.
fn owned(lines: &[(String, Vec<String>)], member: &str) -> HashSet<i32> {
    let mut now = HashSet::new();
    for (w, l) in lines {
        if w != member {
            continue;
        }
        if is(l, "assign") && l.get(3).is_some_and(|s| s == "ok") {
            now.insert(field(l, 1));
        }
        if is(l, "revoke_start") {
            now.remove(&field(l, 1));
        }
    }
    now
}

/// Offset commits logged by `member`.
fn commits_by(lines: &[(String, Vec<String>)], member: &str) -> usize {
    lines
        .iter()
        .filter(|(w, l)| w == member && is(l, "commit"))
        .count()
}

/// The members that have assigned partitions since `since` (µs), and how
/// many each.
fn assigned_since(lines: &[(String, Vec<String>)], since: u64) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for (who, l) in lines {
        if is(l, "assign") && l.get(3).is_some_and(|s| s == "ok") && field::<u64>(l, 2) >= since {
            *m.entry(who.clone()).or_default() += 1;
        }
    }
    m
}

/// The producer: event `e{i}` to partition `i % 6`, and every third
/// message a duplicate of an event produced 40 messages before (so it
/// lands after a rebalance as often as not). Runs until `stop`.
struct Producing {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<(HashSet<String>, BTreeMap<i32, i64>)>,
}

fn produce(bootstrap: &str) -> Producing {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let handle = std::thread::spawn(move || {
        let mut unique = HashSet::new();
        let mut counts: BTreeMap<i32, i64> = BTreeMap::new();
        let mut send = |i: u64| {
            let id = format!("e{i}");
            let p = (i % PARTITIONS as u64) as i32;
            loop {
                match producer.send(
                    BaseRecord::<str, str>::to(TOPIC)
                        .partition(p)
                        .payload(&id)
                        .key(&id),
                ) {
                    Ok(()) => break,
                    Err(_) => producer.poll(Duration::from_millis(10)),
                }
            }
            *counts.entry(p).or_default() += 1;
            unique.insert(id);
        };
        let mut i = 0u64;
        while !flag.load(Ordering::SeqCst) {
            send(i);
            if i.is_multiple_of(3) && i >= 40 {
                send(i - 40);
            }
            i += 1;
            producer.poll(Duration::ZERO);
            // A steady stream (~250 messages a second), not a test wait.
            std::thread::sleep(Duration::from_millis(4));
        }
        producer.flush(Duration::from_secs(60)).expect("flush");
        (unique, counts)
    });
    Producing { stop, handle }
}

/// What one scenario measured.
struct Report {
    mode: &'static str,
    unique: usize,
    messages: i64,
    caught_across: usize,
    caught_same: usize,
    commits_refused: usize,
    reconciled: usize,
    missed: usize,
    lag_at_kill: String,
    handover_us: Vec<u64>,
    takeover_us: Vec<u64>,
    revoke_us: Vec<u64>,
    assign_us: Vec<u64>,
}

/// The `q`-th percentile of `v` (µs), in ms.
fn pct(v: &[u64], q: usize) -> String {
    let mut s = v.to_vec();
    s.sort_unstable();
    match s.get((s.len().saturating_sub(1) * q).div_ceil(100)) {
        Some(us) => format!("{}.{}", us / 1000, us % 1000 / 100),
        None => "-".into(),
    }
}

#[allow(clippy::too_many_lines)] // the steps of the three scenarios, in order
fn scenario(sc: Scenario, mode: &'static str) -> Report {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(TOPIC, PARTITIONS, 1).expect("topic");
    let dir = tempfile::tempdir().expect("tempdir");
    for d in ["bucket", "ledger"] {
        std::fs::create_dir_all(dir.path().join(d)).expect("dirs");
    }
    let mut run = Run {
        dir: dir.path().to_path_buf(),
        guard: Some(dir),
        bootstrap: cluster.bootstrap_servers(),
        mode,
        members: HashMap::new(),
    };
    let producing = produce(&run.bootstrap);
    let mut killed: Option<(String, u64)> = None;
    let mut lag_at_kill = String::new();
    match sc {
        Scenario::Kill | Scenario::LostDisk => {
            // The kill: mid-batch (between the effect and the complete for
            // half the claims, between the claim and the effect for the
            // rest); the lost disk: between the complete and the commit.
            let point = if sc == Scenario::Kill {
                "mid"
            } else {
                "complete"
            };
            let paused = run.spawn("a", Some(point)).expect("a pauses");
            run.spawn("b", None);
            // Both members handle first, so that both members' partitions
            // move with keys in their stores; then a stops in its next
            // batch, and is killed at once.
            run.wait_for("a and b handling", |ls| {
                commits_by(ls, "a") >= 3 && commits_by(ls, "b") >= 3
            });
            std::fs::write(run.path("arm-a"), b"").expect("arm a");
            let t = Instant::now();
            while paused.try_recv().is_err() {
                assert!(t.elapsed() < PATIENCE, "a never stopped in a batch");
                std::thread::sleep(Duration::from_millis(5));
            }
            let at = run.kill("a");
            killed = Some(("a".into(), at));
            lag_at_kill = run
                .lines()
                .iter()
                .find(|(w, l)| w == "a" && is(l, "pause"))
                .map(|(_, l)| l[3..].join(" "))
                .unwrap_or_default();
            // The group notices (session timeout) and b takes all six
            // (counted from a's pause: a paused member does not poll, so a
            // rebalance between the pause and the kill also moves them).
            let paused_at = run
                .lines()
                .iter()
                .find(|(w, l)| w == "a" && is(l, "pause"))
                .map_or(at, |(_, l)| field(l, 2));
            run.wait_for("b owning every partition after the kill", |ls| {
                assigned_since(ls, paused_at).get("b").copied().unwrap_or(0) >= PARTITIONS as usize
            });
            if sc == Scenario::LostDisk {
                std::fs::remove_dir_all(run.base("a")).expect("lose a's disk");
                let back = now_us();
                run.spawn("a", None);
                run.wait_for("a back on an empty disk, restoring", |ls| {
                    ls.iter().any(|(w, l)| {
                        w == "a"
                            && is(l, "assign")
                            && field::<u64>(l, 2) >= back
                            && l.iter().any(|f| f == "restored=Missing")
                    })
                });
            }
        }
        Scenario::Rolling => {
            run.spawn("a", None);
            run.spawn("b", None);
            // Each step waits for handling, not only for the assignment:
            // a store that moves must hold keys for the move to test
            // anything.
            run.wait_for("a and b handling", |ls| {
                commits_by(ls, "a") >= 3 && commits_by(ls, "b") >= 3
            });
            // Replace a with c, then b with d, one at a time.
            for (new, old) in [("c", "a"), ("d", "b")] {
                let t = now_us();
                run.spawn(new, None);
                run.wait_for(&format!("{new} joining and handling"), |ls| {
                    assigned_since(ls, t).contains_key(new) && commits_by(ls, new) >= 3
                });
                let t = now_us();
                run.stop(old);
                let live: Vec<String> = run.members.keys().cloned().collect();
                run.wait_for(&format!("{old}'s partitions moving"), |ls| {
                    let all: HashSet<i32> = live.iter().flat_map(|m| owned(ls, m)).collect();
                    assigned_since(ls, t).contains_key(new) && all.len() == PARTITIONS as usize
                });
            }
        }
    }
    // Let the survivors handle a stretch after the last move, then drain.
    let commits = |ls: &[(String, Vec<String>)]| ls.iter().filter(|(_, l)| is(l, "commit")).count();
    let before = commits(&run.lines());
    run.wait_for("messages handled after the last move", |ls| {
        commits(ls) >= before + 20
    });
    producing.stop.store(true, Ordering::SeqCst);
    let (unique, counts) = producing.handle.join().expect("producer");
    run.wait_for("every offset committed", |ls| {
        let mut top: HashMap<i32, i64> = HashMap::new();
        for (_, l) in ls {
            if is(l, "commit") {
                let e = top.entry(field(l, 1)).or_default();
                *e = (*e).max(field(l, 2));
            }
        }
        counts
            .iter()
            .all(|(p, n)| top.get(p).copied().unwrap_or(0) >= *n)
    });
    let live: Vec<String> = run.members.keys().cloned().collect();
    for m in live {
        run.stop(&m);
    }
    check(
        &run,
        sc,
        mode,
        &unique,
        &counts,
        killed.as_ref(),
        &lag_at_kill,
    )
}

#[allow(clippy::too_many_arguments)]
fn check(
    run: &Run,
    sc: Scenario,
    mode: &'static str,
    unique: &HashSet<String>,
    counts: &BTreeMap<i32, i64>,
    killed: Option<&(String, u64)>,
    lag_at_kill: &str,
) -> Report {
    // The ledger: one effect per idempotency key, and every unique event
    // exactly once.
    let mut applied: HashMap<String, usize> = HashMap::new();
    for e in std::fs::read_dir(run.path("ledger"))
        .expect("ledger")
        .flatten()
    {
        let id = std::fs::read_to_string(e.path()).expect("ledger entry");
        *applied.entry(id).or_default() += 1;
    }
    let twice: Vec<_> = applied.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} {mode}: duplicate effects: {twice:?}",
        sc.name()
    );
    let got: HashSet<String> = applied.keys().cloned().collect();
    assert_eq!(
        &got,
        unique,
        "{} {mode}: the ledger holds the unique events",
        sc.name()
    );
    let lines = run.lines();
    let mut report = Report {
        mode,
        unique: unique.len(),
        messages: counts.values().sum(),
        caught_across: 0,
        caught_same: 0,
        commits_refused: lines.iter().filter(|(_, l)| is(l, "commit_failed")).count(),
        reconciled: 0,
        missed: 0,
        lag_at_kill: lag_at_kill.to_string(),
        handover_us: Vec::new(),
        takeover_us: Vec::new(),
        revoke_us: Vec::new(),
        assign_us: Vec::new(),
    };
    let dead = killed.map(|(m, _)| m.as_str());
    // The dead member's last effect time of each key it handled, and
    // the window its replica had not shipped when it stopped: a key can
    // be missed only if its claim was committed inside that window (every
    // older commit was shipped), so its effect, which follows the claim,
    // came inside it too. 5 ms of slack for the two clocks.
    let mut dead_effects: HashMap<&str, u64> = HashMap::new();
    let mut window_start = 0u64;
    for (w, l) in &lines {
        if Some(w.as_str()) != dead {
            continue;
        }
        if is(l, "effect") {
            dead_effects.insert(l[1].as_str(), field(l, 6));
        }
        if is(l, "pause") {
            let lag: u64 = l
                .iter()
                .find_map(|f| f.strip_prefix("lag_us="))
                .and_then(|v| v.parse().ok())
                .expect("lag_us");
            window_start = field::<u64>(l, 2).saturating_sub(lag + 5_000);
        }
    }
    for (who, l) in &lines {
        if is(l, "caught") {
            match l[2].as_str() {
                "across" => report.caught_across += 1,
                _ => report.caught_same += 1,
            }
        }
        if is(l, "effect") && l[2] == "dup" {
            if l.iter().any(|f| f == "interrupted=true") {
                // A claim the dead member left in flight, reconciled
                // against the provider.
                report.reconciled += 1;
            } else {
                // The store had no record: a key the replica lost.
                report.missed += 1;
                let when = dead_effects.get(l[1].as_str());
                assert!(
                    when.is_some_and(|t| *t >= window_start),
                    "{} {mode}: {who} missed {}, which the dead member did not handle inside \
                     its replica's lag at the kill ({when:?} < {window_start})",
                    sc.name(),
                    l[1]
                );
            }
        }
    }
    if mode == "sync" {
        assert_eq!(
            report.missed,
            0,
            "{} sync: nothing acknowledged is lost",
            sc.name()
        );
    }
    if sc == Scenario::Rolling {
        assert_eq!(
            report.missed, 0,
            "rolling {mode}: a graceful leave ships its tail"
        );
    }
    assert!(
        report.caught_across > 0,
        "{} {mode}: duplicates caught across rebalances",
        sc.name()
    );
    handover_times(&lines, killed, &mut report);
    report
}

/// Each revoke to the next first answer on its partition, the revokes'
/// and assigns' own times, and a kill to each partition's next first answer.
fn handover_times(
    lines: &[(String, Vec<String>)],
    killed: Option<&(String, u64)>,
    report: &mut Report,
) {
    let mut firsts: Vec<(i32, u64)> = lines
        .iter()
        .filter(|(_, l)| is(l, "first"))
        .map(|(_, l)| (field(l, 1), field(l, 2)))
        .collect();
    firsts.sort_unstable();
    let next_first = |p: i32, t: u64| {
        firsts
            .iter()
            .filter(|(q, f)| *q == p && *f >= t)
            .map(|(_, f)| *f)
            .min()
    };
    let mut started: HashMap<(&str, i32), u64> = HashMap::new();
    for (who, l) in lines {
        if is(l, "revoke_start") {
            started.insert((who.as_str(), field(l, 1)), field(l, 2));
        }
        if is(l, "revoke_done")
            && let Some(t) = started.remove(&(who.as_str(), field(l, 1)))
        {
            report.revoke_us.push(field::<u64>(l, 2) - t);
        }
        if let Some(took) = l.iter().find_map(|f| f.strip_prefix("took_us=")) {
            report.assign_us.push(took.parse().expect("took_us"));
        }
        if is(l, "revoke_start") {
            let (p, t): (i32, u64) = (field(l, 1), field(l, 2));
            if let Some(f) = next_first(p, t) {
                report.handover_us.push(f - t);
            }
        }
    }
    if let Some(&(_, at)) = killed {
        for p in 0..PARTITIONS {
            if let Some(f) = next_first(p, at) {
                report.takeover_us.push(f - at);
            }
        }
    }
}

/// One scenario's line of the run's output.
fn print_scenario(sc: Scenario, mode: &str, elapsed: Duration, r: &Report) {
    println!(
        "group_run {} {}: ok in {:.1} s: {} unique events in {} messages; caught \
         across rebalances {}, within an assignment {}; offset commits refused {}; reconciled {}; \
         missed {}{}",
        sc.name(),
        mode,
        elapsed.as_secs_f64(),
        r.unique,
        r.messages,
        r.caught_across,
        r.caught_same,
        r.commits_refused,
        r.reconciled,
        r.missed,
        if r.lag_at_kill.is_empty() {
            String::new()
        } else {
            format!(" (at the kill: {})", r.lag_at_kill)
        }
    );
}

pub fn run() -> ExitCode {
    let pick = |var: &str, all: &[&'static str]| -> Vec<&'static str> {
        match std::env::var(var) {
            Ok(v) => all
                .iter()
                .copied()
                .filter(|s| v.split(',').any(|x| x == *s))
                .collect(),
            Err(_) => all.to_vec(),
        }
    };
    let scenarios: Vec<Scenario> =
        pick("DEDUPKV_KAFKA_SCENARIOS", &["kill", "rolling", "lost-disk"])
            .into_iter()
            .map(|s| match s {
                "kill" => Scenario::Kill,
                "rolling" => Scenario::Rolling,
                _ => Scenario::LostDisk,
            })
            .collect();
    let modes = pick("DEDUPKV_KAFKA_MODES", &["async", "sync"]);
    if std::env::var("CI").as_deref() == Ok("true") {
        // Under CI every scenario runs in both modes: none is skipped.
        assert!(
            scenarios.len() == 3 && modes.len() == 2,
            "CI=true runs every scenario in both modes; unset DEDUPKV_KAFKA_SCENARIOS and \
             DEDUPKV_KAFKA_MODES"
        );
    }
    // The modes run side by side (each its own cluster, members and
    // directories): most of a scenario is waiting for the group.
    let threads: Vec<_> = modes
        .iter()
        .map(|mode| {
            let (mode, scenarios) = (*mode, scenarios.clone());
            std::thread::spawn(move || {
                let mut reports = Vec::new();
                for sc in scenarios {
                    let t = Instant::now();
                    let r = scenario(sc, mode);
                    print_scenario(sc, mode, t.elapsed(), &r);
                    reports.push(r);
                }
                reports
            })
        })
        .collect();
    let mut reports = Vec::new();
    let mut failed = false;
    for t in threads {
        match t.join() {
            Ok(r) => reports.extend(r),
            Err(_) => failed = true,
        }
    }
    if failed {
        return ExitCode::FAILURE;
    }
    println!("\nhand-over (ms, p50 / p99):");
    for mode in &modes {
        let all = |f: fn(&Report) -> &Vec<u64>| -> Vec<u64> {
            reports
                .iter()
                .filter(|r| r.mode == *mode)
                .flat_map(|r| f(r).iter().copied())
                .collect()
        };
        let (h, k, rv, asg) = (
            all(|r| &r.handover_us),
            all(|r| &r.takeover_us),
            all(|r| &r.revoke_us),
            all(|r| &r.assign_us),
        );
        println!(
            "  {mode}: revoke to the next owner's first answer {} / {} ({} hand-overs), of which \
             the revoke {} / {} and the assign {} / {} ({} assigns), the rest the group's \
             rebalance; SIGKILL to the new owner's first answer {} / {} ({})",
            pct(&h, 50),
            pct(&h, 99),
            h.len(),
            pct(&rv, 50),
            pct(&rv, 99),
            pct(&asg, 50),
            pct(&asg, 99),
            asg.len(),
            pct(&k, 50),
            pct(&k, 99),
            k.len()
        );
    }
    ExitCode::SUCCESS
}
