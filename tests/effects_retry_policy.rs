//! The retry policy and its runner: delays stay in bounds and follow the
//! jitter's distribution under a fixed seed; the attempt count and the
//! elapsed budget come from the store, so they survive a reopen; replays
//! and claims held elsewhere never run the closure.

use std::cell::Cell;
use std::path::Path;
use std::time::Duration;

use dedupkv::{
    Begin, Decision, Error, ErrorClass, Fingerprint, GiveUpReason, Jitter, Key, ManualClock,
    Result, RetryPolicy, Run, State, Store,
};
use dedupkv_testkit::T0;

fn open(path: &Path, clock: &ManualClock) -> Result<Store> {
    Store::builder().clock(clock.clone()).open(path)
}

fn retryable(_: &String) -> ErrorClass {
    ErrorClass::Retryable
}

/// A policy whose delays are all 1 ms, on `clock`.
fn tiny(clock: &ManualClock) -> dedupkv::RetryPolicyBuilder {
    RetryPolicy::builder()
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(1))
        .seed(1)
        .clock(clock.clone())
}

#[test]
fn delays_stay_within_bounds_for_every_attempt_and_extreme_settings() -> Result<()> {
    let settings = [
        (Duration::from_millis(100), Duration::from_secs(30)),
        (Duration::from_nanos(1), Duration::MAX),
        (Duration::from_secs(u64::MAX / 2), Duration::MAX),
        (Duration::MAX, Duration::MAX),
        (Duration::from_secs(1), Duration::from_secs(1)),
    ];
    let attempts: Vec<u32> = (0..=64).chain([1000, u32::MAX - 1, u32::MAX]).collect();
    for (base, cap) in settings {
        for jitter in [Jitter::Full, Jitter::Decorrelated] {
            let policy = RetryPolicy::builder()
                .base(base)
                .cap(cap)
                .jitter(jitter)
                .max_attempts(u32::MAX)
                .seed(3)
                .build()?;
            let low = if jitter == Jitter::Full {
                Duration::ZERO
            } else {
                base
            };
            let mut prev = None;
            for &attempt in &attempts {
                for p in [None, prev, Some(Duration::ZERO), Some(Duration::MAX)] {
                    let d = policy.delay(attempt, p);
                    assert!(
                        (low..=cap).contains(&d),
                        "{jitter:?} base {base:?} cap {cap:?} attempt {attempt} prev {p:?}: {d:?}"
                    );
                }
                prev = Some(policy.delay(attempt, prev));
                // decide draws a delay too, and must not overflow either.
                assert!(matches!(
                    policy.decide(attempt, Duration::MAX, None),
                    Decision::Retry { .. } | Decision::GiveUp(_)
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn full_jitter_never_exceeds_the_exponential_ceiling() -> Result<()> {
    let policy = RetryPolicy::builder()
        .base(Duration::from_millis(100))
        .cap(Duration::from_secs(1))
        .seed(11)
        .build()?;
    for _ in 0..2000 {
        assert!(policy.delay(1, None) <= Duration::from_millis(100));
        assert!(policy.delay(2, None) <= Duration::from_millis(200));
        assert!(policy.delay(4, None) <= Duration::from_millis(800));
        assert!(policy.delay(5, None) <= Duration::from_secs(1)); // capped, not 1.6 s
    }
    Ok(())
}

#[test]
fn full_jitter_is_uniform_under_a_fixed_seed() -> Result<()> {
    let policy = RetryPolicy::builder()
        .base(Duration::from_secs(1))
        .cap(Duration::from_secs(3600))
        .seed(0x5EED)
        .build()?;
    // Attempt 4: uniform in [0, base · 2^3] = [0 s, 8 s].
    let samples = (0..N).map(|_| policy.delay(4, None));
    check_uniform(samples, Duration::ZERO, Duration::from_secs(8));
    Ok(())
}

#[test]
fn decorrelated_jitter_is_uniform_between_base_and_three_times_prev() -> Result<()> {
    let policy = RetryPolicy::builder()
        .jitter(Jitter::Decorrelated)
        .base(Duration::from_secs(1))
        .cap(Duration::from_secs(3600))
        .seed(0xDEC0)
        .build()?;
    let prev = Some(Duration::from_secs(2)); // uniform in [1 s, 6 s]
    let samples = (0..N).map(|_| policy.delay(7, prev));
    check_uniform(samples, Duration::from_secs(1), Duration::from_secs(6));
    Ok(())
}

/// Samples per distribution test.
const N: u128 = 100_000;

/// Asserts that `N` samples lie in `[lo, hi]`, their mean is within 1 % of
/// the range of the midpoint, and each tenth of the range holds 10 % of them
/// within 5 % (10 000 expected, standard deviation about 95: the seed is
/// fixed, so this is deterministic, and a skewed or clumped draw fails it).
fn check_uniform(samples: impl Iterator<Item = Duration>, lo: Duration, hi: Duration) {
    let (lo, hi) = (lo.as_nanos(), hi.as_nanos());
    let width = hi - lo;
    let mut deciles = [0u128; 10];
    let mut sum = 0u128;
    let mut n = 0u128;
    for d in samples {
        let x = d.as_nanos();
        assert!((lo..=hi).contains(&x), "{d:?} outside the range");
        sum += x - lo;
        let bucket = usize::try_from((x - lo) * 10 / width)
            .expect("small")
            .min(9);
        deciles[bucket] += 1;
        n += 1;
    }
    assert_eq!(n, N);
    let mean = sum / N;
    let mid = width / 2;
    assert!(
        mean.abs_diff(mid) < width / 100,
        "mean {mean} ns above lo, expected {mid}"
    );
    for (i, &count) in deciles.iter().enumerate() {
        assert!(
            (9_500..=10_500).contains(&count),
            "decile {i}: {count} of {N}"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_delays_and_another_seed_others() -> Result<()> {
    let delays = |seed: u64, jitter: Jitter| -> Result<Vec<Duration>> {
        let policy = RetryPolicy::builder().jitter(jitter).seed(seed).build()?;
        let mut prev = None;
        Ok((1..=100)
            .map(|attempt| {
                let d = policy.delay(attempt % 8, prev);
                prev = Some(d);
                d
            })
            .collect())
    };
    for jitter in [Jitter::Full, Jitter::Decorrelated] {
        assert_eq!(delays(42, jitter)?, delays(42, jitter)?);
        assert_ne!(delays(42, jitter)?, delays(43, jitter)?);
    }
    // An unseeded policy draws its seed from the operating system.
    assert_ne!(delays_unseeded()?, delays_unseeded()?);
    Ok(())
}

fn delays_unseeded() -> Result<Vec<Duration>> {
    let policy = RetryPolicy::builder()
        .cap(Duration::from_secs(3600))
        .build()?;
    Ok((1..=20).map(|_| policy.delay(12, None)).collect())
}

#[test]
fn decide_gives_up_at_max_attempts_and_past_max_elapsed() -> Result<()> {
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .max_elapsed(Duration::from_secs(60))
        .seed(5)
        .build()?;
    assert!(matches!(
        policy.decide(1, Duration::ZERO, None),
        Decision::Retry { after } if after <= Duration::from_millis(100)
    ));
    assert!(matches!(
        policy.decide(2, Duration::from_secs(59), None),
        Decision::Retry { .. }
    ));
    assert_eq!(
        policy.decide(3, Duration::ZERO, None),
        Decision::GiveUp(GiveUpReason::MaxAttempts { max: 3 })
    );
    assert_eq!(
        policy.decide(2, Duration::from_secs(61), None),
        Decision::GiveUp(GiveUpReason::MaxElapsed {
            elapsed: Duration::from_secs(61),
            max: Duration::from_secs(60),
        })
    );
    Ok(())
}

#[test]
fn invalid_settings_are_refused_naming_the_setting() {
    let refused = |b: dedupkv::RetryPolicyBuilder, field: &str| match b.build() {
        Err(Error::InvalidConfig(msg)) => assert!(msg.contains(field), "{msg}"),
        other => panic!("expected InvalidConfig naming {field}, got {other:?}"),
    };
    refused(RetryPolicy::builder().max_attempts(0), "max_attempts");
    refused(RetryPolicy::builder().base(Duration::ZERO), "base");
    refused(
        RetryPolicy::builder()
            .base(Duration::from_secs(2))
            .cap(Duration::from_secs(1)),
        "cap",
    );
    assert!(
        RetryPolicy::builder()
            .base(Duration::from_secs(1))
            .cap(Duration::from_secs(1))
            .max_attempts(1)
            .build()
            .is_ok()
    );
}

#[test]
fn a_success_is_recorded_and_its_replay_does_not_run_the_closure() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new(T0);
    let store = open(&dir.path().join("s.redb"), &clock)?;
    let policy = tiny(&clock).build()?;
    let key = Key::new("shop", "ship-1");
    let calls = Cell::new(0);
    let work = |_: &dedupkv::Claim| -> std::result::Result<Vec<u8>, String> {
        calls.set(calls.get() + 1);
        Ok(b"label-1".to_vec())
    };
    let first = policy.run(&store, &key, Fingerprint::of("o1"), retryable, work)?;
    assert!(matches!(first, Run::Done(ref b) if b == b"label-1"));
    let again = policy.run(&store, &key, Fingerprint::of("o1"), retryable, work)?;
    assert!(matches!(again, Run::Replayed(ref b) if b == b"label-1"));
    assert_eq!(again.retry_after(), None);
    assert_eq!(calls.get(), 1, "the replay did not run the closure");
    let rec = store.get(&key)?.expect("recorded");
    assert_eq!((rec.state(), rec.attempts()), (State::Completed, 1));
    Ok(())
}

#[test]
fn a_typed_outcome_is_replayed_typed() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("s.redb"))?;
    let policy = RetryPolicy::new();
    let key = Key::new("shop", "refund-1");
    let calls = Cell::new(0);
    for _ in 0..2 {
        let run = policy.run_value(&store, &key, Fingerprint::NONE, retryable, |_| {
            calls.set(calls.get() + 1);
            Ok((201u16, "re_1".to_string()))
        })?;
        assert!(
            matches!(run, Run::Done((201, ref id)) | Run::Replayed((201, ref id)) if id == "re_1")
        );
    }
    assert_eq!(calls.get(), 1);
    Ok(())
}

#[test]
fn a_retryable_error_releases_the_key_and_says_when_to_come_back() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new(T0);
    let store = open(&dir.path().join("s.redb"), &clock)?;
    let policy = RetryPolicy::builder()
        .base(Duration::from_millis(100))
        .cap(Duration::from_secs(10))
        .clock(clock.clone())
        .seed(8)
        .build()?;
    let key = Key::new("shop", "ship-2");
    let fp = Fingerprint::of("o2");
    let run = policy.run(&store, &key, fp, retryable, |_| Err("timeout".to_string()))?;
    let Run::RetryAfter {
        after,
        attempt,
        ref error,
        ..
    } = run
    else {
        panic!("expected RetryAfter, got {run:?}")
    };
    assert!(after <= Duration::from_millis(100));
    assert_eq!((attempt, error.as_str()), (1, "timeout"));
    assert_eq!(run.retry_after(), Some(after));
    assert_eq!(
        store.get(&key)?.expect("recorded").state(),
        State::Retryable
    );
    // The next attempt is number 2, and its success is recorded.
    let run = policy.run(&store, &key, fp, retryable, |claim| {
        assert_eq!(claim.attempt(), 2);
        Ok(b"ok".to_vec())
    })?;
    assert!(matches!(run, Run::Done(_)));
    Ok(())
}

#[test]
fn a_permanent_error_is_recorded_with_its_text_and_replayed_as_failed() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("s.redb"))?;
    let policy = RetryPolicy::new();
    let key = Key::new("shop", "charge-1");
    let run = policy.run(
        &store,
        &key,
        Fingerprint::NONE,
        |_: &String| ErrorClass::Permanent,
        |_| Err("card declined".to_string()),
    )?;
    assert!(matches!(
        run,
        Run::GaveUp { attempts: 1, reason: GiveUpReason::Permanent, ref error, .. } if error == "card declined"
    ));
    let calls = Cell::new(0);
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, |_| {
        calls.set(calls.get() + 1);
        Ok(Vec::new())
    })?;
    let Run::Failed(rec) = run else {
        panic!("expected Failed, got {run:?}")
    };
    assert_eq!(rec.outcome(), Some(&b"permanent error: card declined"[..]));
    assert_eq!(calls.get(), 0);
    Ok(())
}

#[test]
fn attempts_continue_across_reopens_and_run_out_at_max_attempts() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let policy = tiny(&clock).max_attempts(3).build()?;
    let key = Key::new("shop", "ship-3");
    let fp = Fingerprint::of("o3");
    for expected in 1..=2 {
        let store = open(&path, &clock)?; // a new process each time
        let run = policy.run(&store, &key, fp, retryable, |claim| {
            assert_eq!(claim.attempt(), expected);
            Err("provider down".to_string())
        })?;
        assert!(
            matches!(run, Run::RetryAfter { attempt, .. } if attempt == expected),
            "attempt {expected}: {run:?}"
        );
        clock.advance(Duration::from_millis(1));
    }
    let store = open(&path, &clock)?;
    let run = policy.run(&store, &key, fp, retryable, |claim| {
        assert_eq!(claim.attempt(), 3);
        Err("provider down".to_string())
    })?;
    assert!(matches!(
        run,
        Run::GaveUp {
            attempts: 3,
            reason: GiveUpReason::MaxAttempts { max: 3 },
            ..
        }
    ));
    drop(store);
    // Exhausted: after another reopen the closure is not run again.
    let store = open(&path, &clock)?;
    let run = policy.run(
        &store,
        &key,
        fp,
        retryable,
        |_| -> std::result::Result<Vec<u8>, String> {
            panic!("an exhausted operation must not be retried")
        },
    )?;
    let Run::DeadLettered(dl) = run else {
        panic!("expected DeadLettered, got {run:?}")
    };
    assert_eq!(dl.attempts(), 3);
    assert_eq!(
        dl.reason(),
        "gave up after 3 attempts (max_attempts): provider down"
    );
    Ok(())
}

#[test]
fn max_elapsed_counts_from_the_stored_first_attempt_across_a_reopen() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let policy = tiny(&clock)
        .max_attempts(10)
        .max_elapsed(Duration::from_secs(60))
        .build()?;
    let key = Key::new("shop", "ship-4");
    let calls = Cell::new(0);
    let fail = |_: &dedupkv::Claim| -> std::result::Result<Vec<u8>, String> {
        calls.set(calls.get() + 1);
        Err("timeout".to_string())
    };
    {
        let store = open(&path, &clock)?;
        let run = policy.run(&store, &key, Fingerprint::NONE, retryable, fail)?;
        assert!(matches!(run, Run::RetryAfter { attempt: 1, .. }));
        clock.advance(Duration::from_secs(30));
        let run = policy.run(&store, &key, Fingerprint::NONE, retryable, fail)?;
        assert!(matches!(run, Run::RetryAfter { attempt: 2, .. }), "{run:?}");
    }
    // A restarted process keeps the budget: it counts from the first
    // attempt the store recorded, not from its own start; and it holds
    // before the attempt, so the restart makes no call past it.
    clock.advance(Duration::from_secs(31));
    let store = open(&path, &clock)?;
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, fail)?;
    assert!(
        matches!(
            run,
            Run::Exhausted {
                attempt: 3,
                reason: GiveUpReason::MaxElapsed { elapsed, max },
                ..
            } if elapsed == Duration::from_secs(61) && max == Duration::from_secs(60)
        ),
        "{run:?}"
    );
    assert_eq!(calls.get(), 2, "no call after the budget ran out");
    assert_eq!(
        store.get(&key)?.expect("recorded").state(),
        State::DeadLettered,
        "exhausted retries go to the dead-letter area"
    );
    Ok(())
}

