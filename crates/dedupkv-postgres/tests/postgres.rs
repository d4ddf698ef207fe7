//! The PostgreSQL backend against a server: the contract's conformance
//! suite, two instances racing the same keys, a lease taken over across
//! instances with the zombie refused by the database, the schema's
//! version check, two processes racing and an instance SIGKILLed mid-run.
//! The server is `DEDUPKV_PG_URL`'s (scripts/with-postgres.sh starts
//! one); without it these tests say they skipped, and under CI (`CI` set,
//! not `false` or `0`) they fail instead.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL) are not code

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dedupkv::contract::{DeadLetters, Handle, Intents, Outcome, Read, Settle, Write};
use dedupkv::{
    Answer, Began, BeginOptions, Error, Failure, Fingerprint, Forget, Intent, Key, Listing,
    Resolution, State,
};
use dedupkv_postgres::PgStore;
use dedupkv_testkit::conformance::{self, Suite};

/// The server's URL, or `None` (after saying so) when there is none and
/// this is not CI.
use dedupkv_testkit::pg_url as url;

/// A schema no other test (or earlier run) uses.
fn fresh_schema(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "t_{tag}_{}_{nanos}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn begin(
    store: &PgStore,
    key: &Key<'_>,
    opts: &BeginOptions,
) -> dedupkv::Result<Began<dedupkv_postgres::PgClaim>> {
    store.tell(store.begin(key, Fingerprint::NONE, opts, None)?)
}

/// Polls `fut` to completion on this thread (no runtime).
fn block_on<T>(fut: impl std::future::Future<Output = T>) -> T {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// The async face is written against the contract, so the same
/// `AsyncStore` runs over PostgreSQL: insert, begin, complete, a replay
/// and a repeat, and several contract calls joined in one `call`. (The
/// backend's calls make their round trip inline and answer settled: the
/// future does its I/O on the thread that polls it.)
#[test]
fn the_async_face_runs_over_postgres() -> Result<(), String> {
    let Some(url) = url("async face") else {
        return Ok(());
    };
    let store = PgStore::builder(url.as_str())
        .schema(fresh_schema("async"))
        .open()
        .map_err(|e| e.to_string())?;
    let store = dedupkv::AsyncStore::new(store);
    // Not inside a tokio runtime: the blocking `postgres` client refuses
    // to run there (see the crate's README).
    block_on(async {
        let key = Key::new("shop", "charge-1");
        assert!(store.insert_if_absent(&Key::new("shop", "evt-1")).await?);
        assert!(!store.insert_if_absent(&Key::new("shop", "evt-1")).await?);
        let Began::Started(claim) = store.begin(&key, Fingerprint::of("100")).await? else {
            panic!("the first begin starts");
        };
        store.complete(&claim, b"ch_1").await?;
        match store.begin(&key, Fingerprint::of("100")).await? {
            Began::Completed(r) => assert_eq!(r.outcome(), Some(&b"ch_1"[..])),
            other => panic!("a replay, got {other:?}"),
        }
        let (a, b) = (Key::new("shop", "evt-2"), Key::new("shop", "evt-3"));
        let both = store
            .call(|s| Ok(s.insert(&a, None)?.zip(s.insert(&b, None)?)))
            .await?;
        assert_eq!(both, (true, true));
        assert!(store.get(&key).await?.is_some());
        Ok::<(), dedupkv::Error>(())
    })
    .map_err(|e| e.to_string())
}

#[test]
fn the_postgres_backend_passes_the_conformance_suite() -> Result<(), String> {
    let Some(url) = url("conformance") else {
        return Ok(());
    };
    conformance::run(
        |clock| {
            let store = PgStore::builder(url.as_str())
                .schema(fresh_schema("conf"))
                .clock(clock)
                .open()?;
            Ok((store, ()))
        },
        Suite::default(),
    )
}

/// The conformance suite's concurrent history check: 8 threads on one
/// instance (each call on a pooled connection of its own, so the races
/// are the database's), leases lapsing between rounds, every key's calls
/// explained by the specification in some real-time order.
#[test]
fn the_postgres_backend_passes_the_concurrent_history_check() -> Result<(), String> {
    let Some(url) = url("history") else {
        return Ok(());
    };
    let done = conformance::histories(
        |clock| {
            let store = PgStore::builder(url.as_str())
                .schema(fresh_schema("hist"))
                .clock(clock)
                .open()?;
            Ok((store, ()))
        },
        &[1, 2, 3],
    )?;
    eprintln!("{done:?}");
    Ok(())
}

/// The issue's scenario: two instances on one database, every key begun
/// by both (4 threads each) at once: exactly one `Started` per key, and
/// every later `begin` replays the winner's outcome.
#[test]
fn two_instances_racing_500_keys_start_each_once() -> Result<(), Error> {
    let Some(url) = url("two_instances") else {
        return Ok(());
    };
    let schema = fresh_schema("race");
    let a = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let b = PgStore::builder(url.as_str()).schema(&schema).open()?;
    race_keys(&a, &b, 500, |c| Ok(c.provider_key()))
}

/// 4 threads on each of `a` and `b` (two instances of one schema) begin
/// the same `keys` keys, each winner completing with its claim's
/// provider key (`pk`): every key starts exactly once, and both replay
/// the winner's outcome and provider key.
fn race_keys<B>(
    a: &B,
    b: &B,
    keys: usize,
    pk: fn(&B::Claim) -> dedupkv::Result<String>,
) -> Result<(), Error>
where
    B: Write + Sync,
{
    let all: Vec<Key<'static>> = (0..keys)
        .map(|i| Key::owned(b"orders".to_vec(), format!("o-{i}").into_bytes()))
        .collect();
    let begin = |store: &B, key: &Key<'_>| {
        store.tell(store.begin(key, Fingerprint::NONE, &BeginOptions::new(), None)?)
    };
    let started: Vec<Vec<(usize, String)>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (store, all) = (if t % 2 == 0 { a } else { b }, &all);
                s.spawn(move || -> dedupkv::Result<Vec<(usize, String)>> {
                    let mut won = Vec::new();
                    for (i, key) in all.iter().enumerate() {
                        if let Began::Started(claim) = begin(store, key)? {
                            let pk = pk(&claim)?;
                            store.tell(store.complete(&claim, Outcome::raw(pk.as_bytes()))?)?;
                            won.push((i, pk));
                        }
                    }
                    Ok(won)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("racer panicked"))
            .collect::<dedupkv::Result<_>>()
    })?;
    let mut per_key = vec![0usize; keys];
    for (i, _) in started.iter().flatten() {
        per_key[*i] += 1;
    }
    assert!(
        per_key.iter().all(|&n| n == 1),
        "keys started other than once: {:?}",
        per_key
            .iter()
            .enumerate()
            .filter(|(_, n)| **n != 1)
            .collect::<Vec<_>>()
    );
    for (i, pk) in started.iter().flatten() {
        for store in [a, b] {
            let Began::Completed(rec) = begin(store, &all[*i])? else {
                panic!("key {i} is not completed");
            };
            assert_eq!(rec.outcome(), Some(pk.as_bytes()));
            assert_eq!(rec.provider_key().as_deref(), Some(pk.as_str()));
        }
    }
    Ok(())
}

/// Instance A's claim lapses (a 50 ms lease on the database's clock);
/// instance B takes the key over as attempt 2 with the same provider key;
/// A's late `complete` is refused by the database's conditional update.
#[test]
fn a_lapsed_claim_is_taken_over_across_instances_and_the_zombie_is_refused() -> Result<(), Error> {
    let Some(url) = url("takeover") else {
        return Ok(());
    };
    let schema = fresh_schema("takeover");
    let a = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let b = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let key = Key::new("payments", "charge-7");
    let short = BeginOptions::new().lease(Duration::from_millis(50));
    let Began::Started(zombie) = begin(&a, &key, &short)? else {
        panic!("A did not start");
    };
    std::thread::sleep(Duration::from_millis(200)); // past the lease, on any clock
    let Began::Started(taker) = begin(&b, &key, &BeginOptions::new())? else {
        panic!("B did not take the lapsed claim over");
    };
    assert_eq!(taker.attempt(), 2);
    assert!(taker.interrupted());
    assert_eq!(taker.provider_key(), zombie.provider_key());
    assert!(taker.token() > zombie.token());
    let refused = a.complete(&zombie, Outcome::raw(b"zombie"));
    assert!(
        matches!(refused, Err(Error::ClaimLost { .. })),
        "{refused:?}"
    );
    assert!(matches!(
        a.renew(&zombie, None),
        Err(Error::ClaimLost { .. })
    ));
    b.tell(b.complete(&taker, Outcome::raw(b"ch_2"))?)?;
    drop(zombie); // its release matches no row
    let rec = a.tell(a.get(&key)?)?.expect("recorded");
    assert_eq!(rec.state(), State::Completed);
    assert_eq!(rec.attempts(), 2);
    assert_eq!(rec.outcome(), Some(&b"ch_2"[..]));
    Ok(())
}

