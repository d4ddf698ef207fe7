//! One storage backend for every fault and crash test: bytes in a redb
//! [`InMemoryBackend`] that outlive the store, faults injected by a
//! [`Plan`], and the bytes a power cut would leave kept apart from the
//! written ones.
//!
//! Invariants:
//! - Handles made by `clone` share the bytes and the plan; [`FaultBackend::healthy`]
//!   shares the bytes with a plan of its own; [`FaultBackend::crash_image`]
//!   shares nothing.
//! - The durable bytes are the written bytes as of the last successful
//!   `sync_data`. A write, `set_len` or sync that fails changes nothing.
//! - Once a plan fires, every later write, `set_len` and sync of its
//!   handles fails the same way until the plan is replaced or disarmed.
//!   Reads never fail.
//!
//! The kit must work under loom (`--cfg dedupkv_loom`), so it takes its
//! locks and atomics from `parking_lot` and `std`, never from dedupkv.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use redb::StorageBackend;
use redb::backends::InMemoryBackend;

/// `ENOSPC` on Linux (the kit is also built by the fuzz crate, which has
/// no `libc`).
const ENOSPC: i32 = 28;

/// What a [`FaultBackend`] does wrong, and when: after `n` counted
/// operations succeed, the next one fails, and so does every write,
/// `set_len` and sync after it.
///
/// Default: writes, `set_len` and syncs are counted, and the failure is a
/// plain I/O error.
///
/// # Examples
///
/// ```
/// use dedupkv_testkit::Plan;
///
/// let _io = Plan::after(3); // the 4th write, set_len or sync fails
/// let _full = Plan::after(0).disk_full(); // the next one fails with ENOSPC
/// let _sync = Plan::after(1).syncs_only(); // one more commit, then its sync fails
/// let _bug = Plan::after(0).panics(); // the next one panics
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Plan {
    after: u64,
    syncs_only: bool,
    fault: Fault,
}

/// How an injected failure shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Io,
    DiskFull,
    Panic,
    /// A write that fails keeps this many of its first bytes (a torn
    /// write); anything else fails as `Io`.
    Torn(usize),
}

impl Plan {
    /// Lets `n` counted operations succeed and fails the next.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::{FaultBackend, Plan};
    /// use dedupkv::PageBackend;
    ///
    /// let backend = FaultBackend::new();
    /// backend.arm(Plan::after(1));
    /// assert!(backend.set_len(4096).is_ok());
    /// assert!(backend.write(0, b"x").is_err());
    /// assert!(backend.sync_data().is_err(), "sticky once fired");
    /// assert!(backend.tripped());
    /// ```
    pub fn after(n: u64) -> Self {
        Self {
            after: n,
            syncs_only: false,
            fault: Fault::Io,
        }
    }

    /// Counts syncs only (one per commit): writes and `set_len` succeed
    /// until a sync fails, so the failing commit's pages are written but
    /// never durable.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::{FaultBackend, Plan};
    /// use dedupkv::PageBackend;
    ///
    /// let backend = FaultBackend::new();
    /// backend.arm(Plan::after(0).syncs_only());
    /// backend.set_len(4096)?;
    /// backend.write(0, b"x")?;
    /// assert!(backend.sync_data().is_err());
    /// assert!(backend.write(0, b"y").is_err(), "sticky once fired");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn syncs_only(self) -> Self {
        Self {
            syncs_only: true,
            ..self
        }
    }

    /// Fails with "No space left on device" (`ENOSPC`), as a full disk does.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::{FaultBackend, Plan};
    /// use dedupkv::PageBackend;
    ///
    /// let backend = FaultBackend::new();
    /// backend.arm(Plan::after(0).disk_full());
    /// let err = backend.set_len(4096).unwrap_err();
    /// assert_eq!(err.raw_os_error(), Some(28));
    /// ```
    pub fn disk_full(self) -> Self {
        Self {
            fault: Fault::DiskFull,
            ..self
        }
    }

    /// Panics instead of returning an error: a bug in the storage engine.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::panic::{AssertUnwindSafe, catch_unwind};
    ///
    /// use dedupkv_testkit::{FaultBackend, Plan};
    /// use dedupkv::PageBackend;
    ///
    /// let backend = FaultBackend::new();
    /// backend.arm(Plan::after(0).panics());
    /// let panicked = catch_unwind(AssertUnwindSafe(|| backend.set_len(4096)));
    /// assert!(panicked.is_err());
    /// ```
    pub fn panics(self) -> Self {
        Self {
            fault: Fault::Panic,
            ..self
        }
    }

    /// The write that fails is torn: its first `keep` bytes are written
    /// (not durable until a sync, and every later sync fails), the rest
    /// are not, and it returns an I/O error, as a process killed or a
    /// disk failing in the middle of a write leaves it. Writes after it
    /// fail whole, and a failing `set_len` or sync is a plain I/O error.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv::PageBackend;
    /// use dedupkv_testkit::{FaultBackend, Plan};
    ///
    /// let backend = FaultBackend::new();
    /// backend.set_len(4)?;
    /// backend.arm(Plan::after(0).torn(2));
    /// assert!(backend.write(0, b"abcd").is_err());
    /// let mut bytes = [0; 4];
    /// backend.read(0, &mut bytes)?;
    /// assert_eq!(&bytes, b"ab\0\0");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn torn(self, keep: usize) -> Self {
        Self {
            fault: Fault::Torn(keep),
            ..self
        }
    }
}

