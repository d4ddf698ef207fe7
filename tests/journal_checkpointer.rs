//! The journal's background checkpointer (`StoreBuilder::journal`): a
//! writer appends to one half of the segment while the run in the other
//! half is being checkpointed into the store file, and a crash in the
//! middle of a checkpoint, at each of its steps, loses nothing
//! acknowledged and replays nothing twice.
//!
//! The store file's syncs are held (`FaultBackend::hold_syncs`): a
//! checkpoint is then in flight for as long as the test likes. A writer
//! that waited for it would never return: the writes that must not wait
//! run on a thread of their own ([`returns`]), and a test fails, instead
//! of hanging, if they have not returned after a generous bound (a
//! liveness bound, not a speed target).

use dedupkv::{Key, ManualClock, Result, State, Store};
use dedupkv_testkit::{FaultBackend, FaultFile};

/// 64 KiB: halves of 30 KiB after the 4 KiB header.
const BYTES: u64 = 64 << 10;
/// Where the second half starts (format 2: the header, then half the rest).
const MID: usize = 4096 + 30 * 1024;

fn open(db: &FaultBackend, j: &FaultFile) -> Result<Store> {
    Store::builder()
        .clock(ManualClock::new(1_700_000_000_000))
        .journal(Some(BYTES))
        .open_with_backends(db.clone(), j.clone())
}

/// A store on fresh media whose first commit (into the store file, with
/// the journal's mark) is done: the next ones go to the journal.
fn started() -> TestResult<(FaultBackend, FaultFile, Store)> {
    let (db, j) = (FaultBackend::new(), FaultFile::new());
    let store = open(&db, &j)?;
    assert!(store.insert_if_absent(&key("first"))?);
    Ok((db, j, store))
}

fn key(id: &str) -> Key<'_> {
    Key::new("c", id)
}

/// The epoch of the record at `at` in the journal `j` (0 if none).
fn epoch_at(j: &FaultFile, at: usize) -> std::io::Result<u64> {
    let seg = j.healthy().contents()?;
    Ok(seg
        .get(at + 8..at + 16)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default())))
}

/// Inserts `k0000`, `k0001`, ... from `next` until the writer has
/// started a run in the second half; the ids inserted.
fn fill_first_half(store: &Store, j: &FaultFile, next: &mut usize) -> TestResult<Vec<String>> {
    let mut ids = Vec::new();
    while epoch_at(j, MID)? == 0 {
        let id = format!("k{next:04}");
        assert!(store.insert_if_absent(&key(&id))?);
        ids.push(id);
        *next += 1;
        assert!(*next < 10_000, "the writer never switched halves");
    }
    Ok(ids)
}

type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Runs `work` on a thread of its own and returns its result, or fails
/// the test (after calling `unstick`, which lets a blocked writer go) if
/// it has not returned after two minutes: a writer that waits for a
/// checkpoint it should not wait for.
fn returns<T: Send + 'static>(
    what: &str,
    unstick: impl FnOnce(),
    work: impl FnOnce() -> TestResult<T> + Send + 'static,
) -> TestResult<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work().map_err(|e| e.to_string()));
    });
    let Ok(done) = rx.recv_timeout(std::time::Duration::from_secs(120)) else {
        unstick();
        panic!("{what}: still waiting after 120 s (a writer waited for a checkpoint)");
    };
    Ok(done?)
}

/// What a reopened store must show: every key of `live` inserted, every
/// key of `gone` forgotten (a record replayed twice, or out of order,
/// would bring one back).
fn assert_state(store: &Store, live: &[String], gone: &[String]) -> TestResult {
    for id in live {
        let state = store.get(&key(id))?.map(|r| r.state());
        assert_eq!(state, Some(State::Inserted), "acknowledged {id}");
    }
    for id in gone {
        let state = store.get(&key(id))?.map(|r| r.state());
        assert_eq!(state, Some(State::Forgotten), "forgotten {id}");
    }
    Ok(())
}

#[test]
fn writers_never_wait_while_a_checkpoint_has_room() -> TestResult {
    let (db, j) = (FaultBackend::new(), FaultFile::new());
    let store = open(&db, &j)?;
    assert!(store.insert_if_absent(&key("first"))?); // into the file, with the mark
    db.hold_syncs();
    let mut next = 0;
    let mut ids = fill_first_half(&store, &j, &mut next)?;
    // The first run is being checkpointed and its sync cannot finish:
    // the writer goes on in the second half, up to its end.
    let writer = store.clone();
    let more = returns(
        "100 inserts while a checkpoint is held",
        || db.release_syncs(),
        move || {
            let mut more = Vec::new();
            for n in next..next + 100 {
                let id = format!("k{n:04}");
                assert!(
                    writer.insert_if_absent(&key(&id))?,
                    "acknowledged while held"
                );
                more.push(id);
            }
            Ok(more)
        },
    )?;
    ids.extend(more);
    assert!(
        epoch_at(&j, MID)? > epoch_at(&j, 4096)?,
        "the second run is the later one"
    );
    db.release_syncs();
    assert_eq!(store.verify()?, ids.len() as u64 + 1);
    assert_eq!(j.len()?, BYTES, "the segment never grows");
    Ok(())
}