/// Blocks until a session of `url` is listening for finishes and has
/// marked what it waits for (a waiter of `begin_or_wait` got as far as
/// its mark, the last statement its listening session sends).
fn until_someone_listens(url: &str) -> Result<(), Error> {
    let mut c = postgres::Client::connect(url, postgres::NoTls)
        .map_err(|e| Error::Storage(std::io::Error::other(e).into()))?;
    loop {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'UPDATE % SET waited = true %'",
                &[],
            )
            .map_err(|e| Error::Storage(std::io::Error::other(e).into()))?
            .get(0);
        if n > 0 {
            // Past its LISTEN; let it reach its sleep (either way the
            // answer below must hold).
            std::thread::sleep(Duration::from_millis(200));
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Instance A begins `id` with an hour's lease; instance B waits on it
/// (up to a minute) in `begin_or_wait`; once B listens, `finish` ends A's
/// attempt. B's answer.
fn wait_on_another_instance(
    url: &str,
    id: &str,
    finish: impl FnOnce(&PgStore, dedupkv_postgres::PgClaim) -> Result<(), Error>,
) -> Result<Began<dedupkv_postgres::PgClaim>, Error> {
    let schema = fresh_schema("wait");
    let a = PgStore::builder(url).schema(&schema).open()?;
    let b = PgStore::builder(url).schema(&schema).open()?;
    let key = Key::owned(b"shop-42".to_vec(), id.as_bytes().to_vec());
    let hour = BeginOptions::new().lease(Duration::from_secs(3_600));
    let Began::Started(claim) = begin(&a, &key, &hour)? else {
        panic!("A did not start");
    };
    let minute = Duration::from_secs(60);
    std::thread::scope(|s| {
        let waiter =
            s.spawn(|| b.begin_or_wait(&key, Fingerprint::NONE, &BeginOptions::new(), minute));
        until_someone_listens(url)?;
        finish(&a, claim)?;
        waiter.join().expect("the waiter panicked")
    })
}

/// B waits on a key A holds; A completes: B is woken by the database's
/// NOTIFY and replays A's outcome. (Without the notification B would
/// sleep to its timeout and answer `InProgress`.)
#[test]
fn a_waiter_on_one_instance_is_woken_by_a_complete_on_another() -> Result<(), Error> {
    let Some(url) = url("wait_complete") else {
        return Ok(());
    };
    let got = wait_on_another_instance(&url, "charge-7", |a, claim| {
        a.tell(a.complete(&claim, Outcome::raw(b"ch_1"))?)
    })?;
    let Began::Completed(rec) = got else {
        panic!("B was not told A's outcome: {got:?}");
    };
    assert_eq!(rec.outcome(), Some(&b"ch_1"[..]));
    Ok(())
}

/// A's claim dropped unfinished (its release notifies too): B, waiting,
/// starts the next attempt, marked interrupted.
#[test]
fn a_waiter_starts_when_a_claim_on_another_instance_is_dropped() -> Result<(), Error> {
    let Some(url) = url("wait_release") else {
        return Ok(());
    };
    let got = wait_on_another_instance(&url, "charge-8", |_, claim| {
        drop(claim);
        Ok(())
    })?;
    let Began::Started(next) = &got else {
        panic!("B did not start after the release: {got:?}");
    };
    assert_eq!((next.attempt(), next.interrupted()), (2, true));
    Ok(())
}

/// With nobody finishing, the wait ends at its timeout and answers
/// `InProgress`, as `begin` would.
#[test]
fn a_wait_that_times_out_answers_in_progress() -> Result<(), Error> {
    let Some(url) = url("wait_timeout") else {
        return Ok(());
    };
    let store = PgStore::builder(url.as_str())
        .schema(fresh_schema("waitto"))
        .open()?;
    let key = Key::new("shop-42", "charge-9");
    let _held = begin(
        &store,
        &key,
        &BeginOptions::new().lease(Duration::from_secs(60)),
    )?;
    let got = store.begin_or_wait(
        &key,
        Fingerprint::NONE,
        &BeginOptions::new(),
        Duration::from_millis(100),
    )?;
    assert!(matches!(got, Began::InProgress(_)), "{got:?}");
    Ok(())
}

#[test]
fn a_fingerprint_mismatch_is_the_same_error_from_either_instance() -> Result<(), Error> {
    let Some(url) = url("fingerprint") else {
        return Ok(());
    };
    let schema = fresh_schema("fp");
    let a = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let b = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let key = Key::new("t", "op");
    let p = a.begin(
        &key,
        Fingerprint::of("card 4242"),
        &BeginOptions::new(),
        None,
    )?;
    let Began::Started(claim) = a.tell(p)? else {
        panic!("not started")
    };
    let other = b.begin(
        &key,
        Fingerprint::of("card 5555"),
        &BeginOptions::new(),
        None,
    );
    match other {
        Err(Error::FingerprintMismatch {
            recorded,
            requested,
            ..
        }) => {
            assert_eq!(recorded, Fingerprint::of("card 4242"));
            assert_eq!(requested, Fingerprint::of("card 5555"));
        }
        other => panic!("{other:?}"),
    }
    a.tell(a.complete(&claim, Outcome::raw(b""))?)?;
    Ok(())
}

#[test]
fn a_schema_from_a_newer_build_and_a_bad_schema_name_are_refused() -> Result<(), Error> {
    let Some(url) = url("schema") else {
        return Ok(());
    };
    let schema = fresh_schema("ver");
    drop(PgStore::builder(url.as_str()).schema(&schema).open()?);
    let mut client = postgres::Client::connect(&url, postgres::NoTls)
        .map_err(|e| Error::Storage(std::io::Error::other(e).into()))?;
    client
        .batch_execute(&format!(
            "UPDATE {schema}.dedupkv_schema_version SET version = 99"
        ))
        .map_err(|e| Error::Storage(std::io::Error::other(e).into()))?;
    let err = PgStore::builder(url.as_str())
        .schema(&schema)
        .open()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{schema}.dedupkv_schema_version is 99")),
        "{err}"
    );
    let err = PgStore::builder(url.as_str())
        .schema("Bad-Name")
        .open()
        .unwrap_err();
    assert!(err.to_string().contains("\"Bad-Name\""), "{err}");
    Ok(())
}

fn sql_error(e: postgres::Error) -> Error {
    Error::Storage(std::io::Error::other(e).into())
}

/// `schema` taken back to an older version by `downgrade` (SQL), then
/// opened again: the store and the version its open recorded.
fn reopened_after(url: &str, schema: &str, downgrade: &str) -> Result<(PgStore, i32), Error> {
    let mut client = postgres::Client::connect(url, postgres::NoTls).map_err(sql_error)?;
    client.batch_execute(downgrade).map_err(sql_error)?;
    let store = PgStore::builder(url).schema(schema).open()?;
    let version: i32 = client
        .query_one(
            &format!("SELECT max(version) FROM {schema}.dedupkv_schema_version"),
            &[],
        )
        .map_err(sql_error)?
        .get(0);
    Ok((store, version))
}

/// A schema made by the first build (version 1: no dead-letter or intent
/// columns) is migrated by the next open: the columns added, the current
/// version recorded, its rows kept, dead-letterable and begun with
/// intents.
#[test]
fn a_version_1_schema_is_migrated_to_the_current_version_with_its_rows() -> Result<(), Error> {
    let Some(url) = url("migrate") else {
        return Ok(());
    };
    let schema = fresh_schema("mig");
    let store = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let key = Key::new("t", "old");
    store.tell(store.insert(&key, None)?)?;
    drop(store);
    // Back to what version 1 wrote.
    let (store, version) = reopened_after(
        &url,
        &schema,
        &format!(
            "ALTER TABLE {schema}.dedupkv_keys DROP COLUMN failed_at, DROP COLUMN first_failed_at, \
             DROP COLUMN payload, DROP COLUMN intent_target, DROP COLUMN intent_settled, \
             DROP COLUMN intent_answer, DROP COLUMN intent_open, DROP COLUMN intent_ref, \
             DROP COLUMN intent_doubt, DROP COLUMN intent_data, DROP COLUMN intent_at, \
             DROP COLUMN intent_attempt, DROP COLUMN waited, DROP COLUMN round_before, \
             DROP COLUMN round_since, DROP COLUMN round_interrupted; \
             DROP TABLE {schema}.dedupkv_completions; \
             DELETE FROM {schema}.dedupkv_schema_version WHERE version > 1"
        ),
    )?;
    assert_eq!(version, dedupkv_postgres::SCHEMA_VERSION);
    assert!(
        !store.tell(store.insert(&key, None)?)?,
        "the old row is kept"
    );
    let other = Key::new("t", "new");
    let Began::Started(c) = begin(&store, &other, &BeginOptions::new())? else {
        panic!("not started");
    };
    let exhausted = Failure::Exhausted {
        reason: "gave up",
        payload: None,
    };
    store.tell(store.fail(&c, exhausted)?)?;
    assert!(matches!(
        begin(&store, &other, &BeginOptions::new())?,
        Began::DeadLettered(_)
    ));
    let intent = Intent {
        target: "carrier",
        request: b"r",
    };
    let p = store.begin(&key, Fingerprint::NONE, &BeginOptions::new(), Some(intent));
    assert!(
        matches!(store.tell(p?)?, Began::Completed(_)),
        "the old row replays"
    );
    let fresh = Key::new("t", "with-intent");
    let p = store.begin(
        &fresh,
        Fingerprint::NONE,
        &BeginOptions::new(),
        Some(intent),
    )?;
    let Began::Started(c) = store.tell(p)? else {
        panic!("not started");
    };
    store.tell(store.mark_answered(&c, Answer::Accepted(b"1Z"))?)?;
    assert_eq!(
        store
            .intent(&fresh)?
            .and_then(|e| e.reference().map(<[u8]>::to_vec)),
        Some(b"1Z".to_vec())
    );
    // Version 6's round and counts work on the migrated schema.
    store.tell(store.complete(&c, Outcome::raw(b"ok").amount(5))?)?;
    let counts = dedupkv::contract::Tallies::tallies(&store, b"t")?;
    assert_eq!(
        counts
            .iter()
            .map(|t| (t.count, t.amount))
            .collect::<Vec<_>>(),
        vec![(1, 5)]
    );
    requeued_into_a_new_round(&store, &other)
}

/// `key`, dead-lettered after its first attempt, requeued: its next
/// attempt is 2 and the first of a new round; it completes.
fn requeued_into_a_new_round(store: &PgStore, key: &Key<'_>) -> Result<(), Error> {
    assert!(store.tell(store.requeue(key)?)?);
    let again = started(store, key, &BeginOptions::new())?;
    assert_eq!(
        (
            again.attempt(),
            dedupkv::contract::SharedClaim::round_attempt(&again)
        ),
        (2, 1)
    );
    store.tell(store.complete(&again, Outcome::raw(b"ok"))?)?;
    Ok(())
}

/// A schema of version 5 (the build before: no rounds, no counts) is
/// migrated to 6 by the next open, its rows kept: a row dead-lettered
/// before is requeued into a new round.
#[test]
fn a_version_5_schema_is_migrated_to_6() -> Result<(), Error> {
    let Some(url) = url("migrate 5") else {
        return Ok(());
    };
    let schema = fresh_schema("mig5");
    let store = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let key = Key::new("t", "dead");
    let c = started(&store, &key, &BeginOptions::new())?;
    let exhausted = Failure::Exhausted {
        reason: "gave up",
        payload: None,
    };
    store.tell(store.fail(&c, exhausted)?)?;
    drop(store);
    let (store, version) = reopened_after(
        &url,
        &schema,
        &format!(
            "ALTER TABLE {schema}.dedupkv_keys DROP COLUMN round_before, DROP COLUMN round_since, \
             DROP COLUMN round_interrupted; DROP TABLE {schema}.dedupkv_completions; \
             DELETE FROM {schema}.dedupkv_schema_version WHERE version > 5"
        ),
    )?;
    assert_eq!(version, 6);
    assert!(matches!(
        begin(&store, &key, &BeginOptions::new())?,
        Began::DeadLettered(_)
    ));
    requeued_into_a_new_round(&store, &key)
}

/// The contract's intent cases (`conformance::intents`) on two
/// instances of one schema: the intent written with the claim, the five
/// answers, one provider key from every instance and attempt, and the
/// pending and duplicate listings after each history of calls.
#[test]
fn the_postgres_backend_passes_the_intent_cases() -> Result<(), String> {
    let Some(url) = url("intents") else {
        return Ok(());
    };
    let (a, b, _clock) = two_on_a_manual_clock(&url, "int", None).map_err(|e| e.to_string())?;
    conformance::intents(
        &a,
        &b,
        &conformance::Listings {
            pending: &|s: &PgStore| Ok(s.pending_intents(&Listing::new())?.items),
            duplicates: &|s: &PgStore| Ok(s.duplicate_candidates(&Listing::new())?.items),
        },
    )
}

/// Two instances on a fresh schema, both on one manual clock (and the
/// given retention).
fn two_on_a_manual_clock(
    url: &str,
    tag: &str,
    retention: Option<Duration>,
) -> Result<(PgStore, PgStore, dedupkv::ManualClock), Error> {
    let schema = fresh_schema(tag);
    let clock = dedupkv::ManualClock::new(1_700_000_000_000);
    let open = || {
        let mut b = PgStore::builder(url).schema(&schema).clock(clock.clone());
        if let Some(r) = retention {
            b = b.retention(r);
        }
        b.open()
    };
    Ok((open()?, open()?, clock))
}

/// The claim of a `begin` that started.
///
/// # Panics
/// On any other answer.
#[track_caller]
fn started(
    store: &PgStore,
    key: &Key<'_>,
    opts: &BeginOptions,
) -> Result<dedupkv_postgres::PgClaim, Error> {
    match begin(store, key, opts)? {
        Began::Started(c) => Ok(c),
        other => panic!("not started: {other:?}"),
    }
}

/// Dead letters across instances, on a manual clock: A's attempts fail
/// (retryable at +10 s, exhausted at +60 s); B is told `DeadLettered`
/// with the reason, payload, attempts and both failure times, and
/// `insert` is a duplicate; B requeues it (the next attempt is 3, a new
/// round), and it is dead-lettered again and resolved by A, both ways.
/// Requeue and resolve of a key that is not a dead letter answer `false`.
#[test]
fn dead_letters_are_shared_by_instances_requeued_and_resolved() -> Result<(), Error> {
    let Some(url) = url("dead_letters") else {
        return Ok(());
    };
    let (a, b, clock) = two_on_a_manual_clock(&url, "dead", None)?;
    let at = |ms: u64| std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + ms);
    let key = Key::new("shop-42", "ship-7");
    let none = BeginOptions::new();
    assert!(!a.tell(DeadLetters::requeue(&a, &key)?)?);
    assert!(!a.tell(a.resolve(&key, Resolution::Completed(b"x"))?)?);
    clock.advance(Duration::from_secs(10));
    let c = started(&a, &key, &none)?;
    a.tell(a.fail(&c, Failure::Retryable)?)?;
    clock.advance(Duration::from_secs(50));
    let c = started(&a, &key, &none)?;
    let exhausted = Failure::Exhausted {
        reason: "carrier down",
        payload: Some(b"order 7"),
    };
    a.tell(a.fail(&c, exhausted)?)?;
    let got = begin(&b, &key, &none)?;
    let Began::DeadLettered(dl) = &got else {
        panic!("B was told {got:?}")
    };
    assert_eq!(
        (dl.attempts(), dl.reason(), dl.payload()),
        (2, "carrier down", Some(&b"order 7"[..]))
    );
    assert_eq!(
        (dl.first_failed_at(), dl.failed_at()),
        (at(10_000), at(60_000))
    );
    let rec = b.tell(b.get(&key)?)?.expect("recorded");
    assert_eq!(rec.state(), State::DeadLettered);
    assert!(!b.tell(b.insert(&key, None)?)?, "a dead letter is present");
    // Requeued by B: attempt 3, a new round of failures.
    assert!(b.tell(DeadLetters::requeue(&b, &key)?)?);
    assert!(
        !b.tell(DeadLetters::requeue(&b, &key)?)?,
        "no longer a dead letter"
    );
    clock.advance(Duration::from_secs(5));
    let c = started(&a, &key, &none)?;
    assert_eq!((c.attempt(), c.interrupted()), (3, false));
    a.tell(a.fail(
        &c,
        Failure::Exhausted {
            reason: "still down",
            payload: None,
        },
    )?)?;
    let Began::DeadLettered(dl) = begin(&b, &key, &none)? else {
        panic!("not dead-lettered")
    };
    assert_eq!((dl.first_failed_at(), dl.payload()), (at(65_000), None));
    // Resolved as done: every later begin replays the outcome.
    assert!(a.tell(a.resolve(&key, Resolution::Completed(b"shipped by hand"))?)?);
    let Began::Completed(rec) = begin(&b, &key, &none)? else {
        panic!("not completed")
    };
    assert_eq!(rec.outcome(), Some(&b"shipped by hand"[..]));
    // Another key abandoned: a final failure with the note.
    let other = Key::new("shop-42", "ship-8");
    let c = started(&a, &other, &none)?;
    a.tell(a.fail(
        &c,
        Failure::Exhausted {
            reason: "r",
            payload: None,
        },
    )?)?;
    assert!(b.tell(b.resolve(&other, Resolution::Abandoned("refunded"))?)?);
    let Began::Completed(rec) = begin(&a, &other, &none)? else {
        panic!("not final")
    };
    assert_eq!(
        (rec.state(), rec.outcome()),
        (State::Failed, Some(&b"refunded"[..]))
    );
    Ok(())
}

