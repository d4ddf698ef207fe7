//! Races between the operations that rewrite a key — `forget`, `requeue`,
//! `begin`'s replay read — and the listings, each driven by live threads on
//! one or two keys (bounded by count, not time). Each test asserts a
//! guarantee that a single caller cannot break:
//!
//! - `forget` never frees a claim a live attempt holds: at most one
//!   `Started` is unfinished at a time;
//! - `Begin::Completed` only ever carries a completed or permanently failed
//!   record;
//! - the listings return, and list what they name.
//!
//! Several records of one key can share a log row (one group commit), so
//! each of these once decided on a slot and then read a row that had
//! meanwhile received the key's next record.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use dedupkv::{
    Begin, Clock, Durability, Error, Failure, Fingerprint, Forget, Key, Listing, ManualClock,
    Result, State, Store,
};
use dedupkv_testkit::T0;

/// A store whose commits gather for 20 ms (`Deferred`), so that many
/// records of one key share a row — the moment each race needs — while
/// reads still wait for the rows they read to be durable.
fn store() -> Result<(tempfile::TempDir, Arc<Store>)> {
    store_with(Durability::Deferred {
        max_delay: Duration::from_millis(20),
    })
}

fn store_with(durability: Durability) -> Result<(tempfile::TempDir, Arc<Store>)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::builder()
        .clock(ManualClock::new(T0))
        .background_eviction(false)
        .durability(durability)
        .open(dir.path().join("s.redb"))?;
    Ok((dir, Arc::new(store)))
}

fn fp() -> Fingerprint {
    Fingerprint::of("request")
}

/// Takes one from the count when dropped, so a racer that panics still
/// lets those that wait for the count go on.
struct Leaving<'a>(&'a AtomicUsize);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// Runs `threads` copies of `f` (each given its index) to the end.
fn race(threads: usize, f: impl Fn(usize) -> Result<()> + Send + Sync + 'static) -> Result<()> {
    let f = Arc::new(f);
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let f = Arc::clone(&f);
            thread::spawn(move || f(i))
        })
        .collect();
    for h in handles {
        h.join().expect("racer panicked")?;
    }
    Ok(())
}

#[test]
fn forget_never_frees_a_claim_a_live_attempt_holds() -> Result<()> {
    let (_dir, store) = store()?;
    let key = Key::new("races", "k");
    // Unfinished `Started` claims: a holder leaves the count just before it
    // finishes (its claim still live in the store until then).
    let holders = Arc::new(AtomicUsize::new(0));
    let forgotten = Arc::new(AtomicUsize::new(0));
    // Beginners still running: the forgetters forget until it is 0.
    let beginners = Arc::new(AtomicUsize::new(3));
    let (s, h, f, b) = (
        Arc::clone(&store),
        Arc::clone(&holders),
        Arc::clone(&forgotten),
        Arc::clone(&beginners),
    );
    race(5, move |i| {
        if i < 2 {
            while b.load(Ordering::Acquire) > 0 {
                if let Forget::Forgotten(_) = s.forget(&key)? {
                    f.fetch_add(1, Ordering::Relaxed);
                }
            }
            return Ok(());
        }
        let _leaving = Leaving(&b);
        for n in 0..2_000 {
            if let Begin::Started(c) = s.begin(&key, fp())? {
                let before = h.fetch_add(1, Ordering::SeqCst);
                assert_eq!(
                    before,
                    0,
                    "a second Started while another attempt is live (attempt {}, interrupted {})",
                    c.attempt(),
                    c.interrupted()
                );
                // The work: long enough for a forget to decide meanwhile.
                for _ in 0..20 {
                    thread::yield_now();
                }
                h.fetch_sub(1, Ordering::SeqCst);
                let finished = if n % 5 == 0 {
                    s.complete(&c, b"done")
                } else {
                    s.fail(&c, Failure::Retryable)
                };
                // Nobody else finished or took over this live claim.
                if let Err(e @ Error::ClaimLost { .. }) = &finished {
                    panic!("a forget freed a live claim: {e}");
                }
                finished?;
            }
        }
        Ok(())
    })?;
    // Released and completed keys are forgotten (those are most states).
    assert!(
        forgotten.load(Ordering::Relaxed) > 0,
        "the race must forget something"
    );
    Ok(())
}

#[test]
fn begin_answers_completed_only_with_a_finished_record() -> Result<()> {
    let (_dir, store) = store()?;
    let completed = Arc::new(AtomicUsize::new(0));
    let (s, done) = (Arc::clone(&store), Arc::clone(&completed));
    race(6, move |i| {
        for n in 0..1_500 {
            let id = format!("k{}", n % 2);
            let key = Key::new("races", &id);
            if i < 2 {
                // The operator: requeue whatever is dead-lettered.
                s.requeue(&key)?;
                continue;
            }
            match s.begin(&key, fp())? {
                Begin::Started(c) => match n % 4 {
                    0 => s.complete(&c, b"done")?,
                    1 => s.fail(&c, Failure::Permanent(b"no"))?,
                    _ => s.fail(
                        &c,
                        Failure::Exhausted {
                            reason: "gave up",
                            payload: None,
                        },
                    )?,
                },
                Begin::Completed(rec) => {
                    assert!(
                        matches!(
                            rec.state(),
                            State::Completed | State::Failed | State::Inserted
                        ),
                        "Completed with a {:?} record: {rec:?}",
                        rec.state()
                    );
                    done.fetch_add(1, Ordering::Relaxed);
                    // Start the key over, so the race goes on.
                    s.forget(&key)?;
                }
                Begin::InProgress(_) | Begin::DeadLettered(_) => {}
            }
        }
        Ok(())
    })?;
    assert!(
        completed.load(Ordering::Relaxed) > 0,
        "the race must replay something"
    );
    Ok(())
}

