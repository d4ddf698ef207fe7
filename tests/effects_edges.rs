//! Edges of the dead-letter area and the intents, found by attacking them:
//! each test names a promise of the module docs and a scenario against it.

use std::time::Duration;

use dedupkv::{
    Begin, BeginOptions, DeadLetter, Durability, Error, Failure, Fingerprint, Intent, Key, Listing,
    ManualClock, Result, State, Store,
};
use dedupkv_testkit::{HOUR, MIN, T0, hour_window as builder, started, tempdir};

fn dead(b: Begin) -> DeadLetter {
    match b {
        Begin::DeadLettered(d) => d,
        other => panic!("expected DeadLettered, got {other:?}"),
    }
}

fn exhaust(store: &Store, key: &Key<'_>, reason: &str) -> Result<()> {
    let claim = started(store.begin(key, Fingerprint::of("req"))?);
    store.fail(
        &claim,
        Failure::Exhausted {
            reason,
            payload: None,
        },
    )
}

/// A dead letter whose record's bucket has passed but that no eviction
/// pass has carried yet (background eviction off, or between its ticks)
/// must still be a dead letter: "retention never drops it".
#[test]
fn a_dead_letter_past_its_bucket_before_eviction_is_still_dead_lettered() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "stuck");
    exhaust(&store, &key, "gave up")?;
    clock.advance(2 * HOUR); // no evict_expired yet
    assert_eq!(
        store.dead_letters(&Listing::new())?.items.len(),
        1,
        "the listing still shows it"
    );
    let rec = store.get(&key)?;
    assert_eq!(rec.map(|r| r.state()), Some(State::DeadLettered), "get");
    let answer = store.begin(&key, Fingerprint::of("req"))?;
    assert!(
        matches!(answer, Begin::DeadLettered(_)),
        "begin must not start attempt 1 over a dead letter: {answer:?}"
    );
    Ok(())
}

/// The same window through `insert_if_absent` and `requeue`.
#[test]
fn requeue_and_insert_see_a_dead_letter_past_its_bucket() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "stuck");
    exhaust(&store, &key, "gave up")?;
    clock.advance(2 * HOUR);
    assert!(!store.insert_if_absent(&key)?, "a dead letter is present");
    assert!(store.requeue(&key)?, "a listed dead letter can be requeued");
    Ok(())
}

/// Two dead letters of one key in one log row (Deferred durability: one
/// batch): eviction must carry the latest, not the first it meets.
#[test]
fn eviction_carries_the_latest_dead_letter_of_a_row() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .durability(Durability::Deferred {
            max_delay: Duration::from_secs(600),
        })
        .open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "stuck");
    let commits = store.stats().commits;
    exhaust(&store, &key, "first")?;
    assert!(store.requeue(&key)?);
    exhaust(&store, &key, "second")?;
    assert_eq!(store.stats().commits, commits, "one batch, one row");
    let before = dead(store.begin(&key, Fingerprint::of("req"))?);
    assert_eq!((before.reason(), before.attempts()), ("second", 2));
    clock.advance(2 * HOUR);
    store.evict_expired()?;
    let after = dead(store.begin(&key, Fingerprint::of("req"))?);
    assert_eq!(
        (after.reason(), after.attempts()),
        ("second", 2),
        "the carried dead letter is the latest one"
    );
    Ok(())
}

/// Two pending intents of one key in one row (attempt 1 released, attempt
/// 2 begun with a new request): eviction must carry attempt 2's.
#[test]
fn eviction_carries_the_latest_pending_intent_of_a_row() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .durability(Durability::Deferred {
            max_delay: Duration::from_secs(600),
        })
        .open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "ship");
    let commits = store.stats().commits;
    let first = Intent {
        target: "carrier-a",
        request: b"req-1",
    };
    let second = Intent {
        target: "carrier-b",
        request: b"req-2",
    };
    let opts = BeginOptions::new();
    let c1 = started(store.begin_with_intent(&key, Fingerprint::of("req"), &opts, first)?);
    store.fail(&c1, Failure::Retryable)?;
    let c2 = started(store.begin_with_intent(&key, Fingerprint::of("req"), &opts, second)?);
    assert_eq!(store.stats().commits, commits, "one batch, one row");
    let e = store.intent(&key)?.expect("pending");
    assert_eq!(
        (e.target(), e.request(), e.attempt()),
        ("carrier-b", Some(&b"req-2"[..]), 2)
    );
    drop(c2); // released; the intent stays unanswered
    clock.advance(2 * HOUR);
    store.evict_expired()?;
    let e = store
        .intent(&key)?
        .expect("an unanswered intent is carried");
    assert_eq!(
        (e.target(), e.request(), e.attempt()),
        ("carrier-b", Some(&b"req-2"[..]), 2),
        "the carried intent is the latest one"
    );
    Ok(())
}

