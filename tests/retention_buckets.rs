//! Retention: time buckets, eviction, the dedup window, and its guard rails.

use std::time::Duration;

use dedupkv::{Begin, Error, Fingerprint, Key, ManualClock, Result, Store, StoreBuilder};
use dedupkv_testkit::{FaultBackend, Plan, T0, is_fault, tempdir};

const MIN: Duration = Duration::from_secs(60);

fn builder(clock: &ManualClock) -> StoreBuilder {
    dedupkv_testkit::builder(clock)
        .lease(Duration::from_secs(30))
        .retention(10 * MIN)
        .bucket_granularity(MIN)
}

fn ids(window: usize, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("w{window}-{i}")).collect()
}

#[test]
fn after_each_window_only_the_last_windows_keys_are_duplicates() -> Result<()> {
    const PER: usize = 300;
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    for w in 0..10 {
        let keys = ids(w, PER);
        let batch: Vec<Key<'_>> = keys.iter().map(|id| Key::new("t", id)).collect();
        assert!(store.insert_batch(&batch)?.iter().all(|new| *new));
        clock.advance(Duration::from_millis(10 * 60_000 - 1)); // the end of window w
        for id in &keys {
            assert!(
                store.get(&Key::new("t", id))?.is_some(),
                "{id} forgotten too early"
            );
        }
        if w > 0 {
            for id in ids(w - 1, PER) {
                assert!(
                    store.get(&Key::new("t", &id))?.is_none(),
                    "{id} outlived its window"
                );
            }
        }
        let ev = store.evict_expired()?;
        assert_eq!(ev.keys, if w == 0 { 0 } else { PER as u64 }, "window {w}");
        assert_eq!(store.stats().keys, PER as u64, "window {w}");
        clock.advance(Duration::from_millis(1));
    }
    assert_eq!(store.stats().evicted_keys, 9 * PER as u64);
    Ok(())
}

#[test]
fn a_redelivery_before_expiry_is_a_duplicate_and_after_it_is_new() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let key = Key::new("webhooks", "evt-1");
    assert!(store.insert_if_absent(&key)?);
    clock.advance(9 * MIN);
    assert!(
        !store.insert_if_absent(&key)?,
        "inside the window: duplicate"
    );
    // The duplicate did not extend the key's life: it expires 10 min (+ the
    // rest of its bucket) after its first record, even before eviction runs.
    clock.advance(2 * MIN);
    assert!(store.insert_if_absent(&key)?, "after the window: new again");
    assert!(!store.insert_if_absent(&key)?);
    Ok(())
}

#[test]
fn per_call_retention_can_extend_a_key_but_never_shorten_it() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    store.insert_if_absent_for(&Key::new("t", "long"), 60 * MIN)?;
    let Begin::Started(c) = store.begin(&Key::new("t", "op"), Fingerprint::NONE)? else {
        panic!()
    };
    store.complete_for(&c, b"kept a day", 24 * 60 * MIN)?;
    store.insert_if_absent(&Key::new("t", "default"))?;
    clock.advance(30 * MIN);
    store.evict_expired()?;
    assert!(store.get(&Key::new("t", "default"))?.is_none());
    assert!(store.get(&Key::new("t", "long"))?.is_some());
    assert!(matches!(
        store.begin(&Key::new("t", "op"), Fingerprint::NONE)?,
        Begin::Completed(_)
    ));
    // A shorter override on a later record does not pull the key earlier.
    let Begin::Completed(_) = store.begin(&Key::new("t", "op"), Fingerprint::NONE)? else {
        panic!()
    };
    assert!(matches!(
        store.insert_if_absent_for(
            &Key::new("t", "x"),
            Duration::from_secs(u64::MAX / 1_000_000)
        ),
        Err(Error::InvalidConfig(_))
    ));
    Ok(())
}

