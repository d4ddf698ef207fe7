//! Everything the store trusts at open is checked: a damaged byte in a
//! table name, in the settings or in a page of the file is an error that
//! says the file is damaged, never an open that silently lost records.
//!
//! The stores here are opened without redb's check of every page
//! (`verify_pages_on_open(false)`), which would report most of this damage
//! first: these tests attack dedupkv's own checks behind it
//! (`tests/log_damage.rs` sweeps both).

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedupkv::{Clock, Error, Key, ManualClock, Result, Store, StoreBuilder};
use dedupkv_testkit::{FaultBackend, Plan, tempdir};

const T0: u64 = 1_700_000_000_000;
/// Buckets written by [`write_store`], one second apart.
const BUCKETS: u64 = 8;
const PER_BUCKET: u64 = 25;

fn builder(clock: &ManualClock) -> StoreBuilder {
    Store::builder()
        .clock(clock.clone())
        .bucket_granularity(Duration::from_secs(1))
        .retention(Duration::from_secs(3_600))
        .background_eviction(false)
        .compact_when_free(None)
        .verify_pages_on_open(false)
        // These tests damage the store file's bytes and open copies of
        // that one file: redb alone, no journal beside it.
        .journal(None)
}

/// The buckets of [`write_store`] not expired at `clock`'s time.
fn live_buckets(clock: &ManualClock) -> std::ops::Range<u64> {
    let first = (clock.now_millis() / 1000).saturating_sub(T0 / 1000 + 3_600);
    first.min(BUCKETS)..BUCKETS
}

/// Ids long enough that a bucket's 25 rows span several redb pages.
fn id(b: u64, i: u64) -> String {
    format!("k{b}-{i}-{}", "x".repeat(200))
}

/// A store at `path` with [`BUCKETS`] bucket tables of [`PER_BUCKET`] keys.
fn write_store(path: &Path, clock: &ManualClock) -> Result<()> {
    let store = builder(clock).open(path)?;
    for b in 0..BUCKETS {
        for i in 0..PER_BUCKET {
            assert!(store.insert_if_absent(&Key::new("s", &id(b, i)))?);
        }
        clock.advance(Duration::from_secs(1));
    }
    Ok(())
}

/// Opens a damaged copy: either it is refused as damaged, or every record
/// of the buckets not expired at `clock` is there and a commit works.
/// Returns whether it opened, or what went wrong.
fn open_whole_or_refused(path: &Path, clock: &ManualClock) -> Result<bool, String> {
    let live = live_buckets(clock);
    match builder(clock).open(path) {
        Ok(store) => {
            let keys = store.stats().keys;
            if keys != (live.end - live.start) * PER_BUCKET {
                return Err(format!("opened with {keys} keys"));
            }
            for b in live {
                for i in 0..PER_BUCKET {
                    let k = id(b, i);
                    if !matches!(store.get(&Key::new("s", &k)), Ok(Some(_))) {
                        return Err(format!("opened without {k}"));
                    }
                }
            }
            match store.insert_if_absent(&Key::new("s", "after")) {
                Ok(true) => Ok(true),
                other => Err(format!("opened, then a commit gave {other:?}")),
            }
        }
        Err(Error::Corrupt(msg)) if msg.contains("damaged") => Ok(false),
        Err(e) => Err(format!("{e:?}")),
    }
}

