//! The conformance cases of [`Order`]'s versions: an entity's version
//! only moves forward, a stale or repeated one is told so, the whole
//! range of versions is ordered, an event is handled once, and racers on
//! one entity leave it at the greatest version.

use dedupkv::contract::{Order, Read};
use dedupkv::{Advance, Key, State, Update};

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
