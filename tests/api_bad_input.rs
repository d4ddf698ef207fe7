//! Every bad input and unusable file gives a clear error, never a panic.

use std::time::Duration;

use dedupkv::{Begin, Durability, Error, Fingerprint, Key, KeyHashing, Result, Store};
use dedupkv_testkit::tempdir;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

#[test]
fn oversized_key_parts_and_outcomes_state_the_limit() -> Result<()> {
    let dir = tempdir();
    let store = Store::builder()
        .max_scope_len(8)
        .max_id_len(16)
        .max_outcome_len(32)
        .open(dir.path().join("s.redb"))?;
    let err = store
        .insert_if_absent(&Key::new("123456789", "id"))
        .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidInput {
            what: "scope",
            len: 9,
            limit: 8
        }
    ));
    assert_eq!(
        err.to_string(),
        "invalid input: scope is 9 bytes, the limit is 8"
    );
    let long_id = [b'i'; 17];
    assert!(matches!(
        store.begin(&Key::new("s", &long_id), Fingerprint::NONE),
        Err(Error::InvalidInput {
            what: "id",
            len: 17,
            limit: 16
        })
    ));
    assert!(matches!(
        store.get(&Key::new("s", &long_id)),
        Err(Error::InvalidInput { .. })
    ));
    // One bad key fails the whole batch before anything is recorded.
    let batch = [Key::new("s", "ok"), Key::new("s", &long_id)];
    assert!(matches!(
        store.insert_batch(&batch),
        Err(Error::InvalidInput { .. })
    ));
    assert!(
        store.insert_if_absent(&Key::new("s", "ok"))?,
        "nothing of the bad batch landed"
    );
    let Begin::Started(c) = store.begin(&Key::new("s", "op"), Fingerprint::NONE)? else {
        panic!()
    };
    let err = store.complete(&c, &[0u8; 33]).unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidInput {
            what: "outcome",
            len: 33,
            limit: 32
        }
    ));
    store.complete(&c, &[0u8; 32])?; // the claim is still usable after a rejected outcome
    Ok(())
}

/// `what` was refused as empty, and the message says so.
fn is_empty_refusal(res: Result<impl std::fmt::Debug>, what: &str) -> bool {
    match res {
        Err(err @ Error::InvalidArgument { what: w, .. }) if w == what => {
            err.to_string().contains("empty")
        }
        other => panic!("{what}: expected an empty-key refusal, got {other:?}"),
    }
}

/// An empty id is a missing key: accepting it would take every event
/// without an id for a duplicate of the first. Every call that takes a key
/// refuses an empty id or scope, and records nothing.
#[test]
fn empty_key_parts_are_refused_by_every_call() -> Result<()> {
    let dir = tempdir();
    let store = Store::open(dir.path().join("s.redb"))?;
    let ok = Key::new("s", "ok");
    for (what, key) in [("id", Key::new("s", "")), ("scope", Key::new("", "e"))] {
        let k = &key;
        assert!(is_empty_refusal(store.insert_if_absent(k), what));
        assert!(is_empty_refusal(
            store.insert_if_absent_for(k, Duration::from_secs(60)),
            what
        ));
        assert!(is_empty_refusal(store.begin(k, Fingerprint::NONE), what));
        assert!(is_empty_refusal(store.get(k), what));
        assert!(is_empty_refusal(store.advance(k, 1), what));
        assert!(is_empty_refusal(store.apply_event(k, &ok, 1), what));
        assert!(is_empty_refusal(store.apply_event(&ok, k, 1), what));
        assert!(is_empty_refusal(store.sequence(k, 1, b"p"), what));
        assert!(is_empty_refusal(store.held(k), what));
        assert!(is_empty_refusal(store.release_held(k), what));
        // One empty key fails the whole batch before anything is recorded.
        let batch = [Key::new("s", "b1"), key.clone(), Key::new("s", "b2")];
        assert!(is_empty_refusal(store.insert_batch(&batch), what));
    }
    assert_eq!(store.stats().keys, 0, "nothing was recorded");
    assert_eq!(store.stats().entities, 0, "nothing was recorded");
    assert!(store.insert_batch(&[Key::new("s", "b1"), Key::new("s", "b2")])?[0]);
    assert!(store.apply_event(&ok, &Key::new("s", "entity"), 1).is_ok());
    Ok(())
}

#[test]
fn bad_settings_are_refused_at_open() {
    let dir = tempdir();
    let p = dir.path().join("s.redb");
    let cases: Vec<(&str, dedupkv::StoreBuilder)> = vec![
        ("shards", Store::builder().shards(3)),
        ("shards", Store::builder().shards(0)),
        ("lease", Store::builder().lease(Duration::ZERO)),
        (
            "retention",
            Store::builder()
                .lease(Duration::from_secs(60))
                .retention(Duration::from_secs(10)),
        ),
        (
            "granularity",
            Store::builder().bucket_granularity(Duration::ZERO),
        ),
        (
            "granularity",
            Store::builder().bucket_granularity(Duration::from_millis(999)),
        ),
        (
            "buckets",
            Store::builder()
                .bucket_granularity(Duration::from_secs(1))
                .retention(Duration::from_secs(365 * 86_400)),
        ),
        (
            "compact_when_free",
            Store::builder().compact_when_free(Some(1.5)),
        ),
        ("max_id_len", Store::builder().max_id_len(70_000)),
        ("evict_slice_bytes", Store::builder().evict_slice_bytes(0)),
        (
            "max_delay",
            Store::builder().durability(Durability::Deferred {
                max_delay: Duration::ZERO,
            }),
        ),
    ];
    for (what, b) in cases {
        let err = b.open(&p).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{what}: {err}");
    }
}