#[test]
fn a_claim_held_elsewhere_gives_the_remaining_lease_without_running() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new(T0);
    let store = Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .open(dir.path().join("s.redb"))?;
    let policy = tiny(&clock).build()?;
    let key = Key::new("shop", "ship-5");
    let Begin::Started(held) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("new key")
    };
    clock.advance(Duration::from_secs(12));
    let calls = Cell::new(0);
    let run = policy.run(&store, &key, Fingerprint::NONE, retryable, |_| {
        calls.set(calls.get() + 1);
        Ok(Vec::new())
    })?;
    let Run::InProgress {
        retry_after,
        lease_expires_at,
        attempt,
        ..
    } = run
    else {
        panic!("expected InProgress, got {run:?}")
    };
    assert_eq!(retry_after, Duration::from_secs(18));
    assert_eq!(lease_expires_at, held.lease_expires_at());
    assert_eq!(attempt, 1);
    assert_eq!(run.retry_after(), Some(Duration::from_secs(18)));
    assert_eq!(calls.get(), 0);
    store.complete(&held, b"done")?;
    Ok(())
}

#[test]
fn a_key_recorded_by_insert_if_absent_is_an_error_naming_it() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "evt-1");
    assert!(store.insert_if_absent(&key)?);
    let err = RetryPolicy::new()
        .run(&store, &key, Fingerprint::NONE, retryable, |_| {
            Ok(Vec::new())
        })
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { what: "key", reason } if reason.contains(r#""shop"/"evt-1""#)),
        "{err}"
    );
    Ok(())
}