#[test]
fn a_crash_in_the_middle_of_a_checkpoint_loses_nothing_and_replays_nothing_twice() -> TestResult {
    let (db, j, store) = started()?;
    db.hold_syncs();
    let mut next = 0;
    let run1 = fill_first_half(&store, &j, &mut next)?;
    // In the second run: forget keys of the first (a replay of the first
    // run after the second would bring them back) and insert more.
    let gone: Vec<String> = run1.iter().step_by(3).cloned().collect();
    for id in &gone {
        store.forget(&key(id))?;
    }
    let live: Vec<String> = run1
        .iter()
        .filter(|id| !gone.contains(id))
        .cloned()
        .chain((0..20).map(|i| format!("late{i}")))
        .collect();
    for id in live.iter().filter(|id| id.starts_with("late")) {
        assert!(store.insert_if_absent(&key(id))?);
    }
    // Step 1: the checkpoint's commit written to the store file, not
    // durable (its sync is held): the mark is the one before it, and
    // both runs are replayed, in order.
    let (db1, j1) = (db.crash_image(), j.crash_image());
    // Step 2: the checkpoint durable, the mark with it, both runs still
    // in the segment (nothing recycled yet): neither is replayed.
    db.release_syncs();
    assert!(store.verify()? > 0, "every run in the store file");
    let (db2, j2) = (db.crash_image(), j.crash_image());
    let seg = j2.healthy().contents()?;
    assert!(
        seg[4096 + 8..4096 + 16] != [0; 8] && seg[MID + 8..MID + 16] != [0; 8],
        "both runs are still in the segment"
    );
    // Step 3: the halves recycled: a run written over the first one.
    let before = epoch_at(&j, 4096)?;
    let mut more = Vec::new();
    while epoch_at(&j, 4096)? == before {
        let id = format!("m{}", more.len());
        assert!(store.insert_if_absent(&key(&id))?);
        more.push(id);
        assert!(
            more.len() < 10_000,
            "the writer never came back to the first half"
        );
    }
    let (db3, j3) = (db.crash_image(), j.crash_image());
    drop(store);
    for (step, (d, jj)) in [(1, (db1, j1)), (2, (db2, j2))] {
        let reopened = open(&d, &jj)?;
        assert_state(&reopened, &live, &gone).map_err(|e| format!("step {step}: {e}"))?;
    }
    let reopened = open(&db3, &j3)?;
    assert_state(&reopened, &[live.clone(), more].concat(), &gone)
        .map_err(|e| format!("step 3: {e}"))?;
    Ok(())
}

#[test]
fn a_failed_background_checkpoint_poisons_and_loses_nothing_acknowledged() -> TestResult {
    let (db, j, store) = started()?;
    // The store file's next write fails: the first checkpoint's.
    db.arm(dedupkv_testkit::Plan::after(0));
    let mut next = 0;
    let mut acked = fill_first_half(&store, &j, &mut next)?;
    // The writer learns of it at its next commit, or at the latest when
    // its half is full and it waits for the checkpointer.
    let err = loop {
        let id = format!("k{next:04}");
        next += 1;
        match store.insert_if_absent(&key(&id)) {
            Ok(new) => {
                assert!(new);
                acked.push(id);
            }
            Err(e) => break e,
        }
        assert!(next < 10_000, "the failed checkpoint was never reported");
    };
    assert!(dedupkv_testkit::is_fault(&err), "{err:?}");
    let again = store.insert_if_absent(&key("later"));
    assert!(
        matches!(&again, Err(e) if dedupkv_testkit::is_fault(e)),
        "sticky: {again:?}"
    );
    db.disarm();
    let (db2, j2) = (db.crash_image(), j.crash_image());
    drop(store);
    let reopened = open(&db2, &j2)?;
    assert_state(&reopened, &acked, &[])?;
    assert!(reopened.get(&key("later"))?.is_none());
    assert!(reopened.insert_if_absent(&key("next"))?, "writable after");
    Ok(())
}

/// A panic of the storage engine inside a background checkpoint (redb
/// panics on some damage) is a failed checkpoint: the writers are told,
/// never left waiting for a job nobody finishes, and the store drops.
#[test]
fn a_panic_in_a_background_checkpoint_poisons_instead_of_hanging() -> TestResult {
    let (db, j, store) = started()?;
    db.arm(dedupkv_testkit::Plan::after(0).panics());
    let mut next = 0;
    let acked = fill_first_half(&store, &j, &mut next)?;
    let writer = store.clone();
    let err = returns(
        "commits after a checkpoint panicked",
        || {},
        move || {
            for n in next..next + 10_000 {
                if let Err(e) = writer.insert_if_absent(&key(&format!("k{n:04}"))) {
                    return Ok(e.to_string());
                }
            }
            Err("the panicked checkpoint was never reported".into())
        },
    )?;
    assert!(err.contains("panicked"), "{err}");
    db.disarm();
    returns(
        "dropping the store",
        || {},
        move || {
            drop(store);
            Ok(())
        },
    )?;
    let reopened = open(&db.crash_image(), &j.crash_image())?;
    assert_state(&reopened, &acked, &[])?;
    Ok(())
}

#[test]
fn the_checkpointer_stops_for_a_compaction_and_runs_again_after_it() -> TestResult {
    let dir = dedupkv_testkit::tempdir();
    let path = dir.path().join("s.redb");
    let builder = || {
        Store::builder()
            .clock(ManualClock::new(1_700_000_000_000))
            .journal(Some(BYTES))
    };
    let ids: Vec<String> = (0..1200).map(|i| format!("k{i:04}")).collect();
    {
        let store = builder().open(&path)?;
        for id in &ids[..600] {
            assert!(store.insert_if_absent(&key(id))?);
        }
        store.compact()?;
        // Several more switches: the checkpointer must be running again.
        let (writer, rest) = (store.clone(), ids[600..].to_vec());
        returns(
            "inserts after a compaction",
            || {},
            move || {
                for id in &rest {
                    assert!(writer.insert_if_absent(&key(id))?);
                }
                Ok(())
            },
        )?;
        assert_eq!(store.verify()?, ids.len() as u64);
    }
    let store = builder().open(&path)?;
    assert_state(&store, &ids, &[])?;
    Ok(())
}
