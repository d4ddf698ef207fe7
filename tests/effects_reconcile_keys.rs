//! Key-level reconciliation: a scope that keeps its completed operations'
//! keys names exactly which keys the system of record lacks or has beyond
//! them, matches an operation that straddles a window boundary once, keeps
//! the keys through eviction, crashes and reopen, and holds memory flat
//! under churn.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::{
    Error, Fingerprint, Key, ManualClock, Result, Store, StoreBuilder, Tally, WindowKeys,
};
use dedupkv_testkit::{FaultBackend, T0, started, tempdir};

const MINUTE: Duration = Duration::from_secs(60);
const SETTLE: Duration = Duration::from_secs(5);

/// The kit's builder with minute windows and kept keys for `shipments`.
fn builder(clock: &ManualClock) -> StoreBuilder {
    dedupkv_testkit::builder(clock)
        .bucket_granularity(Duration::from_secs(1))
        .reconcile_window(MINUTE)
        .reconcile_keys_of("shipments")
}

/// Ships `id`: begin + complete; returns its provider key.
fn ship(store: &Store, id: &str) -> Result<String> {
    let c = started(store.begin(&Key::new("shipments", id), Fingerprint::NONE)?);
    let pk = c.provider_key()?;
    store.complete(&c, b"label")?;
    Ok(pk)
}

/// The start of minute `m` after `T0`.
fn minute(m: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(T0) + MINUTE * m as u32
}

fn keys(list: &[&str]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = list.iter().map(|k| k.as_bytes().to_vec()).collect();
    v.sort();
    v
}

#[test]
fn a_straddling_completion_is_matched_once_across_the_boundary() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    // The carrier accepts five orders in its minute 0, two of them just
    // before its boundary; the store completes those just after it.
    for id in ["o1", "o2", "o3"] {
        ship(&store, id)?;
        clock.advance(Duration::from_secs(10));
    }
    clock.set(T0 + 61_000);
    ship(&store, "o4")?;
    clock.set(T0 + 63_000);
    ship(&store, "o5")?;
    // One more, accepted in minute 1 by both clocks, and one completed
    // long after the boundary it is billed before (not a straddle).
    clock.set(T0 + 90_000);
    ship(&store, "o6")?;
    ship(&store, "o7")?;
    let invoice = [
        WindowKeys::ids(minute(0), ["o1", "o2", "o3", "o4", "o5", "o7"]),
        WindowKeys::ids(minute(1), ["o6"]),
    ];
    // Counts alone: never clean, one window's extra the next one's missing.
    let counts = store.reconcile(
        "shipments",
        &[Tally::new(minute(0), 6, 0), Tally::new(minute(1), 1, 0)],
    )?;
    let d: Vec<_> = counts
        .windows
        .iter()
        .map(|w| (w.missing, w.extra))
        .collect();
    assert_eq!(d, vec![(0, 3), (3, 0)]);
    // Keys: the straddlers matched once, in the carrier's window.
    let report = store.reconcile_keys("shipments", &invoice, SETTLE)?;
    let w0 = &report.windows[0];
    assert_eq!(w0.window_start, minute(0));
    assert_eq!(w0.straddled, keys(&["o4", "o5"]));
    assert_eq!(w0.matched, 5);
    assert_eq!(
        w0.extra,
        keys(&["o7"]),
        "30 s past the boundary: beyond the margin"
    );
    assert!(w0.missing.is_empty() && w0.unsettled.is_empty(), "{w0:?}");
    let w1 = &report.windows[1];
    assert_eq!((w1.matched, w1.missing.clone()), (1, keys(&["o7"])));
    assert!(w1.extra.is_empty() && w1.straddled.is_empty(), "{w1:?}");
    assert_eq!(report.windows.len(), 2);
    // Without a margin every straddler is one window's extra and the
    // next one's missing, as the counts said.
    let strict = store.reconcile_keys("shipments", &invoice, Duration::ZERO)?;
    assert_eq!(strict.windows[0].extra, keys(&["o4", "o5", "o7"]));
    assert_eq!(strict.windows[1].missing, keys(&["o4", "o5", "o7"]));
    Ok(())
}