/// Retention by the store's time (a manual clock here, the database's in
/// production), across instances: a record is present until its
/// retention after its last write and absent after (a key inserted again
/// is new, a claim's key begins attempt 1 of a new operation, `get` and
/// `forget` find nothing); a claim is kept to its lease end at least; a
/// dead letter never expires. `evict_expired` deletes exactly the expired
/// rows.
#[test]
fn records_expire_by_the_store_time_and_eviction_deletes_only_expired_rows() -> Result<(), Error> {
    let Some(url) = url("retention") else {
        return Ok(());
    };
    let (a, b, clock) = two_on_a_manual_clock(&url, "ret", Some(Duration::from_secs(3_600)))?;
    let none = BeginOptions::new();
    let (ins, done, short, dead, held) = (
        Key::new("t", "inserted"),
        Key::new("t", "completed"),
        Key::new("t", "short"),
        Key::new("t", "dead"),
        Key::new("t", "held"),
    );
    assert!(a.tell(a.insert(&ins, None)?)?);
    let c = started(&a, &done, &none)?;
    a.tell(a.complete(&c, Outcome::raw(b"ok"))?)?;
    let ten_s = BeginOptions::new().retention(Duration::from_secs(10));
    let c = started(&a, &short, &ten_s)?;
    a.tell(a.complete(&c, Outcome::raw(b"ok"))?)?;
    let c = started(&a, &dead, &none)?;
    a.tell(a.fail(
        &c,
        Failure::Exhausted {
            reason: "r",
            payload: None,
        },
    )?)?;
    // A lease longer than the retention: kept to its lease end.
    let two_h = BeginOptions::new().lease(Duration::from_secs(7_200));
    let _held = started(&a, &held, &two_h)?;
    clock.advance(Duration::from_secs(10));
    assert!(b.tell(b.get(&short)?)?.is_none(), "past its own retention");
    assert!(b.tell(b.get(&done)?)?.is_some());
    assert_eq!(a.evict_expired()?, 1, "only the short one");
    clock.advance(Duration::from_secs(3_580));
    assert!(
        !b.tell(b.insert(&ins, None)?)?,
        "present (a duplicate writes nothing)"
    );
    assert!(b.tell(b.get(&done)?)?.is_some());
    clock.advance(Duration::from_secs(10)); // an hour after the writes
    assert!(b.tell(b.get(&done)?)?.is_none());
    assert!(matches!(b.tell(b.forget(&done)?)?, Forget::NotFound));
    let Began::Started(again) = begin(&b, &done, &none)? else {
        panic!("not a new operation")
    };
    assert_eq!((again.attempt(), again.interrupted()), (1, false));
    drop(again); // released: kept an hour from now
    assert!(
        matches!(begin(&b, &held, &none)?, Began::InProgress(_)),
        "lease outlives retention"
    );
    assert!(matches!(begin(&b, &dead, &none)?, Began::DeadLettered(_)));
    clock.advance(Duration::from_secs(30 * 86_400));
    assert!(
        matches!(begin(&b, &dead, &none)?, Began::DeadLettered(_)),
        "never expires"
    );
    // Expired now: inserted, completed-then-released, held. Kept: the
    // dead letter.
    let deleted = b.evict_expired()?;
    assert_eq!(deleted, 3);
    assert_eq!(b.evict_expired()?, 0);
    assert!(a.tell(a.insert(&ins, None)?)?, "absent, so new");
    Ok(())
}

/// The racer child of [`two_processes_racing_10000_keys_start_each_once`]:
/// a no-op unless that test started this binary with `RACER_SCHEMA` set.
/// It begins every key with 2 threads and prints the ones it started,
/// through a `Store` over PostgreSQL if `RACER_FACE` is set, else through
/// the `PgStore` itself.
#[test]
fn racer_child() -> Result<(), Error> {
    let (Ok(url), Ok(schema)) = (
        std::env::var("DEDUPKV_PG_URL"),
        std::env::var("RACER_SCHEMA"),
    ) else {
        return Ok(());
    };
    let store = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let won = if std::env::var_os("RACER_FACE").is_some() {
        race_all(&face(store)?)?
    } else {
        race_all(&store)?
    };
    let mut out = std::io::stdout().lock();
    for i in won {
        let _ = writeln!(out, "WON {i}");
    }
    Ok(())
}

/// Begins every one of [`PROCESS_KEYS`] keys on 2 threads of `store`,
/// completing those it starts: the indexes it started.
fn race_all<B: Write + Sync>(store: &B) -> Result<Vec<usize>, Error> {
    let won: Vec<Vec<usize>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| -> dedupkv::Result<Vec<usize>> {
                    let mut won = Vec::new();
                    for i in 0..PROCESS_KEYS {
                        let key = Key::owned(b"p".to_vec(), format!("k{i}").into_bytes());
                        let began =
                            store.begin(&key, Fingerprint::NONE, &BeginOptions::new(), None);
                        if let Began::Started(c) = store.tell(began?)? {
                            store.tell(store.complete(&c, Outcome::raw(b"done"))?)?;
                            won.push(i);
                        }
                    }
                    Ok(won)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("racer panicked"))
            .collect::<dedupkv::Result<_>>()
    })?;
    Ok(won.into_iter().flatten().collect())
}

const PROCESS_KEYS: usize = 10_000;

/// Two processes (this test binary, run twice as [`racer_child`], one
/// through the `PgStore`, one through a `Store` over it) race the same
/// keys on one schema: every key started exactly once overall.
#[test]
fn two_processes_racing_10000_keys_start_each_once() -> Result<(), Error> {
    let Some(url) = url("two_processes") else {
        return Ok(());
    };
    let schema = fresh_schema("proc");
    drop(PgStore::builder(url.as_str()).schema(&schema).open()?);
    let exe = std::env::current_exe().expect("the test binary's path");
    let children: Vec<_> = (0..2)
        .map(|n| {
            let mut racer = Command::new(&exe);
            racer
                .args(["--exact", "racer_child", "--nocapture", "--test-threads=1"])
                .env("DEDUPKV_PG_URL", &url)
                .env("RACER_SCHEMA", &schema)
                .stdout(Stdio::piped());
            if n == 1 {
                racer.env("RACER_FACE", "1");
            }
            racer.spawn().expect("spawn a racer")
        })
        .collect();
    let mut per_key = vec![0usize; PROCESS_KEYS];
    for child in children {
        let out = child.wait_with_output().expect("a racer's output");
        assert!(out.status.success(), "a racer failed: {:?}", out.status);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // The harness may start the first line ("test racer_child ... ").
            if let Some((_, i)) = line.rsplit_once("WON ") {
                per_key[i.parse::<usize>().expect("a key index")] += 1;
            }
        }
    }
    let wrong: Vec<_> = per_key
        .iter()
        .enumerate()
        .filter(|(_, n)| **n != 1)
        .collect();
    assert!(wrong.is_empty(), "keys started other than once: {wrong:?}");
    Ok(())
}

/// The zombie of [`a_zombie_process_s_complete_is_refused_by_the_database`]:
/// a no-op unless that test started this binary with `ZOMBIE_SCHEMA` set.
/// It begins the key with a 50 ms lease, says so, waits for a line on
/// stdin (sent once another process took the key over), then completes
/// and prints what it was told.
#[test]
fn zombie_child() -> Result<(), Error> {
    let (Ok(url), Ok(schema)) = (
        std::env::var("DEDUPKV_PG_URL"),
        std::env::var("ZOMBIE_SCHEMA"),
    ) else {
        return Ok(());
    };
    let store = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let short = BeginOptions::new().lease(Duration::from_millis(50));
    let claim = started(&store, &Key::new("pay", "zombie"), &short)?;
    println!("STARTED");
    std::io::stdout()
        .flush()
        .map_err(|e| Error::Storage(e.into()))?;
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Error::Storage(e.into()))?;
    match store.complete(&claim, Outcome::raw(b"zombie")) {
        Err(Error::ClaimLost { .. }) => println!("COMPLETE ClaimLost"),
        other => println!("COMPLETE {other:?}"),
    }
    Ok(())
}

/// Across processes: a child process begins a key with a 50 ms lease;
/// once it lapsed this process takes the key over (attempt 2,
/// interrupted); then the child, still holding its claim, completes: the
/// database refuses it (`ClaimLost`, in the child), and the key keeps
/// this process's outcome.
#[test]
fn a_zombie_process_s_complete_is_refused_by_the_database() -> Result<(), Error> {
    use std::io::{BufRead, BufReader};
    let Some(url) = url("zombie_process") else {
        return Ok(());
    };
    let schema = fresh_schema("zombie");
    let store = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(&exe)
        .args(["--exact", "zombie_child", "--nocapture", "--test-threads=1"])
        .env("DEDUPKV_PG_URL", &url)
        .env("ZOMBIE_SCHEMA", &schema)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the zombie");
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut stdin = child.stdin.take().expect("piped");
    let key = Key::new("pay", "zombie");
    let mut race = || -> Result<(dedupkv_postgres::PgClaim, String), Error> {
        let mut seen = String::new();
        while !seen.contains("STARTED") {
            let mut line = String::new();
            let n = out.read_line(&mut line).expect("the zombie's output");
            assert!(n > 0, "the zombie ended before it started: {seen}");
            seen.push_str(&line);
        }
        std::thread::sleep(Duration::from_millis(200)); // past its lease, on any clock
        let taker = started(&store, &key, &BeginOptions::new())?;
        writeln!(stdin, "go").expect("tell the zombie");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).expect("the zombie's output");
        Ok((taker, rest))
    };
    let raced = race();
    drop(stdin);
    let status = child.wait().expect("the zombie's status");
    let (taker, rest) = raced?;
    assert!(status.success());
    assert_eq!((taker.attempt(), taker.interrupted()), (2, true));
    assert!(
        rest.contains("COMPLETE ClaimLost"),
        "the zombie was told: {rest}"
    );
    store.tell(store.complete(&taker, Outcome::raw(b"taker"))?)?;
    let rec = store.tell(store.get(&key)?)?.expect("recorded");
    assert_eq!((rec.attempts(), rec.outcome()), (2, Some(&b"taker"[..])));
    Ok(())
}

