//! Helpers shared by the integration tests: storage backends that fail or
//! crash on purpose, and (`model`) the model of the store's semantics that
//! `tests/model.rs` and the `ops` fuzz target drive.
#![allow(dead_code)]

pub mod model;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use redb::StorageBackend;

/// `ENOSPC` on Linux (this kit is shared with the fuzz crate, which has no
/// `libc`).
const ENOSPC: i32 = 28;
use redb::backends::InMemoryBackend;

/// An in-memory backend whose bytes outlive the store, so a test can
/// "reopen" them; after `fail_after` write or sync calls every write and
/// sync fails (until disarmed): with a generic I/O error, with `ENOSPC`
/// (`arm_full`), or by panicking (`arm_panic`).
#[derive(Debug, Clone)]
pub struct FaultyBackend {
    mem: Arc<InMemoryBackend>,
    ops: Arc<AtomicU64>,
    fail_after: Arc<AtomicU64>,
    tripped: Arc<AtomicBool>,
    /// Panic instead of returning the error (a storage engine bug).
    panics: Arc<AtomicBool>,
    /// Fail with `ENOSPC`, as a full disk does.
    full: Arc<AtomicBool>,
}

impl FaultyBackend {
    pub fn new(fail_after: u64) -> Self {
        Self {
            mem: Arc::new(InMemoryBackend::new()),
            ops: Arc::new(AtomicU64::new(0)),
            fail_after: Arc::new(AtomicU64::new(fail_after)),
            tripped: Arc::new(AtomicBool::new(false)),
            panics: Arc::new(AtomicBool::new(false)),
            full: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A handle on the same bytes that never fails (for reopening).
    pub fn healthy(&self) -> Self {
        Self {
            mem: Arc::clone(&self.mem),
            ops: Arc::new(AtomicU64::new(0)),
            fail_after: Arc::new(AtomicU64::new(u64::MAX)),
            tripped: Arc::new(AtomicBool::new(false)),
            panics: Arc::new(AtomicBool::new(false)),
            full: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Panic, rather than fail, from the `n`-th write/sync counted from now.
    pub fn arm_panic(&self, n: u64) {
        self.panics.store(true, Ordering::SeqCst);
        self.arm(n);
    }

    /// Fail with "No space left on device" from the `n`-th write/sync
    /// counted from now.
    pub fn arm_full(&self, n: u64) {
        self.full.store(true, Ordering::SeqCst);
        self.arm(n);
    }

    /// Live handles on the bytes (this one included): the store holds one
    /// while open.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.mem)
    }

    /// Fail from the `n`-th write/sync counted from now.
    pub fn arm(&self, n: u64) {
        self.ops.store(0, Ordering::SeqCst);
        self.fail_after.store(n, Ordering::SeqCst);
    }

    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::SeqCst)
    }

    fn step(&self) -> io::Result<()> {
        let n = self.ops.fetch_add(1, Ordering::SeqCst);
        if n >= self.fail_after.load(Ordering::SeqCst) {
            self.tripped.store(true, Ordering::SeqCst);
            assert!(
                !self.panics.load(Ordering::SeqCst),
                "injected panic in the storage backend"
            );
            if self.full.load(Ordering::SeqCst) {
                return Err(io::Error::from_raw_os_error(ENOSPC));
            }
            return Err(io::Error::other("injected I/O failure"));
        }
        Ok(())
    }
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> io::Result<u64> {
        self.mem.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.mem.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.step()?;
        self.mem.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.step()?;
        self.mem.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.step()?;
        self.mem.write(offset, data)
    }
}

/// A backend that keeps "written" bytes apart from "synced" bytes, the way a
/// page cache sits in front of a disk. `crash_image()` returns what a power
/// cut would leave: the synced bytes only.
#[derive(Debug, Clone, Default)]
pub struct CrashBackend {
    state: Arc<Mutex<CrashState>>,
}

#[derive(Debug, Default)]
struct CrashState {
    written: Vec<u8>,
    synced: Vec<u8>,
}

impl CrashBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// A new backend holding only the bytes that were synced.
    pub fn crash_image(&self) -> Self {
        let s = self.state.lock();
        Self {
            state: Arc::new(Mutex::new(CrashState {
                written: s.synced.clone(),
                synced: s.synced.clone(),
            })),
        }
    }
}

impl StorageBackend for CrashBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.state.lock().written.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let s = self.state.lock();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start + out.len();
        if end > s.written.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past end",
            ));
        }
        out.copy_from_slice(&s.written[start..end]);
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.state.lock().written.resize(len, 0);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        s.synced.clone_from(&s.written);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut s = self.state.lock();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start + data.len();
        if end > s.written.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "write past end",
            ));
        }
        s.written[start..end].copy_from_slice(data);
        Ok(())
    }
}
