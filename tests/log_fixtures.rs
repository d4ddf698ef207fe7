//! On-disk fixtures: files written by earlier builds, committed, so a
//! change that breaks reading them fails here, and a corrupt file is tested
//! for real. The tests only read them; `cargo run -p dedupkv-fixtures --
//! fixtures --prefix vN` (crates/fixtures) writes a new format's set, on
//! purpose, and never replaces a committed file unless forced.
//!
//! `v1-*` are format 1, `v3-*` format 3 (written by the last builds of
//! format 3). A format-3 file stays format 3 under this build until it is
//! upgraded on purpose, so a deploy can be rolled back: [`v3`] is this
//! file's own reader of format 3, written from that format's description
//! (docs/design.md), which checks what a format-3 build checks before it
//! trusts a file and decodes every row.

use std::path::{Path, PathBuf};

use dedupkv::{
    Advance, Begin, Error, Fingerprint, Key, ManualClock, Result, Sequenced, State, Store,
    StoreBuilder,
};
use dedupkv_testkit::{started, tempdir};

const T0: u64 = 1_700_000_040_000;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn builder(clock: &ManualClock) -> StoreBuilder {
    Store::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .compact_when_free(None)
}

/// A copy of a fixture in a temp dir (opening writes to the file).
fn copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempdir();
    let to = dir.path().join(name);
    std::fs::copy(fixture(name), &to).expect("copy fixture");
    (dir, to)
}

