//! Per-call settings: an operation's own lease (and renewal by a given
//! amount) and its own retention, shorter or longer than the store's.

use std::time::{Duration, UNIX_EPOCH};

use dedupkv::{Begin, BeginOptions, Error, Fingerprint, Key, ManualClock, Result};
use dedupkv_testkit::{T0, started, tempdir};

const SEC: u64 = 1_000;
const MIN: u64 = 60 * SEC;

fn builder(clock: &ManualClock) -> dedupkv::StoreBuilder {
    dedupkv_testkit::builder(clock)
        .lease(Duration::from_secs(30))
        .retention(Duration::from_secs(24 * 3_600))
}

fn at(ms: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

#[test]
fn a_claim_keeps_the_lease_it_was_begun_with_and_renews_by_it() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let key = Key::new("t", "lambda");
    let opts = BeginOptions::new().lease(Duration::from_secs(5));
    let c = started(store.begin_with(&key, Fingerprint::NONE, &opts)?);
    assert_eq!(c.lease_expires_at(), at(T0 + 5 * SEC));
    clock.advance(Duration::from_secs(4));
    assert!(
        matches!(store.begin(&key, Fingerprint::NONE)?, Begin::InProgress(i) if i.lease_expires_at() == at(T0 + 5 * SEC))
    );
    // renew extends by the claim's own lease, not the store's 30 s.
    assert_eq!(store.renew(&c)?, at(T0 + 9 * SEC));
    // renew_for extends by the amount given, which becomes its lease.
    assert_eq!(
        store.renew_for(&c, Duration::from_secs(60))?,
        at(T0 + 64 * SEC)
    );
    clock.advance(Duration::from_secs(10));
    assert_eq!(store.renew(&c)?, at(T0 + 74 * SEC));
    clock.advance(Duration::from_secs(61));
    let next = started(store.begin(&key, Fingerprint::NONE)?);
    assert!(next.interrupted());
    assert!(matches!(store.renew(&c), Err(Error::ClaimLost { .. })));
    store.complete(&next, b"")?;
    Ok(())
}

#[test]
fn an_operation_keeps_its_key_for_its_own_retention_shorter_or_longer() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let short = Key::new("t", "short");
    let long = Key::new("t", "long");
    let plain = Key::new("t", "plain");
    let c = started(store.begin_with(
        &short,
        Fingerprint::NONE,
        &BeginOptions::new().retention(Duration::from_secs(10 * 60)),
    )?);
    store.complete(&c, b"short")?;
    let c = started(store.begin_with(
        &long,
        Fingerprint::NONE,
        &BeginOptions::new().retention(Duration::from_secs(48 * 3_600)),
    )?);
    store.complete(&c, b"long")?;
    let c = started(store.begin(&plain, Fingerprint::NONE)?);
    store.complete(&c, b"plain")?;

    clock.set(T0 + 12 * MIN);
    store.evict_expired()?;
    let again = started(store.begin(&short, Fingerprint::NONE)?);
    assert_eq!(
        again.attempt(),
        1,
        "the short operation expired after its 10 min"
    );
    assert!(matches!(
        store.begin(&plain, Fingerprint::NONE)?,
        Begin::Completed(_)
    ));

    clock.set(T0 + 30 * 60 * MIN);
    store.evict_expired()?;
    assert!(
        matches!(store.begin(&plain, Fingerprint::NONE)?, Begin::Started(_)),
        "the store's 24 h passed"
    );
    assert!(
        matches!(store.begin(&long, Fingerprint::NONE)?, Begin::Completed(r) if r.outcome() == Some(&b"long"[..])),
        "the long operation is kept for its 48 h"
    );
    drop(again);
    Ok(())
}

#[test]
fn complete_for_can_be_shorter_when_the_claim_was_begun_short() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let key = Key::new("t", "op");
    let c = started(store.begin_with(
        &key,
        Fingerprint::NONE,
        &BeginOptions::new().retention(Duration::from_secs(5 * 60)),
    )?);
    store.complete_for(&c, b"x", Duration::from_secs(5 * 60))?;
    clock.set(T0 + 7 * MIN);
    store.evict_expired()?;
    assert!(
        store.get(&key)?.is_none(),
        "kept 5 min, not the store's 24 h"
    );
    Ok(())
}

#[test]
fn per_call_settings_out_of_range_are_refused_at_the_call() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .max_retry_window(Duration::from_secs(3_600))
        .open(dir.path().join("s.redb"))?;
    let key = Key::new("t", "op");
    let fp = Fingerprint::NONE;
    for opts in [
        BeginOptions::new().lease(Duration::ZERO),
        BeginOptions::new().lease(Duration::from_secs(u64::MAX)),
        BeginOptions::new().retention(Duration::from_secs(60)),
        BeginOptions::new().retention(Duration::ZERO),
    ] {
        let err = store.begin_with(&key, fp, &opts).unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{opts:?}: {err}"
        );
    }
    for short in [Duration::from_secs(60), Duration::ZERO] {
        assert!(matches!(
            store.insert_if_absent_for(&key, short),
            Err(Error::InvalidArgument {
                what: "retention",
                ..
            })
        ));
    }
    // Nothing was recorded; the window-long retention is fine.
    assert!(store.get(&key)?.is_none());
    let c = started(store.begin_with(
        &key,
        fp,
        &BeginOptions::new().retention(Duration::from_secs(3_600)),
    )?);
    assert!(matches!(
        store.renew_for(&c, Duration::ZERO),
        Err(Error::InvalidArgument { what: "lease", .. })
    ));
    store.complete(&c, b"")?;
    Ok(())
}
