//! The read-only open (`Store::open_read_only`): it answers every read as a
//! writable open of the same file would, refuses every write with
//! `Error::ReadOnly` naming the path, and leaves the file as it found it —
//! not a byte, nor its modification time, changes, and no file is created
//! — on a cleanly closed store, on crash images that need recovery, on a
//! store of an older format (which is not upgraded), and beside a writer
//! that holds the store open.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::PageBackend;
use dedupkv::{
    Answer, AsyncStore, BeginOptions, Error, Failure, Fingerprint, Intent, Key, Listing,
    ManualClock, Resolution, Result, Store, StoreBuilder, WindowKeys,
};
use dedupkv_testkit::{FaultBackend, HOUR, MIN, T0, T0_HOUR, started, tempdir};

/// Every open of these tests, writable or not: the same settings.
fn builder(clock: &ManualClock) -> StoreBuilder {
    Store::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .compact_when_free(None)
        .retention(HOUR)
        .bucket_granularity(MIN)
        .reconcile_keys_of("pay")
}

fn io(e: std::io::Error) -> Error {
    Error::Storage(e.into())
}

/// Fills `store` with every kind of state a read can show: inserted keys,
/// a completed, a failed and a stranded operation, dead letters, a pending
/// intent, an entity with delivered and parked events, tallies and kept
/// keys; then, an hour and a half later, more of each — so that the first
/// ones' tables have expired, and what must outlive expiry (dead letters,
/// the intent, the entity) is carried by the next open's start.
fn populate(store: &Store, clock: &ManualClock) -> Result<()> {
    for round in ["early", "late"] {
        let k = |id: &str| format!("{round}-{id}");
        store.insert_batch(&[Key::new("t", &k("ins-1")), Key::new("t", &k("ins-2"))])?;
        let c = started(store.begin(&Key::new("pay", &k("ok")), Fingerprint::of("a"))?);
        store.complete_with_amount(&c, b"receipt", 250)?;
        let c = started(store.begin(&Key::new("pay", &k("no")), Fingerprint::of("b"))?);
        store.fail(&c, Failure::Permanent(b"declined"))?;
        let c = started(store.begin(&Key::new("ship", &k("dead")), Fingerprint::of("c"))?);
        store.fail(
            &c,
            Failure::Exhausted {
                reason: "carrier down",
                payload: Some(b"order"),
            },
        )?;
        let intent = Intent {
            target: "carrier",
            request: b"label",
        };
        let c = started(store.begin_with_intent(
            &Key::new("ship", &k("asked")),
            Fingerprint::NONE,
            &BeginOptions::new(),
            intent,
        )?);
        store.mark_answered(&c, Answer::Unknown)?;
        // Left in progress: stranded once the store is reopened.
        std::mem::forget(c);
        let entity = Key::new("order", &k("e")).into_owned();
        store.sequence(&entity, 1, b"first")?;
        store.sequence(&entity, 3, b"third")?;
        store.advance(&Key::new("acct", &k("v")), 7)?;
        if round == "early" {
            clock.advance(HOUR + 30 * MIN);
        }
    }
    store.flush()
}

/// The keys `populate` wrote, for reads by key.
fn keys() -> Vec<Key<'static>> {
    let mut out = Vec::new();
    for round in ["early", "late"] {
        for (scope, id) in [
            ("t", "ins-1"),
            ("t", "ins-2"),
            ("t", "never"),
            ("pay", "ok"),
            ("pay", "no"),
            ("ship", "dead"),
            ("ship", "asked"),
        ] {
            out.push(Key::new(scope, &format!("{round}-{id}")).into_owned());
        }
    }
    out
}