/// Bad input fails that call alone, before anything is sent, with the
/// engine's errors naming the argument.
#[test]
fn an_empty_id_and_an_outcome_over_the_limit_are_refused() -> Result<(), Error> {
    let Some(url) = url("bad_input") else {
        return Ok(());
    };
    let store = PgStore::builder(url.as_str())
        .schema(fresh_schema("bad"))
        .open()?;
    let err = store.insert(&Key::new("t", ""), None).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { what: "id", .. }),
        "{err}"
    );
    let long = vec![b'x'; dedupkv_postgres::MAX_SCOPE + 1];
    let err = begin(&store, &Key::new(&long[..], "a"), &BeginOptions::new()).unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput { what: "scope", .. }),
        "{err}"
    );
    let Began::Started(claim) = begin(&store, &Key::new("t", "a"), &BeginOptions::new())? else {
        panic!("not started")
    };
    let huge = vec![0u8; dedupkv_postgres::MAX_OUTCOME + 1];
    let err = store.complete(&claim, Outcome::raw(&huge)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                what: "outcome",
                ..
            }
        ),
        "{err}"
    );
    store.tell(store.complete(&claim, Outcome::raw(b"ok"))?)?;
    Ok(())
}

/// `get`'s record carries the row's times, by the store's clock: when the
/// operation was first recorded, when its latest record was written, and
/// when it expires (the retention after that write, a claim no earlier
/// than its lease end).
#[test]
fn get_tells_when_a_key_was_first_seen_updated_and_expires() -> Result<(), Error> {
    let Some(url) = url("times") else {
        return Ok(());
    };
    let day = Duration::from_secs(86_400);
    let (store, _other, clock) = two_on_a_manual_clock(&url, "times", Some(day))?;
    let t0 = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let key = Key::new("t", "timed");
    let c = started(&store, &key, &BeginOptions::new())?;
    let rec = store.tell(store.get(&key)?)?.expect("recorded");
    assert_eq!(
        (rec.first_seen_at(), rec.updated_at(), rec.expires_at()),
        (t0, t0, t0 + day)
    );
    clock.advance(Duration::from_secs(5));
    store.tell(store.complete(&c, Outcome::raw(b"done"))?)?;
    let rec = store.tell(store.get(&key)?)?.expect("recorded");
    let t5 = t0 + Duration::from_secs(5);
    assert_eq!(
        (rec.first_seen_at(), rec.updated_at(), rec.expires_at()),
        (t0, t5, t5 + day)
    );
    let short = Key::new("t", "short");
    store.tell(store.insert(&short, Some(Duration::from_secs(1)))?)?;
    let rec = store.tell(store.get(&short)?)?.expect("recorded");
    assert_eq!(
        (rec.first_seen_at(), rec.updated_at(), rec.expires_at()),
        (t5, t5, t5 + Duration::from_secs(1))
    );
    Ok(())
}

/// The contract's version cases (`conformance::versions`): versions only
/// move forward across the whole range, an event is handled once, and 8
/// racers on one entity leave it at the greatest.
#[test]
fn the_postgres_backend_passes_the_version_cases() -> Result<(), String> {
    let Some(url) = url("versions") else {
        return Ok(());
    };
    let store = PgStore::builder(url.as_str())
        .schema(fresh_schema("ver"))
        .open()
        .map_err(|e| e.to_string())?;
    conformance::versions(&store)
}

/// The contract's sequencer cases (`conformance::sequencer`) on two
/// instances of one schema: early events parked and never dropped, hand
/// backs in order, their leases shared by the instances, `ack`, the
/// holding area, and 8 threads on both instances delivering out of order
/// at once.
#[test]
fn the_postgres_backend_passes_the_sequencer_cases() -> Result<(), String> {
    let Some(url) = url("sequencer") else {
        return Ok(());
    };
    let (a, b, clock) = two_on_a_manual_clock(&url, "seq", None).map_err(|e| e.to_string())?;
    conformance::sequencer(&a, &b, &clock)
}

/// The contract's tally and key reconciliation cases
/// (`conformance::tallies`, `conformance::key_reconciliation`, run on the
/// engine too): completions counted per window with their amounts, in the
/// completing statement, and matched by id and provider key; directly and
/// through a `Store` over it.
#[test]
fn the_postgres_backend_passes_the_tally_cases() -> Result<(), String> {
    let Some(url) = url("tallies") else {
        return Ok(());
    };
    let (a, _, clock) = two_on_a_manual_clock(&url, "tally", None).map_err(|e| e.to_string())?;
    conformance::tallies(&a, &clock)?;
    let (b, _, clock) =
        two_on_a_manual_clock(&url, "facetally", None).map_err(|e| e.to_string())?;
    conformance::tallies(&face(b).map_err(|e| e.to_string())?, &clock)?;
    let (c, _, clock) = two_on_a_manual_clock(&url, "keys", None).map_err(|e| e.to_string())?;
    conformance::key_reconciliation(&c, &clock)?;
    let (d, _, clock) = two_on_a_manual_clock(&url, "facekeys", None).map_err(|e| e.to_string())?;
    conformance::key_reconciliation(&face(d).map_err(|e| e.to_string())?, &clock)
}

/// `sweep_parked` moves the parked events of a gap open longer than
/// `max_hold` (5 min by default) to the holding area with no later event
/// for the entity, so `release_held` hands them back; a gap not yet
/// overdue is left alone.
#[test]
fn a_sweep_holds_overdue_parked_events_for_release() -> Result<(), Error> {
    use dedupkv::contract::Order;
    use dedupkv::{SequenceOptions, Sequenced};
    let Some(url) = url("sweep_parked") else {
        return Ok(());
    };
    let (a, b, clock) = two_on_a_manual_clock(&url, "sweep", None)?;
    let (late, fresh) = (Key::new("acct", "a-1"), Key::new("acct", "a-2"));
    let none = SequenceOptions::new();
    assert_eq!(
        a.tell(a.sequence(&late, 3, b"c", &none)?)?,
        Sequenced::Parked
    );
    assert_eq!(
        a.tell(a.sequence(&late, 4, b"d", &none)?)?,
        Sequenced::Parked
    );
    clock.advance(Duration::from_secs(301));
    assert_eq!(
        b.tell(b.sequence(&fresh, 2, b"b", &none)?)?,
        Sequenced::Parked
    );
    assert!(
        a.tell(a.release_held(&late)?)?.is_empty(),
        "nothing held yet"
    );
    assert_eq!(b.sweep_parked()?, 2);
    assert_eq!(b.sweep_parked()?, 0);
    let out = a.tell(a.release_held(&late)?)?;
    assert_eq!(out.iter().map(|d| d.seq).collect::<Vec<_>>(), [3, 4]);
    assert!(a.tell(a.release_held(&fresh)?)?.is_empty(), "not overdue");
    Ok(())
}

/// Versions expire like every other record: an entity is forgotten its
/// retention after the last version applied to it (a stale one does not
/// extend it), and `evict_expired` deletes it; an entity that stores
/// events never expires.
#[test]
fn versions_expire_after_their_retention_unless_events_are_stored() -> Result<(), Error> {
    use dedupkv::contract::Order;
    use dedupkv::{Advance, SequenceOptions, Sequenced};
    let Some(url) = url("versions_expire") else {
        return Ok(());
    };
    let clock = dedupkv::ManualClock::new(1_700_000_000_000);
    let hour = Duration::from_secs(3_600);
    let store = PgStore::builder(url.as_str())
        .schema(fresh_schema("vexp"))
        .clock(clock.clone())
        .entities(dedupkv_postgres::Entities::new().retention(hour))
        .open()?;
    let (e, parked) = (Key::new("order", "o-1"), Key::new("order", "o-2"));
    let none = SequenceOptions::new();
    assert_eq!(
        store.tell(store.advance(&e, 5)?)?,
        Advance::Applied { previous: None }
    );
    assert_eq!(
        store.tell(store.sequence(&parked, 2, b"b", &none)?)?,
        Sequenced::Parked
    );
    clock.advance(Duration::from_millis(3_599_999));
    assert_eq!(
        store.tell(store.advance(&e, 3)?)?,
        Advance::Stale { current: 5 }
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        store.evict_expired()?,
        1,
        "the expired entity, not the one with an event"
    );
    assert_eq!(
        store.tell(store.advance(&e, 3)?)?,
        Advance::Applied { previous: None }
    );
    clock.advance(2 * hour);
    assert_eq!(
        store.tell(store.advance(&e, 2)?)?,
        Advance::Applied { previous: None },
        "expired, not evicted"
    );
    let Sequenced::Delivered(out) = store.tell(store.sequence(&parked, 1, b"a", &none)?)? else {
        panic!("the parked event was dropped");
    };
    assert_eq!(out.iter().map(|d| d.seq).collect::<Vec<_>>(), [1, 2]);
    Ok(())
}

/// Two instances on a fresh schema and one manual clock, retention an
/// hour: `a` with the local cache, `b` without.
fn cached_and_not(url: &str, tag: &str) -> Result<(PgStore, PgStore, dedupkv::ManualClock), Error> {
    let schema = fresh_schema(tag);
    let clock = dedupkv::ManualClock::new(1_700_000_000_000);
    let open = |cache| {
        PgStore::builder(url)
            .schema(&schema)
            .clock(clock.clone())
            .retention(Duration::from_secs(3_600))
            .cache(cache)
            .open()
    };
    Ok((open(100)?, open(0)?, clock))
}

/// A repeat `begin` or `get` of a completed key is answered from the
/// cache: no connection is taken (so no statement is sent); a repeat with
/// another request is still refused. Without the cache every repeat takes
/// one.
#[test]
fn a_repeat_of_a_completed_key_makes_no_round_trip_with_the_cache() -> Result<(), Error> {
    let Some(url) = url("cache_repeat") else {
        return Ok(());
    };
    let (a, b, _clock) = cached_and_not(&url, "cache")?;
    let k = Key::new("orders", "o-1");
    let claim = started(&a, &k, &BeginOptions::new())?;
    a.tell(a.complete(&claim, Outcome::raw(b"ch_1"))?)?;
    for store in [&a, &b] {
        assert!(matches!(
            begin(store, &k, &BeginOptions::new())?,
            Began::Completed(_)
        ));
    }
    let (before_a, before_b) = (a.checkouts(), b.checkouts());
    for _ in 0..3 {
        for store in [&a, &b] {
            let Began::Completed(rec) = begin(store, &k, &BeginOptions::new())? else {
                panic!("not completed");
            };
            assert_eq!(rec.outcome(), Some(&b"ch_1"[..]));
            let got = store.tell(store.get(&k)?)?.expect("present");
            assert_eq!(got.state(), State::Completed);
        }
    }
    assert!(matches!(
        a.begin(
            &k,
            Fingerprint::of("another request"),
            &BeginOptions::new(),
            None
        ),
        Err(Error::FingerprintMismatch { .. })
    ));
    assert_eq!(
        a.checkouts(),
        before_a,
        "the cached instance sent statements"
    );
    assert_eq!(
        b.checkouts(),
        before_b + 6,
        "one per call without the cache"
    );
    Ok(())
}

/// The cache never answers "absent" or "in progress" (the other
/// instance's completion is seen at once), and an entry ends at the
/// record's expiry and at a `forget` by its own instance. A `forget` on
/// another instance is not seen by the cache (within `cache_max_age`, as
/// documented).
#[test]
fn the_cache_never_answers_absent_or_in_progress_and_ends_at_expiry_or_forget() -> Result<(), Error>
{
    let Some(url) = url("cache_safe") else {
        return Ok(());
    };
    let (a, b, clock) = cached_and_not(&url, "csafe")?;
    let k = Key::new("orders", "o-1");
    assert!(a.tell(a.get(&k)?)?.is_none());
    let claim = started(&b, &k, &BeginOptions::new())?;
    assert!(matches!(
        begin(&a, &k, &BeginOptions::new())?,
        Began::InProgress(_)
    ));
    assert_eq!(
        a.tell(a.get(&k)?)?.map(|r| r.state()),
        Some(State::InProgress)
    );
    b.tell(b.complete(&claim, Outcome::raw(b"done"))?)?;
    let Began::Completed(rec) = begin(&a, &k, &BeginOptions::new())? else {
        panic!("not completed");
    };
    let done = (State::Completed, Some(&b"done"[..]));
    assert_eq!((rec.state(), rec.outcome()), done);
    let got = a.tell(a.get(&k)?)?.expect("present");
    assert_eq!((got.state(), got.outcome()), done);
    // Absent, then written by the other instance: seen at once.
    let k2 = Key::new("orders", "o-2");
    assert!(a.tell(a.get(&k2)?)?.is_none());
    let c2 = started(&b, &k2, &BeginOptions::new())?;
    b.tell(b.complete(&c2, Outcome::raw(b"two"))?)?;
    assert_eq!(
        a.tell(a.get(&k2)?)?.map(|r| r.state()),
        Some(State::Completed)
    );
    // A forget by this instance ends the entry.
    assert!(matches!(a.tell(a.forget(&k2)?)?, Forget::Forgotten(_)));
    let again = started(&a, &k2, &BeginOptions::new())?;
    assert_eq!(again.attempt(), 1);
    drop(again);
    // A forget on another instance is not seen within cache_max_age.
    let k3 = Key::new("orders", "o-3");
    let c3 = started(&b, &k3, &BeginOptions::new())?;
    b.tell(b.complete(&c3, Outcome::raw(b"three"))?)?;
    assert!(matches!(
        begin(&a, &k3, &BeginOptions::new())?,
        Began::Completed(_)
    ));
    assert!(matches!(b.tell(b.forget(&k3)?)?, Forget::Forgotten(_)));
    assert!(matches!(
        begin(&a, &k3, &BeginOptions::new())?,
        Began::Completed(_)
    ));
    // At the record's expiry the entry ends: a new operation starts.
    assert!(matches!(
        begin(&a, &k, &BeginOptions::new())?,
        Began::Completed(_)
    ));
    clock.advance(Duration::from_secs(3_600));
    let fresh = started(&a, &k, &BeginOptions::new())?;
    assert_eq!(fresh.attempt(), 1);
    Ok(())
}

