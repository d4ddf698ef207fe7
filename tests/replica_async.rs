//! The async front over a replica: a future resolves once its answer is
//! acknowledged, which with a synchronous replica means uploaded; a
//! future waiting on an upload that another owner's fence refuses
//! resolves `Fenced` instead of waiting forever; every `begin_or_wait`
//! waiter, blocking or async, answers `Fenced` as soon as the owner is
//! fenced, not once the holder's lease lapses.

mod replica_kit;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{AsyncStore, Begin, Error, Fingerprint, Key, ManualClock, Store};
use replica_kit::{Bucket, Faulty, TestResult};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime")
}

#[test]
fn async_answers_over_a_synchronous_replica_survive_a_lost_disk() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let r = Replica::new(Arc::clone(&b.objects), &b.at("s")).mode(ReplicaMode::Synchronous);
    let store = AsyncStore::new(
        Store::builder()
            .replica(r.clone())
            .open(dir.path().join("a.redb"))?,
    );
    let rt = runtime();
    let answers = rt.block_on(async {
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let id = format!("evt-{i}");
                    store.insert_if_absent(&Key::new("t", &id)).await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.expect("task")?);
        }
        Ok::<_, Error>(answers)
    })?;
    assert_eq!(answers, vec![true; 16], "every key was new");
    // Every answer was uploaded before it resolved: the machine is gone
    // (the store forgotten without a close) and another, with no file,
    // restores every key.
    std::mem::forget(store);
    let other = Store::builder()
        .replica(r)
        .open(dir.path().join("b.redb"))?;
    assert!(other.replica_status().and_then(|s| s.restored).is_some());
    for i in 0..16 {
        let id = format!("evt-{i}");
        assert!(
            !other.insert_if_absent(&Key::new("t", &id))?,
            "{id} is a duplicate on the new owner"
        );
    }
    Ok(())
}

#[test]
fn a_future_waiting_on_a_fenced_upload_resolves_fenced() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let faulty = Faulty::new(Arc::clone(&b.objects));
    let zombie = AsyncStore::new(
        Store::builder()
            .replica(Replica::new(faulty.clone(), &b.at("s")).mode(ReplicaMode::Synchronous))
            .open(dir.path().join("a.redb"))?,
    );
    let rt = runtime();
    assert!(rt.block_on(zombie.insert_if_absent(&Key::new("t", "before")))?);
    // Uploads fail from now on (retried): the next answer waits on one.
    faulty.hold_puts.store(true, Ordering::SeqCst);
    let failed = faulty.failed.load(Ordering::SeqCst);
    let z = zombie.clone();
    let late = rt.spawn(async move { z.insert_if_absent(&Key::new("t", "late")).await });
    while faulty.failed.load(Ordering::SeqCst) == failed {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!late.is_finished(), "not acknowledged before its upload");
    // Another owner takes the replica (and writes its fence) through the
    // store underneath; then the zombie's retried upload finds the place
    // taken.
    let owner = Store::builder()
        .replica(Replica::new(Arc::clone(&b.objects), &b.at("s")).mode(ReplicaMode::Synchronous))
        .open(dir.path().join("b.redb"))?;
    faulty.hold_puts.store(false, Ordering::SeqCst);
    let answer = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), late)
            .await
            .map(|joined| joined.expect("task"))
    });
    match answer {
        Ok(Err(Error::Fenced(m))) => assert!(m.contains("epoch 2"), "{m}"),
        Ok(other) => panic!("the fenced owner answered {other:?}"),
        Err(elapsed) => panic!("the future waiting on the fenced upload never resolved: {elapsed}"),
    }
    assert!(matches!(
        rt.block_on(zombie.insert_if_absent(&Key::new("t", "later"))),
        Err(Error::Fenced(_))
    ));
    // One owner answers for the key.
    assert!(owner.insert_if_absent(&Key::new("t", "late"))?);
    Ok(())
}

#[test]
fn begin_or_wait_waiters_answer_a_fence_at_once() -> TestResult {
    const THREADS: usize = 50;
    const FUTURES: usize = 500;
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let r = Replica::new(Arc::clone(&b.objects), &b.at("s")).mode(ReplicaMode::Synchronous);
    // The clock never moves: the holder's lease cannot lapse during the
    // test, so only the fence can end the waits.
    let zombie = Store::builder()
        .clock(ManualClock::new(1_700_000_000_000))
        .lease(Duration::from_secs(30))
        .replica(r.clone())
        .open(dir.path().join("a.redb"))?;
    let key = Key::new("t", "charge");
    let Begin::Started(_held) = zombie.begin(&key, Fingerprint::NONE)? else {
        panic!("new")
    };
    let wait = Duration::from_secs(3600);
    let (tx, answers) = std::sync::mpsc::channel();
    for _ in 0..THREADS {
        let (store, tx) = (zombie.clone(), tx.clone());
        std::thread::spawn(move || {
            let got = store.begin_or_wait(&Key::new("t", "charge"), Fingerprint::NONE, wait);
            let _ = tx.send(got.map(|b| format!("{b:?}")));
        });
    }
    let rt = runtime();
    let front = AsyncStore::new(zombie.clone());
    for _ in 0..FUTURES {
        let (store, tx) = (front.clone(), tx.clone());
        rt.spawn(async move {
            let got = store
                .begin_or_wait(&Key::new("t", "charge"), Fingerprint::NONE, wait)
                .await;
            let _ = tx.send(got.map(|b| format!("{b:?}")));
        });
    }
    drop(tx);
    let asleep = std::time::Instant::now();
    while zombie.stats().waiting < (THREADS + FUTURES) as u64 {
        assert!(
            asleep.elapsed() < Duration::from_secs(60),
            "only {} of the waiters are waiting",
            zombie.stats().waiting
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // Another owner takes the replica; the zombie's next upload finds its
    // fence, and the zombie is fenced.
    let _owner = Store::builder()
        .replica(r)
        .open(dir.path().join("b.redb"))?;
    assert!(matches!(
        zombie.insert_if_absent(&Key::new("t", "late")),
        Err(Error::Fenced(_))
    ));
    for n in 0..THREADS + FUTURES {
        let got = answers
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| {
                panic!(
                    "{n} of {} waiters answered; the others still wait for a lease \
                 that cannot lapse",
                    THREADS + FUTURES
                )
            });
        assert!(matches!(&got, Err(Error::Fenced(_))), "{got:?}");
    }
    Ok(())
}
