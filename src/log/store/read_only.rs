//! The redb file of a read-only open, as redb sees it: the file, opened for
//! reading only, under an image in memory that takes every byte redb
//! writes.
//!
//! redb opens a file it may write: it repairs a file a crash left (or one
//! a live writer holds open, whose header says the same), writes its
//! header at open and its allocator state at close, and the open's first
//! commit writes too. Here all of that lands in memory, so a read-only
//! open recovers and starts exactly as a writable one does, and the file
//! is never changed.
//!
//! Invariants:
//! - the file is opened for reading only, and nothing here opens it
//!   otherwise: no write, truncation, sync or lock can reach it;
//! - a read sees the bytes redb wrote where it wrote them, and elsewhere
//!   the file's bytes below the shortest length the image has had (the
//!   file's length at the open, or a length redb cut it to since), and
//!   zeros above it;
//! - no lock is taken (every lock call answers redb's `Unsupported`, so
//!   redb opens without one): a writer that holds the file, or opens it
//!   later, never waits for this image or fails because of it;
//! - every storage call of a read-only store runs under `catch_unwind`
//!   ([`Guarded`]): a writer's commits may reuse pages the image still
//!   reads, and redb can panic on what it then finds; that is an error
//!   naming the file, never a panic in the caller.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::RangeInclusive;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use super::{Commit, LogStore, MetaEntries, Rows, StoreResult, Table, View};
use crate::log::error::LogError;
use crate::sync::RwLock;

/// The size of the pieces the image keeps, in bytes (redb's page size).
const PIECE: u64 = 4096;

/// A file under an image in memory (see the module's invariants).
pub(crate) struct Image {
    file: File,
    state: RwLock<State>,
}

struct State {
    /// The image's length.
    len: u64,
    /// The file's bytes below this show where redb wrote nothing: its
    /// length at the open, or the shortest length redb set since.
    visible: u64,
    /// What redb wrote, in pieces of [`PIECE`] bytes, by piece number.
    pieces: BTreeMap<u64, Box<[u8]>>,
}

impl Image {
    /// An image of `file` (opened for reading), `len` bytes long.
    pub(crate) fn new(file: File, len: u64) -> Image {
        Image {
            file,
            state: RwLock::new(State {
                len,
                visible: len,
                pieces: BTreeMap::new(),
            }),
        }
    }
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.read();
        f.debug_struct("Image")
            .field("len", &st.len)
            .field("pieces", &st.pieces.len())
            .finish_non_exhaustive()
    }
}

impl State {
    /// `out`, filled from `at` with what lies beneath the pieces: the
    /// file's bytes below `visible`, zeros above.
    fn beneath(&self, file: &File, at: u64, out: &mut [u8]) -> io::Result<()> {
        let from_file = usize::try_from(self.visible.saturating_sub(at))
            .map_or(out.len(), |n| n.min(out.len()));
        let (file_part, zeros) = out.split_at_mut(from_file);
        read_at(file, at, file_part)?;
        zeros.fill(0);
        Ok(())
    }
}

