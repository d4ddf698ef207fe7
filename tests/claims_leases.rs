//! Claims: leases, takeover, fencing, fingerprints, scopes, outcomes.

use std::time::Duration;

use dedupkv::{Begin, Error, Failure, Fingerprint, Key, ManualClock, Result, State, Store};
use dedupkv_testkit::{T0, started, tempdir};

fn open(dir: &tempfile::TempDir, clock: &ManualClock) -> Result<Store> {
    Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .open(dir.path().join("s.redb"))
}

#[test]
fn lease_lapse_lets_the_next_begin_take_over_and_fences_the_old_worker() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let key = Key::new("t", "job-1");
    let fp = Fingerprint::of("params");

    let zombie = started(store.begin(&key, fp)?);
    assert_eq!(zombie.attempt(), 1);

    clock.advance(Duration::from_secs(29));
    let Begin::InProgress(info) = store.begin(&key, fp)? else {
        panic!("lease still alive: expected InProgress")
    };
    assert_eq!(info.attempt(), 1);
    assert_eq!(info.lease_expires_at(), zombie.lease_expires_at());

    clock.advance(Duration::from_secs(2));
    let second = started(store.begin(&key, fp)?);
    assert_eq!(second.attempt(), 2);
    assert!(second.token() > zombie.token());

    // The zombie wakes up: it must not overwrite attempt 2's result.
    let err = store.complete(&zombie, b"zombie result").unwrap_err();
    assert!(matches!(err, Error::ClaimLost { attempt: 1, .. }), "{err}");
    assert!(matches!(store.renew(&zombie), Err(Error::ClaimLost { .. })));
    assert!(matches!(
        store.fail(&zombie, Failure::Retryable),
        Err(Error::ClaimLost { .. })
    ));

    store.complete(&second, b"real result")?;
    let Begin::Completed(rec) = store.begin(&key, fp)? else {
        panic!("expected Completed")
    };
    assert_eq!(rec.outcome(), Some(&b"real result"[..]));
    assert_eq!(rec.attempts(), 2);
    assert_eq!(store.stats().takeovers, 1);
    assert_eq!(store.stats().fenced, 3);
    drop(zombie); // dropping a fenced claim changes nothing
    let Begin::Completed(rec) = store.begin(&key, fp)? else {
        panic!("expected Completed")
    };
    assert_eq!(rec.outcome(), Some(&b"real result"[..]));
    Ok(())
}

#[test]
fn renew_moves_the_lease_forward() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let key = Key::new("t", "long-job");
    let claim = started(store.begin(&key, Fingerprint::NONE)?);
    clock.advance(Duration::from_secs(25));
    store.renew(&claim)?;
    clock.advance(Duration::from_secs(25)); // 50 s after start, 25 s after renew
    assert!(matches!(
        store.begin(&key, Fingerprint::NONE)?,
        Begin::InProgress(_)
    ));
    store.complete(&claim, b"done")?;
    Ok(())
}

#[test]
fn a_lapsed_but_untaken_claim_may_still_complete() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let key = Key::new("t", "slow");
    let claim = started(store.begin(&key, Fingerprint::NONE)?);
    clock.advance(Duration::from_secs(60));
    store.complete(&claim, b"late but unopposed")?;
    let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else {
        panic!()
    };
    assert_eq!(rec.outcome(), Some(&b"late but unopposed"[..]));
    Ok(())
}

