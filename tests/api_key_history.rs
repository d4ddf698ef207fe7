//! `Store::history`: every record of a key still in the store, oldest
//! first, across buckets; other keys' records left out; evicted records
//! gone; the read-only open reads it and leaves the file as it was.

use std::time::Duration;

use dedupkv::{Begin, Claim, Error, Failure, Fingerprint, Key, ManualClock, Record, State, Store};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MIN: Duration = Duration::from_secs(60);

fn started(store: &Store, key: &Key<'_>) -> Result<Claim, Box<dyn std::error::Error>> {
    match store.begin(key, Fingerprint::NONE)? {
        Begin::Started(c) => Ok(c),
        _ => Err("expected a new attempt".into()),
    }
}

fn states(store: &Store, key: &Key<'_>) -> dedupkv::Result<Vec<State>> {
    Ok(store.history(key)?.iter().map(Record::state).collect())
}

/// A store with a manual clock, 10 minutes' retention in 1-minute buckets.
fn minute_buckets(dir: &std::path::Path) -> dedupkv::Result<(Store, ManualClock)> {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = Store::builder()
        .clock(clock.clone())
        .retention(10 * MIN)
        .bucket_granularity(MIN)
        .open(dir.join("s.redb"))?;
    Ok((store, clock))
}

#[test]
fn every_attempt_oldest_first_with_its_token_time_and_outcome() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (store, clock) = minute_buckets(dir.path())?;
    let key = Key::new("payments", "order-4711");
    let other = Key::new("payments", "order-4712");
    let first = started(&store, &key)?;
    // Another key's records in the same rows and buckets are not its.
    store.insert_if_absent(&other)?;
    clock.advance(3 * MIN); // the next records go to later buckets
    store.fail(&first, Failure::Retryable)?;
    let second = started(&store, &key)?;
    clock.advance(3 * MIN);
    store.complete(&second, b"charged")?;
    store.insert_if_absent(&Key::new("payments", "order-4713"))?;

    let h = store.history(&key)?;
    assert_eq!(
        h.iter().map(Record::state).collect::<Vec<_>>(),
        [
            State::InProgress,
            State::Retryable,
            State::InProgress,
            State::Completed
        ]
    );
    assert!(h.iter().all(|r| r.key() == &key));
    assert_eq!(
        h.iter().map(Record::attempts).collect::<Vec<_>>(),
        [1, 1, 2, 2]
    );
    assert_eq!(
        h[0].token(),
        h[1].token(),
        "a release keeps its attempt's token"
    );
    assert!(h[2].token() > h[0].token(), "a new attempt has a new token");
    assert!(h.windows(2).all(|w| w[0].updated_at() <= w[1].updated_at()));
    assert_eq!(h[3].outcome(), Some(&b"charged"[..]));
    // Its latest record is what `get` gives.
    assert_eq!(store.get(&key)?.as_ref(), h.last());
    assert_eq!(states(&store, &other)?, [State::Inserted]);
    assert!(store.history(&Key::new("payments", "never"))?.is_empty());
    Ok(())
}

#[test]
fn evicted_records_are_gone_and_a_forget_is_in_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (store, clock) = minute_buckets(dir.path())?;
    let key = Key::new("t", "k");
    let first = started(&store, &key)?;
    store.fail(&first, Failure::Retryable)?;
    clock.advance(5 * MIN);
    let second = started(&store, &key)?;
    store.complete(&second, b"ok")?;
    // The first attempt's bucket expires; the second's does not.
    clock.advance(7 * MIN);
    store.evict_expired()?;
    assert_eq!(states(&store, &key)?, [State::InProgress, State::Completed]);
    store.forget(&key)?;
    assert_eq!(
        states(&store, &key)?,
        [State::InProgress, State::Completed, State::Forgotten]
    );
    assert!(matches!(
        store.history(&Key::new("", "k")),
        Err(Error::InvalidArgument { .. })
    ));
    Ok(())
}

#[test]
fn the_read_only_open_reads_it_and_writes_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.redb");
    let key = Key::new("t", "k");
    {
        let store = Store::open(&path)?;
        let c = started(&store, &key)?;
        store.fail(&c, Failure::Retryable)?;
        let c = started(&store, &key)?;
        store.fail(&c, Failure::Permanent(b"declined"))?;
    }
    let (bytes, mtime) = (std::fs::read(&path)?, std::fs::metadata(&path)?.modified()?);
    let ro = Store::open_read_only(&path)?;
    let h = ro.history(&key)?;
    assert_eq!(
        h.iter().map(Record::state).collect::<Vec<_>>(),
        [
            State::InProgress,
            State::Retryable,
            State::InProgress,
            State::Failed
        ]
    );
    assert!(h[3].is_failure());
    assert_eq!(h[3].outcome(), Some(&b"declined"[..]));
    drop(ro);
    assert_eq!(std::fs::read(&path)?, bytes);
    assert_eq!(std::fs::metadata(&path)?.modified()?, mtime);
    Ok(())
}
