//! The sequencer's hand-back is held like a claim: while its lease is live
//! a redelivery answers `Handling`; it is handed back after the lease
//! lapses, and at once after a restart; `ack` ends it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use dedupkv::{
    Error, Key, ManualClock, Result, SequenceOptions, Sequenced, Store, StoreBuilder, Unacked,
};
use dedupkv_testkit::{FaultBackend, T0, tempdir};

const LEASE: Duration = Duration::from_secs(10);
const MS: Duration = Duration::from_millis(1);

fn builder(clock: &ManualClock) -> StoreBuilder {
    dedupkv_testkit::builder(clock)
        .handback_lease(LEASE)
        .max_hold(Duration::from_secs(300))
}

fn seqs(answer: &Sequenced) -> Vec<u64> {
    match answer {
        Sequenced::Delivered(v) => v.iter().map(|d| d.seq).collect(),
        other => panic!("expected a delivery, got {other:?}"),
    }
}

/// The lease end a `Handling` answer reports, in ms since the epoch.
fn handling_until(answer: &Sequenced) -> u64 {
    match answer {
        Sequenced::Handling(h) => {
            let d = h.lease_expires_at().duration_since(UNIX_EPOCH);
            u64::try_from(d.expect("after the epoch").as_millis()).expect("ms fit a u64")
        }
        other => panic!("expected Handling, got {other:?}"),
    }
}

/// Which listed events are under a live hand-back.
fn live(listed: &[Unacked]) -> Vec<(u64, bool)> {
    listed
        .iter()
        .map(|u| (u.seq, u.handling.is_some()))
        .collect()
}

/// Eight consumers redeliver all of one entity's events at once and
/// acknowledge right after handling: no event is handled twice, since no
/// handler crashes and no lease lapses (the clock never moves). A
/// redelivery during a live hand-back used to hand the event back again.
#[test]
fn eight_consumers_redelivering_one_entity_handle_each_event_once() -> Result<()> {
    const EVENTS: u64 = 200;
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let acct = Key::new("bank", "acct");
    let handled: Vec<AtomicU32> = (0..=EVENTS).map(|_| AtomicU32::new(0)).collect();
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (store, acct, handled) = (&store, &acct, &handled);
            s.spawn(move || {
                for seq in 1..=EVENTS {
                    let payload = format!("p{seq}");
                    let answer = store
                        .sequence(acct, seq, payload.as_bytes())
                        .expect("sequence");
                    if let Sequenced::Delivered(events) = answer {
                        for e in &events {
                            handled[usize::try_from(e.seq).expect("small")]
                                .fetch_add(1, Ordering::Relaxed);
                            std::thread::yield_now(); // handling takes a while
                        }
                        let last = events.last().expect("a delivery is never empty").seq;
                        store.ack(acct, last).expect("ack");
                    }
                }
            });
        }
    });
    let twice: Vec<(u64, u32)> = (1..=EVENTS)
        .map(|seq| {
            (
                seq,
                handled[usize::try_from(seq).expect("small")].load(Ordering::Relaxed),
            )
        })
        .filter(|(_, n)| *n != 1)
        .collect();
    assert!(twice.is_empty(), "(event, times handled): {twice:?}");
    assert!(store.unacked(&acct)?.is_empty());
    assert_eq!(store.stats().unacked_now, 0);
    Ok(())
}

