//! Restore from the replica: a missing local file, a stale one, one left
//! by a fenced owner; what a restore reports; and a replica object missing
//! or damaged is an error naming it, never a smaller store.

mod replica_kit;

use std::sync::Arc;

use dedupkv::replica::{Replica, ReplicaMode, RestoreReason};
use dedupkv::{Begin, Error, Fingerprint, Key, Result, Store};
use replica_kit::{Bucket, TestResult};

fn replica(b: &Bucket, mode: ReplicaMode) -> Replica {
    Replica::new(Arc::clone(&b.objects), &b.at("s")).mode(mode)
}

fn open(b: &Bucket, mode: ReplicaMode, path: &std::path::Path) -> Result<Store> {
    Store::builder().replica(replica(b, mode)).open(path)
}

fn keys(n: usize, tag: &str) -> Vec<String> {
    (0..n).map(|i| format!("{tag}-{i}")).collect()
}

#[test]
fn a_missing_file_is_restored_with_every_key_in_both_modes() -> TestResult {
    for mode in [ReplicaMode::Asynchronous, ReplicaMode::Synchronous] {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let ids = keys(500, "k");
        {
            let s = open(&b, mode, &dir.path().join("a.redb"))?;
            for chunk in ids.chunks(100) {
                let ks: Vec<Key<'_>> = chunk.iter().map(|i| Key::new("t", i)).collect();
                assert!(s.insert_batch(&ks)?.iter().all(|n| *n));
            }
            assert!(s.insert_if_absent(&Key::new("t", "single"))?);
            let st = s.replica_status().expect("a replica");
            assert_eq!(st.epoch, 1);
            assert!(st.restored.is_none(), "a new store restores nothing");
        }
        let s = open(&b, mode, &dir.path().join("b.redb"))?;
        let st = s.replica_status().expect("a replica");
        let r = st.restored.expect("restored");
        assert_eq!(r.reason, RestoreReason::Missing);
        assert_eq!(st.epoch, 2);
        assert!(r.records >= 6, "{r:?}");
        // At most one record per key (a bucket's summary is shipped as a
        // row too, but it is not a log row and holds no records).
        assert!(r.records <= 501, "{r:?}");
        assert!(r.rows <= 501, "{r:?}");
        assert!(r.bytes > 0);
        for i in &ids {
            assert!(
                !s.insert_if_absent(&Key::new("t", i))?,
                "{mode:?}: {i} is a duplicate"
            );
        }
        assert!(!s.insert_if_absent(&Key::new("t", "single"))?);
        assert!(s.insert_if_absent(&Key::new("t", "new"))?);
    }
    Ok(())
}

#[test]
fn outcomes_claims_and_the_provider_key_travel_with_the_replica() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let fp = Fingerprint::of("charge 7");
    let (done, open_key) = (Key::new("t", "done"), Key::new("t", "open"));
    let (provider_key, token) = {
        let s = open(&b, ReplicaMode::Synchronous, &dir.path().join("a.redb"))?;
        let Begin::Started(c) = s.begin(&done, fp)? else {
            panic!("new")
        };
        s.complete(&c, b"receipt")?;
        let Begin::Started(c) = s.begin(&open_key, fp)? else {
            panic!("new")
        };
        let pk = c.provider_key()?;
        let token = c.token();
        std::mem::forget(c); // the owner dies with the claim in progress
        (pk, token)
    };
    let s = open(&b, ReplicaMode::Synchronous, &dir.path().join("b.redb"))?;
    let Begin::Completed(r) = s.begin(&done, fp)? else {
        panic!("completed")
    };
    assert_eq!(r.outcome(), Some(&b"receipt"[..]));
    let Begin::Started(c) = s.begin(&open_key, fp)? else {
        panic!("taken over at once")
    };
    assert!(
        c.interrupted(),
        "the fenced owner's claim is taken over as interrupted"
    );
    assert_eq!(
        c.provider_key()?,
        provider_key,
        "the same provider key on the new owner"
    );
    assert!(
        c.token() > token,
        "a new owner's token exceeds the old owner's"
    );
    assert!(c.token() >= 2 << 40, "the epoch feeds the token");
    Ok(())
}