/// `Stats::fenced` counts every `complete`, `fail` or `renew` refused with
/// `ClaimLost`: on a claim this store already finished, and on a claim of
/// another store, as well as on one taken over.
#[test]
fn every_refused_finish_counts_as_fenced() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let claim = started(store.begin(&Key::new("t", "done"), Fingerprint::NONE)?);
    store.complete(&claim, b"ok")?;
    let refused = [
        store.complete(&claim, b"again"),
        store.fail(&claim, Failure::Retryable),
        store.fail(&claim, Failure::Permanent(b"no")),
        store.renew(&claim).map(|_| ()),
    ];
    for res in &refused {
        assert!(matches!(res, Err(Error::ClaimLost { .. })), "{res:?}");
    }
    assert_eq!(store.stats().fenced, 4);

    let other_dir = tempdir();
    let other = open(&other_dir, &clock)?;
    let foreign = started(other.begin(&Key::new("t", "elsewhere"), Fingerprint::NONE)?);
    let err = store.complete(&foreign, b"wrong store").unwrap_err();
    assert!(matches!(err, Error::ClaimLost { .. }), "{err}");
    assert!(matches!(
        store.renew(&foreign),
        Err(Error::ClaimLost { .. })
    ));
    assert_eq!(store.stats().fenced, 6);
    assert_eq!(other.stats().fenced, 0);
    other.complete(&foreign, b"right store")?;
    Ok(())
}

