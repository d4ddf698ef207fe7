//! Progress on stderr: the long commands (`filter`, `export`, `import`,
//! `verify`, `compact`) draw it when stderr is a terminal (a pseudo
//! terminal from util-linux's `script`), and write not a byte of it
//! otherwise: stderr holds their summary line alone.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use dedupkv::{Key, Store};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const BIN: &str = env!("CARGO_BIN_EXE_dedupkv");

/// A store of 300 inserted keys.
fn store(path: &Path) -> dedupkv::Result<()> {
    let store = Store::open(path)?;
    let ids: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    let keys: Vec<Key<'_>> = ids.iter().map(|id| Key::new("t", id)).collect();
    store.insert_batch(&keys)?;
    Ok(())
}

/// `n` JSON lines `{"id":I}`, I counting up modulo `unique`.
fn ids(n: u32, unique: u32) -> String {
    (0..n).fold(String::new(), |mut s, i| {
        let _ = writeln!(s, "{{\"id\":{}}}", i % unique);
        s
    })
}

/// Runs the binary with `args`, `stdin` fed in, stderr a pipe; answers
/// stderr, after checking the command succeeded.
fn stderr_of(args: &[&str], stdin: &[u8]) -> Result<String, Box<dyn std::error::Error>> {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().ok_or("stdin")?.write_all(stdin)?;
    let out = child.wait_with_output()?;
    let err = String::from_utf8(out.stderr)?;
    assert!(out.status.success(), "{args:?}: {err}");
    Ok(err)
}

#[test]
fn stderr_not_a_terminal_gets_no_progress_bytes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.redb");
    store(&path)?;
    let p = path.to_str().ok_or("path")?;
    let lines = ids(300, 240);
    let export = dir.path().join("export.jsonl");
    let exported = Command::new(BIN)
        .args(["export", "-s", p, "--jsonl"])
        .output()?;
    std::fs::write(&export, &exported.stdout)?;
    let copy = dir.path().join("copy.redb");
    let c = copy.to_str().ok_or("path")?;
    let f = dir.path().join("f.redb");
    let runs: [(&[&str], &[u8], &str); 5] = [
        (
            &[
                "filter",
                "--store",
                f.to_str().ok_or("path")?,
                "--key",
                "id",
            ],
            lines.as_bytes(),
            "dedupkv filter: read 300, new 240, duplicates 60, bad 0, ",
        ),
        (
            &["export", "-s", p, "--jsonl"],
            b"",
            "dedupkv export: 300 records\n",
        ),
        (
            &["import", "-s", c],
            &exported.stdout,
            "dedupkv import: 300 records, 0 skipped\n",
        ),
        (&["verify", "-s", p, "--json"], b"", ""),
        (&["compact", "-s", p, "--write", "--json"], b"", ""),
    ];
    for (args, stdin, want) in runs {
        let err = stderr_of(args, stdin)?;
        assert!(
            !err.contains('\r') && !err.contains('\u{1b}'),
            "{args:?} drew progress: {err:?}"
        );
        assert!(err.starts_with(want), "{args:?}: {err:?}");
        assert_eq!(
            err.lines().count(),
            usize::from(!want.is_empty()),
            "{args:?}: {err:?}"
        );
    }
    Ok(())
}

/// `script -qec CMD /dev/null`: CMD with a pseudo terminal for stdin,
/// stdout and stderr; answers what it wrote there.
fn on_a_terminal(cmd: &str) -> Result<String, Box<dyn std::error::Error>> {
    let out = Command::new("script")
        .args(["-qec", cmd, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("util-linux's `script` runs this test: {e}"))?;
    assert!(out.status.success(), "{cmd}: {out:?}");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn stderr_a_terminal_gets_progress() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.redb");
    store(&path)?;
    let p = path.display();
    let input = dir.path().join("in.jsonl");
    let lines = ids(50_000, 50_000);
    std::fs::write(&input, lines)?;
    let f = dir.path().join("f.redb");
    for cmd in [
        format!("{BIN} export -s {p} --jsonl > /dev/null"),
        format!("{BIN} verify -s {p} > /dev/null"),
        format!(
            "{BIN} filter --store {} --key id {} > /dev/null",
            f.display(),
            input.display()
        ),
    ] {
        let shown = on_a_terminal(&cmd)?;
        assert!(
            shown.contains('\u{1b}'),
            "{cmd}: no progress drawn: {shown:?}"
        );
    }
    Ok(())
}