/// The dead-letter listing is shared by instances: in the order keys
/// reached the area, by scope, up to a limit; a requeued key leaves it.
#[test]
fn dead_letters_are_listed_from_any_instance_in_order() -> Result<(), Error> {
    let Some(url) = url("dead_list") else {
        return Ok(());
    };
    let (a, b, clock) = two_on_a_manual_clock(&url, "deadlist", None)?;
    let keys = [
        Key::new("pay", "k1"),
        Key::new("ship", "k2"),
        Key::new("pay", "k3"),
    ];
    for (i, k) in keys.iter().enumerate() {
        let store = if i % 2 == 0 { &a } else { &b };
        let c = started(store, k, &BeginOptions::new())?;
        let exhausted = Failure::Exhausted {
            reason: "gave up",
            payload: Some(b"p"),
        };
        store.tell(store.fail(&c, exhausted)?)?;
        clock.advance(Duration::from_secs(1));
    }
    let ids = |page: dedupkv::Page<dedupkv::DeadLetter>| -> Vec<Vec<u8>> {
        page.items.iter().map(|d| d.key().id().to_vec()).collect()
    };
    let all = Listing::new();
    assert_eq!(ids(b.dead_letters(&all)?), [b"k1", b"k2", b"k3"]);
    assert_eq!(
        ids(a.dead_letters(&all.clone().scope("pay"))?),
        [b"k1", b"k3"]
    );
    assert_eq!(ids(a.dead_letters(&all.clone().limit(1))?), [b"k1"]);
    // k1 reached the area 3 s ago, k3 1 s ago (by the store's time).
    let old = all.clone().older_than(Duration::from_secs(2));
    assert_eq!(ids(a.dead_letters(&old)?), [b"k1", b"k2"]);
    let first = &b.dead_letters(&all.clone().limit(1))?.items[0];
    assert_eq!(
        (first.reason(), first.payload()),
        ("gave up", Some(&b"p"[..]))
    );
    assert!(b.tell(b.requeue(&keys[0])?)?);
    assert_eq!(ids(a.dead_letters(&all)?), [b"k2", b"k3"]);
    Ok(())
}

/// Listings page as the engine's: pages of 1, 2 and 3 over 9 dead
/// letters (6 of them reaching the area at the same moment, so ties are
/// broken by the key) together equal one page, each entry once, from
/// either instance; a cursor is refused by another listing and by
/// another schema's store.
#[test]
fn listings_page_with_a_cursor_across_instances() -> Result<(), Error> {
    let Some(url) = url("listing_pages") else {
        return Ok(());
    };
    let (a, b, clock) = two_on_a_manual_clock(&url, "pages", None)?;
    for i in 0..9 {
        let k = Key::owned(b"pay".to_vec(), format!("k{i}").into_bytes());
        let c = started(&a, &k, &BeginOptions::new())?;
        let exhausted = Failure::Exhausted {
            reason: "gave up",
            payload: None,
        };
        a.tell(a.fail(&c, exhausted)?)?;
        if i < 3 {
            clock.advance(Duration::from_secs(1));
        }
    }
    let whole: Vec<Key<'static>> = a
        .dead_letters(&Listing::new())?
        .items
        .iter()
        .map(|d| d.key().clone())
        .collect();
    assert_eq!(whole.len(), 9);
    for limit in [1, 2, 3] {
        let (mut listing, mut seen, mut pages) = (Listing::new().limit(limit), Vec::new(), 0);
        loop {
            let store = if pages % 2 == 0 { &a } else { &b };
            let page = store.dead_letters(&listing)?;
            assert!(page.items.len() <= limit);
            seen.extend(page.items.iter().map(|d| d.key().clone()));
            pages += 1;
            assert!(pages <= 9, "pages of {limit} never end: {seen:?}");
            match page.next {
                Some(c) => listing = listing.after(c),
                None => break,
            }
        }
        assert_eq!(seen, whole, "pages of {limit}");
        assert_eq!(pages, 9usize.div_ceil(limit), "pages of {limit}");
    }
    let cursor = a
        .dead_letters(&Listing::new().limit(1))?
        .next
        .expect("a second page");
    assert!(matches!(
        a.pending_intents(&Listing::new().after(cursor)),
        Err(Error::InvalidArgument { what: "cursor", .. })
    ));
    let other = PgStore::builder(url.as_str())
        .schema(fresh_schema("other"))
        .open()?;
    assert!(matches!(
        other.dead_letters(&Listing::new().after(cursor)),
        Err(Error::InvalidArgument { what: "cursor", .. })
    ));
    Ok(())
}

/// Random histories of one operation's calls (attempts dying unanswered,
/// the five answers, two references) made on the engine and on
/// PostgreSQL side by side: after every step both show the same intent,
/// and at the end the same pending intents and duplicate candidates (the
/// engine's rules, restated in SQL, checked against the engine).
#[test]
fn intents_answer_as_on_the_engine_over_random_histories() -> Result<(), String> {
    let Some(url) = url("intent_histories") else {
        return Ok(());
    };
    let pg = PgStore::builder(url.as_str())
        .schema(fresh_schema("ihist"))
        .open()
        .map_err(|e| e.to_string())?;
    let dir = dedupkv_testkit::tempdir();
    let engine = dedupkv::Store::open(dir.path().join("s.redb")).map_err(|e| e.to_string())?;
    let all = dedupkv::Listing::new().limit(10_000); // one page: a default one holds 100
    let on_engine = conformance::Listings {
        pending: &|s: &dedupkv::Store| Ok(s.pending_intents(&all)?.items),
        duplicates: &|s: &dedupkv::Store| Ok(s.duplicate_candidates(&all)?.items),
    };
    let on_pg = conformance::Listings {
        pending: &|s: &PgStore| Ok(s.pending_intents(&Listing::new().limit(10_000))?.items),
        duplicates: &|s: &PgStore| Ok(s.duplicate_candidates(&Listing::new().limit(10_000))?.items),
    };
    conformance::intent_histories(
        (&engine, &on_engine, &|s: &dedupkv::Store, k: &Key<'_>| {
            s.intent(k)
        }),
        (&pg, &on_pg, &|s: &PgStore, k: &Key<'_>| s.intent(k)),
        300,
    )
}

/// 16 threads insert the same 400 keys, each in its own order and half
/// with a retention of their own, grouped (the default, at 1 and 4
/// statements in flight) and one statement each: exactly one caller is
/// told each key is new, and batches of keys in different orders never
/// deadlock.
#[test]
fn concurrent_inserts_have_one_winner_per_key_grouped_or_not() -> Result<(), Error> {
    let Some(url) = url("grouped_inserts") else {
        return Ok(());
    };
    for statements in [0, 1, dedupkv_postgres::DEFAULT_GROUP_COMMIT] {
        let store = PgStore::builder(url.as_str())
            .schema(fresh_schema("group"))
            .group_commit(statements)
            .open()?;
        let won = std::thread::scope(|s| {
            let workers: Vec<_> = (0..16u32)
                .map(|t| {
                    let store = &store;
                    s.spawn(move || -> Result<u32, Error> {
                        let mut won = 0;
                        for i in 0..400u32 {
                            // Each thread its own order: a stride prime to 400.
                            let id = format!("k{}", (i * 7 + t * 31) % 400);
                            let retention = (t % 2 == 0).then(|| Duration::from_secs(60));
                            if store.tell(store.insert(&Key::new("t", id.as_str()), retention)?)? {
                                won += 1;
                            }
                            if i % 50 == 0 {
                                // A batch among the single inserts, sorted or not.
                                let ids: Vec<String> = (0..20)
                                    .map(|j| format!("k{}", (j * 13 + i + t) % 400))
                                    .collect();
                                let keys: Vec<Key<'_>> =
                                    ids.iter().map(|id| Key::new("t", id.as_str())).collect();
                                won += store
                                    .tell(store.insert_batch(&keys)?)?
                                    .iter()
                                    .filter(|&&n| n)
                                    .count() as u32;
                            }
                        }
                        Ok(won)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("worker panicked"))
                .sum::<Result<u32, Error>>()
        })?;
        assert_eq!(won, 400, "group_commit({statements}): one winner per key");
    }
    Ok(())
}

/// Batches of the same keys from 8 threads at once, over and over: each
/// statement locks the rows it meets, so rows locked in different orders
/// would deadlock (PostgreSQL then aborts one statement with an error).
/// Keys are sent in one order, so every batch succeeds.
#[test]
fn concurrent_batches_of_the_same_keys_never_deadlock() -> Result<(), Error> {
    let Some(url) = url("batch_deadlock") else {
        return Ok(());
    };
    let store = PgStore::builder(url.as_str())
        .schema(fresh_schema("dl"))
        .open()?;
    let ids: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|t| {
                let (store, ids) = (&store, &ids);
                s.spawn(move || -> Result<(), Error> {
                    for round in 0..30 {
                        let mut keys: Vec<Key<'_>> =
                            ids.iter().map(|id| Key::new("t", id.as_str())).collect();
                        if (t + round) % 2 == 1 {
                            keys.reverse();
                        }
                        store.tell(store.insert_batch(&keys)?)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("worker panicked"))
    })
}

/// Attempts nobody waits for end without a `NOTIFY` (PostgreSQL commits
/// notifying transactions one at a time); one a waiter marked notifies.
/// Deterministic: notifications arrive in commit order, so a sentinel sent
/// after the finishes comes after any notification they sent.
#[test]
fn only_attempts_someone_waits_for_notify_when_they_end() -> Result<(), Error> {
    use postgres::fallible_iterator::FallibleIterator;
    let Some(url) = url("notify_only_waited") else {
        return Ok(());
    };
    let schema = fresh_schema("nfy");
    let store = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let mut listener = postgres::Client::connect(&url, postgres::NoTls).map_err(sql_error)?;
    listener
        .batch_execute("LISTEN dedupkv_done")
        .map_err(sql_error)?;
    let payloads =
        |listener: &mut postgres::Client, sentinel: &str| -> Result<Vec<String>, Error> {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).map_err(sql_error)?;
            c.execute("SELECT pg_notify('dedupkv_done', $1)", &[&sentinel])
                .map_err(sql_error)?;
            let mut got = Vec::new();
            let mut notifications = listener.notifications();
            let mut it = notifications.timeout_iter(Duration::from_secs(60));
            while let Some(n) = it.next().map_err(sql_error)? {
                if n.payload() == sentinel {
                    return Ok(got);
                }
                got.push(n.payload().to_owned());
            }
            panic!("the sentinel {sentinel} never came");
        };
    // Completed, released and dead-lettered with nobody waiting: silence.
    for (i, end) in ["complete", "drop", "exhaust"].into_iter().enumerate() {
        let Began::Started(c) = begin(&store, &Key::new("t", end), &BeginOptions::new())? else {
            panic!("not started");
        };
        match i {
            0 => store.tell(store.complete(&c, Outcome::raw(b"ok"))?)?,
            1 => drop(c),
            _ => store.tell(store.fail(
                &c,
                Failure::Exhausted {
                    reason: "gave up",
                    payload: None,
                },
            )?)?,
        }
    }
    assert_eq!(payloads(&mut listener, "s1")?, Vec::<String>::new());
    // A waiter marks the attempt; its end notifies (the waiter times out
    // at once here: the mark stays for the attempt).
    let key = Key::new("t", "waited");
    let Began::Started(c) = begin(&store, &key, &BeginOptions::new())? else {
        panic!("not started");
    };
    let other = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let waited = other.begin_or_wait(
        &key,
        Fingerprint::NONE,
        &BeginOptions::new(),
        Duration::ZERO,
    )?;
    assert!(matches!(waited, Began::InProgress(_)), "{waited:?}");
    store.tell(store.complete(&c, Outcome::raw(b"ok"))?)?;
    let got = payloads(&mut listener, "s2")?;
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with(&format!("{schema}.")), "{got:?}");
    Ok(())
}

/// Async code may open a store, and drop a claim and the store, on a
/// runtime's thread: the blocking client's own runtime would panic there
/// ("Cannot start a runtime from within a runtime"), so these run off
/// it. The dropped claim is released (the next `begin` is attempt 2).
#[test]
fn a_store_opened_and_dropped_inside_a_tokio_runtime_does_not_panic() -> Result<(), Error> {
    let Some(url) = url("in_runtime") else {
        return Ok(());
    };
    let schema = fresh_schema("rt");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let store = std::sync::Arc::new(PgStore::builder(url.as_str()).schema(&schema).open()?);
        let s = std::sync::Arc::clone(&store);
        let claim = tokio::task::spawn_blocking(move || {
            begin(&s, &Key::new("t", "in-rt"), &BeginOptions::new())
        })
        .await
        .expect("the blocking task panicked")?;
        let Began::Started(claim) = claim else {
            panic!("not started: {claim:?}");
        };
        drop(claim); // on the runtime's thread: released off it
        drop(store); // the last handle: the pool closed off it
        Ok::<(), Error>(())
    })?;
    let store = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let Began::Started(next) = begin(&store, &Key::new("t", "in-rt"), &BeginOptions::new())? else {
        panic!("the dropped claim was not released");
    };
    assert_eq!(next.attempt(), 2);
    Ok(())
}