/// Every read the store answers, as text: equal transcripts are equal
/// answers.
fn transcript(store: &Store) -> Result<Vec<String>> {
    let all = Listing::new().limit(1_000);
    let mut out = Vec::new();
    for key in keys() {
        out.push(format!("get {key:?}: {:?}", store.get(&key)?));
        out.push(format!("intent {key:?}: {:?}", store.intent(&key)?));
    }
    for round in ["early", "late"] {
        let entity = Key::new("order", &format!("{round}-e")).into_owned();
        out.push(format!("held: {:?}", store.held(&entity)?));
        out.push(format!("unacked: {:?}", store.unacked(&entity)?));
    }
    out.push(format!("dead letters: {:?}", store.dead_letters(&all)?));
    out.push(format!("stranded: {:?}", store.stranded_claims(&all)?));
    out.push(format!("holding area: {:?}", store.holding_area(&all)?));
    out.push(format!(
        "pending intents: {:?}",
        store.pending_intents(&all)?
    ));
    out.push(format!(
        "candidates: {:?}",
        store.duplicate_candidates(&all)?
    ));
    out.push(format!("tallies: {:?}", store.tallies("pay")?));
    out.push(format!("reconcile: {:?}", store.reconcile("pay", &[])?));
    let theirs = [WindowKeys::ids(
        UNIX_EPOCH + Duration::from_millis(T0_HOUR),
        ["x"],
    )];
    out.push(format!(
        "reconcile keys: {:?}",
        store.reconcile_keys("pay", &theirs, Duration::ZERO)?
    ));
    out.push(format!("format: {}", store.format()));
    if store.format() >= 5 {
        out.push(format!("verify: {}", store.verify()?));
    }
    let s = store.stats();
    out.push(format!(
        "stats: keys {} entities {} parked {} held {} unacked {} dead {} oldest {:?} \
         intents {} stranded {} kept keys {} window {:?} format {}",
        s.keys,
        s.entities,
        s.parked_now,
        s.held_now,
        s.unacked_now,
        s.dead_letters_now,
        s.oldest_dead_letter,
        s.intents_pending,
        s.stranded_claims,
        s.reconcile_keys,
        s.effective_window,
        s.format,
    ));
    Ok(out)
}

/// A file's bytes and modification time.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    bytes: Vec<u8>,
    modified: SystemTime,
}

/// Sets the file's modification time to a fixed past moment (so a write
/// within the same clock tick would still show), and returns what it holds.
fn seen(path: &Path) -> Result<Seen> {
    let past = UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    if std::fs::metadata(path)
        .map_err(io)?
        .modified()
        .map_err(io)?
        != past
    {
        let f = std::fs::File::options()
            .write(true)
            .open(path)
            .map_err(io)?;
        f.set_modified(past).map_err(io)?;
    }
    look(path)
}

/// A file's bytes and modification time, as they are.
fn look(path: &Path) -> Result<Seen> {
    Ok(Seen {
        bytes: std::fs::read(path).map_err(io)?,
        modified: std::fs::metadata(path)
            .map_err(io)?
            .modified()
            .map_err(io)?,
    })
}

/// The names in `dir`.
fn names(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(io)?;
    out.sort();
    Ok(out)
}

#[track_caller]
fn read_only_error<T: std::fmt::Debug>(what: &str, res: Result<T>, path: &Path) {
    match res {
        Err(Error::ReadOnly { path: p }) => assert_eq!(p, path, "{what}"),
        other => panic!("{what}: expected ReadOnly, got {other:?}"),
    }
}

/// Opens `path` read-only, reads everything, checks that every write is
/// refused and changed nothing, and that the file and its directory are as
/// they were. Returns the transcript.
fn read_only_session(path: &Path, clock: &ManualClock) -> Result<Vec<String>> {
    let dir = path.parent().expect("a file in a directory");
    let before = (seen(path)?, names(dir)?);
    let store = builder(clock).open_read_only(path)?;
    let read = transcript(&store)?;
    every_write_is_refused(&store, path)?;
    assert_eq!(transcript(&store)?, read, "a refused write changed nothing");
    drop(store);
    assert!(look(path)? == before.0, "the file's bytes or mtime changed");
    assert_eq!(names(dir)?, before.1, "a file was created or removed");
    Ok(read)
}

