//! Real crashes with a replica: a child process streams keys, printing
//! each acknowledged one; the test SIGKILLs it, then opens the store
//! either on the same disk or on a new one (a lost disk, restored from
//! the replica), and checks what came back. Synchronous: every
//! acknowledged key, on either. Asynchronous: every key on the same disk;
//! on a new one, every key acknowledged before the child's last
//! `sync_replica`, and what is lost is only a tail after it.
//!
//! Built without the test harness (`tests/child`): this binary is the child
//! when `DEDUPKV_REPLICA_CRASH_PATH` is set, and runs the tests otherwise.

use std::process::{Command, ExitCode};
use std::time::Duration;

use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{Key, Result, Store};

mod child;
mod replica_kit;

const RUNS: usize = 6;
const PATH_ENV: &str = "DEDUPKV_REPLICA_CRASH_PATH";
const DIR_ENV: &str = "DEDUPKV_REPLICA_CRASH_BUCKET";
const PREFIX_ENV: &str = "DEDUPKV_REPLICA_CRASH_PREFIX";
const MODE_ENV: &str = "DEDUPKV_REPLICA_CRASH_MODE";
const RUN_ENV: &str = "DEDUPKV_REPLICA_CRASH_RUN";

fn main() -> ExitCode {
    child::main(
        PATH_ENV,
        crash_child,
        &[
            (
                "a_synchronous_replica_loses_nothing_acknowledged_to_sigkill_or_a_lost_disk",
                || kills(ReplicaMode::Synchronous),
            ),
            (
                "an_asynchronous_replica_loses_only_the_unsynced_tail_of_a_lost_disk",
                || kills(ReplicaMode::Asynchronous),
            ),
            ("nothing_passes_under_ignored", || {
                child::nothing_passes_under_ignored(this_binary());
                Ok(())
            }),
        ],
    )
}

fn replica_for(dir: Option<&std::path::Path>, prefix: &str, mode: ReplicaMode) -> Replica {
    Replica::new(replica_kit::objects_at(dir), prefix)
        .mode(mode)
        .segment_interval(Duration::from_millis(20))
}

fn mode_of(s: &str) -> ReplicaMode {
    if s == "sync" {
        ReplicaMode::Synchronous
    } else {
        ReplicaMode::Asynchronous
    }
}

/// The child: runs until killed.
fn crash_child() {
    let path = child::env(PATH_ENV);
    let run = child::env(RUN_ENV);
    let mode = mode_of(&child::env(MODE_ENV));
    let dir = std::env::var(DIR_ENV).ok().map(std::path::PathBuf::from);
    let replica = replica_for(dir.as_deref(), &child::env(PREFIX_ENV), mode);
    let store = Store::builder().replica(replica).open(&path).expect("open");
    println!("READY");
    if mode == ReplicaMode::Synchronous {
        std::thread::scope(|s| {
            for t in 0..4 {
                let (store, run) = (&store, &run);
                s.spawn(move || {
                    for i in 0.. {
                        let id = format!("r{run}-t{t}-{i}");
                        assert!(
                            store
                                .insert_if_absent(&Key::new("crash", &id))
                                .expect("insert")
                        );
                        println!("ACK {id}");
                    }
                });
            }
        });
    }
    for i in 0.. {
        let id = format!("r{run}-{i}");
        assert!(
            store
                .insert_if_absent(&Key::new("crash", &id))
                .expect("insert")
        );
        println!("ACK {id}");
        if i % 25 == 24 {
            store.sync_replica().expect("sync");
            println!("SYNCED");
        }
    }
}

fn this_binary() -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    for v in [PATH_ENV, DIR_ENV, PREFIX_ENV, MODE_ENV, RUN_ENV] {
        cmd.env_remove(v);
    }
    cmd
}

