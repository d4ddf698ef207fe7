//! Taking ownership of a replica when the object store or the open
//! misbehaves: an open that fails (or whose write lands but is answered
//! with an error) at any step loses nothing the file acknowledged; a lost
//! response to a landed upload does not fence its own owner; epochs stay
//! above every epoch the replica shows when owner objects are deleted; a
//! replica that is not provably empty is never taken for an empty one; a
//! damaged local file is an error naming it, never a panic.

mod replica_kit;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dedupkv::replica::object_store::{
    ObjectStore, ObjectStoreExt, PutPayload, path::Path as ObjPath,
};
use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{Error, Key, Store};
use replica_kit::{Bucket, Faulty, TestResult};

fn key(i: usize) -> Key<'static> {
    Key::owned(b"t".to_vec(), format!("k{i}").into_bytes())
}

/// Every key `0..n` is in `store` (a duplicate), counted.
fn missing(store: &Store, n: usize) -> dedupkv::Result<usize> {
    let mut missing = 0;
    for i in 0..n {
        if store.get(&key(i))?.is_none() {
            missing += 1;
        }
    }
    Ok(missing)
}

/// An owner that acknowledged `n` keys, shipped only the first, and then
/// died with the rest in its file only (its object store went down and
/// its close gave up): what an asynchronous replica's crash leaves.
fn owner_with_unshipped_tail(b: &Bucket, path: &Path, n: usize) -> TestResult {
    let down = Faulty::new(Arc::clone(&b.objects));
    let store = Store::builder()
        .replica(
            Replica::new(down.clone(), &b.at("s"))
                .segment_interval(Duration::from_secs(3600))
                .close_timeout(Duration::from_millis(10)),
        )
        .open(path)?;
    store.insert_if_absent(&key(0))?;
    store.sync_replica()?;
    for i in 1..n {
        assert!(store.insert_if_absent(&key(i))?);
    }
    down.hold_puts.store(true, Ordering::SeqCst);
    drop(store);
    Ok(())
}

fn objects_under(b: &Bucket, dir: &str) -> TestResult<Vec<ObjPath>> {
    let at = ObjPath::from(format!("{}/{dir}", b.at("s")));
    let listed: Vec<_> = futures_executor(b.objects.list(Some(&at)))?;
    Ok(listed)
}

/// Collects a listing on a small runtime of the test's own.
fn futures_executor(
    s: futures_util::stream::BoxStream<
        'static,
        dedupkv::replica::object_store::Result<dedupkv::replica::object_store::ObjectMeta>,
    >,
) -> TestResult<Vec<ObjPath>> {
    use futures_util::StreamExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let metas: Vec<_> = rt.block_on(s.collect::<Vec<_>>());
    let mut out = Vec::new();
    for m in metas {
        out.push(m?.location);
    }
    Ok(out)
}

fn run<T>(f: impl std::future::Future<Output = T>) -> TestResult<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(rt.block_on(f))
}

#[test]
fn a_reopen_that_fails_at_any_step_loses_no_acknowledged_key() -> TestResult {
    const N: usize = 200;
    let mut steps = 0;
    for after_write in [false, true] {
        for k in 1.. {
            let b = Bucket::new();
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("s.redb");
            owner_with_unshipped_tail(&b, &path, N)?;
            let faulty = Faulty::new(Arc::clone(&b.objects));
            faulty.fail_call.store(k, Ordering::SeqCst);
            faulty
                .fail_call_after_write
                .store(after_write, Ordering::SeqCst);
            let failed = Store::builder()
                .replica(Replica::new(faulty.clone(), &b.at("s")))
                .open(&path);
            let reached = faulty.calls.load(Ordering::SeqCst) >= k;
            drop(failed);
            // Opened again as the owner would be after its restart.
            let store = Store::builder()
                .replica(Replica::new(Arc::clone(&b.objects), &b.at("s")))
                .open(&path)?;
            assert_eq!(
                missing(&store, N)?,
                0,
                "call {k} failed (landed first: {after_write}); reopened with {:?}",
                store.replica_status().and_then(|s| s.restored)
            );
            // And on another disk, from the replica alone.
            store.sync_replica()?;
            drop(store);
            let other = Store::builder()
                .replica(Replica::new(Arc::clone(&b.objects), &b.at("s")))
                .open(dir.path().join("other.redb"))?;
            assert_eq!(missing(&other, N)?, 0, "call {k}: the replica");
            if !reached {
                break;
            }
            steps += 1;
        }
    }
    assert!(steps >= 8, "every step of an open was failed once: {steps}");
    Ok(())
}

