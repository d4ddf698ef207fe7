//! Real crashes: a child process streams keys through `begin` + `complete`,
//! printing each acknowledged key; the test SIGKILLs it at random moments,
//! reopens the store between kills, and checks that every acknowledged key
//! replays its outcome and is never `Started` again.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dedupkv::{Begin, Fingerprint, Key, Result, Store};

const KILLS: usize = 20;
const CHILD_THREADS: usize = 4;

fn outcome_of(id: &str) -> Vec<u8> {
    format!("outcome:{id}").into_bytes()
}

/// The child: runs until killed. Not a test on its own.
#[test]
#[ignore = "child process of kills_never_lose_an_acknowledged_key"]
fn crash_child() {
    let Ok(path) = std::env::var("DEDUPKV_CRASH_PATH") else {
        return;
    };
    let run = std::env::var("DEDUPKV_CRASH_RUN").expect("run id");
    let store = Store::open(&path).expect("open");
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

/// A small deterministic PRNG for kill timing (no dependency needed).
fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn kills_never_lose_an_acknowledged_key() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("crash.redb");
    let exe = std::env::current_exe().expect("test binary");
    let mut seed = u64::from(std::process::id());
    let mut acked: Vec<String> = Vec::new();
    for run in 0..KILLS {
        let mut child = Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                "crash_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DEDUPKV_CRASH_PATH", &path)
            .env("DEDUPKV_CRASH_RUN", run.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait until the child has the store open, then kill it after a
        // random delay of 5–150 ms of streaming.
        let start = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                // libtest may print "test crash_child ... " in front of it.
                Ok(l) if l.ends_with("READY") => break,
                Ok(_) => {}
                Err(e) => panic!("child {run} never became ready: {e}"),
            }
            assert!(start.elapsed() < Duration::from_secs(30));
        }
        std::thread::sleep(Duration::from_millis(5 + next(&mut seed) % 145));
        child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
        let status = child.wait().expect("wait");
        assert!(!status.success());
        reader.join().expect("reader");
        let before = acked.len();
        acked.extend(
            rx.try_iter()
                .filter_map(|l| l.strip_prefix("ACK ").map(str::to_string)),
        );
        eprintln!("kill {run}: {} acknowledged this run", acked.len() - before);

        // Reopen: every key ever acknowledged replays its outcome.
        let store = Store::open(&path)?;
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
            }
        }
    }
    assert!(
        acked.len() > KILLS,
        "the children acknowledged too little to mean anything"
    );
    eprintln!(
        "{KILLS} kills survived, {} acknowledged keys checked",
        acked.len()
    );
    Ok(())
}
