//! Waiting for an in-flight result (`begin_or_wait`), blocking and async:
//! the waiter gets the first attempt's outcome, failure or release, takes
//! over a lapsed lease, times out cleanly, and leaves nothing behind.
//!
//! The waits use a long timeout (`LONG`, 20 s) that a correct store never
//! reaches: each waiter is woken by the finish (or the lapse pass) at
//! once. A store that missed the wake-up would still answer right after
//! the timeout (its last `begin` sees the finish), so the tests check that
//! the wait ended before `LONG`: a bound no loaded machine comes near.

use std::time::{Duration, Instant};

use dedupkv::{AsyncStore, Begin, Failure, Fingerprint, Key, ManualClock, Result, State, Store};
use dedupkv_testkit::{started, tempdir};

const T0: u64 = 1_700_000_000_000;
const LONG: Duration = Duration::from_secs(20);

fn open(dir: &tempfile::TempDir, clock: &ManualClock) -> Result<Store> {
    Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(3600))
        .background_eviction(false)
        .open(dir.path().join("s.redb"))
}

fn key() -> Key<'static> {
    Key::new("t", "charge-7")
}

/// Spawns a blocking waiter on `key()` and returns once it waits.
fn waiter(store: &Store) -> Waiter {
    let before = store.stats().waiting;
    let s = store.clone();
    let h = std::thread::spawn(move || {
        let t = Instant::now();
        let answer = s.begin_or_wait(&key(), Fingerprint::NONE, LONG);
        (answer, t.elapsed())
    });
    while store.stats().waiting == before {
        std::thread::yield_now();
    }
    Waiter(h)
}

struct Waiter(std::thread::JoinHandle<(Result<Begin>, Duration)>);

impl Waiter {
    /// The waiter's answer; it must have been woken, not timed out.
    #[track_caller]
    fn join(self) -> Result<Begin> {
        let (answer, took) = self.0.join().expect("waiter");
        assert!(
            took < LONG,
            "woken by the finish, not the timeout ({took:?})"
        );
        answer
    }
}

#[test]
fn a_waiter_gets_the_outcome_once_the_claim_completes() -> Result<()> {
    let dir = tempdir();
    let store = open(&dir, &ManualClock::new(T0))?;
    let claim = started(store.begin(&key(), Fingerprint::NONE)?);
    let waiters: Vec<_> = (0..8).map(|_| waiter(&store)).collect();
    assert_eq!(store.stats().waiting, 8);
    store.complete(&claim, b"ch_1")?;
    for w in waiters {
        let Begin::Completed(rec) = w.join()? else {
            panic!("expected the first attempt's outcome")
        };
        assert_eq!(rec.outcome(), Some(&b"ch_1"[..]));
    }
    assert_eq!(store.stats().waiting, 0, "the key's waiters are gone");
    Ok(())
}

#[test]
fn a_waiter_gets_the_failure_when_the_claim_fails() -> Result<()> {
    let dir = tempdir();
    let store = open(&dir, &ManualClock::new(T0))?;
    let claim = started(store.begin(&key(), Fingerprint::NONE)?);
    let w = waiter(&store);
    store.fail(&claim, Failure::Permanent(b"card declined"))?;
    let Begin::Completed(rec) = w.join()? else {
        panic!("expected the failure")
    };
    assert_eq!(rec.state(), State::Failed);
    assert_eq!(rec.outcome(), Some(&b"card declined"[..]));
    Ok(())
}

#[test]
fn a_waiter_starts_when_the_claim_is_released_or_dropped() -> Result<()> {
    let dir = tempdir();
    let store = open(&dir, &ManualClock::new(T0))?;
    let claim = started(store.begin(&key(), Fingerprint::NONE)?);
    let w = waiter(&store);
    store.fail(&claim, Failure::Retryable)?;
    let second = started(w.join()?);
    assert_eq!(second.attempt(), 2);
    assert!(!second.interrupted());
    let w = waiter(&store);
    drop(second);
    let third = started(w.join()?);
    assert_eq!(third.attempt(), 3);
    assert!(third.interrupted(), "a dropped claim never answered");
    store.complete(&third, b"")
}

