//! Intents before external calls: recorded in the claim's commit, marked
//! sent, closed by the operation's outcome, and while unanswered findable
//! across crashes, takeovers, reopen and retention.

use std::path::Path;
use std::time::Duration;

use dedupkv::{
    Begin, BeginOptions, Error, Failure, Fingerprint, Intent, Key, Listing, ManualClock, Result,
    Store, StoreBuilder,
};
use dedupkv_testkit::{T0, started, tempdir};

const HOUR: Duration = Duration::from_secs(3600);
const SHIP: Intent<'static> = Intent {
    target: "carrier",
    request: b"{\"order\":7}",
};

fn builder(clock: &ManualClock) -> StoreBuilder {
    dedupkv_testkit::builder(clock)
        .retention(HOUR)
        .bucket_granularity(Duration::from_secs(60))
}

fn open(path: &Path, clock: &ManualClock) -> Result<Store> {
    builder(clock).open(path)
}

fn begin(store: &Store, key: &Key<'_>) -> Result<Begin> {
    store.begin_with_intent(key, Fingerprint::of("req"), &BeginOptions::new(), SHIP)
}

fn pending(store: &Store) -> Result<Vec<String>> {
    Ok(store
        .pending_intents(&Listing::new())?
        .items
        .iter()
        .map(|e| e.key().to_string())
        .collect())
}

#[test]
fn an_intent_rides_in_the_claims_commit_and_mark_sent_adds_one() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let key = Key::new("shop", "ship-7");
    let before = store.stats().commits;
    let claim = started(begin(&store, &key)?);
    assert_eq!(
        store.stats().commits,
        before + 1,
        "one commit: claim and intent"
    );
    let e = store.intent(&key)?.expect("recorded");
    assert_eq!(
        (e.target(), e.request(), e.is_sent()),
        ("carrier", Some(SHIP.request), false)
    );
    assert_eq!(e.provider_key(), claim.provider_key()?);
    assert_eq!((e.attempt(), store.stats().intents_pending), (1, 1));
    store.mark_sent(&claim, b"1Z999")?;
    assert_eq!(store.stats().commits, before + 2);
    let e = store.intent(&key)?.expect("kept");
    assert_eq!(
        (e.is_sent(), e.reference(), e.request()),
        (true, Some(&b"1Z999"[..]), None)
    );
    assert_eq!(store.stats().intents_pending, 0);
    store.complete(&claim, b"1Z999")?;
    assert_eq!(store.stats().commits, before + 3);
    assert!(pending(&store)?.is_empty());
    assert!(
        store
            .duplicate_candidates(&Listing::new())?
            .items
            .is_empty(),
        "one attempt"
    );
    Ok(())
}

#[test]
fn an_unanswered_intent_survives_a_crash_and_the_next_attempt_is_told() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let key = Key::new("shop", "ship-7");
    {
        let store = open(&path, &clock)?;
        let claim = started(begin(&store, &key)?);
        // The process dies after the carrier accepted, before mark_sent.
        std::mem::forget(claim);
    }
    let store = open(&path, &clock)?;
    assert_eq!(pending(&store)?, vec![key.to_string()]);
    let claim = started(begin(&store, &key)?);
    assert!(claim.interrupted() && claim.unanswered_intent());
    assert_eq!(claim.attempt(), 2);
    let e = store.intent(&key)?.expect("pending");
    assert_eq!(
        e.provider_key(),
        claim.provider_key()?,
        "the same key to ask with"
    );
    assert_eq!(
        e.recorded_at(),
        std::time::UNIX_EPOCH + Duration::from_millis(T0)
    );
    // Reconciled: the carrier had it. Mark it, complete, and it is listed
    // as a candidate for a duplicate effect (two attempts).
    store.mark_sent(&claim, b"1Z999")?;
    store.complete(&claim, b"1Z999")?;
    assert!(pending(&store)?.is_empty());
    let twice = store.duplicate_candidates(&Listing::new())?;
    assert_eq!(twice.items.len(), 1);
    assert_eq!(twice.items[0].attempt(), 2);
    drop(store);
    let store = open(&path, &clock)?;
    assert!(pending(&store)?.is_empty(), "answered, durably");
    assert_eq!(store.duplicate_candidates(&Listing::new())?.items.len(), 1);
    Ok(())
}

