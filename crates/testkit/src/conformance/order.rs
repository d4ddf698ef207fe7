//! The conformance cases of [`Order`]'s versions: an entity's version
//! only moves forward, a stale or repeated one is told so, the whole
//! range of versions is ordered, an event is handled once, and racers on
//! one entity leave it at the greatest version; and of its sequencer
//! ([`sequencer`]): events handed back in order, none dropped, once each.

use std::time::Duration;

use dedupkv::contract::{Order, Read};
use dedupkv::{
    Advance, Clock, Delivered, Handling, Key, ManualClock, SequenceOptions, Sequenced, State,
    Update,
};

fn entity(id: &str) -> Key<'static> {
    Key::new("order", id.as_bytes()).into_owned()
}

fn advance<B: Order>(b: &B, e: &Key<'_>, v: u64) -> Result<Advance, String> {
    let told = b
        .advance(e, v)
        .map_err(|x| format!("advance {e:?} to {v}: {x}"))?;
    b.tell(told)
        .map_err(|x| format!("advance {e:?} to {v}: {x}"))
}

/// `got` must be `want` (as the specification would answer).
fn expect<T: PartialEq + std::fmt::Debug>(what: &str, got: &T, want: &T) -> Result<(), String> {
    super::same(what, got, want)
}

/// Runs the version cases on a fresh, empty backend (`Sync`: 8 threads
/// race on one entity).
///
/// # Errors
/// The first case that does not hold, naming it and what was seen.
///
/// # Examples
/// ```
/// use dedupkv::Store;
/// use dedupkv_testkit::conformance;
/// # let dir = dedupkv_testkit::tempdir();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// conformance::versions(&store).unwrap();
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn versions<B: Order + Read + Sync>(backend: &B) -> Result<(), String> {
    let b = backend;
    let e = entity("o-1");
    expect(
        "first version",
        &advance(b, &e, 3)?,
        &Advance::Applied { previous: None },
    )?;
    expect("same version", &advance(b, &e, 3)?, &Advance::Duplicate)?;
    expect(
        "older version",
        &advance(b, &e, 2)?,
        &Advance::Stale { current: 3 },
    )?;
    expect(
        "newer version",
        &advance(b, &e, 5)?,
        &Advance::Applied { previous: Some(3) },
    )?;
    expect(
        "after a stale one",
        &advance(b, &e, 4)?,
        &Advance::Stale { current: 5 },
    )?;
    // The whole range, across the top bit: 0 and u64::MAX - 1 included.
    let wide = entity("o-wide");
    let top = u64::MAX - 1;
    expect(
        "version 0",
        &advance(b, &wide, 0)?,
        &Advance::Applied { previous: None },
    )?;
    let half = 1 << 63;
    expect(
        "2^63 - 1",
        &advance(b, &wide, half - 1)?,
        &Advance::Applied { previous: Some(0) },
    )?;
    expect(
        "2^63",
        &advance(b, &wide, half)?,
        &Advance::Applied {
            previous: Some(half - 1),
        },
    )?;
    expect(
        "the top",
        &advance(b, &wide, top)?,
        &Advance::Applied {
            previous: Some(half),
        },
    )?;
    expect(
        "below 2^63",
        &advance(b, &wide, 7)?,
        &Advance::Stale { current: top },
    )?;
    if b.advance(&wide, u64::MAX).is_ok() {
        return Err("advance to u64::MAX: refused expected".into());
    }
    // Entities are not keys.
    let told = b.get(&e).map_err(|x| x.to_string())?;
    if b.tell(told).map_err(|x| x.to_string())?.is_some() {
        return Err(format!("{e:?}: an entity's version made a key"));
    }
    events(b)?;
    race(b)
}

