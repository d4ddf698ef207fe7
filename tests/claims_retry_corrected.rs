//! A retry with a corrected request: `Failure::RetryableAnyRequest` frees
//! the key's fingerprint for the next attempt; `Failure::Retryable` keeps it.

use dedupkv::{Begin, Error, Failure, Fingerprint, Key, Result, Store};
use dedupkv_testkit::{started, tempdir};

#[test]
fn a_retryable_failure_keeps_the_fingerprint_by_default() -> Result<()> {
    let dir = tempdir();
    let store = Store::open(dir.path().join("s.redb"))?;
    let key = Key::new("t", "charge");
    let c = started(store.begin(&key, Fingerprint::of("v1"))?);
    store.fail(&c, Failure::Retryable)?;
    assert!(matches!(
        store.begin(&key, Fingerprint::of("v2")),
        Err(Error::FingerprintMismatch { .. })
    ));
    let c = started(store.begin(&key, Fingerprint::of("v1"))?);
    assert_eq!(c.attempt(), 2);
    store.complete(&c, b"")?;
    Ok(())
}

#[test]
fn retryable_any_request_lets_a_corrected_request_retry_and_survives_reopen() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let key = Key::new("t", "charge");
    {
        let store = Store::open(&path)?;
        let c = started(store.begin(&key, Fingerprint::of("expired card"))?);
        store.fail(&c, Failure::RetryableAnyRequest)?;
    }
    let store = Store::open(&path)?;
    let c = started(store.begin(&key, Fingerprint::of("new card"))?);
    assert_eq!(c.attempt(), 2, "the attempt count is kept");
    // The corrected request is the key's fingerprint from now on.
    assert!(matches!(
        store.begin(&key, Fingerprint::of("expired card")),
        Err(Error::FingerprintMismatch { .. })
    ));
    store.fail(&c, Failure::Retryable)?;
    assert!(matches!(
        store.begin(&key, Fingerprint::of("expired card")),
        Err(Error::FingerprintMismatch { .. })
    ));
    let c = started(store.begin(&key, Fingerprint::of("new card"))?);
    store.complete(&c, b"ch_1")?;
    let Begin::Completed(rec) = store.begin(&key, Fingerprint::of("new card"))? else {
        panic!("completed")
    };
    assert_eq!(
        (rec.attempts(), rec.fingerprint()),
        (3, Some(Fingerprint::of("new card")))
    );
    Ok(())
}

#[test]
fn a_corrected_request_gets_a_provider_key_of_its_own() -> Result<()> {
    let dir = tempdir();
    let store = Store::open(dir.path().join("s.redb"))?;
    let key = Key::new("t", "charge");
    let first = started(store.begin(&key, Fingerprint::of("card 4242"))?);
    let first_key = first.provider_key()?;
    store.fail(&first, Failure::Retryable)?;
    let same = started(store.begin(&key, Fingerprint::of("card 4242"))?);
    assert_eq!(
        same.provider_key()?,
        first_key,
        "a retry of the same request"
    );
    store.fail(&same, Failure::RetryableAnyRequest)?;
    // A provider refuses a key reused with other parameters (or replays
    // the old decline): the corrected request is a new provider operation.
    let corrected = started(store.begin(&key, Fingerprint::of("card 5555"))?);
    assert_ne!(corrected.provider_key()?, first_key);
    store.complete(&corrected, b"ch_1")?;
    let rec = store.get(&key)?.expect("recorded");
    assert_eq!(rec.provider_key(), Some(corrected.provider_key()?));
    Ok(())
}