#[test]
fn finishing_the_operation_closes_its_intent_durably() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let (done, failed, retry, dead) = (
        Key::new("t", "done"),
        Key::new("t", "failed"),
        Key::new("t", "retry"),
        Key::new("t", "dead"),
    );
    {
        let store = open(&path, &clock)?;
        let c = started(begin(&store, &done)?);
        store.complete(&c, b"ok")?;
        let c = started(begin(&store, &failed)?);
        store.fail(&c, Failure::Permanent(b"refused"))?;
        let c = started(begin(&store, &retry)?);
        store.fail(&c, Failure::Retryable)?;
        let c = started(begin(&store, &dead)?);
        store.fail(
            &c,
            Failure::Exhausted {
                reason: "gave up",
                payload: None,
            },
        )?;
        let mut want = vec![retry.to_string(), dead.to_string()];
        want.sort();
        let mut got = pending(&store)?;
        got.sort();
        assert_eq!(
            got, want,
            "a retry or a dead letter leaves the call ambiguous"
        );
    }
    let store = open(&path, &clock)?;
    let mut got = pending(&store)?;
    got.sort();
    assert_eq!(got.len(), 2);
    assert!(store.intent(&done)?.is_none() && store.intent(&failed)?.is_none());
    let c = started(begin(&store, &retry)?);
    assert!(c.unanswered_intent() && !c.interrupted());
    store.complete(&c, b"ok")?;
    Ok(())
}

#[test]
fn an_unanswered_intent_outlives_retention_and_a_long_close_a_sent_one_does_not() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let (stuck, sent) = (Key::new("t", "stuck"), Key::new("t", "sent"));
    {
        let store = open(&path, &clock)?;
        std::mem::forget(started(begin(&store, &stuck)?));
        let c = started(begin(&store, &sent)?);
        store.mark_sent(&c, b"ref")?;
        std::mem::forget(c);
        clock.advance(3 * HOUR);
        store.evict_expired()?;
        assert_eq!(
            pending(&store)?,
            vec![stuck.to_string()],
            "carried past eviction"
        );
        assert!(
            store.intent(&sent)?.is_none(),
            "a sent one expires with its record"
        );
        assert!(
            store.get(&stuck)?.is_none(),
            "the stranded claim itself expired"
        );
    }
    clock.advance(Duration::from_secs(21 * 86_400));
    let store = open(&path, &clock)?;
    assert_eq!(
        pending(&store)?,
        vec![stuck.to_string()],
        "and past a long close"
    );
    drop(store);
    let store = open(&path, &clock)?;
    assert_eq!(pending(&store)?, vec![stuck.to_string()]);
    // A new operation on the key (the old one expired) still sees it.
    let c = started(begin(&store, &stuck)?);
    assert!(c.unanswered_intent());
    store.complete(&c, b"ok")?;
    assert!(pending(&store)?.is_empty());
    Ok(())
}

#[test]
fn bad_intent_calls_are_refused_and_record_nothing() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .max_outcome_len(64)
        .open(dir.path().join("s.redb"))?;
    let key = Key::new("t", "op");
    let big = vec![7u8; 64]; // with its 1-byte target, one past the limit
    let err = store
        .begin_with_intent(
            &key,
            Fingerprint::NONE,
            &BeginOptions::new(),
            Intent {
                target: "x",
                request: &big,
            },
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput { what: "intent", .. }),
        "{err}"
    );
    assert!(store.get(&key)?.is_none(), "nothing recorded");
    let plain = started(store.begin(&key, Fingerprint::NONE)?);
    assert!(matches!(
        store.mark_sent(&plain, b"r"),
        Err(Error::InvalidArgument { what: "claim", .. })
    ));
    store.complete(&plain, b"ok")?;
    assert!(matches!(
        store.mark_sent(&plain, b"r"),
        Err(Error::ClaimLost { .. })
    ));
    // An answer other than Started records no intent.
    assert!(matches!(
        store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), SHIP)?,
        Begin::Completed(_)
    ));
    assert!(store.intent(&key)?.is_none());
    Ok(())
}