/// Every write `Store` has, on a read-only store: each answers `ReadOnly`
/// naming the path. (A `Claim` comes only from a `begin`, which is
/// refused; a claim of another store is refused too.)
fn every_write_is_refused(store: &Store, path: &Path) -> Result<()> {
    let key = Key::new("t", "early-ins-1");
    let new = Key::new("t", "brand-new");
    let entity = Key::new("order", "late-e");
    let fp = Fingerprint::NONE;
    let opts = BeginOptions::new();
    let intent = Intent {
        target: "x",
        request: b"",
    };
    read_only_error("insert (seen)", store.insert_if_absent(&key), path);
    read_only_error("insert (new)", store.insert_if_absent(&new), path);
    read_only_error("insert_for", store.insert_if_absent_for(&new, HOUR), path);
    read_only_error(
        "insert_batch",
        store.insert_batch(std::slice::from_ref(&new)),
        path,
    );
    read_only_error("begin", store.begin(&new, fp), path);
    read_only_error(
        "begin (done)",
        store.begin(&Key::new("pay", "late-ok"), fp),
        path,
    );
    read_only_error("begin_with", store.begin_with(&new, fp, &opts), path);
    read_only_error("begin_batch", store.begin_batch(&[(new.clone(), fp)]), path);
    read_only_error(
        "begin_with_intent",
        store.begin_with_intent(&new, fp, &opts, intent),
        path,
    );
    read_only_error(
        "begin_or_wait",
        store.begin_or_wait(&new, fp, Duration::ZERO),
        path,
    );
    read_only_error(
        "begin_or_wait_with",
        store.begin_or_wait_with(&new, fp, &opts, Duration::ZERO),
        path,
    );
    read_only_error("forget", store.forget(&key), path);
    read_only_error(
        "requeue",
        store.requeue(&Key::new("ship", "late-dead")),
        path,
    );
    read_only_error(
        "resolve",
        store.resolve(&Key::new("ship", "late-dead"), Resolution::Abandoned("x")),
        path,
    );
    read_only_error(
        "advance",
        store.advance(&Key::new("acct", "late-v"), 8),
        path,
    );
    read_only_error("apply_event", store.apply_event(&new, &entity, 9), path);
    read_only_error("sequence", store.sequence(&entity, 2, b"second"), path);
    read_only_error(
        "sequence_with",
        store.sequence_with(&entity, 2, b"second", &dedupkv::SequenceOptions::new()),
        path,
    );
    read_only_error("release_held", store.release_held(&entity), path);
    read_only_error("ack", store.ack(&entity, 1), path);
    read_only_error("sweep_parked", store.sweep_parked(), path);
    read_only_error("evict_expired", store.evict_expired(), path);
    read_only_error("compact", store.compact(), path);
    read_only_error("upgrade", store.upgrade(), path);
    store.flush()?; // nothing to flush: answers Ok
    writes_with_a_claim_are_refused(store, path)
}

/// The writes that take a claim, with a claim of another store (this one
/// hands out none); and writes through the async front.
fn writes_with_a_claim_are_refused(store: &Store, path: &Path) -> Result<()> {
    let (key, new) = (Key::new("t", "early-ins-1"), Key::new("t", "brand-new"));
    let fp = Fingerprint::NONE;
    let dir = tempdir();
    let other = Store::open(dir.path().join("other.redb"))?;
    let claim = started(other.begin(&new, fp)?);
    read_only_error("complete", store.complete(&claim, b"x"), path);
    read_only_error("complete_for", store.complete_for(&claim, b"x", HOUR), path);
    read_only_error("complete_value", store.complete_value(&claim, &1u8), path);
    read_only_error(
        "complete_with_amount",
        store.complete_with_amount(&claim, b"x", 1),
        path,
    );
    let batch = store.complete_batch(&[(&claim, &b"x"[..])]);
    match batch {
        Ok(each) => {
            for one in each {
                read_only_error("complete_batch (item)", one, path);
            }
        }
        Err(e) => read_only_error::<()>("complete_batch", Err(e), path),
    }
    read_only_error("fail", store.fail(&claim, Failure::Retryable), path);
    read_only_error("renew", store.renew(&claim), path);
    read_only_error("renew_for", store.renew_for(&claim, MIN), path);
    read_only_error("mark_sent", store.mark_sent(&claim, b"r"), path);
    read_only_error(
        "mark_answered",
        store.mark_answered(&claim, Answer::Refused("no")),
        path,
    );
    other.complete(&claim, b"x")?;

    // The async front wraps the same store.
    let front = AsyncStore::new(store.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(io)?;
    read_only_error(
        "async insert",
        rt.block_on(front.insert_if_absent(&new)),
        path,
    );
    read_only_error("async begin", rt.block_on(front.begin(&new, fp)), path);
    assert!(
        rt.block_on(front.get(&key)).is_ok(),
        "the async front reads"
    );
    Ok(())
}

#[test]
fn a_cleanly_closed_store_reads_as_its_writable_open_and_is_left_untouched() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    populate(&builder(&clock).open(&path)?, &clock)?;
    let read = read_only_session(&path, &clock)?;
    // A second session reads the same (nothing was written the first time).
    assert_eq!(read_only_session(&path, &clock)?, read);
    // The writable open at the same moment answers the same.
    let writable = builder(&clock).open(&path)?;
    assert_eq!(transcript(&writable)?, read);
    // Sanity: the transcript holds what `populate` made.
    let text = read.join("\n");
    for must in [
        "DeadLettered",
        "carrier down",
        "Completed",
        "Failed",
        "Unacked",
        "Tally",
    ] {
        assert!(text.contains(must), "{must} missing from:\n{text}");
    }
    Ok(())
}