impl super::PageBackend for Image {
    fn len(&self) -> io::Result<u64> {
        Ok(self.state.read().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let st = self.state.read();
        let end = offset.saturating_add(out.len() as u64);
        if end > st.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "a read of {} bytes at {offset} passes the end ({})",
                    out.len(),
                    st.len
                ),
            ));
        }
        if out.is_empty() {
            return Ok(());
        }
        let mut at = offset;
        for (&n, piece) in st.pieces.range(offset / PIECE..=(end - 1) / PIECE) {
            let start = n * PIECE;
            if at < start {
                let (from, to) = (offset_in(at, offset), offset_in(start, offset));
                st.beneath(&self.file, at, &mut out[from..to])?;
                at = start;
            }
            let stop = end.min(start + PIECE);
            let (from, to) = (offset_in(at, offset), offset_in(stop, offset));
            let inside = offset_in(at, start);
            out[from..to].copy_from_slice(&piece[inside..inside + (to - from)]);
            at = stop;
        }
        if at < end {
            let from = offset_in(at, offset);
            st.beneath(&self.file, at, &mut out[from..])?;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = self.state.write();
        if len < st.len {
            st.visible = st.visible.min(len);
            let first_gone = len.div_ceil(PIECE);
            st.pieces.split_off(&first_gone);
            // The piece the new end falls in keeps nothing past it.
            if !len.is_multiple_of(PIECE)
                && let Some(piece) = st.pieces.get_mut(&(len / PIECE))
            {
                piece[offset_in(len, len / PIECE * PIECE)..].fill(0);
            }
        }
        st.len = len;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut st = self.state.write();
        let end = offset.saturating_add(data.len() as u64);
        let mut at = offset;
        while at < end {
            let n = at / PIECE;
            let start = n * PIECE;
            if !st.pieces.contains_key(&n) {
                let mut piece = vec![0u8; PIECE as usize].into_boxed_slice();
                st.beneath(&self.file, start, &mut piece)?;
                st.pieces.insert(n, piece);
            }
            let stop = end.min(start + PIECE);
            let from = offset_in(at, offset);
            let len = offset_in(stop, at);
            if let Some(piece) = st.pieces.get_mut(&n) {
                let inside = offset_in(at, start);
                piece[inside..inside + len].copy_from_slice(&data[from..from + len]);
            }
            at = stop;
        }
        st.len = st.len.max(end);
        Ok(())
    }
}

/// The storage of a read-only open: each call of the store under it runs
/// under `catch_unwind`, and so does each row its iterators yield.
///
/// Once a call failed (a panic of the storage engine, a damaged or missing
/// row), or when the file changed since the open (a live writer wrote to
/// it), the storage is never closed: redb's close writes its allocator
/// state, reading pages that may be inconsistent now, and a second panic
/// inside that close's own clean-up would abort the process. Such a
/// handle's memory (the image's written pages, redb's cache) is left to
/// the process instead; a handle on a file nobody wrote meanwhile closes
/// normally.
pub(crate) struct Guarded {
    /// `None` only once dropped.
    inner: Option<Box<dyn LogStore>>,
    watch: std::sync::Arc<Watch>,
}

/// The file a guarded storage reads, whether a call of it failed, and the
/// file's length and modification time when it was opened.
struct Watch {
    path: PathBuf,
    damaged: std::sync::atomic::AtomicBool,
    opened: Option<(u64, std::time::SystemTime)>,
}

/// The length and modification time of the file at `path`, if readable.
fn stamp(path: &std::path::Path) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