#[test]
fn a_file_left_by_a_fenced_owner_is_replaced_by_the_replica() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let (a, other) = (dir.path().join("a.redb"), dir.path().join("b.redb"));
    drop(open(&b, ReplicaMode::Synchronous, &a)?);
    {
        // Another machine takes over and writes.
        let s = open(&b, ReplicaMode::Synchronous, &other)?;
        assert!(s.insert_if_absent(&Key::new("t", "written-by-b"))?);
    }
    // The first machine comes back with its old file.
    let s = open(&b, ReplicaMode::Synchronous, &a)?;
    let r = s
        .replica_status()
        .and_then(|st| st.restored)
        .expect("restored");
    assert_eq!(r.reason, RestoreReason::Fenced);
    assert!(
        r.replaced.as_ref().is_some_and(|p| p.exists()),
        "the old file is kept aside"
    );
    let journal = |p: &std::path::Path| {
        let mut s = p.as_os_str().to_owned();
        s.push(".journal");
        std::path::PathBuf::from(s)
    };
    assert!(
        r.replaced.as_deref().is_some_and(|p| journal(p).exists()),
        "with its journal (the default journal: acknowledged commits may be in it)"
    );
    assert!(!s.insert_if_absent(&Key::new("t", "written-by-b"))?);
    drop(s);
    assert!(
        journal(&a).exists(),
        "the restored file, new, gets the default journal"
    );
    Ok(())
}

#[test]
fn a_file_older_than_its_replica_is_restored_and_a_current_one_is_not() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let a = dir.path().join("a.redb");
    let backup = dir.path().join("backup");
    std::fs::create_dir(&backup)?;
    let builder = || {
        Store::builder()
            .background_eviction(false)
            .replica(replica(&b, ReplicaMode::Synchronous))
    };
    drop(builder().open(&a)?);
    {
        // Reopened on its own file: nothing to restore.
        let s = builder().open(&a)?;
        assert!(s.replica_status().and_then(|st| st.restored).is_none());
        assert!(s.insert_if_absent(&Key::new("t", "early"))?);
        // A copy of the disk taken now (nothing commits meanwhile): the
        // store is its file and its journal (where "early" is) ...
        for name in ["a.redb", "a.redb.journal", "a.redb.replica"] {
            std::fs::copy(dir.path().join(name), backup.join(name))?;
        }
        // ... misses what this owner ships after it.
        assert!(s.insert_if_absent(&Key::new("t", "late"))?);
    }
    for name in ["a.redb", "a.redb.journal", "a.redb.replica"] {
        std::fs::copy(backup.join(name), dir.path().join(name))?;
    }
    let s = builder().open(&a)?;
    let r = s
        .replica_status()
        .and_then(|st| st.restored)
        .expect("restored");
    assert_eq!(r.reason, RestoreReason::Older);
    assert!(!s.insert_if_absent(&Key::new("t", "late"))?);
    assert!(!s.insert_if_absent(&Key::new("t", "early"))?);
    Ok(())
}

/// Writes a store with several segments and returns the segment names.
fn several_segments(b: &Bucket, path: &std::path::Path) -> TestResult<Vec<String>> {
    let s = open(b, ReplicaMode::Synchronous, path)?;
    for i in 0..5 {
        assert!(s.insert_if_absent(&Key::new("t", &format!("k{i}")))?);
    }
    drop(s);
    let mut segs: Vec<String> = list(b, "seg");
    segs.sort();
    Ok(segs)
}

fn list(b: &Bucket, dir: &str) -> Vec<String> {
    use futures_util::StreamExt;
    let prefix = dedupkv::replica::object_store::path::Path::from(format!("{}/{dir}", b.at("s")));
    let objects = Arc::clone(&b.objects);
    let rt = tokio_rt();
    rt.block_on(async move {
        let mut out = Vec::new();
        let mut l = objects.list(Some(&prefix));
        while let Some(m) = l.next().await {
            out.push(m.expect("list").location.to_string());
        }
        out
    })
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt")
}

fn delete(b: &Bucket, name: &str) {
    use dedupkv::replica::object_store::ObjectStoreExt;
    let p = dedupkv::replica::object_store::path::Path::from(name);
    let objects = Arc::clone(&b.objects);
    tokio_rt()
        .block_on(async move { objects.delete(&p).await })
        .expect("delete");
}