/// Runs `cases` (what, bytes) through [`open_whole_or_refused`]; panics
/// with every case that went wrong. Returns (refused, opened).
fn sweep(
    dir: &Path,
    clock: &ManualClock,
    cases: impl Iterator<Item = (String, Vec<u8>)>,
) -> (usize, usize) {
    let copy = dir.join("copy.redb");
    let (mut refused, mut opened) = (0, 0);
    let mut wrong = Vec::new();
    for (what, bytes) in cases {
        std::fs::write(&copy, &bytes).expect("write");
        match open_whole_or_refused(&copy, clock) {
            Ok(true) => opened += 1,
            Ok(false) => refused += 1,
            Err(e) => wrong.push(format!("{what}: {e}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} cases went wrong (refused {refused}, opened {opened}):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    (refused, opened)
}

fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

/// The pages holding `needle` that the store reads: zeroing one of them
/// changes what opens (old copies that redb freed do not).
fn live_pages(dir: &Path, bytes: &[u8], clock: &ManualClock, needle: &[u8]) -> Vec<usize> {
    let copy = dir.join("probe.redb");
    let mut pages: Vec<usize> = find_all(bytes, needle).iter().map(|at| at / 4096).collect();
    pages.dedup();
    pages.retain(|&page| {
        let mut bad = bytes.to_vec();
        bad[page * 4096..(page + 1) * 4096].fill(0);
        std::fs::write(&copy, &bad).expect("write");
        !matches!(open_whole_or_refused(&copy, clock), Ok(true))
    });
    pages
}

fn fresh(dir: &Path) -> Result<(PathBuf, Vec<u8>, ManualClock)> {
    let clock = ManualClock::new(T0);
    let path = dir.join("s.redb");
    write_store(&path, &clock)?;
    let bytes = std::fs::read(&path).expect("read");
    Ok((path, bytes, clock))
}

#[test]
fn a_flipped_byte_in_a_table_name_never_drops_a_bucket() -> Result<()> {
    let dir = tempdir();
    let (_path, bytes, clock) = fresh(dir.path())?;
    let pages = live_pages(dir.path(), &bytes, &clock, b"log.00");
    let names: Vec<usize> = find_all(&bytes, b"log.00")
        .into_iter()
        .filter(|at| pages.contains(&(at / 4096)))
        .collect();
    assert!(
        names.len() >= BUCKETS as usize,
        "the table names are in the file"
    );
    let cases = names.iter().flat_map(|&at| {
        let bytes = &bytes;
        (at..at + 16).flat_map(move |pos| {
            [0x01, 0x40].into_iter().map(move |mask| {
                let mut bad = bytes.clone();
                bad[pos] ^= mask;
                (format!("byte {pos} ^ {mask:#x}"), bad)
            })
        })
    });
    let (refused, _) = sweep(dir.path(), &clock, cases);
    assert!(refused > 0, "some flips hit the live table names");
    Ok(())
}

/// Every byte of the page that holds `dedupkv.meta`'s entries, flipped in
/// turn: the settings checksum and the manifest catch what redb does not.
#[test]
fn a_flipped_byte_in_the_metadata_is_reported() -> Result<()> {
    let dir = tempdir();
    let (_path, bytes, clock) = fresh(dir.path())?;
    let mut cases = Vec::new();
    // The entries' values lie in key order after their keys, and "magic"
    // is followed by "manifest" and "settings_sum" only: the node ends
    // within 64 bytes of it (the rest of the page is not the node's).
    for page in live_pages(dir.path(), &bytes, &clock, b"dedupkv store") {
        let magic = find_all(&bytes[page * 4096..(page + 1) * 4096], b"dedupkv store")[0];
        for pos in page * 4096..page * 4096 + magic + 13 + 64 {
            let mut bad = bytes.clone();
            bad[pos] ^= 0x04;
            cases.push((format!("meta byte {pos}"), bad));
        }
    }
    assert!(
        cases.len() > 100,
        "the sweep covers the metadata ({})",
        cases.len()
    );
    let (refused, _) = sweep(dir.path(), &clock, cases.into_iter());
    assert!(refused > 0);
    Ok(())
}

#[test]
fn metadata_missing_beside_log_tables_is_damage_not_a_foreign_file() -> Result<()> {
    let dir = tempdir();
    let (path, mut bytes, clock) = fresh(dir.path())?;
    for at in find_all(&bytes, b"dedupkv.meta") {
        bytes[at + 7] ^= 0x01; // "dedupkv/meta"
    }
    std::fs::write(&path, &bytes).expect("write");
    let err = builder(&clock).open(&path).expect_err("damaged");
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains("dedupkv.meta")),
        "{err}"
    );
    // With redb's page check (the default), redb reports it first.
    let err = builder(&clock)
        .verify_pages_on_open(true)
        .open(&path)
        .expect_err("damaged");
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains("damaged")),
        "{err}"
    );
    Ok(())
}

/// The disk fills up at every point of the open in turn: the open fails
/// and says why, or it succeeds and the store works.
#[test]
fn a_full_disk_at_open_fails_the_open_and_names_the_cause() -> Result<()> {
    let backend = FaultBackend::new();
    let open = |b: FaultBackend| {
        Store::builder()
            .background_eviction(false)
            .open_with_backend(b)
    };
    {
        let store = open(backend.clone())?;
        assert!(store.insert_if_absent(&Key::new("d", "before"))?);
    }
    let mut failed = 0;
    for n in 0..40 {
        let full = backend.healthy();
        full.arm(Plan::after(n).disk_full());
        match open(full.clone()) {
            Err(err) => {
                assert!(
                    matches!(&err, Error::Storage(_)) && err.to_string().contains("No space left"),
                    "after {n} writes: {err}"
                );
                failed += 1;
            }
            Ok(store) => {
                // Whatever open had to write is written: the store works
                // once the disk has room again.
                full.disarm();
                let flushed = store.flush();
                assert!(flushed.is_ok(), "after {n} writes: {flushed:?}");
                assert!(store.get(&Key::new("d", "before"))?.is_some());
                assert!(store.insert_if_absent(&Key::new("d", &format!("new-{n}")))?);
            }
        }
    }
    assert!(failed > 1, "the open wrote more than once");
    let store = open(backend.healthy())?;
    assert!(!store.insert_if_absent(&Key::new("d", "before"))?);
    Ok(())
}