#[test]
fn a_lost_response_to_a_landed_upload_does_not_fence_its_owner() -> TestResult {
    for mode in [ReplicaMode::Asynchronous, ReplicaMode::Synchronous] {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let faulty = Faulty::new(Arc::clone(&b.objects));
        let store = Store::builder()
            .replica(
                Replica::new(faulty.clone(), &b.at("s"))
                    .mode(mode)
                    .segment_interval(Duration::from_millis(5)),
            )
            .open(dir.path().join("a.redb"))?;
        for i in 0..10 {
            store.insert_if_absent(&key(i))?;
        }
        store.sync_replica()?;
        // The next upload lands, is answered with an error, and the
        // store goes down until more commits have queued behind it.
        faulty.hold_after_lost.store(true, Ordering::SeqCst);
        faulty.lose_responses.store(1, Ordering::SeqCst);
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || -> dedupkv::Result<()> {
                for i in 10..60 {
                    store.insert_if_absent(&key(i))?;
                }
                Ok(())
            })
        };
        let t0 = std::time::Instant::now();
        while faulty.failed.load(Ordering::SeqCst) == 0 {
            assert!(t0.elapsed() < Duration::from_secs(60), "no upload was lost");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Asynchronously the writer finishes during the outage (its
        // commits queue behind the lost upload); synchronously it waits.
        let writer = if mode == ReplicaMode::Asynchronous {
            writer.join().expect("writer")?;
            None
        } else {
            Some(writer)
        };
        faulty.hold_puts.store(false, Ordering::SeqCst);
        if let Some(w) = writer {
            w.join().expect("writer")?;
        }
        store.sync_replica()?;
        assert!(
            store.insert_if_absent(&key(60))?,
            "{mode:?}: still the owner"
        );
        let status = store.replica_status().expect("status");
        assert!(!status.fenced, "{mode:?}: {status:?}");
        store.sync_replica()?;
        drop(store);
        let other = Store::builder()
            .replica(Replica::new(Arc::clone(&b.objects), &b.at("s")))
            .open(dir.path().join("b.redb"))?;
        assert_eq!(missing(&other, 61)?, 0, "{mode:?}");
    }
    Ok(())
}

#[test]
fn a_lost_response_to_a_landed_reset_segment_does_not_fence_its_owner() -> TestResult {
    for mode in [ReplicaMode::Asynchronous, ReplicaMode::Synchronous] {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let faulty = Faulty::new(Arc::clone(&b.objects));
        // The fence is segment 0; the first commit's snapshot is 1, and
        // its RESET segment lands with its answer lost.
        *faulty.lose_response_to.lock().expect("lock") = Some("seg/00000000000000000001".into());
        let store = Store::builder()
            .replica(Replica::new(faulty.clone(), &b.at("s")).mode(mode))
            .open(dir.path().join("a.redb"))?;
        for i in 0..20 {
            store.insert_if_absent(&key(i))?;
        }
        store.sync_replica()?;
        assert_eq!(
            faulty.failed.load(Ordering::SeqCst),
            1,
            "{mode:?}: the answer was lost"
        );
        assert!(!store.replica_status().expect("status").fenced, "{mode:?}");
        drop(store);
        let other = Store::builder()
            .replica(Replica::new(Arc::clone(&b.objects), &b.at("s")))
            .open(dir.path().join("b.redb"))?;
        assert_eq!(missing(&other, 20)?, 0, "{mode:?}");
    }
    Ok(())
}

#[test]
fn lone_synchronous_commits_are_snapshotted_by_count_so_a_restore_reads_few_objects() -> TestResult
{
    const N: usize = 1_200;
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let replica =
        || Replica::new(Arc::clone(&b.objects), &b.at("s")).mode(ReplicaMode::Synchronous);
    let store = Store::builder()
        .replica(replica())
        .open(dir.path().join("a.redb"))?;
    for i in 0..N {
        // One commit, one segment each.
        store.insert_if_absent(&key(i))?;
    }
    let snapshots = store.replica_status().expect("status").snapshots;
    drop(store);
    let other = Store::builder()
        .replica(replica())
        .open(dir.path().join("b.redb"))?;
    let restored = other
        .replica_status()
        .and_then(|s| s.restored)
        .expect("restored");
    assert!(snapshots >= 3, "a snapshot every 256 segments: {snapshots}");
    // At most the segments of two snapshot periods (one may still be
    // written while the next segments ship).
    assert!(restored.segments <= 512, "{restored:?}");
    assert_eq!(missing(&other, N)?, 0);
    Ok(())
}