/// The keys of `v1-runs.redb`: a batch of 300 16-byte ids in one scope
/// (one run), then three single inserts (as crates/fixtures writes them).
fn run_ids() -> Vec<String> {
    (0..300).map(|i| format!("batch-id-{i:07}")).collect()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn a_version_1_file_reads_back_everything() -> Result<()> {
    let (_dir, path) = copy("v1-basic.redb");
    let clock = ManualClock::new(T0 + 10_000); // within the 30 s lease of "running"
    let store = builder(&clock).open(&path)?;
    assert!(!store.insert_if_absent(&Key::new("shop", "evt-1"))?);
    let Begin::Completed(rec) =
        store.begin(&Key::new("shop", "charge-1"), Fingerprint::of("100"))?
    else {
        panic!("completed in the fixture")
    };
    assert_eq!(rec.outcome(), Some(&b"receipt-1"[..]));
    let Begin::Completed(rec) =
        store.begin(&Key::new("shop", "charge-2"), Fingerprint::of("200"))?
    else {
        panic!("failed in the fixture")
    };
    assert_eq!(
        (rec.state(), rec.outcome()),
        (State::Failed, Some(&b"declined"[..]))
    );
    // The claim left in progress by the process that wrote the fixture is
    // taken over at once, inside its lease: that process is gone.
    assert!(matches!(
        store.begin(&Key::new("shop", "running"), Fingerprint::NONE)?,
        Begin::Started(c) if c.attempt() == 2 && c.interrupted()
    ));
    assert_eq!(
        store.advance(&Key::new("shop", "order-1"), 7)?,
        Advance::Duplicate
    );
    let Sequenced::Delivered(out) = store.sequence(&Key::new("bank", "acct"), 2, b"two")? else {
        panic!("2 unblocks the parked 3")
    };
    assert_eq!(out.iter().map(|d| d.seq).collect::<Vec<_>>(), [2, 3]);
    Ok(())
}

#[test]
fn a_corrupt_row_in_a_committed_file_is_reported() {
    let (_dir, path) = copy("v1-corrupt-row.redb");
    let clock = ManualClock::new(T0 + 60_000);
    let err = builder(&clock).open(&path).expect_err("corrupt");
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
}

#[test]
fn a_file_with_a_run_of_inserts_reads_back_every_key() -> Result<()> {
    let (_dir, path) = copy("v1-runs.redb");
    // The ids lie back to back: a run, not 300 records of their own.
    let bytes = std::fs::read(&path).expect("read");
    let at = find(&bytes, b"batch-id-").expect("the ids are in the file");
    assert_eq!(&bytes[at + 16..at + 25], b"batch-id-");
    let clock = ManualClock::new(T0 + 60_000);
    let store = builder(&clock).open(&path)?;
    let ids = run_ids();
    let keys: Vec<Key<'_>> = ids.iter().map(|id| Key::new("shop", id)).collect();
    assert_eq!(store.stats().keys, 303);
    assert!(store.insert_batch(&keys)?.iter().all(|&new| !new));
    let rec = store.get(&keys[299])?.expect("the run's last key");
    assert_eq!((rec.key(), rec.state()), (&keys[299], State::Inserted));
    for id in ["a", "b", "c"] {
        assert!(!store.insert_if_absent(&Key::new("other", id))?);
    }
    assert!(store.insert_if_absent(&Key::new("shop", "batch-id-0000300"))?);
    Ok(())
}

/// A reader of store format 3 as its build reads it (docs/design.md, "Files
/// and tables", "Row and record format"): it refuses what that build
/// refuses (a format above 3, an unknown metadata entry, a settings or
/// manifest checksum that fails, a table the manifest does not list or one
/// it lists that is missing) and decodes every row of every bucket table,
/// each key of a table being a row of that format.
mod v3 {
    use std::collections::BTreeSet;
    use std::path::Path;

    use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("dedupkv.meta");
    const SETTINGS: [&str; 5] = [
        "magic",
        "format",
        "key_hashing",
        "key_secret",
        "granularity_ms",
    ];

    /// What a format-3 build finds in a file it accepts.
    #[derive(Debug)]
    pub struct File {
        pub format: u32,
        /// Every (scope, id) of a record (a run's inserts each).
        pub keys: BTreeSet<(Vec<u8>, Vec<u8>)>,
        pub records: usize,
    }

    type Res<T> = std::result::Result<T, String>;

    pub fn read(path: &Path) -> Res<File> {
        let db = redb::Database::open(path).map_err(|e| e.to_string())?;
        let read = db.begin_read().map_err(|e| e.to_string())?;
        let meta = read.open_table(META).map_err(|e| e.to_string())?;
        let mut entries = std::collections::BTreeMap::new();
        for e in meta.iter().map_err(|e| e.to_string())? {
            let (k, v) = e.map_err(|e| e.to_string())?;
            entries.insert(k.value().to_string(), v.value().to_vec());
        }
        let get = |k: &str| entries.get(k).cloned().ok_or(format!("no {k:?} entry"));
        let mut sum_input = Vec::new();
        for k in SETTINGS {
            let v = get(k)?;
            sum_input.extend_from_slice(&(v.len() as u32).to_le_bytes());
            sum_input.extend_from_slice(&v);
        }
        let sum = u64::from_le_bytes(get("settings_sum")?.try_into().map_err(|_| "sum size")?);
        if xxhash_rust::xxh3::xxh3_64(&sum_input) != sum {
            return Err("the settings fail their checksum".into());
        }
        let format = u32::from_le_bytes(get("format")?.try_into().map_err(|_| "format size")?);
        if format > 3 {
            return Err(format!(
                "unsupported format version {format} (this build reads up to 3)"
            ));
        }
        let known = [&SETTINGS[..], &["settings_sum", "manifest"]].concat();
        if let Some(k) = entries.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(format!("unknown entry {k:?}"));
        }
        let listed = manifest(&get("manifest")?)?;
        let mut tables = BTreeSet::new();
        for t in read.list_tables().map_err(|e| e.to_string())? {
            let name = t.name().to_string();
            if name == "dedupkv.meta" {
                continue;
            }
            let bucket = name
                .strip_prefix("log.")
                .filter(|d| d.len() == 12)
                .and_then(|d| d.parse::<u64>().ok())
                .ok_or(format!("unknown table {name:?}"))?;
            tables.insert(bucket);
        }
        if tables != listed {
            return Err(format!("tables {tables:?}, the manifest lists {listed:?}"));
        }
        let mut out = File {
            format,
            keys: BTreeSet::new(),
            records: 0,
        };
        for b in tables {
            let name = format!("log.{b:012}");
            let def = TableDefinition::<u64, &[u8]>::new(&name);
            let t = read.open_table(def).map_err(|e| e.to_string())?;
            for e in t.iter().map_err(|e| e.to_string())? {
                let (k, v) = e.map_err(|e| e.to_string())?;
                row(v.value(), &mut out)
                    .map_err(|why| format!("{name} row {}: {why}", k.value()))?;
            }
        }
        Ok(out)
    }

    fn var(b: &mut &[u8]) -> Res<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&x, rest) = b.split_first().ok_or("truncated varint")?;
            *b = rest;
            v |= u64::from(x & 0x7f) << shift;
            if x & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("long varint".into())
    }

    fn take<'a>(b: &mut &'a [u8], n: usize) -> Res<&'a [u8]> {
        if b.len() < n {
            return Err("truncated".into());
        }
        let (x, rest) = b.split_at(n);
        *b = rest;
        Ok(x)
    }

    fn manifest(bytes: &[u8]) -> Res<BTreeSet<u64>> {
        let (body, sum) = bytes.split_at(bytes.len().checked_sub(8).ok_or("short manifest")?);
        if xxhash_rust::xxh3::xxh3_64(body)
            != u64::from_le_bytes(sum.try_into().map_err(|_| "sum")?)
        {
            return Err("the manifest fails its checksum".into());
        }
        let mut b = body;
        if take(&mut b, 1)? != [1] {
            return Err("manifest version".into());
        }
        let (_tokens, _time, runs) = (var(&mut b)?, var(&mut b)?, var(&mut b)?);
        let mut out = BTreeSet::new();
        let mut end = 0;
        for _ in 0..runs {
            let start = end + var(&mut b)?;
            let len = var(&mut b)? + 1;
            out.extend(start..start + len);
            end = start + len;
        }
        Ok(out)
    }

    /// A row of version 1: its checksum, then each record (kinds 1-13 and
    /// runs, tag 9), against the record before it.
    fn row(bytes: &[u8], out: &mut File) -> Res<()> {
        let (body, sum) = bytes.split_at(bytes.len().checked_sub(8).ok_or("short row")?);
        if xxhash_rust::xxh3::xxh3_64(body)
            != u64::from_le_bytes(sum.try_into().map_err(|_| "sum")?)
        {
            return Err("row checksum mismatch".into());
        }
        let mut b = body;
        if take(&mut b, 2)? != [1, 0] {
            return Err("row version or flags".into());
        }
        let count = u32::from_le_bytes(take(&mut b, 4)?.try_into().map_err(|_| "count")?);
        let mut scope: Vec<u8> = Vec::new();
        for _ in 0..count {
            let kind = take(&mut b, 1)?[0];
            let (_idx, _at, _expires) = (var(&mut b)?, var(&mut b)?, var(&mut b)?);
            match var(&mut b)? {
                0 => {}
                n => scope = take(&mut b, usize::try_from(n - 1).map_err(|_| "len")?)?.to_vec(),
            }
            let id_len = usize::try_from(var(&mut b)?).map_err(|_| "len")?;
            if kind == 9 {
                let n = u16::from_le_bytes(take(&mut b, 2)?.try_into().map_err(|_| "n")?);
                for _ in 0..n {
                    out.keys
                        .insert((scope.clone(), take(&mut b, id_len)?.to_vec()));
                    out.records += 1;
                }
                continue;
            }
            out.keys
                .insert((scope.clone(), take(&mut b, id_len)?.to_vec()));
            out.records += 1;
            match kind {
                1 => {}
                2..=5 | 10..=12 => {
                    let _ = (var(&mut b)?, var(&mut b)?, var(&mut b)?, var(&mut b)?);
                    take(&mut b, 17)?; // params, outcome tag
                    let n = usize::try_from(var(&mut b)?).map_err(|_| "len")?;
                    take(&mut b, n)?;
                }
                6..=8 | 13 => {
                    let _ = (var(&mut b)?, var(&mut b)?, var(&mut b)?);
                    let n = usize::try_from(var(&mut b)?).map_err(|_| "len")?;
                    take(&mut b, n)?;
                }
                k => return Err(format!("unknown record kind {k}")),
            }
        }
        if !b.is_empty() {
            return Err("trailing bytes".into());
        }
        Ok(())
    }
}

