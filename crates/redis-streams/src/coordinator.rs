//! The coordinator: Redis Streams has no rebalance protocol, so this
//! process plays the group's: it starts the member processes, assigns
//! streams to them and moves them (revoke on the old member, then assign
//! on the new; after a SIGKILL, assign on another member at once, which
//! fences the dead one), feeds the streams, and checks the provider's
//! books and the members' lines at the end.
//!
//! Every wait is on a condition (a member's line, the streams drained),
//! bounded by [`PATIENCE`]; nothing is timed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::{
    BoxError, CHILD_ENV, GROUP, Mode, PARTITIONS, Report, Scenario, URL_ENV, now_us, partition_of,
    stream,
};

/// How long any one condition may take before the run fails (generous:
/// both cores may be busy with other work).
const PATIENCE: Duration = Duration::from_secs(180);
/// Answers each member gives before a move, and all give after the last
/// one: the stores that move must hold keys, and the new owners must work.
const RUNS_BEFORE: usize = 1500;
const RUNS_AFTER: usize = 3000;

/// One member's line: (member, fields).
type Line = (String, Vec<String>);

struct Live {
    child: Child,
    stdin: ChildStdin,
}

/// One scenario's place: its Redis namespace, its directory (the
/// replica bucket, the members' disks), its members and their lines.
struct Run {
    exe: PathBuf,
    url: String,
    mode: Mode,
    ns: String,
    dir: PathBuf,
    /// Removes `dir` at the end, unless the run failed.
    guard: Option<tempfile::TempDir>,
    members: HashMap<String, Live>,
    lines: Arc<Mutex<Vec<Line>>>,
    con: redis::Connection,
}

fn is(l: &[String], what: &str) -> bool {
    l.first().is_some_and(|w| w == what)
}

fn field<T: std::str::FromStr>(l: &[String], i: usize) -> Result<T, BoxError> {
    l.get(i)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("field {i} of {l:?}").into())
}

/// The time (µs) of a line: its third field for every line but `start`
/// and `exit`.
fn at(l: &[String]) -> u64 {
    field(l, 2).unwrap_or(0)
}

impl Run {
    fn snapshot(&self) -> Vec<Line> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn disk(&self, member: &str) -> PathBuf {
        self.path(&format!("disk-{member}"))
    }