#[test]
fn live_claims_are_not_evicted_while_their_lease_is_alive() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .lease(8 * MIN)
        .open(dir.path().join("s.redb"))?;
    let Begin::Started(claim) = store.begin(&Key::new("t", "slow"), Fingerprint::NONE)? else {
        panic!()
    };
    // Renewed every few minutes for an hour: never evicted, never taken over.
    for _ in 0..12 {
        clock.advance(5 * MIN);
        store.renew(&claim)?;
        store.evict_expired()?;
        assert!(matches!(
            store.begin(&Key::new("t", "slow"), Fingerprint::NONE)?,
            Begin::InProgress(_)
        ));
    }
    store.complete(&claim, b"done")?;
    Ok(())
}

#[test]
fn memory_and_disk_stay_bounded_under_churn() -> Result<()> {
    const PER_MINUTE: usize = 2_000;
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(&path)?;
    let mut settled = None;
    for minute in 0..60 {
        let keys = ids(minute, PER_MINUTE);
        for chunk in keys.chunks(500) {
            let batch: Vec<Key<'_>> = chunk.iter().map(|id| Key::new("churn", id)).collect();
            store.insert_batch(&batch)?;
        }
        clock.advance(MIN);
        store.evict_expired()?;
        let s = store.stats();
        // Ten minutes of keys plus the bucket being rounded up, at most.
        assert!(
            s.keys <= 11 * PER_MINUTE as u64,
            "minute {minute}: {} keys",
            s.keys
        );
        let file = std::fs::metadata(&path).expect("file").len();
        if minute == 15 {
            settled = Some((s.index_bytes, file));
        }
        if let Some((bytes, size)) = settled {
            // A shard whose share of keys drifts above its 90 % load grows
            // once by a quarter; nothing grows without bound.
            assert!(
                s.index_bytes <= bytes + bytes * 3 / 10,
                "minute {minute}: index grew from {bytes} to {}",
                s.index_bytes
            );
            assert!(
                file <= size + size / 4,
                "minute {minute}: file grew from {size} to {file} bytes"
            );
        }
    }
    Ok(())
}

/// Inserts each key, which must be new.
fn insert_each(store: &Store, keys: &[String]) -> Result<()> {
    for id in keys {
        assert!(
            store.insert_if_absent(&Key::new("t", id))?,
            "{id} was not new"
        );
    }
    Ok(())
}

/// The store holds exactly `live`: none of `expired` came back, none of
/// `live` was lost. `when` names the case in a failure.
fn assert_holds_only(store: &Store, expired: &[String], live: &[String], when: &str) -> Result<()> {
    for id in expired {
        assert!(
            store.get(&Key::new("t", id))?.is_none(),
            "{when}: expired {id} came back"
        );
    }
    for id in live {
        assert!(
            !store.insert_if_absent(&Key::new("t", id))?,
            "{when}: live {id} was lost"
        );
    }
    assert_eq!(store.stats().keys, live.len() as u64, "{when}");
    Ok(())
}

/// A failed eviction is the injected I/O error or the poison after it.
fn assert_storage_fault(err: &Error) {
    assert!(is_fault(err), "{err}");
}

#[test]
fn a_crash_between_index_eviction_and_disk_deletion_loses_and_resurrects_nothing() -> Result<()> {
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    let store = builder(&clock).open_with_backend(backend.clone())?;
    let (old, live) = (ids(0, 200), ids(1, 200));
    insert_each(&store, &old)?;
    clock.advance(15 * MIN); // the old keys have expired
    insert_each(&store, &live)?;
    backend.arm(Plan::after(0)); // the deletion commit fails: the index is evicted, the disk is not
    let err = store
        .evict_expired()
        .expect_err("the deletion commit fails");
    assert_storage_fault(&err);
    drop(store);

    let store = builder(&clock).open_with_backend(backend.healthy())?;
    assert_holds_only(&store, &old, &live, "reopened")
}

