//! Forgetting a key: durable, fenced against a live claim, visible to an
//! audit through `get` and `Stats::forgotten`.

use std::time::Duration;

use dedupkv::{Begin, Fingerprint, Forget, Key, ManualClock, Result, State, Store};
use dedupkv_testkit::{T0, started, tempdir};

fn open(path: &std::path::Path, clock: &ManualClock) -> Result<Store> {
    Store::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .lease(Duration::from_secs(30))
        .retention(Duration::from_secs(3_600))
        .open(path)
}

#[test]
fn a_forgotten_key_is_absent_after_reopen_and_its_forgetting_is_on_record() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let done = Key::new("t", "done");
    let failed = Key::new("t", "failed");
    let seen = Key::new("t", "seen");
    let fp = Fingerprint::of("p");
    {
        let store = open(&path, &clock)?;
        let c = started(store.begin(&done, fp)?);
        store.complete(&c, b"bad outcome")?;
        let c = started(store.begin(&failed, fp)?);
        store.fail(&c, dedupkv::Failure::Permanent(b"declined"))?;
        assert!(store.insert_if_absent(&seen)?);
        clock.advance(Duration::from_secs(5));
        for k in [&done, &failed, &seen] {
            assert!(matches!(store.forget(k)?, Forget::Forgotten(_)), "{k}");
        }
        assert!(matches!(store.forget(&done)?, Forget::NotFound));
        assert!(matches!(
            store.forget(&Key::new("t", "never"))?,
            Forget::NotFound
        ));
        assert_eq!(store.stats().forgotten, 3);
    }
    let store = open(&path, &clock)?;
    let rec = store.get(&done)?.expect("the forget record, for audit");
    assert_eq!(rec.state(), State::Forgotten);
    assert_eq!(rec.attempts(), 1);
    assert_eq!(rec.fingerprint(), Some(fp));
    assert_eq!(
        rec.updated_at(),
        std::time::UNIX_EPOCH + Duration::from_millis(T0 + 5_000)
    );
    // Absent to every call: a new operation, a new key.
    let c = started(store.begin(&done, Fingerprint::of("another request"))?);
    assert_eq!((c.attempt(), c.interrupted()), (1, false));
    store.complete(&c, b"good outcome")?;
    assert!(store.insert_if_absent(&seen)?);
    assert!(matches!(store.begin(&failed, fp)?, Begin::Started(_)));
    Ok(())
}

#[test]
fn forget_never_removes_a_claim_a_live_attempt_holds() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir.path().join("s.redb"), &clock)?;
    let key = Key::new("t", "op");
    let c = started(store.begin(&key, Fingerprint::NONE)?);
    assert!(matches!(store.forget(&key)?, Forget::InProgress(i) if i.attempt() == 1));
    assert!(matches!(
        store.begin(&key, Fingerprint::NONE)?,
        Begin::InProgress(_)
    ));
    // Its lease lapsed: the attempt no longer holds the key, and a zombie
    // cannot complete what was forgotten.
    clock.advance(Duration::from_secs(31));
    assert!(matches!(store.forget(&key)?, Forget::Forgotten(r) if r.state() == State::InProgress));
    assert!(matches!(
        store.complete(&c, b"zombie"),
        Err(dedupkv::Error::ClaimLost { .. })
    ));
    assert!(matches!(store.begin(&key, Fingerprint::NONE)?, Begin::Started(n) if n.attempt() == 1));
    Ok(())
}

#[test]
fn a_key_recorded_again_after_forget_stays_recorded_across_reopen() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let key = Key::new("t", "op");
    {
        let store = open(&path, &clock)?;
        let c = started(store.begin(&key, Fingerprint::NONE)?);
        // A long-lived outcome, then forgotten (the forget record sits in a
        // late bucket), then a plain insert with the store's 1 h retention.
        store.complete_for(&c, b"x", Duration::from_secs(10 * 3_600))?;
        assert!(matches!(store.forget(&key)?, Forget::Forgotten(_)));
        assert!(matches!(
            store.complete(&c, b"late"),
            Err(dedupkv::Error::ClaimLost { reason, .. }) if reason.contains("forgotten") || reason.contains("finished")
        ));
        assert!(store.insert_if_absent(&key)?);
        clock.advance(Duration::from_secs(2 * 3_600));
        store.evict_expired()?;
        let live = store.get(&key)?.map(|r| r.state());
        assert_eq!(
            live,
            Some(State::Inserted),
            "kept at least as long as the forget record"
        );
    }
    let store = open(&path, &clock)?;
    assert_eq!(
        store.get(&key)?.map(|r| r.state()),
        Some(State::Inserted),
        "the forget record must not come back at a reopen"
    );
    Ok(())
}

#[test]
fn a_claim_on_a_forgotten_key_is_fenced_saying_so() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir.path().join("s.redb"), &clock)?;
    let key = Key::new("t", "op");
    let c = started(store.begin(&key, Fingerprint::NONE)?);
    clock.advance(Duration::from_secs(31)); // its lease lapsed
    assert!(matches!(store.forget(&key)?, Forget::Forgotten(_)));
    let err = store.complete(&c, b"late").unwrap_err();
    assert!(err.to_string().contains("forgotten"), "{err}");
    Ok(())
}
