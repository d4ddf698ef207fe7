//! The dead-letter area: exhausted operations land there with their
//! reason, stay through reopen, retention and a long close, stop being
//! retried, and leave only by requeue, resolve or forget.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use dedupkv::{
    Begin, DeadLetter, ErrorClass, Failure, Fingerprint, Forget, Key, Listing, ManualClock,
    Resolution, Result, RetryPolicy, Run, State, Store,
};
use dedupkv_testkit::{HOUR, MIN, T0, hour_window as builder, started, tempdir};

/// Begins `key` and dead-letters its attempt with `reason`.
fn dead_letter(store: &Store, key: &Key<'_>, reason: &str, payload: Option<&[u8]>) -> Result<()> {
    let claim = started(store.begin(key, Fingerprint::of("req"))?);
    store.fail(&claim, Failure::Exhausted { reason, payload })
}

fn dead(b: Begin) -> DeadLetter {
    match b {
        Begin::DeadLettered(d) => d,
        other => panic!("expected DeadLettered, got {other:?}"),
    }
}

fn all(store: &Store) -> Result<Vec<DeadLetter>> {
    Ok(store.dead_letters(&Listing::new().limit(10_000))?.items)
}

fn reopen(path: &Path, clock: &ManualClock) -> Result<Store> {
    builder(clock).open(path)
}

#[test]
fn an_exhausted_operation_lands_in_the_area_with_its_reason_and_payload() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "ship-1");
    let claim = started(store.begin(&key, Fingerprint::of("req"))?);
    clock.advance(Duration::from_secs(5));
    let claim = {
        store.fail(&claim, Failure::Retryable)?;
        started(store.begin(&key, Fingerprint::of("req"))?)
    };
    clock.advance(Duration::from_secs(5));
    store.fail(
        &claim,
        Failure::Exhausted {
            reason: "carrier down after 2 attempts",
            payload: Some(b"order 1"),
        },
    )?;
    let dl = dead(store.begin(&key, Fingerprint::of("req"))?);
    assert_eq!(dl.key(), &key);
    assert_eq!(dl.attempts(), 2);
    assert_eq!(dl.reason(), "carrier down after 2 attempts");
    assert_eq!(dl.payload(), Some(&b"order 1"[..]));
    assert_eq!(
        dl.first_attempt_at(),
        UNIX_EPOCH + Duration::from_millis(T0)
    );
    assert_eq!(
        dl.failed_at(),
        UNIX_EPOCH + Duration::from_millis(T0 + 10_000)
    );
    assert_eq!(dl.record().provider_key(), Some(claim.provider_key()?));
    let rec = store.get(&key)?.expect("recorded");
    assert_eq!(rec.state(), State::DeadLettered);
    assert_eq!(rec.outcome(), Some(&b"carrier down after 2 attempts"[..]));
    assert!(
        !store.insert_if_absent(&key)?,
        "a dead letter is a duplicate"
    );
    assert!(
        store.begin(&key, Fingerprint::of("another")).is_err(),
        "another request under the key is still a mismatch"
    );
    assert!(
        matches!(
            store.complete(&claim, b"late"),
            Err(dedupkv::Error::ClaimLost { .. })
        ),
        "its claim is finished"
    );
    let s = store.stats();
    assert_eq!((s.dead_lettered, s.dead_letters_now), (1, 1));
    assert_eq!(all(&store)?, vec![dl]);
    Ok(())
}

#[test]
fn dead_letters_survive_reopen() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    {
        let store = reopen(&path, &clock)?;
        dead_letter(&store, &Key::new("shop", "a"), "gave up", Some(b"p"))?;
        dead_letter(&store, &Key::new("shop", "b"), "gave up too", None)?;
    }
    let store = reopen(&path, &clock)?;
    let dl = dead(store.begin(&Key::new("shop", "a"), Fingerprint::of("req"))?);
    assert_eq!((dl.reason(), dl.payload()), ("gave up", Some(&b"p"[..])));
    assert_eq!(all(&store)?.len(), 2);
    assert_eq!(store.stats().dead_letters_now, 2);
    Ok(())
}

#[test]
fn dead_letters_outlive_retention_while_the_store_runs() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let store = reopen(&path, &clock)?;
    let key = Key::new("shop", "stuck");
    dead_letter(&store, &key, "gave up", Some(b"p"))?;
    store.insert_if_absent(&Key::new("shop", "plain"))?;
    for round in 0..5 {
        clock.advance(2 * HOUR);
        let ev = store.evict_expired()?;
        if round == 0 {
            assert_eq!(ev.keys, 1, "the plain key expires");
        }
        assert!(ev.buckets >= 1, "round {round}: its bucket is deleted");
        let dl = dead(store.begin(&key, Fingerprint::of("req"))?);
        assert_eq!((dl.reason(), dl.payload()), ("gave up", Some(&b"p"[..])));
    }
    assert!(store.get(&Key::new("shop", "plain"))?.is_none());
    drop(store);
    let store = reopen(&path, &clock)?;
    assert_eq!(all(&store)?.len(), 1, "carried records reopen");
    Ok(())
}