/// The bytes of a redb backend.
fn bytes_of(backend: &FaultBackend) -> Result<Vec<u8>> {
    let len = backend.len().map_err(io)?;
    let mut bytes = vec![0u8; usize::try_from(len).expect("fits")];
    backend.read(0, &mut bytes).map_err(io)?;
    Ok(bytes)
}

/// A copy of `path` beside it, to open writable.
fn copy_of(path: &Path) -> Result<PathBuf> {
    let to = path.with_extension("copy");
    std::fs::copy(path, &to).map_err(io)?;
    Ok(to)
}

#[test]
fn a_crash_image_is_recovered_in_memory() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    let store = builder(&clock).open_with_backend(backend.clone())?;
    populate(&store, &clock)?;
    // A power cut now: what the syncs made durable, the store still open
    // (redb's header says it needs recovery).
    let path = dir.path().join("crash.redb");
    std::fs::write(&path, bytes_of(&backend.crash_image())?).map_err(io)?;
    drop(store);
    let writable_copy = copy_of(&path)?;
    let read = read_only_session(&path, &clock)?;
    assert_eq!(read_only_session(&path, &clock)?, read, "recovered again");
    assert_eq!(transcript(&builder(&clock).open(&writable_copy)?)?, read);
    Ok(())
}

#[test]
fn a_torn_commit_reads_as_its_writable_open_does() -> Result<()> {
    const PAGE: usize = 4096;
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    let store = builder(&clock).open_with_backend(backend.clone())?;
    populate(&store, &clock)?;
    // A commit whose pages are written, its sync held: a crash now may
    // leave any part of its pages on disk. Keep the first half of the
    // pages it changed, and the old bytes (or zeros past the old end)
    // elsewhere: a torn tail.
    let durable = backend.crash_image();
    backend.hold_syncs();
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || store.insert_if_absent(&Key::new("t", "torn")))
    };
    let old = bytes_of(&durable)?;
    let new = loop {
        let now = bytes_of(&backend.healthy())?;
        if now != old {
            break now;
        }
        std::thread::yield_now();
    };
    backend.release_syncs();
    assert!(writer.join().expect("writer").is_ok());
    drop(store);
    let changed: Vec<usize> = (0..new.len().div_ceil(PAGE))
        .filter(|p| {
            let r = p * PAGE..((p + 1) * PAGE).min(new.len());
            old.get(r.clone()) != Some(&new[r])
        })
        .collect();
    let mut torn = old.clone();
    torn.resize(new.len(), 0);
    for p in &changed[..=changed.len() / 2] {
        let r = p * PAGE..((p + 1) * PAGE).min(new.len());
        torn[r.clone()].copy_from_slice(&new[r]);
    }
    let path = dir.path().join("torn.redb");
    std::fs::write(&path, &torn).map_err(io)?;
    let writable_copy = copy_of(&path)?;
    let before = seen(&path)?;
    let read_only = match builder(&clock).open_read_only(&path) {
        Ok(store) => Ok(transcript(&store)?),
        Err(e) => Err(e),
    };
    assert!(look(&path)? == before, "the torn file changed");
    let writable = builder(&clock)
        .open(&writable_copy)
        .and_then(|s| transcript(&s));
    match (read_only, writable) {
        (Ok(r), Ok(w)) => {
            assert_eq!(r, w);
            read_only_session(&path, &clock)?;
        }
        (Err(r), Err(w)) => assert_eq!(
            r.to_string().replace(".copy", ".redb"),
            w.to_string(),
            "the same damage"
        ),
        (r, w) => panic!("read-only {r:?}, writable {w:?}"),
    }
    Ok(())
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn an_older_format_is_read_as_it_is_and_upgraded_only_by_a_writable_open() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0 + 10_000);
    let old = |b: StoreBuilder| b.clock(clock.clone()).background_eviction(false);
    for (name, read_as, written_as) in [("v3-basic.redb", 3, 3), ("v1-basic.redb", 3, 3)] {
        let path = dir.path().join(name);
        std::fs::copy(fixture(name), &path).map_err(io)?;
        let before = seen(&path)?;
        let store = old(Store::builder()).open_read_only(&path)?;
        assert_eq!(store.format(), read_as, "{name}");
        let rec = store.get(&Key::new("shop", "charge-1"))?;
        assert_eq!(
            rec.and_then(|r| r.outcome().map(<[u8]>::to_vec)),
            Some(b"receipt-1".to_vec())
        );
        assert!(matches!(store.verify(), Err(Error::NeedsUpgrade { .. })));
        read_only_error("upgrade", store.upgrade(), &path);
        drop(store);
        assert!(look(&path)? == before, "{name} changed");
        // A writable open afterwards does what it always did: a format-1
        // file is rewritten as format 3 by its first commit, a format-3
        // one kept, and upgraded when asked.
        let store = old(Store::builder()).open(&path)?;
        assert_eq!(store.format(), written_as, "{name}");
        drop(store);
        assert!(
            look(&path)?.bytes != before.bytes,
            "{name}: the writable open wrote"
        );
        assert_eq!(old(Store::builder()).upgrade(true).open(&path)?.format(), 5);
    }
    // The upgrade cannot be asked of a read-only open.
    let path = dir.path().join("v3-basic.redb");
    assert!(matches!(
        old(Store::builder()).upgrade(true).open_read_only(&path),
        Err(Error::InvalidConfig(_))
    ));
    Ok(())
}