/// A `Store` over instance `store` (the builder's `open_shared`).
fn face(store: PgStore) -> Result<dedupkv::Store, Error> {
    dedupkv::Store::builder().open_shared(store)
}

/// The same `Store` over PostgreSQL: the whole conformance suite (every
/// call checked against the specification, and 8 threads racing one key
/// per round) driven through the face's dispatch to the shared backend,
/// and the sequencer's cases on two such stores of one schema.
#[test]
fn the_store_face_over_postgres_passes_the_conformance_suite() -> Result<(), String> {
    let Some(url) = url("store face conformance") else {
        return Ok(());
    };
    conformance::run(
        |clock| {
            let store = PgStore::builder(url.as_str())
                .schema(fresh_schema("face"))
                .clock(clock)
                .open()?;
            Ok((face(store)?, ()))
        },
        Suite::default(),
    )?;
    let (a, b, clock) = two_on_a_manual_clock(&url, "faceseq", None).map_err(|e| e.to_string())?;
    let (a, b) = (face(a), face(b));
    conformance::sequencer(
        &a.map_err(|e| e.to_string())?,
        &b.map_err(|e| e.to_string())?,
        &clock,
    )
}

/// Two `Store`s over two instances of one schema (a webhook on two
/// hosts), 4 threads each beginning the same 300 keys: each key starts
/// exactly once, its claim's provider key is the one every instance sees,
/// and both stores replay the winner's outcome.
#[test]
fn two_stores_over_postgres_start_each_key_once() -> Result<(), Error> {
    let Some(url) = url("store face race") else {
        return Ok(());
    };
    let schema = fresh_schema("facerace");
    let a = face(PgStore::builder(url.as_str()).schema(&schema).open()?)?;
    let b = face(PgStore::builder(url.as_str()).schema(&schema).open()?)?;
    race_keys(&a, &b, 300, dedupkv::Claim::provider_key)
}

/// The retry runner over a `Store` on PostgreSQL keeps the engine's
/// rounds: with `max_attempts(2)` two failures dead-letter the operation
/// (seen from the other instance); a requeue there starts a new round, so
/// the next run's work runs (attempt 3, round attempt 1) and completes. A
/// dropped claim is counted as one interruption, and the claim after it
/// says so. Without the round in the row the requeued run would be
/// refused at once (attempt 3 > 2).
#[test]
fn the_retry_runner_over_postgres_counts_attempts_per_round() -> Result<(), Error> {
    let Some(url) = url("store face rounds") else {
        return Ok(());
    };
    let (a, b, clock) = two_on_a_manual_clock(&url, "rounds", None)?;
    let (a, b) = (face(a)?, face(b)?);
    let policy = dedupkv::RetryPolicy::builder()
        .max_attempts(2)
        .clock(clock.clone())
        .build()?;
    let key = Key::new("shop", "ship-7");
    let retry = |_: &String| dedupkv::ErrorClass::Retryable;
    let fail = |_: &dedupkv::Claim| Err::<Vec<u8>, _>("carrier timeout".to_string());
    let first = policy.run(&a, &key, Fingerprint::NONE, retry, fail)?;
    let dedupkv::Run::RetryAfter { after, .. } = first else {
        panic!("the first failure is retried: {first:?}");
    };
    clock.advance(after);
    let second = policy.run(&a, &key, Fingerprint::NONE, retry, fail)?;
    assert!(
        matches!(
            second,
            dedupkv::Run::GaveUp {
                dead_lettered: true,
                ..
            }
        ),
        "{second:?}"
    );
    assert!(matches!(
        b.begin(&key, Fingerprint::NONE)?,
        Began::DeadLettered(_)
    ));
    let listed = b.dead_letters(&Listing::new())?.items;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key(), &key);
    assert!(b.requeue(&key)?);
    let mut seen = None;
    let third = policy.run(&b, &key, Fingerprint::NONE, retry, |claim| {
        seen = Some((
            claim.attempt(),
            claim.round_attempt(),
            claim.interruptions(),
        ));
        Ok::<_, String>(b"label-1".to_vec())
    })?;
    assert!(matches!(third, dedupkv::Run::Done(_)), "{third:?}");
    assert_eq!(seen, Some((3, 1, 0)));
    // A dropped claim is an interruption of its round.
    let other = Key::new("shop", "ship-8");
    let Began::Started(dropped) = a.begin(&other, Fingerprint::NONE)? else {
        panic!("ship-8 did not start");
    };
    drop(dropped);
    let Began::Started(next) = b.begin(&other, Fingerprint::NONE)? else {
        panic!("ship-8 was not released");
    };
    assert_eq!((next.attempt(), next.round_attempt()), (2, 2));
    assert!(next.interrupted());
    assert_eq!(next.interruptions(), 1);
    assert_eq!(next.first_seen_at(), next.round_started_at());
    assert!(next.lease_expires_at() > next.first_seen_at());
    let renewed = b.renew(&next)?;
    assert_eq!(next.lease_expires_at(), renewed);
    b.complete(&next, b"label-2")?;
    Ok(())
}

/// `begin_or_wait` on a `Store` over one instance answers with the
/// outcome another instance completes while it waits; a wait that times
/// out answers in progress.
#[test]
fn begin_or_wait_over_postgres_sees_another_instance_finish() -> Result<(), Error> {
    let Some(url) = url("store face wait") else {
        return Ok(());
    };
    let schema = fresh_schema("facewait");
    let a = face(PgStore::builder(url.as_str()).schema(&schema).open()?)?;
    let b = face(PgStore::builder(url.as_str()).schema(&schema).open()?)?;
    let key = Key::new("shop", "charge-9");
    let Began::Started(claim) = a.begin(&key, Fingerprint::NONE)? else {
        panic!("A did not start");
    };
    let timed_out = b.begin_or_wait(&key, Fingerprint::NONE, Duration::from_millis(120))?;
    assert!(matches!(timed_out, Began::InProgress(_)), "{timed_out:?}");
    let answer = std::thread::scope(|s| {
        let waiter = s.spawn(|| b.begin_or_wait(&key, Fingerprint::NONE, Duration::from_secs(60)));
        a.complete(&claim, b"ch_9")?;
        waiter.join().expect("waiter panicked")
    })?;
    let Began::Completed(rec) = answer else {
        panic!("the waiter was not told the outcome: {answer:?}");
    };
    assert_eq!(rec.outcome(), Some(&b"ch_9"[..]));
    Ok(())
}

/// What a `Store` over a shared backend refuses, each before anything is
/// recorded: a builder with the embedded engine's settings (naming the
/// backend), the engine's own calls (naming the call), a claim of an
/// embedded store, and a typed outcome (the backend keeps raw bytes).
#[test]
fn a_store_over_postgres_refuses_what_only_the_engine_offers() -> Result<(), Error> {
    let Some(url) = url("store face refusals") else {
        return Ok(());
    };
    let open = || {
        PgStore::builder(url.as_str())
            .schema(fresh_schema("facerefuse"))
            .open()
    };
    let refused = dedupkv::Store::builder()
        .lease(Duration::from_secs(5))
        .open_shared(open()?);
    match refused {
        Err(Error::InvalidConfig(m)) => assert!(m.contains("PgStore"), "{m}"),
        other => panic!("a builder setting was not refused: {other:?}"),
    }
    let refused = dedupkv::Store::builder()
        .clock(dedupkv::ManualClock::new(0))
        .open_shared(open()?);
    assert!(
        matches!(refused, Err(Error::InvalidConfig(_))),
        "{refused:?}"
    );
    let store = face(open()?)?;
    let key = Key::new("t", "k");
    for (call, r) in [
        ("history", store.history(&key).map(|_| ())),
        (
            "stranded_claims",
            store.stranded_claims(&Listing::new()).map(|_| ()),
        ),
        ("compact", store.compact().map(|_| ())),
        ("evict_expired", store.evict_expired().map(|_| ())),
    ] {
        match r {
            Err(Error::Unsupported { call: c, backend }) => {
                assert_eq!(c, call);
                assert!(backend.contains("PgStore"), "{backend}");
            }
            other => panic!("{call}: {other:?}"),
        }
    }
    assert_eq!(store.stats(), dedupkv::Stats::default());
    assert_eq!(store.format(), 0);
    store.flush()?;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let embedded = dedupkv::Store::open(dir.path().join("s.redb"))?;
    let Began::Started(theirs) = embedded.begin(&key, Fingerprint::NONE)? else {
        panic!("the embedded store did not start");
    };
    let Began::Started(ours) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("the shared store did not start");
    };
    let wrong = store.complete(&theirs, b"x");
    assert!(
        matches!(wrong, Err(Error::InvalidArgument { what: "claim", .. })),
        "{wrong:?}"
    );
    let wrong = embedded.complete(&ours, b"x");
    assert!(
        matches!(wrong, Err(Error::InvalidArgument { what: "claim", .. })),
        "{wrong:?}"
    );
    let typed = store.complete_value(&ours, &42u32);
    assert!(
        matches!(
            typed,
            Err(Error::Unsupported {
                call: "complete_value",
                ..
            })
        ),
        "{typed:?}"
    );
    store.complete(&ours, b"done")?;
    embedded.complete(&theirs, b"done")?;
    Ok(())
}

/// What each claim tells in one operation's life, on `store`: attempt 1
/// records an intent and is dropped (never answered); attempt 2, a plain
/// begin, fails retryable; attempt 3 completes. Per claim: attempt, round
/// attempt, interruptions, interrupted, unanswered intent.
/// What a claim tells: attempt, round attempt, interruptions,
/// interrupted, unanswered intent.
type Told = (u32, u32, u32, bool, bool);

fn claim_lives(store: &dedupkv::Store) -> Result<Vec<Told>, Error> {
    let key = Key::new("shop", "ship-9");
    let tell = |c: &dedupkv::Claim| {
        (
            c.attempt(),
            c.round_attempt(),
            c.interruptions(),
            c.interrupted(),
            c.unanswered_intent(),
        )
    };
    let intent = Intent {
        target: "carrier",
        request: b"2 parcels",
    };
    let opts = BeginOptions::new();
    let mut seen = Vec::new();
    let Began::Started(first) = store.begin_with_intent(&key, Fingerprint::NONE, &opts, intent)?
    else {
        panic!("attempt 1 did not start");
    };
    seen.push(tell(&first));
    drop(first);
    // Its call may or may not have happened: listed as pending.
    let pending = store.pending_intents(&Listing::new())?.items;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert!(store.intent(&key)?.is_some());
    let Began::Started(second) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("attempt 2 did not start");
    };
    seen.push(tell(&second));
    store.fail(&second, Failure::Retryable)?;
    let Began::Started(third) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("attempt 3 did not start");
    };
    seen.push(tell(&third));
    store.complete(&third, b"label")?;
    Ok(seen)
}