#[test]
fn a_waiter_takes_over_when_the_lease_lapses() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let zombie = started(store.begin(&key(), Fingerprint::NONE)?);
    let w = waiter(&store);
    clock.advance(Duration::from_secs(3601));
    // The store's time moved: waiters of lapsed leases look again.
    store.evict_expired()?;
    let taken = started(w.join()?);
    assert_eq!(taken.attempt(), 2);
    assert!(taken.interrupted());
    assert!(matches!(
        store.complete(&zombie, b"late"),
        Err(dedupkv::Error::ClaimLost { .. })
    ));
    store.complete(&taken, b"")
}

#[test]
fn a_waiter_times_out_cleanly() -> Result<()> {
    let dir = tempdir();
    let store = open(&dir, &ManualClock::new(T0))?;
    let claim = started(store.begin(&key(), Fingerprint::NONE)?);
    let answer = store.begin_or_wait(&key(), Fingerprint::NONE, Duration::from_millis(20))?;
    assert!(matches!(answer, Begin::InProgress(ref p) if p.attempt() == 1));
    assert_eq!(store.stats().waiting, 0);
    store.complete(&claim, b"")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Waits (yielding) until `n` callers wait.
async fn until_waiting(store: &AsyncStore, n: u64) {
    while store.store().stats().waiting != n {
        tokio::task::yield_now().await;
    }
}

#[test]
fn async_waiters_get_the_outcome_once_the_claim_completes() -> Result<()> {
    let dir = tempdir();
    let store = AsyncStore::new(open(&dir, &ManualClock::new(T0))?);
    runtime().block_on(async {
        let claim = started(store.begin(&key(), Fingerprint::NONE).await?);
        let mut waiters = Vec::new();
        for _ in 0..16 {
            let s = store.clone();
            waiters.push(tokio::spawn(async move {
                let t = Instant::now();
                let answer = s.begin_or_wait(&key(), Fingerprint::NONE, LONG).await;
                assert!(t.elapsed() < LONG, "woken by the finish, not the timeout");
                answer
            }));
        }
        until_waiting(&store, 16).await;
        store.complete(&claim, b"ch_1").await?;
        for w in waiters {
            let Begin::Completed(rec) = w.await.expect("task")? else {
                panic!("expected the outcome")
            };
            assert_eq!(rec.outcome(), Some(&b"ch_1"[..]));
        }
        assert_eq!(store.store().stats().waiting, 0);
        Ok(())
    })
}

#[test]
fn an_async_waiter_takes_over_at_the_lease_end() -> Result<()> {
    // The system clock and a short lease: the store's timer thread wakes
    // the waiter at the lease end (nothing else would).
    let dir = tempdir();
    let store = AsyncStore::new(
        Store::builder()
            .lease(Duration::from_millis(200))
            .open(dir.path().join("s.redb"))?,
    );
    runtime().block_on(async {
        let zombie = started(store.begin(&key(), Fingerprint::NONE).await?);
        let t = Instant::now();
        let taken = started(store.begin_or_wait(&key(), Fingerprint::NONE, LONG).await?);
        assert!(
            t.elapsed() < LONG,
            "woken at the lease end, not the timeout"
        );
        assert_eq!(taken.attempt(), 2);
        assert!(taken.interrupted());
        assert!(store.complete(&zombie, b"late").await.is_err());
        store.complete(&taken, b"").await
    })
}

#[test]
fn an_async_waiter_times_out_cleanly_and_a_cancelled_one_leaves_nothing() -> Result<()> {
    let dir = tempdir();
    let store = AsyncStore::new(open(&dir, &ManualClock::new(T0))?);
    runtime().block_on(async {
        let claim = started(store.begin(&key(), Fingerprint::NONE).await?);
        let answer = store
            .begin_or_wait(&key(), Fingerprint::NONE, Duration::from_millis(20))
            .await?;
        assert!(matches!(answer, Begin::InProgress(_)));
        assert_eq!(store.store().stats().waiting, 0);

        let s = store.clone();
        let cancelled =
            tokio::spawn(async move { s.begin_or_wait(&key(), Fingerprint::NONE, LONG).await });
        until_waiting(&store, 1).await;
        cancelled.abort();
        assert!(cancelled.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(store.store().stats().waiting, 0, "nothing left behind");
        store.complete(&claim, b"").await?;
        let again = store.begin(&key(), Fingerprint::NONE).await?;
        assert!(matches!(again, Begin::Completed(_)));
        Ok(())
    })
}
