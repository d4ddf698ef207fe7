//! `dedupkv filter`: JSON lines in, each line whose key is new out, in
//! input order; keys recorded durably a batch at a time before the
//! batch's lines are written (see [`GUARANTEE`]). Memory holds one batch.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use dedupkv::{Fingerprint, Key, Store};
use serde_json::Value;

use crate::progress::Progress;

/// The order of work and what a crash can do, in `--help` and docs/cli.md.
pub const GUARANTEE: &str = "\
Order of work, batch after batch (--batch lines): read the lines, derive their keys, record the \
keys durably in one commit, then write the batch's new lines to stdout (and its duplicates to \
--duplicates) and flush, then read on. So a line is written only after its key is durable.

Guarantee: across runs and crashes on one store, no line is emitted twice (a key recorded by an \
earlier run is a duplicate). A crash or SIGKILL after a batch's commit and before its lines are \
all written withholds the rest of that one batch: their keys are recorded, so a rerun treats \
them as duplicates and does not emit them. At most one batch is withheld per crash (--batch 1: \
at most one line); the summary of a run that ends normally accounts for every line.

Keys: --key FIELD[,FIELD...], each a dotted path (order.id, items.0.sku) or a JSON pointer \
(/order/id); the key is the JSON text of the selected value (an array of them for several \
fields), or a hash of it past 512 bytes. Lines that are not JSON or lack a field are bad lines: \
--on-bad-line fail (default: stop with file, line number and reason; earlier lines are done), \
skip (counted in the summary), or file:PATH (appended there). Nothing is dropped silently.

Exit codes: 0 ok, 1 error (or a bad line with --on-bad-line fail), 2 usage.";

/// `filter`'s arguments.
#[derive(Args)]
pub struct FilterArgs {
    /// The store that remembers keys across runs (created if missing).
    #[arg(long, short = 's', env = "DEDUPKV_STORE")]
    store: PathBuf,
    /// The fields that make a line's key: dotted paths or JSON pointers.
    #[arg(long, required = true, value_delimiter = ',')]
    key: Vec<String>,
    /// The keys' scope, as text.
    #[arg(long, default_value = "filter", conflicts_with = "scope_field")]
    scope: String,
    /// Take each line's scope from this field instead.
    #[arg(long)]
    scope_field: Option<String>,
    /// How long a key is remembered (`7d`, `36h`); default: the store's.
    #[arg(long, value_parser = crate::duration)]
    retention: Option<Duration>,
    /// Write duplicate lines here.
    #[arg(long)]
    duplicates: Option<PathBuf>,
    /// What to do with a line that is not JSON or lacks a key field:
    /// `fail`, `skip`, or `file:PATH`.
    #[arg(long, default_value = "fail", value_parser = bad_line_mode)]
    on_bad_line: BadLines,
    /// Lines per durable commit.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Input files (`-` or none: stdin), read one after another.
    files: Vec<PathBuf>,
}

/// `--on-bad-line`.
#[derive(Clone, Debug)]
enum BadLines {
    Fail,
    Skip,
    File(PathBuf),
}

fn bad_line_mode(s: &str) -> Result<BadLines, String> {
    match s {
        "fail" => Ok(BadLines::Fail),
        "skip" => Ok(BadLines::Skip),
        _ => match s.strip_prefix("file:") {
            Some(p) if !p.is_empty() => Ok(BadLines::File(PathBuf::from(p))),
            _ => Err(format!("`{s}`: expected fail, skip or file:PATH")),
        },
    }
}

/// What a run saw, for the summary.
#[derive(Default)]
struct Counts {
    read: u64,
    new: u64,
    duplicates: u64,
    bad: u64,
}

/// Where lines go.
struct Outputs {
    out: BufWriter<io::StdoutLock<'static>>,
    duplicates: Option<BufWriter<File>>,
    bad: Option<BufWriter<File>>,
    /// Lines read, on stderr when it is a terminal.
    progress: Progress,
}

/// Runs `filter`; the message of an error names the file and line.
pub fn run(args: &FilterArgs) -> Result<(), String> {
    let started = Instant::now();
    let mut builder = Store::builder();
    if let Some(r) = args.retention {
        builder = builder.retention(r);
    }
    let store = builder.open(&args.store).map_err(|e| match e {
        dedupkv::Error::AlreadyOpen => format!(
            "{}: the store is open in another process (AlreadyOpen); filter needs it to itself",
            args.store.display()
        ),
        e => crate::open::named(&args.store, &e),
    })?;
    let create = |p: &PathBuf| {
        File::options()
            .create(true)
            .append(true)
            .open(p)
            .map(BufWriter::new)
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    let mut outs = Outputs {
        out: BufWriter::new(io::stdout().lock()),
        duplicates: args.duplicates.as_ref().map(create).transpose()?,
        bad: match &args.on_bad_line {
            BadLines::File(p) => Some(create(p)?),
            _ => None,
        },
        progress: Progress::counting("filter", "lines"),
    };
    let mut counts = Counts::default();
    let inputs: Vec<Option<&PathBuf>> = if args.files.is_empty() {
        vec![None]
    } else {
        args.files
            .iter()
            .map(|f| (f.as_os_str() != "-").then_some(f))
            .collect()
    };
    let mut result = Ok(());
    for input in inputs {
        let (name, reader): (String, Box<dyn BufRead>) = match input {
            None => ("<stdin>".into(), Box::new(io::stdin().lock())),
            Some(p) => {
                let f = File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
                (p.display().to_string(), Box::new(BufReader::new(f)))
            }
        };
        result = filter_one(args, &store, &name, reader, &mut outs, &mut counts);
        if result.is_err() {
            break;
        }
    }
    // The progress line is cleared before the summary.
    drop(outs);
    // Lines/s for people: f64's precision is plenty.
    #[allow(clippy::cast_precision_loss)]
    let rate = counts.read as f64 / started.elapsed().as_secs_f64().max(1e-9);
    eprintln!(
        "dedupkv filter: read {}, new {}, duplicates {}, bad {}, {:.0} lines/s",
        counts.read, counts.new, counts.duplicates, counts.bad, rate
    );
    result
}

/// Filters one input, batch after batch.
fn filter_one(
    args: &FilterArgs,
    store: &Store,
    name: &str,
    mut reader: Box<dyn BufRead + '_>,
    outs: &mut Outputs,
    counts: &mut Counts,
) -> Result<(), String> {
    let mut batch: Vec<(Vec<u8>, Key<'static>)> = Vec::with_capacity(args.batch as usize);
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| format!("{name}: {e}"))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        counts.read += 1;
        let line = trim_newline(&buf);
        match key_of(args, line) {
            Ok(key) => batch.push((line.to_vec(), key)),
            Err(reason) => {
                counts.bad += 1;
                match &args.on_bad_line {
                    BadLines::Fail => {
                        flush(store, &mut batch, outs, counts)?;
                        return Err(format!("{name}:{line_no}: {reason}"));
                    }
                    BadLines::Skip => {}
                    BadLines::File(p) => {
                        if let Some(bad) = outs.bad.as_mut() {
                            write_line(bad, line).map_err(|e| format!("{}: {e}", p.display()))?;
                        }
                    }
                }
            }
        }
        if batch.len() >= args.batch as usize {
            flush(store, &mut batch, outs, counts)?;
        }
    }
    flush(store, &mut batch, outs, counts)
}