/// One zeroed 4 KiB page at a time: the open refuses the file as damaged,
/// or it has every record and commits.
#[test]
fn a_zeroed_page_is_refused_as_damaged_or_harmless() -> Result<()> {
    let dir = tempdir();
    let (path, _, _) = fresh(dir.path())?;
    let clock = ManualClock::new(T0 + (3_600 + BUCKETS / 2) * 1000 + 500);
    assert_eq!(live_buckets(&clock), BUCKETS / 2..BUCKETS);
    // Closed right after a commit that deleted tables: redb frees their
    // pages in the commits that follow, reading pages that open does not.
    drop(builder(&clock).open(&path)?);
    let bytes = std::fs::read(&path).expect("read");
    let cases = (0..bytes.len() / 4096).map(|page| {
        let mut bad = bytes.clone();
        bad[page * 4096..(page + 1) * 4096].fill(0);
        (format!("page {page}"), bad)
    });
    let (refused, opened) = sweep(dir.path(), &clock, cases);
    assert!(
        refused > 0 && opened > 0,
        "refused {refused}, opened {opened}"
    );
    Ok(())
}

/// Changes the tables of a closed store file through redb itself.
fn with_db(path: &Path, change: impl FnOnce(&redb::WriteTransaction)) {
    let db = redb::Database::open(path).expect("redb");
    let txn = db.begin_write().expect("txn");
    change(&txn);
    txn.commit().expect("commit");
}

fn log_def(name: &str) -> redb::TableDefinition<'_, u64, &'static [u8]> {
    redb::TableDefinition::new(name)
}

fn first_table(path: &Path) -> String {
    use redb::{ReadableDatabase, TableHandle};
    let db = redb::Database::open(path).expect("redb");
    let read = db.begin_read().expect("read");
    read.list_tables()
        .expect("list")
        .map(|t| t.name().to_string())
        .find(|n| n.starts_with("log."))
        .expect("a log table")
}

