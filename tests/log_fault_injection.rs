//! Storage faults through the `PageBackend` a store may be opened on: a backend that fails
//! writes or syncs after N operations. No caller of a failed batch is
//! acknowledged, the store is poisoned, and after reopening every
//! acknowledged record is present.

use std::collections::BTreeMap;
use std::sync::Mutex;

use std::collections::BTreeSet;

use dedupkv::{
    Begin, BeginOptions, Error, Failure, Fingerprint, Intent, Key, Listing, ManualClock,
    Resolution, Result, State, Store, StoreBuilder,
};
use dedupkv_testkit::{FaultBackend, Plan, is_fault};

const THREADS: usize = 4;
const OPS: usize = 40;

/// Runs a mixed workload until the injected fault stops it (a failure must
/// be the injected I/O error or the poison that follows it); returns the
/// acknowledged plain keys and claimed-and-completed keys.
fn workload(store: &Store) -> (Vec<String>, Vec<String>) {
    let acked_insert = Mutex::new(Vec::new());
    let acked_done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (acked_insert, acked_done) = (&acked_insert, &acked_done);
            s.spawn(move || {
                for i in 0..OPS {
                    let id = format!("t{t}-{i}");
                    let key = Key::new("f", &id);
                    let ok = if i % 2 == 0 {
                        match store.insert_if_absent(&key) {
                            Ok(new) => {
                                assert!(new, "{id} was new");
                                acked_insert.lock().expect("lock").push(id.clone());
                                true
                            }
                            Err(e) => is_fault(&e),
                        }
                    } else {
                        match store.begin(&key, Fingerprint::of(&id)) {
                            Ok(Begin::Started(c)) => match store.complete(&c, id.as_bytes()) {
                                Ok(()) => {
                                    acked_done.lock().expect("lock").push(id.clone());
                                    true
                                }
                                Err(e) => is_fault(&e),
                            },
                            Ok(other) => panic!("{id}: fresh key answered {other:?}"),
                            Err(e) => is_fault(&e),
                        }
                    };
                    assert!(ok, "unexpected error kind for {id}");
                }
            });
        }
    });
    (
        acked_insert.into_inner().expect("lock"),
        acked_done.into_inner().expect("lock"),
    )
}

