//! Model checking with loom: every interleaving (up to a preemption bound)
//! of two or three callers and the committer thread. Built only with
//! `RUSTFLAGS="--cfg dedupkv_loom"`; run `scripts/loom.sh`.
//!
//! Checked: no interleaving lets two callers both win a key
//! (`insert_if_absent`, `begin`), and none acknowledges a caller before its
//! batch is durable: at the moment a call returns `Ok`, the caller takes
//! the backend's crash image (only the synced bytes), and that image,
//! reopened as a store, holds the acknowledged record. The same holds for
//! `flush` in `Deferred` mode, and with an injected sync failure no caller
//! of the failed batch is acknowledged. Two writes of one key in the open
//! log row (`Deferred` mode lets one thread make both before a commit)
//! must not fool a call that read the row between its two locks: `forget`
//! never frees a claim `begin` started meanwhile, and `begin` replays as
//! `Completed` only a finished record, never a `requeue`'s release; and a
//! listing returns when a dead letter lands in a row newer than the one it
//! read when it began. A record acknowledged before its commit
//! (`Deferred`) reads back whether its row is still in the open batch, in
//! the commit being made, or in the storage, whichever the schedule gives.
//!
//! The journal (at the end): a writer's acknowledged keys read back and
//! survive a crash at every moment while it switches halves and the
//! checkpointer moves a full half into the store file, and a failed
//! checkpoint poisons without losing one.
//!
//! Each model opens its store with one shard and a manual clock, so an
//! execution is a function of loom's schedule alone (loom requires it): the
//! random key-hash secret then cannot change which shard locks are taken.
//! A model has at most five threads, loom's limit: the model's own (also a
//! racer), the committer, one or two more racers, and one committer per
//! reopened crash image.
#![cfg(dedupkv_loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use dedupkv::{Begin, Durability, Error, Failure, Fingerprint, Key, ManualClock, Result, Store};
use dedupkv_testkit::{FaultBackend, FaultFile, Plan, is_fault, started};
use loom::thread::JoinHandle;

/// The manual clock's only time: leases never lapse within a model.
const T0: u64 = 1_700_000_000_000;
/// Stack for spawned racers, in the machine words loom's threads count in
/// (2 MiB); redb does not fit the default 32 KiB.
const STACK_WORDS: usize = 1 << 18;
const OUTCOME: &[u8] = b"done";

fn fp() -> Fingerprint {
    Fingerprint::of("params")
}

/// A store on `backend`: one shard, manual clock, no evictor thread, its
/// first commit (the token floor) done, so the committer is idle.
fn open(backend: impl dedupkv::PageBackend) -> Result<Store> {
    open_with(backend, Durability::Immediate)
}

fn open_with(backend: impl dedupkv::PageBackend, durability: Durability) -> Result<Store> {
    let store = Store::builder()
        .shards(1)
        .clock(ManualClock::new(T0))
        .background_eviction(false)
        .durability(durability)
        .open_with_backend(backend)?;
    store.flush()?;
    Ok(store)
}

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    loom::thread::Builder::new()
        .stack_size(STACK_WORDS)
        .spawn(f)
        .expect("spawn")
}

fn join<T>(h: JoinHandle<T>) -> T {
    h.join().expect("racer panicked")
}

/// Explores `model` under loom with at most `preemptions` preemptions per
/// execution (`LOOM_MAX_PREEMPTIONS` overrides it for every model), and
/// prints how many executions that took. Only the part of `model` inside
/// [`race`] is explored; the rest runs one schedule.
fn check(name: &str, preemptions: usize, model: impl Fn() -> Result<()> + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder.preemption_bound.or(Some(preemptions));
    builder.expect_explicit_explore = true;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let label = name.to_string();
    let started = Instant::now();
    builder.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = model() {
            panic!("{label}: {e}");
        }
    });
    println!(
        "loom: {name}: {} executions (preemption bound {}) in {:.1?}",
        runs.load(Ordering::Relaxed),
        builder.preemption_bound.unwrap_or(0),
        started.elapsed()
    );
}

/// Runs `f` with loom exploring every schedule of it. Opening the store
/// before and checking crash images after are not what is being checked:
/// they run one schedule, which keeps the model small.
fn race<R>(f: impl FnOnce() -> R) -> R {
    loom::explore();
    let out = f();
    loom::stop_exploring();
    out
}

