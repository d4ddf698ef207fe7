//! The store's time never goes back: a clock stepped back (or reading 1970
//! on a machine without a real-time clock) forgets nothing, before and
//! after a reopen; a clock that jumps far forward expires what it should;
//! a clock at `u64::MAX` breaks nothing; with `ClockBehind::Advance` a
//! time floor inherited from a clock that ran ahead no longer holds every
//! lease, and the store's time never runs faster than real time.

use std::time::Duration;

use dedupkv::{Begin, Clock, ClockBehind, Fingerprint, Key, ManualClock, Result, Store};
use dedupkv_testkit::{T0, tempdir};

const MIN: u64 = 60_000;

fn builder(clock: &ManualClock) -> dedupkv::StoreBuilder {
    dedupkv_testkit::builder(clock)
        .lease(Duration::from_secs(30))
        .retention(Duration::from_secs(3_600))
}

fn completed(store: &Store, key: &Key<'_>) -> Result<bool> {
    Ok(matches!(
        store.begin(key, Fingerprint::NONE)?,
        Begin::Completed(_)
    ))
}

#[test]
fn a_clock_stepped_back_to_1970_forgets_nothing_before_or_after_reopen() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let seen = Key::new("t", "seen");
    let done = Key::new("t", "done");
    let held = Key::new("t", "held");
    {
        let store = builder(&clock).open(&path)?;
        assert!(store.insert_if_absent(&seen)?);
        let Begin::Started(c) = store.begin(&done, Fingerprint::NONE)? else {
            panic!("new")
        };
        store.complete(&c, b"ok")?;
        let Begin::Started(h) = store.begin(&held, Fingerprint::NONE)? else {
            panic!("new")
        };
        for back in [1, 30 * MIN, T0 / 2, T0] {
            clock.set(T0 - back);
            assert!(!store.insert_if_absent(&seen)?, "clock {back} ms back");
            assert!(completed(&store, &done)?, "clock {back} ms back");
            assert!(
                matches!(store.begin(&held, Fingerprint::NONE)?, Begin::InProgress(_)),
                "a lease does not lapse while the clock is behind"
            );
        }
        assert!(store.stats().clock_behind > 0);
        store.complete(&h, b"")?;
    }
    // Reopened with the clock still at 1970.
    clock.set(0);
    let store = builder(&clock).open(&path)?;
    assert!(!store.insert_if_absent(&seen)?);
    assert!(completed(&store, &done)?);
    assert!(completed(&store, &held)?);
    // Once the clock is right again, time goes on from there as usual.
    clock.set(T0 + 61 * MIN);
    store.evict_expired()?;
    assert!(store.insert_if_absent(&seen)?, "expired after its hour");
    Ok(())
}

#[test]
fn a_forward_jump_of_2_pow_24_buckets_without_eviction_expires_every_key() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let seen = Key::new("t", "seen");
    let done = Key::new("t", "done");
    assert!(store.insert_if_absent(&seen)?);
    let Begin::Started(c) = store.begin(&done, Fingerprint::NONE)? else {
        panic!("new")
    };
    store.complete(&c, b"ok")?;
    // The same low 24 bucket bits as now, 2^24 minutes later; and a few
    // jumps around it.
    for jump in [1u64 << 24, (1 << 24) + 1, 1 << 23, 1 << 22, (1 << 21) + 3] {
        let dir = tempdir();
        let c2 = ManualClock::new(T0);
        let s2 = builder(&c2).open(dir.path().join("s.redb"))?;
        assert!(s2.insert_if_absent(&seen)?);
        c2.set(T0 + jump * MIN);
        assert!(
            s2.insert_if_absent(&seen)?,
            "jump of {jump} buckets: expired"
        );
        assert!(!s2.insert_if_absent(&seen)?);
    }
    clock.set(T0 + (1 << 24) * MIN);
    assert!(store.insert_if_absent(&seen)?);
    assert!(matches!(
        store.begin(&done, Fingerprint::NONE)?,
        Begin::Started(_)
    ));
    // Nothing expired is left behind for eviction to miss.
    store.evict_expired()?;
    assert_eq!(store.stats().keys, 2, "only the two new records");
    Ok(())
}