#[test]
fn a_writer_beside_a_read_only_handle_is_not_disturbed() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let writer = builder(&clock).open(&path)?;
    populate(&writer, &clock)?;
    let names_before = names(dir.path())?;
    // The writer holds the file (and redb's lock on it): a second writer
    // is refused, a read-only open is not.
    assert!(matches!(
        builder(&clock).open(&path),
        Err(Error::AlreadyOpen)
    ));
    let reader = builder(&clock).open_read_only(&path)?;
    // (Not every read answers as the writer does: a new open carries
    // what outlives the expired tables — the early dead letter, at the
    // time of the open — and strands the writer's claims.)
    for key in keys().iter().filter(|k| k.id().starts_with(b"late-")) {
        assert_eq!(reader.get(key)?, writer.get(key)?, "{key:?}");
    }
    // The writer goes on writing and reading, undisturbed.
    for i in 0..100 {
        assert!(writer.insert_if_absent(&Key::new("t", &format!("after-{i}")))?);
    }
    let c = started(writer.begin(&Key::new("pay", "after"), Fingerprint::NONE)?);
    writer.complete(&c, b"done")?;
    assert!(writer.get(&Key::new("t", "after-99"))?.is_some());
    read_only_error(
        "insert beside the writer",
        reader.insert_if_absent(&Key::new("t", "x")),
        &path,
    );
    drop(writer);
    // With the read-only handle still open, a writer opens the store.
    let writer = builder(&clock).open(&path)?;
    assert!(writer.get(&Key::new("t", "after-99"))?.is_some());
    assert!(writer.insert_if_absent(&Key::new("t", "later"))?);
    drop(writer);
    drop(reader);
    assert_eq!(names(dir.path())?, names_before, "no file created");
    // A read-only open now sees everything the writers committed.
    let reader = builder(&clock).open_read_only(&path)?;
    assert!(reader.get(&Key::new("t", "later"))?.is_some());
    Ok(())
}