/// Open deletes the expired tables in its own first commit and returns
/// after it: a failure there fails the open (it does not hand back a store
/// that is already poisoned), and a store it returns has nothing in flight.
#[test]
fn open_returns_after_its_first_commit_and_reports_its_failure() -> Result<()> {
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    let (old, live) = (ids(0, 50), ids(1, 50));
    {
        let store = builder(&clock).open_with_backend(backend.clone())?;
        insert_each(&store, &old)?;
        clock.advance(15 * MIN);
        insert_each(&store, &live)?;
    }
    // Sweep the failure over the reopen's writes and syncs.
    let mut refused = 0;
    for fail_after in 0.. {
        let faulty = backend.healthy();
        faulty.arm(Plan::after(fail_after));
        match builder(&clock).open_with_backend(faulty.clone()) {
            Err(err) => {
                assert_storage_fault(&err);
                refused += 1;
            }
            Ok(store) => {
                assert!(
                    !faulty.tripped(),
                    "open {fail_after} returned a failed store"
                );
                assert_eq!(store.stats().commits, 1, "open {fail_after}");
                faulty.disarm();
                assert_holds_only(&store, &old, &live, &format!("open {fail_after}"))?;
                break;
            }
        }
    }
    assert!(refused > 0, "the sweep never reached the open's commit");
    Ok(())
}

#[test]
fn a_large_bucket_is_deleted_a_slice_per_commit() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    // One row per call: 40 rows in the old bucket.
    let (old, live) = (ids(0, 40), ids(1, 40));

    // With the default slice (1 MiB) the small bucket goes in one commit.
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("whole.redb"))?;
    insert_each(&store, &old)?;
    clock.advance(15 * MIN);
    let before = store.stats().commits;
    assert_eq!(store.evict_expired()?.keys, old.len() as u64);
    assert_eq!(store.stats().commits - before, 1);
    drop(store);

    let clock = ManualClock::new(T0);
    let store = builder(&clock).evict_slice_bytes(1).open(&path)?;
    insert_each(&store, &old)?;
    clock.advance(15 * MIN);
    insert_each(&store, &live)?;
    let before = store.stats().commits;
    assert_eq!(store.evict_expired()?.keys, old.len() as u64);
    // A commit per row, then the (empty) table's deletion.
    assert_eq!(store.stats().commits - before, old.len() as u64 + 1);
    assert_holds_only(&store, &old, &live, "evicted")?;
    drop(store);
    let store = builder(&clock).evict_slice_bytes(1).open(&path)?;
    assert_holds_only(&store, &old, &live, "reopened")
}

#[test]
fn a_crash_part_way_through_a_sliced_deletion_loses_and_resurrects_nothing() -> Result<()> {
    let (old, live) = (ids(0, 30), ids(1, 30));
    let (mut failed, mut mid_way) = (0, 0);
    // Sweep the failure over the slice commits' writes and syncs.
    for fail_after in 0..60 {
        let clock = ManualClock::new(T0);
        let backend = FaultBackend::new();
        let open = |b| builder(&clock).evict_slice_bytes(1).open_with_backend(b);
        let store = open(backend.clone())?;
        insert_each(&store, &old)?;
        clock.advance(15 * MIN);
        insert_each(&store, &live)?;
        let before = store.stats().commits;
        backend.arm(Plan::after(fail_after));
        match store.evict_expired() {
            Ok(ev) => assert_eq!(ev.keys, old.len() as u64),
            Err(err) => {
                assert_storage_fault(&err);
                failed += 1;
                if store.stats().commits > before {
                    mid_way += 1;
                }
            }
        }
        drop(store);

        let store = open(backend.healthy())?;
        assert_holds_only(&store, &old, &live, &format!("fail after {fail_after}"))?;
        // The rest of the expired table goes at the next eviction.
        store.evict_expired()?;
    }
    assert!(
        mid_way >= 5,
        "{failed} failures, {mid_way} after a slice was deleted"
    );
    Ok(())
}

#[test]
fn reopening_loads_nothing_expired() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    {
        let store = builder(&clock).open(&path)?;
        for id in ids(0, 100) {
            store.insert_if_absent(&Key::new("t", &id))?;
        }
        clock.advance(6 * MIN);
        for id in ids(1, 100) {
            store.insert_if_absent(&Key::new("t", &id))?;
        }
    }
    clock.advance(6 * MIN); // window 0 expired while the store was closed
    let store = builder(&clock).open(&path)?;
    assert_eq!(store.stats().keys, 100);
    assert!(store.get(&Key::new("t", "w0-0"))?.is_none());
    assert!(store.get(&Key::new("t", "w1-0"))?.is_some());
    Ok(())
}