/// Runs the child on `path` until a SIGKILL at a random moment; returns the
/// keys it acknowledged, in order, and how many of them came before its
/// last `sync_replica`.
fn run_child(
    mode: ReplicaMode,
    path: &std::path::Path,
    prefix: &str,
    dir: Option<&std::path::Path>,
    run: usize,
    seed: &mut u64,
) -> (Vec<String>, usize) {
    let mut cmd = this_binary();
    cmd.env(PATH_ENV, path)
        .env(PREFIX_ENV, prefix)
        .env(RUN_ENV, run.to_string())
        .env(
            MODE_ENV,
            if mode == ReplicaMode::Synchronous {
                "sync"
            } else {
                "async"
            },
        );
    if let Some(d) = dir {
        cmd.env(DIR_ENV, d);
    }
    let mut spawned = child::Spawned::start(&mut cmd);
    spawned.wait_ready(Duration::from_secs(60));
    let first = match spawned.lines.recv_timeout(Duration::from_secs(60)) {
        Ok(l) => l
            .strip_prefix("ACK ")
            .map(str::to_string)
            .expect("an ACK line"),
        Err(e) => panic!("child {run} acknowledged nothing: {e}"),
    };
    std::thread::sleep(Duration::from_millis(20 + child::next(seed) % 200));
    spawned.child.kill().expect("SIGKILL");
    assert!(!spawned.child.wait().expect("wait").success());
    let mut acked = vec![first];
    let mut synced = 0;
    for l in &spawned.rest() {
        if let Some(id) = l.strip_prefix("ACK ") {
            acked.push(id.to_string());
        } else if l == "SYNCED" {
            synced = acked.len();
        }
    }
    (acked, synced)
}

fn kills(mode: ReplicaMode) -> Result<()> {
    let bucket = replica_kit::Bucket::new();
    let disks = tempfile::tempdir().expect("tempdir");
    let prefix = bucket.at("s");
    let dir = bucket.dir.as_ref().map(|d| d.path().to_path_buf());
    let mut seed = u64::from(std::process::id());
    let mut expected: Vec<String> = Vec::new();
    let mut path = disks.path().join("disk-0.redb");
    let mut lost_total = 0;
    for run in 0..RUNS {
        let (acked, synced) = run_child(mode, &path, &prefix, dir.as_deref(), run, &mut seed);
        let lost_disk = run % 2 == 0;
        let open_at = if lost_disk {
            disks.path().join(format!("disk-{}.redb", run + 1))
        } else {
            path.clone()
        };
        let store = Store::builder()
            .replica(replica_for(dir.as_deref(), &prefix, mode))
            .open(&open_at)?;
        for id in &expected {
            assert!(
                !store.insert_if_absent(&Key::new("crash", id))?,
                "{mode:?} run {run}: earlier {id} lost"
            );
        }
        let mut lost = Vec::new();
        for (i, id) in acked.iter().enumerate() {
            if store.insert_if_absent(&Key::new("crash", id))? {
                lost.push(i);
            }
        }
        match (mode, lost_disk) {
            (ReplicaMode::Synchronous, _) | (_, false) => {
                assert!(
                    lost.is_empty(),
                    "{mode:?} run {run} (lost disk: {lost_disk}): lost {lost:?}"
                );
            }
            _ => {
                assert!(
                    lost.iter().all(|i| *i >= synced),
                    "run {run}: a synced key was lost"
                );
                let tail = acked.len() - lost.len();
                assert!(
                    lost.iter().all(|i| *i >= tail),
                    "run {run}: lost keys are not a tail"
                );
            }
        }
        lost_total += lost.len();
        eprintln!(
            "{mode:?} run {run}: {} acknowledged, {} lost ({})",
            acked.len(),
            lost.len(),
            if lost_disk { "lost disk" } else { "same disk" }
        );
        expected.extend(acked);
        drop(store);
        path = open_at;
    }
    assert!(
        expected.len() >= RUNS,
        "the children acknowledged too little"
    );
    eprintln!(
        "{mode:?}: {} keys checked, {lost_total} lost in all",
        expected.len()
    );
    Ok(())
}