#[test]
fn a_different_fingerprint_is_rejected_naming_the_key() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let key = Key::new("shop-42", "pay-1");
    let claim = started(store.begin(&key, Fingerprint::of("100 EUR"))?);
    // While in progress...
    let err = store.begin(&key, Fingerprint::of("999 EUR")).unwrap_err();
    assert!(
        matches!(&err, Error::FingerprintMismatch { key, .. } if key == r#""shop-42"/"pay-1""#),
        "{err:?}"
    );
    assert!(err.to_string().contains(r#""shop-42"/"pay-1""#), "{err}");
    store.complete(&claim, b"ok")?;
    // ...and once completed: never silently answered with the other request's result.
    let err = store.begin(&key, Fingerprint::of("999 EUR")).unwrap_err();
    assert!(matches!(err, Error::FingerprintMismatch { .. }));
    assert_eq!(store.stats().conflicts, 2);
    Ok(())
}

/// `("a/b", "c")` and `("a", "b/c")` are two keys; their renderings in
/// messages, `Display` and `Debug` must tell them apart too.
#[test]
fn keys_in_messages_tell_scope_from_id() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let (left, right) = (Key::new("a/b", "c"), Key::new("a", "b/c"));
    assert_ne!(left.to_string(), right.to_string());
    assert_ne!(format!("{left:?}"), format!("{right:?}"));
    assert_eq!(left.to_string(), r#""a/b"/"c""#);
    assert_eq!(format!("{right:?}"), r#"Key("a"/"b/c")"#);
    let mut messages = Vec::new();
    for key in [&left, &right] {
        let _claim = started(store.begin(key, Fingerprint::of("one"))?);
        let err = store.begin(key, Fingerprint::of("two")).unwrap_err();
        assert!(matches!(err, Error::FingerprintMismatch { .. }), "{err}");
        messages.push(err.to_string());
    }
    assert!(messages[0].contains(r#"key "a/b"/"c":"#), "{}", messages[0]);
    assert!(messages[1].contains(r#"key "a"/"b/c":"#), "{}", messages[1]);
    Ok(())
}

#[test]
fn scopes_isolate_tenants() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    assert!(store.insert_if_absent(&Key::new("tenant-a", "evt-1"))?);
    assert!(store.insert_if_absent(&Key::new("tenant-b", "evt-1"))?);
    assert!(!store.insert_if_absent(&Key::new("tenant-a", "evt-1"))?);
    // Length-prefixing keeps ("ab","c") and ("a","bc") apart.
    assert!(store.insert_if_absent(&Key::new("ab", "c"))?);
    assert!(store.insert_if_absent(&Key::new("a", "bc"))?);
    let a = started(store.begin(&Key::new("tenant-a", "op"), Fingerprint::of("x"))?);
    let b = started(store.begin(&Key::new("tenant-b", "op"), Fingerprint::of("y"))?);
    store.complete(&a, b"A")?;
    store.complete(&b, b"B")?;
    let Begin::Completed(ra) = store.begin(&Key::new("tenant-a", "op"), Fingerprint::of("x"))?
    else {
        panic!()
    };
    assert_eq!(ra.outcome(), Some(&b"A"[..]));
    Ok(())
}

#[test]
fn outcomes_and_claims_survive_reopen() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let fp = Fingerprint::of("p");
    {
        let store = open(&dir, &clock)?;
        let done = started(store.begin(&Key::new("t", "done"), fp)?);
        store.complete(&done, b"the outcome")?;
        let failed = started(store.begin(&Key::new("t", "failed"), fp)?);
        store.fail(&failed, Failure::Permanent(b"declined"))?;
        let retry = started(store.begin(&Key::new("t", "retry"), fp)?);
        store.fail(&retry, Failure::Retryable)?;
        let running = started(store.begin(&Key::new("t", "running"), fp)?);
        std::mem::forget(running); // the worker "crashes" holding the claim
        store.insert_if_absent(&Key::new("t", "plain"))?;
    }
    let store = open(&dir, &clock)?;
    let Begin::Completed(rec) = store.begin(&Key::new("t", "done"), fp)? else {
        panic!()
    };
    assert_eq!(
        (rec.state(), rec.outcome()),
        (State::Completed, Some(&b"the outcome"[..]))
    );
    let Begin::Completed(rec) = store.begin(&Key::new("t", "failed"), fp)? else {
        panic!()
    };
    assert!(rec.is_failure());
    assert_eq!(rec.outcome(), Some(&b"declined"[..]));
    let c = started(store.begin(&Key::new("t", "retry"), fp)?);
    assert_eq!(c.attempt(), 2);
    store.complete(&c, b"")?;
    // The crashed worker's claim is taken over at once: its process is gone.
    let c = started(store.begin(&Key::new("t", "running"), fp)?);
    assert_eq!(c.attempt(), 2);
    assert!(c.interrupted());
    store.complete(&c, b"")?;
    assert!(!store.insert_if_absent(&Key::new("t", "plain"))?);
    assert!(
        matches!(store.begin(&Key::new("t", "plain"), fp)?, Begin::Completed(r) if r.state() == State::Inserted)
    );
    Ok(())
}

#[test]
fn tokens_keep_growing_across_reopen() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let first = {
        let store = open(&dir, &clock)?;
        let c = started(store.begin(&Key::new("t", "a"), Fingerprint::NONE)?);
        let t = c.token();
        store.complete(&c, b"")?;
        t
    };
    let store = open(&dir, &clock)?;
    let c = started(store.begin(&Key::new("t", "b"), Fingerprint::NONE)?);
    assert!(c.token() > first);
    store.complete(&c, b"")?;
    Ok(())
}

#[test]
fn dropping_a_claim_releases_it_for_retry() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let key = Key::new("t", "dropped");
    drop(started(store.begin(&key, Fingerprint::NONE)?));
    let rec = store.get(&key)?.expect("recorded");
    assert_eq!(rec.state(), State::Retryable);
    let c = started(store.begin(&key, Fingerprint::NONE)?);
    assert_eq!(c.attempt(), 2);
    assert_eq!(store.stats().released, 1);
    store.complete(&c, b"")?;
    Ok(())
}

#[test]
fn complete_twice_is_rejected() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let c = started(store.begin(&Key::new("t", "x"), Fingerprint::NONE)?);
    store.complete(&c, b"first")?;
    assert!(matches!(
        store.complete(&c, b"second"),
        Err(Error::ClaimLost { .. })
    ));
    let rec = store.get(&Key::new("t", "x"))?.expect("recorded");
    assert_eq!(rec.outcome(), Some(&b"first"[..]));
    Ok(())
}

#[test]
fn get_reports_what_an_incident_needs() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let key = Key::new("t", "incident");
    assert!(store.get(&key)?.is_none());
    let fp = Fingerprint::of("p");
    let c = started(store.begin(&key, fp)?);
    let rec = store.get(&key)?.expect("recorded");
    assert_eq!(rec.state(), State::InProgress);
    assert_eq!(rec.fingerprint(), Some(fp));
    assert_eq!(rec.lease_expires_at(), Some(c.lease_expires_at()));
    clock.advance(Duration::from_secs(5));
    store.complete(&c, b"out")?;
    let rec = store.get(&key)?.expect("recorded");
    assert_eq!(rec.state(), State::Completed);
    assert_eq!(rec.attempts(), 1);
    assert_eq!(rec.key(), &key);
    assert_eq!(
        rec.updated_at()
            .duration_since(rec.first_seen_at())
            .expect("order"),
        Duration::from_secs(5)
    );
    assert!(rec.expires_at() >= rec.updated_at() + Duration::from_secs(24 * 3600));
    Ok(())
}

#[test]
fn typed_outcomes_round_trip() -> Result<()> {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Receipt {
        id: String,
        cents: u64,
    }
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let key = Key::new("t", "typed");
    let fp = Fingerprint::of_value(&("charge", 100u64))?;
    let c = started(store.begin(&key, fp)?);
    store.complete_value(
        &c,
        &Receipt {
            id: "r1".into(),
            cents: 100,
        },
    )?;
    let Begin::Completed(rec) = store.begin(&key, fp)? else {
        panic!()
    };
    assert_eq!(
        rec.outcome_as::<Receipt>()?,
        Receipt {
            id: "r1".into(),
            cents: 100
        }
    );
    assert!(matches!(
        rec.outcome_as::<Vec<String>>(),
        Err(Error::Codec(_))
    ));
    Ok(())
}

#[test]
fn a_claim_left_by_an_earlier_process_is_taken_over_at_once_and_says_so() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let key = Key::new("t", "orphan");
    let fp = Fingerprint::of("params");
    let first_token = {
        let store = open(&dir, &clock)?;
        let c = started(store.begin(&key, fp)?);
        assert!(!c.interrupted(), "a first attempt interrupted nothing");
        let token = c.token();
        // The process dies holding the claim: no release is written.
        std::mem::forget(c);
        token
    };
    // Reopened at once, long before the 30 s lease lapses.
    let store = open(&dir, &clock)?;
    let c = started(store.begin(&key, fp)?);
    assert_eq!(c.attempt(), 2);
    assert!(
        c.interrupted(),
        "the caller must learn that attempt 1 may have acted"
    );
    assert!(c.token() > first_token);
    assert_eq!(store.stats().takeovers, 1);
    // The takeover's own claim is a live claim of this process: it waits out
    // its lease as before (a worker may just be slow).
    let Begin::InProgress(info) = store.begin(&key, fp)? else {
        panic!("a claim of this process must be InProgress while its lease runs")
    };
    assert_eq!(info.attempt(), 2);
    store.complete(&c, b"done")?;
    Ok(())
}