    /// Starts member `name`; its stdout lines go to `lines`.
    fn spawn(&mut self, name: &str, drop_ack: bool) -> Result<(), BoxError> {
        let spawned = now_us();
        let mut child = Command::new(&self.exe)
            .env(CHILD_ENV, name)
            .env(URL_ENV, &self.url)
            .env("DEDUPKV_REDIS_MODE", self.mode.name())
            .env("DEDUPKV_REDIS_NS", &self.ns)
            .env("DEDUPKV_REDIS_BASE", self.disk(name))
            .env("DEDUPKV_REDIS_BUCKET", self.path("bucket"))
            .env(
                "DEDUPKV_REDIS_FLAGS",
                if drop_ack { "drop-ack" } else { "" },
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let (lines, who) = (Arc::clone(&self.lines), name.to_string());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let fields = line.split(' ').map(str::to_string).collect();
                lines
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((who.clone(), fields));
            }
        });
        self.members.insert(name.to_string(), Live { child, stdin });
        self.wait_for(&format!("{name} starting"), |ls| {
            ls.iter()
                .any(|(w, l)| w == name && is(l, "start") && at(l) >= spawned)
        })
    }

    fn send(&mut self, name: &str, command: &str) -> Result<(), BoxError> {
        let live = self
            .members
            .get_mut(name)
            .ok_or_else(|| format!("{name} is not running"))?;
        writeln!(live.stdin, "{command}")?;
        live.stdin.flush()?;
        Ok(())
    }

    /// Assigns partition `p` to `name` and waits for its answer.
    fn assign(&mut self, name: &str, p: i32) -> Result<(), BoxError> {
        self.assign_all(name, &[p])
    }

    /// Assigns partitions `ps` to `name` at once and waits for its answers.
    fn assign_all(&mut self, name: &str, ps: &[i32]) -> Result<(), BoxError> {
        let t = now_us();
        for p in ps {
            self.send(name, &format!("assign {p}"))?;
        }
        let answered = |ls: &[Line], p: i32, ok: bool| {
            ls.iter().any(|(w, l)| {
                w == name
                    && is(l, "assign")
                    && l[1] == p.to_string()
                    && at(l) >= t
                    && (!ok || l[3] == "ok")
            })
        };
        self.wait_for(&format!("{name} assigning {ps:?}"), |ls| {
            ps.iter().all(|p| answered(ls, *p, false))
        })?;
        let lines = self.snapshot();
        match ps.iter().find(|p| !answered(&lines, **p, true)) {
            None => Ok(()),
            Some(p) => Err(format!("{name} could not take partition {p}").into()),
        }
    }

    /// Revokes partition `p` from `name` and waits until it is handed over.
    fn revoke(&mut self, name: &str, p: i32) -> Result<(), BoxError> {
        let t = now_us();
        self.send(name, &format!("revoke {p}"))?;
        self.wait_for(&format!("{name} revoking {p}"), |ls| {
            ls.iter().any(|(w, l)| {
                w == name && is(l, "revoke_done") && l[1] == p.to_string() && at(l) >= t
            })
        })
    }

    /// Moves partition `p` from `from` to `to`: revoke, then assign.
    fn move_partition(&mut self, p: i32, from: &str, to: &str) -> Result<(), BoxError> {
        self.revoke(from, p)?;
        self.assign(to, p)
    }

    /// SIGKILLs member `name` (std's `Child::kill` is SIGKILL on Unix);
    /// answers when (µs).
    fn kill(&mut self, name: &str) -> Result<u64, BoxError> {
        let mut live = self
            .members
            .remove(name)
            .ok_or_else(|| format!("{name} is not running"))?;
        live.child.kill()?;
        let killed = now_us();
        let status = live.child.wait()?;
        if status.success() {
            return Err(format!("{name} exited cleanly before its SIGKILL").into());
        }
        Ok(killed)
    }

    /// Asks member `name` to stop (check its tallies, ship its tails) and
    /// waits for it.
    fn stop(&mut self, name: &str) -> Result<(), BoxError> {
        self.send(name, "stop")?;
        let mut live = self
            .members
            .remove(name)
            .ok_or_else(|| format!("{name} is not running"))?;
        let start = Instant::now();
        loop {
            if let Some(status) = live.child.try_wait()? {
                if !status.success() {
                    return Err(format!("{name} failed on stop: {status}").into());
                }
                return Ok(());
            }
            if start.elapsed() > PATIENCE {
                let _ = live.child.kill();
                return Err(format!("{name} did not stop").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `cond` holds over the lines; fails at once if a member
    /// dies meanwhile.
    fn wait_for(&mut self, what: &str, cond: impl Fn(&[Line]) -> bool) -> Result<(), BoxError> {
        let start = Instant::now();
        loop {
            if cond(&self.snapshot()) {
                return Ok(());
            }
            for (name, live) in &mut self.members {
                if let Ok(Some(status)) = live.child.try_wait() {
                    return Err(format!("{name} exited ({status}) while waiting for {what}").into());
                }
            }
            if start.elapsed() > PATIENCE {
                return Err(format!("timed out waiting for {what}").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `name` answered `n` entries since `since` (µs).
    fn wait_runs(&mut self, name: &str, n: usize, since: u64) -> Result<(), BoxError> {
        self.wait_for(&format!("{name} answering {n} entries"), |ls| {
            ls.iter()
                .filter(|(w, l)| w == name && is(l, "run") && at(l) >= since)
                .count()
                >= n
        })
    }

    /// Waits until `name` paused (after `arm`); answers the pause line.
    fn wait_pause(&mut self, name: &str) -> Result<Vec<String>, BoxError> {
        self.wait_for(&format!("{name} pausing"), |ls| {
            ls.iter().any(|(w, l)| w == name && is(l, "pause"))
        })?;
        self.snapshot()
            .into_iter()
            .find(|(w, l)| w == name && is(l, "pause"))
            .map(|(_, l)| l)
            .ok_or_else(|| "no pause line".into())
    }

    /// Every stream read to its end by the group and nothing pending.
    fn drained(&mut self) -> Result<bool, BoxError> {
        for p in 0..PARTITIONS {
            let key = stream(&self.ns, p);
            let last: Vec<redis::Value> = redis::cmd("XREVRANGE")
                .arg(&key)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query(&mut self.con)?;
            let last: Vec<(String, HashMap<String, String>)> = last
                .iter()
                .map(redis::from_redis_value_ref)
                .collect::<Result<_, _>>()?;
            let groups: Vec<HashMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&key)
                .query(&mut self.con)?;
            let group = groups
                .iter()
                .find(|g| {
                    g.get("name")
                        .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                        .is_some_and(|n| n == GROUP)
                })
                .ok_or_else(|| format!("{key} has no group {GROUP}"))?;
            let pending: u64 = group
                .get("pending")
                .map(redis::from_redis_value_ref)
                .transpose()?
                .unwrap_or(0);
            let delivered: String = group
                .get("last-delivered-id")
                .map(redis::from_redis_value_ref)
                .transpose()?
                .unwrap_or_default();
            let read_all = last.first().is_none_or(|(id, _)| *id == delivered);
            if pending > 0 || !read_all {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for (_, mut live) in self.members.drain() {
            let _ = live.child.kill();
            let _ = live.child.wait();
        }
    }
}

/// The producer: order `order-NNNNN` to its stream (a hash of its id),
/// and every third entry a copy of the order published 40 entries before
/// (a redelivering upstream; it lands after a move as often as not).
/// Runs until `stop`; answers the unique orders and the entries.
struct Producing {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Result<(HashSet<String>, u64), String>>,
}

fn produce(url: &str, ns: &str) -> Result<Producing, BoxError> {
    let mut con = redis::Client::open(url)?.get_connection()?;
    for p in 0..PARTITIONS {
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream(ns, p))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query(&mut con)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, ns) = (Arc::clone(&stop), ns.to_string());
    let handle = std::thread::spawn(move || {
        let mut unique = HashSet::new();
        let mut entries = 0u64;
        let mut add = |i: u64| -> redis::RedisResult<()> {
            let order = format!("order-{i:05}");
            let amount = (i % 50 + 1) * 100;
            let _: String = redis::cmd("XADD")
                .arg(stream(&ns, partition_of(&order)))
                .arg("*")
                .arg("order")
                .arg(&order)
                .arg("amount")
                .arg(amount)
                .query(&mut con)?;
            entries += 1;
            unique.insert(order);
            Ok(())
        };
        let mut i = 0u64;
        while !flag.load(Ordering::SeqCst) {
            add(i).map_err(|e| e.to_string())?;
            if i.is_multiple_of(3) && i >= 40 {
                add(i - 40).map_err(|e| e.to_string())?;
            }
            i += 1;
            // A steady stream (~400 entries a second), not a test wait.
            std::thread::sleep(Duration::from_millis(3));
        }
        Ok((unique, entries))
    });
    Ok(Producing { stop, handle })
}

/// The partitions member `a` starts with, and `b`'s.
fn halves() -> (Vec<i32>, Vec<i32>) {
    (0..PARTITIONS).partition(|p| p % 2 == 0)
}

/// Runs one scenario in one mode against the Redis at `url`.
pub(crate) fn scenario(
    exe: &std::path::Path,
    url: &str,
    sc: Scenario,
    mode: Mode,
) -> Result<Report, BoxError> {
    let start = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("dedupkv-redis-group-")
        .tempdir()?;
    let ns = format!("run{}:{}:{}", std::process::id(), mode.name(), sc.name());
    let mut run = Run {
        exe: exe.to_path_buf(),
        url: url.to_string(),
        mode,
        ns: ns.clone(),
        dir: dir.path().to_path_buf(),
        guard: Some(dir),
        members: HashMap::new(),
        lines: Arc::default(),
        con: redis::Client::open(url)?.get_connection()?,
    };
    std::fs::create_dir_all(run.path("bucket"))?;
    let result = steps(&mut run, sc);
    let lines = run.snapshot();
    let dump = |run: &mut Run| {
        // Keep the directory and the lines for a look.
        if let Some(g) = run.guard.take() {
            let kept = g.keep();
            let mut text = String::new();
            for (w, l) in &lines {
                text.push_str(w);
                text.push(' ');
                text.push_str(&l.join(" "));
                text.push('\n');
            }
            let _ = std::fs::write(kept.join("lines.txt"), text);
            eprintln!(
                "redis_streams {} {}: the run's lines are in {}",
                mode.name(),
                sc.name(),
                kept.join("lines.txt").display()
            );
        }
    };
    let (unique, entries, killed, paused) = match result {
        Ok(r) => r,
        Err(e) => {
            dump(&mut run);
            return Err(format!("{} {}: {e}", mode.name(), sc.name()).into());
        }
    };
    let report = check(
        &mut run,
        sc,
        mode,
        &unique,
        entries,
        killed,
        paused.as_deref(),
        start,
    );
    match report {
        Ok(r) if r.check().is_ok() && std::env::var_os("DEDUPKV_REDIS_KEEP").is_none() => {
            // The scenario's keys go with it (the server may be shared).
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{ns}:*"))
                .query(&mut run.con)?;
            if !keys.is_empty() {
                let _: u64 = redis::cmd("DEL").arg(&keys).query(&mut run.con)?;
            }
            Ok(r)
        }
        Ok(r) => {
            dump(&mut run);
            Ok(r)
        }
        Err(e) => {
            dump(&mut run);
            Err(e)
        }
    }
}

/// The scenario's steps: what the members do, up to the drained streams
/// and the members stopped. Answers the unique orders, the entries
/// published, the kill's time and the pause line.
type Steps = (HashSet<String>, u64, Option<u64>, Option<Vec<String>>);

fn steps(run: &mut Run, sc: Scenario) -> Result<Steps, BoxError> {
    let producing = produce(&run.url, &run.ns)?;
    let (evens, odds) = halves();
    run.spawn("a", false)?;
    run.spawn("b", true)?;
    for p in &evens {
        run.assign("a", *p)?;
    }
    for p in &odds {
        run.assign("b", *p)?;
    }
    let t0 = now_us();
    run.wait_runs("a", RUNS_BEFORE, t0)?;
    run.wait_runs("b", RUNS_BEFORE, t0)?;
    let (mut killed, mut paused) = (None, None);
    match sc {
        Scenario::Kill | Scenario::LostDisk => {
            // The kill: after a charge, before its record (kill), or
            // after the record, before the XACK (lost disk).
            let point = if sc == Scenario::Kill {
                "mid"
            } else {
                "complete"
            };
            run.send("a", &format!("arm {point}"))?;
            paused = Some(run.wait_pause("a")?);
            let at = run.kill("a")?;
            killed = Some(at);
            // Its partitions to b at once: the assign fences the dead
            // owner; b reclaims its pending entries.
            run.assign_all("b", &evens)?;
            if sc == Scenario::LostDisk {
                std::fs::remove_dir_all(run.disk("a"))?;
                run.spawn("a", false)?;
                // Half of them back to a, on its empty disk: restored.
                for p in evens.iter().take(2) {
                    run.move_partition(*p, "b", "a")?;
                }
            }
        }
        Scenario::Rolling => {
            // Replace a with c, then b with d, one partition at a time.
            for (new, old, parts) in [("c", "a", &evens), ("d", "b", &odds)] {
                run.spawn(new, false)?;
                for p in parts {
                    run.move_partition(*p, old, new)?;
                }
                run.stop(old)?;
            }
        }
    }
    let t1 = now_us();
    run.wait_for("entries answered after the last move", |ls| {
        ls.iter()
            .filter(|(_, l)| is(l, "run") && at(l) >= t1)
            .count()
            >= RUNS_AFTER
    })?;
    producing.stop.store(true, Ordering::SeqCst);
    let (unique, entries) = producing
        .handle
        .join()
        .map_err(|_| "the producer panicked")??;
    let start = Instant::now();
    while !run.drained()? {
        if start.elapsed() > PATIENCE {
            return Err("timed out waiting for the streams to drain".into());
        }
        // Fail at once if a member died.
        run.wait_for("the members alive", |_| true)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    let live: Vec<String> = run.members.keys().cloned().collect();
    for m in live {
        run.stop(&m)?;
    }
    Ok((unique, entries, killed, paused))
}

/// The order the killed member stopped inside (its pause line `l`), and
/// how its next owner answered it: copies of the order may follow, and
/// the one that took the claim over answers "reconciled", the others
/// replay it.
fn paused_answer(l: &[String], runs: &[&Vec<String>]) -> (String, String) {
    let order = l.get(3).cloned().unwrap_or_default();
    let t = at(l);
    let after: Vec<&&Vec<String>> = runs.iter().filter(|r| r[3] == order && at(r) > t).collect();
    let answer = if after.iter().any(|r| r[5] == "reconciled") {
        "reconciled".to_string()
    } else {
        after
            .first()
            .map_or_else(|| "none".to_string(), |r| r[5].clone())
    };
    (order, answer)
}

/// How many completions a store lacks against the ledger, from a tally
/// line's windows (`store=C/A_ledger=C/A,...`): `None` unless the store
/// is behind in every window that differs (never ahead).
fn tally_gap(windows: &str) -> Option<u64> {
    let mut gap = 0;
    for w in windows.split(',') {
        let (store, ledger) = w.strip_prefix("store=")?.split_once("_ledger=")?;
        let count = |s: &str| s.split_once('/').and_then(|(c, _)| c.parse::<u64>().ok());
        let (ours, theirs) = (count(store)?, count(ledger)?);
        if ours >= theirs {
            return None;
        }
        gap += theirs - ours;
    }
    Some(gap)
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

/// Reads the books and the lines into the scenario's report.
#[allow(clippy::too_many_arguments)] // the scenario's results, each once
fn check(
    run: &mut Run,
    sc: Scenario,
    mode: Mode,
    unique: &HashSet<String>,
    entries: u64,
    killed: Option<u64>,
    paused: Option<&[String]>,
    start: Instant,
) -> Result<Report, BoxError> {
    let books = crate::provider::Books::new(&run.ns);
    let effects: HashMap<String, u64> = redis::cmd("HGETALL")
        .arg(&books.effects)
        .query(&mut run.con)?;
    let ledger: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&books.ledger)
        .query(&mut run.con)?;
    let repeated: Option<u64> = redis::cmd("GET").arg(&books.repeats).query(&mut run.con)?;
    let lines = run.snapshot();
    let runs: Vec<&Vec<String>> = lines
        .iter()
        .filter(|(_, l)| is(l, "run"))
        .map(|(_, l)| l)
        .collect();
    let kind = |k: &str| runs.iter().filter(|l| l[5] == k).count();
    // A replay "across": the charge was made by another process.
    let me_of = |w: &str, t: u64| -> String {
        // The process `w` that was running at `t`: its latest start.
        lines
            .iter()
            .rfind(|(x, l)| x == w && is(l, "start") && field::<u64>(l, 2).unwrap_or(0) <= t)
            .map(|(_, l)| l[1].clone())
            .unwrap_or_default()
    };
    let replayed_across = lines
        .iter()
        .filter(|(w, l)| is(l, "run") && l[5] == "replayed" && l[6] != me_of(w, at(l)))
        .count();
    let dropped: Vec<&str> = lines
        .iter()
        .filter(|(_, l)| is(l, "dropped_ack"))
        .map(|(_, l)| l[3].as_str())
        .collect();
    let redelivered = dropped.iter().all(|id| {
        runs.iter()
            .any(|l| l[4] == *id && l[5] == "replayed" && l[7] == "reclaimed=1")
    }) && !dropped.is_empty();
    // Each stream's store against the ledger: equal, or behind it by the
    // completions its replica lost (acknowledged, not shipped when their
    // member died), or wrong.
    let (mut clean, mut behind, mut dirty) = (0, 0, Vec::new());
    let mut tallied = HashSet::new();
    for (w, l) in &lines {
        if is(l, "tally") {
            let p: i32 = field(l, 1)?;
            tallied.insert(p);
            match l[3].as_str() {
                "clean" => clean += 1,
                "dirty" => match tally_gap(l.get(4).map_or("", String::as_str)) {
                    Some(gap) => behind += gap,
                    None => dirty.push(format!("{w} partition {p}: {}", l[4..].join(" "))),
                },
                _ => dirty.push(format!("{w} partition {p}: {}", l[3..].join(" "))),
            }
        }
    }
    // The killed member's assigns after its return (the lost disk).
    let restored_missing = lines
        .iter()
        .filter(|(w, l)| {
            w == "a"
                && is(l, "assign")
                && killed.is_some_and(|k| at(l) >= k)
                && l.iter().any(|f| f == "restored=Missing")
        })
        .count();
    let paused_answer = paused.map(|l| paused_answer(l, &runs));
    let mut report = Report {
        scenario: sc,
        mode,
        seconds: start.elapsed().as_secs_f64(),
        entries,
        unique: unique.len(),
        double_charges: effects.values().filter(|n| **n > 1).count(),
        repeated_sends: repeated.unwrap_or(0),
        lost: unique.iter().filter(|o| !ledger.contains_key(*o)).count(),
        extra: ledger.keys().filter(|o| !unique.contains(*o)).count(),
        done: kind("done"),
        reconciled: kind("reconciled"),
        replayed: kind("replayed"),
        replayed_across,
        dropped_ack_redelivered: redelivered,
        tallied: tallied.len(),
        tallies_clean: clean,
        completions_lost: behind,
        tallies_dirty: dirty,
        restored_missing,
        lag_at_kill: paused
            .as_ref()
            .map(|l| l.get(4..).map(|f| f.join(" ")).unwrap_or_default())
            .unwrap_or_default(),
        paused: paused_answer,
        handover: String::new(),
        takeover: String::new(),
    };
    handover_times(&lines, killed, &mut report)?;
    Ok(report)
}

/// Each revoke to the next first answer on its partition, each assign's
/// own time, and a kill to each partition's next first answer.
fn handover_times(
    lines: &[Line],
    killed: Option<u64>,
    report: &mut Report,
) -> Result<(), BoxError> {
    let mut firsts: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    for (_, l) in lines {
        if is(l, "first") {
            firsts.entry(field(l, 1)?).or_default().push(at(l));
        }
    }
    let next_first = |p: i32, t: u64| {
        firsts
            .get(&p)
            .and_then(|v| v.iter().filter(|f| **f >= t).min().copied())
    };
    let (mut hand, mut assign, mut take) = (Vec::new(), Vec::new(), Vec::new());
    for (_, l) in lines {
        if is(l, "revoke_start")
            && let Some(f) = next_first(field(l, 1)?, at(l))
        {
            hand.push(f - at(l));
        }
        if let Some(took) = l.iter().find_map(|f| f.strip_prefix("took_us=")) {
            assign.push(took.parse()?);
        }
    }
    if let Some(k) = killed {
        // The dead member's partitions: the first assigns after the kill.
        let mut moved = HashSet::new();
        for (_, l) in lines {
            if is(l, "assign") && at(l) >= k && moved.insert(field::<i32>(l, 1)?) {
                take.extend(next_first(field(l, 1)?, k).map(|f| f - k));
            }
        }
    }
    report.handover = format!(
        "revoke to the next owner's first answer p50 {} / max {} ms ({} moves), assign p50 {} / max {} ms",
        pct(&hand, 50),
        pct(&hand, 100),
        hand.len(),
        pct(&assign, 50),
        pct(&assign, 100),
    );
    if killed.is_some() {
        report.takeover = format!(
            "SIGKILL to the new owner's first answer p50 {} / max {} ms ({} partitions)",
            pct(&take, 50),
            pct(&take, 100),
            take.len()
        );
    }
    Ok(())
}
