//! The provider key across a real crash with a lost disk: a child process
//! with an asynchronous replica (segments left alone for an hour) begins
//! orders, takes each one's provider key and "sends" it (prints it), and
//! is killed (`SIGKILL`) at a random moment; another owner then opens the
//! prefix on a new disk. Every key the child sent is the one the new owner
//! derives for that order (completed, or taken over as interrupted):
//! none is a fresh first attempt under a key the provider never saw.
//!
//! Built without the test harness (`tests/child`): this binary is the child
//! when `DEDUPKV_PK_KILL_PATH` is set, and runs the tests otherwise.

use std::collections::HashMap;
use std::process::{Command, ExitCode};
use std::time::Duration;

use dedupkv::replica::Replica;
use dedupkv::{Begin, Fingerprint, Key, Result, Store};

mod child;
mod replica_kit;

const RUNS: usize = 3;
const PATH_ENV: &str = "DEDUPKV_PK_KILL_PATH";
const DIR_ENV: &str = "DEDUPKV_PK_KILL_BUCKET";
const PREFIX_ENV: &str = "DEDUPKV_PK_KILL_PREFIX";
const RUN_ENV: &str = "DEDUPKV_PK_KILL_RUN";

fn main() -> ExitCode {
    child::main(
        PATH_ENV,
        kill_child,
        &[
            (
                "every_key_sent_before_a_sigkill_and_a_lost_disk_is_the_next_owners",
                sent_keys_survive,
            ),
            ("nothing_passes_under_ignored", || {
                child::nothing_passes_under_ignored(this_binary());
                Ok(())
            }),
        ],
    )
}

fn replica_for(dir: Option<&std::path::Path>, prefix: &str) -> Replica {
    Replica::new(replica_kit::objects_at(dir), prefix).segment_interval(Duration::from_secs(3600))
}

fn fp(id: &str) -> Fingerprint {
    Fingerprint::of(format!("charge for {id}"))
}

/// The child: begins orders, sends each one's key, completes every other
/// one, until killed.
fn kill_child() {
    let run = child::env(RUN_ENV);
    let dir = std::env::var(DIR_ENV).ok().map(std::path::PathBuf::from);
    let replica = replica_for(dir.as_deref(), &child::env(PREFIX_ENV));
    let store = Store::builder()
        .replica(replica)
        .open(child::env(PATH_ENV))
        .expect("open");
    println!("READY");
    for i in 0.. {
        let id = format!("r{run}-{i}");
        let Begin::Started(claim) = store
            .begin(&Key::new("orders", &id), fp(&id))
            .expect("begin")
        else {
            panic!("{id} is new")
        };
        let key = claim.provider_key().expect("provider key");
        println!("SENT {id} {key}"); // the provider has it now
        if i % 2 == 0 {
            store.complete(&claim, b"ch").expect("complete");
        } else {
            std::mem::forget(claim); // in flight when the process dies
        }
    }
}

fn this_binary() -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    for v in [PATH_ENV, DIR_ENV, PREFIX_ENV, RUN_ENV] {
        cmd.env_remove(v);
    }
    cmd
}

/// Runs the child on `path` until a SIGKILL at a random moment; returns
/// the keys it sent, by order id.
fn run_child(
    path: &std::path::Path,
    (prefix, dir): (&str, Option<&std::path::Path>),
    run: usize,
    seed: &mut u64,
) -> HashMap<String, String> {
    let mut cmd = this_binary();
    cmd.env(PATH_ENV, path)
        .env(PREFIX_ENV, prefix)
        .env(RUN_ENV, run.to_string());
    if let Some(d) = dir {
        cmd.env(DIR_ENV, d);
    }
    let mut spawned = child::Spawned::start(&mut cmd);
    spawned.wait_ready(Duration::from_secs(60));
    let first = spawned
        .lines
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("child {run} sent nothing: {e}"));
    std::thread::sleep(Duration::from_millis(20 + child::next(seed) % 200));
    spawned.child.kill().expect("SIGKILL");
    assert!(!spawned.child.wait().expect("wait").success());
    let mut sent = HashMap::new();
    for l in std::iter::once(first).chain(spawned.rest()) {
        if let Some((id, key)) = l.strip_prefix("SENT ").and_then(|r| r.split_once(' ')) {
            sent.insert(id.to_string(), key.to_string());
        }
    }
    sent
}

fn sent_keys_survive() -> Result<()> {
    let bucket = replica_kit::Bucket::new();
    let disks = tempfile::tempdir().expect("tempdir");
    let prefix = bucket.at("s");
    let dir = bucket.dir.as_ref().map(|d| d.path().to_path_buf());
    let mut seed = u64::from(std::process::id());
    for run in 0..RUNS {
        let lost = disks.path().join(format!("disk-{run}.redb"));
        let sent = run_child(&lost, (&prefix, dir.as_deref()), run, &mut seed);
        assert!(!sent.is_empty(), "run {run}: the child sent nothing");
        // The disk is gone: the next owner opens the prefix elsewhere.
        let store = Store::builder()
            .replica(replica_for(dir.as_deref(), &prefix))
            .open(disks.path().join(format!("next-{run}.redb")))?;
        for (id, key) in &sent {
            let got = match store.begin(&Key::new("orders", id), fp(id))? {
                Begin::Completed(rec) => rec.provider_key().expect("an operation"),
                Begin::Started(claim) => {
                    assert!(
                        claim.interrupted() && claim.attempt() > 1,
                        "run {run}: {id} was sent under {key} but begins afresh"
                    );
                    let got = claim.provider_key()?;
                    store.complete(&claim, b"ch")?;
                    got
                }
                other => panic!("run {run}: {id}: {other:?}"),
            };
            assert_eq!(&got, key, "run {run}: {id}'s key on the next owner");
        }
    }
    Ok(())
}
