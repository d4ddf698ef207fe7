//! Ownership of a replica: of owners racing for an epoch exactly one wins;
//! a later owner fences an earlier one, whose next upload is refused and
//! which then acknowledges nothing; claims of a fenced owner are taken
//! over at once, as interrupted.

mod replica_kit;

use std::sync::Arc;

use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{Begin, Error, Fingerprint, Key, Store};
use replica_kit::{Bucket, Faulty, TestResult};

fn replica(objects: Arc<dyn dedupkv::replica::object_store::ObjectStore>, b: &Bucket) -> Replica {
    Replica::new(objects, &b.at("s"))
}

#[test]
fn an_owner_that_loses_the_race_for_its_epoch_opens_nothing() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let faulty = Faulty::new(Arc::clone(&b.objects));
    drop(
        Store::builder()
            .replica(replica(faulty.clone(), &b))
            .open(dir.path().join("a.redb"))?,
    );
    faulty
        .rival_owner
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let path = dir.path().join("b.redb");
    let err = Store::builder()
        .replica(replica(faulty.clone(), &b))
        .open(&path)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Fenced(m) if m.contains("epoch 2")),
        "{err}"
    );
    assert!(!path.exists(), "the loser restored nothing");
    Ok(())
}

#[test]
fn owners_opening_at_once_each_get_their_own_epoch_or_lose_cleanly() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let start = Arc::new(std::sync::Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let (objects, start) = (Arc::clone(&b.objects), Arc::clone(&start));
            let r = replica(objects, &b);
            let path = dir.path().join(format!("{i}.redb"));
            std::thread::spawn(move || {
                start.wait();
                Store::builder()
                    .replica(r)
                    .open(&path)
                    .map(|s| s.replica_status().map(|st| st.epoch))
            })
        })
        .collect();
    let mut epochs = Vec::new();
    for h in handles {
        match h.join().expect("thread") {
            Ok(Some(e)) => epochs.push(e),
            Ok(None) => panic!("no replica status"),
            Err(Error::Fenced(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    assert!(!epochs.is_empty(), "somebody wins");
    let mut unique = epochs.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        epochs.len(),
        "no epoch has two owners: {epochs:?}"
    );
    Ok(())
}

#[test]
fn a_fenced_synchronous_owner_acknowledges_nothing_more() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let r = replica(Arc::clone(&b.objects), &b).mode(ReplicaMode::Synchronous);
    let zombie = Store::builder()
        .replica(r.clone())
        .open(dir.path().join("a.redb"))?;
    assert!(zombie.insert_if_absent(&Key::new("t", "before"))?);
    let owner = Store::builder()
        .replica(r)
        .open(dir.path().join("b.redb"))?;
    // The zombie's next commit is durable locally, but its upload finds
    // the new owner's fence: refused, not acknowledged.
    let err = zombie.insert_if_absent(&Key::new("t", "late")).unwrap_err();
    assert!(
        matches!(&err, Error::Fenced(m) if m.contains("epoch 2")),
        "{err}"
    );
    assert!(matches!(
        zombie.insert_if_absent(&Key::new("t", "later")),
        Err(Error::Fenced(_))
    ));
    assert!(matches!(
        zombie.get(&Key::new("t", "before")),
        Err(Error::Fenced(_))
    ));
    assert!(zombie.replica_status().is_some_and(|s| s.fenced));
    // The key has one owner answering for it.
    assert!(!owner.insert_if_absent(&Key::new("t", "before"))?);
    assert!(owner.insert_if_absent(&Key::new("t", "late"))?);
    Ok(())
}

#[test]
fn a_fenced_asynchronous_owner_stops_at_its_next_upload() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let r = replica(Arc::clone(&b.objects), &b);
    let zombie = Store::builder()
        .replica(r.clone())
        .open(dir.path().join("a.redb"))?;
    assert!(zombie.insert_if_absent(&Key::new("t", "before"))?);
    zombie.sync_replica()?;
    let owner = Store::builder()
        .replica(r)
        .open(dir.path().join("b.redb"))?;
    // Acknowledged from the local file before the upload ...
    assert!(zombie.insert_if_absent(&Key::new("t", "late"))?);
    // ... whose upload is refused: from then on the zombie answers Fenced.
    assert!(matches!(zombie.sync_replica(), Err(Error::Fenced(_))));
    assert!(matches!(
        zombie.insert_if_absent(&Key::new("t", "x")),
        Err(Error::Fenced(_))
    ));
    assert!(!owner.insert_if_absent(&Key::new("t", "before"))?);
    Ok(())
}

#[test]
fn a_fenced_owners_claim_is_taken_over_at_once_as_interrupted() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let r = replica(Arc::clone(&b.objects), &b).mode(ReplicaMode::Synchronous);
    let zombie = Store::builder()
        .replica(r.clone())
        .open(dir.path().join("a.redb"))?;
    let key = Key::new("t", "charge");
    let fp = Fingerprint::of("100 EUR");
    let Begin::Started(old) = zombie.begin(&key, fp)? else {
        panic!("new")
    };
    let owner = Store::builder()
        .replica(r)
        .open(dir.path().join("b.redb"))?;
    let Begin::Started(new) = owner.begin(&key, fp)? else {
        panic!("taken over at once")
    };
    assert!(new.interrupted());
    assert_eq!(new.attempt(), old.attempt() + 1);
    assert_eq!(new.provider_key()?, old.provider_key()?);
    assert!(new.token() > old.token());
    // The zombie cannot finish what it no longer owns.
    assert!(matches!(
        zombie.complete(&old, b"late"),
        Err(Error::Fenced(_))
    ));
    owner.complete(&new, b"done")?;
    Ok(())
}
