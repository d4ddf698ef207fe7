//! Reading a replica without owning it: a reader sees what a live owner
//! acknowledged, writes nothing to the object store and leaves the owner
//! serving (opening with the owner's builder call instead takes the
//! replica over and fences it); an empty or wrong prefix and a damaged
//! segment are errors naming them, never an empty or smaller store.

mod replica_kit;

use std::sync::Arc;

use dedupkv::replica::object_store::ObjectStore;
use dedupkv::replica::{Replica, ReplicaMode, ReplicaReader};
use dedupkv::{Error, Key, Store};
use replica_kit::{Bucket, Faulty, TestResult};

fn owner(b: &Bucket, path: &std::path::Path) -> dedupkv::Result<Store> {
    let r = Replica::new(Arc::clone(&b.objects), &b.at("s"))
        .mode(ReplicaMode::Synchronous)
        .owner_label("consumer-7");
    Store::builder().replica(r).open(path)
}

/// The bucket seen through a store that records every write and delete.
fn watched(b: &Bucket) -> Arc<Faulty> {
    Faulty::new(Arc::clone(&b.objects))
}

#[test]
fn a_reader_sees_a_live_owners_keys_and_the_owner_goes_on_serving() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let live = owner(&b, &dir.path().join("live.redb"))?;
    for i in 0..20 {
        assert!(live.insert_if_absent(&Key::new("t", &format!("k{i}")))?);
    }
    let watch = watched(&b);
    let reader = ReplicaReader::new(Arc::clone(&watch) as Arc<dyn ObjectStore>, &b.at("s"));

    let summary = reader.summary()?;
    assert_eq!(summary.epoch, Some(1));
    assert_eq!(summary.owner.as_deref(), Some("consumer-7"));
    assert_eq!(summary.last_segment_epoch, Some(1));
    assert!(summary.last_segment.is_some() && summary.snapshot.is_some());
    assert!(summary.last_segment_age.is_some() && summary.owner_since.is_some());
    assert!(summary.objects >= 3, "{summary:?}");

    let copy = reader.copy_to(dir.path().join("look.redb"))?;
    assert_eq!(copy.last_segment, summary.last_segment);
    for i in 0..20 {
        assert!(
            copy.store.get(&Key::new("t", &format!("k{i}")))?.is_some(),
            "k{i} was acknowledged, so it is in the copy"
        );
    }
    assert!(copy.store.get(&Key::new("t", "never"))?.is_none());
    // The copy is a store of its own: writing to it reaches no replica.
    assert!(copy.store.insert_if_absent(&Key::new("t", "scratch"))?);
    assert!(copy.store.replica_status().is_none());
    drop(copy);

    // Nothing was written or deleted in the object store, and no epoch
    // was taken: the owner goes on acknowledging writes.
    assert_eq!(
        watch.written(),
        0,
        "the reader wrote {:?}",
        watch.writes.lock().expect("writes")
    );
    assert!(live.insert_if_absent(&Key::new("t", "after"))?);
    let st = live.replica_status().expect("a replica");
    assert!(!st.fenced && st.epoch == 1, "{st:?}");

    // A later look sees the later write, and still writes nothing.
    let copy = reader.copy_to(dir.path().join("look-2.redb"))?;
    assert!(copy.store.get(&Key::new("t", "after"))?.is_some());
    assert!(copy.store.get(&Key::new("t", "scratch"))?.is_none());
    assert_eq!(watch.written(), 0);
    Ok(())
}

/// Why the reader exists: looking with the owner's builder call (what the
/// forensic open of #27 did) writes to the object store and fences the
/// live owner. The test above fails the same way if its reader is
/// replaced by this call.
#[test]
fn looking_with_the_owners_builder_call_takes_the_replica_over() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let live = owner(&b, &dir.path().join("live.redb"))?;
    assert!(live.insert_if_absent(&Key::new("t", "k"))?);
    let watch = watched(&b);
    let look = Store::builder()
        .replica(Replica::new(
            Arc::clone(&watch) as Arc<dyn ObjectStore>,
            &b.at("s"),
        ))
        .open(dir.path().join("look.redb"))?;
    assert!(look.get(&Key::new("t", "k"))?.is_some());
    assert!(watch.written() > 0, "it took an epoch");
    let err = live.insert_if_absent(&Key::new("t", "after")).unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    Ok(())
}