#[test]
fn interrupted_tells_a_lapsed_lease_from_a_released_retry() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let fp = Fingerprint::NONE;

    let released = Key::new("t", "released");
    let c = started(store.begin(&released, fp)?);
    store.fail(&c, Failure::Retryable)?;
    let retry = started(store.begin(&released, fp)?);
    assert_eq!(retry.attempt(), 2);
    assert!(
        !retry.interrupted(),
        "a retryable failure answered: nothing was interrupted"
    );

    let lapsed = Key::new("t", "lapsed");
    let zombie = started(store.begin(&lapsed, fp)?);
    clock.advance(Duration::from_secs(31));
    let next = started(store.begin(&lapsed, fp)?);
    assert!(next.interrupted(), "the lease lapsed without an answer");
    assert!(matches!(
        store.complete(&zombie, b"late"),
        Err(Error::ClaimLost { .. })
    ));
    store.complete(&next, b"ok")?;
    store.complete(&retry, b"ok")?;
    Ok(())
}

/// The provider key of the operation on `key`, as its record reports it.
fn recorded_provider_key(store: &Store, key: &Key<'_>) -> Result<String> {
    let rec = store.get(key)?.expect("recorded");
    Ok(rec
        .provider_key()
        .expect("a claimed key has a provider key"))
}

