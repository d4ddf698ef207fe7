//! Reconciliation: durable per-window counts of completed operations, and
//! their comparison with the system of record's. The counts live in the
//! completions' own records and in the window totals eviction writes
//! before those records leave: exact after a crash, after eviction (early
//! too) and after weeks closed.

use std::time::{Duration, UNIX_EPOCH};

use dedupkv::{
    Begin, Error, Failure, Fingerprint, Key, ManualClock, Resolution, Result, Store, Tally,
};
use dedupkv_testkit::{FaultBackend, T0_HOUR as T0, builder, started, tempdir};

const HOUR: Duration = Duration::from_secs(3600);

fn ship(store: &Store, id: &str, amount: i64) -> Result<()> {
    let c = started(store.begin(&Key::new("shipments", id), Fingerprint::NONE)?);
    store.complete_with_amount(&c, b"label", amount)
}

#[test]
fn completions_are_counted_per_window_with_their_amounts() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    for i in 0..3 {
        ship(&store, &format!("a{i}"), 100)?;
    }
    // Not completions: a retry, a permanent failure, a dead letter.
    let c = started(store.begin(&Key::new("shipments", "f1"), Fingerprint::NONE)?);
    store.fail(&c, Failure::Retryable)?;
    let c = started(store.begin(&Key::new("shipments", "f2"), Fingerprint::NONE)?);
    store.fail(&c, Failure::Permanent(b"no"))?;
    let c = started(store.begin(&Key::new("shipments", "f3"), Fingerprint::NONE)?);
    store.fail(
        &c,
        Failure::Exhausted {
            reason: "x",
            payload: None,
        },
    )?;
    clock.advance(HOUR);
    ship(&store, "b0", -40)?;
    let c = started(store.begin(&Key::new("shipments", "b1"), Fingerprint::NONE)?);
    for r in store.complete_batch(&[(&c, b"label")])? {
        r?;
    }
    assert!(store.resolve(
        &Key::new("shipments", "f3"),
        Resolution::Completed(b"by hand")
    )?);
    // Another scope keeps its own counts.
    let c = started(store.begin(&Key::new("refunds", "r0"), Fingerprint::NONE)?);
    store.complete(&c, b"ok")?;
    let t = store.tallies("shipments")?;
    let got: Vec<_> = t
        .iter()
        .map(|t| (t.window_start, t.window, t.count, t.amount))
        .collect();
    let w0 = UNIX_EPOCH + Duration::from_millis(T0);
    assert_eq!(got, vec![(w0, HOUR, 3, 300), (w0 + HOUR, HOUR, 3, -40)]);
    assert_eq!(store.tallies("refunds")?.len(), 1);
    assert!(store.tallies("").is_err(), "an empty scope is refused");
    Ok(())
}

#[test]
fn reconciliation_finds_a_missing_and_a_duplicate_operation() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    for i in 0..10 {
        ship(&store, &format!("a{i}"), 5)?;
    }
    clock.advance(HOUR);
    for i in 0..5 {
        ship(&store, &format!("b{i}"), 5)?;
    }
    let w0 = UNIX_EPOCH + Duration::from_millis(T0);
    let clean = store.reconcile(
        "shipments",
        &[Tally::new(w0, 10, 50), Tally::new(w0 + HOUR, 5, 25)],
    )?;
    assert!(clean.is_clean(), "{clean:?}");
    // The carrier lost one label in the first hour and printed one twice
    // in the second; and reports a third hour we never saw.
    let report = store.reconcile(
        "shipments",
        &[
            Tally::new(w0, 9, 45),
            Tally::new(w0 + HOUR, 3, 15),
            Tally::new(w0 + HOUR, 3, 15), // two invoice lines add up
            Tally::new(w0 + 2 * HOUR, 1, 5),
        ],
    )?;
    assert!(!report.is_clean());
    let d: Vec<_> = report
        .windows
        .iter()
        .map(|w| (w.window_start, w.missing, w.extra, w.is_clean()))
        .collect();
    assert_eq!(
        d,
        vec![
            (w0, 1, 0, false),
            (w0 + HOUR, 0, 1, false),
            (w0 + 2 * HOUR, 0, 1, false)
        ]
    );
    assert_eq!(report.differences().count(), 3);
    Ok(())
}

