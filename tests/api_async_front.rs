//! The async front: the same answers as the blocking API, resolved once
//! durable, without blocking the executor.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dedupkv::{AsyncStore, Begin, Failure, Fingerprint, Key, Result, State, Store};
use dedupkv_testkit::{FaultBackend, Plan, is_fault, started, tempdir};

fn open(dir: &tempfile::TempDir) -> Result<AsyncStore> {
    Ok(AsyncStore::new(Store::open(dir.path().join("s.redb"))?))
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Releases a held disk every 30 s until dropped, so a test whose call
/// wrongly blocks its thread on a held commit fails instead of hanging.
struct Watchdog(Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>);

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.0.take() {
            let _ = stop.send(());
            thread.join().expect("watchdog");
        }
    }
}

/// A current-thread runtime (one thread: a blocked call stops every
/// task) and the watchdog of `backend`'s held syncs.
fn held_disk_runtime(backend: &FaultBackend) -> (tokio::runtime::Runtime, Watchdog) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let backend = backend.clone();
    let thread = std::thread::spawn(move || {
        while stopped.recv_timeout(Duration::from_secs(30)).is_err() {
            backend.release_syncs();
        }
    });
    (rt, Watchdog(Some((stop, thread))))
}

#[test]
fn many_tasks_racing_one_key_get_exactly_one_started() -> Result<()> {
    let dir = tempdir();
    let store = open(&dir)?;
    multi_thread().block_on(async {
        let started = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (store, started) = (store.clone(), Arc::clone(&started));
            tasks.push(tokio::spawn(async move {
                let key = Key::new("race", "one");
                match store.begin(&key, Fingerprint::of("p")).await? {
                    Begin::Started(claim) => {
                        started.fetch_add(1, Ordering::SeqCst);
                        store.complete(&claim, b"done").await?;
                    }
                    Begin::Completed(rec) => assert_eq!(rec.outcome(), Some(&b"done"[..])),
                    Begin::InProgress(_) => {}
                    Begin::DeadLettered(dl) => panic!("dead letter {dl:?}"),
                }
                Ok::<(), dedupkv::Error>(())
            }));
        }
        for t in tasks {
            t.await.expect("task")?;
        }
        assert_eq!(started.load(Ordering::SeqCst), 1);
        let again = store
            .begin(&Key::new("race", "one"), Fingerprint::of("p"))
            .await?;
        assert!(matches!(again, Begin::Completed(ref r) if r.outcome() == Some(&b"done"[..])));
        Ok(())
    })
}

#[test]
fn the_async_calls_answer_as_the_blocking_ones() -> Result<()> {
    let dir = tempdir();
    let store = open(&dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let k = |id: &str| Key::new("t", id).into_owned();
        assert!(store.insert_if_absent(&k("a")).await?);
        assert!(!store.insert_if_absent(&k("a")).await?);
        assert_eq!(
            store.insert_batch(&[k("a"), k("b"), k("b")]).await?,
            vec![false, true, false]
        );
        let c = started(store.begin(&k("job"), Fingerprint::NONE).await?);
        store.renew(&c).await?;
        store.fail(&c, Failure::Retryable).await?;
        let c = started(store.begin(&k("job"), Fingerprint::NONE).await?);
        assert_eq!(c.attempt(), 2);
        store.complete(&c, b"ok").await?;
        let rec = store.get(&k("job")).await?.expect("recorded");
        assert_eq!(rec.state(), State::Completed);
        let items = [(k("x"), Fingerprint::NONE), (k("y"), Fingerprint::NONE)];
        let claims: Vec<_> = store
            .begin_batch(&items)
            .await?
            .into_iter()
            .map(|b| b.map(started))
            .collect::<Result<_>>()?;
        let done: Vec<_> = claims.iter().map(|c| (c, &b"v"[..])).collect();
        for r in store.complete_batch(&done).await? {
            r?;
        }
        assert!(matches!(
            store.forget(&k("a")).await?,
            dedupkv::Forget::Forgotten(_)
        ));
        store.flush().await?;
        // The same store, reopened blocking: everything acknowledged is there.
        let blocking = store.store().clone();
        drop(store);
        drop(claims);
        let s = blocking.stats();
        assert_eq!((s.new_keys, s.completed), (2, 3));
        Ok(())
    })
}

#[test]
fn a_dropped_begin_future_releases_its_claim_as_interrupted() -> Result<()> {
    let dir = tempdir();
    let store = open(&dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let key = Key::new("t", "dropped");
        {
            let mut fut = std::pin::pin!(store.begin(&key, Fingerprint::NONE));
            // One poll: the claim is decided and appended, then dropped
            // with the future (before or after its commit).
            let _ = std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await;
        }
        let c = started(store.begin(&key, Fingerprint::NONE).await?);
        assert_eq!(c.attempt(), 2);
        assert!(
            c.interrupted(),
            "the dropped claim's attempt never answered"
        );
        store.complete(&c, b"").await
    })
}

