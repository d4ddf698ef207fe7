//! One damaged byte never opens a smaller store: every flip of a byte in
//! the file either leaves every acknowledged fact readable (after the open,
//! a write and a reopen) or fails the open as damage (`Error::Corrupt`).
//!
//! Three sweeps, deterministic (fixed seeds, a manual clock, stores in
//! memory), each run in a child process so that a flip on which redb
//! aborts the process is recorded, not fatal: every byte of every B-tree
//! page (branch or leaf) the open reads in a small store, with the default
//! open (redb checks every page); the same of the bucket tables' pages
//! with that check off, where the bucket summaries and the open's lookups
//! must refuse what loses a row; and seeded random flips anywhere in a
//! larger store. `DEDUPKV_DAMAGE_ALL=1` flips every byte instead of a
//! sample, and `DEDUPKV_DAMAGE_FLIPS=N` makes N random flips of a store
//! the size of the reported one (8,550 facts) instead of 1,000 of a small
//! one: the soak's settings (scripts/soak.sh).

use std::sync::Arc;
use std::time::Duration;

use dedupkv::PageBackend;
use dedupkv::{Begin, Error, Fingerprint, Key, ManualClock, Result, State, Store, StoreBuilder};
use dedupkv_testkit::FaultBackend;
use redb::StorageBackend;
use redb::backends::InMemoryBackend;

const T0: u64 = 1_700_000_000_000;
const PAGE: usize = 4096;

/// What a store of [`write_store`] holds.
#[derive(Clone, Copy)]
struct Shape {
    /// Bucket tables (one second of writes each).
    buckets: u64,
    /// Completed jobs per bucket (a claim, then a completion: two rows).
    jobs: u64,
    /// Plain inserts per bucket (one row each).
    inserts: u64,
    /// Padding of each id, so rows span pages.
    pad: usize,
    /// Open the damaged copies with redb's check of every page
    /// (`StoreBuilder::verify_pages_on_open`, the default) or without.
    verify_pages: bool,
}

fn builder(clock: &ManualClock) -> StoreBuilder {
    Store::builder()
        .clock(clock.clone())
        .bucket_granularity(Duration::from_secs(1))
        .retention(Duration::from_secs(3_600))
        .background_eviction(false)
        .compact_when_free(None)
}

fn job(b: u64, i: u64, pad: usize) -> String {
    format!("job-{b}-{i}-{}", "j".repeat(pad))
}

fn insert(b: u64, i: u64, pad: usize) -> String {
    format!("ins-{b}-{i}-{}", "i".repeat(pad))
}

fn outcome(b: u64, i: u64) -> Vec<u8> {
    format!("receipt {b}/{i}").into_bytes()
}

/// A cleanly closed store of `shape`, as file bytes, and the clock it was
/// written with (every bucket is live at its time).
fn write_store(shape: Shape) -> Result<(Vec<u8>, ManualClock)> {
    let clock = ManualClock::new(T0);
    let backend = FaultBackend::new();
    {
        let store = builder(&clock).open_with_backend(backend.clone())?;
        for b in 0..shape.buckets {
            for i in 0..shape.jobs.max(shape.inserts) {
                if i < shape.jobs {
                    let key = job(b, i, shape.pad);
                    let Begin::Started(c) = store.begin(&Key::new("s", &key), Fingerprint::NONE)?
                    else {
                        panic!("{key} is new")
                    };
                    store.complete(&c, &outcome(b, i))?;
                }
                if i < shape.inserts {
                    assert!(store.insert_if_absent(&Key::new("s", &insert(b, i, shape.pad)))?);
                }
            }
            clock.advance(Duration::from_secs(1));
        }
    }
    let len = usize::try_from(backend.len().expect("len")).expect("fits");
    let mut bytes = vec![0; len];
    backend.read(0, &mut bytes).expect("read");
    Ok((bytes, clock))
}

/// Bytes in memory, shared by its clones, optionally recording which
/// pages were read.
#[derive(Debug, Clone)]
struct Image {
    mem: Arc<InMemoryBackend>,
    read: Option<Arc<parking_lot::Mutex<Vec<bool>>>>,
}