/// On the manual clock: a redelivery during the lease is told `Handling`
/// with the lease's end; at the lease's end the events are handed back
/// again, held anew; `ack` ends the hand-back. A late `ack` by the first
/// handler (its lease lapsed, its events handed to another) is accepted,
/// and the second handler's `ack` then answers 0.
#[test]
fn a_hand_back_is_held_for_its_lease_and_handed_back_after_it() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let acct = Key::new("bank", "acct");
    assert_eq!(store.sequence(&acct, 2, b"two")?, Sequenced::Parked);
    // Consumer A is handed 1 and 2.
    assert_eq!(seqs(&store.sequence(&acct, 1, b"one")?), [1, 2]);
    let first_lease = T0 + 10_000;
    assert_eq!(live(&store.unacked(&acct)?), [(1, true), (2, true)]);
    clock.advance(Duration::from_millis(9_999)); // the lease's last ms
    assert_eq!(
        handling_until(&store.sequence(&acct, 1, b"one")?),
        first_lease
    );
    assert_eq!(
        handling_until(&store.sequence(&acct, 2, b"two")?),
        first_lease
    );
    // A's lease lapses: consumer B is handed them again, held for B now.
    clock.advance(MS);
    assert_eq!(live(&store.unacked(&acct)?), [(1, false), (2, false)]);
    assert_eq!(seqs(&store.sequence(&acct, 1, b"one")?), [1, 2]);
    assert_eq!(
        handling_until(&store.sequence(&acct, 2, b"two")?),
        first_lease + 10_000
    );
    // A finishes late and acknowledges: accepted (they were handled), and
    // B's hand-back ends with it.
    assert_eq!(store.ack(&acct, 2)?, 2);
    assert_eq!(store.ack(&acct, 2)?, 0, "B's own ack");
    assert_eq!(store.sequence(&acct, 1, b"one")?, Sequenced::Duplicate);
    assert!(store.unacked(&acct)?.is_empty());

    // A per-call lease, and `release_held`'s hand-back, are held too.
    let opts = SequenceOptions::new().lease(Duration::from_secs(60));
    assert_eq!(seqs(&store.sequence_with(&acct, 3, b"three", &opts)?), [3]);
    let now = T0 + 10_000;
    assert_eq!(
        handling_until(&store.sequence(&acct, 3, b"three")?),
        now + 60_000
    );
    assert_eq!(store.ack(&acct, 3)?, 1);
    assert_eq!(store.sequence(&acct, 6, b"six")?, Sequenced::Parked);
    clock.advance(Duration::from_secs(301));
    assert_eq!(store.sweep_parked()?, 1);
    assert_eq!(store.release_held(&acct)?.len(), 1);
    let now = now + 301_000;
    assert_eq!(
        handling_until(&store.sequence(&acct, 6, b"six")?),
        now + 10_000
    );
    clock.advance(LEASE);
    assert_eq!(seqs(&store.sequence(&acct, 6, b"six")?), [6]);
    assert_eq!(store.ack(&acct, 6)?, 1);

    // A lease of 0 is refused, per call and per store.
    let zero = SequenceOptions::new().lease(Duration::ZERO);
    let r = store.sequence_with(&acct, 7, b"seven", &zero);
    assert!(
        matches!(r, Err(Error::InvalidArgument { what: "lease", .. })),
        "{r:?}"
    );
    let r = builder(&clock)
        .handback_lease(Duration::ZERO)
        .open(dir.path().join("zero.redb"));
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    Ok(())
}

/// A redelivery after a lapse hands back the lapsed events after it, but
/// stops at the first one another consumer's live hand-back holds.
#[test]
fn a_redelivery_after_a_lapse_stops_at_an_event_another_consumer_holds() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let acct = Key::new("bank", "acct");
    assert_eq!(seqs(&store.sequence(&acct, 1, b"one")?), [1]); // A, until T0 + 10 s
    clock.advance(Duration::from_secs(5));
    assert_eq!(seqs(&store.sequence(&acct, 2, b"two")?), [2]); // C, until T0 + 15 s
    clock.advance(Duration::from_secs(6)); // A's lease lapsed, C's is live
    assert_eq!(live(&store.unacked(&acct)?), [(1, false), (2, true)]);
    assert_eq!(seqs(&store.sequence(&acct, 1, b"one")?), [1]);
    assert_eq!(
        handling_until(&store.sequence(&acct, 2, b"two")?),
        T0 + 15_000
    );
    Ok(())
}

/// Hand-back leases live in memory: after a restart (a clean reopen or a
/// power cut) the process that held them is gone, so every
/// unacknowledged event is handed back at once, though the clock says the
/// lease is live.
#[test]
fn a_restart_hands_back_at_once_what_was_being_handled() -> Result<()> {
    let acct = Key::new("bank", "acct");
    let clock = ManualClock::new(T0);
    let hand_back = |store: &Store| -> Result<()> {
        assert_eq!(store.sequence(&acct, 2, b"two")?, Sequenced::Parked);
        assert_eq!(seqs(&store.sequence(&acct, 1, b"one")?), [1, 2]);
        assert!(matches!(
            store.sequence(&acct, 1, b"one")?,
            Sequenced::Handling(_)
        ));
        Ok(())
    };
    let after_restart = |store: &Store| -> Result<()> {
        assert_eq!(live(&store.unacked(&acct)?), [(1, false), (2, false)]);
        assert_eq!(seqs(&store.sequence(&acct, 1, b"one")?), [1, 2]);
        assert!(matches!(
            store.sequence(&acct, 2, b"two")?,
            Sequenced::Handling(_)
        ));
        assert_eq!(store.ack(&acct, 2)?, 2);
        Ok(())
    };
    // A clean reopen.
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    hand_back(&builder(&clock).open(&path)?)?;
    after_restart(&builder(&clock).open(&path)?)?;
    // A power cut: the store is abandoned, not closed.
    let backend = FaultBackend::new();
    let store = builder(&clock).open_with_backend(backend.clone())?;
    hand_back(&store)?;
    let image = backend.crash_image();
    std::mem::forget(store);
    after_restart(&builder(&clock).open_with_backend(image)?)?;
    Ok(())
}