/// Records the batch's keys durably, then writes its lines.
fn flush(
    store: &Store,
    batch: &mut Vec<(Vec<u8>, Key<'static>)>,
    outs: &mut Outputs,
    counts: &mut Counts,
) -> Result<(), String> {
    if !batch.is_empty() {
        let keys: Vec<Key<'static>> = batch.iter().map(|(_, k)| k.clone()).collect();
        let new = store.insert_batch(&keys).map_err(|e| e.to_string())?;
        for ((line, _), is_new) in batch.drain(..).zip(new) {
            if is_new {
                counts.new += 1;
                write_line(&mut outs.out, &line).map_err(|e| format!("stdout: {e}"))?;
            } else {
                counts.duplicates += 1;
                if let Some(d) = outs.duplicates.as_mut() {
                    write_line(d, &line).map_err(|e| format!("--duplicates: {e}"))?;
                }
            }
        }
    }
    outs.out.flush().map_err(|e| format!("stdout: {e}"))?;
    outs.progress.set(counts.read);
    for w in [outs.duplicates.as_mut(), outs.bad.as_mut()]
        .into_iter()
        .flatten()
    {
        w.flush().map_err(|e| format!("output file: {e}"))?;
    }
    Ok(())
}

fn write_line(w: &mut impl Write, line: &[u8]) -> io::Result<()> {
    w.write_all(line)?;
    w.write_all(b"\n")
}

fn trim_newline(b: &[u8]) -> &[u8] {
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    b.strip_suffix(b"\r").unwrap_or(b)
}

/// Longest key text kept as it is; longer ones are hashed.
const MAX_KEY_TEXT: usize = 512;

/// The line's key, or why it has none.
fn key_of(args: &FilterArgs, line: &[u8]) -> Result<Key<'static>, String> {
    let text = std::str::from_utf8(line).map_err(|e| format!("not UTF-8: {e}"))?;
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let mut selected = Vec::with_capacity(args.key.len());
    for field in &args.key {
        selected.push(select(&value, field)?.clone());
    }
    let selected = if selected.len() == 1 {
        selected.swap_remove(0)
    } else {
        Value::Array(selected)
    };
    let mut id = selected.to_string();
    if id.len() > MAX_KEY_TEXT {
        let f = Fingerprint::of_value(&selected).map_err(|e| e.to_string())?;
        id = format!("#{f}");
    }
    let scope = match &args.scope_field {
        None => args.scope.clone(),
        Some(field) => match select(&value, field)? {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
    };
    Ok(Key::owned(scope.into_bytes(), id.into_bytes()))
}

/// The value at `field`: a JSON pointer (`/a/b`) or a dotted path (`a.b`,
/// a decimal segment indexes an array).
fn select<'v>(value: &'v Value, field: &str) -> Result<&'v Value, String> {
    let found = if field.starts_with('/') {
        value.pointer(field)
    } else {
        field.split('.').try_fold(value, |v, seg| match v {
            Value::Object(m) => m.get(seg),
            Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => None,
        })
    };
    found.ok_or_else(|| format!("no field `{field}`"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn select_walks_dotted_paths_and_pointers() {
        let v = json!({"a": {"b": [10, {"c": "x"}]}});
        assert_eq!(select(&v, "a.b.0").ok(), Some(&json!(10)));
        assert_eq!(select(&v, "a.b.1.c").ok(), Some(&json!("x")));
        assert_eq!(select(&v, "/a/b/1/c").ok(), Some(&json!("x")));
        assert_eq!(select(&v, "a.z"), Err("no field `a.z`".to_owned()));
    }

    #[test]
    fn bad_line_modes_parse() {
        assert!(matches!(bad_line_mode("fail"), Ok(BadLines::Fail)));
        assert!(matches!(bad_line_mode("skip"), Ok(BadLines::Skip)));
        assert!(
            matches!(bad_line_mode("file:x.jsonl"), Ok(BadLines::File(p)) if p.as_os_str() == "x.jsonl")
        );
        assert!(bad_line_mode("file:").is_err());
        assert!(bad_line_mode("drop").is_err());
    }
}
