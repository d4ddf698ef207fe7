//! Real crashes of a store that counts completions and keeps their keys:
//! a child ships orders on four threads (`begin` + `complete_with_amount`)
//! with operations kept for a second, so its evictor writes the windows'
//! counts and keys out of the buckets while the threads complete; the
//! test SIGKILLs it at random moments, reopens the store, and checks that
//! the counts and the kept keys equal exactly the completed operations:
//! every acknowledged one, and at most the one per thread that completed
//! before its acknowledgement was printed.
//!
//! Built without the test harness (`tests/child`): this binary is the child
//! when `DEDUPKV_RECON_PATH` is set, and runs the tests otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, ExitCode};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::{
    Begin, Clock, Fingerprint, Key, Result, Store, StoreBuilder, SystemClock, WindowKeys,
};
use dedupkv_testkit::tempdir;

mod child;

const KILLS: usize = 6;
const CHILD_THREADS: usize = 4;
const PATH_ENV: &str = "DEDUPKV_RECON_PATH";
const RUN_ENV: &str = "DEDUPKV_RECON_RUN";
const START_ENV: &str = "DEDUPKV_RECON_START";
/// The store's time at the test's start: an hour boundary, so the whole
/// test falls in one reconciliation window.
const BASE: u64 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000;

fn main() -> ExitCode {
    child::main(
        PATH_ENV,
        crash_child,
        &[
            (
                "kills_keep_counts_and_keys_exact",
                kills_keep_counts_and_keys_exact,
            ),
            ("nothing_passes_under_ignored", nothing_passes_under_ignored),
        ],
    )
}

/// Real time, shifted so the test starts at [`BASE`].
#[derive(Debug)]
struct Shifted {
    real_start: u64,
}

impl Clock for Shifted {
    fn now_millis(&self) -> u64 {
        BASE + SystemClock.now_millis().saturating_sub(self.real_start)
    }
}

fn builder(real_start: u64) -> StoreBuilder {
    Store::builder()
        .clock(Shifted { real_start })
        .retention(Duration::from_secs(1))
        .lease(Duration::from_secs(1))
        .bucket_granularity(Duration::from_secs(1))
        .reconcile_keys_of("ship")
}

/// What order `id` is worth.
fn amount_of(id: &str) -> i64 {
    id.bytes().map(i64::from).sum::<i64>() % 97 - 40
}

fn crash_child() {
    let path = child::env(PATH_ENV);
    let run = child::env(RUN_ENV);
    let start: u64 = child::env(START_ENV).parse().expect("start");
    let store = builder(start).open(&path).expect("open");
    println!("READY");
    std::thread::scope(|s| {
        for t in 0..CHILD_THREADS {
            let (store, run) = (&store, &run);
            s.spawn(move || {
                for i in 0.. {
                    let id = format!("r{run}-t{t}-{i}");
                    match store
                        .begin(&Key::new("ship", &id), Fingerprint::NONE)
                        .expect("begin")
                    {
                        Begin::Started(c) => {
                            store
                                .complete_with_amount(&c, b"label", amount_of(&id))
                                .expect("complete");
                            println!("ACK {id}");
                        }
                        other => panic!("fresh key {id} answered {other:?}"),
                    }
                }
            });
        }
    });
}

/// The first few of `keys`, readable.
fn shown(keys: &[Vec<u8>]) -> Vec<String> {
    keys.iter()
        .take(5)
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect()
}

fn this_binary() -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.env_remove(PATH_ENV)
        .env_remove(RUN_ENV)
        .env_remove(START_ENV);
    cmd
}

fn kills_keep_counts_and_keys_exact() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("recon.redb");
    let real_start = u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis(),
    )
    .expect("ms");
    let mut seed = u64::from(std::process::id());
    let mut acked: BTreeSet<String> = BTreeSet::new();
    // Per (run, thread) the highest index acknowledged: the next one may
    // have completed unacknowledged.
    let mut last: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    let window = UNIX_EPOCH + Duration::from_millis(BASE);
    for run in 0..KILLS {
        let mut spawned = child::Spawned::start(
            this_binary()
                .env(PATH_ENV, &path)
                .env(RUN_ENV, run.to_string())
                .env(START_ENV, real_start.to_string()),
        );
        spawned.wait_ready(Duration::from_secs(30));
        let mut lines = match spawned.lines.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => vec![l],
            Err(e) => panic!("child {run} acknowledged nothing: {e}"),
        };
        // Long enough, some runs, for the child's evictor to take buckets
        // out from under the threads.
        std::thread::sleep(Duration::from_millis(100 + child::next(&mut seed) % 2900));
        spawned.child.kill().expect("SIGKILL");
        assert!(!spawned.child.wait().expect("wait").success());
        lines.extend(spawned.rest());
        for id in lines.iter().filter_map(|l| l.strip_prefix("ACK ")) {
            let parts: Vec<&str> = id.split('-').collect();
            let num = |p: &str| -> u64 { p.trim_start_matches(['r', 't']).parse().expect("an id") };
            let (r, t, i) = (num(parts[0]), num(parts[1]), num(parts[2]));
            let e = last.entry((r as usize, t as usize)).or_insert(0);
            *e = (*e).max(i);
            acked.insert(id.to_string());
        }
        let store = builder(real_start).open(&path)?;
        let theirs = WindowKeys::ids(window, &acked);
        let report = store.reconcile_keys("ship", &[theirs], Duration::ZERO)?;
        assert_eq!(report.windows.len(), 1, "{report:?}");
        let w = &report.windows[0];
        assert!(
            w.extra.is_empty(),
            "acknowledged but not kept after kill {run}: {:?}",
            w.extra
        );
        assert_eq!(w.matched, acked.len() as u64);
        // Completed unacknowledged: at most the next one of a thread.
        let candidates: BTreeSet<Vec<u8>> = last
            .iter()
            .map(|((r, t), i)| format!("r{r}-t{t}-{}", i + 1).into_bytes())
            .chain((0..CHILD_THREADS).map(|t| format!("r{run}-t{t}-0").into_bytes()))
            .collect();
        assert!(
            w.missing.iter().all(|k| candidates.contains(k)),
            "kept but never acknowledged after kill {run}: {:?}",
            shown(&w.missing)
        );
        let done: Vec<String> = acked
            .iter()
            .cloned()
            .chain(
                w.missing
                    .iter()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
            )
            .collect();
        let t = store.tallies("ship")?;
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!(
            t[0].count,
            done.len() as u64,
            "counted once each, after kill {run}"
        );
        assert_eq!(
            t[0].amount,
            done.iter()
                .map(|id| i128::from(amount_of(id)))
                .sum::<i128>(),
            "summed once each, after kill {run}"
        );
        for id in w
            .missing
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
        {
            acked.insert(id);
        }
        eprintln!("kill {run}: {} completed so far", acked.len());
    }
    assert!(
        acked.len() >= 4 * KILLS,
        "too little acknowledged to mean anything"
    );
    Ok(())
}

#[allow(clippy::unnecessary_wraps)] // the signature of a `child::Test`
fn nothing_passes_under_ignored() -> Result<()> {
    child::nothing_passes_under_ignored(this_binary());
    Ok(())
}
