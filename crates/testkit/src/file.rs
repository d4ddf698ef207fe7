//! The file-level sibling of [`FaultBackend`]: one file written by appends
//! and writes at offsets, synced, its length read, as a journal writes its
//! segment files, with the same [`Plan`]s (failed writes and syncs, a full
//! disk, torn writes) and the same crash images.
//!
//! Invariants (those of `backend.rs`, which holds the bytes):
//! - handles made by `clone` share the bytes and the plan;
//!   [`FaultFile::healthy`] shares the bytes with a plan of its own;
//!   [`FaultFile::crash_image`] shares nothing;
//! - the durable bytes are the written bytes as of the last successful
//!   [`sync`](FaultFile::sync); a failed write, append or sync makes
//!   nothing durable, and a torn one leaves only its first bytes written;
//! - an append counts as one write against the plan (a file's `write` at
//!   its end), not as a `set_len` and a write.

use std::io;

use dedupkv::PageBackend;

use crate::{FaultBackend, Plan};

/// One file for fault and crash tests at the file level (a journal's
/// segment), where [`FaultBackend`] serves a storage engine's pages.
///
/// # Examples
///
/// ```
/// use dedupkv_testkit::{FaultFile, Plan};
///
/// let file = FaultFile::new();
/// file.append(b"first")?;
/// file.sync()?;
/// file.arm(Plan::after(0).torn(3));
/// assert!(file.append(b"second").is_err());
///
/// // The process dies: the torn tail is in the file.
/// assert_eq!(file.healthy().contents()?, b"firstsec");
/// // The power fails: only what was synced is.
/// assert_eq!(file.crash_image().contents()?, b"first");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct FaultFile {
    bytes: FaultBackend,
}

impl FaultFile {
    /// An empty file that never fails until armed.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(dedupkv_testkit::FaultFile::new().len()?, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `data` at the end; returns the offset it starts at.
    ///
    /// # Errors
    /// The plan's fault; a torn append leaves its first bytes written.
    ///
    /// # Examples
    ///
    /// ```
    /// let file = dedupkv_testkit::FaultFile::new();
    /// assert_eq!(file.append(b"ab")?, 0);
    /// assert_eq!(file.append(b"c")?, 2);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn append(&self, data: &[u8]) -> io::Result<u64> {
        self.bytes.append_counted(data)
    }

    /// Writes `data` at `offset`, within the file's length (a
    /// preallocated segment).
    ///
    /// # Errors
    /// The plan's fault; a torn write leaves its first bytes written.
    ///
    /// # Examples
    ///
    /// ```
    /// let file = dedupkv_testkit::FaultFile::new();
    /// file.set_len(4)?;
    /// file.write_at(1, b"xy")?;
    /// assert_eq!(file.contents()?, b"\0xy\0");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.bytes.write_counted(offset, data)
    }

    /// Sets the file's length (bytes it adds read as zero).
    ///
    /// # Errors
    /// The plan's fault.
    ///
    /// # Examples
    /// See [`write_at`](Self::write_at).
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        self.bytes.set_len(len)
    }

    /// Makes every write before it durable.
    ///
    /// # Errors
    /// The plan's fault: nothing written since the last successful sync
    /// is durable.
    ///
    /// # Examples
    /// See [`FaultFile`].
    pub fn sync(&self) -> io::Result<()> {
        self.bytes.sync_data()
    }

    /// The file's length as written (synced or not).
    ///
    /// # Errors
    /// Never, in memory; the signature is a file's.
    ///
    /// # Examples
    /// See [`new`](Self::new).
    pub fn len(&self) -> io::Result<u64> {
        self.bytes.len()
    }

    /// Whether the file is empty.
    ///
    /// # Errors
    /// As [`len`](Self::len).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(dedupkv_testkit::FaultFile::new().is_empty()?);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Every byte of the file as written (synced or not).
    ///
    /// # Errors
    /// As [`len`](Self::len).
    ///
    /// # Examples
    /// See [`FaultFile`].
    pub fn contents(&self) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.len()?).map_err(io::Error::other)?;
        let mut out = vec![0; len];
        self.bytes.read(0, &mut out)?;
        Ok(out)
    }

    /// Fails by `plan`, counting from now (see [`FaultBackend::arm`]).
    ///
    /// # Examples
    /// See [`FaultFile`].
    pub fn arm(&self, plan: Plan) {
        self.bytes.arm(plan);
    }

    /// Stops failing (see [`FaultBackend::disarm`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_testkit::{FaultFile, Plan};
    ///
    /// let file = FaultFile::new();
    /// file.arm(Plan::after(0));
    /// file.disarm();
    /// file.append(b"x")?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn disarm(&self) {
        self.bytes.disarm();
    }

    /// Whether a plan of this handle (or its clones) has fired, ever.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(!dedupkv_testkit::FaultFile::new().tripped());
    /// ```
    pub fn tripped(&self) -> bool {
        self.bytes.tripped()
    }

    /// A handle on the same bytes with no plan of its own: the file as a
    /// process that reopens it after a crash of the writer finds it.
    ///
    /// # Examples
    /// See [`FaultFile`].
    #[must_use]
    pub fn healthy(&self) -> Self {
        Self {
            bytes: self.bytes.healthy(),
        }
    }

    /// A new, healthy file holding only the durable bytes: what a power
    /// cut at this moment would leave.
    ///
    /// # Examples
    /// See [`FaultFile`].
    #[must_use]
    pub fn crash_image(&self) -> Self {
        Self {
            bytes: self.bytes.crash_image(),
        }
    }
}

