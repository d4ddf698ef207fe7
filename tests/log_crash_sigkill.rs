//! Real crashes: a child process streams keys through `begin` + `complete`,
//! printing each acknowledged key; the test SIGKILLs it at random moments,
//! reopens the store between kills, and checks that every acknowledged key
//! replays its outcome and is never `Started` again.
//!
//! Built without the test harness (`tests/child`): this binary is the child
//! when `DEDUPKV_CRASH_PATH` is set, and runs the tests otherwise.

use std::process::{Command, ExitCode};
use std::time::Duration;

use dedupkv::{Begin, Fingerprint, Key, Result, Store};
use dedupkv_testkit::tempdir;

mod child;

const KILLS: usize = 20;
const CHILD_THREADS: usize = 4;
const PATH_ENV: &str = "DEDUPKV_CRASH_PATH";
const RUN_ENV: &str = "DEDUPKV_CRASH_RUN";
/// Set: the child (and the reopen) keeps the store with a journal of
/// this many bytes (small, so kills land in checkpoints and recycling).
const JOURNAL_ENV: &str = "DEDUPKV_CRASH_JOURNAL";

fn main() -> ExitCode {
    child::main(
        PATH_ENV,
        crash_child,
        &[
            (
                "kills_never_lose_an_acknowledged_key",
                kills_never_lose_an_acknowledged_key,
            ),
            (
                "kills_never_lose_an_acknowledged_key_with_the_journal",
                kills_never_lose_an_acknowledged_key_with_the_journal,
            ),
            (
                "a_child_without_its_run_id_fails_loudly",
                a_child_without_its_run_id_fails_loudly,
            ),
            ("nothing_passes_under_ignored", nothing_passes_under_ignored),
        ],
    )
}

fn outcome_of(id: &str) -> Vec<u8> {
    format!("outcome:{id}").into_bytes()
}

/// The child: runs until killed.
fn crash_child() {
    let path = child::env(PATH_ENV);
    let run = child::env(RUN_ENV);
    let journal = std::env::var(JOURNAL_ENV).ok().and_then(|b| b.parse().ok());
    let store = Store::builder().journal(journal).open(&path).expect("open");
    println!("READY");
    std::thread::scope(|s| {
        for t in 0..CHILD_THREADS {
            let (store, run) = (&store, &run);
            s.spawn(move || {
                for i in 0.. {
                    let id = format!("r{run}-t{t}-{i}");
                    let key = Key::new("crash", &id);
                    match store.begin(&key, Fingerprint::of(&id)).expect("begin") {
                        Begin::Started(c) => {
                            store.complete(&c, &outcome_of(&id)).expect("complete");
                            println!("ACK {id}");
                        }
                        other => panic!("fresh key {id} answered {other:?}"),
                    }
                }
            });
        }
    });
}

/// This binary with the crash environment removed (the tests' own run may
/// not carry it, but a developer's shell might).
fn this_binary() -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.env_remove(PATH_ENV)
        .env_remove(RUN_ENV)
        .env_remove(JOURNAL_ENV);
    cmd
}

fn kills_never_lose_an_acknowledged_key() -> Result<()> {
    kills_with(None)
}

fn kills_never_lose_an_acknowledged_key_with_the_journal() -> Result<()> {
    kills_with(Some(64 << 10))
}

/// Kills children streaming into one store (kept with a journal of
/// `journal` bytes, if given) and checks every acknowledged key after each.
fn kills_with(journal: Option<u64>) -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("crash.redb");
    let mut seed = u64::from(std::process::id());
    let mut acked: Vec<String> = Vec::new();
    for run in 0..KILLS {
        let mut cmd = this_binary();
        cmd.env(PATH_ENV, &path).env(RUN_ENV, run.to_string());
        if let Some(bytes) = journal {
            cmd.env(JOURNAL_ENV, bytes.to_string());
        }
        let mut spawned = child::Spawned::start(&mut cmd);
        // Wait until the child has the store open, then kill it after a
        // random delay of 5–150 ms of streaming ...
        spawned.wait_ready(Duration::from_secs(30));
        // ... and has acknowledged a key (on a starved machine its threads
        // may take longer than the delay to start), so every run checks one.
        match spawned.lines.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => acked.extend(l.strip_prefix("ACK ").map(str::to_string)),
            Err(e) => panic!("child {run} acknowledged nothing: {e}"),
        }
        std::thread::sleep(Duration::from_millis(5 + child::next(&mut seed) % 145));
        spawned.child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
        let status = spawned.child.wait().expect("wait");
        assert!(!status.success());
        let before = acked.len();
        acked.extend(
            spawned
                .rest()
                .iter()
                .filter_map(|l| l.strip_prefix("ACK ").map(str::to_string)),
        );
        eprintln!("kill {run}: {} acknowledged this run", acked.len() - before);

        // Reopen: every key ever acknowledged replays its outcome.
        let store = Store::builder().journal(journal).open(&path)?;
        for id in &acked {
            match store.begin(&Key::new("crash", id), Fingerprint::of(id))? {
                Begin::Completed(rec) => {
                    assert_eq!(rec.outcome(), Some(outcome_of(id).as_slice()), "{id}");
                }
                Begin::Started(_) => {
                    panic!("acknowledged key {id} was Started again after kill {run}")
                }
                Begin::InProgress(_) => {
                    panic!("acknowledged key {id} is in progress after kill {run}")
                }
                Begin::DeadLettered(_) => {
                    panic!("acknowledged key {id} is dead-lettered after kill {run}")
                }
            }
        }
    }
    assert!(
        acked.len() >= KILLS,
        "the children acknowledged too little to mean anything"
    );
    eprintln!(
        "{KILLS} kills survived, {} acknowledged keys checked",
        acked.len()
    );
    Ok(())
}

/// A child started with the store's path but no run id stops at once and
/// names the missing variable, rather than streaming under a made-up id.
#[allow(clippy::unnecessary_wraps)] // the signature of a `child::Test`
fn a_child_without_its_run_id_fails_loudly() -> Result<()> {
    let dir = tempdir();
    let out = this_binary()
        .env(PATH_ENV, dir.path().join("crash.redb"))
        .output()
        .expect("run child");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(RUN_ENV), "{err}");
    Ok(())
}

/// The child is not a test entry: run with `--ignored` (no ignored tests
/// here), this binary passes nothing, where an ignored child test used to
/// return early and pass.
#[allow(clippy::unnecessary_wraps)] // the signature of a `child::Test`
fn nothing_passes_under_ignored() -> Result<()> {
    child::nothing_passes_under_ignored(this_binary());
    Ok(())
}
