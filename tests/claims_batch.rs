//! Batch claims: `begin_batch` answers each item as `begin` would, in one
//! commit; `complete_batch` completes many claims in one commit, failing
//! only the items whose claim was lost.

use std::time::Duration;

use dedupkv::{Begin, Claim, Error, Fingerprint, Key, ManualClock, Result, State, Store};
use dedupkv_testkit::{T0, started, tempdir};

fn open(dir: &tempfile::TempDir, clock: &ManualClock) -> Result<Store> {
    Store::builder()
        .clock(clock.clone())
        // Eviction is driven by hand: a background pass may commit on its
        // own, and a test counts commits.
        .background_eviction(false)
        .lease(Duration::from_secs(30))
        .open(dir.path().join("s.redb"))
}

#[test]
fn begin_batch_answers_each_item_as_begin_would_in_one_commit() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir, &clock)?;
    let fp = Fingerprint::of("p");
    let done = started(store.begin(&Key::new("t", "done"), fp)?);
    store.complete(&done, b"earlier")?;
    let running = started(store.begin(&Key::new("t", "running"), fp)?);
    store.flush()?;
    let commits = store.stats().commits;

    let items = [
        (Key::new("t", "new-1"), fp),
        (Key::new("t", "done"), fp),
        (Key::new("t", "running"), fp),
        (Key::new("t", "new-2"), fp),
        (Key::new("t", "new-1"), fp),
        (Key::new("t", "done"), Fingerprint::of("other")),
    ];
    let mut out = store.begin_batch(&items)?.into_iter();
    assert_eq!(
        store.stats().commits,
        commits + 1,
        "one commit for the batch"
    );
    let new1 = started(out.next().expect("0")?);
    assert_eq!((new1.attempt(), new1.interrupted()), (1, false));
    assert!(
        matches!(out.next(), Some(Ok(Begin::Completed(r))) if r.outcome() == Some(&b"earlier"[..]))
    );
    assert!(matches!(out.next(), Some(Ok(Begin::InProgress(i))) if i.attempt() == 1));
    let new2 = started(out.next().expect("3")?);
    assert!(
        matches!(out.next(), Some(Ok(Begin::InProgress(_)))),
        "a key repeated in the batch is in progress after its first position"
    );
    assert!(matches!(
        out.next(),
        Some(Err(Error::FingerprintMismatch { .. }))
    ));
    assert!(out.next().is_none());

    let results = store.complete_batch(&[(&new1, b"one"), (&new2, b"two")])?;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    store.complete(&running, b"")?;
    // Both survive a reopen.
    drop((new1, new2, running, done));
    drop(store);
    let store = open(&dir, &clock)?;
    for (id, outcome) in [("new-1", &b"one"[..]), ("new-2", b"two")] {
        let rec = store.get(&Key::new("t", id))?.expect("recorded");
        assert_eq!(
            (rec.state(), rec.outcome()),
            (State::Completed, Some(outcome))
        );
    }
    Ok(())
}

#[test]
fn complete_batch_fails_only_the_items_whose_claim_is_lost() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .max_outcome_len(8)
        .open(dir.path().join("s.redb"))?;
    let fp = Fingerprint::NONE;
    let items: Vec<(Key<'_>, Fingerprint)> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| (Key::new("t", id), fp))
        .collect();
    let mut claims: Vec<Claim> = store
        .begin_batch(&items)?
        .into_iter()
        .map(|b| b.map(started))
        .collect::<Result<_>>()?;
    let d = claims.pop().expect("d");
    let c = claims.pop().expect("c");
    let b = claims.pop().expect("b");
    let a = claims.pop().expect("a");
    // b's lease lapses and another worker takes it over.
    clock.advance(Duration::from_secs(31));
    let b2 = started(store.begin(&Key::new("t", "b"), fp)?);
    assert!(b2.interrupted());
    let fenced = store.stats().fenced;
    let results = store.complete_batch(&[
        (&a, b"a"),
        (&b, b"zombie"),
        (&c, b"far too long"),
        (&d, b"d"),
        (&a, b"again"),
    ])?;
    assert!(results[0].is_ok());
    assert!(matches!(results[1], Err(Error::ClaimLost { .. })));
    assert!(matches!(
        results[2],
        Err(Error::InvalidInput {
            what: "outcome",
            ..
        })
    ));
    assert!(results[3].is_ok());
    assert!(matches!(results[4], Err(Error::ClaimLost { .. })));
    assert!(store.stats().fenced > fenced);
    // The refused outcome left c's claim usable; b belongs to b2.
    store.complete(&c, b"c")?;
    store.complete(&b2, b"b2")?;
    for (id, want) in [("a", &b"a"[..]), ("b", b"b2"), ("c", b"c"), ("d", b"d")] {
        let Begin::Completed(rec) = store.begin(&Key::new("t", id), fp)? else {
            panic!("{id} completed")
        };
        assert_eq!(rec.outcome(), Some(want), "{id}");
    }
    Ok(())
}

#[test]
fn a_batch_call_with_a_bad_key_records_nothing() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = Store::builder()
        .clock(clock.clone())
        .max_id_len(4)
        .open(dir.path().join("s.redb"))?;
    let items = [
        (Key::new("t", "ok"), Fingerprint::NONE),
        (Key::new("t", "too-long"), Fingerprint::NONE),
    ];
    assert!(matches!(
        store.begin_batch(&items),
        Err(Error::InvalidInput { what: "id", .. })
    ));
    assert!(store.get(&Key::new("t", "ok"))?.is_none());
    Ok(())
}