#[test]
fn an_open_that_lists_a_segment_a_live_owner_prunes_meanwhile_lists_again() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let live = Store::builder()
        .replica(
            Replica::new(Arc::clone(&b.objects), &b.at("s"))
                .mode(ReplicaMode::Synchronous)
                .snapshot_after_bytes(1),
        )
        .open(dir.path().join("a.redb"))?;
    for i in 0..5 {
        live.insert_if_absent(&key(i))?;
    }
    // The new owner lists the prefix, then is held at the read of the
    // newest segment it listed until the live owner has pruned it (a
    // snapshot after every segment prunes the ones before it).
    let watch = Faulty::new(Arc::clone(&b.objects));
    let (gate, reached, open) = replica_kit::Gate::new("/seg/");
    *watch.gate.lock().expect("gate") = Some(gate);
    let opening = {
        let r = Replica::new(watch.clone(), &b.at("s")).mode(ReplicaMode::Synchronous);
        let path = dir.path().join("b.redb");
        std::thread::spawn(move || Store::builder().replica(r).open(path))
    };
    let held = reached.recv_timeout(Duration::from_secs(60))?;
    let held = ObjPath::from(held);
    let mut n = 5;
    let t0 = std::time::Instant::now();
    while run(b.objects.head(&held))?.is_ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{held} was never pruned"
        );
        live.insert_if_absent(&key(n))?;
        n += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    open.notify_one();
    let new_owner = opening.join().expect("opening")?;
    assert_eq!(missing(&new_owner, n)?, 0);
    assert!(matches!(
        live.insert_if_absent(&key(n)),
        Err(Error::Fenced(_))
    ));
    Ok(())
}

fn delete_owners(b: &Bucket, only_newest: bool) -> TestResult {
    let mut owners = objects_under(b, "owner")?;
    owners.sort_by(|x, y| x.as_ref().cmp(y.as_ref()));
    if only_newest {
        owners = owners.split_off(owners.len() - 1);
    }
    for o in owners {
        run(b.objects.delete(&o))??;
    }
    Ok(())
}

#[test]
fn epochs_stay_above_every_epoch_the_replica_shows_when_owner_objects_are_deleted() -> TestResult {
    // All of owner/ emptied (a lifecycle rule): the next owner still takes
    // an epoch above the segments', and the replica restores after it.
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let replica =
        || Replica::new(Arc::clone(&b.objects), &b.at("s")).mode(ReplicaMode::Synchronous);
    for round in 0..4 {
        let store = Store::builder()
            .replica(replica())
            .open(dir.path().join("a.redb"))?;
        store.insert_if_absent(&key(round))?;
    }
    delete_owners(&b, false)?;
    let store = Store::builder()
        .replica(replica())
        .open(dir.path().join("a.redb"))?;
    assert!(store.replica_status().expect("status").epoch > 4);
    store.insert_if_absent(&key(4))?;
    drop(store);
    let other = Store::builder()
        .replica(replica())
        .open(dir.path().join("b.redb"))?;
    assert_eq!(missing(&other, 5)?, 0);
    drop(other);

    // Only the live owner's object deleted: a second owner takes a new
    // epoch (not the live one's), fences it, and what the first
    // acknowledged survives its disk's return.
    let b = Bucket::new();
    let replica =
        || Replica::new(Arc::clone(&b.objects), &b.at("s")).mode(ReplicaMode::Synchronous);
    let first = Store::builder()
        .replica(replica())
        .open(dir.path().join("c.redb"))?;
    for i in 0..5 {
        first.insert_if_absent(&key(i))?;
    }
    let live = first.replica_status().expect("status").epoch;
    delete_owners(&b, true)?;
    let second = Store::builder()
        .replica(replica())
        .open(dir.path().join("d.redb"))?;
    assert!(second.replica_status().expect("status").epoch > live);
    assert!(matches!(
        first.insert_if_absent(&key(9)),
        Err(Error::Fenced(_))
    ));
    assert_eq!(missing(&second, 5)?, 0);
    drop((first, second));
    let back = Store::builder()
        .replica(replica())
        .open(dir.path().join("c.redb"))?;
    assert_eq!(missing(&back, 5)?, 0, "the old disk returns");
    Ok(())
}

