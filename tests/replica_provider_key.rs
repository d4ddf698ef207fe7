//! The provider key across owners: a key handed out is the one every
//! later owner of the store derives for the same operation, in both
//! replica modes, even when the next owner restores from the replica
//! after a lost disk; it still differs across scopes, stores and later
//! operations of one key. With an asynchronous replica the key is handed
//! out only once its claim is uploaded (the uploader is asked for it at
//! once, not at its interval); a fenced owner hands out none.

mod replica_kit;

use std::sync::Arc;
use std::time::Duration;

use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{Begin, Claim, Error, Fingerprint, Key, ManualClock, Store};
use replica_kit::{Bucket, TestResult};

const T0: u64 = 1_700_000_000_000;

/// A replica whose segments, left alone, would wait an hour: anything
/// uploaded within a test was asked for.
fn replica(b: &Bucket, store: &str, mode: ReplicaMode) -> Replica {
    Replica::new(Arc::clone(&b.objects), &b.at(store))
        .mode(mode)
        .segment_interval(Duration::from_secs(3600))
}

fn open(r: Replica, clock: &ManualClock, path: &std::path::Path) -> dedupkv::Result<Store> {
    Store::builder().clock(clock.clone()).replica(r).open(path)
}

fn started(b: Begin) -> Claim {
    match b {
        Begin::Started(c) => c,
        other => panic!("expected Started, got {other:?}"),
    }
}

/// The case: a key taken from an asynchronous replica's owner,
/// whose disk is then lost before the segment interval; the next owner
/// restores the claim, takes it over once its lease lapsed, and hands
/// the provider the same key.
#[test]
fn a_key_taken_before_a_lost_disk_is_the_next_owners_in_both_modes() -> TestResult {
    for mode in [ReplicaMode::Asynchronous, ReplicaMode::Synchronous] {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let clock = ManualClock::new(T0);
        let key = Key::new("shop-42", "charge-7");
        let fp = Fingerprint::of("100 EUR");
        let old = open(replica(&b, "s", mode), &clock, &dir.path().join("a.redb"))?;
        let first = started(old.begin(&key, fp)?);
        let idempotency_key = first.provider_key()?;
        assert_eq!(
            first.provider_key()?,
            idempotency_key,
            "{mode:?}: asked again"
        );

        // The disk is lost: another member opens the prefix on a new
        // local path, once the old claim's lease lapsed.
        clock.advance(Duration::from_secs(31));
        let new = open(replica(&b, "s", mode), &clock, &dir.path().join("b.redb"))?;
        let next = started(new.begin(&key, fp)?);
        assert_eq!(
            next.provider_key()?,
            idempotency_key,
            "{mode:?}: the next owner hands the provider the same key"
        );
        assert_eq!(next.attempt(), 2, "{mode:?}");
        assert!(next.interrupted(), "{mode:?}: it asks the provider first");
        assert_eq!(next.first_seen_at(), first.first_seen_at(), "{mode:?}");
        new.complete(&next, b"ch_1")?;
        drop(first);
    }
    Ok(())
}

/// Asking for a key uploads its claim (and what was committed before
/// it), at once; a claim begun after it, whose key nobody asked for,
/// waits for the interval as before, so a lost disk loses it, and the next
/// owner starts that operation afresh.
#[test]
fn asking_for_a_key_uploads_its_claim_and_nothing_later() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(T0);
    let (asked, quiet) = (Key::new("t", "asked"), Key::new("t", "quiet"));
    let mode = ReplicaMode::Asynchronous;
    let old = open(replica(&b, "s", mode), &clock, &dir.path().join("a.redb"))?;
    let asked_claim = started(old.begin(&asked, Fingerprint::NONE)?);
    let pk = asked_claim.provider_key()?;
    let quiet_claim = started(old.begin(&quiet, Fingerprint::NONE)?);
    clock.advance(Duration::from_secs(31));
    let new = open(replica(&b, "s", mode), &clock, &dir.path().join("b.redb"))?;
    let again = started(new.begin(&asked, Fingerprint::NONE)?);
    assert_eq!((again.attempt(), again.provider_key()?), (2, pk));
    assert_eq!(started(new.begin(&quiet, Fingerprint::NONE)?).attempt(), 1);
    drop((quiet_claim, asked_claim));
    Ok(())
}

