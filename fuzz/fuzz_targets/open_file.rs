//! Opening a damaged store file: `Store::open` must return `Ok` or `Err`,
//! never panic; if it opens, reading and writing must not panic either.
//!
//! The input either edits a real small store (`seed/store.redb`, see
//! `fuzz/README.md`) — bit flips, overwritten bytes and ranges, truncation —
//! or is a whole file by itself. Each run writes the bytes to a file in a
//! temporary directory and opens it there: one small directory per fuzzing
//! process, left under `TMPDIR` since libFuzzer exits without running
//! destructors (`scripts/fuzz-smoke.sh` points `TMPDIR` at a directory of
//! its own and deletes it).
//!
//! redb 4.6 panics on many damaged pages instead of returning an error (see
//! `a_damaged_file_is_an_error_not_a_panic` in `tests/model.rs`), so this
//! target finds such a crash within seconds. With
//! `DEDUPKV_FUZZ_IGNORE_REDB_PANICS=1` a panic raised inside redb's own code
//! is caught and the input skipped (a panic anywhere else still crashes),
//! so the search can go on for dedupkv's own bugs. A second panic while
//! unwinding from the first still aborts.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use arbitrary::Arbitrary;
use dedupkv::{Begin, Fingerprint, Key, ManualClock, Store};
use libfuzzer_sys::fuzz_target;

/// A clean store: 15 keys in two log buckets, written at `T0` and `T0 + 90 s`
/// with 1 h retention and 60 s buckets (inserted, completed, failed,
/// released, a typed outcome and a claim held at close).
const SEED: &[u8] = include_bytes!("../seed/store.redb");
/// The seed's clock, plus 5 minutes: every record in it is live.
const NOW: u64 = 1_700_000_000_000 + 300_000;

#[derive(Arbitrary, Debug)]
enum Input {
    Edit {
        edits: Vec<Edit>,
        truncate: Option<u16>,
    },
    Whole(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Edit {
    Flip { at: u16, bit: u8 },
    Set { at: u16, byte: u8 },
    Fill { at: u16, len: u8, byte: u8 },
    Splice { at: u16, bytes: Vec<u8> },
}

/// Inputs skipped because redb panicked (reported every 2^16).
static REDB_PANICS: AtomicU64 = AtomicU64::new(0);

/// Whether redb's panics are skipped; on first use, wraps libFuzzer's panic
/// hook (which aborts) so that it lets panics located in redb unwind.
fn ignore_redb_panics() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var_os("DEDUPKV_FUZZ_IGNORE_REDB_PANICS").is_some_and(|v| v != "0");
        if on {
            let fuzzer_hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let in_redb = info.location().is_some_and(|l| l.file().contains("/redb-"));
                if !in_redb {
                    fuzzer_hook(info);
                }
            }));
        }
        on
    })
}

fn file_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("dedupkv-fuzz-open-")
            .tempdir()
            .expect("temp dir");
        // Kept for the life of the process (libFuzzer exits without
        // running destructors); one small file per fuzzing process.
        dir.keep().join("store.redb")
    })
}

fn apply(edits: &[Edit], truncate: Option<u16>) -> Vec<u8> {
    let mut bytes = SEED.to_vec();
    for e in edits.iter().take(64) {
        let len = bytes.len().max(1);
        match e {
            Edit::Flip { at, bit } => {
                if let Some(b) = bytes.get_mut(usize::from(*at) % len) {
                    *b ^= 1 << (bit % 8);
                }
            }
            Edit::Set { at, byte } => {
                if let Some(b) = bytes.get_mut(usize::from(*at) % len) {
                    *b = *byte;
                }
            }
            Edit::Fill { at, len: n, byte } => {
                let start = usize::from(*at) % len;
                let end = (start + usize::from(*n)).min(bytes.len());
                bytes[start..end].fill(*byte);
            }
            Edit::Splice { at, bytes: new } => {
                let start = usize::from(*at) % len;
                let end = (start + new.len()).min(bytes.len());
                bytes[start..end].copy_from_slice(&new[..end - start]);
            }
        }
    }
    if let Some(t) = truncate {
        bytes.truncate(usize::from(t));
    }
    bytes
}

/// Every call may fail; none may panic.
fn exercise(store: &Store) {
    for (scope, id) in [
        ("seed", "evt-1"),
        ("seed", "done"),
        ("seed", "held"),
        ("seed", "retry"),
    ] {
        let key = Key::new(scope, id);
        let _ = store.get(&key);
        if let Ok(Begin::Started(claim)) = store.begin(&key, Fingerprint::of("p")) {
            let _ = store.complete(&claim, b"fuzz");
        }
    }
    let _ = store.insert_if_absent(&Key::new("fuzz", "new"));
    let _ = store.evict_expired();
    let _ = store.flush();
}

/// Opens the file; if it opens, uses it, closes it and opens it again.
fn open_and_use(path: &PathBuf) {
    let opened = Store::builder()
        .clock(ManualClock::new(NOW))
        .background_eviction(false)
        .cache_size(1 << 20)
        .open(path);
    if let Ok(store) = opened {
        exercise(&store);
        drop(store);
        // A store that opened once must open again after a clean close.
        let again = Store::builder()
            .clock(ManualClock::new(NOW + 1_000))
            .background_eviction(false)
            .cache_size(1 << 20)
            .open(path);
        if let Err(e) = &again {
            panic!("reopening a store that opened and closed cleanly failed: {e}");
        }
    }
}

fuzz_target!(|input: Input| {
    let bytes = match input {
        Input::Edit { edits, truncate } => apply(&edits, truncate),
        Input::Whole(bytes) => bytes,
    };
    let path = file_path();
    std::fs::write(path, &bytes).expect("write the file");
    if ignore_redb_panics() {
        let run = std::panic::catch_unwind(|| open_and_use(path));
        if run.is_err() {
            let n = REDB_PANICS.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() || n.is_multiple_of(65_536) {
                eprintln!("open_file: {n} input(s) skipped after a panic inside redb");
            }
        }
    } else {
        open_and_use(path);
    }
});
