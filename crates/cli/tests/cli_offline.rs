//! The built `dedupkv` binary against stores made here: every offline read
//! answers (and `--json` parses), leaves the file byte-identical with its
//! mtime unchanged, and exits with the documented code; writes need
//! `--write` and are refused while another handle holds the store.

use std::path::{Path, PathBuf};

use dedupkv::{Begin, Failure, Fingerprint, Key, Store};
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

mod common;
use common::{dedupkv, json};

/// A store with an inserted key, a completed claim with a fingerprint and
/// an outcome, a failed attempt, and a stranded claim (its process gone).
fn store(dir: &Path) -> Result<PathBuf, dedupkv::Error> {
    let path = dir.join("s.redb");
    let store = Store::open(&path)?;
    store.insert_if_absent(&Key::new("orders", "4711"))?;
    let fp = Fingerprint::of(b"charge 10 EUR");
    if let Begin::Started(c) = store.begin(&Key::new("pay", "p-1"), fp)? {
        store.complete(&c, b"charged")?;
    }
    if let Begin::Started(c) = store.begin(&Key::new("pay", "p-2"), fp)? {
        store.fail(&c, Failure::Retryable)?;
    }
    if let Begin::Started(c) = store.begin(&Key::new("pay", "p-3"), Fingerprint::NONE)? {
        std::mem::forget(c); // its process "crashes" with the claim held
    }
    drop(store);
    Ok(path)
}

/// The arguments of `get --history --json` of `pay`/`id` in `p`.
fn history_of<'a>(p: &'a str, id: &'a str) -> [&'a str; 8] {
    ["get", "-s", p, "--scope", "pay", id, "--history", "--json"]
}

/// The file's bytes and mtime.
fn snapshot(path: &Path) -> std::io::Result<(Vec<u8>, std::time::SystemTime)> {
    Ok((std::fs::read(path)?, std::fs::metadata(path)?.modified()?))
}

#[test]
fn get_shows_the_record_as_json_and_text() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = store(dir.path())?;
    let p = path.to_str().ok_or("path")?;
    let v = json(&dedupkv(&[
        "get", "-s", p, "--scope", "pay", "p-1", "--json",
    ])?)?;
    assert_eq!(v["state"], "Completed");
    assert_eq!(v["attempts"], 1);
    assert_eq!(v["outcome"], "charged");
    assert_eq!(
        v["fingerprint"],
        Fingerprint::of(b"charge 10 EUR").to_string()
    );
    assert_eq!(v["provider_key"].as_str().map(str::len), Some(32), "{v}");
    assert!(
        v["first_seen"]["at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert!(
        v["first_seen"]["age"]
            .as_str()
            .is_some_and(|a| a.ends_with("ago"))
    );
    let failed = json(&dedupkv(&[
        "get", "-s", p, "--scope", "pay", "p-2", "--json",
    ])?)?;
    assert_eq!(failed["state"], "Retryable");
    let text = dedupkv(&["get", "-s", p, "--scope", "orders", "4711"])?;
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout)?;
    assert!(text.contains("state: Inserted"), "{text}");
    Ok(())
}

#[test]
fn get_history_shows_every_attempt_oldest_first() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = store(dir.path())?;
    let p = path.to_str().ok_or("path")?;
    let v = json(&dedupkv(&history_of(p, "p-2"))?)?;
    assert_eq!(v["state"], "Retryable");
    let h = v["history"].as_array().ok_or("no history")?;
    let kinds: Vec<_> = h.iter().map(|a| a["kind"].as_str()).collect();
    assert_eq!(kinds, [Some("InProgress"), Some("Retryable")]);
    assert_eq!(h[0]["token"], v["token"]);
    assert_eq!(h[0]["owner_epoch"], 0);
    assert_eq!(h[0]["attempt"], 1);
    assert!(h[1]["at"]["at"].as_str().is_some_and(|t| t.ends_with('Z')));
    let done = json(&dedupkv(&history_of(p, "p-1"))?)?;
    assert_eq!(done["history"][1]["outcome"], "charged");
    // Without the flag, no scan and no history.
    let plain = json(&dedupkv(&[
        "get", "-s", p, "--scope", "pay", "p-2", "--json",
    ])?)?;
    assert!(plain.get("history").is_none());
    let text = String::from_utf8(
        dedupkv(&["get", "-s", p, "--scope", "pay", "p-2", "--history"])?.stdout,
    )?;
    assert!(
        text.contains("history:") && text.contains("kind: Retryable"),
        "{text}"
    );
    Ok(())
}