#[test]
fn a_replica_holding_objects_of_no_replica_is_refused_by_name() -> TestResult {
    // Another store's prefix nested inside this one's segments: this
    // replica has no segment of its own, yet it is not empty.
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let nested = Store::builder()
        .replica(
            Replica::new(Arc::clone(&b.objects), &b.at("s/seg/nested"))
                .mode(ReplicaMode::Synchronous),
        )
        .open(dir.path().join("nested.redb"))?;
    nested.insert_if_absent(&key(0))?;
    drop(nested);
    let err = Store::builder()
        .replica(Replica::new(Arc::clone(&b.objects), &b.at("s")))
        .open(dir.path().join("s.redb"))
        .expect_err("not an empty replica");
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains("seg/nested")),
        "{err}"
    );
    assert!(!dir.path().join("s.redb").exists());
    // A stray object beside the segments of a replica in use.
    let b = Bucket::new();
    drop(
        Store::builder()
            .replica(Replica::new(Arc::clone(&b.objects), &b.at("s")))
            .open(dir.path().join("t.redb"))?,
    );
    let stray = ObjPath::from(format!("{}/seg/notes.txt", b.at("s")));
    run(b.objects.put(&stray, PutPayload::from_static(b"hello")))??;
    let err = Store::builder()
        .replica(Replica::new(Arc::clone(&b.objects), &b.at("s")))
        .open(dir.path().join("u.redb"))
        .expect_err("a stray object");
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains("notes.txt")),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_deleted_newest_snapshot_is_refused_naming_the_object() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let replica = || {
        Replica::new(Arc::clone(&b.objects), &b.at("s"))
            .mode(ReplicaMode::Synchronous)
            .snapshot_after_bytes(1)
    };
    let store = Store::builder()
        .replica(replica())
        .open(dir.path().join("a.redb"))?;
    for i in 0..50 {
        store.insert_if_absent(&key(i))?;
    }
    // Wait for a snapshot after the first (the RESET one) and its prune.
    let t0 = std::time::Instant::now();
    while store.replica_status().expect("status").snapshots < 3 {
        assert!(t0.elapsed() < Duration::from_secs(60));
        store.insert_if_absent(&key(1000))?;
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(store);
    let mut indexes: Vec<_> = objects_under(&b, "snap")?
        .into_iter()
        .filter(|p| p.as_ref().ends_with("/index"))
        .collect();
    indexes.sort_by(|x, y| x.as_ref().cmp(y.as_ref()));
    let newest = indexes.pop().expect("a snapshot");
    // Older snapshots (not yet pruned) go too, so none is whole.
    for p in indexes.iter().chain([&newest]) {
        run(b.objects.delete(p))??;
    }
    let err = Store::builder()
        .replica(replica())
        .open(dir.path().join("b.redb"))
        .expect_err("no whole snapshot");
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains(newest.as_ref())),
        "names {newest}: {err}"
    );
    Ok(())
}

#[test]
fn a_damaged_local_file_is_an_error_never_a_panic() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.redb");
    let replica = || Replica::new(Arc::clone(&b.objects), &b.at("s"));
    let store = Store::builder().replica(replica()).open(&path)?;
    for i in 0..300 {
        store.insert_if_absent(&key(i))?;
    }
    drop(store);
    let good = std::fs::read(&path)?;
    let local = {
        let mut p = path.as_os_str().to_owned();
        p.push(".replica");
        std::fs::read(std::path::PathBuf::from(p))?
    };
    let mut refused = 0;
    let step = (good.len() / 150).max(1);
    for at in (0..good.len()).step_by(step) {
        let mut bad = good.clone();
        bad[at] ^= 0x5a;
        std::fs::write(&path, &bad)?;
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Store::builder().replica(replica()).open(&path)
        }));
        let opened = opened.map_err(|_| format!("the open panicked with byte {at} flipped"))?;
        match opened {
            Ok(store) => drop(store),
            Err(e) => {
                refused += 1;
                assert!(e.to_string().contains("a.redb"), "byte {at}: {e}");
            }
        }
        std::fs::write(&path, &good)?;
        let mut p = path.as_os_str().to_owned();
        p.push(".replica");
        std::fs::write(std::path::PathBuf::from(p), &local)?;
    }
    assert!(refused > 0, "some flips are damage the open sees");
    Ok(())
}