/// The owner writes a new snapshot and deletes the one the copy was
/// reading, in the middle of the copy: the copy starts again from the new
/// one, holds every key, and still writes nothing.
#[test]
fn a_copy_started_again_when_the_owner_replaces_its_snapshot_meanwhile() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let r = Replica::new(Arc::clone(&b.objects), &b.at("s"))
        .mode(ReplicaMode::Synchronous)
        .snapshot_after_bytes(1);
    let live = Store::builder()
        .replica(r)
        .open(dir.path().join("live.redb"))?;
    assert!(live.insert_if_absent(&Key::new("t", "k0"))?);
    let watch = watched(&b);
    let (gate, reached, open) = replica_kit::Gate::new("/part-");
    *watch.gate.lock().expect("gate") = Some(gate);
    let reader = ReplicaReader::new(Arc::clone(&watch) as Arc<dyn ObjectStore>, &b.at("s"));
    let path = dir.path().join("look.redb");
    let copying = std::thread::spawn(move || reader.copy_to(&path));

    // The copy is reading a part of the snapshot it chose: the owner
    // writes until a newer snapshot has replaced that one (at most 50
    // writes; with a snapshot every byte, two do).
    let held = reached.recv_timeout(std::time::Duration::from_secs(60))?;
    let dir_of = |name: &str| name.rsplit_once('/').map(|(d, _)| d.to_string());
    let held_snapshot = dir_of(&held).expect("a part's snapshot");
    let mut n = 0;
    while names(&b, "snap")
        .iter()
        .any(|o| o.starts_with(&held_snapshot))
    {
        assert!(n < 50, "the owner never replaced {held_snapshot}");
        assert!(live.insert_if_absent(&Key::new("t", &format!("w{n}")))?);
        n += 1;
        wait_for(|| {
            names(&b, "snap")
                .iter()
                .all(|o| !o.starts_with(&held_snapshot))
        });
    }
    open.notify_one();

    let copy = copying.join().expect("the copy's thread")?;
    assert!(
        copy.snapshot
            .is_some_and(|s| !held_snapshot.ends_with(&format!("{s:020}")))
    );
    assert!(copy.store.get(&Key::new("t", "k0"))?.is_some());
    for i in 0..n {
        assert!(
            copy.store.get(&Key::new("t", &format!("w{i}")))?.is_some(),
            "w{i}"
        );
    }
    assert_eq!(watch.written(), 0);
    assert!(live.insert_if_absent(&Key::new("t", "after"))?);
    Ok(())
}

/// Waits until `f` holds, for a second at most.
fn wait_for(mut f: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while !f() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_copy_never_replaces_an_existing_file() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("live.redb");
    let live = owner(&b, &path)?;
    assert!(live.insert_if_absent(&Key::new("t", "k"))?);
    let before = std::fs::read(&path)?;
    let err = ReplicaReader::new(Arc::clone(&b.objects), &b.at("s"))
        .copy_to(&path)
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { reason, .. } if reason.contains("live.redb")),
        "{err}"
    );
    assert_eq!(std::fs::read(&path)?, before, "the live file is untouched");
    assert!(live.insert_if_absent(&Key::new("t", "after"))?);
    Ok(())
}

#[test]
fn a_reader_of_an_empty_or_wrong_prefix_says_so() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let nothing = ReplicaReader::new(Arc::clone(&b.objects), &b.at("nothing"));
    let err = nothing.summary().unwrap_err();
    assert!(
        matches!(&err, Error::Replica { .. })
            && err.to_string().contains(&b.at("nothing"))
            && err.to_string().contains("no objects"),
        "{err}"
    );
    let path = dir.path().join("look.redb");
    let err = nothing.copy_to(&path).unwrap_err();
    assert!(err.to_string().contains("no objects"), "{err}");
    assert!(
        !path.exists(),
        "no empty store is left to be mistaken for one"
    );

    // The bucket's root holds a replica below it, but is not one.
    drop(owner(&b, &dir.path().join("live.redb"))?);
    let parent = ReplicaReader::new(Arc::clone(&b.objects), &b.prefix);
    let err = parent.copy_to(&path).unwrap_err();
    assert!(
        err.to_string().contains(&b.prefix) && err.to_string().contains("none a replica writes"),
        "{err}"
    );
    assert!(!path.exists());
    Ok(())
}

#[test]
fn a_reader_of_a_damaged_segment_errors_naming_it() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let live = owner(&b, &dir.path().join("live.redb"))?;
    for i in 0..5 {
        assert!(live.insert_if_absent(&Key::new("t", &format!("k{i}")))?);
    }
    let segs = names(&b, "seg");
    assert!(segs.len() >= 4, "{segs:?}");
    let bad = segs[segs.len() - 2].clone();
    damage(&b, &bad);
    let path = dir.path().join("look.redb");
    let err = ReplicaReader::new(Arc::clone(&b.objects), &b.at("s"))
        .copy_to(&path)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains(bad.as_str()) && m.contains("checksum")),
        "{err}"
    );
    assert!(!path.exists(), "no smaller store is left behind");
    Ok(())
}

fn names(b: &Bucket, dir: &str) -> Vec<String> {
    use futures_util::StreamExt;
    let prefix = dedupkv::replica::object_store::path::Path::from(format!("{}/{dir}", b.at("s")));
    let objects = Arc::clone(&b.objects);
    let mut out = rt().block_on(async move {
        let mut out = Vec::new();
        let mut l = objects.list(Some(&prefix));
        while let Some(m) = l.next().await {
            out.push(m.expect("list").location.to_string());
        }
        out
    });
    out.sort();
    out
}

fn damage(b: &Bucket, name: &str) {
    use dedupkv::replica::object_store::ObjectStoreExt;
    let p = dedupkv::replica::object_store::path::Path::from(name);
    let objects = Arc::clone(&b.objects);
    rt().block_on(async move {
        let mut bytes = objects.get(&p).await?.bytes().await?.to_vec();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        objects.put(&p, bytes.into()).await
    })
    .expect("damage");
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt")
}
