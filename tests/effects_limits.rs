//! Retry limits hold before the attempt they limit: the store counts an
//! operation's rounds (from its first attempt, and from each requeue) and
//! the attempts of a round that never answered, across restarts; the
//! runners check `max_attempts` and `max_elapsed` after the claim is taken
//! and before the work is called, so an operation whose workers keep
//! dying, or whose time ran out while no worker ran, is dead-lettered
//! without one more call, and `requeue` grants another round.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use dedupkv::{
    ErrorClass, Failure, Fingerprint, GiveUpReason, Key, Listing, ManualClock, Result, RetryPolicy,
    Run, State, Store,
};
use dedupkv_testkit::{T0, started, tempdir};

fn open(path: &Path, clock: &ManualClock) -> Result<Store> {
    Store::builder().clock(clock.clone()).open(path)
}

fn retryable(_: &String) -> ErrorClass {
    ErrorClass::Retryable
}

/// A policy of `max` attempts whose delays are all 1 ms, on `clock`.
fn policy(clock: &ManualClock, max: u32) -> Result<RetryPolicy> {
    RetryPolicy::builder()
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(1))
        .max_attempts(max)
        .seed(1)
        .clock(clock.clone())
        .build()
}

/// One attempt whose worker dies inside the work: a real process leaves
/// its claim behind, as `forget` does here.
fn die_inside(store: &Store, key: &Key<'_>) -> Result<u32> {
    let claim = started(store.begin(key, Fingerprint::NONE)?);
    let attempt = claim.attempt();
    std::mem::forget(claim);
    Ok(attempt)
}

#[test]
fn the_round_and_its_interruptions_survive_reopen_requeue_and_release() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let key = Key::new("shop", "poison");
    for _ in 0..2 {
        die_inside(&open(&path, &clock)?, &key)?;
        clock.advance(Duration::from_secs(1));
    }
    let store = open(&path, &clock)?;
    let c = started(store.begin(&key, Fingerprint::NONE)?);
    assert_eq!(
        (c.attempt(), c.round_attempt(), c.interruptions()),
        (3, 3, 2)
    );
    assert_eq!(c.round_started_at(), c.first_seen_at());
    store.renew(&c)?; // a renewal rewrites the claim record: the round stays
    store.fail(
        &c,
        Failure::Exhausted {
            reason: "poison",
            payload: None,
        },
    )?;
    clock.advance(Duration::from_secs(60));
    assert!(store.requeue(&key)?);
    drop(store);

    // A new round: numbered on, counted from 1, timed from the requeue.
    let requeued_at = UNIX_EPOCH + Duration::from_millis(T0 + 62_000);
    let store = open(&path, &clock)?;
    let c = started(store.begin(&key, Fingerprint::NONE)?);
    assert_eq!(
        (c.attempt(), c.round_attempt(), c.interruptions()),
        (4, 1, 0)
    );
    assert_eq!(c.round_started_at(), requeued_at);
    assert_eq!(c.first_seen_at(), UNIX_EPOCH + Duration::from_millis(T0));
    std::mem::forget(c);
    drop(store);
    let store = open(&path, &clock)?;
    let c = started(store.begin(&key, Fingerprint::NONE)?);
    assert_eq!(
        (c.attempt(), c.round_attempt(), c.interruptions()),
        (5, 2, 1)
    );
    assert_eq!(
        c.round_started_at(),
        requeued_at,
        "kept in the claim record"
    );
    store.fail(&c, Failure::Retryable)?; // answered: not an interruption
    drop(store);
    let store = open(&path, &clock)?;
    let c = started(store.begin(&key, Fingerprint::NONE)?);
    assert_eq!(
        (c.attempt(), c.round_attempt(), c.interruptions()),
        (6, 3, 1)
    );
    assert_eq!(
        c.round_started_at(),
        requeued_at,
        "kept in the release record"
    );
    drop(c); // dropped unanswered (a panic): an interruption
    let c = started(store.begin(&key, Fingerprint::NONE)?);
    assert_eq!((c.round_attempt(), c.interruptions()), (4, 2));
    store.complete(&c, b"")?;
    Ok(())
}

#[test]
fn a_crash_loop_is_dead_lettered_before_the_attempt_past_max_attempts() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let policy = policy(&clock, 3)?;
    let key = Key::new("shop", "poison-7");
    let calls = Cell::new(0);
    // Each worker panics inside the work: its claim is dropped unanswered.
    for _ in 0..3 {
        let store = open(&path, &clock)?;
        let died = catch_unwind(AssertUnwindSafe(|| {
            policy.run(&store, &key, Fingerprint::NONE, retryable, |_| {
                calls.set(calls.get() + 1);
                panic!("the message crashes the worker")
            })
        }));
        assert!(died.is_err());
    }
    let store = open(&path, &clock)?;
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, |_| {
        calls.set(calls.get() + 1);
        Ok(Vec::new())
    })?;
    assert_eq!(
        calls.get(),
        3,
        "the work is called exactly max_attempts times"
    );
    let reason = GiveUpReason::Interrupted {
        attempts: 3,
        interrupted: 3,
    };
    assert!(
        matches!(run, Run::Exhausted { attempt: 4, reason: r, .. } if r == reason),
        "{run:?}"
    );
    let dl = &store.dead_letters(&Listing::new())?.items[0];
    assert_eq!(dl.key(), &key);
    assert_eq!(
        dl.reason(),
        "interrupted 3 times (max_attempts); attempt 4 not started"
    );
    // Later deliveries find the dead letter; the work is not called again.
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, |_| {
        calls.set(calls.get() + 1);
        Ok(Vec::new())
    })?;
    assert!(matches!(run, Run::DeadLettered(_)), "{run:?}");
    assert_eq!(calls.get(), 3);
    Ok(())
}