#[test]
fn a_clock_at_u64_max_never_gives_two_started() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(u64::MAX);
    let key = Key::new("t", "op");
    {
        let store = builder(&clock).open(&path)?;
        let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else {
            panic!("new")
        };
        assert!(matches!(
            store.begin(&key, Fingerprint::NONE)?,
            Begin::InProgress(_)
        ));
        assert!(store.insert_if_absent(&Key::new("t", "evt"))?);
        assert!(!store.insert_if_absent(&Key::new("t", "evt"))?);
        store.complete(&c, b"once")?;
        assert!(completed(&store, &key)?);
    }
    let store = builder(&clock).open(&path)?;
    assert!(completed(&store, &key)?);
    assert!(!store.insert_if_absent(&Key::new("t", "evt"))?);
    Ok(())
}

#[test]
fn the_store_time_survives_a_reopen_after_every_record_expired() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    {
        let store = builder(&clock).open(&path)?;
        assert!(store.insert_if_absent(&Key::new("t", "e"))?);
        clock.set(T0 + 3 * 60 * MIN);
        assert!(store.insert_if_absent(&Key::new("t", "later"))?);
        clock.set(T0 + 6 * 60 * MIN);
        let ev = store.evict_expired()?;
        assert_eq!(ev.keys, 2, "every record expired and left the file");
        // One more write at the latest time, then nothing is left of it
        // but the persisted floor.
        assert!(store.insert_if_absent(&Key::new("t", "last"))?);
        clock.set(T0 + 8 * 60 * MIN);
        store.evict_expired()?;
        assert_eq!(store.stats().keys, 0);
    }
    // The clock is ten days behind at the reopen.
    clock.set(T0 - 10 * 24 * 60 * MIN);
    let store = builder(&clock).open(&path)?;
    let key = Key::new("t", "op");
    let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("new")
    };
    assert!(
        store.stats().clock_behind > 0,
        "the clock reads behind the store's time"
    );
    clock.advance(Duration::from_secs(31));
    assert!(
        matches!(store.begin(&key, Fingerprint::NONE)?, Begin::InProgress(_)),
        "the store's time stands still while the clock is behind: the lease holds"
    );
    store.complete(&c, b"")?;
    Ok(())
}

const YEAR: u64 = 365 * 24 * 60 * MIN;

fn in_progress(store: &Store, key: &Key<'_>) -> Result<bool> {
    Ok(matches!(
        store.begin(key, Fingerprint::NONE)?,
        Begin::InProgress(_)
    ))
}

/// An owner whose clock ran a year ahead left its time in the file (as a
/// replica's owner leaves it to the next): by default every later owner's
/// store stands still for that year (a lease begun now never lapses, no key
/// expires); with `Advance` leases lapse and keys expire after the time
/// that really passes, also after a further reopen.
#[test]
fn a_time_floor_a_year_ahead_holds_leases_unless_the_time_advances() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let hung = Key::new("t", "hung");
    let seen = Key::new("t", "seen");
    {
        let ahead = ManualClock::new(T0 + YEAR);
        let store = builder(&ahead).open(&path)?;
        assert!(store.insert_if_absent(&seen)?);
    }
    // A claim whose worker hangs in this process: never completed nor
    // released. (A claim of an earlier run is taken over at once anyway.)
    let begin_hung = |store: &Store| -> Result<()> {
        let Begin::Started(c) = store.begin(&hung, Fingerprint::NONE)? else {
            panic!("new")
        };
        std::mem::forget(c);
        Ok(())
    };
    {
        let clock = ManualClock::new(T0);
        let store = builder(&clock).open(&path)?;
        begin_hung(&store)?;
        clock.advance(Duration::from_secs(61 * 60));
        assert!(
            in_progress(&store, &hung)?,
            "by default the inherited floor holds the lease"
        );
        store.evict_expired()?;
        assert!(!store.insert_if_absent(&seen)?, "and expires nothing");
    }
    let clock = ManualClock::new(T0);
    let advance = |c: &ManualClock| builder(c).clock_behind(ClockBehind::Advance);
    {
        let store = advance(&clock).open(&path)?;
        let hung = Key::new("t", "hung again");
        let Begin::Started(c) = store.begin(&hung, Fingerprint::NONE)? else {
            panic!("new")
        };
        std::mem::forget(c);
        clock.advance(Duration::from_secs(29));
        assert!(
            in_progress(&store, &hung)?,
            "never sooner than the lease's length in real time"
        );
        clock.advance(Duration::from_secs(2));
        let Begin::Started(c) = store.begin(&hung, Fingerprint::NONE)? else {
            panic!("the lease lapsed after 31 s of real time: taken over")
        };
        store.complete(&c, b"ok")?;
        assert!(!store.insert_if_absent(&seen)?, "kept within its hour");
        assert!(store.stats().clock_behind > 0);
    }
    // Reopened later: the time runs on from the floor, not from the open.
    let store = advance(&clock).open(&path)?;
    clock.advance(Duration::from_secs(58 * 60));
    store.evict_expired()?;
    assert!(
        !store.insert_if_absent(&seen)?,
        "kept: 31 s before the reopen and 58 min since are less than its hour"
    );
    clock.advance(Duration::from_secs(3 * 60));
    store.evict_expired()?;
    assert!(
        store.insert_if_absent(&seen)?,
        "expired after its hour of real time"
    );
    Ok(())
}