/// A [`PageBackend`](dedupkv::PageBackend) in memory for fault and crash tests.
///
/// - Its bytes outlive the store: open a store on a clone, drop or poison
///   it, and reopen the same bytes with [`healthy`](Self::healthy).
/// - It fails on purpose once [`arm`](Self::arm)ed with a [`Plan`].
/// - It keeps the written bytes apart from the durable (synced) ones, as a
///   page cache sits in front of a disk: [`crash_image`](Self::crash_image)
///   is what a power cut would leave.
///
/// # Examples
///
/// ```
/// use dedupkv::{Key, Store};
/// use dedupkv_testkit::{FaultBackend, Plan};
///
/// let backend = FaultBackend::new();
/// let store = Store::builder().open_with_backend(backend.clone())?;
/// assert!(store.insert_if_absent(&Key::new("t", "a"))?);
/// backend.arm(Plan::after(0));
/// assert!(store.insert_if_absent(&Key::new("t", "b")).is_err());
///
/// // A power cut now keeps what was acknowledged.
/// let image = backend.crash_image();
/// let reopened = Store::builder().open_with_backend(image)?;
/// assert!(!reopened.insert_if_absent(&Key::new("t", "a"))?);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct FaultBackend {
    disk: Arc<Disk>,
    faults: Arc<Faults>,
}

/// The bytes: written ones in `written`, and what a sync made durable.
#[derive(Debug)]
struct Disk {
    written: InMemoryBackend,
    /// Locked around every change to `written`, so a sync copies one state.
    durable: Mutex<Durable>,
}

#[derive(Debug, Default)]
struct Durable {
    bytes: Vec<u8>,
    /// Ranges written since the last sync (offset to the longest length).
    dirty: BTreeMap<u64, usize>,
    /// The shortest length since the last sync: bytes past it that were
    /// cut off and grown back are zeros unless written again.
    shortest: u64,
}

#[derive(Debug, Default)]
struct Faults {
    armed: Mutex<Option<Armed>>,
    tripped: AtomicBool,
    /// Syncs wait while this is set (a disk as slow as the test says).
    held: Mutex<bool>,
    released: parking_lot::Condvar,
}

#[derive(Debug)]
struct Armed {
    plan: Plan,
    counted: u64,
    fired: bool,
}

/// The operations a plan may fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Sync,
}