/// `apply_event`: the event recorded once (as an inserted key), the
/// entity advanced only by a new event.
fn events<B: Order + Read>(b: &B) -> Result<(), String> {
    let order = entity("o-7");
    let (e1, e0) = (entity("evt-1"), entity("evt-0"));
    let apply = |ev: &Key<'_>, v: u64| -> Result<Update, String> {
        let told = b
            .apply_event(ev, &order, v)
            .map_err(|x| format!("apply_event {ev:?} {v}: {x}"))?;
        b.tell(told).map_err(|x| format!("apply_event: {x}"))
    };
    expect(
        "new event, first version",
        &apply(&e1, 2)?,
        &Update::Applied { previous: None },
    )?;
    expect(
        "new event, older version",
        &apply(&e0, 1)?,
        &Update::Stale { current: 2 },
    )?;
    expect("its redelivery", &apply(&e0, 1)?, &Update::DuplicateEvent)?;
    expect(
        "a redelivery with another version",
        &apply(&e1, 9)?,
        &Update::DuplicateEvent,
    )?;
    expect(
        "new event, same version",
        &apply(&entity("evt-2"), 2)?,
        &Update::SameVersion,
    )?;
    expect(
        "new event, newer",
        &apply(&entity("evt-3"), 4)?,
        &Update::Applied { previous: Some(2) },
    )?;
    expect(
        "the entity after them",
        &advance(b, &order, 4)?,
        &Advance::Duplicate,
    )?;
    let told = b.get(&e1).map_err(|x| x.to_string())?;
    let state = b.tell(told).map_err(|x| x.to_string())?.map(|r| r.state());
    expect("the event's key", &state, &Some(State::Inserted))
}

/// 8 threads advance one entity at once, to versions 1 to 8: each
/// `Applied` replaced an older version, and the entity ends at 8.
fn race<B: Order + Sync>(b: &B) -> Result<(), String> {
    let e = entity("o-race");
    let answers: Vec<Result<Advance, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..=8u64)
            .map(|v| {
                let e = &e;
                s.spawn(move || advance(b, e, v))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a racer panicked".into())))
            .collect()
    });
    for (v, a) in (1..=8u64).zip(answers) {
        match a? {
            Advance::Applied { previous } if previous.is_none_or(|p| p < v) => {}
            Advance::Stale { current } if current > v => {}
            other => return Err(format!("racer {v}: {other:?}")),
        }
    }
    expect("after the race", &advance(b, &e, 8)?, &Advance::Duplicate)
}

/// The store settings the sequencer cases assume: the engine's defaults.
pub const HANDBACK_LEASE_MS: u64 = 30_000;
/// See [`HANDBACK_LEASE_MS`].
pub const MAX_HOLD_MS: u64 = 300_000;

fn sequence<B: Order>(
    b: &B,
    e: &Key<'_>,
    seq: u64,
    payload: &[u8],
    opts: &SequenceOptions,
) -> Result<Sequenced, String> {
    let told = b
        .sequence(e, seq, payload, opts)
        .map_err(|x| format!("sequence {e:?} {seq}: {x}"))?;
    b.tell(told)
        .map_err(|x| format!("sequence {e:?} {seq}: {x}"))
}

fn ack<B: Order>(b: &B, e: &Key<'_>, upto: u64) -> Result<usize, String> {
    let told = b
        .ack(e, upto)
        .map_err(|x| format!("ack {e:?} {upto}: {x}"))?;
    b.tell(told).map_err(|x| format!("ack {e:?} {upto}: {x}"))
}

fn release<B: Order>(b: &B, e: &Key<'_>) -> Result<Vec<Delivered>, String> {
    let told = b
        .release_held(e)
        .map_err(|x| format!("release_held {e:?}: {x}"))?;
    b.tell(told).map_err(|x| format!("release_held {e:?}: {x}"))
}

fn delivered(events: &[(u64, &[u8])]) -> Sequenced {
    Sequenced::Delivered(
        events
            .iter()
            .map(|(seq, p)| Delivered {
                seq: *seq,
                payload: p.to_vec(),
            })
            .collect(),
    )
}

fn handling(until_ms: u64) -> Sequenced {
    Sequenced::Handling(Handling::until_millis(until_ms))
}

