//! Engine benchmarks for the core store's performance targets, printed as a
//! table of medians and side-by-side ratios (this machine is shared and
//! noisy: compare ratios measured in the same run, not absolute figures).
//!
//! `cargo bench --bench engine` (10M keys; `DEDUPKV_BENCH_KEYS=1000000`
//! for a quicker run; `DEDUPKV_BENCH_RUNS` runs per figure, default 3;
//! `DEDUPKV_BENCH_ONLY` one group: `batch`, `threads`, `index`, `reopen`).
#![allow(missing_docs, clippy::unwrap_used, clippy::cast_precision_loss)]
#![allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

#[path = "common/mod.rs"]
mod common;
use common::{env_or, splitmix};

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use dedupkv::{Key, Store};
use hashbrown::HashTable;
use parking_lot::Mutex;
use redb::TableDefinition;

const SCOPE: &[u8] = b"bench";

fn random_ids(n: usize, seed: u64) -> Vec<[u8; 16]> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&splitmix(&mut s).to_le_bytes());
            id[8..].copy_from_slice(&splitmix(&mut s).to_le_bytes());
            id
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn load(store: &Store, ids: &[[u8; 16]]) {
    for chunk in ids.chunks(10_000) {
        let keys: Vec<Key<'_>> = chunk.iter().map(|id| Key::new(SCOPE, id)).collect();
        store.insert_batch(&keys).unwrap();
    }
}

/// The ceiling: a bare parking_lot-sharded hashbrown set of key bytes.
struct BareMap {
    shards: Vec<Mutex<HashTable<[u8; 16]>>>,
}

impl BareMap {
    fn new(ids: &[[u8; 16]]) -> Self {
        let m = BareMap {
            shards: (0..64).map(|_| Mutex::new(HashTable::new())).collect(),
        };
        for id in ids {
            m.insert(id);
        }
        m
    }
    fn hash(id: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(id)
    }
    fn insert(&self, id: &[u8; 16]) -> bool {
        let h = Self::hash(id);
        let mut s = self.shards[(h >> 58) as usize].lock();
        if s.find(h, |k| k == id).is_some() {
            return false;
        }
        s.insert_unique(h, *id, |k| Self::hash(k));
        true
    }
}

/// The same bare map doing the same lookups as the engine: the key
/// (scope, id) hashed with keyed SipHash-1-3-128, the 128-bit fingerprint
/// looked up in a sharded hashbrown set.
struct BareFingerprintMap {
    shards: Vec<Mutex<HashTable<u128>>>,
}

impl BareFingerprintMap {
    fn new(ids: &[[u8; 16]]) -> Self {
        let m = BareFingerprintMap {
            shards: (0..64).map(|_| Mutex::new(HashTable::new())).collect(),
        };
        for id in ids {
            m.insert(id);
        }
        m
    }
    fn fingerprint(id: &[u8]) -> u128 {
        use siphasher::sip128::{Hasher128, SipHasher13};
        let mut h = SipHasher13::new_with_key(&[7; 16]);
        std::hash::Hasher::write(&mut h, &(SCOPE.len() as u32).to_le_bytes());
        std::hash::Hasher::write(&mut h, SCOPE);
        std::hash::Hasher::write(&mut h, id);
        h.finish128().as_u128()
    }
    fn insert(&self, id: &[u8; 16]) -> bool {
        let f = Self::fingerprint(id);
        let mut s = self.shards[(f >> 122) as usize].lock();
        if s.find(f as u64, |k| *k == f).is_some() {
            return false;
        }
        s.insert_unique(f as u64, f, |k| *k as u64);
        true
    }
}

/// Runs `op` over `lookups` from `threads` threads; returns ops/s.
fn parallel_rate(threads: usize, lookups: &[[u8; 16]], op: &(dyn Fn(&[u8; 16]) + Sync)) -> f64 {
    let barrier = Barrier::new(threads);
    let per = lookups.len() / threads;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (barrier, slice) = (&barrier, &lookups[t * per..(t + 1) * per]);
            s.spawn(move || {
                barrier.wait();
                for id in slice {
                    op(id);
                }
            });
        }
    });
    (per * threads) as f64 / start.elapsed().as_secs_f64()
}

