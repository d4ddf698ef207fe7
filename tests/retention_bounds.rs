//! What the size bound and the retention settings may drop, and what they
//! must not: dead letters do not count toward `max_keys` (so they never
//! drive early eviction of live buckets), answered intents survive an
//! early eviction until their own records expire, and a zero entity
//! retention is refused at open.

use std::time::Duration;

use dedupkv::{
    Begin, BeginOptions, Error, Failure, Fingerprint, Intent, Key, Listing, ManualClock, Result,
    Store,
};
use dedupkv_testkit::{HOUR, MIN, T0, hour_window as builder, started, tempdir};

/// 150 dead letters, over a `max_keys` of 100 by themselves, and a few
/// live keys a minute: the live keys stay well under the bound, so no pass
/// evicts a live bucket early and every live key is still a duplicate.
#[test]
fn dead_letters_over_max_keys_do_not_early_evict_live_buckets() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .max_keys(100)
        .open(dir.path().join("s.redb"))?;
    for i in 0..150 {
        let c = started(store.begin(&Key::new("stuck", &format!("op-{i}")), Fingerprint::NONE)?);
        store.fail(
            &c,
            Failure::Exhausted {
                reason: "carrier down",
                payload: None,
            },
        )?;
    }
    let mut live = Vec::new();
    for minute in 0..6 {
        clock.advance(MIN);
        for i in 0..10 {
            let id = format!("m{minute}-{i}");
            assert!(store.insert_if_absent(&Key::new("live", &id))?);
            live.push(id);
        }
        store.evict_expired()?;
    }
    assert_eq!(
        store.stats().early_evicted_buckets,
        0,
        "60 live keys under a bound of 100: nothing is evicted early"
    );
    for id in &live {
        assert!(
            !store.insert_if_absent(&Key::new("live", id))?,
            "{id} was forgotten before its retention"
        );
    }
    assert_eq!(
        store.stats().dead_letters_now,
        150,
        "and every dead letter kept"
    );
    Ok(())
}

/// The live keys alone over the bound still evict early, dead letters or
/// not: the bound holds for what it counts.
#[test]
fn live_keys_over_max_keys_still_evict_early_beside_dead_letters() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .max_keys(100)
        .open(dir.path().join("s.redb"))?;
    for i in 0..50 {
        let c = started(store.begin(&Key::new("stuck", &format!("op-{i}")), Fingerprint::NONE)?);
        store.fail(
            &c,
            Failure::Exhausted {
                reason: "carrier down",
                payload: None,
            },
        )?;
    }
    for minute in 0..5 {
        clock.advance(MIN);
        for i in 0..60 {
            store.insert_if_absent(&Key::new("live", &format!("m{minute}-{i}")))?;
        }
    }
    store.evict_expired()?;
    let s = store.stats();
    assert!(s.early_evicted_buckets > 0, "300 live keys over 100");
    assert!(s.keys <= 100 + 50 + 60, "{} keys", s.keys);
    assert_eq!(s.dead_letters_now, 50);
    Ok(())
}

fn candidates(store: &Store) -> Result<Vec<Key<'static>>> {
    Ok(store
        .duplicate_candidates(&Listing::new())?
        .items
        .iter()
        .map(|e| e.key().clone())
        .collect())
}

/// A duplicate candidate (a takeover that called the carrier again
/// without asking) sits in the oldest live bucket when the size bound
/// evicts early. The operation's own records go with the bucket, but the
/// candidate is carried, durably, until its record's own retention ends.
#[test]
fn early_eviction_keeps_a_duplicate_candidate_until_its_own_retention() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let open = || builder(&clock).max_keys(100).open(&path);
    let store = open()?;
    let key = Key::new("shop", "ship-7");
    let intent = Intent {
        target: "carrier",
        request: b"order 7",
    };
    let begin = |s: &Store| -> Result<Begin> {
        s.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent)
    };
    drop(begin(&store)?); // the worker died, maybe after calling
    let again = started(begin(&store)?);
    store.mark_sent(&again, b"1Z999")?; // called again without asking
    store.complete(&again, b"1Z999")?;
    assert_eq!(candidates(&store)?, vec![key.clone()]);

    for minute in 0..5 {
        clock.advance(MIN);
        for i in 0..60 {
            store.insert_if_absent(&Key::new("live", &format!("m{minute}-{i}")))?;
        }
        store.evict_expired()?;
    }
    assert!(store.stats().early_evicted_buckets > 0, "evicted early");
    assert!(
        store.get(&key)?.is_none(),
        "the operation's own records went"
    );
    assert_eq!(
        candidates(&store)?,
        vec![key.clone()],
        "the candidate stays until its record's retention"
    );
    let e = store.intent(&key)?.expect("kept");
    assert_eq!(e.reference(), Some(&b"1Z999"[..]));
    drop(store);
    let store = open()?;
    assert_eq!(candidates(&store)?, vec![key.clone()], "carried durably");

    // Its record's own retention (an hour after mark_sent) ends.
    clock.advance(HOUR);
    store.evict_expired()?;
    assert!(candidates(&store)?.is_empty(), "gone with its retention");
    assert!(store.intent(&key)?.is_none());
    Ok(())
}

#[test]
fn a_zero_entity_retention_is_refused_at_open_naming_the_setting() {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let err = builder(&clock)
        .entity_retention(Duration::ZERO)
        .open(dir.path().join("s.redb"))
        .err();
    assert!(
        matches!(&err, Some(Error::InvalidConfig(m)) if m.contains("entity_retention")),
        "{err:?}"
    );
    assert!(
        builder(&clock)
            .entity_retention(Duration::from_millis(1))
            .open(dir.path().join("s.redb"))
            .is_ok()
    );
}