#[test]
fn retention_shorter_than_the_retry_window_is_refused() {
    let dir = tempdir();
    let err = Store::builder()
        .retention(Duration::from_secs(3600))
        .max_retry_window(Duration::from_secs(7200))
        .open(dir.path().join("s.redb"))
        .expect_err("refused");
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("retry window")),
        "{err}"
    );
    assert!(
        Store::builder()
            .retention(Duration::from_secs(7200))
            .max_retry_window(Duration::from_secs(7200))
            .open(dir.path().join("s.redb"))
            .is_ok()
    );
}

/// 500 new keys a minute for five minutes: 2,500 keys, over a `max_keys`
/// of 1,000, in five live buckets.
fn fill_five_minutes(store: &Store, clock: &ManualClock) -> Result<()> {
    for minute in 0..5 {
        insert_each(store, &ids(minute, 500))?;
        clock.advance(MIN);
    }
    Ok(())
}

#[test]
fn a_size_bound_evicts_early_and_says_so() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .lease(9 * MIN)
        .max_keys(1_000)
        .open(dir.path().join("s.redb"))?;
    let held = Key::new("t", "held");
    let Begin::Started(claim) = store.begin(&held, Fingerprint::NONE)? else {
        panic!()
    };
    fill_five_minutes(&store, &clock)?;
    let before = store.stats();
    assert_eq!(before.early_evicted_buckets, 0);
    let ev = store.evict_expired()?;
    assert!(ev.early_buckets >= 3, "{ev:?}");
    let s = store.stats();
    assert!(s.keys <= 1_001, "{} keys", s.keys);
    assert_eq!(s.early_evicted_buckets, ev.early_buckets as u64);
    assert!(s.effective_window < before.effective_window, "{s:?}");
    // The claim's lease (9 min) is still alive: early eviction kept it.
    assert!(matches!(
        store.begin(&held, Fingerprint::NONE)?,
        Begin::InProgress(_)
    ));
    store.complete(&claim, b"done")?;
    Ok(())
}

#[test]
fn a_claim_kept_by_early_eviction_survives_a_reopen() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let open = || builder(&clock).lease(9 * MIN).max_keys(1_000).open(&path);
    let store = open()?;
    let held = Key::new("t", "held");
    let Begin::Started(claim) = store.begin(&held, Fingerprint::NONE)? else {
        panic!("a new key is started")
    };
    fill_five_minutes(&store, &clock)?;
    let ev = store.evict_expired()?;
    assert!(ev.early_buckets >= 3, "{ev:?}");
    // The worker dies holding the claim: nothing releases it.
    std::mem::forget(claim);
    drop(store);

    // The claim's record must survive the restart, or the operation would
    // start over as attempt 1 with nobody told that attempt 1 may have
    // acted. Its process is gone, so the next begin takes it over at once.
    let store = open()?;
    let Begin::Started(c) = store.begin(&held, Fingerprint::NONE)? else {
        panic!("the claim of a process that is gone is taken over")
    };
    assert_eq!(
        (c.attempt(), c.interrupted()),
        (2, true),
        "the live claim was lost with its early-evicted bucket"
    );
    store.complete(&c, b"")?;
    let Begin::Completed(rec) = store.begin(&held, Fingerprint::NONE)? else {
        panic!("completed")
    };
    assert_eq!(
        rec.first_seen_at(),
        std::time::UNIX_EPOCH + Duration::from_millis(T0)
    );
    Ok(())
}

