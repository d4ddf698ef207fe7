//! The journal in front of the store file (`StoreBuilder::journal`): a
//! round trip, reopens after a drop and after a crash without a
//! checkpoint, a torn last record at every 512-byte boundary, failed
//! writes and syncs, recycled segments, the read-only open, and damage.

use dedupkv::{Error, Key, ManualClock, Result, State, Store, StoreBuilder};
use dedupkv_testkit::{FaultBackend, FaultFile, Plan, is_fault};

/// A builder with a manual clock (records of the same shape have the same
/// length) and a journal of `bytes`.
/// A test's result: any error fails it.
type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

fn builder(bytes: u64) -> StoreBuilder {
    plain().journal(Some(bytes))
}

/// A builder without a journal (turned off: the default journal is on
/// for a new store, and an open with it off settles one it finds), on
/// the same clock (the keys' retention is measured on it).
fn plain() -> StoreBuilder {
    Store::builder()
        .clock(ManualClock::new(1_700_000_000_000))
        .journal(None)
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
        assert!(
            store.get(&key(id))?.is_some(),
            "acknowledged {id} is missing"
        );
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
        assert!(
            !store.insert_if_absent(&key("k7"))?,
            "a duplicate, from the overlay"
        );
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
    assert!(
        !journal.exists(),
        "an open without the journal settles and removes it"
    );
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

/// A store with `acked` keys inserted one commit each, on fresh bytes.
fn seeded(acked: &[String]) -> Result<(FaultBackend, FaultFile, Store)> {
    let (db, j) = (FaultBackend::new(), FaultFile::new());
    let store = open(&db, &j, 1 << 20)?;
    for id in acked {
        assert!(store.insert_if_absent(&key(id))?);
    }
    Ok((db, j, store))
}

#[test]
fn a_torn_last_record_at_every_512_byte_boundary_loses_only_itself() -> TestResult {
    let acked: Vec<String> = (0..20).map(|i| format!("a{i}")).collect();
    let batch_ids: Vec<String> = (0..300).map(|i| format!("batch-key-{i:04}")).collect();
    let batch: Vec<Key<'_>> = batch_ids.iter().map(|id| key(id)).collect();
    // The batch's record, written whole: its length.
    let (_db, j, store) = seeded(&acked)?;
    store.insert_batch(&batch)?;
    let len = last_record_len(&j.healthy().contents()?);
    drop(store);
    assert!(len > 4096, "a record of several blocks ({len} bytes)");
    let mut cuts = 0;
    for keep in (0..len).step_by(512) {
        let (db, j, store) = seeded(&acked)?;
        j.arm(Plan::after(0).torn(keep));
        let err = store.insert_batch(&batch).map(|_| ());
        assert!(matches!(&err, Err(e) if is_fault(e)), "{keep}: {err:?}");
        // The process dies with the torn bytes in the file.
        let (db2, j2) = (db.crash_image(), killed(&j)?);
        drop(store);
        let reopened = open(&db2, &j2, 1 << 20)?;
        assert_present(&reopened, &acked)?;
        for id in &batch_ids {
            assert!(
                reopened.get(&key(id))?.is_none(),
                "torn at {keep}: {id} of the unacknowledged batch is there"
            );
        }
        assert!(reopened.insert_if_absent(&key("next"))?, "writable after");
        cuts += 1;
    }
    assert!(cuts >= 8, "{cuts} cuts");
    Ok(())
}

#[test]
fn a_failed_journal_write_or_sync_acknowledges_nothing_and_poisons() -> TestResult {
    let acked: Vec<String> = (0..10).map(|i| format!("f{i}")).collect();
    for plan in [
        Plan::after(0),
        Plan::after(0).syncs_only(),
        Plan::after(0).disk_full(),
    ] {
        let (db, j, store) = seeded(&acked)?;
        j.arm(plan);
        let err = store.insert_if_absent(&key("failed"));
        assert!(matches!(&err, Err(e) if is_fault(e)), "{err:?}");
        j.disarm();
        let again = store.insert_if_absent(&key("later"));
        assert!(matches!(&again, Err(e) if is_fault(e)), "sticky: {again:?}");
        // The power fails: what was synced.
        let (db2, j2) = (db.crash_image(), j.crash_image());
        // The process dies: what was written.
        let (db3, j3) = (db.crash_image(), killed(&j)?);
        drop(store);
        let after_power_cut = open(&db2, &j2, 1 << 20)?;
        assert_present(&after_power_cut, &acked)?;
        assert!(
            after_power_cut.get(&key("failed"))?.is_none(),
            "never synced"
        );
        assert!(after_power_cut.get(&key("later"))?.is_none());
        drop(after_power_cut);
        let after_kill = open(&db3, &j3, 1 << 20)?;
        assert_present(&after_kill, &acked)?;
        assert!(after_kill.get(&key("later"))?.is_none());
        assert!(after_kill.insert_if_absent(&key("next"))?, "writable after");
    }
    Ok(())
}

#[test]
fn recycled_segments_never_replay_their_stale_tail() -> TestResult {
    // 8 KiB segments: a checkpoint every few dozen commits.
    let (db, j) = (FaultBackend::new(), FaultFile::new());
    let store = open(&db, &j, 8192)?;
    let mut ids = Vec::new();
    for i in 0..400 {
        let id = format!("r{i}");
        assert!(store.insert_if_absent(&key(&id))?);
        ids.push(id);
        // Forgotten keys stay forgotten: a stale record replayed would
        // bring one back.
        if i % 7 == 0 {
            store.forget(&key(&ids[i / 2]))?;
        }
    }
    assert_eq!(j.len()?, 8192, "the segment never grows");
    let states = |s: &Store| -> Result<Vec<Option<State>>> {
        ids.iter()
            .map(|id| Ok(s.get(&key(id))?.map(|r| r.state())))
            .collect()
    };
    let want = states(&store)?;
    assert!(
        want.contains(&Some(State::Forgotten)),
        "some keys were forgotten"
    );
    let (db2, j2) = (db.crash_image(), j.crash_image());
    drop(store);
    let reopened = open(&db2, &j2, 8192)?;
    let got = states(&reopened)?;
    assert_eq!(got, want, "the same keys, forgotten ones included");
    Ok(())
}

#[test]
fn a_damaged_or_missing_journal_is_an_error_naming_it() -> TestResult {
    let dir = dedupkv_testkit::tempdir();
    let path = dir.path().join("s.redb");
    let journal = dir.path().join("s.redb.journal");
    builder(1 << 16).open(&path)?.insert_if_absent(&key("x"))?;
    let good = std::fs::read(&journal)?;
    let mut flipped = good.clone();
    flipped[20] ^= 0x40; // the segment length in the header
    let cases: [(&str, Option<Vec<u8>>); 4] = [
        ("a damaged header", Some(flipped)),
        ("a cut segment", Some(good[..5000].to_vec())),
        ("a header only", Some(good[..100].to_vec())),
        ("no journal", None),
    ];
    for (what, bytes) in cases {
        match &bytes {
            Some(b) => std::fs::write(&journal, b)?,
            None => std::fs::remove_file(&journal)?,
        }
        for b in [builder(1 << 16), plain()] {
            let err = b.open(&path).map(|_| ());
            assert!(
                matches!(&err, Err(Error::Corrupt(m)) if m.contains("s.redb.journal")),
                "{what}: {err:?}"
            );
        }
        let err = Store::open_read_only(&path).map(|_| ());
        assert!(
            matches!(&err, Err(Error::Corrupt(m)) if m.contains("s.redb.journal")),
            "{what}, read-only: {err:?}"
        );
    }
    std::fs::write(&journal, &good)?;
    assert!(plain().open(&path)?.get(&key("x"))?.is_some(), "repaired");
    Ok(())
}

/// A segment cut while it was first made (a crash or a full disk after
/// its length was set and before its header was written) held no record:
/// the store has no journal mark yet, since the mark comes with the first
/// commit after the segment was whole. Every open goes on (the writable
/// one with a journal makes it again), none refuses the store.
#[test]
fn a_segment_cut_while_it_was_made_is_made_again_not_refused() -> TestResult {
    let dir = dedupkv_testkit::tempdir();
    let path = dir.path().join("s.redb");
    let journal = dir.path().join("s.redb.journal");
    plain().open(&path)?.insert_if_absent(&key("before"))?;
    let cut = vec![0u8; 1 << 16]; // the length set, no header yet
    std::fs::write(&journal, &cut)?;
    let ro = plain().open_read_only(&path)?;
    assert!(ro.get(&key("before"))?.is_some());
    drop(ro);
    assert_eq!(std::fs::read(&journal)?, cut, "a read-only open wrote");
    // No journal wanted: the store opens as it is.
    assert!(plain().open(&path)?.get(&key("before"))?.is_some());
    std::fs::write(&journal, &cut)?;
    {
        let store = builder(1 << 16).open(&path)?;
        for i in 0..50 {
            assert!(store.insert_if_absent(&key(&format!("k{i}")))?);
        }
    }
    let store = builder(1 << 16).open(&path)?;
    assert!(store.get(&key("before"))?.is_some());
    assert!(store.get(&key("k49"))?.is_some());
    drop(store);
    // Once the store holds a mark, the same bytes are damage again.
    std::fs::write(&journal, &cut)?;
    let err = builder(1 << 16).open(&path).map(|_| ());
    assert!(
        matches!(&err, Err(Error::Corrupt(m)) if m.contains("s.redb.journal")),
        "a store with a mark still refuses a damaged journal: {err:?}"
    );
    Ok(())
}

#[test]
fn a_read_only_open_replays_the_journal_in_memory_and_writes_nothing() -> TestResult {
    let dir = dedupkv_testkit::tempdir();
    let path = dir.path().join("s.redb");
    let journal = dir.path().join("s.redb.journal");
    let store = builder(1 << 20).open(&path)?;
    let ids: Vec<String> = (0..30).map(|i| format!("ro{i}")).collect();
    for id in &ids {
        assert!(store.insert_if_absent(&key(id))?);
    }
    // The writer stays open, without a checkpoint: its commits are in the
    // journal only.
    let before = (std::fs::read(&path)?, std::fs::read(&journal)?);
    let reader = plain().open_read_only(&path)?;
    assert_present(&reader, &ids)?;
    drop(reader);
    let after = (std::fs::read(&path)?, std::fs::read(&journal)?);
    assert!(before == after, "the read-only open wrote to a file");
    drop(store);
    Ok(())
}

#[test]
fn eviction_through_the_journal_is_replayed_after_a_crash() -> TestResult {
    const MIN: std::time::Duration = std::time::Duration::from_secs(60);
    let clock = ManualClock::new(dedupkv_testkit::T0);
    let b = || {
        dedupkv_testkit::builder(&clock)
            .retention(10 * MIN)
            .bucket_granularity(MIN)
            .journal(Some(1 << 20))
    };
    let (db, j) = (FaultBackend::new(), FaultFile::new());
    let store = b().open_with_backends(db.clone(), j.clone())?;
    let old: Vec<String> = (0..50).map(|i| format!("old{i}")).collect();
    let new: Vec<String> = (0..50).map(|i| format!("new{i}")).collect();
    for id in &old {
        assert!(store.insert_if_absent(&key(id))?);
    }
    clock.advance(15 * MIN);
    for id in &new {
        assert!(store.insert_if_absent(&key(id))?);
    }
    assert!(store.evict_expired()?.keys > 0, "the old bucket expired");
    // A key committed after the eviction, into the journal only.
    assert!(store.insert_if_absent(&key("last"))?);
    let (db2, j2) = (db.crash_image(), j.crash_image());
    drop(store);
    let reopened = b().open_with_backends(db2, j2)?;
    assert_present(&reopened, &new)?;
    assert!(reopened.get(&key("last"))?.is_some());
    for id in &old {
        assert!(reopened.get(&key(id))?.is_none(), "{id} came back");
    }
    Ok(())
}

/// The epoch of the first record of a journal segment.
fn first_epoch(seg: &[u8]) -> u64 {
    u64::from_le_bytes(seg[4096 + 8..4096 + 16].try_into().expect("8 bytes"))
}

#[test]
fn a_journal_left_behind_by_a_settle_is_never_read_as_the_new_ones() -> TestResult {
    let (dir, copy) = (dedupkv_testkit::tempdir(), dedupkv_testkit::tempdir());
    let store = builder(1 << 16).open(dir.path().join("s.redb"))?;
    for id in ["a", "b", "c"] {
        assert!(store.insert_if_absent(&key(id))?);
    }
    // Its commits are in the journal only; the copy is what a crash leaves.
    for name in ["s.redb", "s.redb.journal"] {
        std::fs::copy(dir.path().join(name), copy.path().join(name))?;
    }
    drop(store);
    let (path, journal) = (
        copy.path().join("s.redb"),
        copy.path().join("s.redb.journal"),
    );
    let left = std::fs::read(&journal)?;
    // Opened without the journal: settled into the file, then the open
    // "crashes" before the file is removed (put back).
    drop(plain().open(&path)?);
    assert!(!journal.exists());
    std::fs::write(&journal, &left)?;
    let store = builder(1 << 16).open(&path)?;
    assert!(store.insert_if_absent(&key("d"))?);
    let now = std::fs::read(&journal)?;
    assert_ne!(
        first_epoch(&now),
        first_epoch(&left),
        "the new records must not share the left-behind ones' epoch"
    );
    drop(store);
    let store = builder(1 << 16).open(&path)?;
    assert_present(&store, &["a", "b", "c", "d"].map(String::from))?;
    Ok(())
}

/// A copy of the committed journal fixture (`tests/fixtures/v5-journal.*`:
/// a format-5 store written by this build with an 8 KiB journal, 5
/// `insert_if_absent` and 3 `begin` + `complete` at `T0`, its process gone
/// before any checkpoint, so its 12 records after the first commit are in
/// the journal only).
fn journal_fixture() -> std::io::Result<(tempfile::TempDir, std::path::PathBuf)> {
    let dir = dedupkv_testkit::tempdir();
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for name in ["v5-journal.redb", "v5-journal.redb.journal"] {
        std::fs::copy(from.join(name), dir.path().join(name))?;
    }
    let path = dir.path().join("v5-journal.redb");
    Ok((dir, path))
}

fn fixture_builder() -> StoreBuilder {
    Store::builder()
        .clock(ManualClock::new(1_700_000_040_000))
        .background_eviction(false)
        .compact_when_free(None)
}

fn assert_fixture_keys(store: &Store) -> TestResult {
    for i in 0..5 {
        let rec = store.get(&Key::new("fx", &format!("ins-{i}")))?;
        assert_eq!(rec.map(|r| r.state()), Some(State::Inserted), "ins-{i}");
    }
    for i in 0..3 {
        let id = format!("op-{i}");
        let rec = store.get(&Key::new("fx", &id))?.ok_or("missing")?;
        assert_eq!(
            rec.outcome(),
            Some(format!("outcome-{i}").as_bytes()),
            "{id}"
        );
    }
    Ok(())
}

#[test]
fn the_committed_journal_fixture_reads_as_journal_format_1() -> TestResult {
    let (_dir, path) = journal_fixture()?;
    let seg = std::fs::read(path.with_file_name("v5-journal.redb.journal"))?;
    assert_eq!(&seg[..8], b"dkvjrnl\x01", "magic");
    assert_eq!(seg[8..12], 1u32.to_le_bytes(), "journal format 1");
    assert_eq!(seg[16..24], 8192u64.to_le_bytes(), "the segment's length");
    assert_eq!(seg.len(), 8192);
    assert_eq!(
        seg[4096 + 16..4096 + 24],
        1u64.to_le_bytes(),
        "sequence 1 first"
    );
    // Read only: replayed in memory, nothing written.
    let reader = fixture_builder().open_read_only(&path)?;
    assert_fixture_keys(&reader)?;
    drop(reader);
    assert_eq!(
        std::fs::read(path.with_file_name("v5-journal.redb.journal"))?,
        seg
    );
    // Writable, with the journal: replayed into the file, and the header
    // upgraded to format 2 (an older build refuses the segment then).
    let store = fixture_builder().journal(Some(8192)).open(&path)?;
    assert_fixture_keys(&store)?;
    drop(store);
    let upgraded = std::fs::read(path.with_file_name("v5-journal.redb.journal"))?;
    assert_eq!(upgraded[8..12], 2u32.to_le_bytes(), "journal format 2");
    // Without it: settled, and the journal removed.
    let store = fixture_builder().journal(None).open(&path)?;
    assert_fixture_keys(&store)?;
    assert!(!path.with_file_name("v5-journal.redb.journal").exists());
    Ok(())
}