/// Runs the sequencer cases on two instances of one fresh, empty backend
/// (`a` and `b`: two handles on one database, or the same store twice),
/// whose time is `clock` and whose sequencer settings are the engine's
/// defaults ([`HANDBACK_LEASE_MS`], [`MAX_HOLD_MS`]): early events are
/// parked until their predecessor lands, never dropped, and handed back
/// in order with it; a redelivery while the hand-back's lease is live is
/// told `Handling`, after it the events come back again; `ack` ends
/// them; a gap open longer than `max_hold` moves its events to the
/// holding area, which `release_held` empties in order; and 8 threads
/// (4 on each instance) feeding one entity's events out of order at once
/// get each event handed back exactly once, in order.
///
/// # Errors
/// The first case that does not hold, naming it and what was seen.
///
/// # Examples
/// ```
/// use dedupkv::{ManualClock, Store};
/// use dedupkv_testkit::conformance;
/// # let dir = dedupkv_testkit::tempdir();
/// let clock = ManualClock::new(1_700_000_000_000);
/// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
/// conformance::sequencer(&store, &store, &clock).unwrap();
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn sequencer<B: Order + Sync>(a: &B, b: &B, clock: &ManualClock) -> Result<(), String> {
    let none = SequenceOptions::new();
    let e = entity("s-1");
    expect(
        "3 early",
        &sequence(a, &e, 3, b"c", &none)?,
        &Sequenced::Parked,
    )?;
    expect(
        "2 early",
        &sequence(b, &e, 2, b"b", &none)?,
        &Sequenced::Parked,
    )?;
    expect(
        "2 again while parked",
        &sequence(a, &e, 2, b"b", &none)?,
        &Sequenced::Duplicate,
    )?;
    expect(
        "1 lands: 1, 2, 3 in order",
        &sequence(b, &e, 1, b"a", &none)?,
        &delivered(&[(1, b"a"), (2, b"b"), (3, b"c")]),
    )?;
    let until = clock.now_millis() + HANDBACK_LEASE_MS;
    expect(
        "2 again while handed back",
        &sequence(a, &e, 2, b"b", &none)?,
        &handling(until),
    )?;
    clock.advance(Duration::from_millis(HANDBACK_LEASE_MS));
    expect(
        "2 again after the lease: 2 and 3 again",
        &sequence(a, &e, 2, b"b2", &none)?,
        &delivered(&[(2, b"b2"), (3, b"c")]),
    )?;
    expect("ack up to 2", &ack(b, &e, 2)?, &2)?;
    expect(
        "3 again, held by the redelivery",
        &sequence(b, &e, 3, b"c", &none)?,
        &handling(clock.now_millis() + HANDBACK_LEASE_MS),
    )?;
    expect("ack past the end", &ack(a, &e, 9)?, &1)?;
    expect("ack again", &ack(a, &e, 9)?, &0)?;
    expect(
        "1 after its ack",
        &sequence(a, &e, 1, b"a", &none)?,
        &Sequenced::Duplicate,
    )?;
    let long = SequenceOptions::new().lease(Duration::from_secs(120));
    expect(
        "4 with its own lease",
        &sequence(b, &e, 4, b"d", &long)?,
        &delivered(&[(4, b"d")]),
    )?;
    expect(
        "4 again",
        &sequence(a, &e, 4, b"d", &none)?,
        &handling(clock.now_millis() + 120_000),
    )?;
    for bad in [0, u64::MAX] {
        if a.sequence(&e, bad, b"", &none).is_ok() {
            return Err(format!("sequence {bad}: refused expected"));
        }
    }
    if a.sequence(&e, 5, b"", &SequenceOptions::new().lease(Duration::ZERO))
        .is_ok()
    {
        return Err("a hand-back lease of 0: refused expected".into());
    }
    expect("nothing to release", &release(a, &e)?, &Vec::new())?;
    expect(
        "ack of an unknown entity",
        &ack(a, &entity("s-none"), 5)?,
        &0,
    )?;
    hold(a, b, clock)?;
    sequencer_race(a, b)
}