/// Reopens a crash image and asserts every id in `ids` (scope `t`) is
/// recorded there.
fn assert_recorded(image: FaultBackend, ids: &[&str], what: &str) -> Result<()> {
    let store = open(image)?;
    for id in ids {
        assert!(
            store.get(&Key::new("t", id))?.is_some(),
            "{what} returned, but a crash at that moment loses t/{id}"
        );
    }
    Ok(())
}

/// Which answer a `begin` racer got (its claim completed if it started).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Started,
    InProgress,
    Completed,
}

/// `begin` on `t/op`, and `complete` if this caller won.
fn begin_and_complete(store: &Store) -> Result<Answer> {
    Ok(match store.begin(&Key::new("t", "op"), fp())? {
        Begin::Started(claim) => {
            if let Err(e) = store.complete(&claim, OUTCOME) {
                panic!("a Started claim could not complete, so another caller won too: {e}");
            }
            Answer::Started
        }
        Begin::InProgress(_) => Answer::InProgress,
        Begin::Completed(rec) => {
            assert_eq!(rec.outcome(), Some(OUTCOME), "replayed outcome");
            Answer::Completed
        }
        Begin::DeadLettered(d) => panic!("nothing is dead-lettered here: {d:?}"),
    })
}

/// `racers` threads (the model's own included) insert `t/k`; asserts
/// exactly one was told it is new.
fn insert_race(racers: usize) -> Result<()> {
    let store = open(FaultBackend::new())?;
    let answers = race(|| {
        let others: Vec<_> = (1..racers)
            .map(|_| {
                let store = store.clone();
                spawn(move || store.insert_if_absent(&Key::new("t", "k")))
            })
            .collect();
        let mut answers = vec![store.insert_if_absent(&Key::new("t", "k"))];
        answers.extend(others.into_iter().map(join));
        answers.into_iter().collect::<Result<Vec<bool>>>()
    })?;
    let wins = answers.iter().filter(|&&new| new).count();
    assert_eq!(wins, 1, "insert_if_absent answers {answers:?}");
    Ok(())
}

#[test]
fn insert_if_absent_has_one_winner() {
    check("insert_if_absent, 2 racers on one key", 3, || {
        insert_race(2)
    });
}

#[test]
fn insert_if_absent_has_one_winner_of_three() {
    check("insert_if_absent, 3 racers on one key", 1, || {
        insert_race(3)
    });
}

#[test]
fn begin_has_one_winner() {
    check("begin + complete, 2 racers on one key", 2, || {
        let store = open(FaultBackend::new())?;
        let (mine, theirs) = race(|| {
            let racer = {
                let store = store.clone();
                spawn(move || begin_and_complete(&store))
            };
            (begin_and_complete(&store), join(racer))
        });
        let answers = [mine?, theirs?];
        let started = answers.iter().filter(|&&a| a == Answer::Started).count();
        assert_eq!(started, 1, "begin answers {answers:?}");
        Ok(())
    });
}

#[test]
fn inserts_are_durable_when_acknowledged() {
    check("insert_if_absent / insert_batch: ack => durable", 2, || {
        let backend = FaultBackend::new();
        let store = open(backend.clone())?;
        let ((mine, my_image), (theirs, their_image)) = race(|| {
            let racer = {
                let (store, backend) = (store.clone(), backend.clone());
                spawn(move || {
                    let keys = [Key::new("t", "shared"), Key::new("t", "batch-only")];
                    let flags = store.insert_batch(&keys);
                    (flags, backend.crash_image())
                })
            };
            let mine = store.insert_if_absent(&Key::new("t", "shared"));
            ((mine, backend.crash_image()), join(racer))
        });
        drop(store);
        let (mine, theirs) = (mine?, theirs?);
        assert!(mine != theirs[0], "both or neither won: {mine}, {theirs:?}");
        // A duplicate answer is an acknowledgement too: it must not be given
        // before the record it is based on is durable.
        assert_recorded(my_image, &["shared"], "insert_if_absent")?;
        assert_recorded(their_image, &["shared", "batch-only"], "insert_batch")
    });
}

