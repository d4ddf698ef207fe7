//! A Redis Streams consumer group on dedupkv's async front and its
//! [`PartitionSet`](dedupkv::partitions::PartitionSet), run end to end
//! with crashes, a rolling deploy and a lost disk, in both replica modes
//! (`examples/redis_streams.rs`; `tests/redis_streams.rs` runs it under
//! `scripts/with-redis.sh`).
//!
//! - **Producer**: publishes orders to [`PARTITIONS`] streams
//!   `NS:orders:<p>` at a steady rate, every third entry a copy of an
//!   order published 40 entries before (a redelivering upstream). An order
//!   goes to stream `fnv1a64(order id) % PARTITIONS`, so every copy of an
//!   order lands in the same stream.
//! - **Members**: processes of the consumer group `payments`, each with a
//!   `PartitionSet`: one store per stream it is assigned, each shipping to
//!   its replica (`NS/orders/<p>`) in a local-filesystem object store the
//!   members share, in [`ReplicaMode::Synchronous`] or
//!   [`ReplicaMode::Asynchronous`]. A member reads its streams with
//!   `XREADGROUP`, runs each order's charge through
//!   [`RetryPolicy::call_async`](dedupkv::RetryPolicy::call_async) (claim and intent in one commit, ask the
//!   provider after an interrupted attempt, the answer recorded, then
//!   complete) and acknowledges with `XACK` only after the store's record.
//!   The module `member` says why that order is safe at each crash point.
//! - **Coordinator**: Redis Streams has no rebalance protocol, so the
//!   parent plays it: it assigns streams to members and moves them
//!   (revoke on the old member, which ships the store's tail, then assign
//!   on the new, which restores it). After a SIGKILL it assigns the dead
//!   member's streams to another member at once: that fences the dead
//!   one, and the new owner takes its pending entries over with
//!   `XAUTOCLAIM`. A member whose store answers `Error::Fenced` stops
//!   working that stream.
//! - **Provider**: a simulated payment provider in Redis that deduplicates
//!   by idempotency key: a repeated key returns the first charge and
//!   charges nothing. The key is the claim's provider key, taken in one
//!   function (`provider::carrier_key`). Its ledger (order → charge) is
//!   the system of record; it counts the charges made per order.
//!
//! Scenarios, each in both replica modes:
//! - `kill`: member `a` is killed (`SIGKILL`) after the provider charged an order
//!   and before the charge was recorded; `b` takes its streams, reclaims
//!   its pending entries and asks the provider about that charge
//!   (`Run::Reconciled`) instead of charging again;
//! - `rolling`: a rolling deploy: `c` replaces `a`, then `d` replaces
//!   `b`, one stream at a time, each old member leaving gracefully;
//! - `lost-disk`: `a` is killed (`SIGKILL`) after a record and before its `XACK`,
//!   `b` takes its streams, `a`'s disk is removed, and `a` comes back on
//!   the empty disk and is given two streams back (restored from the
//!   replica).
//!
//! In each, member `b` drops one `XACK` on purpose: the entry stays
//! pending, is reclaimed with `XAUTOCLAIM` once idle (by `b`, or by the
//! stream's next owner at its assign), and answered from the store
//! (`Run::Replayed`).
//!
//! Checked at the end of each ([`Report::check`]): no order charged twice
//! (double charges), no charge sent twice with one key, every unique order
//! charged (none lost), every entry read and acknowledged, duplicates
//! suppressed (some by another process than the one that charged), the
//! dropped ack redelivered, every stream's store's per-window completion
//! tallies reconciled with the ledger (exactly; after a crash in
//! asynchronous mode a store may be behind it by completions its replica
//! lost, which are counted, never ahead), and per scenario: the killed
//! charge answered by asking the provider (`kill`), a store restored onto
//! the empty disk (`lost-disk`). It prints the hand-over times and the
//! replica's lag at the kill.
//!
//! `DEDUPKV_REDIS_SCENARIOS=kill,rolling` picks scenarios and
//! `DEDUPKV_REDIS_MODES=sync` modes (the example; under `CI=true` every
//! one runs). Each scenario's keys live under a namespace of their own,
//! removed after a scenario that passed; a failed scenario's directory
//! and members' lines (`lines.txt`) are kept and named, and every one's
//! with `DEDUPKV_REDIS_KEEP=1`.

