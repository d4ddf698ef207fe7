//! The fsync floor: no engine at all, only the durable write a journal
//! commit cannot go below. Each commit writes `bytes` at the next offset
//! of a preallocated, zero-filled file (sequentially, wrapping at its
//! end, as a recycled journal segment is) and makes it durable, with
//! `fdatasync` or through an `O_DSYNC` descriptor. The keys are kept in a
//! set in memory, only so it answers as every contender must (the bench
//! checks the count of new keys); the bytes written are not the keys.
//! `begin_complete` is two such commits (the claim, then the outcome), as
//! dedupkv's begin + complete is.
//!
//! Commits are serialized (one lock around the file): the floor of one
//! caller, not a group commit. Issue #29's target is against the 4 KiB
//! `fdatasync` floor ([`Floor::fdatasync_4k`]); the record-sized one
//! ([`Floor::fdatasync_record`]) writes what the journal writes for one
//! key (~170 bytes, unaligned), to show what the block's partial write
//! costs.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt as _;
use std::sync::{Arc, Mutex, PoisonError};

use tempfile::TempDir;

use crate::contender::{Contender, Instance, Key16, Result, Worker};

/// The file's length: 64 MiB, written once with zeros before the run.
const FILE_BYTES: u64 = 64 << 20;

/// `O_DSYNC` on Linux (every architecture the project builds on uses this
/// value); the harness does not depend on `libc` for one flag.
#[cfg(target_os = "linux")]
const O_DSYNC: i32 = 0o10000;

/// A bare write + sync loop of one size. A commit runs it once: open an
/// instance, take a worker, and every `insert_batch` is one durable write.
///
/// # Examples
///
/// ```
/// use dedupkv_bench_compare::contender::Contender as _;
/// use dedupkv_bench_compare::floor::Floor;
///
/// let inst = Floor::fdatasync_record().open(10)?;
/// let mut w = inst.worker()?;
/// assert_eq!(w.insert_batch(&[[1; 16], [2; 16]])?, 2);
/// assert_eq!(w.insert_batch(&[[1; 16]])?, 0, "seen before");
/// # Ok::<(), dedupkv_bench_compare::contender::Error>(())
/// ```
pub struct Floor {
    id: &'static str,
    /// Bytes per commit.
    bytes: usize,
    /// One `pwrite` on an `O_DSYNC` descriptor instead of `pwrite` +
    /// `fdatasync`.
    dsync: bool,
}

impl Floor {
    /// 4 KiB per commit, aligned, `pwrite` + `fdatasync`: issue #29's floor.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_bench_compare::contender::Contender as _;
    ///
    /// let floor = dedupkv_bench_compare::floor::Floor::fdatasync_4k();
    /// assert_eq!(floor.id(), "floor-4k");
    /// ```
    pub fn fdatasync_4k() -> Self {
        Floor {
            id: "floor-4k",
            bytes: 4096,
            dsync: false,
        }
    }

    /// 4 KiB per commit through an `O_DSYNC` descriptor.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_bench_compare::contender::Contender as _;
    ///
    /// let floor = dedupkv_bench_compare::floor::Floor::dsync_4k();
    /// assert_eq!(floor.id(), "floor-4k-dsync");
    /// ```
    pub fn dsync_4k() -> Self {
        Floor {
            id: "floor-4k-dsync",
            bytes: 4096,
            dsync: true,
        }
    }

    /// 168 bytes per commit (the journal's record for one key, unaligned,
    /// back to back), `pwrite` + `fdatasync`.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_bench_compare::contender::Contender as _;
    ///
    /// let floor = dedupkv_bench_compare::floor::Floor::fdatasync_record();
    /// assert_eq!(floor.id(), "floor-record");
    /// ```
    pub fn fdatasync_record() -> Self {
        Floor {
            id: "floor-record",
            bytes: 168,
            dsync: false,
        }
    }
}

impl Contender for Floor {
    fn id(&self) -> &'static str {
        self.id
    }

    fn name(&self) -> String {
        let sync = if self.dsync { "O_DSYNC" } else { "fdatasync" };
        format!("floor: {} B pwrite + {sync}", self.bytes)
    }

    fn durability(&self) -> &'static str {
        "durable: no engine, the write and sync alone"
    }

    fn open(&self, _expected_keys: usize) -> Result<Box<dyn Instance>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("floor");
        {
            let f = File::create(&path)?;
            let zeros = vec![0u8; 1 << 20];
            let mut at = 0;
            while at < FILE_BYTES {
                f.write_all_at(&zeros, at)?;
                at += zeros.len() as u64;
            }
            f.sync_all()?;
        }
        let mut opts = OpenOptions::new();
        opts.write(true);
        if self.dsync {
            #[cfg(target_os = "linux")]
            std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, O_DSYNC);
        }
        let file = opts.open(&path)?;
        Ok(Box::new(FloorInstance {
            file: Arc::new(Mutex::new(State {
                file,
                at: 0,
                keys: HashSet::new(),
            })),
            bytes: vec![0xA5; self.bytes],
            dsync: self.dsync,
            _dir: dir,
        }))
    }
}

/// The file, the next offset, and the keys seen.
struct State {
    file: File,
    at: u64,
    keys: HashSet<Key16>,
}

struct FloorInstance {
    file: Arc<Mutex<State>>,
    bytes: Vec<u8>,
    dsync: bool,
    _dir: TempDir,
}

impl Instance for FloorInstance {
    fn worker(&self) -> Result<Box<dyn Worker>> {
        Ok(Box::new(FloorWorker {
            file: Arc::clone(&self.file),
            bytes: self.bytes.clone(),
            dsync: self.dsync,
        }))
    }
}

struct FloorWorker {
    file: Arc<Mutex<State>>,
    bytes: Vec<u8>,
    dsync: bool,
}

impl FloorWorker {
    /// One durable write at the next offset; how many of `keys` are new.
    fn commit(&self, keys: &[Key16]) -> Result<usize> {
        let mut s = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let len = self.bytes.len() as u64;
        if s.at + len > FILE_BYTES {
            s.at = 0;
        }
        s.file.write_all_at(&self.bytes, s.at)?;
        if !self.dsync {
            s.file.sync_data()?;
        }
        s.at += len;
        Ok(keys.iter().filter(|k| s.keys.insert(**k)).count())
    }
}

impl Worker for FloorWorker {
    fn insert_batch(&mut self, keys: &[Key16]) -> Result<usize> {
        self.commit(keys)
    }

    fn begin_complete(&mut self, key: &Key16, _outcome: &[u8]) -> Result<bool> {
        let new = self.commit(std::slice::from_ref(key))? == 1;
        if new {
            self.commit(&[])?;
        }
        Ok(new)
    }
}