/// A claim over PostgreSQL tells what the engine's tells, step for step:
/// an attempt after one that recorded an intent and never answered is
/// interrupted, with the intent unanswered (so the runner asks the
/// provider before calling again), and the round counts it.
#[test]
fn claims_over_postgres_tell_what_the_engine_s_tell() -> Result<(), Error> {
    let Some(url) = url("claim lives") else {
        return Ok(());
    };
    let clock = dedupkv::ManualClock::new(1_700_000_000_000);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let engine = dedupkv::Store::builder()
        .clock(clock.clone())
        .open(dir.path().join("s.redb"))?;
    let pg = PgStore::builder(url.as_str())
        .schema(fresh_schema("lives"))
        .clock(clock)
        .open()?;
    let on_engine = claim_lives(&engine)?;
    assert_eq!(on_engine[1], (2, 2, 1, true, true), "{on_engine:?}");
    assert_eq!(claim_lives(&face(pg)?)?, on_engine);
    Ok(())
}

/// A claim of a store on another schema is refused by the database-side
/// checks' front door (a token is unique within one schema only), and a
/// clone of the `PgStore` given to `open_shared` reaches the backend's own
/// calls on the same pool; a typed run refuses before its work runs.
#[test]
fn a_claim_of_another_schema_is_refused_and_a_typed_run_never_runs() -> Result<(), Error> {
    let Some(url) = url("origins") else {
        return Ok(());
    };
    let (mine, theirs) = (
        PgStore::builder(url.as_str())
            .schema(fresh_schema("mine"))
            .open()?,
        PgStore::builder(url.as_str())
            .schema(fresh_schema("theirs"))
            .open()?,
    );
    let key = Key::new("t", "same-key");
    let their_claim = started(&theirs, &key, &BeginOptions::new())?;
    let my_claim = started(&mine, &key, &BeginOptions::new())?;
    for refused in [
        mine.complete(&their_claim, Outcome::raw(b"x")).map(|_| ()),
        mine.renew(&their_claim, None).map(|_| ()),
        mine.complete_batch(&[(&their_claim, b"x")]).map(|_| ()),
    ] {
        assert!(
            matches!(refused, Err(Error::InvalidArgument { what: "claim", .. })),
            "{refused:?}"
        );
    }
    mine.tell(mine.complete(&my_claim, Outcome::raw(b"mine"))?)?;
    theirs.tell(theirs.complete(&their_claim, Outcome::raw(b"theirs"))?)?;
    let own = mine.clone();
    let store = face(mine)?;
    let policy = dedupkv::RetryPolicy::new();
    let mut ran = false;
    let typed = policy.run_value(
        &store,
        &Key::new("t", "typed"),
        Fingerprint::NONE,
        |_: &String| dedupkv::ErrorClass::Retryable,
        |_| {
            ran = true;
            Ok::<u32, String>(7)
        },
    );
    assert!(
        matches!(
            typed,
            Err(Error::Unsupported {
                call: "run_value",
                ..
            })
        ),
        "{typed:?}"
    );
    assert!(
        !ran,
        "the work ran though its outcome could not be recorded"
    );
    assert!(own.tell(own.get(&Key::new("t", "typed"))?)?.is_none());
    assert_eq!(
        own.tell(own.get(&key)?)?
            .and_then(|r| r.outcome().map(<[u8]>::to_vec)),
        Some(b"mine".to_vec())
    );
    Ok(())
}

/// A `Store` over PostgreSQL reports the backend's outcome limit
/// (`Write::max_outcome_len`: `MAX_OUTCOME`), which the retry runners cut
/// what they record to, and an outcome one byte over it is refused before
/// anything is recorded (the claim stays in progress).
#[test]
fn a_store_over_postgres_reports_and_keeps_the_backend_s_outcome_limit() -> Result<(), Error> {
    let Some(url) = url("outcome limit") else {
        return Ok(());
    };
    let store = face(
        PgStore::builder(url.as_str())
            .schema(fresh_schema("limit"))
            .open()?,
    )?;
    assert_eq!(
        Write::max_outcome_len(&store),
        dedupkv_postgres::MAX_OUTCOME
    );
    let key = Key::new("shop", "ship-10");
    let Began::Started(claim) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("not started");
    };
    let over = vec![b'x'; dedupkv_postgres::MAX_OUTCOME + 1];
    let refused = store.complete(&claim, &over);
    assert!(
        matches!(refused, Err(Error::InvalidInput { .. })),
        "{refused:?}"
    );
    let at_limit = vec![b'x'; dedupkv_postgres::MAX_OUTCOME];
    store.complete(&claim, &at_limit)?;
    let rec = store.get(&key)?.expect("recorded");
    assert_eq!(
        rec.outcome().map(<[u8]>::len),
        Some(dedupkv_postgres::MAX_OUTCOME)
    );
    Ok(())
}

/// Key `i` of [`a_sigkilled_instance_loses_nothing_it_acknowledged`]'s
/// payments, its outcome and its amount.
fn payment(i: u64) -> (Key<'static>, String, i64) {
    let key = Key::owned(b"pay".to_vec(), format!("k{i}").into_bytes());
    (
        key,
        format!("paid {i}"),
        i64::try_from(i).expect("small") + 1,
    )
}

/// The instance of [`a_sigkilled_instance_loses_nothing_it_acknowledged`]:
/// a no-op unless that test started this binary with `KILL_SCHEMA` set.
/// A `Store` over PostgreSQL, 4 threads paying keys from `KILL_FROM` on:
/// each says `BEGIN i`, begins payment `i` (a 300 ms lease), completes it
/// with its amount, says `DONE i` once the completion is acknowledged,
/// then inserts `seen/i` (the grouped path) and says `INS i` once that is
/// acknowledged. It runs until it is killed (or 100,000 keys).
#[test]
fn killed_child() -> Result<(), Error> {
    let (Ok(url), Ok(schema), Ok(from)) = (
        std::env::var("DEDUPKV_PG_URL"),
        std::env::var("KILL_SCHEMA"),
        std::env::var("KILL_FROM"),
    ) else {
        return Ok(());
    };
    let from: u64 = from.parse().expect("KILL_FROM is a number");
    let store = face(PgStore::builder(url.as_str()).schema(&schema).open()?)?;
    let short = BeginOptions::new().lease(Duration::from_millis(300));
    std::thread::scope(|s| {
        for t in 0..4 {
            let (store, short) = (&store, &short);
            s.spawn(move || -> dedupkv::Result<()> {
                for i in (from + t..from + 100_000).step_by(4) {
                    let (key, paid, amount) = payment(i);
                    println!("BEGIN {i}");
                    let Began::Started(c) =
                        store.tell(Write::begin(store, &key, Fingerprint::NONE, short, None)?)?
                    else {
                        panic!("payment {i} was begun before");
                    };
                    let outcome = Outcome::raw(paid.as_bytes()).amount(amount);
                    store.tell(Write::complete(store, &c, outcome)?)?;
                    println!("DONE {i}");
                    let seen = Key::owned(b"seen".to_vec(), i.to_be_bytes().to_vec());
                    assert!(
                        store.tell(Write::insert(store, &seen, None)?)?,
                        "seen/{i} was new"
                    );
                    println!("INS {i}");
                }
                Ok(())
            });
        }
    });
    Ok(())
}

/// Durability across a real crash: 5 times, an instance (a `Store` over
/// PostgreSQL in a child process, [`killed_child`]) pays keys on 4
/// threads and is SIGKILLed mid-run, at a different point each time.
/// Every completion and insert it acknowledged is there afterwards, with
/// its outcome; every claim it left open is taken over once its lease
/// ends (on the database's clock); and once those are completed, the
/// tallies count each payment exactly once with its amount, and list each
/// id once (a completion and its count are one commit: a crash keeps both
/// or neither).
#[test]
fn a_sigkilled_instance_loses_nothing_it_acknowledged() -> Result<(), Error> {
    use dedupkv::contract::Tallies;
    use std::collections::BTreeSet;
    let Some(url) = url("sigkill") else {
        return Ok(());
    };
    let schema = fresh_schema("kill");
    let store = face(PgStore::builder(url.as_str()).schema(&schema).open()?)?;
    let mut said = Said::default();
    for round in 0..5u64 {
        said.kill_mid_run(&url, &schema, round);
    }
    let Said {
        begun,
        done,
        inserted,
    } = said;
    for &i in &done {
        let (key, paid, _) = payment(i);
        let rec = store.tell(Read::get(&store, &key)?)?;
        let rec = rec.unwrap_or_else(|| panic!("acknowledged payment {i} is lost"));
        assert_eq!(
            (rec.state(), rec.outcome()),
            (State::Completed, Some(paid.as_bytes()))
        );
    }
    for &i in &inserted {
        let seen = Key::owned(b"seen".to_vec(), i.to_be_bytes().to_vec());
        assert!(
            !store.tell(Write::insert(&store, &seen, None)?)?,
            "acknowledged seen/{i} is lost"
        );
    }
    std::thread::sleep(Duration::from_millis(400)); // past every lease, on any clock
    let (mut started_again, mut completed_unsaid) = (0, 0);
    for &i in begun.difference(&done) {
        let (key, paid, amount) = payment(i);
        let mut answer = begin_face(&store, &key)?;
        for _ in 0..50 {
            // A statement the dead instance sent may still land; its
            // lease ends 300 ms after, on the database's clock.
            let Began::InProgress(_) = answer else { break };
            std::thread::sleep(Duration::from_millis(100));
            answer = begin_face(&store, &key)?;
        }
        match answer {
            Began::Started(c) => {
                started_again += 1;
                let outcome = Outcome::raw(paid.as_bytes()).amount(amount);
                store.tell(Write::complete(&store, &c, outcome)?)?;
            }
            Began::Completed(rec) => {
                completed_unsaid += 1;
                assert_eq!(rec.outcome(), Some(paid.as_bytes()));
            }
            other => panic!("payment {i} after its lease: {other:?}"),
        }
    }
    assert!(
        started_again + completed_unsaid > 0,
        "no kill landed inside a payment"
    );
    let tallies = store.tallies(b"pay")?;
    let count: u64 = tallies.iter().map(|t| t.count).sum();
    let amount: i128 = tallies.iter().map(|t| t.amount).sum();
    let expected: i128 = begun.iter().map(|&i| i128::from(payment(i).2)).sum();
    assert_eq!(
        (count, amount),
        (begun.len() as u64, expected),
        "each payment counted once"
    );
    let ms = |t: Option<&dedupkv::Tally>| {
        t.map_or(0, |t| {
            let since = t.window_start.duration_since(std::time::UNIX_EPOCH);
            u64::try_from(since.expect("after 1970").as_millis()).expect("in range")
        })
    };
    let starts = ms(tallies.first())..=ms(tallies.last());
    let ids: Vec<Vec<u8>> = store
        .completions(b"pay", starts)?
        .into_iter()
        .map(|c| c.id)
        .collect();
    let distinct: BTreeSet<&Vec<u8>> = ids.iter().collect();
    assert_eq!(
        (ids.len(), distinct.len()),
        (begun.len(), begun.len()),
        "each id listed once"
    );
    Ok(())
}

fn begin_face(store: &dedupkv::Store, key: &Key<'_>) -> dedupkv::Result<Began<dedupkv::Claim>> {
    store.tell(Write::begin(
        store,
        key,
        Fingerprint::NONE,
        &BeginOptions::new(),
        None,
    )?)
}

/// What [`killed_child`] instances said: the payments they began, those
/// whose completion was acknowledged, and the inserts acknowledged.
#[derive(Default)]
struct Said {
    begun: std::collections::BTreeSet<u64>,
    done: std::collections::BTreeSet<u64>,
    inserted: std::collections::BTreeSet<u64>,
}