#[test]
fn dead_letters_survive_a_store_closed_for_weeks() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    {
        let store = reopen(&path, &clock)?;
        dead_letter(&store, &Key::new("shop", "stuck"), "gave up", Some(b"p"))?;
        store.insert_if_absent(&Key::new("shop", "plain"))?;
    }
    clock.advance(Duration::from_secs(21 * 86_400));
    {
        let store = reopen(&path, &clock)?;
        let dl = dead(store.begin(&Key::new("shop", "stuck"), Fingerprint::of("req"))?);
        assert_eq!((dl.reason(), dl.payload()), ("gave up", Some(&b"p"[..])));
        assert!(store.get(&Key::new("shop", "plain"))?.is_none(), "expired");
    }
    // Carried at open into a live bucket: it survives the next reopen, and
    // another long pause.
    clock.advance(Duration::from_secs(21 * 86_400));
    let store = reopen(&path, &clock)?;
    assert_eq!(all(&store)?.len(), 1);
    Ok(())
}

#[test]
fn a_requeued_or_resolved_dead_letter_does_not_come_back_after_a_long_close() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    {
        let store = reopen(&path, &clock)?;
        for id in ["requeued", "resolved", "forgotten", "kept"] {
            dead_letter(&store, &Key::new("shop", id), "gave up", None)?;
        }
        clock.advance(Duration::from_secs(1));
        assert!(store.requeue(&Key::new("shop", "requeued"))?);
        assert!(store.resolve(
            &Key::new("shop", "resolved"),
            Resolution::Completed(b"by hand")
        )?);
        assert!(matches!(
            store.forget(&Key::new("shop", "forgotten"))?,
            Forget::Forgotten(_)
        ));
    }
    clock.advance(Duration::from_secs(21 * 86_400));
    let store = reopen(&path, &clock)?;
    let left: Vec<_> = all(&store)?.iter().map(|d| d.key().clone()).collect();
    assert_eq!(left, vec![Key::new("shop", "kept")]);
    for id in ["requeued", "resolved", "forgotten"] {
        let c = started(store.begin(&Key::new("shop", id), Fingerprint::of("req"))?);
        assert_eq!(c.attempt(), 1, "{id}: expired, a new operation");
    }
    Ok(())
}

#[test]
fn requeue_and_resolve_change_state_durably() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let (a, b, c) = (Key::new("t", "a"), Key::new("t", "b"), Key::new("t", "c"));
    {
        let store = reopen(&path, &clock)?;
        for k in [&a, &b, &c] {
            dead_letter(&store, k, "gave up", None)?;
        }
        assert!(!store.requeue(&Key::new("t", "none"))?, "not a dead letter");
        store.insert_if_absent(&Key::new("t", "plain"))?;
        assert!(!store.resolve(&Key::new("t", "plain"), Resolution::Abandoned("x"))?);
        assert!(store.requeue(&a)?);
        assert!(!store.requeue(&a)?, "requeued once");
        assert!(store.resolve(&b, Resolution::Completed(b"done by hand"))?);
        assert!(store.resolve(&c, Resolution::Abandoned("refunded instead"))?);
        assert_eq!(store.stats().dead_letters_now, 0);
    }
    let store = reopen(&path, &clock)?;
    let claim = started(store.begin(&a, Fingerprint::of("req"))?);
    assert_eq!(claim.attempt(), 2, "its history is kept");
    assert!(!claim.interrupted());
    store.complete(&claim, b"ok")?;
    let Begin::Completed(rec) = store.begin(&b, Fingerprint::of("req"))? else {
        panic!("resolved as completed")
    };
    assert_eq!(rec.outcome(), Some(&b"done by hand"[..]));
    let Begin::Completed(rec) = store.begin(&c, Fingerprint::of("req"))? else {
        panic!("resolved as abandoned")
    };
    assert!(rec.is_failure());
    assert_eq!(rec.outcome(), Some(&b"refunded instead"[..]));
    assert!(all(&store)?.is_empty());
    Ok(())
}

#[test]
fn the_oldest_dead_letters_age_moves_with_the_clock() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    assert_eq!(store.stats().oldest_dead_letter, None);
    dead_letter(&store, &Key::new("t", "old"), "x", None)?;
    clock.advance(Duration::from_secs(10));
    dead_letter(&store, &Key::new("t", "new"), "x", None)?;
    assert_eq!(
        store.stats().oldest_dead_letter,
        Some(Duration::from_secs(10))
    );
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        store.stats().oldest_dead_letter,
        Some(Duration::from_secs(70))
    );
    assert!(store.requeue(&Key::new("t", "old"))?);
    assert_eq!(
        store.stats().oldest_dead_letter,
        Some(Duration::from_secs(60))
    );
    assert!(store.resolve(&Key::new("t", "new"), Resolution::Abandoned("x"))?);
    assert_eq!(store.stats().oldest_dead_letter, None);
    Ok(())
}

