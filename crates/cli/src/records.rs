//! `keys`, `export --jsonl` and `import`: the store's live records through
//! `Store::records`, a page at a time.

use std::io::{BufRead, BufWriter, Write as _};
use std::path::Path;
use std::time::SystemTime;

use dedupkv::{Begin, Failure, Fingerprint, Key, Listing, Record, State, Store};
use serde_json::Value;

use crate::progress::Progress;
use crate::show;

/// Calls `each` on every live record `listing` selects, page by page
/// (`listing`'s limit is the page size), until it answers `false`.
pub fn each_record(
    store: &Store,
    mut listing: Listing,
    mut each: impl FnMut(&Record) -> Result<bool, String>,
) -> dedupkv::Result<Result<(), String>> {
    loop {
        let page = store.records(&listing)?;
        for r in &page.items {
            match each(r) {
                Ok(true) => {}
                Ok(false) => return Ok(Ok(())),
                Err(e) => return Ok(Err(e)),
            }
        }
        match page.next {
            Some(c) => listing = listing.after(c),
            None => return Ok(Ok(())),
        }
    }
}

/// A state's name as the command line takes and shows it.
pub fn state_name(s: State) -> String {
    format!("{s:?}")
}

/// Writes every live record as one JSON line (the `get --json` form) to
/// stdout; returns how many.
pub fn export(store: &Store, listing: Listing) -> Result<u64, String> {
    let now = SystemTime::now();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let progress = Progress::counting("export", "records");
    let mut n = 0u64;
    each_record(store, listing.limit(1000), |r| {
        n += 1;
        progress.inc(1);
        writeln!(out, "{}", show::record(r, now)).map_err(|e| format!("stdout: {e}"))?;
        Ok(true)
    })
    .map_err(|e| e.to_string())??;
    out.flush().map_err(|e| format!("stdout: {e}"))?;
    Ok(n)
}

/// What `import` did.
#[derive(Default)]
pub struct Imported {
    /// Records written.
    pub records: u64,
    /// Lines naming a state an import cannot recreate (a claim in
    /// progress, a dead letter): listed on stderr, not written.
    pub skipped: u64,
}

/// Reads `export --jsonl` lines from `input` into the fresh store at
/// `path` (refused if the file exists).
pub fn import(path: &Path, input: impl BufRead) -> Result<Imported, String> {
    if path.exists() {
        return Err(format!(
            "{}: exists; import writes into a fresh store only",
            path.display()
        ));
    }
    let store = Store::open(path).map_err(|e| crate::open::named(path, &e))?;
    let mut done = Imported::default();
    let progress = Progress::counting("import", "lines");
    for (i, line) in input.lines().enumerate() {
        progress.inc(1);
        let at = |e: String| format!("line {}: {e}", i + 1);
        let line = line.map_err(|e| at(e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| at(format!("not JSON: {e}")))?;
        let wrote = import_one(&store, &v).map_err(at)?;
        if wrote {
            done.records += 1;
        } else {
            done.skipped += 1;
            progress.note(&format!(
                "dedupkv import: line {}: state {} is not imported",
                i + 1,
                v["state"]
            ));
        }
    }
    store.flush().map_err(|e| crate::open::named(path, &e))?;
    Ok(done)
}

/// Bytes back from `dedupkv::admin::json::bytes`: a string, or `{"hex": ...}`.
fn bytes_of(v: &Value, what: &str) -> Result<Vec<u8>, String> {
    match v {
        Value::String(s) => Ok(s.as_bytes().to_vec()),
        Value::Object(m) => {
            let hex = m
                .get("hex")
                .and_then(Value::as_str)
                .ok_or(format!("{what}: no hex"))?;
            (0..hex.len())
                .step_by(2)
                .map(|i| {
                    hex.get(i..i + 2)
                        .and_then(|b| u8::from_str_radix(b, 16).ok())
                        .ok_or(format!("{what}: bad hex"))
                })
                .collect()
        }
        _ => Err(format!("{what}: missing")),
    }
}

/// Writes one exported record; `false` for a state it does not recreate.
fn import_one(store: &Store, v: &Value) -> Result<bool, String> {
    let key = Key::owned(bytes_of(&v["scope"], "scope")?, bytes_of(&v["id"], "id")?);
    let fingerprint = match v["fingerprint"].as_str() {
        Some(hex) => Fingerprint(
            u128::from_str_radix(hex, 16).map_err(|_| format!("fingerprint `{hex}`: bad hex"))?,
        ),
        None => Fingerprint::NONE,
    };
    let outcome = match &v["outcome"] {
        Value::Null => Vec::new(),
        o => bytes_of(o, "outcome")?,
    };
    let e = |e: dedupkv::Error| format!("{key}: {e}");
    let state = v["state"].as_str().unwrap_or_default();
    if state == state_name(State::Inserted) {
        store.insert_if_absent(&key).map_err(e)?;
        return Ok(true);
    }
    let finish: fn(&Store, &dedupkv::Claim, &[u8]) -> dedupkv::Result<()> = match state {
        s if s == state_name(State::Completed) => |s, c, o| s.complete(c, o),
        s if s == state_name(State::Failed) => |s, c, o| s.fail(c, Failure::Permanent(o)),
        s if s == state_name(State::Retryable) => |s, c, _| s.fail(c, Failure::Retryable),
        _ => return Ok(false),
    };
    match store.begin(&key, fingerprint).map_err(e)? {
        Begin::Started(c) => finish(store, &c, &outcome).map_err(e)?,
        _ => return Err(format!("{key}: listed twice in the input")),
    }
    Ok(true)
}
