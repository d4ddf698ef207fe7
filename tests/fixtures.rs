//! On-disk fixtures: files written by this format version, committed, so a
//! format change that breaks reading them fails here, and a corrupt file is
//! tested for real. `cargo test --test fixtures -- --ignored write_fixtures`
//! regenerates them (only when the format changes on purpose).

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedupkv::{
    Advance, Begin, Error, Failure, Fingerprint, Key, ManualClock, Result, Sequenced, State, Store,
    StoreBuilder,
};

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
    let dir = tempfile::tempdir().expect("tempdir");
    let to = dir.path().join(name);
    std::fs::copy(fixture(name), &to).expect("copy fixture");
    (dir, to)
}

#[test]
#[ignore = "regenerates tests/fixtures; run on purpose after a deliberate format change"]
fn write_fixtures() -> Result<()> {
    let clock = ManualClock::new(T0);
    let path = fixture("v1-basic.redb");
    let _ = std::fs::remove_file(&path);
    {
        let store = builder(&clock).open(&path)?;
        store.insert_if_absent(&Key::new("shop", "evt-1"))?;
        let Begin::Started(c) =
            store.begin(&Key::new("shop", "charge-1"), Fingerprint::of("100"))?
        else {
            panic!("fresh key")
        };
        store.complete(&c, b"receipt-1")?;
        let Begin::Started(c) =
            store.begin(&Key::new("shop", "charge-2"), Fingerprint::of("200"))?
        else {
            panic!("fresh key")
        };
        store.fail(&c, Failure::Permanent(b"declined"))?;
        let Begin::Started(c) = store.begin(&Key::new("shop", "running"), Fingerprint::NONE)?
        else {
            panic!("fresh key")
        };
        std::mem::forget(c); // in progress when the file was written
        store.advance(&Key::new("shop", "order-1"), 7)?;
        store.sequence(&Key::new("bank", "acct"), 1, b"one")?;
        store.sequence(&Key::new("bank", "acct"), 3, b"three")?; // parked
    }
    // A corrupt copy: one byte of a log row flipped (the checksum catches it).
    let bytes = std::fs::read(&path).expect("read");
    let at = find(&bytes, b"receipt-1").expect("the outcome is in the file");
    let mut bad = bytes.clone();
    bad[at] ^= 0x01;
    std::fs::write(fixture("v1-corrupt-row.redb"), bad).expect("write");
    Ok(())
}

/// The keys of `v1-runs.redb`: a batch of 300 16-byte ids in one scope
/// (one run), then three single inserts.
fn run_ids() -> Vec<String> {
    (0..300).map(|i| format!("batch-id-{i:07}")).collect()
}

#[test]
#[ignore = "regenerates tests/fixtures/v1-runs.redb; run on purpose after a deliberate format change"]
fn write_runs_fixture() -> Result<()> {
    let clock = ManualClock::new(T0);
    let path = fixture("v1-runs.redb");
    let _ = std::fs::remove_file(&path);
    let store = builder(&clock).open(&path)?;
    let ids = run_ids();
    let keys: Vec<Key<'_>> = ids.iter().map(|id| Key::new("shop", id)).collect();
    assert!(store.insert_batch(&keys)?.iter().all(|&new| new));
    for id in ["a", "b", "c"] {
        store.insert_if_absent(&Key::new("other", id))?;
    }
    Ok(())
}

/// The fuzzers' seed file (`fuzz/seed/store.redb`, see `fuzz/README.md`):
/// regenerate it with the fixtures when the format changes.
#[test]
#[ignore = "regenerates fuzz/seed/store.redb; run on purpose after a deliberate format change"]
fn write_fuzz_seed() -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seed/store.redb");
    let _ = std::fs::remove_file(&path);
    let clock = ManualClock::new(1_700_000_000_000);
    let open = || {
        Store::builder()
            .clock(clock.clone())
            .retention(Duration::from_secs(3_600))
            .open(&path)
    };
    {
        let store = open()?;
        for i in 0..8 {
            store.insert_if_absent(&Key::new("seed", &format!("evt-{i}")))?;
        }
        store.insert_batch(&[Key::new("other", "a"), Key::new("other", "b")])?;
        let start = |id: &str| match store.begin(&Key::new("seed", id), Fingerprint::of("p")) {
            Ok(Begin::Started(c)) => c,
            other => panic!("{id}: {other:?}"),
        };
        store.complete(&start("done"), b"outcome bytes")?;
        store.fail(&start("failed"), Failure::Permanent(b"declined"))?;
        store.fail(&start("retry"), Failure::Retryable)?;
        clock.advance(Duration::from_secs(90));
        let held = start("held");
        store.renew(&held)?;
        store.complete_value(&start("retry"), &("typed".to_string(), 42u32))?;
        store.insert_if_absent(&Key::new("seed", "later"))?;
        std::mem::forget(held); // still claimed at close
    }
    drop(open()?);
    Ok(())
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