#[test]
fn no_record_lands_in_a_bucket_an_early_eviction_closed() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let open = || builder(&clock).max_keys(1_000).open(&path);
    let store = open()?;
    fill_five_minutes(&store, &clock)?;
    // Minutes 0..=2 (buckets expiring at T0 + 10..=12 min) go early.
    let ev = store.evict_expired()?;
    assert!(ev.early_buckets >= 3, "{ev:?}");
    // A 6-minute retention now aims at T0 + 11 min: a deleted bucket.
    let short = Key::new("t", "short-lived");
    assert!(store.insert_if_absent_for(&short, 6 * MIN)?);
    let rec = store.get(&short)?.expect("just inserted");
    let closed_end = std::time::UNIX_EPOCH + Duration::from_millis(T0) + 13 * MIN;
    assert!(
        rec.expires_at() >= closed_end,
        "the record went into a closed bucket: expires {:?}",
        rec.expires_at()
    );
    // It is durable where it went: a restart keeps it.
    drop(store);
    let store = open()?;
    assert!(
        !store.insert_if_absent(&short)?,
        "the short-lived key was lost"
    );
    Ok(())
}

#[test]
fn compaction_gives_space_back_after_the_store_shrinks() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(&path)?;
    let ids: Vec<String> = (0..200_000).map(|i| format!("bulk-{i}")).collect();
    for chunk in ids.chunks(10_000) {
        let keys: Vec<Key<'_>> = chunk.iter().map(|id| Key::new("t", id)).collect();
        store.insert_batch(&keys)?;
    }
    let full = std::fs::metadata(&path).expect("file").len();
    clock.advance(20 * MIN);
    assert_eq!(store.evict_expired()?.keys, 200_000);
    assert!(store.compact()?, "there was space to give back");
    let compacted = std::fs::metadata(&path).expect("file").len();
    assert!(compacted < full / 2, "{full} -> {compacted} bytes");
    // Still a working store.
    assert!(store.insert_if_absent(&Key::new("t", "after"))?);
    drop(store);
    let store = builder(&clock).open(&path)?;
    assert!(!store.insert_if_absent(&Key::new("t", "after"))?);
    Ok(())
}

fn keys_in_t(ids: &[String]) -> Vec<Key<'_>> {
    ids.iter().map(|id| Key::new("t", id)).collect()
}

/// One commit whose records go to two bucket tables, each holding runs of
/// plain inserts (consecutive inserts with one time, scope and id length)
/// broken by the other table's records: recovery merges the tables' rows
/// by record index and must get every key and its expiry back.
#[test]
fn one_commit_with_runs_in_two_bucket_tables_reopens_whole() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let open = || {
        builder(&clock)
            .durability(dedupkv::Durability::Deferred {
                max_delay: Duration::from_secs(3_600),
            })
            .open(&path)
    };
    let short: Vec<String> = (0..9).map(|i| format!("short-{i:02}")).collect();
    let long: Vec<String> = (0..4).map(|i| format!("long-{i:03}")).collect();
    {
        let store = open()?;
        let before = store.stats().commits;
        store.insert_batch(&keys_in_t(&short[..5]))?;
        for k in keys_in_t(&long) {
            store.insert_if_absent_for(&k, 60 * MIN)?;
        }
        store.insert_batch(&keys_in_t(&short[5..8]))?;
        store.insert_if_absent(&keys_in_t(&short[8..])[0])?;
        store.flush()?;
        assert_eq!(store.stats().commits - before, 1, "all in one commit");
    }
    // Both tables hold runs: ids back to back, not records of their own.
    let bytes = std::fs::read(&path).expect("read");
    for prefix in [&b"short-"[..], b"long-"] {
        let at = bytes
            .windows(prefix.len())
            .position(|w| w == prefix)
            .expect("ids in the file");
        assert_eq!(&bytes[at + 8..at + 8 + prefix.len()], prefix);
    }
    let store = open()?;
    assert_eq!(store.stats().keys, 13);
    for (ids, retention) in [(&short, 10 * MIN), (&long, 60 * MIN)] {
        for k in keys_in_t(ids) {
            let rec = store.get(&k)?.expect("recovered");
            let expires = rec
                .expires_at()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            assert_eq!(expires, Duration::from_millis(T0) + retention, "{k:?}");
        }
        assert!(store.insert_batch(&keys_in_t(ids))?.iter().all(|&new| !new));
    }
    Ok(())
}