/// A fault file is a [`PageBackend`] (a journal's segment under test): a
/// write is counted as [`FaultFile::write_at`], a sync as
/// [`FaultFile::sync`].
impl PageBackend for FaultFile {
    fn len(&self) -> io::Result<u64> {
        FaultFile::len(self)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.bytes.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        FaultFile::set_len(self, len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_at(offset, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_sync_leaves_the_appends_written_but_not_durable() -> io::Result<()> {
        let file = FaultFile::new();
        file.append(b"kept")?;
        file.sync()?;
        file.arm(Plan::after(0).syncs_only());
        file.append(b"lost")?;
        assert!(file.sync().is_err());
        assert_eq!(file.contents()?, b"keptlost");
        assert_eq!(file.crash_image().contents()?, b"kept");
        assert!(file.append(b"x").is_err(), "sticky once fired");
        Ok(())
    }

    #[test]
    fn a_torn_append_keeps_its_first_bytes_and_nothing_after_it() -> io::Result<()> {
        let file = FaultFile::new();
        file.arm(Plan::after(1).torn(2));
        file.append(b"one")?;
        assert!(file.append(b"two").is_err());
        assert!(file.tripped());
        assert_eq!(file.len()?, 5);
        assert!(file.append(b"three").is_err(), "sticky once fired");
        assert!(file.sync().is_err(), "a sync after the tear fails too");
        let reopened = file.healthy();
        assert_eq!(reopened.contents()?, b"onetw");
        assert_eq!(file.crash_image().contents()?, b"", "nothing was synced");
        Ok(())
    }

    #[test]
    fn a_torn_write_at_an_offset_keeps_its_first_bytes() -> io::Result<()> {
        let file = FaultFile::new();
        file.set_len(6)?;
        file.write_at(0, b"abcdef")?;
        file.sync()?;
        file.arm(Plan::after(0).torn(3));
        assert!(file.write_at(0, b"uvwxyz").is_err());
        assert_eq!(file.contents()?, b"uvwdef");
        assert_eq!(file.crash_image().contents()?, b"abcdef");
        Ok(())
    }

    #[test]
    fn an_append_counts_as_one_write() -> io::Result<()> {
        let file = FaultFile::new();
        file.arm(Plan::after(2));
        file.append(b"a")?;
        file.append(b"b")?;
        assert!(file.append(b"c").is_err(), "the third write fails");
        Ok(())
    }

    #[test]
    fn a_full_disk_writes_nothing() -> io::Result<()> {
        let file = FaultFile::new();
        file.arm(Plan::after(0).disk_full());
        let err = file.append(b"abc").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(28));
        assert_eq!(file.len()?, 0);
        Ok(())
    }
}