use std::error::Error;
use std::fmt;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::replica::ReplicaMode;
use redis::aio::MultiplexedConnection;

mod coordinator;
mod member;
mod provider;

/// Streams (partitions) of the group.
pub const PARTITIONS: i32 = 6;
const GROUP: &str = "payments";
/// Set in a member process's environment (to its name): run with it, this
/// crate's binaries are a member of the group, not the run.
pub const CHILD_ENV: &str = "DEDUPKV_REDIS_MEMBER";
const URL_ENV: &str = "DEDUPKV_REDIS_URL";
/// The reconciliation window: one day, so a run never straddles two.
const WINDOW: Duration = Duration::from_secs(86_400);

/// A failure of the run, for people.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// The partition of an order: FNV-1a (64-bit) of its id, modulo
/// [`PARTITIONS`].
fn partition_of(order: &str) -> i32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in order.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    i32::try_from(h % u64::from(PARTITIONS.unsigned_abs())).unwrap_or(0)
}

fn stream(ns: &str, p: i32) -> String {
    format!("{ns}:orders:{p}")
}

fn now_ms() -> u64 {
    now_us() / 1000
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A connection whose commands may wait long: the default 500 ms
/// response timeout fails a member whose machine is busy.
async fn connect(url: &str) -> Result<MultiplexedConnection, BoxError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(60)));
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// A replica mode of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Synchronous,
    Asynchronous,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Synchronous => "sync",
            Mode::Asynchronous => "async",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        match s {
            "sync" => Some(Mode::Synchronous),
            "async" => Some(Mode::Asynchronous),
            _ => None,
        }
    }

    fn replica(self) -> ReplicaMode {
        match self {
            Mode::Synchronous => ReplicaMode::Synchronous,
            Mode::Asynchronous => ReplicaMode::Asynchronous,
        }
    }
}

/// A scenario of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Kill,
    Rolling,
    LostDisk,
}

impl Scenario {
    const ALL: [Scenario; 3] = [Scenario::Kill, Scenario::Rolling, Scenario::LostDisk];

    fn name(self) -> &'static str {
        match self {
            Scenario::Kill => "kill",
            Scenario::Rolling => "rolling",
            Scenario::LostDisk => "lost-disk",
        }
    }
}

/// What one scenario in one replica mode found.
#[derive(Debug)]
pub struct Report {
    scenario: Scenario,
    mode: Mode,
    seconds: f64,
    /// Entries published (copies included).
    pub entries: u64,
    /// Unique orders published.
    pub unique: usize,
    /// Orders the provider charged more than once (under different keys).
    pub double_charges: usize,
    /// Sends the provider deduplicated (a charge sent twice with one key:
    /// the store should have asked first).
    pub repeated_sends: u64,
    /// Unique orders never charged.
    pub lost: usize,
    /// Ledger rows for orders never published.
    pub extra: usize,
    /// Charges made (`Run::Done`).
    pub done: usize,
    /// Charges an earlier attempt had made, found by asking the provider
    /// (`Run::Reconciled`).
    pub reconciled: usize,
    /// Duplicates answered from a store's record (`Run::Replayed`).
    pub replayed: usize,
    /// Of those, the ones whose charge another process made.
    pub replayed_across: usize,
    /// The dropped ack's entry was reclaimed and answered from the store.
    pub dropped_ack_redelivered: bool,
    /// Streams whose store's tallies were checked at the end.
    pub tallied: usize,
    /// Of those, the ones that reconciled with the ledger exactly.
    pub tallies_clean: usize,
    /// Completions the stores lack against the ledger: charged and
    /// acknowledged, their records not shipped when their member died (an
    /// asynchronous replica's loss; a copy of the order arriving later is
    /// charged again unless the provider knows its key).
    pub completions_lost: u64,
    /// The ones that did not, and why.
    pub tallies_dirty: Vec<String>,
    /// Assigns that restored a store onto an empty disk.
    pub restored_missing: usize,
    /// The killed member's replica lag when it stopped.
    pub lag_at_kill: String,
    /// The order the killed member stopped inside, and how its next owner
    /// answered it.
    pub paused: Option<(String, String)>,
    /// Hand-over times of the moves.
    pub handover: String,
    /// Take-over times after the kill.
    pub takeover: String,
}