impl Image {
    fn new(bytes: &[u8], read: Option<Arc<parking_lot::Mutex<Vec<bool>>>>) -> Self {
        let mem = InMemoryBackend::new();
        mem.set_len(bytes.len() as u64).expect("len");
        mem.write(0, bytes).expect("write");
        Image {
            mem: Arc::new(mem),
            read,
        }
    }
}

impl PageBackend for Image {
    fn len(&self) -> std::io::Result<u64> {
        self.mem.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        if let Some(read) = &self.read {
            let mut read = read.lock();
            let first = usize::try_from(offset).expect("fits") / PAGE;
            let last = (usize::try_from(offset).expect("fits") + out.len().max(1) - 1) / PAGE;
            for p in first..=last {
                if p < read.len() {
                    read[p] = true;
                }
            }
        }
        // Past the end, as a file answers (the in-memory backend's own
        // error is not an I/O kind a file would give).
        if offset + out.len() as u64 > self.mem.len()? {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.mem.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.mem.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.mem.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.mem.write(offset, data)
    }
}

/// What one damaged copy did.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Opened with every fact, took a write, reopened with every fact.
    Harmless,
    /// Refused at open as damaged.
    Refused,
    /// Opened with every fact, then said so later: a write failed (redb
    /// met the damage in a page the open did not read, and the store
    /// poisoned itself), or the reopen refused the file as damaged.
    Later,
    /// Opened without a fact, or with a fact changed: the bug.
    Silent(String),
    /// Anything else (another error, an escaped panic).
    Wrong(String),
}

/// Every fact of `shape` is readable in `store`, or the first one that is
/// not.
fn missing(store: &Store, shape: Shape) -> Option<String> {
    let expected = shape.buckets * (shape.jobs + shape.inserts);
    let keys = store.stats().keys;
    if keys < expected {
        return Some(format!("{keys} keys of {expected}"));
    }
    for b in 0..shape.buckets {
        for i in 0..shape.jobs {
            let k = job(b, i, shape.pad);
            match store.get(&Key::new("s", &k)) {
                Ok(Some(r))
                    if r.state() == State::Completed && r.outcome() == Some(&outcome(b, i)[..]) => {
                }
                other => return Some(format!("{k}: {other:?}")),
            }
        }
        for i in 0..shape.inserts {
            let k = insert(b, i, shape.pad);
            match store.get(&Key::new("s", &k)) {
                Ok(Some(r)) if r.state() == State::Inserted => {}
                other => return Some(format!("{k}: {other:?}")),
            }
        }
    }
    None
}

fn is_damage(e: &Error) -> bool {
    matches!(e, Error::Corrupt(m) if m.contains("damaged"))
}

/// Opens `bytes`, checks every fact, writes, reopens and checks again. A
/// panic that escapes the store (closing it included) is wrong too.
fn judge(bytes: &[u8], clock: &ManualClock, shape: Shape) -> Verdict {
    quiet_storage_panics();
    std::panic::catch_unwind(|| judge_unguarded(bytes, clock, shape)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Verdict::Wrong(format!("a panic escaped the store: {what}"))
    })
}

/// redb panics on some damaged pages, and the store turns those panics
/// into errors: their messages would bury the sweep's report, so panics
/// raised inside redb are not printed (every other panic is).
fn quiet_storage_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_redb = info.location().is_some_and(|l| l.file().contains("/redb-"));
            if !in_redb {
                default(info);
            }
        }));
    });
}

fn judge_unguarded(bytes: &[u8], clock: &ManualClock, shape: Shape) -> Verdict {
    let image = Image::new(bytes, None);
    let open = || {
        builder(clock)
            .verify_pages_on_open(shape.verify_pages)
            .open_with_backend(image.clone())
    };
    let store = match open() {
        Ok(s) => s,
        Err(e) if is_damage(&e) => return Verdict::Refused,
        Err(e) => return Verdict::Wrong(format!("open: {e}")),
    };
    if let Some(m) = missing(&store, shape) {
        return Verdict::Silent(format!("opened without {m}"));
    }
    let wrote = match store.insert_if_absent(&Key::new("s", "after")) {
        Ok(true) => true,
        Err(Error::Poisoned(_) | Error::Corrupt(_) | Error::Storage(_)) => false,
        other => return Verdict::Wrong(format!("a write gave {other:?}")),
    };
    drop(store);
    match open() {
        Ok(s) => match missing(&s, shape) {
            Some(m) => Verdict::Silent(format!("reopened without {m}")),
            None if wrote => Verdict::Harmless,
            None => Verdict::Later,
        },
        Err(e) if is_damage(&e) => Verdict::Later,
        Err(e) => Verdict::Wrong(format!("reopen: {e}")),
    }
}