fn damage(b: &Bucket, name: &str) {
    use dedupkv::replica::object_store::ObjectStoreExt;
    let p = dedupkv::replica::object_store::path::Path::from(name);
    let objects = Arc::clone(&b.objects);
    tokio_rt()
        .block_on(async move {
            let mut bytes = objects.get(&p).await?.bytes().await?.to_vec();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x40;
            objects.put(&p, bytes.into()).await
        })
        .expect("damage");
}

#[test]
fn a_missing_segment_is_an_error_naming_it() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let segs = several_segments(&b, &dir.path().join("a.redb"))?;
    assert!(segs.len() >= 4, "{segs:?}");
    let gone = &segs[segs.len() - 2];
    delete(&b, gone);
    let err = open(&b, ReplicaMode::Synchronous, &dir.path().join("b.redb")).unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains(gone.as_str()) && m.contains("missing")),
        "{err}"
    );
    assert!(
        !dir.path().join("b.redb").exists(),
        "no smaller store is left behind"
    );
    Ok(())
}

#[test]
fn a_damaged_segment_is_an_error_naming_it() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let segs = several_segments(&b, &dir.path().join("a.redb"))?;
    let bad = &segs[segs.len() - 2];
    damage(&b, bad);
    let err = open(&b, ReplicaMode::Synchronous, &dir.path().join("b.redb")).unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains(bad.as_str()) && m.contains("checksum")),
        "{err}"
    );
    assert!(!dir.path().join("b.redb").exists());
    Ok(())
}

#[test]
fn a_damaged_snapshot_part_is_an_error_naming_it() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    several_segments(&b, &dir.path().join("a.redb"))?;
    let parts: Vec<String> = list(&b, "snap")
        .into_iter()
        .filter(|n| n.contains("part-"))
        .collect();
    let bad = parts.last().expect("a snapshot part").clone();
    damage(&b, &bad);
    let err = open(&b, ReplicaMode::Synchronous, &dir.path().join("b.redb")).unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains(bad.as_str())),
        "{err}"
    );
    Ok(())
}

/// An owner whose clock ran a year ahead hands its time to the next owner
/// through the replica: by default the restored store stands still (a
/// lease begun there holds), and with `ClockBehind::Advance` its time runs
/// on, so the lease lapses and the key expires after real time passes.
#[test]
fn a_time_floor_inherited_through_a_restore_runs_on_with_advance() -> TestResult {
    use dedupkv::{ClockBehind, ManualClock};
    use std::time::Duration;
    const T0: u64 = 1_700_000_040_000;
    const YEAR: u64 = 365 * 24 * 3_600_000;
    let owner = |b: &Bucket, clock: &ManualClock, mode: ClockBehind, path: &std::path::Path| {
        Store::builder()
            .clock(clock.clone())
            .background_eviction(false)
            .lease(Duration::from_secs(30))
            .retention(Duration::from_secs(3_600))
            .clock_behind(mode)
            .replica(replica(b, ReplicaMode::Synchronous))
            .open(path)
    };
    for mode in [ClockBehind::StandStill, ClockBehind::Advance] {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let seen = Key::new("t", "seen");
        {
            let ahead = ManualClock::new(T0 + YEAR);
            let s = owner(
                &b,
                &ahead,
                ClockBehind::StandStill,
                &dir.path().join("a.redb"),
            )?;
            assert!(s.insert_if_absent(&seen)?);
        }
        let clock = ManualClock::new(T0);
        let s = owner(&b, &clock, mode, &dir.path().join("b.redb"))?;
        assert!(s.replica_status().expect("a replica").restored.is_some());
        let hung = Key::new("t", "hung");
        let Begin::Started(c) = s.begin(&hung, Fingerprint::NONE)? else {
            panic!("new")
        };
        std::mem::forget(c);
        clock.advance(Duration::from_secs(31));
        let lapsed = matches!(s.begin(&hung, Fingerprint::NONE)?, Begin::Started(_));
        assert_eq!(lapsed, mode == ClockBehind::Advance, "{mode:?}");
        clock.advance(Duration::from_secs(61 * 60));
        s.evict_expired()?;
        assert_eq!(
            s.insert_if_absent(&seen)?,
            mode == ClockBehind::Advance,
            "{mode:?}"
        );
    }
    Ok(())
}