#[test]
fn every_offline_read_leaves_the_file_untouched() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = store(dir.path())?;
    let p = path.to_str().ok_or("path")?;
    let before = snapshot(&path)?;
    let reads: [&[&str]; 11] = [
        &["keys", "-s", p, "--json"],
        &history_of(p, "p-2"),
        &["export", "-s", p, "--jsonl"],
        &["get", "-s", p, "--scope", "pay", "p-1", "--json"],
        &["get", "-s", p, "--scope", "pay", "nope", "--json"],
        &["stats", "-s", p, "--json"],
        &["verify", "-s", p, "--json"],
        &["stranded", "-s", p, "--json"],
        &["dead-letters", "list", "-s", p, "--json"],
        &["held", "list", "-s", p, "--json"],
        &["intents", "pending", "-s", p, "--json"],
    ];
    for args in reads {
        let out = dedupkv(args)?;
        // One JSON value, or JSON lines (export); nothing for a missing key.
        for line in String::from_utf8(out.stdout)?.lines() {
            let _: Value = serde_json::from_str(line)?;
        }
        assert_eq!(snapshot(&path)?, before, "{args:?} changed the file");
    }
    Ok(())
}

/// `get` reads one key without loading the others (the one-key open):
/// on a store kept with a journal, copied while its writer holds it (every
/// commit still in the journal's tail), it finds the key and its history,
/// answers as `export` (the full open) does, and leaves the file and the
/// journal byte-identical with their mtimes.
#[test]
fn get_reads_the_journal_tail_and_writes_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let live = dir.path().join("live.redb");
    let store = Store::builder().journal(Some(1 << 20)).open(&live)?;
    let key = Key::new("pay", "p-9");
    if let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? {
        store.fail(&c, Failure::Retryable)?;
    }
    if let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? {
        store.complete(&c, b"charged")?;
    }
    store.flush()?;
    let path = dir.path().join("s.redb");
    let journal = dir.path().join("s.redb.journal");
    std::fs::copy(&live, &path)?;
    std::fs::copy(dir.path().join("live.redb.journal"), &journal)?;
    drop(store);
    let p = path.to_str().ok_or("path")?;
    let before = (snapshot(&path)?, snapshot(&journal)?);
    let v = json(&dedupkv(&history_of(p, "p-9"))?)?;
    assert_eq!(v["state"], "Completed", "{v}");
    assert_eq!(v["attempts"], 2);
    assert_eq!(v["history"].as_array().map(Vec::len), Some(4), "{v}");
    let exported = dedupkv(&["export", "-s", p, "--jsonl"])?;
    let full: Value = serde_json::from_slice(&exported.stdout)?;
    let plain = json(&dedupkv(&[
        "get", "-s", p, "--scope", "pay", "p-9", "--json",
    ])?)?;
    for field in [
        "state",
        "attempts",
        "token",
        "first_seen",
        "updated",
        "expires",
        "outcome",
    ] {
        assert_eq!(plain[field]["at"], full[field]["at"], "{field}");
        if plain[field].get("at").is_none() {
            assert_eq!(plain[field], full[field], "{field}");
        }
    }
    let missing = dedupkv(&["get", "-s", p, "--scope", "pay", "nope", "--json"])?;
    assert_eq!(missing.status.code(), Some(4));
    assert_eq!((snapshot(&path)?, snapshot(&journal)?), before, "get wrote");
    Ok(())
}

#[test]
fn stats_and_listings_count_what_is_there() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = store(dir.path())?;
    let p = path.to_str().ok_or("path")?;
    let s = json(&dedupkv(&["stats", "-s", p, "--json"])?)?;
    assert_eq!(s["keys"], 4);
    assert_eq!(s["stranded_claims"], 1);
    assert!(s["file_bytes"].as_u64().is_some_and(|n| n > 0));
    let stranded = json(&dedupkv(&["stranded", "-s", p, "--json"])?)?;
    assert_eq!(stranded.as_array().map(Vec::len), Some(1));
    assert_eq!(stranded[0]["id"], "p-3");
    assert_eq!(stranded[0]["state"], "InProgress");
    assert_eq!(
        json(&dedupkv(&["dead-letters", "list", "-s", p, "--json"])?)?,
        Value::Array(vec![])
    );
    let v = json(&dedupkv(&["verify", "-s", p, "--json"])?)?;
    assert_eq!(v["clean"], true);
    Ok(())
}