#[test]
fn counts_survive_a_crash_and_a_reopen() -> Result<()> {
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    {
        let store = builder(&clock).open_with_backend(backend.clone())?;
        for i in 0..20 {
            ship(&store, &format!("k{i}"), 1)?;
        }
        // The power goes out here: only what is durable is in the image.
        let image = backend.crash_image();
        let store = builder(&clock).open_with_backend(image)?;
        let t = store.tallies("shipments")?;
        assert_eq!(
            (t[0].count, t[0].amount),
            (20, 20),
            "every acknowledged completion"
        );
        drop(store);
    }
    let store = builder(&clock).open_with_backend(backend.healthy())?;
    assert_eq!(store.tallies("shipments")?[0].count, 20);
    Ok(())
}

#[test]
fn a_windows_counts_expire_with_the_reconcile_retention() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let open = |c: &ManualClock| {
        builder(c)
            .reconcile_retention(Duration::from_secs(2 * 86_400))
            .open(&path)
    };
    {
        let store = open(&clock)?;
        ship(&store, "a", 1)?;
        clock.advance(Duration::from_secs(86_400));
        store.evict_expired()?;
        assert_eq!(store.tallies("shipments")?.len(), 1, "kept a day later");
        clock.advance(Duration::from_secs(2 * 86_400));
        store.evict_expired()?;
        assert!(
            store.tallies("shipments")?.is_empty(),
            "gone after its retention"
        );
        ship(&store, "b", 1)?;
    }
    clock.advance(Duration::from_secs(5 * 86_400));
    let store = open(&clock)?;
    assert!(
        store.tallies("shipments")?.is_empty(),
        "expired while closed"
    );
    let bad = builder(&clock)
        .reconcile_window(Duration::from_secs(3 * 86_400))
        .reconcile_retention(Duration::from_secs(86_400))
        .open(dir.path().join("other.redb"));
    assert!(matches!(bad, Err(dedupkv::Error::InvalidConfig(_))));
    Ok(())
}

#[test]
fn an_answer_other_than_started_counts_nothing() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    ship(&store, "a", 7)?;
    assert!(matches!(
        store.begin(&Key::new("shipments", "a"), Fingerprint::NONE)?,
        Begin::Completed(_)
    ));
    assert_eq!(
        store.tallies("shipments")?[0].count,
        1,
        "a replay is no completion"
    );
    Ok(())
}

/// The scope's windows as (start offset from `T0` in minutes, count, amount).
fn windows(store: &Store) -> Result<Vec<(u64, u64, i128)>> {
    Ok(store
        .tallies("shipments")?
        .iter()
        .map(|t| {
            let ms = t
                .window_start
                .duration_since(UNIX_EPOCH)
                .expect("after the epoch")
                .as_millis() as u64;
            ((ms - T0) / 60_000, t.count, t.amount)
        })
        .collect())
}

#[test]
fn counts_outlive_the_records_they_come_from() -> Result<()> {
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    // Operations are kept a minute; their window's counts a week.
    let open = |b: FaultBackend| {
        builder(&clock)
            .retention(Duration::from_secs(60))
            .bucket_granularity(Duration::from_secs(1))
            .open_with_backend(b)
    };
    let store = open(backend.clone())?;
    for i in 0..5 {
        ship(&store, &format!("a{i}"), 10)?;
    }
    clock.advance(Duration::from_secs(120));
    store.evict_expired()?;
    assert!(
        store.get(&Key::new("shipments", "a0"))?.is_none(),
        "the records are gone"
    );
    assert_eq!(windows(&store)?, vec![(0, 5, 50)]);
    // The window is still open: more completions after the eviction.
    for i in 0..3 {
        ship(&store, &format!("b{i}"), 1)?;
    }
    clock.advance(Duration::from_secs(120));
    store.evict_expired()?;
    for i in 0..2 {
        ship(&store, &format!("c{i}"), 100)?;
    }
    clock.advance(HOUR);
    ship(&store, "d0", 0)?;
    let want = vec![(0, 10, 253), (60, 1, 0)];
    assert_eq!(windows(&store)?, want);
    // A power cut: only the durable part of the file survives.
    let image = backend.crash_image();
    drop(store);
    let store = open(image)?;
    assert_eq!(windows(&store)?, want, "after a crash");
    // And evicted once more, then reopened.
    clock.advance(Duration::from_secs(120));
    store.evict_expired()?;
    drop(store);
    let store = open(backend.healthy())?;
    assert_eq!(windows(&store)?, want, "after a reopen");
    Ok(())
}