impl Report {
    /// Checks everything the run promises; says what failed.
    ///
    /// # Errors
    /// Each broken promise, joined with `; `.
    ///
    /// # Examples
    /// ```no_run
    /// let exe = std::env::current_exe()?;
    /// for report in dedupkv_redis_streams::run_mode(&exe, "redis://127.0.0.1:6379/", "sync")? {
    ///     report.check()?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    /// ```
    pub fn check(&self) -> Result<(), String> {
        let mut wrong = Vec::new();
        if self.double_charges != 0 {
            wrong.push(format!("{} orders charged twice", self.double_charges));
        }
        if self.repeated_sends != 0 {
            wrong.push(format!(
                "{} charges sent twice with one key",
                self.repeated_sends
            ));
        }
        if self.lost != 0 {
            wrong.push(format!("{} orders never charged", self.lost));
        }
        if self.extra != 0 {
            wrong.push(format!("{} ledger rows for unknown orders", self.extra));
        }
        if self.replayed_across == 0 {
            wrong.push("no duplicate suppressed across a move".into());
        }
        if !self.dropped_ack_redelivered {
            wrong.push("the dropped ack was not redelivered and replayed".into());
        }
        if !self.tallies_dirty.is_empty() {
            wrong.push(format!(
                "stores disagree with the ledger: {}",
                self.tallies_dirty.join(", ")
            ));
        }
        // Only an asynchronous replica may lose acknowledged completions,
        // and only at a crash; a graceful leave ships its tail.
        let may_lose = self.mode == Mode::Asynchronous && self.scenario != Scenario::Rolling;
        if self.completions_lost != 0 && !may_lose {
            wrong.push(format!(
                "{} completions lost from the replica",
                self.completions_lost
            ));
        }
        if self.tallied != PARTITIONS.unsigned_abs() as usize {
            wrong.push(format!(
                "{} of {PARTITIONS} stores' tallies checked",
                self.tallied
            ));
        }
        match (self.scenario, &self.paused) {
            (Scenario::Kill, Some((order, answer))) if answer != "reconciled" => wrong.push(
                format!("the killed charge of {order} was answered {answer}, not reconciled"),
            ),
            (Scenario::LostDisk, _) if self.restored_missing == 0 => {
                wrong.push("no store was restored onto the empty disk".into());
            }
            _ => {}
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} {}: {}",
                self.scenario.name(),
                self.mode.name(),
                wrong.join("; ")
            ))
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "redis_streams {} {}: {} in {:.1} s: {} entries, {} unique orders; double charges {}, \
             charges sent twice {}, lost {}; charged {}, reconciled with the provider {}, \
             duplicates suppressed {} ({} across processes); dropped ack redelivered {}; \
             tallies clean {}/{} (completions the replica lost {}); restored onto an empty \
             disk {}",
            self.scenario.name(),
            self.mode.name(),
            if self.check().is_ok() { "ok" } else { "FAILED" },
            self.seconds,
            self.entries,
            self.unique,
            self.double_charges,
            self.repeated_sends,
            self.lost,
            self.done,
            self.reconciled,
            self.replayed,
            self.replayed_across,
            self.dropped_ack_redelivered,
            self.tallies_clean,
            self.tallied,
            self.completions_lost,
            self.restored_missing,
        )?;
        if let Some((order, answer)) = &self.paused {
            writeln!(
                f,
                "  killed inside {order} ({}), answered by the next owner: {answer}",
                self.lag_at_kill
            )?;
        }
        if !self.takeover.is_empty() {
            writeln!(f, "  {}", self.takeover)?;
        }
        write!(f, "  {}", self.handover)
    }
}