impl Default for FaultBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultBackend {
    /// An empty backend that never fails until armed.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv::Store;
    /// use dedupkv_testkit::FaultBackend;
    ///
    /// let _store = Store::builder().open_with_backend(FaultBackend::new())?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn new() -> Self {
        Self::holding(Vec::new())
    }

    fn holding(bytes: Vec<u8>) -> Self {
        let written = InMemoryBackend::new();
        let len = bytes.len() as u64;
        // An empty in-memory backend accepts `set_len` and in-range writes.
        let filled = written.set_len(len).and_then(|()| written.write(0, &bytes));
        debug_assert!(filled.is_ok(), "in-memory backend refused its fill");
        Self {
            disk: Arc::new(Disk {
                written,
                durable: Mutex::new(Durable {
                    bytes,
                    dirty: BTreeMap::new(),
                    shortest: len,
                }),
            }),
            faults: Arc::default(),
        }
    }

    /// Fails by `plan`, counting from now (replacing any earlier plan of
    /// this handle and its clones).
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::{FaultBackend, Plan};
    /// use dedupkv::PageBackend;
    ///
    /// let backend = FaultBackend::new();
    /// backend.arm(Plan::after(0));
    /// assert!(backend.set_len(1).is_err());
    /// ```
    pub fn arm(&self, plan: Plan) {
        *self.faults.armed.lock() = Some(Armed {
            plan,
            counted: 0,
            fired: false,
        });
    }

    /// Stops failing: every operation succeeds again.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::{FaultBackend, Plan};
    /// use dedupkv::PageBackend;
    ///
    /// let backend = FaultBackend::new();
    /// backend.arm(Plan::after(0));
    /// backend.disarm();
    /// assert!(backend.set_len(1).is_ok());
    /// ```
    pub fn disarm(&self) {
        *self.faults.armed.lock() = None;
    }

    /// Makes every sync of this handle (and its clones) wait until
    /// [`release_syncs`](Self::release_syncs): a disk exactly as slow as
    /// the test needs, so a commit is in flight for as long as it likes.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::FaultBackend;
    /// use dedupkv::PageBackend;
    ///
    /// let backend = FaultBackend::new();
    /// backend.hold_syncs();
    /// let other = backend.clone();
    /// let sync = std::thread::spawn(move || other.sync_data());
    /// backend.release_syncs();
    /// sync.join().unwrap()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn hold_syncs(&self) {
        *self.faults.held.lock() = true;
    }

    /// Lets held syncs (and later ones) go on.
    ///
    /// # Examples
    /// See [`hold_syncs`](Self::hold_syncs).
    pub fn release_syncs(&self) {
        *self.faults.held.lock() = false;
        self.faults.released.notify_all();
    }

    /// Whether a plan of this handle (or its clones) has fired, ever.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::FaultBackend;
    ///
    /// assert!(!FaultBackend::new().tripped());
    /// ```
    pub fn tripped(&self) -> bool {
        self.faults.tripped.load(Ordering::SeqCst)
    }

    /// A handle on the same bytes with no plan of its own (for reopening,
    /// or for a plan that leaves this handle healthy).
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::{FaultBackend, Plan};
    /// use dedupkv::PageBackend;
    ///
    /// let backend = FaultBackend::new();
    /// backend.arm(Plan::after(0));
    /// let healthy = backend.healthy();
    /// healthy.set_len(1)?;
    /// assert_eq!(backend.len()?, 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    #[must_use]
    pub fn healthy(&self) -> Self {
        Self {
            disk: Arc::clone(&self.disk),
            faults: Arc::default(),
        }
    }

    /// A new, healthy backend holding only the durable bytes: what a power
    /// cut at this moment would leave.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::FaultBackend;
    /// use dedupkv::PageBackend;
    ///
    /// let backend = FaultBackend::new();
    /// backend.set_len(2)?;
    /// backend.write(0, b"ab")?;
    /// backend.sync_data()?;
    /// backend.write(0, b"x")?;
    /// let image = backend.crash_image();
    /// let mut bytes = [0; 2];
    /// image.read(0, &mut bytes)?;
    /// assert_eq!(&bytes, b"ab");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    #[must_use]
    pub fn crash_image(&self) -> Self {
        let durable = self.disk.durable.lock();
        Self::holding(durable.bytes.clone())
    }

    /// Live handles on the bytes, this one included (an open store holds
    /// one).
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::FaultBackend;
    ///
    /// let backend = FaultBackend::new();
    /// let _healthy = backend.healthy();
    /// assert_eq!(backend.handles(), 2);
    /// ```
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.disk)
    }

    /// Counts `op` against the plan and fails it if the plan says so.
    fn check(&self, op: Op) -> io::Result<()> {
        match self.fault(op) {
            None => Ok(()),
            Some(fault) => Err(failure(fault)),
        }
    }

    /// Counts `op` against the plan: the fault to inject, if it fails.
    fn fault(&self, op: Op) -> Option<Fault> {
        let fault = {
            let mut armed = self.faults.armed.lock();
            let armed = armed.as_mut()?;
            if armed.fired {
                // Only the write that fired is torn; later ones fail whole.
                match armed.plan.fault {
                    Fault::Torn(_) => Fault::Io,
                    f => f,
                }
            } else {
                if armed.plan.syncs_only && op != Op::Sync {
                    return None;
                }
                if armed.counted < armed.plan.after {
                    armed.counted += 1;
                    return None;
                }
                armed.fired = true;
                armed.plan.fault
            }
        };
        self.faults.tripped.store(true, Ordering::SeqCst);
        Some(fault)
    }

    /// Writes `data` at `offset` as counted by the plan: a torn write
    /// keeps its first bytes and fails.
    pub(crate) fn write_counted(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if let Some(fault) = self.fault(Op::Write) {
            if let Fault::Torn(keep) = fault {
                self.write_unchecked(offset, &data[..keep.min(data.len())])?;
            }
            return Err(failure(fault));
        }
        self.write_unchecked(offset, data)
    }

    /// `set_len` and `write` at the end, counted by the plan as one write
    /// (a file's append); returns where the bytes went. A torn append
    /// keeps its first bytes and fails.
    pub(crate) fn append_counted(&self, data: &[u8]) -> io::Result<u64> {
        let fault = self.fault(Op::Write);
        let at = self.disk.written.len()?;
        let keep = match fault {
            None => data.len(),
            Some(Fault::Torn(keep)) => keep.min(data.len()),
            Some(f) => return Err(failure(f)),
        };
        self.set_len_unchecked(at + keep as u64)?;
        self.write_unchecked(at, &data[..keep])?;
        match fault {
            None => Ok(at),
            Some(f) => Err(failure(f)),
        }
    }

    fn set_len_unchecked(&self, len: u64) -> io::Result<()> {
        let mut durable = self.disk.durable.lock();
        self.disk.written.set_len(len)?;
        durable.shortest = durable.shortest.min(len);
        Ok(())
    }

    fn write_unchecked(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut durable = self.disk.durable.lock();
        self.disk.written.write(offset, data)?;
        let n = durable.dirty.entry(offset).or_default();
        *n = (*n).max(data.len());
        Ok(())
    }
}