#[test]
fn a_mixed_round_names_its_interruptions() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir.path().join("s.redb"), &clock)?;
    let policy = policy(&clock, 3)?;
    let key = Key::new("shop", "flaky");
    die_inside(&store, &key)?; // attempt 1 left behind (a lease that lapses)
    clock.advance(Duration::from_secs(31));
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, |claim| {
        assert!(claim.interrupted());
        Err("carrier 503".to_string())
    })?;
    assert!(matches!(run, Run::RetryAfter { attempt: 2, .. }), "{run:?}");
    die_inside(&store, &key)?; // attempt 3
    clock.advance(Duration::from_secs(31));
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, |_| {
        panic!("past max_attempts: not called")
    })?;
    assert!(
        matches!(
            run,
            Run::Exhausted {
                attempt: 4,
                reason: GiveUpReason::Interrupted {
                    attempts: 3,
                    interrupted: 2
                },
                ..
            }
        ),
        "{run:?}"
    );
    let dl = &store.dead_letters(&Listing::new())?.items[0];
    assert_eq!(
        dl.reason(),
        "gave up after 3 attempts, 2 interrupted (max_attempts); attempt 4 not started"
    );
    Ok(())
}

#[test]
fn past_max_elapsed_after_a_restart_no_call_is_made() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let policy = RetryPolicy::builder()
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(1))
        .max_attempts(10)
        .max_elapsed(Duration::from_secs(600))
        .seed(1)
        .clock(clock.clone())
        .build()?;
    let calls = Cell::new(0);
    let fail = |_: &dedupkv::Claim| -> std::result::Result<Vec<u8>, String> {
        calls.set(calls.get() + 1);
        Err("timeout".to_string())
    };
    let released = Key::new("shop", "released");
    let crashed = Key::new("shop", "crashed");
    {
        let store = open(&path, &clock)?;
        let run = policy.run(&store, &released, Fingerprint::NONE, retryable, fail)?;
        assert!(matches!(run, Run::RetryAfter { attempt: 1, .. }), "{run:?}");
        die_inside(&store, &crashed)?;
    }
    assert_eq!(calls.get(), 1);
    // The process comes back 11 minutes later.
    clock.advance(Duration::from_secs(660));
    let store = open(&path, &clock)?;
    for (key, attempt) in [(&released, 2), (&crashed, 2)] {
        let run = policy.run(&store, key, Fingerprint::NONE, retryable, fail)?;
        let want = GiveUpReason::MaxElapsed {
            elapsed: Duration::from_secs(660),
            max: Duration::from_secs(600),
        };
        assert!(
            matches!(run, Run::Exhausted { attempt: a, reason, .. } if a == attempt && reason == want),
            "{key}: {run:?}"
        );
        assert_eq!(
            store.get(key)?.map(|r| r.state()),
            Some(State::DeadLettered)
        );
    }
    assert_eq!(calls.get(), 1, "no call after the budget ran out");
    let page = store.dead_letters(&Listing::new())?;
    for dl in &page.items {
        assert_eq!(
            dl.reason(),
            "max_elapsed 600s passed (660s since the round's first attempt); attempt 2 not started",
            "{}",
            dl.key()
        );
    }
    Ok(())
}

#[test]
fn requeue_grants_another_round_of_attempts_and_time() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let policy = RetryPolicy::builder()
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(1))
        .max_attempts(2)
        .max_elapsed(Duration::from_secs(60))
        .seed(1)
        .clock(clock.clone())
        .build()?;
    let key = Key::new("shop", "requeued");
    let calls = Cell::new(0);
    let fail = |_: &dedupkv::Claim| -> std::result::Result<Vec<u8>, String> {
        calls.set(calls.get() + 1);
        Err("carrier down".to_string())
    };
    let store = open(&path, &clock)?;
    assert!(matches!(
        policy.run(&store, &key, Fingerprint::NONE, retryable, fail)?,
        Run::RetryAfter { attempt: 1, .. }
    ));
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, fail)?;
    assert!(
        matches!(
            run,
            Run::GaveUp {
                attempts: 2,
                dead_lettered: true,
                ..
            }
        ),
        "{run:?}"
    );
    // An hour later, past max_elapsed, the operator requeues it.
    clock.advance(Duration::from_secs(3600));
    assert!(store.requeue(&key)?);
    drop(store);
    let store = open(&path, &clock)?;
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, |claim| {
        calls.set(calls.get() + 1);
        assert_eq!((claim.attempt(), claim.round_attempt()), (3, 1));
        Err("carrier down".to_string())
    })?;
    assert!(matches!(run, Run::RetryAfter { attempt: 3, .. }), "{run:?}");
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, fail)?;
    assert!(matches!(run, Run::GaveUp { attempts: 4, .. }), "{run:?}");
    assert_eq!(calls.get(), 4, "two attempts per round");
    Ok(())
}
