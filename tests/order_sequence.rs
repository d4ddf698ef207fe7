//! Ordering: the version gate, dedup + version in one step, the sequencer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use dedupkv::{
    Advance, Durability, Error, Key, ManualClock, Result, Sequenced, Store, StoreBuilder, Update,
};
use dedupkv_testkit::{FaultBackend, Plan, T0, tempdir};
use proptest::prelude::*;

const MIN: Duration = Duration::from_secs(60);

fn builder(clock: &ManualClock) -> StoreBuilder {
    dedupkv_testkit::builder(clock)
        .retention(60 * MIN)
        .entity_retention(24 * 60 * MIN)
        .max_hold(5 * MIN)
        .handback_lease(MIN)
}

/// One delivery of an update event: (event id, entity, version, value).
type Delivery = (u32, u8, u64, u32);

fn history() -> impl Strategy<Value = (Vec<Delivery>, HashMap<u8, u32>)> {
    // 1-4 entities, each with 1-12 versioned updates; each update delivered
    // 1-3 times; the whole stream shuffled.
    proptest::collection::vec(1usize..12, 1..4)
        .prop_flat_map(|lens| {
            let mut updates = Vec::new();
            let mut event = 0u32;
            for (entity, n) in lens.iter().enumerate() {
                for v in 1..=*n as u64 {
                    updates.push((event, entity as u8, v * 10, event * 7 + 1));
                    event += 1;
                }
            }
            let copies = proptest::collection::vec(1usize..=3, updates.len());
            (Just(updates), copies)
        })
        .prop_flat_map(|(updates, copies)| {
            let mut stream = Vec::new();
            let mut last: HashMap<u8, (u64, u32)> = HashMap::new();
            for (u, c) in updates.iter().zip(copies) {
                for _ in 0..c {
                    stream.push(*u);
                }
                let e = last.entry(u.1).or_insert((0, 0));
                if u.2 > e.0 {
                    *e = (u.2, u.3);
                }
            }
            let expected = last.into_iter().map(|(k, (_, val))| (k, val)).collect();
            (Just(stream).prop_shuffle(), Just(expected))
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Applying only what the engine calls `Applied` gives the in-order
    /// result, and no stale update is ever applied.
    #[test]
    fn shuffled_duplicated_updates_converge_to_the_in_order_state((stream, expected) in history()) {
        let clock = ManualClock::new(T0);
        let store = builder(&clock).open_with_backend(FaultBackend::new()).unwrap();
        let mut state: HashMap<u8, (u64, u32)> = HashMap::new();
        let mut seen_events = HashSet::new();
        for (event, entity, version, value) in stream {
            let ev = format!("evt-{event}");
            let en = format!("entity-{entity}");
            let answer = store.apply_event(&Key::new("t", &ev), &Key::new("t", &en), version).unwrap();
            let first_time = seen_events.insert(event);
            let cur = state.get(&entity).map(|s| s.0);
            match answer {
                Update::Applied { previous } => {
                    prop_assert!(first_time);
                    prop_assert_eq!(previous, cur);
                    prop_assert!(cur.is_none_or(|c| version > c), "stale update applied");
                    state.insert(entity, (version, value));
                }
                Update::Stale { current } => {
                    prop_assert!(first_time);
                    prop_assert_eq!(Some(current), cur);
                    prop_assert!(version < current);
                }
                Update::SameVersion => prop_assert!(first_time && cur == Some(version)),
                Update::DuplicateEvent => prop_assert!(!first_time),
                other => prop_assert!(false, "unexpected {:?}", other),
            }
            clock.advance(Duration::from_millis(10)); // delays between deliveries
        }
        let got: HashMap<u8, u32> = state.into_iter().map(|(k, (_, v))| (k, v)).collect();
        prop_assert_eq!(got, expected);
    }

    /// Random permutations of 1..=N with duplicates come out as exactly
    /// 1..=N, across a crash and reopen in the middle.
    #[test]
    fn the_sequencer_delivers_exactly_in_order_across_a_crash(
        order in (2u64..40).prop_flat_map(|n| Just((1..=n).collect::<Vec<u64>>()).prop_shuffle()),
        dups in proptest::collection::vec(0usize..40, 0..10),
        crash_at in 0usize..40,
    ) {
        let clock = ManualClock::new(T0);
        let n = order.len() as u64;
        let mut stream = order.clone();
        for d in dups {
            let at = d % stream.len();
            stream.insert(at, order[d % order.len()]);
        }
        let backend = FaultBackend::new();
        let mut store = builder(&clock).open_with_backend(backend.clone()).unwrap();
        let mut crashed = Vec::new();
        let acct = Key::new("bank", "acct");
        let mut delivered = Vec::new();
        for (i, seq) in stream.iter().enumerate() {
            if i == crash_at {
                // A power cut: reopen from the synced bytes only; the old
                // store is abandoned, not closed.
                let image = backend.crash_image();
                crashed.push(std::mem::replace(
                    &mut store,
                    builder(&clock).open_with_backend(image).unwrap(),
                ));
            }
            let payload = format!("p{seq}");
            match store.sequence(&acct, *seq, payload.as_bytes()).unwrap() {
                Sequenced::Delivered(evs) => {
                    let last = evs.last().map(|e| e.seq);
                    for e in evs {
                        prop_assert_eq!(e.payload, format!("p{}", e.seq).into_bytes());
                        delivered.push(e.seq);
                    }
                    // Handled: acknowledged before the upstream is.
                    store.ack(&acct, last.unwrap()).unwrap();
                }
                Sequenced::Parked | Sequenced::Duplicate => {}
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }
        prop_assert_eq!(delivered, (1..=n).collect::<Vec<_>>());
        prop_assert_eq!(store.stats().parked_now, 0);
        prop_assert_eq!(store.stats().unacked_now, 0);
    }
}

#[test]
fn the_version_gate_rejects_stale_versions_and_survives_reopen() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let path = dir.path().join("s.redb");
    let order = Key::new("shop", "order-1");
    {
        let store = builder(&clock).open(&path)?;
        assert_eq!(
            store.advance(&order, 1_700_000_000_000_001)?,
            Advance::Applied { previous: None }
        );
        assert_eq!(
            store.advance(&order, 1_700_000_000_000_900)?,
            Advance::Applied {
                previous: Some(1_700_000_000_000_001)
            }
        );
    }
    let store = builder(&clock).open(&path)?;
    assert_eq!(
        store.advance(&order, 1_700_000_000_000_500)?,
        Advance::Stale {
            current: 1_700_000_000_000_900
        }
    );
    assert_eq!(
        store.advance(&order, 1_700_000_000_000_900)?,
        Advance::Duplicate
    );
    // An entity and an event key with the same scope and id are different things.
    assert!(store.insert_if_absent(&order)?);
    assert_eq!(store.stats().versions_stale, 1);
    Ok(())
}

#[test]
fn an_expired_entity_accepts_its_next_version_as_first() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let e = Key::new("t", "e");
    store.advance(&e, 100)?;
    clock.advance(25 * 60 * MIN); // past the entity retention (24 h)
    assert_eq!(store.advance(&e, 3)?, Advance::Applied { previous: None });
    store.evict_expired()?;
    assert_eq!(store.advance(&e, 2)?, Advance::Stale { current: 3 });
    Ok(())
}

#[test]
fn a_gap_past_max_hold_lands_in_the_holding_area_with_its_reason() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let acct = Key::new("bank", "acct-9");
    {
        let store = builder(&clock).open(&path)?;
        assert_eq!(
            store.sequence(&acct, 1, b"one")?,
            Sequenced::Delivered(vec![dedupkv::Delivered {
                seq: 1,
                payload: b"one".to_vec()
            }])
        );
        assert_eq!(store.sequence(&acct, 3, b"three")?, Sequenced::Parked);
        assert_eq!(store.sequence(&acct, 4, b"four")?, Sequenced::Parked);
        clock.advance(6 * MIN);
        assert_eq!(store.sweep_parked()?, 2);
        let held = store.held(&acct)?;
        assert_eq!(held.iter().map(|h| h.seq).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(held[0].missing, 2);
        assert!(
            held[0]
                .reason
                .starts_with("predecessor 2 missing since 2023-11-14T22:14"),
            "{}",
            held[0].reason
        );
        assert_eq!(store.stats().held_now, 2);
    }
    // Held events survive a reopen and a day of evictions (carried forward).
    let store = builder(&clock).open(&path)?;
    for _ in 0..30 {
        clock.advance(60 * MIN);
        store.evict_expired()?;
    }
    drop(store);
    let store = builder(&clock).open(&path)?;
    assert_eq!(store.held(&acct)?.len(), 2);
    // The predecessor finally arrives: everything flows, in order.
    let Sequenced::Delivered(out) = store.sequence(&acct, 2, b"two")? else {
        panic!("expected delivery")
    };
    assert_eq!(out.iter().map(|d| d.seq).collect::<Vec<_>>(), [2, 3, 4]);
    assert!(store.held(&acct)?.is_empty());
    // Handed back, not acknowledged: once the lease lapsed, a redelivery
    // hands back 3 and 4 again.
    assert!(matches!(
        store.sequence(&acct, 3, b"three")?,
        Sequenced::Handling(_)
    ));
    clock.advance(MIN);
    assert_eq!(seqs(&store.sequence(&acct, 3, b"three")?), [3, 4]);
    assert_eq!(store.ack(&acct, 4)?, 4); // 1 was never acknowledged either
    assert_eq!(store.sequence(&acct, 3, b"three")?, Sequenced::Duplicate);
    Ok(())
}

#[test]
fn release_held_gives_up_on_the_missing_predecessor() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let acct = Key::new("bank", "acct-2");
    store.sequence(&acct, 5, b"five")?;
    store.sequence(&acct, 6, b"six")?;
    store.sequence(&acct, 9, b"nine")?;
    clock.advance(6 * MIN);
    // `sequence` moves overdue events itself, before handling the new one.
    assert_eq!(store.sequence(&acct, 8, b"eight")?, Sequenced::Parked);
    assert_eq!(store.held(&acct)?.len(), 3);
    let out = store.release_held(&acct)?;
    // Held 5, 6, 9 and parked 8, in order; 1-4 and 7 never came.
    assert_eq!(out.iter().map(|d| d.seq).collect::<Vec<_>>(), [5, 6, 8, 9]);
    assert_eq!(store.stats().parked_now + store.stats().held_now, 0);
    assert_eq!(store.stats().unacked_now, 4);
    assert_eq!(store.ack(&acct, 9)?, 4);
    assert_eq!(
        store.sequence(&acct, 10, b"ten")?,
        Sequenced::Delivered(vec![dedupkv::Delivered {
            seq: 10,
            payload: b"ten".to_vec()
        }])
    );
    assert_eq!(store.sequence(&acct, 8, b"eight")?, Sequenced::Duplicate);
    Ok(())
}