#[test]
fn claims_and_completions_are_durable_when_acknowledged() {
    check("begin / complete: ack => durable", 2, || {
        let backend = FaultBackend::new();
        let store = open(backend.clone())?;
        let answers = race(|| {
            let racer = {
                let (store, backend) = (store.clone(), backend.clone());
                spawn(move || (begin_and_complete(&store), backend.crash_image()))
            };
            let mine = begin_and_complete(&store);
            [(mine, backend.crash_image()), join(racer)]
        });
        drop(store);
        for (answer, image) in answers {
            let answer = answer?;
            let store = open(image)?;
            let after = store.begin(&Key::new("t", "op"), fp())?;
            match (answer, &after) {
                // Completed (by this caller, or replayed to it): the outcome
                // survives.
                (Answer::Started | Answer::Completed, Begin::Completed(rec)) => {
                    assert_eq!(rec.outcome(), Some(OUTCOME));
                }
                // Told "in progress": the claim it was told of survives, so
                // the crash cannot start the key afresh. Its process is gone,
                // so the reopened store takes it over at once, as attempt 2
                // and interrupted (a lost claim would start attempt 1).
                (Answer::InProgress, Begin::Completed(_)) => {}
                (Answer::InProgress, Begin::Started(c)) if c.attempt() == 2 && c.interrupted() => {}
                _ => panic!("answered {answer:?}, but a crash at that moment leaves {after:?}"),
            }
        }
        Ok(())
    });
}

#[test]
fn deferred_flush_makes_earlier_acks_durable() {
    check("deferred: flush => durable", 2, || {
        let backend = FaultBackend::new();
        let deferred = Durability::Deferred {
            max_delay: Duration::from_millis(5),
        };
        let store = open_with(backend.clone(), deferred)?;
        // The committer also commits on its own whenever its (modelled)
        // timeout fires; `flush` must still cover every earlier ack.
        let (answers, image) = race(|| {
            let racer = {
                let store = store.clone();
                spawn(move || store.insert_if_absent(&Key::new("t", "a")))
            };
            let mine = store.insert_if_absent(&Key::new("t", "b"));
            let answers = [mine, join(racer)];
            let flushed = store.flush();
            (answers, flushed.map(|()| backend.crash_image()))
        });
        drop(store);
        for new in answers {
            assert!(new?, "distinct keys are new");
        }
        assert_recorded(image?, &["a", "b"], "flush")
    });
}

/// A store whose first commit is done, and whose backend then lets `syncs`
/// more syncs (one per commit) succeed before one fails.
/// The failing commit's pages are written but never synced, and after
/// the failed sync every write and sync fails.
fn open_failing(syncs: u64) -> Result<(Store, FaultBackend)> {
    let backend = FaultBackend::new();
    let store = open(backend.clone())?;
    backend.arm(Plan::after(syncs).syncs_only());
    Ok((store, backend))
}

#[test]
fn failed_commit_acknowledges_nobody() {
    check(
        "sync failure of the next commit: every caller gets Err",
        3,
        || {
            let (store, _backend) = open_failing(0)?;
            let answers = race(|| {
                let racer = {
                    let store = store.clone();
                    spawn(move || store.insert_if_absent(&Key::new("t", "a")))
                };
                let mine = store.insert_if_absent(&Key::new("t", "b"));
                [mine, join(racer)]
            });
            for res in &answers {
                assert!(
                    matches!(res, Err(e) if is_fault(e)),
                    "a caller of the failed commit was answered {res:?}"
                );
            }
            // Sticky: the store refuses writes until reopened.
            let again = store.insert_if_absent(&Key::new("t", "c"));
            assert!(
                matches!(again, Err(Error::Poisoned(_))),
                "after the failure: {again:?}"
            );
            Ok(())
        },
    );
}

