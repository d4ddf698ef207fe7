//! Listings of claims and what an operator pages through: a stranded claim
//! of a dead process ages from the reopen, and a cursor is accepted only by
//! the listing (store and kind) that made it.

use std::path::Path;
use std::time::Duration;

use dedupkv::{
    Error, Failure, Fingerprint, Key, Listing, ManualClock, Result, Store, StoreBuilder,
};
use dedupkv_testkit::{T0, started, tempdir};

const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

fn builder(clock: &ManualClock) -> StoreBuilder {
    dedupkv_testkit::builder(clock)
        .lease(HOUR)
        .retention(24 * HOUR)
}

fn open(path: &Path, clock: &ManualClock) -> Result<Store> {
    builder(clock).open(path)
}

fn stranded(store: &Store, older_than: Duration) -> Result<Vec<Key<'static>>> {
    Ok(store
        .stranded_claims(&Listing::new().older_than(older_than))?
        .items
        .iter()
        .map(|r| r.key().clone())
        .collect())
}

/// A worker holds a one-hour lease and its process dies; the store is
/// reopened a minute later. The claim is stranded from the reopen (nobody
/// can finish it), so an operator asking for claims stranded over five
/// minutes sees it ten minutes after the reopen — not only once its hour
/// has passed.
#[test]
fn a_dead_process_claim_is_stranded_from_the_reopen_not_its_lease_end() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let dead = Key::new("shop", "ship-7");
    {
        let store = open(&path, &clock)?;
        std::mem::forget(started(store.begin(&dead, Fingerprint::NONE)?));
    }
    clock.advance(MIN);
    let store = open(&path, &clock)?;
    // A claim of this run with its lease live: not stranded at all.
    let live = Key::new("shop", "ship-8");
    std::mem::forget(started(store.begin(&live, Fingerprint::NONE)?));
    assert_eq!(stranded(&store, Duration::ZERO)?, vec![dead.clone()]);
    clock.advance(10 * MIN);
    assert_eq!(
        stranded(&store, 5 * MIN)?,
        vec![dead.clone()],
        "stranded since the reopen, ten minutes ago"
    );
    assert!(
        stranded(&store, 15 * MIN)?.is_empty(),
        "but not for fifteen minutes"
    );
    // Past both leases: the dead one still ages from the reopen (the
    // earlier of the two), this run's from its lease's end.
    clock.advance(HOUR);
    assert_eq!(stranded(&store, HOUR)?, vec![dead.clone()]);
    assert_eq!(stranded(&store, 5 * MIN)?, vec![dead, live]);
    Ok(())
}

/// A claim of a dead process whose lease ended before the reopen ages
/// from its lease's end, the earlier of the two.
#[test]
fn a_dead_process_claim_whose_lease_ended_first_ages_from_its_lease_end() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let key = Key::new("shop", "ship-7");
    {
        let store = builder(&clock).lease(MIN).open(&path)?;
        std::mem::forget(started(store.begin(&key, Fingerprint::NONE)?));
    }
    clock.advance(30 * MIN);
    let store = open(&path, &clock)?;
    assert_eq!(
        stranded(&store, 20 * MIN)?,
        vec![key],
        "its lease ended 29 minutes ago"
    );
    assert!(stranded(&store, 30 * MIN)?.is_empty());
    Ok(())
}

fn exhaust(store: &Store, ids: &[&str]) -> Result<()> {
    for id in ids {
        let c = started(store.begin(&Key::new("shop", id), Fingerprint::NONE)?);
        store.fail(
            &c,
            Failure::Exhausted {
                reason: "gave up",
                payload: None,
            },
        )?;
    }
    Ok(())
}

fn refused<T>(res: &Result<T>) -> bool {
    matches!(res, Err(Error::InvalidArgument { what: "cursor", .. }))
}

/// A cursor of one store's dead-letter listing, handed to another store
/// (another file) or to another listing of the same store, is refused: it
/// would start that listing at a position that means nothing there. It
/// still pages its own listing, across a reopen too.
#[test]
fn a_cursor_is_refused_by_another_store_and_another_listing() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let path = dir.path().join("a.redb");
    let a = open(&path, &clock)?;
    let b = open(&dir.path().join("b.redb"), &clock)?;
    exhaust(&a, &["x", "y"])?;
    exhaust(&b, &["x", "y"])?;
    let first = a.dead_letters(&Listing::new().limit(1))?;
    let cursor = first.next.expect("a second page");
    let mine = Listing::new().after(cursor);
    assert_eq!(a.dead_letters(&mine)?.items.len(), 1);

    let got = b.dead_letters(&mine);
    assert!(refused(&got), "another store's cursor: {got:?}");
    assert!(refused(&a.stranded_claims(&mine)), "stranded_claims");
    assert!(refused(&a.holding_area(&mine)), "holding_area");
    assert!(refused(&a.pending_intents(&mine)), "pending_intents");
    assert!(
        refused(&a.duplicate_candidates(&mine)),
        "duplicate_candidates"
    );
    if let Err(e) = a.pending_intents(&mine) {
        let text = e.to_string();
        assert!(
            text.contains("dead_letters") && text.contains("pending_intents"),
            "the error names both listings: {text}"
        );
    }

    drop(a);
    let a = open(&path, &clock)?;
    let again = a.dead_letters(&mine)?;
    assert_eq!(again.items.len(), 1, "the same file's cursor, reopened");
    assert_ne!(again.items[0].key(), first.items[0].key());
    Ok(())
}
