//! `dedupkv filter` run as a shell pipeline would: new lines out in input
//! order, across runs on one store; nested keys; every `--on-bad-line`
//! mode; and a SIGKILL mid-stream, after which a rerun emits no line twice.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Runs `filter` on `store` with `args`, `input` on stdin.
fn filter(store: &Path, args: &[&str], input: &str) -> std::io::Result<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dedupkv"))
        .arg("filter")
        .arg("--store")
        .arg(store)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or(std::io::ErrorKind::BrokenPipe)?
        .write_all(input.as_bytes())?;
    child.wait_with_output()
}

fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn new_lines_in_order_and_a_second_run_emits_none_of_them() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("f.redb");
    let input = "{\"id\":3}\n{\"id\":1}\n{\"id\":3,\"x\":1}\n{\"id\":2}\n";
    let out = filter(&store, &["--key", "id"], input)?;
    assert!(out.status.success());
    assert_eq!(lines(&out), ["{\"id\":3}", "{\"id\":1}", "{\"id\":2}"]);
    let summary = String::from_utf8(out.stderr)?;
    assert!(
        summary.contains("read 4, new 3, duplicates 1, bad 0"),
        "{summary}"
    );
    let out = filter(
        &store,
        &["--key", "id"],
        "{\"id\":1}\n{\"id\":4}\n{\"id\":2}\n",
    )?;
    assert_eq!(lines(&out), ["{\"id\":4}"]);
    Ok(())
}

#[test]
fn nested_keys_pointers_several_fields_scopes_and_duplicates_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("f.redb");
    let dups = dir.path().join("dups.jsonl");
    let input = concat!(
        "{\"o\":{\"id\":1},\"t\":\"a\"}\n",
        "{\"o\":{\"id\":1},\"t\":\"b\"}\n",
        "{\"o\":{\"id\":1},\"t\":\"a\",\"z\":0}\n",
    );
    let out = filter(
        &store,
        &["--key", "o.id,t", "--duplicates", dups.to_str().ok_or("p")?],
        input,
    )?;
    assert_eq!(lines(&out).len(), 2);
    assert_eq!(
        std::fs::read_to_string(&dups)?,
        "{\"o\":{\"id\":1},\"t\":\"a\",\"z\":0}\n"
    );
    // The pointer selects the same field; a scope of its own keeps keys apart.
    let out = filter(&store, &["--key", "/o/id", "--scope", "other"], input)?;
    assert_eq!(lines(&out).len(), 1);
    // A scope from a field: each tenant has its own keys.
    let out = filter(&store, &["--key", "o.id", "--scope-field", "t"], input)?;
    assert_eq!(lines(&out).len(), 2);
    Ok(())
}

#[test]
fn bad_lines_fail_by_default_with_the_line_number_or_are_skipped_or_kept() -> TestResult {
    let dir = tempfile::tempdir()?;
    let input = "{\"id\":1}\nnot json\n{\"nokey\":1}\n{\"id\":2}\n";
    let out = filter(&dir.path().join("a.redb"), &["--key", "id"], input)?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        lines(&out),
        ["{\"id\":1}"],
        "lines before the bad one are done"
    );
    let err = String::from_utf8(out.stderr)?;
    assert!(err.contains("<stdin>:2: not JSON"), "{err}");

    let out = filter(
        &dir.path().join("b.redb"),
        &["--key", "id", "--on-bad-line", "skip"],
        input,
    )?;
    assert!(out.status.success());
    assert_eq!(lines(&out), ["{\"id\":1}", "{\"id\":2}"]);
    assert!(String::from_utf8(out.stderr)?.contains("bad 2"));

    let bad = dir.path().join("bad.jsonl");
    let mode = format!("file:{}", bad.display());
    let out = filter(
        &dir.path().join("c.redb"),
        &["--key", "id", "--on-bad-line", &mode],
        input,
    )?;
    assert!(out.status.success());
    assert_eq!(lines(&out), ["{\"id\":1}", "{\"id\":2}"]);
    assert_eq!(std::fs::read_to_string(&bad)?, "not json\n{\"nokey\":1}\n");

    let out = filter(
        &dir.path().join("d.redb"),
        &["--key", "id", "--on-bad-line", "drop"],
        input,
    )?;
    assert_eq!(out.status.code(), Some(2));
    Ok(())
}

#[test]
fn sigkill_mid_filter_then_rerun_emits_no_line_twice() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("f.redb");
    let input = dir.path().join("in.jsonl");
    let (n, unique) = (60_000u32, 40_000u32);
    let mut text = String::new();
    for i in 0..n {
        writeln!(text, "{{\"id\":{},\"n\":{i}}}", i % unique)?;
    }
    std::fs::write(&input, &text)?;
    let batch = 100;
    let args = |store: &Path| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dedupkv"));
        c.arg("filter")
            .arg("--store")
            .arg(store)
            .args(["--key", "id", "--batch", "100"]);
        c.arg(&input).stdout(Stdio::piped()).stderr(Stdio::null());
        c
    };
    let mut child = args(&store).spawn()?;
    let mut first = Vec::new();
    let mut reader = BufReader::new(child.stdout.take().ok_or("stdout")?);
    let mut line = String::new();
    // Kill it mid-stream: after some output, with more to come.
    while first.len() < 5_000 && reader.read_line(&mut line)? > 0 {
        first.push(std::mem::take(&mut line).trim_end().to_owned());
    }
    child.kill()?; // SIGKILL
    child.wait()?;
    // Whatever was already in the pipe was emitted too.
    for l in reader.lines() {
        first.push(l?);
    }
    assert!(first.len() < unique as usize, "killed before the end");
    let second = args(&store).output()?;
    assert!(second.status.success());
    let mut seen = HashSet::new();
    for l in first
        .iter()
        .map(String::as_str)
        .chain(lines(&second).iter().map(String::as_str))
    {
        let v: serde_json::Value = serde_json::from_str(l)?;
        assert!(seen.insert(v["id"].clone()), "line emitted twice: {l}");
    }
    // At most the one batch in flight at the kill is withheld.
    let missing = unique as usize - seen.len();
    assert!(
        missing <= batch,
        "{missing} lines lost, more than one batch"
    );
    Ok(())
}