#[test]
fn settings_fixed_at_creation_cannot_change() -> Result<()> {
    let dir = tempdir();
    let p = dir.path().join("s.redb");
    drop(
        Store::builder()
            .bucket_granularity(Duration::from_secs(10))
            .open(&p)?,
    );
    let err = Store::builder()
        .bucket_granularity(Duration::from_secs(60))
        .open(&p)
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidConfig(ref m) if m.contains("10000 ms")),
        "{err}"
    );
    let err = Store::builder()
        .key_hashing(KeyHashing::Xxh3)
        .open(&p)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)));
    // Not setting them explicitly adopts the file's.
    drop(Store::open(&p)?);
    Ok(())
}

#[test]
fn a_file_that_is_not_a_store_is_refused() {
    let dir = tempdir();
    let garbage = dir.path().join("garbage.redb");
    std::fs::write(&garbage, vec![0x5a; 10_000]).expect("write");
    let err = Store::open(&garbage).unwrap_err();
    assert!(matches!(err, Error::NotAStore(_)), "{err}");

    // A healthy redb database that belongs to someone else.
    let foreign = dir.path().join("foreign.redb");
    {
        let db = redb::Database::create(&foreign).expect("redb");
        let txn = db.begin_write().expect("txn");
        txn.open_table(TableDefinition::<u64, u64>::new("users"))
            .expect("table")
            .insert(1, 2)
            .expect("insert");
        txn.commit().expect("commit");
    }
    let err = Store::open(&foreign).unwrap_err();
    assert!(matches!(err, Error::NotAStore(_)), "{err}");
}

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("dedupkv.meta");

/// The settings checksum as `src/log/meta.rs` defines it (every format
/// keeps it): xxh3-64 of each setting's length (u32 LE) and bytes.
fn settings_sum(values: &[&[u8]]) -> u64 {
    let mut buf = Vec::new();
    for v in values {
        buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
        buf.extend_from_slice(v);
    }
    xxhash_rust::xxh3::xxh3_64(&buf)
}

/// Rewrites the file's `format` entry, resealing the settings checksum
/// if `reseal` (as a newer build would write it).
fn set_format(p: &std::path::Path, format: u32, reseal: bool) {
    let db = redb::Database::open(p).expect("redb");
    let txn = db.begin_write().expect("txn");
    {
        let mut t = txn.open_table(META).expect("meta");
        let format = format.to_le_bytes();
        t.insert("format", format.as_slice()).expect("insert");
        if reseal {
            let get = |k: &str| t.get(k).expect("get").expect(k).value().to_vec();
            let values = [
                "magic",
                "format",
                "key_hashing",
                "key_secret",
                "granularity_ms",
            ]
            .map(get);
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            let sum = settings_sum(&refs).to_le_bytes();
            t.insert("settings_sum", sum.as_slice()).expect("insert");
        }
    }
    txn.commit().expect("commit");
}