#[test]
fn racing_versions_of_one_entity_linearize() -> Result<()> {
    let dir = tempdir();
    let store = Store::open(dir.path().join("s.redb"))?;
    let e = Key::new("t", "hot");
    let answers: Vec<(u64, Advance)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8u64)
            .map(|t| {
                let (store, e) = (&store, &e);
                s.spawn(move || {
                    (0..50u64)
                        .map(|i| {
                            let v = (i * 8 + t) * 7 % 400 + 1; // versions interleave across threads
                            (v, store.advance(e, v).expect("advance"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("thread"))
            .collect()
    });
    let max = answers.iter().map(|(v, _)| *v).max().expect("answers");
    // The applied versions form one chain from None, each link increasing.
    let mut links: BTreeMap<Option<u64>, u64> = BTreeMap::new();
    for (v, a) in &answers {
        match a {
            Advance::Applied { previous } => {
                assert!(previous.is_none_or(|p| p < *v));
                assert!(
                    links.insert(*previous, *v).is_none(),
                    "two updates applied over {previous:?}"
                );
            }
            Advance::Stale { current } => assert!(current > v),
            Advance::Duplicate => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let mut cur = None;
    let mut steps = 0;
    while let Some(next) = links.get(&cur) {
        cur = Some(*next);
        steps += 1;
    }
    assert_eq!(
        steps,
        links.len(),
        "the applied versions do not form one chain"
    );
    assert_eq!(cur, Some(max));
    assert_eq!(store.advance(&e, max)?, Advance::Duplicate);
    Ok(())
}

/// A version or sequence number the store cannot represent is refused at
/// the call: `u64::MAX` read back as `u64::MAX - 1` after a reopen (the
/// Entity record stores version + 1), so it was applied twice; a sequence
/// number `u64::MAX` wrapped the sequencer; 0 was answered `Duplicate` and
/// silently dropped.
#[test]
fn versions_and_sequence_numbers_outside_the_range_are_refused() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let (e, ev) = (Key::new("t", "e"), Key::new("t", "evt"));
    let refused = |r: Result<_>, what: &str| {
        assert!(
            matches!(&r, Err(Error::InvalidArgument { what: w, .. }) if *w == what),
            "{r:?}"
        );
    };
    {
        let store = builder(&clock).open(&path)?;
        refused(store.advance(&e, u64::MAX).map(drop), "version");
        refused(store.apply_event(&ev, &e, u64::MAX).map(drop), "version");
        refused(store.sequence(&e, u64::MAX, b"top").map(drop), "seq");
        refused(store.sequence(&e, 0, b"zero").map(drop), "seq");
        // The refused event key was not recorded either.
        assert!(store.insert_if_absent(&ev)?);
        assert_eq!(
            store.advance(&e, u64::MAX - 1)?,
            Advance::Applied { previous: None }
        );
        assert_eq!(
            store.sequence(&e, u64::MAX - 1, b"last")?,
            Sequenced::Parked
        );
    }
    let store = builder(&clock).open(&path)?;
    assert_eq!(store.advance(&e, u64::MAX - 1)?, Advance::Duplicate);
    assert_eq!(
        store.sequence(&e, u64::MAX - 1, b"last")?,
        Sequenced::Duplicate
    );
    assert_eq!(store.stats().parked_now, 1);
    Ok(())
}

/// Parks 2 on entity `parked`; parks 3 on entity `held` and moves it to
/// the holding area.
fn park_and_hold(store: &Store, clock: &ManualClock) -> Result<()> {
    let (parked, held) = (Key::new("bank", "parked"), Key::new("bank", "held"));
    assert_eq!(store.sequence(&parked, 2, b"two")?, Sequenced::Parked);
    assert_eq!(store.sequence(&held, 3, b"three")?, Sequenced::Parked);
    clock.advance(6 * MIN);
    assert_eq!(store.sweep_parked()?, 2);
    assert_eq!(store.stats().held_now, 2);
    Ok(())
}

/// What [`park_and_hold`] left is all there, and the predecessors deliver it.
fn check_parked_and_held(store: &Store) -> Result<()> {
    let (parked, held) = (Key::new("bank", "parked"), Key::new("bank", "held"));
    let st = store.stats();
    assert_eq!(st.parked_now + st.held_now, 2, "{st:?}");
    assert_eq!(store.held(&held)?.len(), 1);
    let seqs = |s: Sequenced| match s {
        Sequenced::Delivered(v) => v.iter().map(|d| d.seq).collect::<Vec<_>>(),
        other => panic!("expected a delivery, got {other:?}"),
    };
    assert_eq!(seqs(store.sequence(&parked, 1, b"one")?), [1, 2]);
    assert_eq!(seqs(store.sequence(&held, 1, b"one")?), [1]);
    assert_eq!(seqs(store.sequence(&held, 2, b"two")?), [2, 3]);
    Ok(())
}

/// The docs promise parked and held events are "never dropped": a store
/// closed longer than `entity_retention` lost them at reopen (recovery
/// skipped the expired tables and the first commit deleted them).
#[test]
fn parked_and_held_events_survive_any_downtime() -> Result<()> {
    for downtime in [25 * 60 * MIN, 21 * 24 * 60 * MIN] {
        let dir = tempdir();
        let path = dir.path().join("s.redb");
        let clock = ManualClock::new(T0);
        park_and_hold(&builder(&clock).open(&path)?, &clock)?;
        clock.advance(downtime);
        // Twice: the records carried forward at the first reopen expire
        // in the second downtime.
        drop(builder(&clock).open(&path)?);
        clock.advance(downtime);
        let store = builder(&clock).open(&path)?;
        check_parked_and_held(&store)?;
    }
    Ok(())
}

/// The records carried out of the tables that expired during the downtime
/// are durable before those tables are deleted: a power cut right after
/// the reopen keeps the events.
#[test]
fn parked_events_carried_at_open_survive_a_crash_right_after() -> Result<()> {
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    park_and_hold(&builder(&clock).open_with_backend(backend.clone())?, &clock)?;
    clock.advance(21 * 24 * 60 * MIN);
    let store = builder(&clock).open_with_backend(backend.clone())?;
    let image = backend.crash_image();
    std::mem::forget(store); // a power cut: the store is abandoned, not closed
    let store = builder(&clock).open_with_backend(image)?;
    check_parked_and_held(&store)
}

/// Recovery applies the entity records of expired tables, so a crash
/// part-way through an eviction must not leave a Park record behind
/// without the later record that consumed it: the event came back parked
/// after it had been delivered. Eviction deletes its victims a bucket at a
/// time, oldest first.
#[test]
fn a_crash_part_way_through_eviction_brings_back_no_delivered_event() -> Result<()> {
    let acct = Key::new("bank", "acct");
    let mut mid_way = 0;
    // Sweep the failure over the eviction's writes and syncs.
    for fail_after in 0..40 {
        let clock = ManualClock::new(T0);
        let backend = FaultBackend::new();
        let open = |b| {
            builder(&clock)
                .durability(Durability::Deferred {
                    max_delay: 60 * MIN,
                })
                .evict_slice_bytes(200)
                .open_with_backend(b)
        };
        let store = open(backend.clone())?;
        // Bucket A: a small row with the parked 2 (below a slice: it goes
        // with its table's deletion).
        assert_eq!(store.sequence(&acct, 2, b"two")?, Sequenced::Parked);
        store.flush()?;
        // Bucket B: one large row (a slice of its own) with the delivery
        // that consumed 2.
        clock.advance(2 * MIN);
        assert!(matches!(
            store.sequence(&acct, 1, b"one")?,
            Sequenced::Delivered(v) if v.len() == 2
        ));
        assert_eq!(store.ack(&acct, 2)?, 2);
        for i in 0..20 {
            store.advance(&Key::new("t", &format!("other-{i:02}")), 1)?;
        }
        store.flush()?;
        clock.advance(25 * 60 * MIN);
        let before = store.stats().commits;
        backend.arm(Plan::after(fail_after));
        if store.evict_expired().is_err() && store.stats().commits > before {
            mid_way += 1;
        }
        drop(store);
        let store = open(backend.healthy())?;
        let st = store.stats();
        assert_eq!(
            (st.parked_now, st.held_now, st.unacked_now),
            (0, 0, 0),
            "fail after {fail_after}: a delivered event came back"
        );
    }
    assert!(mid_way > 0, "no failure fell between two eviction commits");
    Ok(())
}

fn seqs(answer: &Sequenced) -> Vec<u64> {
    match answer {
        Sequenced::Delivered(v) => v.iter().map(|d| d.seq).collect(),
        other => panic!("expected a delivery, got {other:?}"),
    }
}

/// What `sequence` hands back stays the store's until `ack`: a redelivery
/// of an unacknowledged event whose lease lapsed hands back it (with the
/// payload it carries now) and everything unacknowledged after it, and
/// `unacked` lists them. It used to answer `Duplicate`: a consumer that
/// crashed before handling the successors lost them.
#[test]
fn delivered_events_are_handed_back_again_until_acked() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let acct = Key::new("bank", "acct");
    {
        let store = builder(&clock).open(&path)?;
        assert_eq!(store.sequence(&acct, 2, b"two")?, Sequenced::Parked);
        assert_eq!(store.sequence(&acct, 3, b"three")?, Sequenced::Parked);
        assert_eq!(seqs(&store.sequence(&acct, 1, b"one")?), [1, 2, 3]);
        assert_eq!(store.stats().unacked_now, 3);
        clock.advance(MIN); // the hand-back's lease lapses
        let again = store.sequence(&acct, 1, b"one, again")?;
        assert_eq!(seqs(&again), [1, 2, 3]);
        let Sequenced::Delivered(again) = again else {
            unreachable!()
        };
        assert_eq!(again[0].payload, b"one, again");
        assert_eq!(again[1].payload, b"two");
        clock.advance(MIN);
        assert_eq!(seqs(&store.sequence(&acct, 2, b"two")?), [2, 3]);
        assert_eq!(store.ack(&acct, 1)?, 1);
        assert_eq!(store.sequence(&acct, 1, b"one")?, Sequenced::Duplicate);
        assert_eq!(store.ack(&acct, 1)?, 0);
    }
    // Across a reopen: 2 and 3 are still unacknowledged, and handed back
    // at once (their handler is gone).
    let store = builder(&clock).open(&path)?;
    let unacked = store.unacked(&acct)?;
    assert_eq!(unacked.iter().map(|d| d.seq).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(unacked[1].payload, b"three");
    assert_eq!(seqs(&store.sequence(&acct, 3, b"three")?), [3]);
    // An ack beyond what was delivered acknowledges what was delivered.
    assert_eq!(store.ack(&acct, 10)?, 2);
    assert_eq!(store.sequence(&acct, 3, b"three")?, Sequenced::Duplicate);
    assert!(store.unacked(&acct)?.is_empty());
    assert_eq!(seqs(&store.sequence(&acct, 4, b"four")?), [4]);
    assert_eq!(store.stats().unacked_now, 1);
    drop(store);
    let store = builder(&clock).open(&path)?;
    assert_eq!(store.stats().unacked_now, 1);
    assert_eq!(store.sequence(&acct, 2, b"two")?, Sequenced::Duplicate);
    Ok(())
}

/// Events `release_held` hands back are unacknowledged too, and
/// unacknowledged events outlive eviction and downtime like parked ones.
#[test]
fn unacked_events_survive_eviction_and_downtime() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let acct = Key::new("bank", "acct");
    {
        let store = builder(&clock).open(&path)?;
        assert_eq!(store.sequence(&acct, 5, b"five")?, Sequenced::Parked);
        assert_eq!(seqs(&store.sequence(&acct, 1, b"one")?), [1]);
        clock.advance(6 * MIN);
        store.sweep_parked()?;
        let out = store.release_held(&acct)?;
        assert_eq!(out.iter().map(|d| d.seq).collect::<Vec<_>>(), [5]);
        assert_eq!(store.stats().unacked_now, 2);
        for _ in 0..30 {
            clock.advance(60 * MIN);
            store.evict_expired()?;
        }
    }
    clock.advance(21 * 24 * 60 * MIN);
    drop(builder(&clock).open(&path)?);
    clock.advance(21 * 24 * 60 * MIN);
    let store = builder(&clock).open(&path)?;
    let unacked = store.unacked(&acct)?;
    assert_eq!(unacked.iter().map(|d| d.seq).collect::<Vec<_>>(), [1, 5]);
    assert_eq!(unacked[1].payload, b"five");
    assert_eq!(seqs(&store.sequence(&acct, 5, b"five")?), [5]);
    assert_eq!(store.ack(&acct, 5)?, 2);
    assert_eq!(store.stats().unacked_now, 0);
    Ok(())
}

const SIGKILL_CHILD: &str = "DEDUPKV_SEQ_CHILD_PATH";

/// The child of `delivered_events_survive_a_sigkill_until_acked`: parks 2,
/// sequences 1, checks that a redelivery meanwhile is told they are being
/// handled, says so, and waits to be killed before handling them.
fn sigkill_child(path: &str) -> ! {
    let store = Store::builder()
        .handback_lease(Duration::from_secs(3_600))
        .open(path)
        .expect("open");
    let acct = Key::new("bank", "acct");
    assert_eq!(
        store.sequence(&acct, 2, b"two").expect("park"),
        Sequenced::Parked
    );
    let out = store.sequence(&acct, 1, b"one").expect("sequence");
    assert_eq!(seqs(&out), [1, 2]);
    let again = store.sequence(&acct, 1, b"one").expect("redelivery");
    assert!(matches!(again, Sequenced::Handling(_)), "{again:?}");
    println!("HANDED BACK");
    loop {
        std::thread::park();
    }
}

/// A consumer killed (`SIGKILL`) between the hand-back and handling the
/// events: after the restart they are still there, handed back at once
/// (though the killed process held them for an hour), and only `ack`
/// retires them.
#[test]
fn delivered_events_survive_a_sigkill_until_acked() -> Result<()> {
    use std::io::{BufRead, BufReader};
    if let Ok(path) = std::env::var(SIGKILL_CHILD) {
        sigkill_child(&path);
    }
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "delivered_events_survive_a_sigkill_until_acked",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SIGKILL_CHILD, &path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let handed_back = BufReader::new(stdout)
        .lines()
        .map_while(std::result::Result::ok)
        // libtest may print "test … " in front of it.
        .any(|l| l.ends_with("HANDED BACK"));
    child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
    let status = child.wait().expect("wait");
    assert!(handed_back, "the child died before the hand-back: {status}");
    assert!(!status.success());

    let acct = Key::new("bank", "acct");
    {
        let store = Store::open(&path)?;
        let unacked = store.unacked(&acct)?;
        assert_eq!(unacked.iter().map(|d| d.seq).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(unacked[1].payload, b"two");
        assert!(unacked.iter().all(|u| u.handling.is_none()));
        assert_eq!(seqs(&store.sequence(&acct, 1, b"one")?), [1, 2]);
        assert_eq!(store.ack(&acct, 2)?, 2);
        assert_eq!(store.sequence(&acct, 1, b"one")?, Sequenced::Duplicate);
    }
    let store = Store::open(&path)?;
    assert_eq!(store.sequence(&acct, 1, b"one")?, Sequenced::Duplicate);
    assert!(store.unacked(&acct)?.is_empty());
    Ok(())
}

/// An entity whose state expired starts again at 1; what its earlier
/// incarnation left in the log (its acknowledged events) must not come
/// back at a reopen as parked events of the new one.
#[test]
fn a_new_incarnation_of_an_expired_entity_gets_no_ghost_events_at_reopen() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(1_700_000_040_000);
    let min = Duration::from_secs(60);
    let open = || {
        Store::builder()
            .clock(clock.clone())
            .retention(60 * min)
            .entity_retention(60 * min)
            .max_hold(5 * min)
            .background_eviction(false)
            .open(&path)
    };
    let acct = Key::new("bank", "acct-1");
    {
        let store = open()?;
        // The first incarnation: 2..=13 parked, then 1 delivers them all.
        for seq in 2..=13u64 {
            assert_eq!(
                store.sequence(&acct, seq, format!("old{seq}").as_bytes())?,
                Sequenced::Parked
            );
        }
        let Sequenced::Delivered(v) = store.sequence(&acct, 1, b"old1")? else {
            panic!("1 delivers the parked events")
        };
        assert_eq!(v.len(), 13);
        assert_eq!(store.ack(&acct, 13)?, 13);
        // Its state expires (no eviction ran), and a new incarnation
        // delivers 1..=10.
        clock.advance(3 * 60 * min);
        for seq in 1..=10u64 {
            let Sequenced::Delivered(v) =
                store.sequence(&acct, seq, format!("new{seq}").as_bytes())?
            else {
                panic!("new {seq} is next")
            };
            assert_eq!(v.len(), 1);
            store.ack(&acct, seq)?;
        }
    }
    let store = open()?;
    assert_eq!(
        store.stats().parked_now,
        0,
        "no ghost of the old incarnation"
    );
    assert_eq!(store.stats().unacked_now, 0);
    let Sequenced::Delivered(v) = store.sequence(&acct, 11, b"new11")? else {
        panic!("new 11 is next")
    };
    assert_eq!(
        v.iter()
            .map(|d| (d.seq, d.payload.clone()))
            .collect::<Vec<_>>(),
        [(11, b"new11".to_vec())],
        "only the new event, with its own payload"
    );
    Ok(())
}
