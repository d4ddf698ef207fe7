//! `get` and `stats` against a store that another process holds open for
//! writing and keeps writing to: they answer (from a snapshot as of the
//! open), and the writer goes on. This binary is also that writer: run
//! with `DEDUPKV_CLI_WRITER=PATH`, it is the child and nothing else.

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use dedupkv::{Key, Store};

const WRITER: &str = "DEDUPKV_CLI_WRITER";

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    if let Some(path) = std::env::var_os(WRITER) {
        return match writer(Path::new(&path)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("writer: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match get_and_stats_beside_a_live_writer() {
        Ok(()) => {
            println!("test get_and_stats_beside_a_live_writer ... ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("test get_and_stats_beside_a_live_writer ... FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Holds the store and writes until killed; `PATH.ready` says it started.
fn writer(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let store = Store::open(path)?;
    store.insert_if_absent(&Key::new("orders", "4711"))?;
    std::fs::write(path.with_extension("ready"), b"")?;
    for i in 0u64.. {
        store.insert_if_absent(&Key::new("load", &i.to_string()))?;
    }
    Ok(())
}

/// Runs `args`, retrying the open that raced a commit (documented: the
/// read-only open may then report the file changed under it).
fn run(args: &[&str]) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let mut last = String::new();
    for _ in 0..20 {
        let out = Command::new(env!("CARGO_BIN_EXE_dedupkv"))
            .args(args)
            .output()?;
        if out.status.success() {
            return Ok(serde_json::from_slice(&out.stdout)?);
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            last.contains("corrupt") || last.contains("changed"),
            "{last}"
        );
    }
    Err(format!("{args:?} never answered: {last}").into())
}

fn get_and_stats_beside_a_live_writer() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("live.redb");
    let mut child = Command::new(std::env::current_exe()?)
        .env(WRITER, &path)
        .stdout(Stdio::null())
        .spawn()?;
    let ready = path.with_extension("ready");
    let start = Instant::now();
    while !ready.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the writer never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let p = path.to_str().ok_or("path")?;
    let result = (|| -> TestResult {
        for _ in 0..5 {
            let v = run(&["get", "-s", p, "--scope", "orders", "4711", "--json"])?;
            assert_eq!(v["state"], "Inserted");
            let s = run(&["stats", "-s", p, "--json"])?;
            assert!(s["keys"].as_u64().is_some_and(|k| k >= 1), "{s}");
        }
        Ok(())
    })();
    // The writer is still there, writing: nothing we did stopped it.
    let alive = child.try_wait()?.is_none();
    child.kill()?;
    child.wait()?;
    result?;
    assert!(alive, "the writer died while the CLI read its store");
    Ok(())
}