#[test]
fn one_policy_serves_many_threads() -> Result<()> {
    fn shareable<T: Send + Sync>(_: &T) {}
    let policy = RetryPolicy::builder().seed(2).build()?;
    shareable(&policy);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for attempt in 1..=1000 {
                    assert!(policy.delay(attempt, None) <= Duration::from_secs(30));
                }
            });
        }
    });
    Ok(())
}

/// A permanent error with a message longer than the store's
/// `max_outcome_len` is still recorded (cut to fit), so the work never runs
/// again.
#[test]
fn a_permanent_failure_is_recorded_under_a_small_max_outcome_len() -> Result<()> {
    use dedupkv::{ErrorClass, RetryPolicy, Run};
    let store = Store::builder()
        .max_outcome_len(64)
        .open_with_backend(dedupkv_testkit::FaultBackend::new())?;
    let policy = RetryPolicy::new();
    let key = Key::new("shop", "refund-1");
    let permanent = |_: &String| ErrorClass::Permanent;
    let long = "card declined: ".to_string() + &"x".repeat(200);
    let first = policy.run(&store, &key, Fingerprint::NONE, permanent, |_| {
        Err::<Vec<u8>, _>(long.clone())
    });
    assert!(
        matches!(first, Ok(Run::GaveUp { .. })),
        "a permanent error gives up and is recorded: {first:?}"
    );
    let mut ran = false;
    let again = policy.run(&store, &key, Fingerprint::NONE, permanent, |_| {
        ran = true;
        Ok(Vec::new())
    })?;
    assert!(!ran, "the work ran again after a permanent failure");
    assert!(matches!(again, Run::Failed(_)), "{again:?}");
    Ok(())
}