#[test]
fn exit_codes_and_clear_errors_create_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = store(dir.path())?;
    let p = path.to_str().ok_or("path")?;
    // 4: not found.
    let out = dedupkv(&["get", "-s", p, "--scope", "pay", "nope"])?;
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8(out.stderr)?.contains("no record of"));
    // 2: usage (an unknown flag; a write without --write).
    assert_eq!(
        dedupkv(&["stats", "-s", p, "--frobnicate"])?.status.code(),
        Some(2)
    );
    assert_eq!(dedupkv(&["compact", "-s", p])?.status.code(), Some(2));
    // 1: a missing path (nothing created), a directory, a file that is no store.
    let missing = dir.path().join("missing.redb");
    let out = dedupkv(&["stats", "-s", missing.to_str().ok_or("path")?])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)?.contains("missing.redb"));
    assert!(!missing.exists(), "a read created the file");
    let d = dir.path().to_str().ok_or("path")?;
    let out = dedupkv(&["get", "-s", d, "--scope", "a", "b"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)?.contains(d));
    let junk = dir.path().join("junk.txt");
    std::fs::write(&junk, b"hello, not a store")?;
    let out = dedupkv(&["stats", "-s", junk.to_str().ok_or("path")?])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)?.contains("junk.txt"));
    assert_eq!(std::fs::read(&junk)?, b"hello, not a store");
    // --write on a missing path creates nothing either.
    let out = dedupkv(&["compact", "-s", missing.to_str().ok_or("path")?, "--write"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(!missing.exists());
    Ok(())
}

#[test]
fn verify_exits_3_on_a_damaged_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = store(dir.path())?;
    let mut bytes = std::fs::read(&path)?;
    // Damage every page past the header: whatever the layout, rows fail
    // their checksums or the open finds the file damaged.
    for b in bytes.iter_mut().skip(4096) {
        *b ^= 0x5a;
    }
    std::fs::write(&path, &bytes)?;
    let out = dedupkv(&["verify", "-s", path.to_str().ok_or("path")?])?;
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8(out.stderr)?.contains("s.redb"));
    Ok(())
}

#[test]
fn writes_need_write_and_are_refused_while_the_store_is_held() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = store(dir.path())?;
    let p = path.to_str().ok_or("path")?;
    let held = Store::open(&path)?;
    let out = dedupkv(&["evict", "-s", p, "--write"])?;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr)?;
    assert!(
        err.contains(p) && err.contains("AlreadyOpen") && err.contains("admin endpoint"),
        "{err}"
    );
    drop(held);
    let v = json(&dedupkv(&["evict", "-s", p, "--write", "--json"])?)?;
    assert_eq!(v["keys"], 0);
    let v = json(&dedupkv(&["upgrade", "-s", p, "--write", "--json"])?)?;
    assert_eq!(v["upgraded"], false);
    Ok(())
}

#[test]
fn keys_by_scope_state_and_limit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = store(dir.path())?;
    let p = path.to_str().ok_or("path")?;
    let all = json(&dedupkv(&["keys", "-s", p, "--json"])?)?;
    assert_eq!(all.as_array().map(Vec::len), Some(4));
    let pay = json(&dedupkv(&["keys", "-s", p, "--scope", "pay", "--json"])?)?;
    assert_eq!(pay.as_array().map(Vec::len), Some(3));
    let done = json(&dedupkv(&[
        "keys",
        "-s",
        p,
        "--state",
        "completed",
        "--json",
    ])?)?;
    assert_eq!(done.as_array().map(Vec::len), Some(1));
    assert_eq!(done[0]["id"], "p-1");
    let one = json(&dedupkv(&["keys", "-s", p, "--limit", "1", "--json"])?)?;
    assert_eq!(one.as_array().map(Vec::len), Some(1));
    Ok(())
}

#[test]
fn export_then_import_gives_equal_records() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = store(dir.path())?;
    let p = path.to_str().ok_or("path")?;
    let export = dedupkv(&["export", "-s", p, "--jsonl"])?;
    assert!(export.status.success());
    let file = dir.path().join("export.jsonl");
    std::fs::write(&file, &export.stdout)?;
    let copy = dir.path().join("copy.redb");
    let c = copy.to_str().ok_or("path")?;
    let out = dedupkv(&["import", "-s", c, file.to_str().ok_or("path")?])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The stranded claim (in progress) is not recreated, and says so.
    assert!(String::from_utf8(out.stderr)?.contains("3 records, 1 skipped"));
    let original = Store::open_read_only(&path)?;
    let copied = Store::open_read_only(&copy)?;
    for (scope, id) in [("orders", "4711"), ("pay", "p-1"), ("pay", "p-2")] {
        let key = Key::new(scope, id);
        let was = original.get(&key)?.ok_or("original")?;
        let now = copied.get(&key)?.ok_or("copied")?;
        assert_eq!(
            (
                was.state(),
                was.attempts(),
                was.fingerprint(),
                was.outcome()
            ),
            (
                now.state(),
                now.attempts(),
                now.fingerprint(),
                now.outcome()
            ),
            "{key}"
        );
    }
    assert_eq!(
        json(&dedupkv(&["verify", "-s", c, "--json"])?)?["clean"],
        true
    );
    // Import writes into a fresh store only.
    let again = dedupkv(&["import", "-s", c, file.to_str().ok_or("path")?])?;
    assert_eq!(again.status.code(), Some(1));
    Ok(())
}
