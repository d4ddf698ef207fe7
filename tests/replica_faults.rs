//! The replica under faults: failed and slow uploads, a graceful close
//! that ships the tail, a crash with the disk (the tail shipped at the
//! next open).

mod replica_kit;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{Key, Store};
use replica_kit::{Bucket, Faulty, TestResult};

fn replica(objects: Arc<dyn dedupkv::replica::object_store::ObjectStore>, b: &Bucket) -> Replica {
    Replica::new(objects, &b.at("s"))
}

/// Waits (without a time bound) until `f` holds.
fn until(mut f: impl FnMut() -> bool) {
    while !f() {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_synchronous_write_is_acknowledged_only_once_its_failing_upload_succeeds() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let faulty = Faulty::new(Arc::clone(&b.objects));
    let r = replica(faulty.clone(), &b).mode(ReplicaMode::Synchronous);
    let store = Store::builder()
        .replica(r.clone())
        .open(dir.path().join("a.redb"))?;
    faulty.hold_puts.store(true, Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let s = store.clone();
    let writer = std::thread::spawn(move || {
        let _ = tx.send(s.insert_if_absent(&Key::new("t", "held")));
    });
    until(|| {
        store
            .replica_status()
            .is_some_and(|st| st.upload_failures >= 3)
    });
    assert!(
        rx.try_recv().is_err(),
        "acknowledged while every upload failed"
    );
    assert!(
        store
            .replica_status()
            .is_some_and(|st| st.last_error.is_some())
    );
    faulty.hold_puts.store(false, Ordering::SeqCst);
    assert!(rx.recv()??);
    writer.join().expect("writer");
    drop(store);
    let other = Store::builder()
        .replica(r)
        .open(dir.path().join("b.redb"))?;
    assert!(!other.insert_if_absent(&Key::new("t", "held"))?);
    Ok(())
}

#[test]
fn an_asynchronous_replica_that_falls_behind_slows_writers_instead_of_queueing() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let faulty = Faulty::new(Arc::clone(&b.objects));
    let r = replica(faulty.clone(), &b).max_lag_bytes(4 << 10);
    let store = Store::builder()
        .replica(r.clone())
        .open(dir.path().join("a.redb"))?;
    store.sync_replica()?;
    faulty.hold_puts.store(true, Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let s = store.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..1_000 {
            let id = format!("k{i:04}");
            if s.insert_if_absent(&Key::new("t", &id)).is_err() {
                break;
            }
            let _ = tx.send(i);
        }
    });
    // The queue fills to its bound, and then the writer waits.
    until(|| {
        store
            .replica_status()
            .is_some_and(|st| st.lag_bytes >= 4 << 10)
    });
    let seen = faulty.failed.load(Ordering::SeqCst);
    until(|| faulty.failed.load(Ordering::SeqCst) >= seen + 3);
    let done_while_held = rx.try_iter().count();
    assert!(
        done_while_held < 1_000,
        "the writer ran on with the replica stuck"
    );
    let lag = store.replica_status().map_or(0, |st| st.lag_bytes);
    assert!(lag < 8 << 10, "the queue stays near its bound: {lag}");
    faulty.hold_puts.store(false, Ordering::SeqCst);
    writer.join().expect("writer");
    assert_eq!(rx.try_iter().count() + done_while_held, 1_000);
    drop(store);
    let other = Store::builder()
        .replica(r)
        .open(dir.path().join("b.redb"))?;
    assert!(!other.insert_if_absent(&Key::new("t", "k0999"))?);
    Ok(())
}

#[test]
fn slow_uploads_merge_concurrent_synchronous_commits() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let faulty = Faulty::new(Arc::clone(&b.objects));
    let r = replica(faulty.clone(), &b).mode(ReplicaMode::Synchronous);
    let store = Store::builder()
        .replica(r)
        .open(dir.path().join("a.redb"))?;
    faulty.delay_ms.store(20, Ordering::SeqCst);
    let puts = faulty.puts.load(Ordering::SeqCst);
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let s = store.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    let id = format!("w{w}-{i}");
                    assert!(s.insert_if_absent(&Key::new("t", &id)).expect("insert"));
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    let uploads = faulty.puts.load(Ordering::SeqCst) - puts;
    assert!(uploads < 80, "80 commits shared uploads: {uploads}");
    Ok(())
}

#[test]
fn a_graceful_close_ships_the_asynchronous_tail() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let r = replica(Arc::clone(&b.objects), &b).segment_interval(Duration::from_secs(3600));
    {
        let s = Store::builder()
            .replica(r.clone())
            .open(dir.path().join("a.redb"))?;
        for i in 0..100 {
            assert!(s.insert_if_absent(&Key::new("t", &format!("k{i}")))?);
        }
    } // closing waits for the uploader
    let s = Store::builder()
        .replica(r.clone())
        .open(dir.path().join("b.redb"))?;
    for i in 0..100 {
        assert!(!s.insert_if_absent(&Key::new("t", &format!("k{i}")))?);
    }
    drop(s);
    // Reopened on a file closed cleanly: no restore, no new snapshot.
    let snaps = b.objects.clone();
    let _ = snaps;
    let s = Store::builder()
        .replica(r)
        .open(dir.path().join("b.redb"))?;
    let st = s.replica_status().expect("status");
    assert!(st.restored.is_none());
    s.sync_replica()?;
    assert_eq!(
        s.replica_status().expect("status").snapshots,
        0,
        "the chain goes on as it was"
    );
    Ok(())
}