#[test]
fn listings_filter_by_scope_and_age_and_page_without_repeats() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let mut want = Vec::new();
    for i in 0..25 {
        let scope = if i % 3 == 0 { "eu" } else { "us" };
        let key = Key::owned(scope.as_bytes().to_vec(), format!("op-{i:02}").into_bytes());
        dead_letter(&store, &key, &format!("reason {i}"), None)?;
        want.push(key);
        // Two per millisecond: ties are ordered too.
        if i % 2 == 1 {
            clock.advance(Duration::from_secs(1));
        }
    }
    let mut got = Vec::new();
    let mut listing = Listing::new().limit(7);
    let mut pages = 0;
    loop {
        let page = store.dead_letters(&listing)?;
        pages += 1;
        assert!(page.items.len() <= 7);
        got.extend(page.items.iter().map(|d| (d.failed_at(), d.key().clone())));
        match page.next {
            Some(c) => listing = listing.after(c),
            None => break,
        }
    }
    assert_eq!(pages, 4);
    assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "oldest first");
    let show = |k: &Key<'_>| k.to_string();
    let mut keys: Vec<String> = got.iter().map(|(_, k)| show(k)).collect();
    let mut want: Vec<String> = want.iter().map(show).collect();
    keys.sort();
    want.sort();
    assert_eq!(keys, want, "every dead letter exactly once");
    let eu = store.dead_letters(&Listing::new().scope("eu").limit(100))?;
    assert_eq!(eu.items.len(), 9);
    assert!(eu.items.iter().all(|d| d.key().scope() == b"eu"));
    // Now is 12 s after the first: older than 10 s are the six of the first 2 s.
    let old = store.dead_letters(&Listing::new().older_than(Duration::from_secs(10)))?;
    assert_eq!(old.items.len(), 6, "{:?}", old.items.len());
    Ok(())
}

#[test]
fn early_eviction_for_max_keys_never_drops_a_dead_letter() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .max_keys(100)
        .open(dir.path().join("s.redb"))?;
    dead_letter(&store, &Key::new("t", "stuck"), "gave up", None)?;
    for round in 0..6 {
        clock.advance(MIN);
        let keys: Vec<String> = (0..60).map(|i| format!("r{round}-{i}")).collect();
        let batch: Vec<Key<'_>> = keys.iter().map(|k| Key::new("t", k)).collect();
        store.insert_batch(&batch)?;
        store.evict_expired()?;
    }
    assert!(
        store.stats().early_evicted_buckets > 0,
        "the bound evicted early"
    );
    dead(store.begin(&Key::new("t", "stuck"), Fingerprint::of("req"))?);
    Ok(())
}

#[test]
fn a_retry_policy_that_runs_out_dead_letters_and_stops_retrying_across_restarts() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(2))
        .clock(clock.clone())
        .seed(7)
        .build()?;
    let key = Key::new("shop", "label-9");
    let retryable = |_: &String| ErrorClass::Retryable;
    let mut calls = 0;
    for attempt in 1..=3u32 {
        // A restart between attempts: the count comes from the store.
        let store = reopen(&path, &clock)?;
        let run = policy.run(&store, &key, Fingerprint::of("req"), retryable, |_| {
            calls += 1;
            Err::<Vec<u8>, _>(format!("timeout {attempt}"))
        })?;
        match (attempt, run) {
            (1 | 2, Run::RetryAfter { attempt: a, .. }) => assert_eq!(a, attempt),
            (
                3,
                Run::GaveUp {
                    attempts,
                    dead_lettered,
                    ..
                },
            ) => {
                assert_eq!(attempts, 3);
                assert!(dead_lettered);
            }
            (_, other) => panic!("attempt {attempt}: {other:?}"),
        }
    }
    let store = reopen(&path, &clock)?;
    let run = policy.run(&store, &key, Fingerprint::of("req"), retryable, |_| {
        calls += 1;
        Ok(Vec::new())
    })?;
    let Run::DeadLettered(dl) = run else {
        panic!("{run:?}")
    };
    assert_eq!(calls, 3, "no fourth attempt");
    assert_eq!(dl.attempts(), 3);
    assert!(dl.reason().contains("timeout 3"), "{}", dl.reason());
    // Requeued by an operator, the policy runs it again, as attempt 4.
    assert!(store.requeue(&key)?);
    let run = policy.run(&store, &key, Fingerprint::of("req"), retryable, |c| {
        assert_eq!(c.attempt(), 4);
        Ok(b"shipped".to_vec())
    })?;
    assert!(matches!(run, Run::Done(_)), "{run:?}");
    Ok(())
}