/// A gap open longer than `max_hold`: its parked events move to the
/// holding area at the entity's next call, and `release_held` hands back
/// every held and parked event in order, moving the entity past them.
fn hold<B: Order>(a: &B, b: &B, clock: &ManualClock) -> Result<(), String> {
    let none = SequenceOptions::new();
    let e = entity("s-hold");
    expect(
        "5 early",
        &sequence(a, &e, 5, b"e", &none)?,
        &Sequenced::Parked,
    )?;
    expect("no gap is overdue", &release(b, &e)?, &Vec::new())?;
    clock.advance(Duration::from_millis(MAX_HOLD_MS + 1_000));
    expect(
        "7 early",
        &sequence(b, &e, 7, b"g", &none)?,
        &Sequenced::Parked,
    )?;
    let out = release(a, &e)?;
    expect(
        "released",
        &out,
        &vec![
            Delivered {
                seq: 5,
                payload: b"e".to_vec(),
            },
            Delivered {
                seq: 7,
                payload: b"g".to_vec(),
            },
        ],
    )?;
    expect(
        "6 after the release",
        &sequence(b, &e, 6, b"f", &none)?,
        &Sequenced::Duplicate,
    )?;
    expect(
        "8 is next",
        &sequence(a, &e, 8, b"h", &none)?,
        &delivered(&[(8, b"h")]),
    )?;
    expect("ack all", &ack(b, &e, 8)?, &3)
}

/// Events of the race, per entity.
const RACE_EVENTS: u64 = 40;

/// 8 threads, 4 on each instance, feed events 1 to [`RACE_EVENTS`] of
/// two entities, each thread its share in descending order, all at once:
/// every event is handed back exactly once, each hand-back in order with
/// no gap, and none is dropped.
fn sequencer_race<B: Order + Sync>(a: &B, b: &B) -> Result<(), String> {
    let entities = [entity("s-race-1"), entity("s-race-2")];
    let answers: Vec<Result<Vec<(usize, Sequenced)>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                let (backend, entities) = (if t % 2 == 0 { a } else { b }, &entities);
                s.spawn(move || {
                    let mut out = Vec::new();
                    for seq in (1..=RACE_EVENTS).rev().filter(|s| s % 8 == t) {
                        for (i, e) in entities.iter().enumerate() {
                            let p = format!("{seq}");
                            let got =
                                sequence(backend, e, seq, p.as_bytes(), &SequenceOptions::new())?;
                            out.push((i, got));
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a racer panicked".into())))
            .collect()
    });
    let mut seen = [
        vec![0u32; 1 + RACE_EVENTS as usize],
        vec![0u32; 1 + RACE_EVENTS as usize],
    ];
    for answer in answers {
        for (i, got) in answer? {
            match got {
                Sequenced::Parked => {}
                Sequenced::Delivered(run) => {
                    for (k, d) in run.iter().enumerate() {
                        if d.seq != run[0].seq + k as u64
                            || d.payload != format!("{}", d.seq).as_bytes()
                        {
                            return Err(format!("entity {i}: a hand-back out of order: {run:?}"));
                        }
                        seen[i][usize::try_from(d.seq).unwrap_or(0)] += 1;
                    }
                }
                other => return Err(format!("entity {i}: {other:?} for an event sent once")),
            }
        }
    }
    for (i, counts) in seen.iter().enumerate() {
        if counts[1..].iter().any(|&n| n != 1) {
            return Err(format!(
                "entity {i}: events not handed back exactly once: {:?}",
                counts[1..]
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n != 1)
                    .map(|(s, n)| (s + 1, *n))
                    .collect::<Vec<_>>()
            ));
        }
    }
    for e in &entities {
        let n = u64::try_from(ack(a, e, RACE_EVENTS)?).unwrap_or(0);
        expect("acknowledged after the race", &n, &RACE_EVENTS)?;
        expect(
            "an event after its ack",
            &sequence(b, e, 1, b"1", &SequenceOptions::new())?,
            &Sequenced::Duplicate,
        )?;
    }
    Ok(())
}