#[test]
fn a_bucket_table_missing_from_the_file_is_named() -> Result<()> {
    let dir = tempdir();
    let (path, _, clock) = fresh(dir.path())?;
    let gone = first_table(&path);
    with_db(&path, |txn| {
        assert!(txn.delete_table(log_def(&gone)).expect("delete"));
    });
    let err = builder(&clock)
        .open(&path)
        .expect_err("a bucket is missing");
    assert!(
        matches!(&err, Error::Corrupt(m) if m.contains(&gone) && m.contains("missing")),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_table_the_manifest_does_not_list_is_named() -> Result<()> {
    let dir = tempdir();
    for extra in ["log.000000000001", "log.1", "users"] {
        let (path, _, clock) = fresh(dir.path())?;
        with_db(&path, |txn| {
            txn.open_table(log_def(extra))
                .expect("table")
                .insert(1, b"x".as_slice())
                .expect("insert");
        });
        let err = builder(&clock).open(&path).expect_err("an extra table");
        assert!(
            matches!(&err, Error::Corrupt(m) if m.contains(extra) && m.contains("damaged")),
            "{extra}: {err}"
        );
        std::fs::remove_file(&path).expect("remove");
    }
    Ok(())
}

/// A store written before the manifest (format 1, a committed fixture)
/// opens with every record, keeps its fencing-token floor, and is checked
/// like any other file from its first commit on.
#[test]
fn a_format_1_file_gets_a_manifest_and_keeps_its_token_floor() -> Result<()> {
    use redb::ReadableDatabase;
    let dir = tempdir();
    let path = dir.path().join("v1.redb");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-basic.redb");
    std::fs::copy(fixture, &path).expect("copy");
    let meta = redb::TableDefinition::<&str, &[u8]>::new("dedupkv.meta");
    let old_floor = {
        let db = redb::Database::open(&path).expect("redb");
        let read = db.begin_read().expect("read");
        let t = read.open_table(meta).expect("meta");
        assert!(t.get("manifest").expect("get").is_none(), "a format-1 file");
        let v = t.get("token_floor").expect("get").expect("a token floor");
        u64::from_le_bytes(v.value().try_into().expect("u64"))
    };
    assert!(old_floor > 0);
    let clock = ManualClock::new(1_700_000_050_000);
    let open = || {
        Store::builder()
            .clock(clock.clone())
            .background_eviction(false)
            .open(&path)
    };
    {
        let store = open()?;
        assert!(!store.insert_if_absent(&Key::new("shop", "evt-1"))?);
        let dedupkv::Begin::Started(c) =
            store.begin(&Key::new("shop", "new-op"), dedupkv::Fingerprint::NONE)?
        else {
            panic!("a fresh key")
        };
        assert!(
            c.token() >= old_floor,
            "token {} under the old floor {old_floor}",
            c.token()
        );
    }
    {
        let db = redb::Database::open(&path).expect("redb");
        let read = db.begin_read().expect("read");
        let t = read.open_table(meta).expect("meta");
        assert!(t.get("manifest").expect("get").is_some());
        assert!(
            t.get("token_floor").expect("get").is_none(),
            "folded into the manifest"
        );
    }
    drop(open()?);
    let gone = first_table(&path);
    with_db(&path, |txn| {
        assert!(txn.delete_table(log_def(&gone)).expect("delete"));
    });
    assert!(matches!(open(), Err(Error::Corrupt(m)) if m.contains(&gone)));
    Ok(())
}

#[test]
fn a_truncated_store_is_damaged_not_foreign() -> Result<()> {
    let dir = tempdir();
    let (path, bytes, clock) = fresh(dir.path())?;
    for len in [bytes.len() / 2, 4096, 600] {
        std::fs::write(&path, &bytes[..len]).expect("write");
        let err = builder(&clock).open(&path).expect_err("truncated");
        assert!(
            matches!(&err, Error::Corrupt(m) if m.contains("damaged") && m.contains(&*path.to_string_lossy())),
            "{len} bytes: {err}"
        );
    }
    Ok(())
}

#[test]
fn an_empty_file_is_refused_not_made_a_store() {
    let dir = tempdir();
    let path = dir.path().join("empty.redb");
    std::fs::write(&path, b"").expect("write");
    let err = Store::open(&path).expect_err("an empty file");
    assert!(
        matches!(&err, Error::NotAStore(m) if m.contains(&*path.to_string_lossy()) && m.contains("empty")),
        "{err}"
    );
    assert_eq!(
        std::fs::metadata(&path).expect("stat").len(),
        0,
        "left as it was"
    );
}

#[test]
fn open_existing_never_creates_a_store() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("typo.redb");
    let err = Store::open_existing(&path).expect_err("nothing there");
    assert!(
        matches!(&err, Error::Storage(s) if s.io_kind() == Some(std::io::ErrorKind::NotFound)),
        "{err:?}"
    );
    assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    assert!(!path.exists(), "no file was created");
    drop(Store::open(&path)?);
    let store = Store::builder().open_existing(&path)?;
    assert!(store.insert_if_absent(&Key::new("s", "k"))?);
    Ok(())
}

#[test]
fn an_io_error_at_open_names_the_path() {
    let dir = tempdir();
    let err = Store::open(dir.path()).expect_err("a directory");
    assert!(
        err.to_string().contains(&*dir.path().to_string_lossy()),
        "{err}"
    );
}

/// The storage engine panics (as redb does on some damaged pages) at every
/// point of the open in turn: the open fails, calling the file damaged, or
/// it succeeds and the store works. Never a store whose first commit
/// already poisoned it.
#[test]
fn a_panic_in_the_first_commit_fails_the_open_as_damage() -> Result<()> {
    let backend = FaultBackend::new();
    let open = |b: FaultBackend| {
        Store::builder()
            .background_eviction(false)
            .open_with_backend(b)
    };
    drop(open(backend.clone())?);
    let mut failed = 0;
    for n in 0..20 {
        let faulty = backend.healthy();
        faulty.arm(Plan::after(n).panics());
        match open(faulty.clone()) {
            Err(err) => {
                assert!(
                    matches!(&err, Error::Corrupt(m) if m.contains("damaged") && m.contains("panicked")),
                    "panic after {n} writes: {err}"
                );
                failed += 1;
            }
            Ok(store) => {
                faulty.disarm();
                let flushed = store.flush();
                assert!(flushed.is_ok(), "panic after {n} writes: {flushed:?}");
            }
        }
    }
    assert!(failed > 1);
    drop(open(backend.healthy())?);
    Ok(())
}

/// A store file holds the key secret and every key: a file the store
/// creates is its owner's alone (whatever the umask lets others read).
#[cfg(unix)]
#[test]
fn a_new_store_file_is_readable_by_its_owner_only() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let store = Store::open(&path)?;
    store.insert_if_absent(&Key::new("t", "k"))?;
    drop(store);
    let mode = std::fs::metadata(&path)
        .expect("metadata")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    Ok(())
}
