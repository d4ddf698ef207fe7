//! On-disk fixtures: files written by earlier builds, committed, so a
//! change that breaks reading them fails here, and a corrupt file is tested
//! for real. The tests only read them; `cargo run -p dedupkv-fixtures --
//! fixtures --prefix vN` (crates/fixtures) writes a new format's set, on
//! purpose, and never replaces a committed file unless forced.

use std::path::{Path, PathBuf};

use dedupkv::{
    Advance, Begin, Error, Fingerprint, Key, ManualClock, Result, Sequenced, State, Store,
    StoreBuilder,
};
use dedupkv_testkit::tempdir;

const T0: u64 = 1_700_000_040_000;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn builder(clock: &ManualClock) -> StoreBuilder {
    Store::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .compact_when_free(None)
}

/// A copy of a fixture in a temp dir (opening writes to the file).
fn copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempdir();
    let to = dir.path().join(name);
    std::fs::copy(fixture(name), &to).expect("copy fixture");
    (dir, to)
}

/// The keys of `v1-runs.redb`: a batch of 300 16-byte ids in one scope
/// (one run), then three single inserts (as crates/fixtures writes them).
fn run_ids() -> Vec<String> {
    (0..300).map(|i| format!("batch-id-{i:07}")).collect()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn a_version_1_file_reads_back_everything() -> Result<()> {
    let (_dir, path) = copy("v1-basic.redb");
    let clock = ManualClock::new(T0 + 10_000); // within the 30 s lease of "running"
    let store = builder(&clock).open(&path)?;
    assert!(!store.insert_if_absent(&Key::new("shop", "evt-1"))?);
    let Begin::Completed(rec) =
        store.begin(&Key::new("shop", "charge-1"), Fingerprint::of("100"))?
    else {
        panic!("completed in the fixture")
    };
    assert_eq!(rec.outcome(), Some(&b"receipt-1"[..]));
    let Begin::Completed(rec) =
        store.begin(&Key::new("shop", "charge-2"), Fingerprint::of("200"))?
    else {
        panic!("failed in the fixture")
    };
    assert_eq!(
        (rec.state(), rec.outcome()),
        (State::Failed, Some(&b"declined"[..]))
    );
    // The claim left in progress by the process that wrote the fixture is
    // taken over at once, inside its lease: that process is gone.
    assert!(matches!(
        store.begin(&Key::new("shop", "running"), Fingerprint::NONE)?,
        Begin::Started(c) if c.attempt() == 2 && c.interrupted()
    ));
    assert_eq!(
        store.advance(&Key::new("shop", "order-1"), 7)?,
        Advance::Duplicate
    );
    let Sequenced::Delivered(out) = store.sequence(&Key::new("bank", "acct"), 2, b"two")? else {
        panic!("2 unblocks the parked 3")
    };
    assert_eq!(out.iter().map(|d| d.seq).collect::<Vec<_>>(), [2, 3]);
    Ok(())
}

#[test]
fn a_corrupt_row_in_a_committed_file_is_reported() {
    let (_dir, path) = copy("v1-corrupt-row.redb");
    let clock = ManualClock::new(T0 + 60_000);
    let err = builder(&clock).open(&path).expect_err("corrupt");
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
}

#[test]
fn a_file_with_a_run_of_inserts_reads_back_every_key() -> Result<()> {
    let (_dir, path) = copy("v1-runs.redb");
    // The ids lie back to back: a run, not 300 records of their own.
    let bytes = std::fs::read(&path).expect("read");
    let at = find(&bytes, b"batch-id-").expect("the ids are in the file");
    assert_eq!(&bytes[at + 16..at + 25], b"batch-id-");
    let clock = ManualClock::new(T0 + 60_000);
    let store = builder(&clock).open(&path)?;
    let ids = run_ids();
    let keys: Vec<Key<'_>> = ids.iter().map(|id| Key::new("shop", id)).collect();
    assert_eq!(store.stats().keys, 303);
    assert!(store.insert_batch(&keys)?.iter().all(|&new| !new));
    let rec = store.get(&keys[299])?.expect("the run's last key");
    assert_eq!((rec.key(), rec.state()), (&keys[299], State::Inserted));
    for id in ["a", "b", "c"] {
        assert!(!store.insert_if_absent(&Key::new("other", id))?);
    }
    assert!(store.insert_if_absent(&Key::new("shop", "batch-id-0000300"))?);
    Ok(())
}
