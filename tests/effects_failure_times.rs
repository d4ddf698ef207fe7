//! A dead letter says when its operation first failed and when it last
//! did: the first failure of its round (a retryable failure, a dropped
//! claim, an attempt found stranded), kept across restarts, takeovers,
//! eviction and a requeue's new round.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::{
    Begin, DeadLetter, Failure, Fingerprint, Key, Listing, ManualClock, Result, Store, StoreBuilder,
};
use dedupkv_testkit::{T0, started, tempdir};

const SEC: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);

fn builder(clock: &ManualClock) -> StoreBuilder {
    dedupkv_testkit::builder(clock)
        .lease(30 * SEC)
        .retention(HOUR)
        .bucket_granularity(60 * SEC)
}

fn open(path: &Path, clock: &ManualClock) -> Result<Store> {
    builder(clock).open(path)
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn key() -> Key<'static> {
    Key::new("shop", "ship-7")
}

fn begin(store: &Store) -> Result<Begin> {
    store.begin(&key(), Fingerprint::NONE)
}

fn give_up(store: &Store) -> Result<DeadLetter> {
    let c = started(begin(store)?);
    store.fail(
        &c,
        Failure::Exhausted {
            reason: "carrier down",
            payload: None,
        },
    )?;
    one_dead_letter(store)
}

fn one_dead_letter(store: &Store) -> Result<DeadLetter> {
    let page = store.dead_letters(&Listing::new())?;
    let [dl] = &page.items[..] else {
        panic!("dead letters: {:?}", page.items)
    };
    Ok(dl.clone())
}

/// Three retryable failures across two restarts, then the dead letter:
/// the first failure is the first release's time, the last the dead
/// letter's — not the first attempt's time.
#[test]
fn a_dead_letter_reports_its_first_and_last_failure_across_restarts() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    for _ in 0..3 {
        let store = open(&path, &clock)?;
        let c = started(begin(&store)?);
        clock.advance(5 * SEC); // the call takes a while, then fails
        store.fail(&c, Failure::Retryable)?;
        clock.advance(20 * SEC);
    }
    let store = open(&path, &clock)?;
    let dl = give_up(&store)?;
    assert_eq!(dl.first_attempt_at(), at(T0));
    assert_eq!(dl.first_failed_at(), at(T0 + 5_000), "the first release");
    assert_eq!(dl.failed_at(), at(T0 + 75_000), "the dead letter itself");
    assert_eq!(dl.attempts(), 4);
    drop(store);
    let store = open(&path, &clock)?;
    assert_eq!(one_dead_letter(&store)?, dl, "durably");
    Ok(())
}

/// A hung worker's lease lapses and a later attempt takes over: the
/// round's first failure is when the lease lapsed, not the takeover.
#[test]
fn a_lapsed_lease_is_a_failure_from_its_end() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir.path().join("s.redb"), &clock)?;
    std::mem::forget(started(begin(&store)?)); // hangs
    clock.advance(100 * SEC);
    let dl = give_up(&store)?;
    assert_eq!(dl.first_failed_at(), at(T0 + 30_000), "its lease's end");
    assert_eq!(dl.failed_at(), at(T0 + 100_000));
    Ok(())
}

/// A worker with a one-hour lease dies; the store is reopened a minute
/// later. The attempt failed by the reopen at the latest (the process is
/// gone), not an hour later.
#[test]
fn a_dead_process_is_a_failure_from_the_reopen_at_the_latest() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    {
        let store = builder(&clock)
            .lease(HOUR)
            .retention(2 * HOUR)
            .open(&path)?;
        std::mem::forget(started(begin(&store)?));
    }
    clock.advance(60 * SEC);
    let store = builder(&clock)
        .lease(HOUR)
        .retention(2 * HOUR)
        .open(&path)?;
    clock.advance(30 * SEC);
    let dl = give_up(&store)?;
    assert_eq!(dl.first_failed_at(), at(T0 + 60_000), "the reopen");
    assert_eq!(dl.failed_at(), at(T0 + 90_000));
    Ok(())
}

/// A claim dropped without an answer is a failure when it is dropped; an
/// operation dead-lettered at its first failure has one time for both.
#[test]
fn a_dropped_claim_fails_when_dropped_and_a_first_failure_can_be_the_last() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir.path().join("s.redb"), &clock)?;
    let other = Key::new("shop", "ship-8");
    let c = started(store.begin(&other, Fingerprint::NONE)?);
    clock.advance(3 * SEC);
    store.fail(
        &c,
        Failure::Exhausted {
            reason: "address refused",
            payload: None,
        },
    )?;
    let dl = one_dead_letter(&store)?;
    assert_eq!(
        (dl.first_failed_at(), dl.failed_at()),
        (at(T0 + 3_000), at(T0 + 3_000))
    );
    assert!(store.resolve(&other, dedupkv::Resolution::Abandoned("by hand"))?);

    drop(started(begin(&store)?)); // a handler that returned early
    clock.advance(7 * SEC);
    let dl = give_up(&store)?;
    assert_eq!(dl.first_failed_at(), at(T0 + 3_000), "dropped at +3 s");
    assert_eq!(dl.failed_at(), at(T0 + 10_000));
    Ok(())
}

/// A requeue starts a new round: the next dead letter's first failure is
/// that round's. And a dead letter carried past its retention, and past a
/// long close, keeps both times.
#[test]
fn a_requeue_starts_the_count_again_and_carrying_keeps_both_times() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let store = open(&path, &clock)?;
    let c = started(begin(&store)?);
    store.fail(&c, Failure::Retryable)?;
    clock.advance(10 * SEC);
    give_up(&store)?;
    clock.advance(HOUR);
    assert!(store.requeue(&key())?);
    let requeued = T0 + 10_000 + 3_600_000;
    clock.advance(5 * SEC);
    let c = started(begin(&store)?);
    store.fail(&c, Failure::Retryable)?;
    clock.advance(5 * SEC);
    let dl = give_up(&store)?;
    assert_eq!(dl.first_failed_at(), at(requeued + 5_000), "this round's");
    assert_eq!(dl.failed_at(), at(requeued + 10_000));

    clock.advance(3 * HOUR);
    store.evict_expired()?;
    assert_eq!(
        one_dead_letter(&store)?.first_failed_at(),
        dl.first_failed_at()
    );
    drop(store);
    clock.advance(30 * 24 * HOUR);
    let store = open(&path, &clock)?;
    let carried = one_dead_letter(&store)?;
    assert_eq!(
        (carried.first_failed_at(), carried.failed_at()),
        (dl.first_failed_at(), dl.failed_at())
    );
    Ok(())
}
