//! The `main` of a `harness = false` test binary that is also the child
//! process its test kills. The test re-runs this binary with the child's
//! environment set; with it, the binary is the child and nothing else;
//! without it, the binary runs its tests, taking libtest's arguments
//! (filters, `--exact`, `--skip`, `--ignored`, `--include-ignored`,
//! `--list`). The child is no test entry, so no `--ignored` run can make
//! it pass vacuously.

use std::io::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::time::Instant;

/// A named test.
pub type Test = (&'static str, fn() -> dedupkv::Result<()>);

/// Runs `child` if the environment variable `child_env` is set, else the
/// `tests` that the arguments select.
pub fn main(child_env: &str, child: fn(), tests: &[Test]) -> ExitCode {
    if std::env::var_os(child_env).is_some() {
        child();
        return ExitCode::SUCCESS;
    }
    let mut filters = Vec::new();
    let mut skips = Vec::new();
    let (mut exact, mut only_ignored, mut list) = (false, false, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--exact" => exact = true,
            "--ignored" => only_ignored = true,
            "--list" => list = true,
            "--skip" => skips.extend(args.next()),
            // Options with a separate value: skip the value too.
            "--test-threads" | "--color" | "--format" | "--logfile" | "-Z" => {
                args.next();
            }
            s if s.starts_with('-') => {} // --nocapture, --test-threads=N, -q, ...
            _ => filters.push(a),
        }
    }
    let matches = |name: &str, pat: &str| {
        if exact {
            name == pat
        } else {
            name.contains(pat)
        }
    };
    // None of these tests is ignored: `--ignored` selects nothing.
    let chosen: Vec<&Test> = tests
        .iter()
        .filter(|_| !only_ignored)
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| matches(name, f)))
        .filter(|(name, _)| !skips.iter().any(|s| matches(name, s)))
        .collect();
    if list {
        for (name, _) in &chosen {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let start = Instant::now();
    println!(
        "\nrunning {} test{}",
        chosen.len(),
        if chosen.len() == 1 { "" } else { "s" }
    );
    let mut failed = Vec::new();
    for (name, test) in &chosen {
        print!("test {name} ... ");
        let _ = std::io::stdout().flush();
        match catch_unwind(AssertUnwindSafe(test)) {
            Ok(Ok(())) => println!("ok"),
            Ok(Err(e)) => {
                println!("FAILED");
                eprintln!("{name}: Error: {e}");
                failed.push(*name);
            }
            Err(_) => {
                println!("FAILED");
                failed.push(*name);
            }
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed; 0 ignored; 0 measured; {} filtered out; \
         finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        chosen.len() - failed.len(),
        failed.len(),
        tests.len() - chosen.len(),
        start.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The value of an environment variable the child needs; panics, naming
/// it, if it is missing, so a half-set environment fails loudly.
#[allow(dead_code)] // not every child reads its environment through it
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: this child process is started by its test, which sets it")
    })
}

/// A child process started by its test, with its stdout read line by line
/// on a thread of its own (so the test can wait for a line with a timeout).
#[allow(dead_code)] // only the SIGKILL tests start children this way
pub struct Spawned {
    pub child: std::process::Child,
    pub lines: std::sync::mpsc::Receiver<String>,
    reader: std::thread::JoinHandle<()>,
}

#[allow(dead_code)]
impl Spawned {
    /// Starts `cmd` with stdout piped and stderr discarded.
    pub fn start(cmd: &mut std::process::Command) -> Spawned {
        use std::io::BufRead as _;
        use std::process::Stdio;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Spawned {
            child,
            lines,
            reader,
        }
    }

    /// Waits (at most `limit`) for a line ending in `READY`, returning the
    /// lines read up to it (libtest may print in front of it).
    pub fn wait_ready(&self, limit: std::time::Duration) -> Vec<String> {
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            let left = limit.saturating_sub(start.elapsed());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("the child never became ready: {e}"));
            let ready = line.ends_with("READY");
            seen.push(line);
            if ready {
                return seen;
            }
        }
    }

    /// After the child exited: joins the reader and returns what was left.
    pub fn rest(self) -> Vec<String> {
        self.reader.join().expect("reader");
        self.lines.try_iter().collect()
    }
}

/// A small deterministic PRNG (splitmix64) for kill timing.
#[allow(dead_code)]
pub fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Asserts that `this` (the test binary, child environment removed) run
/// with `--ignored` passes nothing: a child is never a test entry that
/// could pass without its parent.
#[allow(dead_code)] // only the SIGKILL tests check this
pub fn nothing_passes_under_ignored(mut this: std::process::Command) {
    let out = this.arg("--ignored").output().expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(" 0 passed;"), "{text}");
}