/// The keys a format-3 build finds in the file at `path` (after checking
/// it as that build would), or why it refuses the file.
fn v3_keys(path: &Path) -> std::result::Result<v3::File, String> {
    v3::read(path)
}

fn has(file: &v3::File, scope: &str, id: &str) -> bool {
    file.keys
        .contains(&(scope.as_bytes().to_vec(), id.as_bytes().to_vec()))
}

/// The bucket tables of the file at `path` that hold a summary (row
/// 0), and those that do not.
fn summaries(path: &Path) -> (usize, usize) {
    use redb::{ReadableDatabase, TableHandle};
    let db = redb::Database::open(path).expect("redb");
    let read = db.begin_read().expect("read");
    let (mut with, mut without) = (0, 0);
    for t in read.list_tables().expect("list") {
        let name = t.name().to_string();
        if !name.starts_with("log.") {
            continue;
        }
        let def = redb::TableDefinition::<u64, &[u8]>::new(&name);
        let table = read.open_table(def).expect("table");
        if table.get(0).expect("get").is_some() {
            with += 1;
        } else {
            without += 1;
        }
    }
    (with, without)
}

/// A format-3 file written by the last build of format 3 is opened, written
/// and closed by this build and stays a file that build reads: the old
/// reader accepts it and finds the new records. Only an explicit upgrade
/// makes it format 5, with a summary in every bucket table, after which
/// the old reader refuses it.
#[test]
fn a_format_3_file_keeps_its_format_until_upgraded() -> Result<()> {
    let (_dir, path) = copy("v3-basic.redb");
    let before = v3_keys(&path).expect("a format-3 file, as its build wrote it");
    assert_eq!(before.format, 3);
    assert!(has(&before, "shop", "charge-1"));
    let clock = ManualClock::new(T0 + 10_000);
    {
        let store = builder(&clock).open(&path)?;
        assert_eq!((store.format(), store.stats().format), (3, 3));
        assert!(store.insert_if_absent(&Key::new("new", "insert"))?);
        let c = started(store.begin(&Key::new("new", "job"), Fingerprint::of("x"))?);
        store.complete(&c, b"done by the new build")?;
        assert!(!store.insert_if_absent(&Key::new("shop", "evt-1"))?);
        // What needs the newer format says so, naming the upgrade.
        let err = store.verify().expect_err("format 3 has no summaries");
        assert!(
            matches!(
                err,
                Error::NeedsUpgrade {
                    found: 3,
                    needed: 5,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("Store::upgrade()"), "{err}");
    }
    let after = v3_keys(&path).expect("still a file a format-3 build opens");
    assert_eq!(after.format, 3);
    assert!(has(&after, "new", "insert") && has(&after, "new", "job"));
    assert!(before.keys.is_subset(&after.keys));
    assert_eq!(
        summaries(&path).0,
        0,
        "no summary rows for the old build to trip on"
    );
    // A rollback's build and this one take turns: reopened, still format 3.
    {
        let store = builder(&clock).open(&path)?;
        assert_eq!(store.format(), 3);
        assert!(matches!(
            store.begin(&Key::new("new", "job"), Fingerprint::of("x"))?,
            Begin::Completed(r) if r.outcome() == Some(&b"done by the new build"[..])
        ));
        // The explicit upgrade, on the open store.
        assert!(store.upgrade()?);
        assert_eq!((store.format(), store.stats().format), (5, 5));
        assert!(!store.upgrade()?, "once");
        let rows = store.verify()?;
        assert!(rows > 0);
        assert!(store.insert_if_absent(&Key::new("new", "after upgrade"))?);
    }
    let err = v3_keys(&path).expect_err("a format-3 build refuses an upgraded file");
    assert!(err.contains("unsupported format version 5"), "{err}");
    let (with, without) = summaries(&path);
    assert!(
        with > 0 && without == 0,
        "{with} tables with a summary, {without} without"
    );
    let store = builder(&clock).open(&path)?;
    assert_eq!(store.format(), 5);
    assert!(!store.insert_if_absent(&Key::new("new", "after upgrade"))?);
    assert!(!store.insert_if_absent(&Key::new("shop", "evt-1"))?);
    store.verify()?;
    Ok(())
}

/// `StoreBuilder::upgrade(true)` upgrades in the open's first commit; the
/// upgraded file's summaries are checked by every later open.
#[test]
fn an_upgrade_at_open_makes_a_format_3_file_format_5() -> Result<()> {
    let (_dir, path) = copy("v3-runs.redb");
    let clock = ManualClock::new(T0 + 60_000);
    {
        let store = builder(&clock).upgrade(true).open(&path)?;
        assert_eq!(store.format(), 5);
        assert_eq!(store.stats().keys, 303);
        assert_eq!(store.verify()?, 4, "the batch's row and the three inserts'");
    }
    assert!(v3_keys(&path).is_err(), "the format-3 build refuses it now");
    // One row taken out behind the store's back: the summary says so.
    {
        use redb::{ReadableDatabase, ReadableTable, TableHandle};
        let db = redb::Database::open(&path).expect("redb");
        let name = {
            let read = db.begin_read().expect("read");
            read.list_tables()
                .expect("list")
                .map(|t| t.name().to_string())
                .find(|n| n.starts_with("log."))
                .expect("a bucket table")
        };
        let txn = db.begin_write().expect("txn");
        {
            let def = redb::TableDefinition::<u64, &[u8]>::new(&name);
            let mut t = txn.open_table(def).expect("table");
            // The newest row (row 0 is the summary).
            let newest = t.last().expect("last").expect("a row").0.value();
            assert_ne!(newest, 0);
            t.remove(newest).expect("remove");
        }
        txn.commit().expect("commit");
        drop(db);
        let err = builder(&clock).open(&path).expect_err("a row is missing");
        assert!(
            matches!(&err, Error::Corrupt(m) if m.contains(&name) && m.contains("missing") && m.contains("damaged")),
            "{err}"
        );
    }
    Ok(())
}

/// A format-1 file becomes format 3 by its first commit, as before (no
/// release wrote format 1), and format 5 only when asked.
#[test]
fn a_format_1_file_becomes_format_3_and_format_5_only_on_request() -> Result<()> {
    let clock = ManualClock::new(T0 + 10_000);
    let (_dir, path) = copy("v1-basic.redb");
    {
        let store = builder(&clock).open(&path)?;
        assert_eq!(store.format(), 3);
    }
    let file = v3_keys(&path).expect("a format-3 file now");
    assert!(has(&file, "shop", "charge-1"));
    let (_dir2, path) = copy("v1-basic.redb");
    let store = builder(&clock).upgrade(true).open(&path)?;
    assert_eq!(store.format(), 5);
    store.verify()?;
    Ok(())
}

/// What format 4 changes in the records themselves (the provider's
/// answers, counting) follows the format the file had at open: on a
/// format-3 file an answer format 3 cannot hold is refused with
/// `NeedsUpgrade`, and what is written stays readable by a format-3 build;
/// after `Store::upgrade()` that holds until the next open, which writes
/// format 4's records.
#[test]
fn a_format_3_file_gets_format_3_records_until_it_is_reopened_upgraded() -> Result<()> {
    use dedupkv::{Answer, BeginOptions, Intent};
    let (_dir, path) = copy("v3-basic.redb");
    let clock = ManualClock::new(T0 + 10_000);
    let intent = Intent {
        target: "carrier",
        request: b"label",
    };
    let refused = |store: &Store, id: &str| -> Result<()> {
        let key = Key::new("ship", id);
        let Begin::Started(c) =
            store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::default(), intent)?
        else {
            panic!("{id} is new")
        };
        store.mark_answered(&c, Answer::Refused("503"))?;
        store.fail(&c, dedupkv::Failure::Retryable)
    };
    {
        let store = builder(&clock).open(&path)?;
        let err = refused(&store, "a").expect_err("format 3 holds no refusals");
        assert!(
            matches!(
                err,
                Error::NeedsUpgrade {
                    found: 3,
                    needed: 4,
                    ..
                }
            ),
            "{err}"
        );
        // An accepted call is format 3's own answer.
        let key = Key::new("ship", "b");
        let c = started(store.begin_with_intent(
            &key,
            Fingerprint::NONE,
            &BeginOptions::default(),
            intent,
        )?);
        store.mark_sent(&c, b"1Z999")?;
        store.complete(&c, b"shipped")?;
    }
    let file = v3_keys(&path).expect("what was written is format 3's");
    assert!(has(&file, "ship", "b"));
    {
        let store = builder(&clock).open(&path)?;
        assert!(store.upgrade()?);
        let err = refused(&store, "c").expect_err("until the next open");
        assert!(matches!(err, Error::NeedsUpgrade { found: 3, .. }), "{err}");
    }
    let store = builder(&clock).open(&path)?;
    assert_eq!(store.format(), 5);
    refused(&store, "d")?;
    store.verify()?;
    Ok(())
}