/// The key to hand an external provider is one per operation: every
/// attempt of it (takeover after a lapsed lease, retry after a retryable
/// failure or a dropped claim, after a reopen) passes the same one, while
/// the fencing token changes with each attempt.
#[test]
fn the_provider_key_is_the_same_on_every_attempt_of_an_operation() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let key = Key::new("shop-42", "label-7");
    let fp = Fingerprint::of("ship order 7");
    let first;
    {
        let store = open(&dir, &clock)?;
        let a1 = started(store.begin(&key, fp)?);
        first = a1.provider_key()?;
        assert_eq!(first.len(), 32, "{first}");
        assert!(first.bytes().all(|b| b.is_ascii_hexdigit()), "{first}");
        assert_eq!(recorded_provider_key(&store, &key)?, first);

        clock.advance(Duration::from_secs(31)); // a1's lease lapses
        let a2 = started(store.begin(&key, fp)?);
        assert_eq!(a2.attempt(), 2);
        assert_ne!(a2.token(), a1.token());
        assert_eq!(a2.provider_key()?, first, "takeover");

        store.fail(&a2, Failure::Retryable)?;
        assert_eq!(recorded_provider_key(&store, &key)?, first, "released");
        let a3 = started(store.begin(&key, fp)?);
        assert_eq!(a3.provider_key()?, first, "retry");
        drop(a3);
        let a4 = started(store.begin(&key, fp)?);
        assert_eq!(a4.provider_key()?, first, "after a dropped claim");
        std::mem::forget(a4); // the process dies holding it
    }
    let store = open(&dir, &clock)?;
    assert_eq!(recorded_provider_key(&store, &key)?, first, "reopened");
    clock.advance(Duration::from_secs(31));
    let a5 = started(store.begin(&key, fp)?);
    assert_eq!(a5.attempt(), 5);
    assert_eq!(a5.provider_key()?, first, "takeover after reopen");
    store.complete(&a5, b"label L-1")?;
    let Begin::Completed(rec) = store.begin(&key, fp)? else {
        panic!("expected Completed")
    };
    assert_eq!(rec.provider_key().as_deref(), Some(first.as_str()));
    Ok(())
}

/// Provider keys never collide between two operations: the same id in two
/// scopes, the same key in two stores (even at the same instant), or a new
/// operation on a key whose old record expired.
#[test]
fn provider_keys_differ_across_scopes_stores_and_operations() -> Result<()> {
    let clock = ManualClock::new(T0);
    let (d1, d2) = (tempdir(), tempdir());
    let (s1, s2) = (open(&d1, &clock)?, open(&d2, &clock)?);
    let a = started(s1.begin(&Key::new("shop-1", "order-9"), Fingerprint::NONE)?);
    let b = started(s1.begin(&Key::new("shop-2", "order-9"), Fingerprint::NONE)?);
    let c = started(s2.begin(&Key::new("shop-1", "order-9"), Fingerprint::NONE)?);
    assert_ne!(a.provider_key()?, b.provider_key()?, "scopes");
    assert_ne!(a.provider_key()?, c.provider_key()?, "stores");
    let old = a.provider_key()?;
    s1.complete(&a, b"done")?;

    // Past the retention (24 h by default) the key starts a new operation.
    clock.advance(Duration::from_secs(3 * 86_400));
    s1.evict_expired()?;
    let again = started(s1.begin(&Key::new("shop-1", "order-9"), Fingerprint::NONE)?);
    assert_eq!(again.attempt(), 1);
    assert_ne!(again.provider_key()?, old, "a new operation");

    // An inserted key is no operation: it has no provider key.
    s1.insert_if_absent(&Key::new("shop-1", "evt-1"))?;
    let rec = s1.get(&Key::new("shop-1", "evt-1"))?.expect("recorded");
    assert_eq!(rec.provider_key(), None);
    Ok(())
}

#[test]
fn a_claim_dropped_without_an_answer_makes_the_next_attempt_interrupted() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let key = Key::new("t", "ship");
    // The handler panics after its external call: its claim is dropped.
    let handler = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _claim = started(store.begin(&key, Fingerprint::NONE).expect("begin"));
        panic!("the handler failed after calling the provider");
    }));
    assert!(handler.is_err());
    let next = started(store.begin(&key, Fingerprint::NONE)?);
    assert_eq!(next.attempt(), 2, "the dropped claim freed the key at once");
    assert!(
        next.interrupted(),
        "attempt 1 may have acted: reconcile first"
    );
    store.complete(&next, b"")?;
    Ok(())
}