#[test]
fn a_failed_commit_fails_the_futures_waiting_for_it() -> Result<()> {
    let backend = FaultBackend::new();
    let store = AsyncStore::new(Store::builder().open_with_backend(backend.clone())?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        backend.arm(Plan::after(0));
        let err = store
            .insert_if_absent(&Key::new("t", "a"))
            .await
            .expect_err("never acknowledged");
        assert!(is_fault(&err), "{err}");
        let err = store
            .insert_if_absent(&Key::new("t", "b"))
            .await
            .unwrap_err();
        assert!(matches!(err, dedupkv::Error::Poisoned(_)), "{err}");
    });
    Ok(())
}

/// Every awaited call leaves the runtime's thread free while it waits: on
/// a current-thread runtime, with the disk's syncs held (a commit in
/// flight for as long as the test likes), another task runs while each
/// call is pending — and releases the disk. A call that blocked its
/// thread would let no task run until a watchdog released the disk, and
/// the observer would never have seen it pending. No timing bound: it
/// holds on a loaded machine (docs/performance.md has the measured
/// worst stall).
#[test]
fn async_calls_never_block_a_current_thread_runtime() -> Result<()> {
    let backend = FaultBackend::new();
    let store = AsyncStore::new(Store::builder().open_with_backend(backend.clone())?);
    let (rt, watchdog) = held_disk_runtime(&backend);
    let result = rt.block_on(async {
        for op in ["insert_if_absent", "begin", "complete"] {
            let pending = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let claim = if op == "complete" {
                Some(started(
                    store.begin(&Key::new("op", "c"), Fingerprint::NONE).await?,
                ))
            } else {
                None
            };
            backend.hold_syncs();
            let writer = {
                let (store, pending, done) = (store.clone(), pending.clone(), done.clone());
                tokio::spawn(async move {
                    pending.store(true, Ordering::SeqCst);
                    match op {
                        "insert_if_absent" => {
                            store.insert_if_absent(&Key::new("plain", "a")).await?;
                        }
                        "begin" => {
                            started(store.begin(&Key::new("op", "b"), Fingerprint::NONE).await?);
                        }
                        _ => {
                            let claim = claim.expect("a claim");
                            store.complete(&claim, b"ok").await?;
                        }
                    }
                    pending.store(false, Ordering::SeqCst);
                    done.store(true, Ordering::SeqCst);
                    Ok::<(), dedupkv::Error>(())
                })
            };
            let observer = {
                let backend = backend.clone();
                tokio::spawn(async move {
                    loop {
                        if pending.load(Ordering::SeqCst) {
                            backend.release_syncs();
                            return true;
                        }
                        if done.load(Ordering::SeqCst) {
                            return false;
                        }
                        tokio::task::yield_now().await;
                    }
                })
            };
            writer.await.expect("writer")?;
            let saw = observer.await.expect("observer");
            assert!(
                saw,
                "{op}: no other task ran while it waited for its commit"
            );
        }
        Ok(())
    });
    drop(watchdog);
    result
}

/// A call that reads a record whose commit is still in flight (a repeat
/// of a key completed a moment ago, a `get` of it) reads that record from
/// memory: it neither blocks the runtime's one thread nor runs again, and
/// it answers only once that commit is durable. With the disk's syncs
/// held, the three futures stay pending while other tasks run; released,
/// each answers the completed outcome. A call that waited inline would
/// hold the thread until the watchdog released the disk (30 s), and all
/// three would be finished when first looked at.
#[test]
fn a_read_of_a_record_in_flight_awaits_its_commit_without_blocking() -> Result<()> {
    let backend = FaultBackend::new();
    let store = AsyncStore::new(Store::builder().open_with_backend(backend.clone())?);
    let (rt, watchdog) = held_disk_runtime(&backend);
    let result = rt.block_on(async {
        let key = Key::new("op", "k");
        let claim = started(store.begin(&key, Fingerprint::NONE).await?);
        backend.hold_syncs();
        let completing = {
            let store = store.clone();
            tokio::spawn(async move { store.complete(&claim, b"done").await })
        };
        // Its record is appended on its first poll.
        tokio::task::yield_now().await;
        let replay = {
            let store = store.clone();
            let key = key.clone();
            tokio::spawn(async move { store.begin(&key, Fingerprint::NONE).await })
        };
        let got = {
            let store = store.clone();
            tokio::spawn(async move { store.get(&key).await })
        };
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
        let told = [
            completing.is_finished(),
            replay.is_finished(),
            got.is_finished(),
        ];
        assert_eq!(told, [false; 3], "answered before its commit was durable");
        backend.release_syncs();
        completing.await.expect("complete")?;
        match replay.await.expect("begin")? {
            Begin::Completed(r) => assert_eq!(r.outcome(), Some(&b"done"[..])),
            other => panic!("a replay of the completed key: {other:?}"),
        }
        let got = got.await.expect("get")?.expect("recorded");
        assert_eq!(
            (got.state(), got.outcome()),
            (State::Completed, Some(&b"done"[..]))
        );
        Ok(())
    });
    drop(watchdog);
    result
}
