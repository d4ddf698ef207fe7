//! Listings for working a store: stranded claims and the sequencer's
//! holding area, oldest first, by scope and age, paged.

use std::time::Duration;

use dedupkv::{Begin, Fingerprint, Key, Listing, ManualClock, Result, Store, StoreBuilder};
use dedupkv_testkit::{T0, started, tempdir};

fn builder(clock: &ManualClock) -> StoreBuilder {
    dedupkv_testkit::builder(clock)
        .lease(Duration::from_secs(30))
        .max_hold(Duration::from_secs(60))
}

/// Claims `key` and leaves the claim unfinished (a hung worker).
fn hang(store: &Store, key: &Key<'_>) -> Result<()> {
    std::mem::forget(started(store.begin(key, Fingerprint::NONE)?));
    Ok(())
}

fn keys<T>(page: &dedupkv::Page<T>, key: impl Fn(&T) -> String) -> Vec<String> {
    page.items.iter().map(key).collect()
}

#[test]
fn stranded_claims_are_listed_once_their_lease_lapses_oldest_first() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    hang(&store, &Key::new("eu", "a"))?;
    clock.advance(Duration::from_secs(10));
    hang(&store, &Key::new("us", "b"))?;
    hang(&store, &Key::new("eu", "c"))?;
    let done = started(store.begin(&Key::new("eu", "done"), Fingerprint::NONE)?);
    store.complete(&done, b"ok")?;
    let live = started(store.begin(&Key::new("eu", "live"), Fingerprint::NONE)?);
    assert!(
        store.stranded_claims(&Listing::new())?.items.is_empty(),
        "leases are live"
    );

    clock.advance(Duration::from_secs(25)); // a lapsed, b and c live
    store.renew(&live)?;
    let show = |r: &dedupkv::Record| r.key().to_string();
    let page = store.stranded_claims(&Listing::new())?;
    assert_eq!(keys(&page, show), vec![Key::new("eu", "a").to_string()]);
    assert!(
        page.items[0].provider_key().is_some(),
        "what to ask the provider about"
    );

    clock.advance(Duration::from_secs(10)); // b and c lapsed too; live renewed
    let page = store.stranded_claims(&Listing::new())?;
    assert_eq!(page.items.len(), 3);
    assert_eq!(page.items[0].key(), &Key::new("eu", "a"), "oldest first");
    let eu = store.stranded_claims(&Listing::new().scope("eu"))?;
    assert_eq!(eu.items.len(), 2);
    let old = store.stranded_claims(&Listing::new().older_than(Duration::from_secs(10)))?;
    assert_eq!(keys(&old, show), vec![Key::new("eu", "a").to_string()]);
    // Paged one at a time: each once.
    let mut listing = Listing::new().limit(1);
    let mut seen = Vec::new();
    loop {
        let page = store.stranded_claims(&listing)?;
        seen.extend(keys(&page, show));
        match page.next {
            Some(c) => listing = listing.after(c),
            None => break,
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 3);
    // Taken over, a claim is no longer stranded.
    let c = started(store.begin(&Key::new("eu", "a"), Fingerprint::NONE)?);
    assert!(c.interrupted());
    assert_eq!(store.stranded_claims(&Listing::new())?.items.len(), 2);
    store.complete(&c, b"ok")?;
    store.complete(&live, b"ok")?;
    Ok(())
}

#[test]
fn claims_of_a_process_that_is_gone_are_stranded_at_once_after_reopen() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    {
        let store = builder(&clock).open(&path)?;
        hang(&store, &Key::new("t", "orphan"))?;
    }
    let store = builder(&clock).open(&path)?;
    let page = store.stranded_claims(&Listing::new())?;
    assert_eq!(
        page.items.len(),
        1,
        "its lease is live, but its holder is gone"
    );
    assert!(matches!(
        store.begin(&Key::new("t", "orphan"), Fingerprint::NONE)?,
        Begin::Started(c) if c.interrupted()
    ));
    Ok(())
}

#[test]
fn the_holding_area_lists_held_events_of_every_entity() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let (a, b) = (Key::new("eu", "order-1"), Key::new("us", "order-2"));
    {
        let store = builder(&clock).open(&path)?;
        store.sequence(&a, 2, b"a2")?;
        store.sequence(&a, 3, b"a3")?;
        clock.advance(Duration::from_secs(5));
        store.sequence(&b, 5, b"b5")?;
        assert!(
            store.holding_area(&Listing::new())?.items.is_empty(),
            "parked, not held"
        );
        clock.advance(Duration::from_secs(61));
        store.sweep_parked()?;
    }
    let store = builder(&clock).open(&path)?;
    let page = store.holding_area(&Listing::new())?;
    let got: Vec<_> = page
        .items
        .iter()
        .map(|h| (h.entity.clone(), h.seq, h.missing, h.payload.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (a.clone(), 2, 1, b"a2".to_vec()),
            (a.clone(), 3, 1, b"a3".to_vec()),
            (b.clone(), 5, 1, b"b5".to_vec()),
        ],
        "oldest gap first, then by entity and sequence number"
    );
    assert!(
        page.items[0]
            .reason
            .starts_with("predecessor 1 missing since")
    );
    let us = store.holding_area(&Listing::new().scope("us"))?;
    assert_eq!(us.items.len(), 1);
    let first = store.holding_area(&Listing::new().limit(2))?;
    assert_eq!(first.items.len(), 2);
    let rest = store.holding_area(&Listing::new().after(first.next.expect("more")))?;
    assert_eq!(rest.items[0].entity, b);
    store.release_held(&a)?;
    assert_eq!(store.holding_area(&Listing::new())?.items.len(), 1);
    Ok(())
}