#[test]
fn a_missing_path_or_a_directory_is_a_clear_error_and_nothing_is_created() -> Result<()> {
    let dir = tempdir();
    let missing = dir.path().join("missing.redb");
    let err = Store::open_read_only(&missing).unwrap_err();
    assert!(
        matches!(&err, Error::Storage(s) if s.io_kind() == Some(std::io::ErrorKind::NotFound)),
        "{err:?}"
    );
    assert!(err.to_string().contains("missing.redb"), "{err}");
    assert!(!missing.exists(), "nothing created");

    let err = Store::open_read_only(dir.path()).unwrap_err();
    assert!(matches!(&err, Error::NotAStore(_)), "{err:?}");
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );

    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").map_err(io)?;
    let err = Store::open_read_only(&empty).unwrap_err();
    assert!(
        matches!(&err, Error::NotAStore(m) if m.contains("empty.redb")),
        "{err:?}"
    );

    let junk = dir.path().join("junk.redb");
    std::fs::write(&junk, vec![7u8; 10_000]).map_err(io)?;
    let before = seen(&junk)?;
    let err = Store::open_read_only(&junk).unwrap_err();
    assert!(matches!(&err, Error::NotAStore(_)), "{err:?}");
    assert!(look(&junk)? == before, "the file changed");

    // An empty redb database (no dedupkv tables) is not a store: the
    // read-only open does not make one in memory.
    let bare = dir.path().join("bare.redb");
    drop(
        redb::Database::create(&bare)
            .map_err(|e| Error::Storage(std::io::Error::other(e).into()))?,
    );
    let err = Store::open_read_only(&bare).unwrap_err();
    assert!(matches!(&err, Error::NotAStore(_)), "{err:?}");

    let mut left = names(dir.path())?;
    left.retain(|p| {
        !["empty.redb", "junk.redb", "bare.redb"]
            .iter()
            .any(|n| p.ends_with(n))
    });
    assert!(left.is_empty(), "created: {left:?}");
    Ok(())
}

#[test]
fn a_read_only_open_checks_the_settings_the_file_fixed() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    drop(
        Store::builder()
            .key_hashing(dedupkv::KeyHashing::Xxh3)
            .open(&path)?,
    );
    let err = Store::builder()
        .key_hashing(dedupkv::KeyHashing::SipHash13)
        .open_read_only(&path)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    Ok(())
}