#[test]
fn listings_return_while_their_keys_are_rewritten() -> Result<()> {
    // Immediate: a commit at every few calls, so the open row moves on
    // while a listing goes from shard to shard.
    let (_dir, store) = store_with(Durability::Immediate)?;
    // Writers still running: the listers list until it is 0.
    let writers = Arc::new(AtomicUsize::new(4));
    let listed = Arc::new(AtomicUsize::new(0));
    let (s, w, l) = (
        Arc::clone(&store),
        Arc::clone(&writers),
        Arc::clone(&listed),
    );
    race(6, move |i| {
        if i >= 4 {
            // Listers: each entry listed must be what the listing names.
            while w.load(Ordering::Acquire) > 0 {
                for d in s.dead_letters(&Listing::new())?.items {
                    assert_eq!(d.record().state(), State::DeadLettered, "{d:?}");
                    l.fetch_add(1, Ordering::Relaxed);
                }
                for r in s.stranded_claims(&Listing::new())?.items {
                    assert_eq!(r.state(), State::InProgress, "{r:?}");
                }
            }
            return Ok(());
        }
        let _leaving = Leaving(&w);
        for n in 0..1_500 {
            let id = format!("k{}", n % 2);
            let key = Key::new("races", &id);
            if i == 0 {
                s.requeue(&key)?;
                continue;
            }
            if let Begin::Started(c) = s.begin(&key, fp())? {
                s.fail(
                    &c,
                    Failure::Exhausted {
                        reason: "gave up",
                        payload: None,
                    },
                )?;
            }
        }
        Ok(())
    })?;
    assert!(
        listed.load(Ordering::Relaxed) > 0,
        "the listers must see dead letters"
    );
    Ok(())
}

/// A clock that, once armed, runs a hook on another thread at its
/// `nth` reading and waits for it: a write slipped in at an exact point
/// of a call. Clones share the hook.
#[derive(Clone, Default)]
struct HookedClock(Arc<Hook>);

#[derive(Default)]
struct Hook {
    /// Readings left before the hook runs (0: disarmed).
    left: AtomicUsize,
    run: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for HookedClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookedClock")
    }
}

impl HookedClock {
    fn arm(&self, nth: usize, hook: impl FnOnce() + Send + 'static) {
        *self.0.run.lock().expect("hook") = Some(Box::new(hook));
        self.0.left.store(nth, Ordering::SeqCst);
    }
}

impl Clock for HookedClock {
    fn now_millis(&self) -> u64 {
        let fire = self
            .0
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok_and(|n| n == 1);
        if fire && let Some(hook) = self.0.run.lock().expect("hook").take() {
            // On its own thread: the hook's writes read this clock too.
            thread::spawn(hook).join().expect("hook panicked");
        }
        T0
    }
}

/// A listing reads the store's time twice before it visits the shards (for
/// the age filter): at the second reading, the key's dead letter is
/// requeued, committed, and dead-lettered again into a newer row. The
/// listing must widen that slot's row against a row read under the shard's
/// lock: against one read before, it waited for a row that never exists.
#[test]
fn a_listing_never_waits_for_a_row_it_computed_before_a_commit() -> Result<()> {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = HookedClock::default();
    let store = Arc::new(
        Store::builder()
            .clock(clock.clone())
            .background_eviction(false)
            .open(dir.path().join("s.redb"))?,
    );
    let key = Key::new("races", "k");
    let exhaust = |s: &Store| -> Result<()> {
        let Begin::Started(c) = s.begin(&key, fp())? else {
            panic!("the key is free");
        };
        s.fail(
            &c,
            Failure::Exhausted {
                reason: "gave up",
                payload: None,
            },
        )
    };
    exhaust(&store)?;
    let (s, ran) = (Arc::clone(&store), Arc::new(AtomicUsize::new(0)));
    let r = Arc::clone(&ran);
    clock.arm(2, move || {
        let key = Key::new("races", "k");
        assert!(s.requeue(&key).expect("requeue"));
        s.flush().expect("flush");
        let Begin::Started(c) = s.begin(&key, fp()).expect("begin") else {
            panic!("requeued");
        };
        s.fail(
            &c,
            Failure::Exhausted {
                reason: "again",
                payload: None,
            },
        )
        .expect("fail");
        r.fetch_add(1, Ordering::SeqCst);
    });
    let page = store.dead_letters(&Listing::new())?;
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the hook ran inside the listing"
    );
    let reasons: Vec<&str> = page.items.iter().map(dedupkv::DeadLetter::reason).collect();
    assert_eq!(reasons, ["again"], "the dead letter as it is now");
    Ok(())
}