/// A step of the clock is not time passing: stepped back, a lease lapses
/// after its length of `advance`, not sooner; stepped forward to the right
/// time again, the time already run on is not counted twice.
#[test]
fn advance_counts_time_that_passes_never_a_step_and_never_twice() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock)
        .clock_behind(ClockBehind::Advance)
        .open(dir.path().join("s.redb"))?;
    let key = Key::new("t", "op");
    let Begin::Started(_c) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("new")
    };
    clock.set(T0 - 60 * MIN);
    assert!(in_progress(&store, &key)?, "a step back moves nothing");
    clock.advance(Duration::from_secs(20));
    assert!(in_progress(&store, &key)?, "20 s of a 30 s lease");
    // The clock is right again: the store's time is T0 + 20 s, not 40 s.
    clock.set(T0 + 20_000);
    assert!(
        in_progress(&store, &key)?,
        "20 s of a 30 s lease, counted once"
    );
    let later = Key::new("t", "later");
    let Begin::Started(_l) = store.begin(&later, Fingerprint::NONE)? else {
        panic!("new")
    };
    clock.advance(Duration::from_secs(11));
    assert!(
        matches!(store.begin(&key, Fingerprint::NONE)?, Begin::Started(_)),
        "lapsed after 31 s"
    );
    // Stepped back again: time runs on while the clock is behind.
    clock.set(T0 - 60 * MIN);
    clock.advance(Duration::from_secs(18));
    assert!(in_progress(&store, &later)?, "29 s of its 30 s lease");
    clock.advance(Duration::from_secs(2));
    assert!(
        matches!(store.begin(&later, Fingerprint::NONE)?, Begin::Started(_)),
        "lapsed after 31 s although the clock reads an hour behind"
    );
    Ok(())
}

/// A clock stepped back to 1970 while its monotonic clock reads `u64::MAX`
/// throughout: only the monotonic clock's differences count, so no time
/// passes, nothing expires and nothing panics, also after a reopen.
#[test]
fn advance_with_a_monotonic_clock_stuck_at_u64_max_passes_no_time() -> Result<()> {
    #[derive(Debug, Clone)]
    struct Stuck(ManualClock);
    impl Clock for Stuck {
        fn now_millis(&self) -> u64 {
            self.0.now_millis()
        }
        fn elapsed_millis(&self) -> u64 {
            u64::MAX
        }
    }
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let open = |c: &ManualClock| {
        builder(c)
            .clock(Stuck(c.clone()))
            .clock_behind(ClockBehind::Advance)
            .open(&path)
    };
    let key = Key::new("t", "k");
    {
        let store = open(&clock)?;
        assert!(store.insert_if_absent(&key)?);
        clock.set(0);
        assert!(!store.insert_if_absent(&key)?, "no time passed: kept");
        assert!(store.insert_if_absent(&Key::new("t", "late"))?);
    }
    let store = open(&clock)?;
    assert!(!store.insert_if_absent(&Key::new("t", "late"))?);
    Ok(())
}