#[test]
fn failure_in_a_later_commit_keeps_earlier_acks_durable() {
    let outcomes = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let seen = Arc::clone(&outcomes);
    check(
        "sync failure of the second commit: ack => durable, else Err",
        3,
        move || {
            let (store, backend) = open_failing(1)?;
            let answers = race(|| {
                let racer = {
                    let (store, disk) = (store.clone(), backend.clone());
                    spawn(move || {
                        let res = store.insert_if_absent(&Key::new("t", "a"));
                        ("a", res, disk.crash_image())
                    })
                };
                let mine = store.insert_if_absent(&Key::new("t", "b"));
                [("b", mine, backend.crash_image()), join(racer)]
            });
            drop(store);
            for (id, res, image) in answers {
                match res {
                    Ok(new) => {
                        assert!(new, "t/{id} was new");
                        seen[0].fetch_add(1, Ordering::Relaxed);
                        assert_recorded(image, &[id], "insert_if_absent")?;
                    }
                    Err(e) => {
                        assert!(is_fault(&e), "unexpected error {e}");
                        seen[1].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(())
        },
    );
    // The schedule decides which callers share the failed commit: loom must
    // have seen both answers, or the model checked less than it claims.
    let (ok, err) = (
        outcomes[0].load(Ordering::Relaxed),
        outcomes[1].load(Ordering::Relaxed),
    );
    println!("loom:   acknowledged {ok} times, refused {err} times");
    assert!(ok > 0 && err > 0, "acknowledged {ok}, refused {err}");
}

/// Deferred mode: a write returns before its commit, so two writes of one
/// key can share the open log row without a third thread.
fn deferred() -> Durability {
    Durability::Deferred {
        max_delay: Duration::from_millis(5),
    }
}

#[test]
fn an_acknowledged_record_reads_back_while_its_commit_is_made() {
    check(
        "deferred: get and replay of an acked record during its commit",
        2,
        || {
            let store = open_with(FaultBackend::new(), deferred())?;
            let key = Key::new("t", "op");
            let claim = started(store.begin(&key, fp())?);
            let (read, flushed) = race(|| {
                let racer = {
                    let store = store.clone();
                    spawn(move || store.flush())
                };
                // Acknowledged at once; the racer (or the committer)
                // takes the batch and commits it at any point around the
                // reads below.
                let read = store.complete(&claim, OUTCOME).and_then(|()| {
                    let got = store.get(&Key::new("t", "op"))?;
                    let again = store.begin(&Key::new("t", "op"), fp())?;
                    Ok((got, again))
                });
                (read, join(racer))
            });
            flushed?;
            let (got, again) = read?;
            let got =
                got.ok_or_else(|| Error::Corrupt("an acknowledged record read as absent".into()))?;
            assert_eq!(got.outcome(), Some(OUTCOME), "get of the acked completion");
            match again {
                Begin::Completed(rec) => assert_eq!(rec.outcome(), Some(OUTCOME)),
                other => panic!("a replay of the acked completion, got {other:?}"),
            }
            Ok(())
        },
    );
}

#[test]
fn forget_never_frees_a_live_claim() {
    check(
        "forget vs fail + begin: a Started claim stays the key's",
        2,
        || {
            let store = open_with(FaultBackend::new(), deferred())?;
            let first = started(store.begin(&Key::new("t", "op"), fp())?);
            let (forgot, again) = race(|| {
                let racer = {
                    let store = store.clone();
                    spawn(move || store.forget(&Key::new("t", "op")))
                };
                let again = store
                    .fail(&first, Failure::Retryable)
                    .and_then(|()| store.begin(&Key::new("t", "op"), fp()));
                (join(racer), again)
            });
            let (forgot, again) = (forgot?, again?);
            // Forgotten before the begin (a new operation, attempt 1) or
            // refused while the first claim was live: either way a Started
            // claim is the key's active claim until it finishes.
            if let Begin::Started(claim) = again
                && let Err(e) = store.complete(&claim, OUTCOME)
            {
                panic!(
                    "begin started attempt {} while forget answered {forgot:?}, \
                     and the claim was lost: {e}",
                    claim.attempt()
                );
            }
            Ok(())
        },
    );
}

#[test]
fn begin_replays_only_finished_records() {
    check(
        "begin vs requeue: Completed only for a finished record",
        2,
        || {
            let store = open_with(FaultBackend::new(), deferred())?;
            let first = started(store.begin(&Key::new("t", "op"), fp())?);
            let (mine, requeued) = race(|| {
                let racer = {
                    let store = store.clone();
                    spawn(move || store.requeue(&Key::new("t", "op")))
                };
                let exhausted = Failure::Exhausted {
                    reason: "gave up",
                    payload: None,
                };
                let mine = store
                    .fail(&first, exhausted)
                    .and_then(|()| store.begin(&Key::new("t", "op"), fp()));
                (mine, join(racer))
            });
            let (mine, requeued) = (mine?, requeued?);
            // Dead-lettered (before the requeue) or a new attempt (after
            // it); nothing here ever completed.
            if let Begin::Completed(rec) = &mine {
                panic!("begin answered Completed with {rec:?} (requeued: {requeued})");
            }
            Ok(())
        },
    );
}

#[test]
fn dead_letters_listing_returns() {
    check(
        "dead_letters vs a dead letter written into a newer row",
        2,
        || {
            let store = open(FaultBackend::new())?;
            let first = started(store.begin(&Key::new("t", "op"), fp())?);
            let (listed, failed) = race(|| {
                let racer = {
                    let store = store.clone();
                    spawn(move || {
                        // A commit after the listing began: the dead letter
                        // lands in a row newer than the one it read.
                        store.insert_if_absent(&Key::new("t", "other"))?;
                        store.fail(
                            &first,
                            Failure::Exhausted {
                                reason: "gave up",
                                payload: None,
                            },
                        )
                    })
                };
                let listed = store.dead_letters(&dedupkv::Listing::new());
                (listed, join(racer))
            });
            failed?;
            // It returned (loom reports a listing that waits forever as a
            // deadlock), with the dead letter or without it.
            let listed = listed?;
            assert!(listed.items.len() <= 1, "listed {listed:?}");
            Ok(())
        },
    );
}

// The journal (`StoreBuilder::journal`): a writer appends records to one
// half of the segment while the checkpointer thread writes the run in the
// other half into the store file, then frees that half; the writer
// switches halves past a half's high-water mark (if the other half is
// free) and must wait when its half is full. These models run the real
// journal store (its writer lock, overlay, hand-off and checkpointer
// thread use `crate::sync`, so loom schedules them) under a `Store` on
// two fault backends: the store file's pages and the journal's segment.
// Not covered here: a write or sync of the segment itself failing
// (tests/journal.rs sweeps those), the drop's last settle, compaction's
// restart of the checkpointer, and schedules past the preemption bound.

/// The smallest segment (8 KiB): the 4 KiB header and two halves of
/// 2 KiB. With ids of [`ID_BYTES`] a record takes ~0.5 KiB, so a run
/// passes its high-water mark after two records and a half is full after
/// three or four: six inserts switch halves, may switch back into the
/// half just checkpointed, and may find the other half still busy.
const JOURNAL_BYTES: u64 = 8 << 10;
const ID_BYTES: usize = 400;
const JOURNAL_INSERTS: usize = 6;

/// A crash image of both media, and the ids acknowledged before it.
struct Image {
    store: FaultBackend,
    journal: FaultFile,
    acked: Vec<String>,
}

/// Images gathered while loom explores, checked after (a reopen needs a
/// committer and a checkpointer thread of its own: two more than a model
/// of three threads can spawn per image, loom's limit being five).
static IMAGES: std::sync::Mutex<Vec<Image>> = std::sync::Mutex::new(Vec::new());

fn journal_id(n: usize) -> String {
    format!("{n:0>ID_BYTES$}")
}

fn open_journaled(store: FaultBackend, journal: FaultFile) -> Result<Store> {
    Store::builder()
        .shards(1)
        .clock(ManualClock::new(T0))
        .background_eviction(false)
        .journal(Some(JOURNAL_BYTES))
        // A row per commit: a key's row is then left in the run being
        // checkpointed, and its reads race the checkpoint's hand-over
        // to the store file.
        .row_split_bytes(1)
        .open_with_backends(store, journal)
}

/// A journaled store whose first commit (into the store file, with the
/// journal's mark) is done: the next commits go to the journal.
fn journaled() -> Result<(Store, FaultBackend, FaultFile)> {
    let (db, j) = (FaultBackend::new(), FaultFile::new());
    let store = open_journaled(db.clone(), j.clone())?;
    assert!(store.insert_if_absent(&Key::new("t", "first"))?);
    Ok((store, db, j))
}

/// What a power cut now leaves of both media (the store file's first:
/// only the checkpointer writes it, and it never writes the journal, so
/// taken from the writer's thread the pair is one instant's).
fn crash_images(db: &FaultBackend, j: &FaultFile, acked: &[String]) -> Image {
    Image {
        store: db.crash_image(),
        journal: j.crash_image(),
        acked: acked.to_vec(),
    }
}

fn fingerprint(image: &Image) -> std::io::Result<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let len = dedupkv::PageBackend::len(&image.store)?;
    let mut bytes = vec![0; usize::try_from(len).unwrap_or(0)];
    dedupkv::PageBackend::read(&image.store, 0, &mut bytes)?;
    bytes.hash(&mut h);
    image.journal.contents()?.hash(&mut h);
    image.acked.hash(&mut h);
    Ok(h.finish())
}

/// Reopens every distinct image gathered by the models, each in a loom
/// model of its own (one schedule: the reopen's two threads are what a
/// model can spare), and asserts each id acknowledged before it is
/// recorded: the journal's tail and the store file together hold every
/// acknowledged commit at every moment. (Images rarely repeat: each run
/// draws its journal's first epoch at random.)
fn check_images(what: &str) {
    let images = std::mem::take(&mut *IMAGES.lock().unwrap_or_else(PoisonError::into_inner));
    let mut seen = std::collections::HashSet::new();
    let mut distinct = Vec::new();
    for image in images {
        if seen.insert(fingerprint(&image).expect("reading an image")) {
            distinct.push(image);
        }
    }
    let started = Instant::now();
    let count = distinct.len();
    for image in distinct {
        let image = Arc::new(std::sync::Mutex::new(Some(image)));
        let label = what.to_string();
        let mut builder = loom::model::Builder::new();
        builder.expect_explicit_explore = true;
        builder.check(move || {
            let Some(image) = image.lock().unwrap_or_else(PoisonError::into_inner).take() else {
                return;
            };
            let store = open_journaled(image.store, image.journal)
                .unwrap_or_else(|e| panic!("{label}: reopening a crash image: {e}"));
            for id in &image.acked {
                let got = store.get(&Key::new("t", id));
                assert!(
                    matches!(got, Ok(Some(_))),
                    "{label}: t/{} was acknowledged, but a crash at that moment \
                     leaves {got:?}",
                    id.parse::<u64>().unwrap_or(u64::MAX)
                );
            }
        });
    }
    println!(
        "loom:   {count} distinct crash images reopened in {:.1?}",
        started.elapsed()
    );
}

/// Inserts ids `0..n` one by one; after each acknowledgement every key
/// acknowledged so far reads back and both media's crash images are kept. Stops at the first
/// error, and returns it.
fn journal_writer(
    store: &Store,
    db: &FaultBackend,
    j: &FaultFile,
    n: usize,
) -> (Vec<String>, Vec<Image>, Option<Error>) {
    let (mut acked, mut images) = (Vec::new(), Vec::new());
    for i in 0..n {
        let id = journal_id(i);
        match store.insert_if_absent(&Key::new("t", &id)) {
            Ok(new) => {
                assert!(new, "t/{i} was new");
                acked.push(id);
                images.push(crash_images(db, j, &acked));
                for (n, id) in acked.iter().enumerate() {
                    let got = store.get(&Key::new("t", id));
                    assert!(
                        matches!(got, Ok(Some(_))),
                        "t/{n} was acknowledged but reads as {got:?} after t/{i}'s ack"
                    );
                }
            }
            Err(e) => return (acked, images, Some(e)),
        }
    }
    (acked, images, None)
}

fn keep(images: Vec<Image>) {
    IMAGES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .extend(images);
}

#[test]
fn journal_acks_survive_switches_and_checkpoints() {
    const WHAT: &str = "journal: ack => readable and in the crash image, across switches";
    check(WHAT, 2, || {
        let (store, db, j) = journaled()?;
        let (acked, images, failed) = race(|| journal_writer(&store, &db, &j, JOURNAL_INSERTS));
        if let Some(e) = failed {
            panic!("an insert failed with nothing armed: {e}");
        }
        for id in &acked {
            assert!(
                store.get(&Key::new("t", id))?.is_some(),
                "t/{id} reads back"
            );
        }
        keep(images);
        Ok(())
    });
    check_images(WHAT);
}

#[test]
fn journal_failed_checkpoint_poisons_and_keeps_every_ack() {
    const WHAT: &str = "journal: a failed checkpoint poisons, ack => in the crash image";
    let refused = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&refused);
    check(WHAT, 2, move || {
        let (store, db, j) = journaled()?;
        // The store file's next sync fails: the first checkpoint's.
        db.arm(Plan::after(0).syncs_only());
        let (acked, images, failed) = race(|| journal_writer(&store, &db, &j, JOURNAL_INSERTS));
        keep(images);
        match failed {
            Some(_) => {
                seen.fetch_add(1, Ordering::Relaxed);
            }
            // Every insert fitted before the writer needed the failed half.
            None => assert_eq!(acked.len(), JOURNAL_INSERTS),
        }
        // The writer is refused at the latest when it needs the failed
        // half again, and from then on every write is (sticky).
        let mut more = JOURNAL_INSERTS;
        while store
            .insert_if_absent(&Key::new("t", &journal_id(more)))
            .is_ok()
        {
            more += 1;
            assert!(
                more < 3 * JOURNAL_INSERTS,
                "the failed checkpoint never poisoned the store"
            );
        }
        let again = store.insert_if_absent(&Key::new("t", "after"));
        assert!(
            matches!(again, Err(Error::Poisoned(_))),
            "after the refusal: {again:?}"
        );
        Ok(())
    });
    check_images(WHAT);
    let refused = refused.load(Ordering::Relaxed);
    println!("loom:   the writer was refused within the race {refused} times");
    assert!(refused > 0, "no schedule reached the refusal");
}