/// The error (or panic) an injected fault shows as.
fn failure(fault: Fault) -> io::Error {
    match fault {
        Fault::Io | Fault::Torn(_) => io::Error::other("injected I/O failure"),
        Fault::DiskFull => io::Error::from_raw_os_error(ENOSPC),
        Fault::Panic => panic!("injected panic in the storage backend"),
    }
}

impl dedupkv::PageBackend for FaultBackend {
    fn len(&self) -> io::Result<u64> {
        self.disk.written.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.disk.written.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check(Op::Write)?;
        self.set_len_unchecked(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        {
            let mut held = self.faults.held.lock();
            while *held {
                self.faults.released.wait(&mut held);
            }
        }
        self.check(Op::Sync)?;
        let mut guard = self.disk.durable.lock();
        let durable = &mut *guard;
        let len = self.disk.written.len()?;
        let shortest = usize::try_from(durable.shortest).map_err(io::Error::other)?;
        durable.bytes.truncate(shortest);
        durable
            .bytes
            .resize(usize::try_from(len).map_err(io::Error::other)?, 0);
        for (&offset, &n) in &durable.dirty {
            let start = usize::try_from(offset).map_err(io::Error::other)?;
            let end = start.saturating_add(n).min(durable.bytes.len());
            if start < end {
                self.disk
                    .written
                    .read(offset, &mut durable.bytes[start..end])?;
            }
        }
        durable.dirty.clear();
        durable.shortest = len;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_counted(offset, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dedupkv::PageBackend;

    fn image_bytes(b: &FaultBackend) -> Vec<u8> {
        let image = b.crash_image();
        let mut out = vec![0; usize::try_from(image.len().unwrap()).unwrap()];
        image.read(0, &mut out).unwrap();
        out
    }

    #[test]
    fn the_crash_image_holds_the_bytes_of_the_last_sync() -> io::Result<()> {
        let b = FaultBackend::new();
        b.set_len(8)?;
        b.write(0, b"abcd")?;
        assert_eq!(image_bytes(&b), b"", "nothing synced yet");
        b.sync_data()?;
        b.write(4, b"efgh")?;
        assert_eq!(image_bytes(&b), b"abcd\0\0\0\0");
        b.sync_data()?;
        assert_eq!(image_bytes(&b), b"abcdefgh");
        Ok(())
    }

    #[test]
    fn bytes_cut_off_and_grown_back_are_zeros_in_the_image() -> io::Result<()> {
        let b = FaultBackend::new();
        b.set_len(8)?;
        b.write(0, b"abcdefgh")?;
        b.sync_data()?;
        b.set_len(2)?;
        b.set_len(8)?;
        b.write(6, b"xy")?;
        b.sync_data()?;
        assert_eq!(image_bytes(&b), b"ab\0\0\0\0xy");
        Ok(())
    }

    #[test]
    fn a_failed_sync_makes_nothing_durable() -> io::Result<()> {
        let b = FaultBackend::new();
        b.set_len(4)?;
        b.write(0, b"abcd")?;
        b.sync_data()?;
        b.arm(Plan::after(0).syncs_only());
        b.write(0, b"wxyz")?;
        assert!(b.sync_data().is_err());
        assert_eq!(image_bytes(&b), b"abcd");
        assert!(
            b.write(0, b"q").is_err(),
            "writes fail after the failed sync"
        );
        Ok(())
    }

    #[test]
    fn a_healthy_handle_ignores_the_plan_and_sees_the_same_bytes() -> io::Result<()> {
        let b = FaultBackend::new();
        b.arm(Plan::after(0));
        let h = b.healthy();
        h.set_len(3)?;
        h.write(0, b"abc")?;
        assert!(b.write(0, b"x").is_err());
        let mut out = [0; 3];
        b.read(0, &mut out)?;
        assert_eq!(&out, b"abc");
        assert!(b.tripped() && !h.tripped());
        Ok(())
    }
}