/// A small deterministic generator (xorshift64*), so a failing flip can
/// be named and replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A non-zero XOR mask.
    fn mask(&mut self) -> u8 {
        (self.next() % 255) as u8 + 1
    }
}

/// The verdicts of a sweep, and the flips that went wrong.
#[derive(Default)]
struct Tally {
    harmless: usize,
    refused: usize,
    later: usize,
    /// Flips that made redb abort the process (a panic while it unwound
    /// from another): loud, but not an error dedupkv can return.
    aborted: Vec<String>,
    bad: Vec<String>,
}

impl Tally {
    fn total(&self) -> usize {
        self.harmless + self.refused + self.later + self.aborted.len() + self.bad.len()
    }

    fn check(&self, name: &str) {
        let silent = self.bad.iter().filter(|b| b.contains("SILENT")).count();
        eprintln!(
            "{name}: {} flips: {} harmless, {} refused at open, {} refused later, \
             {} aborted by redb, {silent} silent losses, {} other wrong",
            self.total(),
            self.harmless,
            self.refused,
            self.later,
            self.aborted.len(),
            self.bad.len() - silent
        );
        for a in &self.aborted {
            eprintln!("  aborted by redb: {a}");
        }
        assert!(
            self.bad.is_empty(),
            "{name}: {} of {} flips went wrong:\n{}",
            self.bad.len(),
            self.total(),
            self.bad.join("\n")
        );
    }
}

/// A store and the flips to make in it, each (what, byte, mask).
struct Sweep {
    shape: Shape,
    bytes: Vec<u8>,
    clock: ManualClock,
    flips: Vec<(String, usize, u8)>,
}

const FROM: &str = "DEDUPKV_DAMAGE_FROM";