impl Said {
    /// Runs one instance from key `round * 1,000,000` on and SIGKILLs it
    /// after `20 + 37 * round` acknowledged completions, noting all it said
    /// (what it said before it died was acknowledged too).
    fn kill_mid_run(&mut self, url: &str, schema: &str, round: u64) {
        use std::io::{BufRead, BufReader};
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(&exe)
            .args(["--exact", "killed_child", "--nocapture", "--test-threads=1"])
            .env("DEDUPKV_PG_URL", url)
            .env("KILL_SCHEMA", schema)
            .env("KILL_FROM", (round * 1_000_000).to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the instance");
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let kill_after = self.done.len() as u64 + 20 + round * 37;
        let mut line = String::new();
        while (self.done.len() as u64) < kill_after {
            line.clear();
            let n = out.read_line(&mut line).expect("the instance's output");
            assert!(n > 0, "the instance ended before it was killed");
            self.note(&line);
        }
        child.kill().expect("SIGKILL the instance");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).expect("the instance's output");
        rest.lines().for_each(|line| self.note(line));
        let status = child.wait().expect("the instance's status");
        assert!(!status.success(), "the instance was killed, not ended");
    }

    /// Notes one line of [`killed_child`]'s output.
    fn note(&mut self, line: &str) {
        let Some((word, i)) = line.trim_end().rsplit_once(' ') else {
            return;
        };
        let Ok(i) = i.parse::<u64>() else {
            return;
        };
        // The harness may start the first line ("test killed_child ... ").
        let set = if word.ends_with("BEGIN") {
            &mut self.begun
        } else if word.ends_with("DONE") {
            &mut self.done
        } else if word.ends_with("INS") {
            &mut self.inserted
        } else {
            return;
        };
        set.insert(i);
    }
}

/// The clock at its ends. At 1970 (0 ms) every rule holds: a duplicate
/// insert, a claim in progress seen from the other instance, taken over
/// after its lease (attempt 2, interrupted), the zombie refused, the
/// completion counted in the window that starts at the epoch. Past the
/// database's `int8` range (`i64::MAX` ms and `u64::MAX`) every write
/// fails with an error that tells the server's SQLSTATE and message, and
/// nothing is recorded.
#[test]
fn the_clock_at_1970_keeps_every_rule_and_past_int8_fails_clearly() -> Result<(), Error> {
    use dedupkv::contract::Tallies;
    let Some(url) = url("clock ends") else {
        return Ok(());
    };
    let (a, b, clock) = two_on_a_manual_clock(&url, "epoch", None)?;
    clock.set(0);
    let (key, seen) = (Key::new("pay", "k"), Key::new("seen", "k"));
    assert!(a.tell(a.insert(&seen, None)?)?);
    assert!(!b.tell(b.insert(&seen, None)?)?);
    let zombie = started(&a, &key, &BeginOptions::new())?;
    assert!(matches!(
        begin(&b, &key, &BeginOptions::new())?,
        Began::InProgress(_)
    ));
    clock.advance(dedupkv_postgres::DEFAULT_LEASE + Duration::from_millis(1));
    let taker = started(&b, &key, &BeginOptions::new())?;
    assert_eq!((taker.attempt(), taker.interrupted()), (2, true));
    let refused = a.complete(&zombie, Outcome::raw(b"zombie"));
    assert!(matches!(
        refused.and_then(|p| a.tell(p)),
        Err(Error::ClaimLost { .. })
    ));
    b.tell(b.complete(&taker, Outcome::raw(b"paid").amount(5))?)?;
    let rec = a.tell(a.get(&key)?)?.expect("recorded");
    assert_eq!(
        (rec.state(), rec.first_seen_at()),
        (State::Completed, std::time::UNIX_EPOCH)
    );
    let tallies = a.tallies(b"pay")?;
    assert_eq!(tallies.len(), 1);
    assert_eq!(
        (tallies[0].window_start, tallies[0].count, tallies[0].amount),
        (std::time::UNIX_EPOCH, 1, 5)
    );

    for far in [i64::MAX.unsigned_abs(), u64::MAX] {
        let (a, b, clock) = two_on_a_manual_clock(&url, "far", None)?;
        clock.set(far);
        let said = |r: dedupkv::Result<String>| match r {
            Err(e @ Error::Storage(_)) => e.to_string(),
            other => panic!("at {far} ms: {other:?}"),
        };
        let inserted = a.insert(&seen, None).and_then(|p| a.tell(p));
        let text = said(inserted.map(|n| n.to_string()));
        assert!(
            text.contains("22003") && text.contains("out of range"),
            "{text}"
        );
        assert_eq!(text.matches("storage:").count(), 1, "{text}");
        let begun = begin(&a, &key, &BeginOptions::new());
        let text = said(begun.map(|b| format!("{b:?}")));
        assert!(text.contains("22003"), "{text}");
        clock.set(1_700_000_000_000);
        assert!(
            b.tell(b.get(&key)?)?.is_none(),
            "nothing recorded at {far} ms"
        );
        assert!(
            b.tell(b.insert(&seen, None)?)?,
            "nothing recorded at {far} ms"
        );
    }
    Ok(())
}

/// A server error says what the server said: a database that does not
/// exist is named with its SQLSTATE (the client's own text is only "db
/// error"), and a refused connection says so.
#[test]
fn a_connection_error_tells_what_the_server_or_the_socket_said() {
    let Some(url) = url("connection errors") else {
        return;
    };
    let missing = format!("{url} dbname=dedupkv_no_such_database");
    let err = PgStore::connect(missing.as_str()).expect_err("no such database");
    let text = err.to_string();
    assert!(
        text.contains("connecting to PostgreSQL")
            && text.contains("3D000")
            && text.contains("dedupkv_no_such_database"),
        "{text}"
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("its port").port();
    drop(listener);
    let closed = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
    let text = PgStore::connect(closed.as_str())
        .expect_err("nothing listens")
        .to_string();
    assert!(
        text.contains("connecting to PostgreSQL") && text.contains("refused"),
        "{text}"
    );
}

/// A TCP proxy in front of the server that cuts connections: each
/// connection's server side is read as protocol messages, so the cut can
/// land after the server committed and before the client hears it.
struct Cut {
    port: u16,
    /// Armed: the next statement's answer (from its `CommandComplete` on)
    /// is swallowed, and once the server says it is ready again (its
    /// commit made) the connection is closed.
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Both sides of every connection made so far.
    open: std::sync::Arc<parking_lot::Mutex<Vec<std::net::TcpStream>>>,
}

impl Cut {
    /// A proxy to `url`'s server, and the URL that goes through it.
    fn to(url: &str) -> (Cut, String) {
        use std::net::{TcpListener, TcpStream};
        let port: u16 = url
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("port="))
            .and_then(|p| p.parse().ok())
            .expect("the URL names its port");
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let cut = Cut {
            port: listener.local_addr().expect("its port").port(),
            armed: std::sync::Arc::default(),
            open: std::sync::Arc::default(),
        };
        let (armed, open) = (cut.armed.clone(), cut.open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let server = TcpStream::connect(("127.0.0.1", port)).expect("the server");
                let clone = |s: &TcpStream| s.try_clone().expect("a socket's clone");
                open.lock().extend([clone(&client), clone(&server)]);
                let (mut from_client, mut to_server) = (clone(&client), clone(&server));
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_client, &mut to_server);
                    let _ = to_server.shutdown(std::net::Shutdown::Both);
                });
                let armed = armed.clone();
                std::thread::spawn(move || Cut::answers(server, client, &armed));
            }
        });
        let proxied = url.replace(&format!("port={port}"), &format!("port={}", cut.port));
        (cut, proxied)
    }

    /// Forwards the server's messages (a type byte, a 4-byte length) to
    /// the client, unless a cut is armed at a `CommandComplete` (`C`):
    /// then nothing more is forwarded, and at the next `ReadyForQuery`
    /// (`Z`, sent after the commit) both sides are closed.
    fn answers(
        mut server: std::net::TcpStream,
        mut client: std::net::TcpStream,
        armed: &std::sync::atomic::AtomicBool,
    ) {
        use std::io::{Read as _, Write as _};
        let close = |a: &std::net::TcpStream, b: &std::net::TcpStream| {
            let _ = a.shutdown(std::net::Shutdown::Both);
            let _ = b.shutdown(std::net::Shutdown::Both);
        };
        let (mut pending, mut cutting, mut buf) = (Vec::new(), false, [0u8; 8192]);
        loop {
            let n = server.read(&mut buf).unwrap_or(0);
            if n == 0 {
                return close(&server, &client);
            }
            pending.extend_from_slice(&buf[..n]);
            let (mut at, mut out) = (0, Vec::new());
            while let Some(len) = pending
                .get(at + 1..at + 5)
                .map(|l| u32::from_be_bytes(l.try_into().expect("4 bytes")) as usize)
                .filter(|len| pending.len() > at + len)
            {
                let message = &pending[at..=at + len];
                at += len + 1;
                cutting |= message[0] == b'C' && armed.swap(false, Ordering::SeqCst);
                if !cutting {
                    out.extend_from_slice(message);
                } else if message[0] == b'Z' {
                    let _ = client.write_all(&out);
                    return close(&server, &client);
                }
            }
            pending.drain(..at);
            if client.write_all(&out).is_err() {
                return close(&server, &client);
            }
        }
    }

    /// Closes every connection made so far (a server restart, a firewall
    /// dropping idle connections).
    fn close_all(&self) {
        for s in self.open.lock().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A completion that landed but whose answer was lost (the connection cut
/// after the server's commit, before the client heard it): the retry
/// runner says so with a storage error, the key is completed as every
/// instance sees, and the next run replays the outcome without running
/// the work again; the completion is counted once.
#[test]
fn a_completion_whose_answer_is_lost_is_replayed_not_run_again() -> Result<(), Error> {
    use dedupkv::contract::Tallies;
    let Some(url) = url("lost answer") else {
        return Ok(());
    };
    let (cut, proxied) = Cut::to(&url);
    let schema = fresh_schema("lost");
    let a = face(PgStore::builder(proxied.as_str()).schema(&schema).open()?)?;
    let b = PgStore::builder(url.as_str()).schema(&schema).open()?;
    let key = Key::new("pay", "order-1");
    let policy = dedupkv::RetryPolicy::builder().build()?;
    let runs = AtomicU32::new(0);
    let work = |_: &dedupkv::Claim| {
        runs.fetch_add(1, Ordering::SeqCst);
        cut.armed.store(true, Ordering::SeqCst); // the completion's answer
        Ok::<_, String>(b"charged".to_vec())
    };
    let retry = |_: &String| dedupkv::ErrorClass::Retryable;
    match policy.run(&a, &key, Fingerprint::NONE, retry, work) {
        Err(e @ Error::Storage(_)) => {
            assert!(e.to_string().contains("connection closed"), "{e}");
        }
        other => panic!("the lost answer: {other:?}"),
    }
    let Began::Completed(rec) = begin(&b, &key, &BeginOptions::new())? else {
        panic!("the completion did not land");
    };
    assert_eq!(rec.outcome(), Some(&b"charged"[..]));
    let again = policy.run(&a, &key, Fingerprint::NONE, retry, work)?;
    assert!(
        matches!(&again, dedupkv::Run::Replayed(o) if o == b"charged"),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran again");
    let counted: u64 = b.tallies(b"pay")?.iter().map(|t| t.count).sum();
    assert_eq!(counted, 1);
    Ok(())
}

/// Every connection of a store cut at once (a server restart, a firewall
/// dropping idle connections): a call on a pooled connection that was cut
/// fails with a storage error that says so (a write's fate is unknown, so
/// it is not sent again), the broken connection leaves the pool, and the
/// store recovers within the pool's idle connections: every call after
/// succeeds.
#[test]
fn a_store_whose_connections_are_cut_recovers_on_the_next_calls() -> Result<(), Error> {
    let Some(url) = url("cut connections") else {
        return Ok(());
    };
    let (cut, proxied) = Cut::to(&url);
    let schema = fresh_schema("cutall");
    let a = face(
        PgStore::builder(proxied.as_str())
            .schema(&schema)
            .max_idle(4)
            .open()?,
    )?;
    let insert = |i: usize| {
        let key = Key::owned(b"seen".to_vec(), format!("k{i}").into_bytes());
        Write::insert(&a, &key, None).and_then(|p| a.tell(p))
    };
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || (0..50).for_each(|i| drop(insert(1000 * t + i))));
        }
    });
    cut.close_all();
    let mut failed = 0;
    let mut i = 10_000;
    while let Err(e) = insert(i) {
        assert!(
            matches!(e, Error::Storage(_)) && e.to_string().contains("connection closed"),
            "{e}"
        );
        failed += 1;
        i += 1;
        assert!(failed <= 4, "more failures than idle connections");
    }
    for i in i + 1..i + 20 {
        assert!(insert(i)?, "key {i} after the pool recovered");
    }
    Ok(())
}