/// `Failure::Exhausted`'s reason is "kept whole, within `max_outcome_len`":
/// a reason of exactly the limit must be accepted (or refused naming the
/// reason, not an "outcome" the caller never passed).
#[test]
fn a_reason_at_max_outcome_len_is_within_the_limit() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .max_outcome_len(64)
        .open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "long");
    let claim = started(store.begin(&key, Fingerprint::of("req"))?);
    let reason = "r".repeat(64);
    let res = store.fail(
        &claim,
        Failure::Exhausted {
            reason: &reason,
            payload: None,
        },
    );
    match res {
        Ok(()) => {}
        Err(Error::InvalidInput { what, len, .. }) => {
            assert_eq!(
                (what, len),
                ("reason", 64),
                "the error names what was passed"
            );
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// `mark_sent` checks the reference alone, but the Intent record holds
/// target + reference + 13 bytes: a call that passes the check writes a
/// record over `max_outcome_len` (over the format's limit at the top).
#[test]
fn mark_sent_keeps_the_intent_record_within_max_outcome_len() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .max_outcome_len(64)
        .open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "ship");
    let target = "t".repeat(50); // 50 + 0 + 13 = 63: accepted
    let intent = Intent {
        target: &target,
        request: b"",
    };
    let claim = started(store.begin_with_intent(
        &key,
        Fingerprint::of("req"),
        &BeginOptions::new(),
        intent,
    )?);
    let res = store.mark_sent(&claim, &[7u8; 64]); // record body: 127 bytes
    assert!(
        matches!(res, Err(Error::InvalidInput { .. })),
        "a 127-byte intent body passed a 64-byte limit: {res:?}"
    );
    Ok(())
}

/// What the window above costs: a redelivery in it starts attempt 1 and
/// the dead letter is gone from the area for good.
#[test]
fn a_redelivery_past_the_bucket_does_not_erase_the_dead_letter() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "stuck");
    exhaust(&store, &key, "gave up")?;
    clock.advance(2 * HOUR);
    if let Begin::Started(c) = store.begin(&key, Fingerprint::of("req"))? {
        store.complete(&c, b"done twice")?;
    }
    store.evict_expired()?;
    assert_eq!(
        store.dead_letters(&Listing::new())?.items.len(),
        1,
        "the dead letter left without requeue, resolve or forget"
    );
    Ok(())
}

/// A forward jump of more than 2^21 buckets (forced eviction) keeps the
/// dead letter and the unanswered intent.
#[test]
fn a_clock_jump_past_the_forced_eviction_span_keeps_both() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let path = dir.path().join("s.redb");
    let store = builder(&clock).open(&path)?;
    let key = Key::new("shop", "stuck");
    exhaust(&store, &key, "gave up")?;
    let ship = Key::new("shop", "ship");
    let intent = Intent {
        target: "carrier",
        request: b"r",
    };
    let c = started(store.begin_with_intent(
        &ship,
        Fingerprint::of("req"),
        &BeginOptions::new(),
        intent,
    )?);
    store.fail(&c, Failure::Retryable)?;
    clock.advance(MIN * ((1 << 21) + 10));
    let d = dead(store.begin(&key, Fingerprint::of("req"))?);
    assert_eq!(d.reason(), "gave up");
    assert!(store.intent(&ship)?.is_some_and(|e| !e.is_sent()));
    drop(store);
    clock.advance(MIN * ((1 << 21) + 10));
    let store = builder(&clock).open(&path)?;
    assert_eq!(
        dead(store.begin(&key, Fingerprint::of("req"))?).reason(),
        "gave up"
    );
    assert_eq!(store.pending_intents(&Listing::new())?.items.len(), 1);
    Ok(())
}

/// A clock at `u64::MAX` (held at 9999-12-31): dead-lettering, requeue and
/// reopen work, nothing panics.
#[test]
fn dead_letters_at_the_end_of_time() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(u64::MAX);
    let path = dir.path().join("s.redb");
    let store = builder(&clock).open(&path)?;
    let key = Key::new("shop", "late");
    exhaust(&store, &key, "late")?;
    assert_eq!(
        dead(store.begin(&key, Fingerprint::of("req"))?).reason(),
        "late"
    );
    drop(store);
    let store = builder(&clock).open(&path)?;
    assert!(store.requeue(&key)?);
    let c = started(store.begin(&key, Fingerprint::of("req"))?);
    assert_eq!(c.attempt(), 2);
    Ok(())
}