impl Guarded {
    /// `inner`, the storage of the file at `path`, guarded.
    pub(crate) fn new(inner: Box<dyn LogStore>, path: PathBuf) -> Guarded {
        Guarded {
            inner: Some(inner),
            watch: std::sync::Arc::new(Watch {
                opened: stamp(&path),
                path,
                damaged: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }
}

impl Guarded {
    /// The storage under the guard.
    fn store(&self) -> StoreResult<&dyn LogStore> {
        self.inner
            .as_deref()
            .ok_or_else(|| LogError::Corrupt(format!("{} is closed", self.watch.path.display())))
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        let w = &self.watch;
        let changed = w.opened.is_none() || stamp(&w.path) != w.opened;
        if changed || w.damaged.load(std::sync::atomic::Ordering::Acquire) {
            std::mem::forget(inner); // left unclosed: see the type's comment
            return;
        }
        let _ = catch_unwind(AssertUnwindSafe(move || drop(inner)));
    }
}

/// `f()`; a panic in it is [`LogError::Corrupt`] naming the file, and any
/// error marks the storage damaged.
fn guard<T>(watch: &Watch, f: impl FnOnce() -> StoreResult<T>) -> StoreResult<T> {
    let res = catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|panic| Err(panicked(&watch.path, &*panic)));
    match res {
        Ok(v) => Ok(v),
        Err(e) => {
            watch
                .damaged
                .store(true, std::sync::atomic::Ordering::Release);
            // An I/O error on a file that changed since the open (a read
            // past the end a writer moved) is that change, not the disk.
            if matches!(e, LogError::Storage(_)) && stamp(&watch.path) != watch.opened {
                return Err(LogError::Corrupt(format!(
                    "{} changed under this read-only handle ({e}): reopen it",
                    watch.path.display()
                )));
            }
            Err(e)
        }
    }
}

/// What a panic of the storage engine reading `path` is.
fn panicked(path: &std::path::Path, panic: &(dyn std::any::Any + Send)) -> LogError {
    LogError::Corrupt(format!(
        "the storage engine panicked reading {} ({}): a writer changed the file under this \
         read-only handle (reopen it), or the file is damaged",
        path.display(),
        crate::error::panic_message(panic)
    ))
}

/// Rows whose every step is guarded.
fn guarded_rows(rows: Rows, watch: &std::sync::Arc<Watch>) -> Rows {
    let watch = std::sync::Arc::clone(watch);
    let mut rows = Some(rows);
    Box::new(std::iter::from_fn(move || {
        let it = rows.as_mut()?;
        match catch_unwind(AssertUnwindSafe(|| it.next())) {
            Ok(Some(Err(e))) => {
                watch
                    .damaged
                    .store(true, std::sync::atomic::Ordering::Release);
                Some(Err(e))
            }
            Ok(next) => next,
            Err(panic) => {
                // The iterator is not asked again after a panic.
                rows = None;
                watch
                    .damaged
                    .store(true, std::sync::atomic::Ordering::Release);
                Some(Err(panicked(&watch.path, &*panic)))
            }
        }
    }))
}

impl LogStore for Guarded {
    fn read_meta(&self) -> StoreResult<Option<MetaEntries>> {
        guard(&self.watch, || self.store()?.read_meta())
    }

    fn table_names(&self) -> StoreResult<Vec<String>> {
        guard(&self.watch, || self.store()?.table_names())
    }

    fn check_bucket(&self, bucket: u64) -> StoreResult<()> {
        guard(&self.watch, || self.store()?.check_bucket(bucket))
    }

    fn read_row(&self, bucket: u64, row: u64) -> StoreResult<Option<Vec<u8>>> {
        let found = guard(&self.watch, || self.store()?.read_row(bucket, row))?;
        if found.is_none() {
            // Nothing is deleted from a read-only store: the log answers
            // this as damage.
            self.watch
                .damaged
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(found)
    }

    fn tables(&self) -> StoreResult<Vec<(u64, Table)>> {
        let tables = guard(&self.watch, || self.store()?.tables())?;
        Ok(tables
            .into_iter()
            .map(|(b, t)| (b, self.table_of(t)))
            .collect())
    }

    fn row_range(&self, bucket: u64, rows: RangeInclusive<u64>) -> StoreResult<Rows> {
        let rows = guard(&self.watch, || self.store()?.row_range(bucket, rows))?;
        Ok(guarded_rows(rows, &self.watch))
    }

    fn view(&self) -> StoreResult<View> {
        let view = guard(&self.watch, || self.store()?.view())?;
        Ok(View {
            meta: view.meta,
            tables: view
                .tables
                .into_iter()
                .map(|(b, rows)| (b, guarded_rows(rows, &self.watch)))
                .collect(),
        })
    }

    fn last_row(&self) -> StoreResult<u64> {
        guard(&self.watch, || self.store()?.last_row())
    }

    fn commit(&self, commit: Commit<'_>) -> StoreResult<()> {
        guard(&self.watch, || self.store()?.commit(commit))
    }

    fn used_bytes(&self) -> StoreResult<Option<u64>> {
        guard(&self.watch, || self.store()?.used_bytes())
    }

    fn compact(&mut self) -> StoreResult<Option<bool>> {
        let watch = std::sync::Arc::clone(&self.watch);
        guard(&watch, || match self.inner.as_deref_mut() {
            Some(inner) => inner.compact(),
            None => Ok(None),
        })
    }
}

impl Guarded {
    fn table_of(&self, t: Table) -> Table {
        Table {
            summary: t.summary,
            rows: guarded_rows(t.rows, &self.watch),
        }
    }
}

/// `at - base` as an index into a buffer that starts at `base` (the
/// callers' buffers are in memory, so the difference fits).
fn offset_in(at: u64, base: u64) -> usize {
    usize::try_from(at - base).unwrap_or(usize::MAX)
}

/// Fills `out` with the file's bytes from `at` (the journal's segment
/// file reads through it too).
#[cfg(unix)]
pub(super) fn read_at(file: &File, at: u64, out: &mut [u8]) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, out, at)
}

/// Fills `out` with the file's bytes from `at`.
#[cfg(windows)]
pub(super) fn read_at(file: &File, mut at: u64, mut out: &mut [u8]) -> io::Result<()> {
    while !out.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, out, at) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                out = &mut out[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::store::PageBackend;

    fn image(bytes: &[u8]) -> (tempfile::TempDir, Image) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, bytes).expect("write");
        let file = File::open(&path).expect("open");
        (dir, Image::new(file, bytes.len() as u64))
    }

    fn read(img: &Image, at: u64, n: usize) -> Vec<u8> {
        let mut out = vec![0xAA; n];
        img.read(at, &mut out).expect("read");
        out
    }

    #[test]
    fn writes_stay_in_memory_and_read_back_over_the_file() -> io::Result<()> {
        let file: Vec<u8> = (0..3 * PIECE).map(|i| (i % 251) as u8).collect();
        let (dir, img) = image(&file);
        let mut want = file.clone();
        // Across a piece boundary, and a whole piece.
        img.write(PIECE - 3, b"abcdef")?;
        want[PIECE as usize - 3..PIECE as usize + 3].copy_from_slice(b"abcdef");
        img.write(2 * PIECE, &[7; PIECE as usize])?;
        want[2 * PIECE as usize..].fill(7);
        assert_eq!(read(&img, 0, want.len()), want);
        assert_eq!(read(&img, PIECE - 5, 10), want[PIECE as usize - 5..][..10]);
        assert_eq!(
            std::fs::read(dir.path().join("f"))?,
            file,
            "the file is untouched"
        );
        Ok(())
    }

    #[test]
    fn a_cut_and_regrown_image_reads_zeros_past_the_cut() -> io::Result<()> {
        let file = vec![9u8; 2 * PIECE as usize];
        let (_dir, img) = image(&file);
        img.write(PIECE, b"xyz")?;
        img.set_len(PIECE + 1)?;
        img.set_len(3 * PIECE)?;
        let got = read(&img, PIECE - 1, 4);
        assert_eq!(got, [9, b'x', 0, 0]);
        assert!(
            read(&img, PIECE + 1, 2 * PIECE as usize - 1)
                .iter()
                .all(|b| *b == 0)
        );
        let mut past = [0u8; 2];
        assert!(img.read(3 * PIECE - 1, &mut past).is_err(), "past the end");
        Ok(())
    }

    #[test]
    fn a_write_past_the_end_grows_the_image() -> io::Result<()> {
        let (_dir, img) = image(b"ab");
        img.write(PIECE + 1, b"z")?;
        assert_eq!(img.len()?, PIECE + 2);
        let got = read(&img, 0, PIECE as usize + 2);
        assert_eq!(&got[..2], b"ab");
        assert!(got[2..=PIECE as usize].iter().all(|b| *b == 0));
        assert_eq!(got[PIECE as usize + 1], b'z');
        Ok(())
    }
}