#[test]
fn a_newer_format_version_is_refused() -> Result<()> {
    let dir = tempdir();
    let p = dir.path().join("s.redb");
    drop(Store::open(&p)?);
    set_format(&p, 6, true);
    let err = Store::open(&p).unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsupportedVersion {
                found: 6,
                supported: 5
            }
        ),
        "{err}"
    );
    // Without its checksum, a "newer" format is damage, not a newer file.
    set_format(&p, 7, false);
    let err = Store::open(&p).unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains("checksum") && m.contains("damaged")),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_corrupt_log_row_is_reported_not_panicked_on() -> Result<()> {
    let dir = tempdir();
    let p = dir.path().join("s.redb");
    {
        let store = Store::open(&p)?;
        for i in 0..10 {
            store.insert_if_absent(&Key::new("t", &format!("k{i}")))?;
        }
    }
    {
        let db = redb::Database::open(&p).expect("redb");
        let read = db.begin_read().expect("read");
        let name = read
            .list_tables()
            .expect("list")
            .map(|t| t.name().to_string())
            .find(|n| n.starts_with("log."))
            .expect("a log table");
        drop(read);
        let def = TableDefinition::<u64, &[u8]>::new(&name);
        let txn = db.begin_write().expect("txn");
        {
            let mut t = txn.open_table(def).expect("table");
            let row = t
                .first()
                .expect("first")
                .map(|(k, v)| (k.value(), v.value().to_vec()));
            let (k, mut v) = row.expect("a row");
            v[10] ^= 0xff;
            t.insert(k, v.as_slice()).expect("insert");
        }
        txn.commit().expect("commit");
    }
    let err = Store::open(&p).unwrap_err();
    assert!(
        matches!(err, Error::Corrupt(ref m) if m.contains("checksum")),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_store_open_elsewhere_is_refused() -> Result<()> {
    let dir = tempdir();
    let p = dir.path().join("s.redb");
    let first = Store::open(&p)?;
    let err = Store::open(&p).unwrap_err();
    assert!(matches!(err, Error::AlreadyOpen), "{err}");
    drop(first);
    drop(Store::open(&p)?);
    Ok(())
}

/// The `format` entry of the file at `p`.
fn format_of(p: &std::path::Path) -> u32 {
    use redb::ReadableDatabase;
    let db = redb::Database::open(p).expect("redb");
    let txn = db.begin_read().expect("txn");
    let t = txn.open_table(META).expect("meta");
    let v = t
        .get("format")
        .expect("get")
        .expect("format")
        .value()
        .to_vec();
    u32::from_le_bytes(v.try_into().expect("4 bytes"))
}

#[test]
fn a_format_2_file_opens_whole_and_is_rewritten_as_the_newest_format() -> Result<()> {
    let dir = tempdir();
    let p = dir.path().join("s.redb");
    drop(Store::open(&p)?);
    assert_eq!(format_of(&p), 5, "a new file is the newest format");
    // A format-3 file (written by an earlier build) with its format set
    // back to 2, as the build before dead letters wrote it.
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v3-basic.redb");
    std::fs::copy(fixture, &p).expect("copy");
    set_format(&p, 2, true);
    // The fixture's time: its records are live.
    let clock = dedupkv::ManualClock::new(1_700_000_050_000);
    let open = || Store::builder().clock(clock.clone()).open(&p);
    {
        let store = open()?;
        assert!(!store.insert_if_absent(&dedupkv::Key::new("shop", "evt-1"))?);
        assert_eq!(store.format(), 3);
    }
    assert_eq!(
        format_of(&p),
        3,
        "the first commit rewrites it, so a format-2 build refuses the file as newer \
         (and no further: later formats wait for an explicit upgrade)"
    );
    let store = open()?;
    assert!(!store.insert_if_absent(&dedupkv::Key::new("shop", "evt-1"))?);
    Ok(())
}

/// A duration setting at its extremes opens, or is refused with a clear
/// error: never a panic.
fn opens_or_is_refused(what: &str, got: Result<Store>) {
    match got {
        Ok(_) | Err(Error::InvalidConfig(_)) => {}
        Err(e) => panic!("{what}: neither opened nor refused as a setting: {e}"),
    }
}

#[test]
fn extreme_durations_saturate_or_are_refused_never_panic() -> Result<()> {
    type Setter = fn(dedupkv::StoreBuilder, Duration) -> dedupkv::StoreBuilder;
    let setters: [(&str, Setter); 9] = [
        ("lease", |b, d| b.lease(d)),
        ("retention", |b, d| b.retention(d)),
        ("bucket_granularity", |b, d| b.bucket_granularity(d)),
        ("max_retry_window", |b, d| b.max_retry_window(d)),
        ("entity_retention", |b, d| b.entity_retention(d)),
        ("max_hold", |b, d| b.max_hold(d)),
        ("handback_lease", |b, d| b.handback_lease(d)),
        ("reconcile_window", |b, d| b.reconcile_window(d)),
        ("reconcile_retention", |b, d| b.reconcile_retention(d)),
    ];
    for (what, set) in setters {
        for d in [Duration::MAX, Duration::ZERO] {
            let dir = tempdir();
            opens_or_is_refused(
                what,
                set(Store::builder(), d).open(dir.path().join("s.redb")),
            );
        }
    }
    let dir = tempdir();
    let store = Store::open(dir.path().join("s.redb"))?;
    for (i, d) in [Duration::MAX, Duration::ZERO].into_iter().enumerate() {
        let ok_or_refused = |r: Result<()>| match r {
            Ok(()) | Err(Error::InvalidArgument { .. } | Error::InvalidConfig(_)) => {}
            Err(e) => panic!("{d:?}: {e}"),
        };
        let id = format!("k{i}");
        ok_or_refused(store.insert_if_absent_for(&Key::new("s", &id), d).map(drop));
        let opts = dedupkv::BeginOptions::new().lease(d).retention(d);
        ok_or_refused(
            store
                .begin_with(&Key::new("s", &id), Fingerprint::NONE, &opts)
                .map(drop),
        );
        ok_or_refused(
            store
                .begin_or_wait(&Key::new("w", &id), Fingerprint::NONE, d)
                .map(drop),
        );
        if let Begin::Started(c) = store.begin(&Key::new("c", &id), Fingerprint::NONE)? {
            ok_or_refused(store.renew_for(&c, d).map(drop));
            ok_or_refused(store.complete_for(&c, b"ok", d));
        }
        ok_or_refused(
            store
                .dead_letters(&dedupkv::Listing::new().older_than(d))
                .map(drop),
        );
        ok_or_refused(
            store
                .stranded_claims(&dedupkv::Listing::new().older_than(d))
                .map(drop),
        );
    }
    Ok(())
}