fn check_all_present(store: &Store, inserts: &[String], done: &[String]) -> Result<()> {
    for id in inserts {
        assert!(
            !store.insert_if_absent(&Key::new("f", id))?,
            "acknowledged insert {id} lost"
        );
    }
    for id in done {
        match store.begin(&Key::new("f", id), Fingerprint::of(id))? {
            Begin::Completed(rec) => assert_eq!(rec.outcome(), Some(id.as_bytes())),
            other => panic!("acknowledged completion {id} came back as {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn failed_commits_poison_and_lose_nothing_acknowledged() -> Result<()> {
    let mut tripped = 0;
    // Sweep the failure point over the workload's writes and syncs.
    for fail_after in (0..400).step_by(7) {
        let backend = FaultBackend::new();
        let store = Store::builder().open_with_backend(backend.clone())?;
        backend.arm(Plan::after(fail_after));
        let (inserts, done) = workload(&store);
        if backend.tripped() {
            tripped += 1;
            // Poisoned: every later write fails clearly, and so does flush.
            let err = store.insert_if_absent(&Key::new("f", "after")).unwrap_err();
            assert!(matches!(err, Error::Poisoned(_)), "{err}");
            assert!(err.to_string().contains("reopen"));
            assert!(matches!(store.flush(), Err(Error::Poisoned(_))));
            assert!(inserts.len() + done.len() < THREADS * OPS);
        } else {
            assert_eq!(inserts.len() + done.len(), THREADS * OPS);
        }
        drop(store);
        let reopened = Store::builder().open_with_backend(backend.healthy())?;
        check_all_present(&reopened, &inserts, &done)?;
    }
    assert!(
        tripped >= 20,
        "the sweep must hit the workload (tripped {tripped} times)"
    );
    Ok(())
}

#[test]
fn a_power_cut_image_keeps_every_acknowledged_record() -> Result<()> {
    // Bytes written but never synced are dropped from the crash image.
    for round in 0..5 {
        let backend = FaultBackend::new();
        let store = Store::builder().open_with_backend(backend.clone())?;
        let (inserts, done) = workload(&store);
        assert_eq!(inserts.len() + done.len(), THREADS * OPS, "round {round}");
        let image = backend.crash_image(); // the store is still open: nothing flushed at close
        let reopened = Store::builder().open_with_backend(image)?;
        check_all_present(&reopened, &inserts, &done)?;
        drop(store);
    }
    Ok(())
}

/// A panic inside the storage engine during a commit (found by the
/// `open_file` fuzzer, on a damaged file) poisons the store like an I/O
/// error; dropping the store still lets go of the file, so it can be
/// reopened as `Error::Poisoned` says, with every acknowledged record.
#[test]
fn a_panic_in_the_storage_engine_poisons_and_the_store_reopens() -> Result<()> {
    let backend = FaultBackend::new();
    let open = |b: FaultBackend| {
        Store::builder()
            .background_eviction(false)
            .open_with_backend(b)
    };
    let store = open(backend.clone())?;
    assert!(store.insert_if_absent(&Key::new("p", "before"))?);
    let idle = backend.handles();
    backend.arm(Plan::after(0).panics());
    let err = store
        .insert_if_absent(&Key::new("p", "during"))
        .expect_err("the commit panicked");
    assert!(
        matches!(&err, Error::Poisoned(m) if m.contains("panicked")),
        "{err}"
    );
    assert!(matches!(
        store.insert_if_absent(&Key::new("p", "after")),
        Err(Error::Poisoned(_))
    ));
    assert!(backend.tripped());
    drop(store);
    assert_eq!(
        backend.handles(),
        idle - 1,
        "the closed store let go of its file"
    );
    let store = open(backend.healthy())?;
    assert!(!store.insert_if_absent(&Key::new("p", "before"))?);
    assert!(store.insert_if_absent(&Key::new("p", "after"))?);
    Ok(())
}

/// A replay of an outcome that is acknowledged but not yet committed
/// (`Deferred`) reads it from memory: it is answered `Completed` and
/// counted without forcing a commit (the armed sync fault is not reached;
/// until issue #28's last step the replay committed first and failed).
/// The commit that then fails poisons the store: later calls fail and are
/// not counted.
#[test]
fn a_replay_of_an_acknowledged_outcome_forces_no_commit() -> Result<()> {
    let backend = FaultBackend::new();
    let store = Store::builder()
        .durability(dedupkv::Durability::Deferred {
            max_delay: std::time::Duration::from_secs(3600),
        })
        .open_with_backend(backend.clone())?;
    let key = Key::new("t", "paid");
    let claim = dedupkv_testkit::started(store.begin(&key, Fingerprint::NONE)?);
    store.complete(&claim, b"ok")?;
    backend.arm(Plan::after(0).syncs_only());
    match store.begin(&key, Fingerprint::NONE)? {
        Begin::Completed(r) => assert_eq!(r.outcome(), Some(&b"ok"[..])),
        other => panic!("a replay of the acknowledged outcome, got {other:?}"),
    }
    assert!(!backend.tripped(), "the replay forced no commit");
    assert_eq!(
        store
            .get(&key)?
            .and_then(|r| r.outcome().map(<[u8]>::to_vec)),
        Some(b"ok".to_vec())
    );
    assert_eq!(store.stats().replays, 1);
    let err = store.flush().unwrap_err();
    assert!(is_fault(&err), "{err}");
    let err = store.begin(&key, Fingerprint::NONE).unwrap_err();
    assert!(matches!(err, dedupkv::Error::Poisoned(_)), "{err}");
    assert_eq!(store.stats().replays, 1, "a failed begin is not a replay");
    Ok(())
}

/// A replay is counted once; a mismatching begin is a conflict, not a replay.
#[test]
fn a_replay_is_counted_once() -> Result<()> {
    let store = Store::builder().open_with_backend(FaultBackend::new())?;
    let key = Key::new("t", "paid");
    let claim = dedupkv_testkit::started(store.begin(&key, Fingerprint::NONE)?);
    store.complete(&claim, b"ok")?;
    assert!(matches!(
        store.begin(&key, Fingerprint::NONE)?,
        Begin::Completed(_)
    ));
    assert!(store.begin(&key, Fingerprint::of("other")).is_err());
    assert_eq!(store.stats().replays, 1);
    assert_eq!(store.stats().conflicts, 1);
    Ok(())
}

/// What a dead-letter key is, as the workload was told: state, attempts,
/// and the reason (dead letter), outcome (completed) or note (abandoned).
type Seen = (State, u32, Option<Vec<u8>>);

/// The dead-letter workload's acknowledged states, by id, and the one
/// call in flight when the fault stopped it: its id and what its key was
/// before, or would be if the call landed.
#[derive(Default)]
struct DeadLetterRun {
    acked: BTreeMap<String, Seen>,
    in_flight: Option<(String, Option<Seen>, Seen)>,
}

const DEAD_KEYS: usize = 12;

fn dl_key(id: &str) -> Key<'_> {
    Key::new("dl", id)
}

impl DeadLetterRun {
    /// Runs `call` for `id`, which makes the key `next`; on an injected
    /// fault records it as in flight and returns `None`.
    fn step<T>(&mut self, id: &str, next: Seen, call: impl FnOnce() -> Result<T>) -> Option<T> {
        match call() {
            Ok(t) => {
                self.acked.insert(id.to_string(), next);
                Some(t)
            }
            Err(e) => {
                assert!(is_fault(&e), "{id}: unexpected error {e}");
                let before = self.acked.get(id).cloned();
                self.in_flight = Some((id.to_string(), before, next));
                None
            }
        }
    }

    /// Begins `id` (attempt `attempt`) and dead-letters it with `reason`.
    fn dead_letter(&mut self, store: &Store, id: &str, attempt: u32, reason: &str) -> Option<()> {
        let claimed = (State::InProgress, attempt, None);
        let claim = self.step(id, claimed, || {
            Ok(dedupkv_testkit::started(
                store.begin(&dl_key(id), Fingerprint::of(id))?,
            ))
        })?;
        assert_eq!(claim.attempt(), attempt, "{id}");
        let dead = (
            State::DeadLettered,
            attempt,
            Some(reason.as_bytes().to_vec()),
        );
        let payload = id.as_bytes();
        self.step(id, dead, || {
            store.fail(
                &claim,
                Failure::Exhausted {
                    reason,
                    payload: Some(payload),
                },
            )
        })
    }

    /// Dead-letters every key, and on the way requeues (and dead-letters
    /// again), resolves as completed and resolves as abandoned earlier
    /// ones; stops at the first injected fault.
    fn run(&mut self, store: &Store) -> Option<()> {
        for i in 0..DEAD_KEYS {
            let id = format!("d{i}");
            self.dead_letter(store, &id, 1, &format!("r{i}"))?;
            if i % 3 == 1 {
                let id = format!("d{}", i - 1);
                let requeued = self.step(&id, (State::Retryable, 1, None), || {
                    store.requeue(&dl_key(&id))
                })?;
                assert!(requeued, "{id} was a dead letter");
                self.dead_letter(store, &id, 2, "again")?;
            }
            if i % 4 == 2 {
                let id = format!("d{}", i - 2);
                let attempts = self.acked[&id].1;
                let done = (State::Completed, attempts, Some(b"by hand".to_vec()));
                let resolved = self.step(&id, done, || {
                    store.resolve(&dl_key(&id), Resolution::Completed(b"by hand"))
                })?;
                assert!(resolved, "{id} was a dead letter");
            }
            if i % 4 == 3 {
                let id = format!("d{}", i - 1);
                let attempts = self.acked[&id].1;
                let dropped = (State::Failed, attempts, Some(b"dropped".to_vec()));
                let resolved = self.step(&id, dropped, || {
                    store.resolve(&dl_key(&id), Resolution::Abandoned("dropped"))
                })?;
                assert!(resolved, "{id} was a dead letter");
            }
        }
        Some(())
    }

    /// The reopened store shows every acknowledged state, the call in
    /// flight either way, and nothing of the keys never reached; the
    /// listing holds exactly the dead letters among them.
    fn check(&self, store: &Store, what: &str) -> Result<()> {
        let mut want_dead = BTreeMap::new();
        for i in 0..DEAD_KEYS {
            let id = format!("d{i}");
            let got = store.get(&dl_key(&id))?.map(|r| {
                let bytes = (r.state() != State::InProgress && r.state() != State::Retryable)
                    .then(|| r.outcome().map(<[u8]>::to_vec))
                    .flatten();
                (r.state(), r.attempts(), bytes)
            });
            let acked = self.acked.get(&id).cloned();
            let ok = match &self.in_flight {
                Some((f, before, next)) if *f == id => got == *before || got.as_ref() == Some(next),
                _ => got == acked,
            };
            assert!(
                ok,
                "{what}: {id} is {got:?}, acknowledged {acked:?}, in flight {:?}",
                self.in_flight
            );
            if let Some((State::DeadLettered, attempts, reason)) = got {
                want_dead.insert(id, (attempts, reason));
            }
        }
        let listed = store.dead_letters(&Listing::new().limit(1_000))?.items;
        let listed: BTreeMap<String, (u32, Option<Vec<u8>>)> = listed
            .iter()
            .map(|dl| {
                assert_eq!(dl.payload(), Some(dl.key().id()), "{what}: payload");
                let id = String::from_utf8(dl.key().id().to_vec()).expect("utf-8 id");
                (id, (dl.attempts(), Some(dl.reason().as_bytes().to_vec())))
            })
            .collect();
        assert_eq!(listed, want_dead, "{what}: the dead-letter listing");
        assert_eq!(
            store.stats().dead_letters_now,
            want_dead.len() as u64,
            "{what}"
        );
        Ok(())
    }
}

/// The fault sweep over a workload that dead-letters, requeues and
/// resolves keys: every write and sync of it fails once. After each
/// fault the store is poisoned, and both the bytes written (a healthy
/// reopen) and the bytes synced (a power cut) reopen with every
/// acknowledged dead letter, requeue and resolution, and nothing that was
/// not acknowledged as done.
#[test]
fn faults_in_dead_letter_commits_lose_nothing_acknowledged() -> Result<()> {
    sweep::<DeadLetterRun>(|| Store::builder().background_eviction(false), 50)
}

/// An intent key as the workload was told: its record's state and
/// attempts, and its intent (sent, request or reference, attempt).
type IntentSeen = (State, u32, Option<(bool, Vec<u8>, u32)>);

/// The intent workload's acknowledged states by id, its acknowledged
/// completions (count, amount), and the call in flight when the fault
/// stopped it: id, the key before and after, and the amount it counts.
#[derive(Default)]
struct IntentRun {
    acked: BTreeMap<String, IntentSeen>,
    done: (u64, i128),
    in_flight: Option<(String, Option<IntentSeen>, IntentSeen, Option<i64>)>,
    /// Claims left in progress, held until the run is checked.
    held: Vec<dedupkv::Claim>,
}

const INTENT_KEYS: usize = 10;

fn in_key(id: &str) -> Key<'_> {
    Key::new("in", id)
}

impl IntentRun {
    /// Runs `call` for `id`, which makes the key `next` (a completion
    /// counting `amount`); on an injected fault records it as in flight
    /// and returns `None`.
    fn step<T>(
        &mut self,
        id: &str,
        (next, amount): (IntentSeen, Option<i64>),
        call: impl FnOnce() -> Result<T>,
    ) -> Option<T> {
        match call() {
            Ok(t) => {
                self.acked.insert(id.to_string(), next);
                if let Some(a) = amount {
                    self.done = (self.done.0 + 1, self.done.1 + i128::from(a));
                }
                Some(t)
            }
            Err(e) => {
                assert!(is_fault(&e), "{id}: unexpected error {e}");
                let before = self.acked.get(id).cloned();
                self.in_flight = Some((id.to_string(), before, next, amount));
                None
            }
        }
    }

    /// `begin_with_intent` of `id` as attempt `attempt`.
    fn begin(&mut self, store: &Store, id: &str, attempt: u32) -> Option<dedupkv::Claim> {
        let request = id.as_bytes().to_vec();
        let next = (
            State::InProgress,
            attempt,
            Some((false, request.clone(), attempt)),
        );
        let claim = self.step(id, (next, None), || {
            let intent = Intent {
                target: "carrier",
                request: &request,
            };
            let opts = BeginOptions::new();
            Ok(dedupkv_testkit::started(store.begin_with_intent(
                &in_key(id),
                Fingerprint::of(id),
                &opts,
                intent,
            )?))
        })?;
        assert_eq!(claim.attempt(), attempt, "{id}");
        assert_eq!(claim.unanswered_intent(), attempt > 1, "{id}");
        Some(claim)
    }

    /// Every key: recorded with an intent; every third fails retryably
    /// and begins again (attempt 2, its intent still pending); every
    /// second is marked sent; all but every fourth complete with an
    /// amount. Stops at the first injected fault.
    fn run(&mut self, store: &Store) -> Option<()> {
        for i in 0..INTENT_KEYS {
            let id = format!("i{i}");
            let mut claim = self.begin(store, &id, 1)?;
            let mut attempt = 1;
            if i % 3 == 0 {
                let request = id.as_bytes().to_vec();
                let released = (State::Retryable, 1, Some((false, request, 1)));
                self.step(&id, (released, None), || {
                    store.fail(&claim, Failure::Retryable)
                })?;
                attempt = 2;
                claim = self.begin(store, &id, 2)?;
            }
            let mut intent = Some((false, id.as_bytes().to_vec(), attempt));
            if i % 2 == 0 {
                let reference = format!("ref-{i}").into_bytes();
                intent = Some((true, reference.clone(), attempt));
                let sent = (State::InProgress, attempt, intent.clone());
                self.step(&id, (sent, None), || store.mark_sent(&claim, &reference))?;
            }
            if i % 4 == 3 {
                // Left in progress with its intent open.
                self.held.push(claim);
            } else {
                let amount = i64::try_from(i).expect("small") * 100 - 300;
                let kept = intent.filter(|(sent, ..)| *sent);
                let done = (State::Completed, attempt, kept);
                self.step(&id, (done, Some(amount)), || {
                    store.complete_with_amount(&claim, b"ok", amount)
                })?;
            }
        }
        Some(())
    }

    /// The reopened store shows every acknowledged state and intent, the
    /// call in flight either way, nothing of the keys never reached; the
    /// listings and the pending count agree; the tallies count exactly
    /// the completions that landed.
    fn check(&self, store: &Store, what: &str) -> Result<()> {
        let (mut pending, mut twice) = (BTreeSet::new(), BTreeSet::new());
        let mut want_done = self.done;
        for i in 0..INTENT_KEYS {
            let id = format!("i{i}");
            let record = store.get(&in_key(&id))?;
            let intent = store.intent(&in_key(&id))?.map(|e| {
                let data = e.reference().or(e.request()).map(<[u8]>::to_vec);
                assert_eq!(e.target(), "carrier", "{what}: {id}");
                (e.is_sent(), data.unwrap_or_default(), e.attempt())
            });
            let got = record.map(|r| (r.state(), r.attempts(), intent.clone()));
            if got.is_none() {
                assert!(
                    intent.is_none(),
                    "{what}: {id} has no record but {intent:?}"
                );
            }
            let acked = self.acked.get(&id).cloned();
            let ok = match &self.in_flight {
                Some((f, before, next, amount)) if *f == id => {
                    let landed = got.as_ref() == Some(next);
                    if landed && let Some(a) = amount {
                        want_done = (want_done.0 + 1, want_done.1 + i128::from(*a));
                    }
                    landed || got == *before
                }
                _ => got == acked,
            };
            assert!(
                ok,
                "{what}: {id} is {got:?}, acknowledged {acked:?}, in flight {:?}",
                self.in_flight
            );
            match intent {
                Some((false, ..)) => {
                    pending.insert(id);
                }
                Some((true, _, attempt)) if attempt > 1 => {
                    twice.insert(id);
                }
                _ => {}
            }
        }
        let ids = |items: Vec<dedupkv::IntentEntry>| -> BTreeSet<String> {
            items
                .iter()
                .map(|e| String::from_utf8(e.key().id().to_vec()).expect("utf-8 id"))
                .collect()
        };
        let all = Listing::new().limit(1_000);
        assert_eq!(ids(store.pending_intents(&all)?.items), pending, "{what}");
        assert_eq!(
            ids(store.duplicate_candidates(&all)?.items),
            twice,
            "{what}"
        );
        assert_eq!(
            store.stats().intents_pending,
            pending.len() as u64,
            "{what}"
        );
        let tallies = store.tallies("in")?;
        let got_done = tallies
            .iter()
            .fold((0, 0), |(n, a), t| (n + t.count, a + t.amount));
        assert_eq!(got_done, want_done, "{what}: the tallies");
        Ok(())
    }
}

/// The fault sweep over a workload of intents and counted completions
/// (`begin_with_intent`, a retry, `mark_sent`, `complete_with_amount`):
/// every write and sync of it fails once. After each fault both the
/// bytes written and the bytes synced reopen with every acknowledged
/// intent state and tally, the call in flight whole or not at all (its
/// count with its completion), and nothing never acknowledged.
#[test]
fn faults_in_intent_and_tally_commits_lose_nothing_acknowledged() -> Result<()> {
    let clock = ManualClock::new(1_700_000_000_000);
    sweep::<IntentRun>(
        || {
            Store::builder()
                .clock(clock.clone())
                .background_eviction(false)
        },
        30,
    )
}

/// A workload a fault sweep drives: `run` stops at the first failed call
/// (`None`), remembering the call in flight; `check` compares a reopened
/// store with what was acknowledged.
trait Workload: Default {
    fn run(&mut self, store: &Store) -> Option<()>;
    fn check(&self, store: &Store, what: &str) -> Result<()>;
    fn settled(&self) -> bool;
}

impl Workload for DeadLetterRun {
    fn run(&mut self, store: &Store) -> Option<()> {
        DeadLetterRun::run(self, store)
    }
    fn check(&self, store: &Store, what: &str) -> Result<()> {
        DeadLetterRun::check(self, store, what)
    }
    fn settled(&self) -> bool {
        self.in_flight.is_none()
    }
}

impl Workload for IntentRun {
    fn run(&mut self, store: &Store) -> Option<()> {
        IntentRun::run(self, store)
    }
    fn check(&self, store: &Store, what: &str) -> Result<()> {
        IntentRun::check(self, store, what)
    }
    fn settled(&self) -> bool {
        self.in_flight.is_none()
    }
}

/// Fails every write and sync of `W`'s workload in turn (a store opened by
/// `builder`); after each fault, the store is poisoned, and both the bytes
/// written (a reopen) and the bytes synced (a power cut) reopen with
/// everything acknowledged. The sweep must hit the workload at least
/// `min_trips` times.
fn sweep<W: Workload>(builder: impl Fn() -> StoreBuilder, min_trips: u32) -> Result<()> {
    let mut tripped = 0;
    for fail_after in 0.. {
        let backend = FaultBackend::new();
        let store = builder().open_with_backend(backend.clone())?;
        backend.arm(Plan::after(fail_after));
        let mut run = W::default();
        let finished = run.run(&store).is_some();
        assert_eq!(finished, !backend.tripped(), "fault {fail_after}");
        if finished {
            assert!(run.settled());
            run.check(&store, "no fault")?;
            break;
        }
        tripped += 1;
        assert!(matches!(
            store.insert_if_absent(&Key::new("f", "after")),
            Err(Error::Poisoned(_))
        ));
        let image = backend.crash_image();
        drop(store);
        let what = format!("fault {fail_after}");
        run.check(
            &builder().open_with_backend(image)?,
            &format!("{what}, power cut"),
        )?;
        run.check(&builder().open_with_backend(backend.healthy())?, &what)?;
    }
    assert!(
        tripped >= min_trips,
        "the sweep must hit the workload (tripped {tripped} times)"
    );
    Ok(())
}

/// After a failed commit every read answers `Poisoned`, as every write
/// does: the index may hold what the failed commit never made durable
/// (here a completion and its count), so no read answers from it. `stats`
/// still answers, and a reopened store reads what is durable.
#[test]
fn every_read_of_a_poisoned_store_answers_poisoned() -> Result<()> {
    let backend = FaultBackend::new();
    let store = Store::builder()
        .clock(ManualClock::new(1_700_000_000_000))
        .open_with_backend(backend.clone())?;
    let key = Key::new("p", "k");
    let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("new key");
    };
    backend.arm(Plan::after(0));
    let err = store.complete_with_amount(&claim, b"done", 5).unwrap_err();
    assert!(is_fault(&err), "{err}");
    let entity = Key::new("p", "entity");
    let reads: [(&str, Result<()>); 11] = [
        ("get", store.get(&key).map(drop)),
        ("intent", store.intent(&key).map(drop)),
        (
            "pending_intents",
            store.pending_intents(&Listing::new()).map(drop),
        ),
        (
            "duplicate_candidates",
            store.duplicate_candidates(&Listing::new()).map(drop),
        ),
        ("tallies", store.tallies("p").map(drop)),
        ("reconcile", store.reconcile("p", &[]).map(drop)),
        (
            "dead_letters",
            store.dead_letters(&Listing::new()).map(drop),
        ),
        (
            "stranded_claims",
            store.stranded_claims(&Listing::new()).map(drop),
        ),
        (
            "holding_area",
            store.holding_area(&Listing::new()).map(drop),
        ),
        ("held", store.held(&entity).map(drop)),
        ("unacked", store.unacked(&entity).map(drop)),
    ];
    for (name, answer) in reads {
        assert!(
            matches!(answer, Err(Error::Poisoned(_))),
            "{name} after a failed commit: {answer:?}"
        );
    }
    assert_eq!(store.stats().started, 1, "stats still answer");
    drop(store);
    let reopened = Store::builder()
        .clock(ManualClock::new(1_700_000_000_000))
        .open_with_backend(backend.healthy())?;
    assert_eq!(
        reopened.get(&key)?.map(|r| r.state()),
        Some(State::InProgress)
    );
    assert!(
        reopened.tallies("p")?.is_empty(),
        "the failed completion was never counted"
    );
    Ok(())
}
