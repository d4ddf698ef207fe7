//! Bytes written per commit with the journal (`StoreBuilder::journal`),
//! counted by a [`PageBackend`] that wraps the store file's medium and the
//! journal's: what the store asks the disk to write, per one-key commit
//! and per key in batches of 1,000, checkpoints included (issue #29's
//! targets: at most 8 KiB and 40 bytes).
//!
//! Figures: `cargo test --test journal_bytes -- --nocapture`.

// Byte counts and key counts here stay far below 2^52.
#![allow(clippy::cast_precision_loss)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dedupkv::{Key, ManualClock, PageBackend, Result, Store};
use dedupkv_testkit::{FaultBackend, FaultFile};

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// A medium that counts the bytes written to it and its syncs.
#[derive(Debug)]
struct Counting<B> {
    inner: B,
    written: Arc<AtomicU64>,
    syncs: Arc<AtomicU64>,
}

impl<B: PageBackend> Counting<B> {
    fn new(inner: B) -> Self {
        Counting {
            inner,
            written: Arc::default(),
            syncs: Arc::default(),
        }
    }

    /// The counters, to read after the store took the medium.
    fn counters(&self) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
        (Arc::clone(&self.written), Arc::clone(&self.syncs))
    }
}

impl<B: PageBackend> PageBackend for Counting<B> {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.written.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.write(offset, data)
    }
}

/// Bytes written to the store file and to the journal (after its
/// segment was made) by `work`, the store dropped (its last checkpoint)
/// included.
struct Written {
    file: u64,
    journal: u64,
    /// Syncs of both.
    syncs: u64,
}

fn count(journal: Option<u64>, work: impl FnOnce(&Store) -> Result<()>) -> Result<Written> {
    let db = Counting::new(FaultBackend::new());
    let j = Counting::new(FaultFile::new());
    let ((file, fs), (jw, js)) = (db.counters(), j.counters());
    let builder = Store::builder()
        .clock(ManualClock::new(1_700_000_000_000))
        .background_eviction(false)
        .compact_when_free(None);
    let store = match journal {
        Some(bytes) => builder.journal(Some(bytes)).open_with_backends(db, j)?,
        None => builder.open_with_backend(db)?,
    };
    // The store's first commit (the file's tables) and the segment's zeros
    // are not the workload's.
    assert!(store.insert_if_absent(&Key::new("w", "warm-up"))?);
    let at = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let (f0, j0, s0) = (at(&file), at(&jw), at(&fs) + at(&js));
    work(&store)?;
    drop(store);
    Ok(Written {
        file: at(&file) - f0,
        journal: at(&jw) - j0,
        syncs: at(&fs) + at(&js) - s0,
    })
}

fn id(i: usize) -> String {
    format!("key-{i:08}")
}

/// 1 MiB segments: a checkpoint every ~1,500 one-key commits, so the
/// counts include several of them (and the last, at the drop).
const SEGMENT: u64 = 1 << 20;

#[test]
fn a_one_key_commit_writes_at_most_8_kib_checkpoints_included() -> TestResult {
    const N: usize = 8_000;
    let ones = |n: usize| {
        move |s: &Store| -> Result<()> {
            for i in 0..n {
                s.insert_if_absent(&Key::new("w", &id(i)))?;
            }
            Ok(())
        }
    };
    let with = count(Some(SEGMENT), ones(N))?;
    // redb's commits cost the same each: fewer of them say it.
    let without = count(None, ones(N / 10))?;
    let per = |w: &Written| (w.file + w.journal) as f64 / N as f64;
    println!(
        "one-key commits: journal {:.0} B + store file {:.0} B = {:.0} B per commit, \
         {:.3} syncs; without the journal {:.0} B, {:.3} syncs",
        with.journal as f64 / N as f64,
        with.file as f64 / N as f64,
        per(&with),
        with.syncs as f64 / N as f64,
        per(&without) * 10.0,
        without.syncs as f64 / N as f64 * 10.0
    );
    assert!(
        per(&with) <= 8192.0,
        "{:.0} bytes per one-key commit",
        per(&with)
    );
    assert!(
        per(&with) < per(&without) * 10.0,
        "the journal writes less than redb's copy-on-write commit"
    );
    Ok(())
}

#[test]
fn a_key_in_batches_of_1000_writes_at_most_40_bytes_checkpoints_included() -> TestResult {
    const BATCHES: usize = 40;
    let batches = |s: &Store| -> Result<()> {
        for b in 0..BATCHES {
            let ids: Vec<String> = (0..1000).map(|i| id(b * 1000 + i)).collect();
            let keys: Vec<Key<'_>> = ids.iter().map(|i| Key::new("w", i)).collect();
            s.insert_batch(&keys)?;
        }
        Ok(())
    };
    let with = count(Some(SEGMENT), batches)?;
    let without = count(None, batches)?;
    let n = (BATCHES * 1000) as f64;
    let per = |w: &Written| (w.file + w.journal) as f64 / n;
    println!(
        "batches of 1,000: journal {:.1} B + store file {:.1} B = {:.1} B per key, \
         {} syncs; without the journal {:.1} B, {} syncs",
        with.journal as f64 / n,
        with.file as f64 / n,
        per(&with),
        with.syncs,
        per(&without),
        without.syncs
    );
    assert!(per(&with) <= 40.0, "{:.1} bytes per key", per(&with));
    Ok(())
}