#[test]
fn an_early_eviction_keeps_the_counts() -> Result<()> {
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    let open = |b: FaultBackend| {
        builder(&clock)
            .bucket_granularity(Duration::from_secs(1))
            .max_keys(10)
            .open_with_backend(b)
    };
    let store = open(backend.clone())?;
    let mut early = 0;
    for i in 0..40 {
        ship(&store, &format!("k{i}"), 2)?;
        clock.advance(Duration::from_secs(1));
        if i % 10 == 9 {
            early += store.evict_expired()?.early_buckets;
        }
    }
    assert!(early >= 20, "live buckets went early: {early}");
    assert_eq!(windows(&store)?, vec![(0, 40, 80)]);
    drop(store);
    let store = open(backend.crash_image())?;
    assert_eq!(windows(&store)?, vec![(0, 40, 80)], "after a crash");
    Ok(())
}

#[test]
fn counts_survive_weeks_closed() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let open = || builder(&clock).open(&path);
    {
        let store = open()?;
        for i in 0..4 {
            ship(&store, &format!("a{i}"), 25)?;
        }
        clock.advance(HOUR);
        ship(&store, "b0", 1)?;
    }
    // Closed for three days: every operation's record expired (a day's
    // retention), the windows' counts (a week) did not.
    clock.advance(Duration::from_secs(3 * 86_400));
    let want = vec![(0, 4, 100), (60, 1, 1)];
    {
        let store = open()?;
        assert_eq!(windows(&store)?, want);
        assert!(store.get(&Key::new("shipments", "a0"))?.is_none());
    }
    clock.advance(Duration::from_secs(2 * 86_400));
    assert_eq!(windows(&open()?)?, want, "the open carried them");
    clock.advance(Duration::from_secs(3 * 86_400));
    assert!(windows(&open()?)?.is_empty(), "a week after their end");
    Ok(())
}

#[test]
fn reconcile_refuses_a_phantom_window_and_an_overlong_scope() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .max_scope_len(16)
        .open(dir.path().join("s.redb"))?;
    ship(&store, "a", 1)?;
    let w0 = UNIX_EPOCH + Duration::from_millis(T0);
    let off = w0 + Duration::from_secs(90);
    match store.reconcile("shipments", &[Tally::new(off, 1, 1)]) {
        Err(Error::InvalidArgument { what, reason }) => {
            assert_eq!(what, "tally");
            assert!(
                reason.contains(&format!("{:?}", off.duration_since(UNIX_EPOCH).unwrap())),
                "{reason}"
            );
            assert!(reason.contains("3600000 ms"), "{reason}");
        }
        other => panic!("a tally off a boundary: {other:?}"),
    }
    let long = "s".repeat(17);
    for got in [
        store.reconcile(&long, &[]).map(|_| ()),
        store.tallies(&long).map(|_| ()),
    ] {
        match got {
            Err(Error::InvalidArgument { what, reason }) => {
                assert_eq!(what, "scope");
                assert!(
                    reason.contains("17 bytes") && reason.contains("max_scope_len (16)"),
                    "{reason}"
                );
            }
            other => panic!("an overlong scope: {other:?}"),
        }
    }
    assert!(
        store
            .reconcile("shipments", &[Tally::new(w0, 1, 1)])?
            .is_clean()
    );
    Ok(())
}