#[test]
fn missing_and_extra_keys_are_named_exactly() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0 + 20_000);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let mut pks = Vec::new();
    for i in 0..10 {
        pks.push(ship(&store, &format!("a{i}"))?);
    }
    clock.advance(MINUTE);
    for i in 0..5 {
        pks.push(ship(&store, &format!("b{i}"))?);
    }
    // Another scope's keys are kept apart, and a scope that keeps none
    // is refused.
    let c = started(store.begin(&Key::new("refunds", "r1"), Fingerprint::NONE)?);
    store.complete(&c, b"ok")?;
    // The carrier lost a3 and b1, shipped a5 twice and lists x9 we never sent.
    let first: Vec<String> = (0..10)
        .filter(|i| *i != 3)
        .map(|i| format!("a{i}"))
        .chain(["a5".into(), "x9".into()])
        .collect();
    let second = ["b0", "b2", "b3", "b4"];
    let report = store.reconcile_keys(
        "shipments",
        &[
            WindowKeys::ids(minute(0), &first),
            WindowKeys::ids(minute(1), second),
        ],
        SETTLE,
    )?;
    assert!(!report.is_clean());
    let w: Vec<_> = report
        .windows
        .iter()
        .map(|w| (w.matched, w.missing.clone(), w.extra.clone()))
        .collect();
    assert_eq!(
        w,
        vec![
            (9, keys(&["a3"]), keys(&["a5", "x9"])),
            (4, keys(&["b1"]), vec![]),
        ]
    );
    assert_eq!(report.differences().count(), 2);
    // The same by provider key, which the carrier stores as the
    // Idempotency-Key (either case).
    let theirs: Vec<String> = pks
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3)
        .map(|(_, k)| k.to_uppercase())
        .collect();
    let by_pk = store.reconcile_keys(
        "shipments",
        &[
            WindowKeys::provider_keys(minute(0), &theirs[..9]),
            WindowKeys::provider_keys(minute(1), &theirs[9..]),
        ],
        SETTLE,
    )?;
    assert_eq!(by_pk.windows[0].missing, vec![pks[3].clone().into_bytes()]);
    assert!(by_pk.windows[1].is_clean(), "{:?}", by_pk.windows[1]);
    // One window alone: the keys completed within the margin of its far
    // edge are unsettled, not missing (the next window may list them).
    clock.set(T0 + 2 * 60_000 - 1_000);
    ship(&store, "c0")?;
    let alone = store.reconcile_keys("shipments", &[WindowKeys::ids(minute(1), second)], SETTLE)?;
    assert_eq!(alone.windows[0].missing, keys(&["b1"]));
    assert_eq!(alone.windows[0].unsettled, keys(&["c0"]));
    // What is refused, naming what is wrong.
    let refused = |r: Result<dedupkv::KeyReconciliation>, what: &str| match r {
        Err(Error::InvalidArgument { what: w, .. }) => assert_eq!(w, what),
        other => panic!("{what}: {other:?}"),
    };
    refused(store.reconcile_keys("refunds", &[], SETTLE), "scope");
    refused(
        store.reconcile_keys(
            "shipments",
            &[WindowKeys::ids(minute(0) + SETTLE, ["a"])],
            SETTLE,
        ),
        "window_keys",
    );
    refused(
        store.reconcile_keys(
            "shipments",
            &[
                WindowKeys::ids(minute(0), ["a"]),
                WindowKeys::provider_keys(minute(1), ["b"]),
            ],
            SETTLE,
        ),
        "window_keys",
    );
    refused(store.reconcile_keys("shipments", &[], MINUTE * 2), "settle");
    Ok(())
}

#[test]
fn kept_keys_survive_eviction_a_crash_and_a_reopen() -> Result<()> {
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    // Operations are kept 30 s, their windows' keys a day.
    let open = |b: FaultBackend| {
        builder(&clock)
            .retention(Duration::from_secs(30))
            .reconcile_retention(Duration::from_secs(86_400))
            .open_with_backend(b)
    };
    let store = open(backend.clone())?;
    let mut all = Vec::new();
    for m in 0..4u64 {
        clock.set(T0 + m * 60_000 + 1_000);
        for i in 0..20 {
            let id = format!("m{m}-{i}");
            ship(&store, &id)?;
            all.push((m, id));
            clock.advance(Duration::from_secs(2));
        }
        store.evict_expired()?;
    }
    let invoice: Vec<WindowKeys> = (0..4u64)
        .map(|m| {
            WindowKeys::ids(
                minute(m),
                all.iter().filter(|(w, _)| *w == m).map(|(_, id)| id),
            )
        })
        .collect();
    let check = |store: &Store, what: &str| -> Result<()> {
        let report = store.reconcile_keys("shipments", &invoice, SETTLE)?;
        assert!(report.is_clean(), "{what}: {report:?}");
        assert_eq!(
            report.windows.iter().map(|w| w.matched).sum::<u64>(),
            80,
            "{what}"
        );
        Ok(())
    };
    assert!(
        store.get(&Key::new("shipments", "m0-0"))?.is_none(),
        "the records left"
    );
    check(&store, "after eviction")?;
    drop(store);
    let store = open(backend.crash_image())?;
    check(&store, "after a crash")?;
    drop(store);
    // Closed for hours: the open writes the keys of the expired tables.
    clock.advance(Duration::from_secs(6 * 3600));
    let store = open(backend.healthy())?;
    check(&store, "reopened hours later")?;
    drop(store);
    clock.advance(Duration::from_secs(3600));
    check(&open(backend.healthy())?, "and once more")?;
    clock.advance(Duration::from_secs(86_400));
    let store = open(backend.healthy())?;
    assert_eq!(store.stats().reconcile_keys, 0, "a day after their windows");
    Ok(())
}

#[test]
fn memory_stays_flat_under_churn() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .retention(Duration::from_secs(120))
        .reconcile_retention(Duration::from_secs(600))
        .open(dir.path().join("s.redb"))?;
    let (mut held, mut bytes) = (Vec::new(), Vec::new());
    for m in 0..90u64 {
        for i in 0..20 {
            clock.set(T0 + m * 60_000 + i * 2_000);
            ship(&store, &format!("m{m}-{i}"))?;
        }
        store.evict_expired()?;
        let s = store.stats();
        held.push(s.reconcile_keys);
        bytes.push(s.reconcile_bytes);
    }
    // Retention (10 min) after the window's end, and the window being
    // filled: at most 12 windows of 20 keys.
    assert!(held.iter().all(|k| *k <= 12 * 20), "{held:?}");
    assert_eq!(
        held[20..].iter().min(),
        held[20..].iter().max(),
        "flat: {held:?}"
    );
    assert!(bytes[89] <= bytes[30] * 2, "{bytes:?}");
    Ok(())
}