/// The scenarios `DEDUPKV_REDIS_SCENARIOS` picks (all without it, and
/// always all under `CI=true`).
fn scenarios() -> Result<Vec<Scenario>, BoxError> {
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    match std::env::var("DEDUPKV_REDIS_SCENARIOS") {
        Ok(v) if !ci => {
            let picked: Vec<Scenario> = Scenario::ALL
                .into_iter()
                .filter(|s| v.split(',').any(|x| x == s.name()))
                .collect();
            if picked.is_empty() {
                return Err(format!("DEDUPKV_REDIS_SCENARIOS={v:?} names no scenario").into());
            }
            Ok(picked)
        }
        _ => Ok(Scenario::ALL.to_vec()),
    }
}

/// Runs every scenario in replica mode `mode` (`"sync"` or `"async"`)
/// against the Redis at `url`, side by side (each its own namespace,
/// members and directories), with `exe` as the members' binary (run with
/// [`CHILD_ENV`] set, it is a member). Answers each scenario's report;
/// [`Report::check`] says whether it kept the promises.
///
/// # Errors
/// An unknown mode, Redis unreachable, a member that failed, or a
/// condition that did not come within its bound (the failed scenario's
/// lines are kept in a directory the message names).
///
/// # Examples
/// See [`Report::check`].
pub fn run_mode(exe: &std::path::Path, url: &str, mode: &str) -> Result<Vec<Report>, BoxError> {
    let mode = Mode::parse(mode).ok_or_else(|| format!("unknown replica mode {mode:?}"))?;
    let threads: Vec<_> = scenarios()?
        .into_iter()
        .map(|sc| {
            let (exe, url) = (exe.to_path_buf(), url.to_string());
            std::thread::spawn(move || coordinator::scenario(&exe, &url, sc, mode))
        })
        .collect();
    let mut reports = Vec::new();
    let mut failed = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok(r)) => reports.push(r),
            Ok(Err(e)) => failed.push(e.to_string()),
            Err(_) => failed.push("a scenario's thread panicked".into()),
        }
    }
    if failed.is_empty() {
        Ok(reports)
    } else {
        // The scenarios that ran to the end still say what they found.
        let found: Vec<String> = reports.iter().map(ToString::to_string).collect();
        Err(format!("{}\n{}", failed.join("; "), found.join("\n")).into())
    }
}

/// A member process: its settings from the environment.
fn member_main(name: &str) -> Result<(), BoxError> {
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let mode = Mode::parse(&var("DEDUPKV_REDIS_MODE")?).ok_or("DEDUPKV_REDIS_MODE is unknown")?;
    member::run(member::Settings {
        member: name.to_string(),
        mode: mode.replica(),
        ns: var("DEDUPKV_REDIS_NS")?,
        base: var("DEDUPKV_REDIS_BASE")?.into(),
        bucket: var("DEDUPKV_REDIS_BUCKET")?.into(),
        url: var(URL_ENV)?,
        drop_ack: var("DEDUPKV_REDIS_FLAGS")?.contains("drop-ack"),
    })
}

/// The `main` of the example and of the test's member processes: a member
/// when [`CHILD_ENV`] is set; else the whole run in the modes
/// `DEDUPKV_REDIS_MODES` picks (both without it), each report printed and
/// checked.
///
/// # Examples
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     dedupkv_redis_streams::main()
/// }
/// ```
pub fn main() -> ExitCode {
    if let Ok(name) = std::env::var(CHILD_ENV) {
        return match member_main(&name) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("member {name}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let Ok(url) = std::env::var(URL_ENV) else {
        eprintln!("set {URL_ENV} (scripts/with-redis.sh does), e.g. redis://127.0.0.1:6379/");
        return ExitCode::FAILURE;
    };
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("the run cannot find its own binary");
        return ExitCode::FAILURE;
    };
    let modes = std::env::var("DEDUPKV_REDIS_MODES").unwrap_or_else(|_| "sync,async".into());
    let mut ok = true;
    for mode in modes.split(',') {
        match run_mode(&exe, &url, mode) {
            Ok(reports) => {
                for r in reports {
                    println!("{r}");
                    if let Err(e) = r.check() {
                        eprintln!("the run is wrong: {e}");
                        ok = false;
                    }
                }
            }
            Err(e) => {
                eprintln!("the run failed: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