/// Raw redb: presence check and insert of each key in a table keyed by the
/// key bytes, `batch` keys per write transaction, after `preload` keys.
fn raw_redb_rate(dir: &Path, preload: &[[u8; 16]], ids: &[[u8; 16]], batch: usize) -> f64 {
    let db = redb::Builder::new()
        .set_cache_size(64 << 20)
        .create(dir.join("raw.redb"))
        .unwrap();
    let def: TableDefinition<&[u8], ()> = TableDefinition::new("keys");
    let insert = |chunk: &[[u8; 16]]| {
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(def).unwrap();
            for id in chunk {
                let key: &[u8] = id;
                if redb::ReadableTable::get(&t, key).unwrap().is_none() {
                    t.insert(key, ()).unwrap();
                }
            }
        }
        txn.commit().unwrap();
    };
    let mut sorted = preload.to_vec();
    sorted.sort_unstable(); // preload fast, in key order
    for chunk in sorted.chunks(100_000) {
        insert(chunk);
    }
    let start = Instant::now();
    for chunk in ids.chunks(batch) {
        insert(chunk);
    }
    ids.len() as f64 / start.elapsed().as_secs_f64()
}

fn batch_rate(dir: &Path, preload: &[[u8; 16]], ids: &[[u8; 16]], batch: usize) -> f64 {
    let store = Store::open(dir.join("batch.redb")).unwrap();
    load(&store, preload);
    let start = Instant::now();
    for chunk in ids.chunks(batch) {
        let keys: Vec<Key<'_>> = chunk.iter().map(|id| Key::new(SCOPE, id)).collect();
        store.insert_batch(&keys).unwrap();
    }
    ids.len() as f64 / start.elapsed().as_secs_f64()
}