#[test]
fn a_read_only_open_racing_a_writer_answers_right_or_fails_naming_the_path() -> Result<()> {
    // Stops the writer however the rounds end (a failed assertion too),
    // so a failure fails the test instead of hanging it.
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let writer = Store::builder().background_eviction(false).open(&path)?;
    let before: Vec<String> = (0..200).map(|i| format!("before-{i}")).collect();
    let keys: Vec<Key<'_>> = before.iter().map(|id| Key::new("t", id)).collect();
    writer.insert_batch(&keys)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (opened, failed) = std::thread::scope(|s| -> Result<(u32, u32)> {
        let writing = s.spawn(|| -> Result<u64> {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = format!("during-{n}");
                writer.insert_if_absent(&Key::new("t", &id))?;
                n += 1;
            }
            Ok(n)
        });
        let _stop = Stop(&stop);
        let (mut opened, mut failed) = (0, 0);
        for _ in 0..10 {
            // Either every key written before the open reads back, or the
            // open (or a read) fails as `Corrupt`, naming the file.
            let round = Store::open_read_only(&path).and_then(|reader| {
                for key in &keys {
                    let found = reader.get(key)?;
                    assert!(
                        found.is_some(),
                        "{key:?}, written before the open, reads as absent"
                    );
                }
                Ok(())
            });
            match round {
                Ok(()) => opened += 1,
                Err(Error::Corrupt(why)) => {
                    assert!(why.contains(&path.display().to_string()), "{why}");
                    failed += 1;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let wrote = writing.join().expect("writer thread")?;
        assert!(wrote > 0, "the writer kept writing");
        Ok((opened, failed))
    })?;
    eprintln!("beside a writer: {opened} read-only opens read everything, {failed} failed");
    // The writer was not disturbed: everything it was told is there.
    assert!(writer.get(&Key::new("t", "during-0"))?.is_some());
    Ok(())
}

/// Every read of `key` alone: its record, intent, history and dead letter.
fn key_reads(store: &Store, key: &Key<'_>) -> Result<String> {
    let scoped = Listing::new().scope(key.scope()).limit(1_000);
    let dead: Vec<_> = store
        .dead_letters(&scoped)?
        .items
        .into_iter()
        .filter(|d| d.key() == key)
        .collect();
    Ok(format!(
        "get {:?}\nintent {:?}\nhistory {:?}\ndead {dead:?}",
        store.get(key)?,
        store.intent(key)?,
        store.history(key)?,
    ))
}

/// The one-key open answers each key's reads as the full read-only open
/// does, on records expired and carried (the first round of `populate`),
/// forgotten, re-claimed (a lapsed lease taken over; a retry after a
/// retryable failure), in a crash image and in the journal's tail (a
/// store kept with a journal, copied while its writer holds it: every
/// commit is still in the journal), and writes nothing.
#[test]
fn a_one_key_open_reads_its_key_as_the_full_open_does() -> Result<()> {
    for journal in [None, Some(1 << 20)] {
        let dir = tempdir();
        let path = dir.path().join("s.redb");
        let clock = ManualClock::new(T0);
        let store = builder(&clock).journal(journal).open(&path)?;
        populate(&store, &clock)?;
        let fp = Fingerprint::NONE;
        let forgotten = Key::new("pay", "forgotten");
        let c = started(store.begin(&forgotten, fp)?);
        store.complete(&c, b"done")?;
        store.forget(&forgotten)?;
        let taken = Key::new("pay", "taken-over");
        std::mem::forget(started(store.begin(&taken, fp)?));
        let retried = Key::new("pay", "retried");
        let c = started(store.begin(&retried, fp)?);
        store.fail(&c, Failure::Retryable)?;
        clock.advance(MIN);
        let c = started(store.begin(&taken, fp)?);
        store.complete(&c, b"second")?;
        std::mem::forget(started(store.begin(&retried, fp)?));
        store.flush()?;
        // The writer still holds it: an image of what is durable.
        let image = dir.path().join("image.redb");
        std::fs::copy(&path, &image).map_err(io)?;
        if journal.is_some() {
            let tail = std::fs::read(dir.path().join("s.redb.journal")).map_err(io)?;
            std::fs::write(dir.path().join("image.redb.journal"), tail).map_err(io)?;
        }
        let mut all = keys();
        all.extend([forgotten, taken, retried].map(Key::into_owned));
        for at in [&image, &path] {
            let full = builder(&clock).open_read_only(at)?;
            let before = (seen(at)?, names(dir.path())?);
            let mut shown = String::new();
            for key in &all {
                let one = builder(&clock).open_read_only_key(at, key)?;
                let read = key_reads(&one, key)?;
                assert_eq!(read, key_reads(&full, key)?, "{key:?} in {at:?}");
                shown.push_str(&read);
            }
            assert!(look(at)? == before.0, "the file's bytes or mtime changed");
            assert_eq!(names(dir.path())?, before.1, "a file was created");
            for must in [
                "DeadLettered",
                "get None",
                "Forgotten",
                "attempts: 2",
                "InProgress",
            ] {
                assert!(shown.contains(must), "{must} missing from:\n{shown}");
            }
            // Another key reads as absent.
            let one = builder(&clock).open_read_only_key(at, &Key::new("pay", "late-ok"))?;
            assert!(one.get(&Key::new("pay", "late-no"))?.is_none());
        }
        drop(store);
    }
    Ok(())
}