/// Keys stay apart: across scopes, across stores (prefixes), and for a
/// later operation of one key, after `forget` and after expiry; and the
/// later operation's key is again the one a next owner derives.
#[test]
fn keys_differ_across_scopes_stores_and_later_operations() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(T0);
    let mode = ReplicaMode::Asynchronous;
    let s1 = open(replica(&b, "s1", mode), &clock, &dir.path().join("1.redb"))?;
    let s2 = open(replica(&b, "s2", mode), &clock, &dir.path().join("2.redb"))?;
    let key = Key::new("shop-1", "order-9");
    let a = started(s1.begin(&key, Fingerprint::NONE)?);
    let other_scope = started(s1.begin(&Key::new("shop-2", "order-9"), Fingerprint::NONE)?);
    let other_store = started(s2.begin(&key, Fingerprint::NONE)?);
    let first = a.provider_key()?;
    assert_ne!(first, other_scope.provider_key()?, "scopes");
    assert_ne!(first, other_store.provider_key()?, "stores");
    s1.complete(&a, b"done")?;

    // A later operation after `forget` (in the same millisecond).
    s1.forget(&key)?;
    let after_forget = started(s1.begin(&key, Fingerprint::NONE)?);
    let second = after_forget.provider_key()?;
    assert_ne!(second, first, "after forget");
    s1.complete(&after_forget, b"done")?;

    // A later operation after the record expired.
    clock.advance(Duration::from_secs(3 * 86_400));
    s1.evict_expired()?;
    let after_expiry = started(s1.begin(&key, Fingerprint::NONE)?);
    assert_eq!(after_expiry.attempt(), 1);
    let third = after_expiry.provider_key()?;
    assert_ne!(third, first, "after expiry");
    assert_ne!(third, second, "after expiry");

    // A lost disk: the next owner derives the latest operation's key.
    clock.advance(Duration::from_secs(31));
    let next = open(replica(&b, "s1", mode), &clock, &dir.path().join("1b.redb"))?;
    let taken_over = started(next.begin(&key, Fingerprint::NONE)?);
    assert_eq!(taken_over.provider_key()?, third, "the latest operation's");
    drop((after_expiry, other_scope, other_store));
    Ok(())
}

/// An owner fenced before its claim was uploaded hands out no key: the
/// next owner never saw that claim, so a key from it would be one
/// nobody derives again.
#[test]
fn a_fenced_owner_hands_out_no_key_for_a_claim_it_had_not_uploaded() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(T0);
    let mode = ReplicaMode::Asynchronous;
    let zombie = open(replica(&b, "s", mode), &clock, &dir.path().join("a.redb"))?;
    let key = Key::new("shop-42", "charge-8");
    let kept = started(zombie.begin(&Key::new("shop-42", "charge-7"), Fingerprint::NONE)?);
    let kept_key = kept.provider_key()?;
    let unshipped = started(zombie.begin(&key, Fingerprint::NONE)?);
    let owner = open(replica(&b, "s", mode), &clock, &dir.path().join("b.redb"))?;
    let err = unshipped.provider_key().unwrap_err();
    assert!(
        matches!(&err, Error::Fenced(m) if m.contains("epoch 2")),
        "{err}"
    );
    // A key handed out before the fence stays what it was.
    assert_eq!(kept.provider_key()?, kept_key);
    // The new owner never saw the unshipped claim: a first attempt.
    let fresh = started(owner.begin(&key, Fingerprint::NONE)?);
    assert_eq!(fresh.attempt(), 1);
    assert!(!fresh.interrupted());
    owner.complete(&fresh, b"ch_2")?;
    drop((kept, unshipped));
    Ok(())
}

/// The awaited key (feature "async") also waits for the upload, without
/// blocking the executor, and is the next owner's too.
#[cfg(feature = "async")]
#[test]
fn an_awaited_key_is_the_next_owners_too() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(T0);
    let key = Key::new("shop-42", "charge-9");
    let mode = ReplicaMode::Asynchronous;
    let old = open(replica(&b, "s", mode), &clock, &dir.path().join("a.redb"))?;
    let first = started(old.begin(&key, Fingerprint::NONE)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    // It owns what it needs: a task of its own can await it.
    let pending = first.provider_key_async();
    let idempotency_key = rt.block_on(async { tokio::spawn(pending).await })??;
    clock.advance(Duration::from_secs(31));
    let new = open(replica(&b, "s", mode), &clock, &dir.path().join("b.redb"))?;
    let next = started(new.begin(&key, Fingerprint::NONE)?);
    assert_eq!(next.provider_key()?, idempotency_key);
    drop(first);
    Ok(())
}