/// `insert_if_absent` of fresh keys from `threads` threads for `secs`.
fn single_key_rate(dir: &Path, threads: usize, secs: f64, seed: u64) -> f64 {
    let store = Store::open(dir.join(format!("single-{threads}.redb"))).unwrap();
    let ids = random_ids(threads * 200_000, seed);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let barrier = Barrier::new(threads);
    let start = Instant::now();
    let done: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (store, barrier, ids) = (&store, &barrier, &ids);
                s.spawn(move || {
                    barrier.wait();
                    let mut n = 0;
                    for id in &ids[t * 200_000..(t + 1) * 200_000] {
                        assert!(store.insert_if_absent(&Key::new(SCOPE, id)).unwrap());
                        n += 1;
                        if n % 16 == 0 && Instant::now() >= deadline {
                            break;
                        }
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    done as f64 / start.elapsed().as_secs_f64()
}

/// A crash image of the store at `from` (and of its journal, if any):
/// the store is still open.
fn copy_while_open(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
    let journal = |p: &Path| {
        let mut s = p.as_os_str().to_owned();
        s.push(".journal");
        std::path::PathBuf::from(s)
    };
    if journal(from).exists() {
        std::fs::copy(journal(from), journal(to)).unwrap();
    }
}

fn reopen_secs(path: &Path, quick_repair: bool) -> f64 {
    let start = Instant::now();
    let store = Store::builder()
        .quick_repair(quick_repair)
        .open(path)
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    drop(store);
    secs
}

/// Reopen of `n` keys with the journal (the default) and without
/// (`journal(None)`), each loaded into its own store: clean, alternating
/// the two (which goes first alternates too, so neither always meets a
/// colder machine), the median of `runs` each; then from a crash image of
/// each, taken while it was open (once).
fn bench_reopen(n: usize, runs: usize) -> Vec<String> {
    let ids = random_ids(n, 11);
    let builder = |journal: bool| {
        let b = Store::builder();
        if journal { b } else { b.journal(None) }
    };
    let dir = tempfile::tempdir().unwrap();
    let paths = [true, false].map(|journal| {
        let path = dir.path().join(format!("r-{journal}.redb"));
        let store = builder(journal).open(&path).unwrap();
        load(&store, &ids);
        let crash = dir.path().join(format!("crash-{journal}.redb"));
        copy_while_open(&path, &crash);
        drop(store);
        (journal, path, crash)
    });
    drop(ids);
    let reopen = |journal: bool, p: &Path| {
        let start = Instant::now();
        let store = builder(journal).open(p).unwrap();
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(store.stats().keys, n as u64);
        drop(store);
        secs
    };
    let mut clean = [vec![], vec![]];
    for r in 0..runs {
        for i in [r % 2, 1 - r % 2] {
            clean[i].push(reopen(paths[i].0, &paths[i].1));
        }
    }
    let mut rows = Vec::new();
    for (i, (journal, _, crash)) in paths.iter().enumerate() {
        let crashed = reopen(*journal, crash);
        rows.push(format!(
            "| reopen {n} keys, {}: clean / after crash (s) | {:.2} / {crashed:.2} | — | — | no slower with the journal |",
            if *journal { "journal (default)" } else { "`journal(None)`" },
            median(clean[i].clone())
        ));
    }
    rows
}

/// B. `insert_batch` of 1,000 new keys, Immediate, vs raw redb keyed table,
/// both after the same preload (the table size a real store has).
fn bench_batch(runs: usize) -> String {
    let preload_n = env_or("DEDUPKV_BENCH_PRELOAD", 1_000_000);
    let batch_keys = env_or("DEDUPKV_BENCH_BATCH_KEYS", 100_000);
    let (mut ours, mut raw, mut ratios) = (vec![], vec![], vec![]);
    for r in 0..runs {
        let dir = tempfile::tempdir().unwrap();
        let preload = random_ids(preload_n, 50 + r as u64);
        let ids = random_ids(batch_keys, 100 + r as u64);
        let a = batch_rate(dir.path(), &preload, &ids, 1_000);
        let b = raw_redb_rate(dir.path(), &preload, &ids, 1_000);
        ours.push(a);
        raw.push(b);
        ratios.push(a / b);
    }
    format!(
        "| `insert_batch` 1,000 new keys/commit into a {preload_n}-key store, Immediate (keys/s) | {:.0} | raw redb keyed table of {preload_n} keys, 1,000 keys/txn: {:.0} | {:.1}× | ≥ 1M keys/s and ≥ 20× |",
        median(ours),
        median(raw),
        median(ratios)
    )
}

/// C. `insert_if_absent` from 16 threads vs 1 thread, Immediate.
fn bench_threads(runs: usize) -> String {
    let (mut one, mut many, mut ratios) = (vec![], vec![], vec![]);
    for r in 0..runs {
        let dir = tempfile::tempdir().unwrap();
        let a = single_key_rate(dir.path(), 1, 2.0, 200 + r as u64);
        let b = single_key_rate(dir.path(), 16, 2.0, 300 + r as u64);
        one.push(a);
        many.push(b);
        ratios.push(b / a);
    }
    format!(
        "| `insert_if_absent` 16 threads, Immediate (keys/s) | {:.0} | 1 thread: {:.0} | {:.1}× | ≥ 10× |",
        median(many),
        median(one),
        median(ratios)
    )
}

/// A: duplicate hits on a loaded store against bare maps, side by side.
fn bench_dups(
    store: &Store,
    ids: &[[u8; 16]],
    lookups: &[[u8; 16]],
    runs: usize,
    dir: &Path,
) -> Vec<String> {
    let n = ids.len();
    let mut rows = Vec::new();
    let bare = BareMap::new(ids);
    let bare_fp = BareFingerprintMap::new(ids);
    let (mut ours, mut fast, mut same) = (vec![], vec![], vec![]);
    let (mut r_fast, mut r_same) = (vec![], vec![]);
    for _ in 0..runs {
        let engine = parallel_rate(2, lookups, &|id| {
            assert!(!store.insert_if_absent(&Key::new(SCOPE, id)).unwrap());
        });
        let fast_rate = parallel_rate(2, lookups, &|id| {
            assert!(!bare.insert(id));
        });
        let same_rate = parallel_rate(2, lookups, &|id| {
            assert!(!bare_fp.insert(id));
        });
        ours.push(engine);
        fast.push(fast_rate);
        same.push(same_rate);
        r_fast.push(engine / fast_rate);
        r_same.push(engine / same_rate);
    }
    drop(bare_fp);
    // The opt-in xxh3 key hashing (trusted keys) against the xxh3 bare map.
    let (mut xx, mut r_xx) = (vec![], vec![]);
    {
        let store_xx = Store::builder()
            .key_hashing(dedupkv::KeyHashing::Xxh3)
            .open(dir.join("xxh3.redb"))
            .unwrap();
        load(&store_xx, ids);
        for _ in 0..runs {
            let engine = parallel_rate(2, lookups, &|id| {
                assert!(!store_xx.insert_if_absent(&Key::new(SCOPE, id)).unwrap());
            });
            let fast_rate = parallel_rate(2, lookups, &|id| {
                assert!(!bare.insert(id));
            });
            xx.push(engine);
            r_xx.push(engine / fast_rate);
        }
    }
    drop(bare);
    rows.push(format!(
        "| duplicate hits on a {n}-key index, 2 threads (checks/s) | {:.0} | bare sharded hashbrown, same lookups (keyed SipHash-128 fingerprint): {:.0} | {:.2}× | ≥ 0.7× |",
        median(ours.clone()),
        median(same),
        median(r_same)
    ));
    rows.push(format!(
        "| duplicate hits, as above | {:.0} | bare sharded hashbrown of raw 16-byte ids, xxh3 (no key hashing): {:.0} | {:.2}× | — |",
        median(ours),
        median(fast),
        median(r_fast)
    ));
    rows.push(format!(
        "| duplicate hits, store opened with `KeyHashing::Xxh3` (trusted keys) | {:.0} | the xxh3 bare map, measured alongside | {:.2}× | — |",
        median(xx),
        median(r_xx)
    ));
    rows
}

/// A + D. A loaded index: duplicate hits against a bare map, memory, reopen.
fn bench_index(n: usize, runs: usize) -> Vec<String> {
    let mut rows = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    let ids = random_ids(n, 7);
    let lookups: Vec<[u8; 16]> = {
        let mut s = 99;
        (0..4_000_000)
            .map(|_| ids[(splitmix(&mut s) % n as u64) as usize])
            .collect()
    };
    let rss0 = rss_bytes();
    let path = dir.path().join("loaded.redb");
    let store = Store::open(&path).unwrap();
    let t = Instant::now();
    load(&store, &ids);
    let load_secs = t.elapsed().as_secs_f64();
    let rss1 = rss_bytes();
    let stats = store.stats();
    rows.extend(bench_dups(&store, &ids, &lookups, runs, dir.path()));
    rows.push(format!(
        "| index bytes per key at {n} keys | {:.1} (table allocation) | RSS growth while loading: {:.1} | — | ≤ 32 |",
        stats.index_bytes as f64 / stats.keys as f64,
        (rss1.saturating_sub(rss0)) as f64 / n as f64
    ));
    rows.push(format!(
        "| load {n} keys via `insert_batch` of 10,000, Immediate (keys/s) | {:.0} | — | — | — |",
        n as f64 / load_secs
    ));
    store.flush().unwrap();
    let crash = dir.path().join("crash.redb");
    copy_while_open(&path, &crash); // a crash image: the store is still open
    drop(store);
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    let clean = reopen_secs(&path, false);
    let crashed = reopen_secs(&crash, false);
    rows.push(format!(
        "| reopen {n} keys: clean / after crash (s) | {clean:.2} / {crashed:.2} | file {} MiB | — | — |",
        size >> 20
    ));
    // Quick repair: the same, for stores written with it on and off.
    let qids = &ids[..n.min(2_000_000)];
    let crash_reopen = |quick: bool| {
        let p = dir.path().join(format!("q{quick}.redb"));
        let store = Store::builder().quick_repair(quick).open(&p).unwrap();
        load(&store, qids);
        let c = dir.path().join(format!("q{quick}-crash.redb"));
        copy_while_open(&p, &c);
        drop(store);
        reopen_secs(&c, quick)
    };
    let (on, off) = (crash_reopen(true), crash_reopen(false));
    rows.push(format!(
        "| reopen after crash, {} keys: quick_repair on / off (s) | {on:.2} | {off:.2} | — | — |",
        qids.len()
    ));
    rows
}

fn main() {
    let n = env_or("DEDUPKV_BENCH_KEYS", 10_000_000);
    let runs = env_or("DEDUPKV_BENCH_RUNS", 3);
    let only = std::env::var("DEDUPKV_BENCH_ONLY").unwrap_or_default();
    let want = |name: &str| only.is_empty() || only == name;
    let mut out = String::new();
    let mut row = |line: String| {
        println!("{line}");
        writeln!(out, "{line}").unwrap();
    };
    row(format!(
        "dedupkv engine bench: {n} keys, {runs} runs per figure, medians"
    ));
    row(String::new());
    row("| figure | dedupkv | comparison | ratio | target |".into());
    row("|---|---|---|---|---|".into());
    if want("batch") {
        row(bench_batch(runs));
    }
    if want("threads") {
        row(bench_threads(runs));
    }
    if want("index") {
        for r in bench_index(n, runs) {
            row(r);
        }
    }
    if want("reopen") {
        for r in bench_reopen(n, runs) {
            row(r);
        }
    }
    let dirp = Path::new("target/bench-engine");
    let _ = std::fs::create_dir_all(dirp);
    let _ = std::fs::write(dirp.join("engine.md"), out);
}