/// Runs `sweep`'s flips in a child process (this test binary, re-run for
/// the test `test` alone with [`FROM`] set): a flip can make redb abort
/// the process (it panics while unwinding from a panic), which no
/// `catch_unwind` survives, so an abort is recorded against the flip the
/// child was judging and a new child goes on from the next one. In the
/// child, judges the flips from [`FROM`] on and prints each verdict;
/// returns `None` there.
fn run(test: &str, sweep: &Sweep) -> Option<Tally> {
    if let Ok(from) = std::env::var(FROM) {
        let from: usize = from.parse().expect("a flip index");
        for (i, (_, at, mask)) in sweep.flips.iter().enumerate().skip(from) {
            println!("DMG-CASE {i}");
            let v = judge(
                &flipped(&sweep.bytes, *at, *mask),
                &sweep.clock,
                sweep.shape,
            );
            let line = match v {
                Verdict::Harmless => "H".to_string(),
                Verdict::Refused => "R".to_string(),
                Verdict::Later => "L".to_string(),
                Verdict::Silent(m) => format!("S {m}"),
                Verdict::Wrong(m) => format!("W {m}"),
            };
            println!("DMG-VERDICT {i} {}", line.replace('\n', " "));
        }
        return None;
    }
    let mut tally = Tally::default();
    let mut from = 0;
    while from < sweep.flips.len() {
        let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(FROM, from.to_string())
            .output()
            .expect("run the sweep's child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut open = None;
        // The harness starts the first line ("test ... ").
        for line in stdout.lines() {
            let line = line.find("DMG-").map_or(line, |at| &line[at..]);
            if let Some(i) = line.strip_prefix("DMG-CASE ") {
                open = Some(i.parse::<usize>().expect("an index"));
            } else if let Some(rest) = line.strip_prefix("DMG-VERDICT ") {
                let (i, v) = rest.split_once(' ').expect("index and verdict");
                let i: usize = i.parse().expect("an index");
                let what = &sweep.flips[i].0;
                match v.split_at(1) {
                    ("H", _) => tally.harmless += 1,
                    ("R", _) => tally.refused += 1,
                    ("L", _) => tally.later += 1,
                    ("S", m) => tally.bad.push(format!("{what}: SILENT LOSS:{m}")),
                    (_, m) => tally.bad.push(format!("{what}:{m}")),
                }
                open = None;
                from = i + 1;
            }
        }
        if out.status.success() {
            assert!(
                open.is_none() && from == sweep.flips.len(),
                "the child stopped early"
            );
            break;
        }
        let Some(i) = open else {
            panic!(
                "the sweep's child failed outside a flip ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        };
        tally
            .aborted
            .push(format!("{} ({})", sweep.flips[i].0, out.status));
        from = i + 1;
    }
    Some(tally)
}

/// The pages a clean open of `bytes` (and its first commit) reads.
fn pages_read(bytes: &[u8], clock: &ManualClock) -> Result<Vec<usize>> {
    let read = Arc::new(parking_lot::Mutex::new(vec![false; bytes.len() / PAGE]));
    let image = Image::new(bytes, Some(Arc::clone(&read)));
    drop(builder(clock).open_with_backend(image)?);
    Ok(read
        .lock()
        .iter()
        .enumerate()
        .filter_map(|(p, r)| r.then_some(p))
        .collect())
}

/// `mask`, or, where byte `at` ends what reads as a page number of this
/// file, only its low bits. A redb page number's top five bits are the
/// page's order (its size, 4 KiB × 2^order): a flip that raises them makes
/// redb allocate that size before it reads the page, up to 8 TiB, which
/// aborts the process (and a debug build zero-fills a GiB for a minute).
/// That is damage redb does not survive, listed under "What is not
/// promised" in docs/design.md; the flip keeps the order at most 1 here,
/// and still changes the byte.
fn tame(bytes: &[u8], at: usize, mask: u8) -> u8 {
    let Some(word) = at.checked_sub(7).and_then(|from| bytes.get(from..=at)) else {
        return mask;
    };
    let v = u64::from_le_bytes(word.try_into().expect("8 bytes"));
    // Order 0, no bits between the region and the order, region 0, a page
    // inside the file.
    let page_number = v >> 40 == 0 && v > 0 && v < (bytes.len() / PAGE) as u64;
    if page_number && mask & 0xF0 != 0 {
        (mask & 0x0F).max(1)
    } else {
        mask
    }
}

/// Flips `mask` into byte `at` of a copy of `bytes`.
fn flipped(bytes: &[u8], at: usize, mask: u8) -> Vec<u8> {
    let mut bad = bytes.to_vec();
    bad[at] ^= mask;
    bad
}

/// How many bytes of `page` (a redb branch or leaf page) its node uses:
/// what follows is free space, never read. redb 4's layouts: a branch is
/// an 8-byte header (type, padding, `num_keys`: u16, padding), a 16-byte
/// checksum and an 8-byte page number per child, then, for keys of
/// variable width, a u32 end offset per key, then the keys; a leaf is a
/// 4-byte header (type, reserved, `num_entries`: u16), a u32 end offset
/// per key (variable-width keys only), a u32 end offset per value
/// (variable-width values), then the keys and values. Which widths a
/// page's tree has is not in the page: every reading whose last offset
/// fits the page is a candidate, and the longest is taken (too long only
/// costs flips of free space); with none, the whole page.
fn node_len(page: &[u8]) -> usize {
    let n = entries(page);
    let fits = |start: usize, end: Option<usize>| end.filter(|e| *e >= start && *e <= page.len());
    let candidates = match page[0] {
        2 => {
            let keys = 8 + 24 * (n + 1);
            [
                // u64 keys (the bucket tables), at a fixed stride.
                fits(keys, Some(keys + 8 * n)),
                // Variable-width keys: the last key's end offset.
                fits(
                    keys + 4 * n,
                    last(n).and_then(|l| u32_at(page, keys + 4 * l)),
                ),
            ]
        }
        _ => [
            // Fixed-width keys, variable values: the last value's end.
            fits(4 + 4 * n, last(n).and_then(|l| u32_at(page, 4 + 4 * l))),
            // Both of variable width: key ends, then value ends.
            fits(
                4 + 8 * n,
                last(n).and_then(|l| u32_at(page, 4 + 4 * n + 4 * l)),
            ),
        ],
    };
    candidates.into_iter().flatten().max().unwrap_or(page.len())
}

fn entries(page: &[u8]) -> usize {
    usize::from(u16::from_le_bytes([page[2], page[3]]))
}

fn last(n: usize) -> Option<usize> {
    n.checked_sub(1)
}

fn u32_at(page: &[u8], at: usize) -> Option<usize> {
    let b = page.get(at..at + 4)?;
    Some(u32::from_le_bytes(b.try_into().ok()?) as usize)
}

/// Where a leaf of a bucket table (u64 row numbers to rows, and the
/// summary) has its values, if `page` is one: every value starts as a row
/// does (version 1, flags 0) or is the 41-byte summary, and the keys
/// ascend.
fn row_values(page: &[u8]) -> Option<usize> {
    let n = entries(page);
    if page[0] != 1 || n == 0 {
        return None;
    }
    let values = 4 + 12 * n;
    let mut start = values;
    let mut prev_key = None;
    for i in 0..n {
        let end = u32_at(page, 4 + 4 * i)?;
        let key = u64::from_le_bytes(page.get(4 + 4 * n + 8 * i..)?.get(..8)?.try_into().ok()?);
        let value = page.get(start..end)?;
        let row = value.starts_with(&[1, 0]);
        let summary = value.len() == 41 && value[0] == 1 && key == 0;
        if !(row || summary) || prev_key.is_some_and(|p| p >= key) {
            return None;
        }
        prev_key = Some(key);
        start = end;
    }
    Some(values)
}

/// The bytes of `page` the exhaustive sweep flips, as offsets in it: every
/// byte of every node, except that where the sweep would run long in a
/// debug build it takes a sample: the rows' bytes in a bucket table's
/// leaf (each refused by the row's own checksum, whichever it is) every
/// 8th byte, and redb's own allocator state (the leaves that hold
/// neither rows nor dedupkv's names) every 8th. `all` takes every byte.
fn sweep_offsets(page: &[u8], all: bool) -> Vec<usize> {
    let end = node_len(page);
    let ours = |needle: &[u8]| page[..end].windows(needle.len()).any(|w| w == needle);
    let (dense, stride) = if all || page[0] == 2 {
        (end, 1)
    } else if let Some(values) = row_values(page) {
        (values, 8)
    } else if ours(b"dedupkv") || ours(b"log.0") {
        (end, 1)
    } else {
        (0, 8)
    };
    (0..dense).chain((dense..end).step_by(stride)).collect()
}

/// A store whose bucket table spans leaves under a branch page (two such
/// tables with `all`), and the flips of every byte of the pages the open
/// reads that `take` keeps (as [`sweep_offsets`] samples them, unless
/// `all`), each with a seeded mask.
fn small_sweep(all: bool, verify_pages: bool, take: impl Fn(&[u8]) -> bool) -> Result<Sweep> {
    let shape = Shape {
        buckets: if all { 2 } else { 1 },
        jobs: 10,
        inserts: 20,
        pad: 60,
        verify_pages,
    };
    let (bytes, clock) = write_store(shape)?;
    let pages = pages_read(&bytes, &clock)?;
    let mut rng = Rng(0x5eed_0001);
    let mut flips = Vec::new();
    let (mut branches, mut row_leaves) = (0, 0);
    for &p in &pages {
        let page = &bytes[p * PAGE..(p + 1) * PAGE];
        // Only B-tree pages: the header, region and allocator pages are
        // other structures.
        if !(1..=2).contains(&page[0]) || !take(page) {
            continue;
        }
        branches += usize::from(page[0] == 2);
        row_leaves += usize::from(row_values(page).is_some());
        for at in sweep_offsets(page, all) {
            let at = p * PAGE + at;
            let mask = tame(&bytes, at, rng.mask());
            flips.push((format!("byte {at} (page {p}) ^ {mask:#04x}"), at, mask));
        }
    }
    eprintln!(
        "{} bytes, {} pages read, {branches} branch pages and {row_leaves} bucket leaves swept",
        bytes.len(),
        pages.len(),
    );
    assert!(
        branches >= 1 && row_leaves >= 2,
        "a bucket table spans leaves under a branch"
    );
    Ok(Sweep {
        shape,
        bytes,
        clock,
        flips,
    })
}

/// Every byte of every branch and leaf page the open reads (a sample of
/// some in CI, see [`sweep_offsets`]; every one with
/// `DEDUPKV_DAMAGE_ALL=1`), with the default open, which has redb check
/// every page.
#[test]
fn every_byte_of_a_small_stores_pages_is_checked_or_harmless() -> Result<()> {
    let all = std::env::var_os("DEDUPKV_DAMAGE_ALL").is_some();
    let sweep = small_sweep(all, true, |_| true)?;
    let Some(tally) = run(
        "every_byte_of_a_small_stores_pages_is_checked_or_harmless",
        &sweep,
    ) else {
        return Ok(());
    };
    tally.check("small store, every byte");
    assert!(tally.refused > 500, "the sweep reached the checks");
    Ok(())
}

/// The same sweep of the bucket tables' pages (branches and leaves) with
/// redb's page check off: the bucket summaries and the open's lookups
/// alone refuse every flip that loses a row. (redb's allocator state is
/// left out: without the page check, a flip there can make the first
/// commit write over a live page; see `StoreBuilder::verify_pages_on_open`.)
#[test]
fn without_page_checks_every_byte_of_the_bucket_tables_is_checked_or_harmless() -> Result<()> {
    let all = std::env::var_os("DEDUPKV_DAMAGE_ALL").is_some();
    let sweep = small_sweep(all, false, |page| {
        page[0] == 2 || row_values(page).is_some()
    })?;
    let Some(tally) = run(
        "without_page_checks_every_byte_of_the_bucket_tables_is_checked_or_harmless",
        &sweep,
    ) else {
        return Ok(());
    };
    tally.check("bucket tables without page checks, every byte");
    assert!(tally.refused > 500, "the sweep reached the checks");
    Ok(())
}

/// Seeded flips anywhere in a larger store. `DEDUPKV_DAMAGE_FLIPS=N` makes
/// N flips in a store the size of the reported one (8,553 facts, about
/// 1.2 MB) instead.
#[test]
fn random_flips_in_a_larger_store_are_checked_or_harmless() -> Result<()> {
    let soak: Option<usize> = std::env::var("DEDUPKV_DAMAGE_FLIPS")
        .ok()
        .map(|v| v.parse().expect("DEDUPKV_DAMAGE_FLIPS is a number"));
    let (shape, n) = match soak {
        Some(n) => (
            Shape {
                buckets: 30,
                jobs: 143,
                inserts: 142,
                pad: 40,
                verify_pages: true,
            },
            n,
        ),
        None => (
            Shape {
                buckets: 4,
                jobs: 12,
                inserts: 12,
                pad: 80,
                verify_pages: true,
            },
            1_000,
        ),
    };
    let (bytes, clock) = write_store(shape)?;
    let mut rng = Rng(0x5eed_0002);
    let flips = (0..n)
        .map(|_| {
            let at = usize::try_from(rng.next() % bytes.len() as u64).expect("fits");
            let mask = tame(&bytes, at, rng.mask());
            (format!("byte {at} ^ {mask:#04x}"), at, mask)
        })
        .collect();
    let sweep = Sweep {
        shape,
        bytes,
        clock,
        flips,
    };
    let Some(tally) = run(
        "random_flips_in_a_larger_store_are_checked_or_harmless",
        &sweep,
    ) else {
        return Ok(());
    };
    eprintln!(
        "{} facts in {} bytes",
        shape.buckets * (shape.jobs + shape.inserts),
        sweep.bytes.len()
    );
    tally.check("larger store, random flips");
    assert!(tally.refused > n / 10, "the flips reached the checks");
    Ok(())
}
