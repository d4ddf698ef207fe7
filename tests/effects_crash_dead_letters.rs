//! Real crashes of the dead-letter area: a child process dead-letters one
//! key after another (`Failure::Exhausted`), and every seventh key
//! requeues an earlier dead letter, printing each call after it returns.
//! The test SIGKILLs it at random moments and reopens the store between
//! kills (the last time with a clock a month ahead, so every table has
//! expired at open and the dead letters are carried out of them): every
//! acknowledged dead letter is listed with its reason, and no acknowledged
//! requeue is dead-lettered again.
//!
//! Built without the test harness (`tests/child`): this binary is the child
//! when `DEDUPKV_DLQ_CRASH_PATH` is set, and runs the tests otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, ExitCode};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::{Failure, Fingerprint, Key, Listing, ManualClock, Result, State, Store};
use dedupkv_testkit::{started, tempdir};

mod child;

const KILLS: usize = 8;
const PATH_ENV: &str = "DEDUPKV_DLQ_CRASH_PATH";
const RUN_ENV: &str = "DEDUPKV_DLQ_CRASH_RUN";
/// How far ahead of the system clock the last reopen's clock is.
const MONTH: Duration = Duration::from_secs(30 * 86_400);

fn main() -> ExitCode {
    child::main(
        PATH_ENV,
        crash_child,
        &[
            (
                "kills_keep_every_acknowledged_dead_letter_and_requeue",
                kills_keep_every_acknowledged_dead_letter_and_requeue,
            ),
            ("nothing_passes_under_ignored", nothing_passes_under_ignored),
        ],
    )
}

fn key_of(run: &str, i: u64) -> Key<'static> {
    Key::owned(b"dlq".to_vec(), format!("r{run}-{i}").into_bytes())
}

fn reason_of(i: u64) -> String {
    format!("r{i}")
}

/// The child: dead-letters key after key until killed; every seventh key
/// it requeues the dead letter three keys back.
fn crash_child() {
    let path = child::env(PATH_ENV);
    let run = child::env(RUN_ENV);
    let store = Store::open(&path).expect("open");
    println!("READY");
    for i in 0.. {
        let claim = started(
            store
                .begin(&key_of(&run, i), Fingerprint::NONE)
                .expect("begin"),
        );
        let reason = reason_of(i);
        store
            .fail(
                &claim,
                Failure::Exhausted {
                    reason: &reason,
                    payload: None,
                },
            )
            .expect("fail");
        println!("DL {i}");
        if i % 7 == 6 {
            let j = i - 3;
            // Not an acknowledgement: a kill from here on may or may not
            // have requeued it.
            println!("TRY {j}");
            assert!(store.requeue(&key_of(&run, j)).expect("requeue"), "{j}");
            println!("RQ {j}");
        }
    }
}

/// This binary with the crash environment removed.
fn this_binary() -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.env_remove(PATH_ENV).env_remove(RUN_ENV);
    cmd
}

/// What one child printed: dead letters, requeues tried and acknowledged.
#[derive(Default)]
struct Printed {
    dead: BTreeSet<u64>,
    tried: BTreeSet<u64>,
    requeued: BTreeSet<u64>,
}

impl Printed {
    fn read(&mut self, line: &str) {
        let Some((what, n)) = line.split_once(' ') else {
            return;
        };
        let Ok(n) = n.parse() else { return };
        match what {
            "DL" => self.dead.insert(n),
            "TRY" => self.tried.insert(n),
            "RQ" => self.requeued.insert(n),
            _ => false,
        };
    }
}

/// Every printed dead letter not (possibly) requeued is listed with its
/// reason and answers `get` as dead-lettered; every printed requeue is
/// neither listed nor dead-lettered.
fn check(store: &Store, runs: &[(String, Printed)], what: &str) -> Result<()> {
    // By id: every key is in the one scope.
    let listed: BTreeMap<Vec<u8>, String> = store
        .dead_letters(&Listing::new().limit(1_000_000))?
        .items
        .into_iter()
        .map(|dl| {
            assert_eq!(dl.key().scope(), b"dlq", "{what}");
            (dl.key().id().to_vec(), dl.reason().to_string())
        })
        .collect();
    let mut checked = 0;
    for (run, p) in runs {
        for &i in p.dead.difference(&p.tried) {
            let key = key_of(run, i);
            assert_eq!(
                listed.get(key.id()).map(String::as_str),
                Some(reason_of(i).as_str()),
                "{what}: acknowledged dead letter {key} is not listed"
            );
            let state = store.get(&key)?.map(|r| r.state());
            assert_eq!(state, Some(State::DeadLettered), "{what}: {key}");
            checked += 1;
        }
        for &j in &p.requeued {
            let key = key_of(run, j);
            assert!(
                !listed.contains_key(key.id()),
                "{what}: requeued {key} is listed"
            );
            let state = store.get(&key)?.map(|r| r.state());
            assert_ne!(state, Some(State::DeadLettered), "{what}: requeued {key}");
        }
    }
    assert_eq!(
        store.stats().dead_letters_now,
        listed.len() as u64,
        "{what}"
    );
    eprintln!("{what}: {checked} dead letters, {} listed", listed.len());
    Ok(())
}

fn kills_keep_every_acknowledged_dead_letter_and_requeue() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("dlq.redb");
    let mut seed = u64::from(std::process::id());
    let mut runs: Vec<(String, Printed)> = Vec::new();
    for round in 0..KILLS {
        let run = round.to_string();
        let mut spawned =
            child::Spawned::start(this_binary().env(PATH_ENV, &path).env(RUN_ENV, &run));
        let mut printed = Printed::default();
        spawned.wait_ready(Duration::from_secs(30));
        // Each run acknowledges a dead letter before the kill, and lives
        // 5–150 ms more (long enough, often, for a requeue).
        match spawned.lines.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => printed.read(&l),
            Err(e) => panic!("child {run} dead-lettered nothing: {e}"),
        }
        std::thread::sleep(Duration::from_millis(5 + child::next(&mut seed) % 145));
        spawned.child.kill().expect("SIGKILL");
        assert!(!spawned.child.wait().expect("wait").success());
        for l in spawned.rest() {
            printed.read(&l);
        }
        eprintln!(
            "kill {round}: {} dead-lettered, {} requeued",
            printed.dead.len(),
            printed.requeued.len()
        );
        runs.push((run, printed));
        check(&Store::open(&path)?, &runs, &format!("after kill {round}"))?;
    }
    // A month later every table has expired: the dead letters are carried
    // out of them at open, and a second open finds the carried records.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    let later = u64::try_from((now + MONTH).as_millis()).expect("ms fit");
    for pass in ["a month later", "a month later, reopened"] {
        let store = Store::builder()
            .clock(ManualClock::new(later))
            .open(&path)?;
        check(&store, &runs, pass)?;
    }
    let acked: usize = runs.iter().map(|(_, p)| p.dead.len()).sum();
    let requeued: usize = runs.iter().map(|(_, p)| p.requeued.len()).sum();
    assert!(acked >= KILLS, "too few dead letters to mean anything");
    eprintln!("{KILLS} kills: {acked} dead letters, {requeued} requeues checked");
    Ok(())
}

/// The child is not a test entry: run with `--ignored`, this binary passes
/// nothing.
#[allow(clippy::unnecessary_wraps)] // the signature of a `child::Test`
fn nothing_passes_under_ignored() -> Result<()> {
    child::nothing_passes_under_ignored(this_binary());
    Ok(())
}
