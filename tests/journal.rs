//! The journal in front of the store file (`StoreBuilder::journal`): a
//! round trip, reopens after a drop and after a crash without a
//! checkpoint, a torn last record at every 512-byte boundary, failed
//! writes and syncs, recycled segments, the read-only open, and damage.

use dedupkv::{Error, Key, ManualClock, Result, Store, StoreBuilder};
use dedupkv_testkit::{FaultBackend, FaultFile, Plan, is_fault};

/// A builder with a manual clock (records of the same shape have the same
/// length) and a journal of `bytes`.
/// A test's result: any error fails it.
type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

fn builder(bytes: u64) -> StoreBuilder {
    plain().journal(Some(bytes))
}

/// A builder without a journal, on the same clock (the keys' retention
/// is measured on it).
fn plain() -> StoreBuilder {
    Store::builder().clock(ManualClock::new(1_700_000_000_000))
}

fn open(db: &FaultBackend, journal: &FaultFile, bytes: u64) -> Result<Store> {
    builder(bytes).open_with_backends(db.clone(), journal.clone())
}

fn key(id: &str) -> Key<'_> {
    Key::new("j", id)
}

/// A copy of what was written to `f` (synced or not): what a process
/// killed now leaves in the file.
fn killed(f: &FaultFile) -> std::io::Result<FaultFile> {
    let copy = FaultFile::new();
    copy.append(&f.healthy().contents()?)?;
    copy.sync()?;
    Ok(copy)
}

/// The length of the last record in a segment that was never recycled.
fn last_record_len(seg: &[u8]) -> usize {
    let (mut at, mut last) = (4096, 0);
    while at + 32 <= seg.len() {
        let len = u32::from_le_bytes(seg[at..at + 4].try_into().expect("4 bytes")) as usize;
        if seg[at..at + 32].iter().all(|b| *b == 0) {
            break;
        }
        last = 32 + len;
        at += last;
    }
    last
}

fn assert_present(store: &Store, ids: &[String]) -> Result<()> {
    for id in ids {
        assert!(store.get(&key(id))?.is_some(), "acknowledged {id} is missing");
    }
    Ok(())
}

#[test]
fn keys_round_trip_and_survive_a_reopen_and_switching_the_journal_off() -> TestResult {
    let dir = dedupkv_testkit::tempdir();
    let path = dir.path().join("s.redb");
    let ids: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    {
        let store = builder(1 << 20).open(&path)?;
        for id in &ids {
            assert!(store.insert_if_absent(&key(id))?);
        }
        assert!(!store.insert_if_absent(&key("k7"))?, "a duplicate, from the overlay");
        assert_present(&store, &ids)?;
    }
    let journal = dir.path().join("s.redb.journal");
    assert_eq!(std::fs::metadata(&journal)?.len(), 1 << 20, "preallocated");
    {
        let store = builder(1 << 20).open(&path)?;
        assert_present(&store, &ids)?;
        assert!(!store.insert_if_absent(&key("k99"))?);
        assert!(store.insert_if_absent(&key("after"))?);
    }
    // Off: the journal is moved into the file and removed.
    let store = plain().open(&path)?;
    assert_present(&store, &ids)?;
    assert!(store.get(&key("after"))?.is_some());
    assert!(!journal.exists(), "an open without the journal settles and removes it");
    Ok(())
}

#[test]
fn a_crash_without_a_checkpoint_replays_the_journal() -> TestResult {
    let (db, j) = (FaultBackend::new(), FaultFile::new());
    let store = open(&db, &j, 1 << 20)?;
    let ids: Vec<String> = (0..50).map(|i| format!("c{i}")).collect();
    for id in &ids {
        assert!(store.insert_if_absent(&key(id))?);
    }
    // The power fails: only synced bytes, and no checkpoint since the
    // store's first commit.
    let (db_a, db_b, j2) = (db.crash_image(), db.crash_image(), j.crash_image());
    drop(store);
    let reopened = open(&db_a, &j2, 1 << 20)?;
    assert_present(&reopened, &ids)?;
    // The same store file without its journal is refused, not opened smaller.
    let err = open(&db_b, &FaultFile::new(), 1 << 20).map(|_| ());
    assert!(
        matches!(&err, Err(Error::Corrupt(m)) if m.contains("journal")),
        "{err:?}"
    );
    Ok(())
}

