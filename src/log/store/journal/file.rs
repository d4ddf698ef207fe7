//! A journal segment on disk, as a [`PageBackend`]: reads and writes at
//! offsets, `fdatasync`, and a `set_len` that grows the file by writing
//! zeros, so every block of a preallocated segment is allocated and
//! written once: a later overwrite and its `fdatasync` change no file
//! metadata (an extent left unwritten by `fallocate` would be converted,
//! a metadata change, on its first write).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::super::PageBackend;
use super::super::read_only::read_at;

/// One segment file.
#[derive(Debug)]
pub(crate) struct SegmentFile {
    file: File,
    path: PathBuf,
}

impl SegmentFile {
    /// Opens the segment at `path`, creating an empty one if `create`
    /// (readable and writable by its owner only, as the store file); for
    /// reading only if `!write`. `None` when it is missing and not created.
    pub(crate) fn open(path: &Path, write: bool, create: bool) -> io::Result<Option<SegmentFile>> {
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true).write(write).create(create && write);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        match opts.open(path) {
            Ok(file) => Ok(Some(SegmentFile {
                file,
                path: path.to_path_buf(),
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl PageBackend for SegmentFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        read_at(&self.file, offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut at = self.len()?;
        if len <= at {
            return self.file.set_len(len);
        }
        let zeros = vec![0u8; 1 << 20];
        while at < len {
            let n = usize::try_from(len - at).map_or(zeros.len(), |n| n.min(zeros.len()));
            write_at(&self.file, at, &zeros[..n])?;
            at += n as u64;
        }
        // The new length and the directory entry, once.
        self.file.sync_all()?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            sync_dir(dir);
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        write_at(&self.file, offset, data)
    }
}

/// Makes a directory's entries durable where the platform can (a failure
/// is not an error: the segment is synced again before it holds a commit).
pub(crate) fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

#[cfg(unix)]
fn write_at(file: &File, at: u64, data: &[u8]) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, data, at)
}

#[cfg(windows)]
fn write_at(file: &File, mut at: u64, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match std::os::windows::fs::FileExt::seek_write(file, data, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                data = &data[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