/// An eviction of an expired bucket deleted in slices, cut by an I/O fault
/// at every point: the crash image reopens with the dead letter and the
/// unanswered intent, at their latest attempt.
#[test]
fn a_crash_in_a_sliced_eviction_loses_no_dead_letter_or_intent() -> Result<()> {
    use dedupkv_testkit::{FaultBackend, Plan};
    let mut tripped = 0;
    for n in 0..60 {
        let backend = FaultBackend::new();
        let clock = ManualClock::new(T0);
        let open = |b: FaultBackend| builder(&clock).evict_slice_bytes(1).open_with_backend(b);
        let store = open(backend.clone())?;
        let key = Key::new("shop", "stuck");
        let ship = Key::new("shop", "ship");
        for i in 0..10 {
            store.insert_if_absent(&Key::new("shop", &format!("plain-{i}")))?;
        }
        exhaust(&store, &key, "gave up")?;
        let intent = Intent {
            target: "carrier",
            request: b"r",
        };
        let c = started(store.begin_with_intent(
            &ship,
            Fingerprint::of("req"),
            &BeginOptions::new(),
            intent,
        )?);
        store.fail(&c, Failure::Retryable)?;
        for i in 10..20 {
            store.insert_if_absent(&Key::new("shop", &format!("plain-{i}")))?;
        }
        clock.advance(2 * HOUR);
        backend.arm(Plan::after(n).syncs_only());
        let res = store.evict_expired();
        tripped += u64::from(backend.tripped());
        let image = backend.crash_image();
        drop(store);
        let _ = res;
        let store = open(image)?;
        let d = dead(store.begin(&key, Fingerprint::of("req"))?);
        assert_eq!((d.reason(), d.attempts()), ("gave up", 1), "cut after {n}");
        assert_eq!(
            store.pending_intents(&Listing::new())?.items.len(),
            1,
            "cut after {n}"
        );
    }
    assert!(tripped > 3, "the sweep hit the eviction ({tripped})");
    Ok(())
}

/// After `forget`, a new operation on the key recorded no intent: the
/// forgotten operation's sent intent is not its intent, and `mark_sent`
/// refuses as documented ("`InvalidArgument` if it recorded no intent").
#[test]
fn a_forgotten_operations_sent_intent_does_not_stick_to_the_next() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "ship");
    let intent = Intent {
        target: "carrier",
        request: b"r",
    };
    let c = started(store.begin_with_intent(
        &key,
        Fingerprint::of("req"),
        &BeginOptions::new(),
        intent,
    )?);
    store.mark_sent(&c, b"1Z")?;
    store.complete(&c, b"ok")?;
    assert!(matches!(store.forget(&key)?, dedupkv::Forget::Forgotten(_)));
    let fresh = started(store.begin(&key, Fingerprint::of("other"))?);
    let res = store.mark_sent(&fresh, b"2Z");
    assert!(
        matches!(res, Err(Error::InvalidArgument { .. })),
        "the new operation recorded no intent: {res:?}"
    );
    Ok(())
}

/// The Intent record follows the Claim record in one row: get, forget's
/// audit read, the stranded listing and a reopen read the claim.
#[test]
fn an_intent_after_the_claim_in_its_row_is_never_the_keys_state() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let path = dir.path().join("s.redb");
    let store = builder(&clock).open(&path)?;
    let key = Key::new("shop", "ship");
    let intent = Intent {
        target: "carrier",
        request: b"r",
    };
    let c = started(store.begin_with_intent(
        &key,
        Fingerprint::of("req"),
        &BeginOptions::new(),
        intent,
    )?);
    assert_eq!(store.get(&key)?.map(|r| r.state()), Some(State::InProgress));
    std::mem::forget(c); // the worker vanished, its lease lapses
    clock.advance(MIN);
    let stranded = store.stranded_claims(&Listing::new())?;
    assert_eq!(stranded.items.len(), 1);
    assert_eq!(stranded.items[0].state(), State::InProgress);
    drop(store);
    let store = builder(&clock).open(&path)?;
    assert_eq!(store.get(&key)?.map(|r| r.state()), Some(State::InProgress));
    match store.forget(&key)? {
        dedupkv::Forget::Forgotten(r) => assert_eq!(r.state(), State::InProgress),
        other => panic!("expected Forgotten, got {other:?}"),
    }
    assert!(
        store.pending_intents(&Listing::new())?.items.is_empty(),
        "forget closed it"
    );
    Ok(())
}
