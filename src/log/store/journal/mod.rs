//! The journal: a preallocated segment file beside the store, in front of
//! it, so a durable commit is one sequential write and one `fdatasync`
//! (see docs/design.md, "The journal", for the format and the choice).
//!
//! [`JournalStore`] wraps the store of record (redb) under the same
//! [`LogStore`] seam. A commit is appended to the segment as one record
//! and synced; its rows wait in memory (the overlay), where row reads look
//! first. A checkpoint writes every waiting commit into the store in one
//! transaction, with the [`MARK`] entry (the last sequence it holds, and
//! the epoch of the records that follow), makes it durable, and recycles
//! the segment: the next record is written at its start again. A
//! checkpoint is made when the next record would not fit (the writer
//! waits for it: the journal never grows past its segment), before every
//! read other than a row's (scans, metadata, compaction: they read the
//! store), and when the store is dropped.
//!
//! Invariants:
//! - a commit is acknowledged only once its record is synced (or, for a
//!   commit larger than the segment, or the store's first, once the store
//!   of record committed it);
//! - the records replayed at open are exactly those after [`MARK`]'s
//!   sequence, with its epoch, each one more than the last, each whole
//!   under its checksum, from the segment's start; the first that is not
//!   ends the journal (a torn tail, or a recycled segment's stale one);
//! - once a journal write, sync or checkpoint failed, no commit is taken
//!   until the store is reopened (the store's sticky failure);
//! - the header is written once, when the segment is made: damage to it
//!   is an error naming the file, never an empty journal;
//! - a read-only open replays into memory and writes nothing;
//! - a store whose [`MARK`] says it has a journal refuses to open without
//!   the segment (acknowledged commits may be in it).

mod checkpointer;
mod file;
mod format;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use super::{Commit, LogStore, MetaEntries, PageBackend, Rows, StoreResult, Table, View};
use crate::log::error::LogError;
use crate::sync::{Arc, JoinHandle, Mutex, MutexGuard, RwLock};
use crate::{Error, Result};
use format::{FRAME_BYTES, HEADER_BYTES, Owned};

/// The metadata entry of a store kept with a journal: the last sequence
/// the store holds (u64) and the epoch of the records after it (u64).
/// Part of the file format: a build without the journal refuses the store
/// (an unknown entry) instead of missing the journal's commits.
pub(crate) const MARK: &str = "dedupkv.journal";

/// What no sequence or epoch of a journal reaches (see [`read_mark`]).
const MARK_LIMIT: u64 = 1 << 63;

/// The segment's length when the builder does not say. Default: 16 MiB:
/// the disk a store's journal takes, and the most record bytes its
/// overlay holds in memory until checkpointed (two runs); a checkpoint
/// starts every 4 MiB (half of a half: ~25,000 one-key commits, so
/// redb's ~28 KB commit is spread over that many), and a batch larger
/// than a half (8 MiB) goes to redb directly, as batches that large gain
/// nothing from the journal.
pub(crate) const DEFAULT_BYTES: u64 = 16 << 20;
/// The shortest segment: the header and one block of records.
pub(crate) const MIN_BYTES: u64 = 2 * HEADER_BYTES;

/// The journal a store is opened with.
#[derive(Clone, Debug)]
pub(crate) struct JournalSetting {
    /// The segment's length in bytes (when it is made).
    pub bytes: u64,
    /// The segment's medium, for a store opened on a backend (tests);
    /// else the file beside the store ([`journal_path`]).
    pub backend: Option<Arc<dyn PageBackend>>,
    /// Asked for (`journal(Some(..))`, `upgrade(true)`, a store just
    /// restored): put in front of a store kept without one. Else, the
    /// default, only a new store at a path gets one (and a store that
    /// has one keeps it), so an existing store is not changed into a
    /// format the build that wrote it refuses (see [`adopts`]).
    pub asked: bool,
}

impl JournalSetting {
    /// The default: a journal of [`DEFAULT_BYTES`] for new stores at a
    /// path and for stores that have one.
    pub(crate) fn default_on() -> Self {
        JournalSetting {
            bytes: DEFAULT_BYTES,
            backend: None,
            asked: false,
        }
    }
}

/// Whether a store without a journal (no [`MARK`]) gets one: when asked
/// for, or when the store is new (no table yet: this open creates it)
/// and lives at a path. A default journal is never put in front of an
/// existing store, nor of one on a caller's backend or in memory, nor
/// beside a file with tables but no store's metadata (a foreign file,
/// which the open refuses next: no journal is left beside it).
fn adopts(setting: &JournalSetting, base: &dyn LogStore, path: Option<&Path>) -> StoreResult<bool> {
    if setting.asked || setting.backend.is_some() {
        return Ok(true);
    }
    Ok(path.is_some() && base.table_names()?.is_empty())
}

/// Where the journal of the store file at `store` lives: beside it, its
/// name with `.journal` added.
pub(crate) fn journal_path(store: &Path) -> PathBuf {
    let mut name = store.file_name().unwrap_or_default().to_os_string();
    name.push(".journal");
    store.with_file_name(name)
}

/// The storage the log uses: `base` (the store of record, at `path` if a
/// file), with its journal if the store has one, or `setting` asks for
/// one ([`adopts`]: the default setting only for a new store at a path). A store that has a journal but is opened without the setting is
/// settled: its journal replayed into it, then removed. A read-only open
/// replays into memory only.
///
/// # Errors
/// A segment length out of range ([`Error::InvalidConfig`]); a journal
/// that is damaged or missing ([`Error::Corrupt`], naming it); I/O.
pub(crate) fn wrap(
    base: Box<dyn LogStore>,
    path: Option<&Path>,
    read_only: bool,
    setting: Option<JournalSetting>,
) -> Result<Box<dyn LogStore>> {
    if let Some(bytes) = setting.as_ref().map(|s| s.bytes)
        && !(MIN_BYTES..=u64::from(u32::MAX)).contains(&bytes)
    {
        return Err(Error::InvalidConfig(format!(
            "a journal segment of {bytes} bytes: it must be from {MIN_BYTES} to {} bytes",
            u32::MAX
        )));
    }
    let mark = read_mark(&*base)?;
    let setting = match setting {
        // The default keeps a store without a journal as it is (a leftover
        // segment beside it is settled, as without the setting).
        Some(s) if mark.is_none() && !adopts(&s, &*base, path)? => None,
        s => s,
    };
    let (wanted, backend) = match setting {
        Some(s) => (Some(s.bytes), s.backend),
        None => (None, None),
    };
    let (segment, name) = segment_of(path, read_only, wanted.is_some(), backend)?;
    let Some(segment) = segment else {
        if mark.is_some() {
            return Err(missing(&name));
        }
        return Ok(base);
    };
    let mut len = segment.len().map_err(|e| io_err(&name, &e))?;
    if len > 0 && mark.is_none() && read_header(&*segment, &name, len).is_err() {
        // Cut while it was made (a crash or a full disk between its
        // length and its header): it never held a record, since the mark
        // comes with the first commit after the segment was whole. Made
        // again below (or left alone by a read-only open), never a reason
        // to refuse the store.
        if read_only {
            return Ok(with_filter(base));
        }
        segment.set_len(0).map_err(|e| io_err(&name, &e))?;
        len = 0;
    }
    if len == 0 && mark.is_some() {
        // The mark is written after the segment was made whole.
        return Err(missing(&name));
    }
    if len == 0 && (wanted.is_none() || read_only) {
        // A segment never made whole: it never held a record (and a
        // read-only open makes none).
        return Ok(with_filter(base));
    }
    let (seg_bytes, version) = made(&*segment, &name, len, wanted)?;
    let opened = Opened {
        base,
        path,
        segment,
        name,
        mark,
    };
    match wanted {
        _ if read_only => opened.replay_in_memory(seg_bytes, version),
        None => opened.settle(seg_bytes, version),
        Some(_) => opened.resume(seg_bytes, version),
    }
}

/// A store and its journal's segment, whole, as [`wrap`] found them.
struct Opened<'p> {
    base: Box<dyn LogStore>,
    path: Option<&'p Path>,
    segment: Arc<dyn PageBackend>,
    name: String,
    /// The store's mark: the sequence and epoch checkpointed last.
    mark: Option<(u64, u64)>,
}

impl Opened<'_> {
    /// The segment's records past the mark, and the epoch of the last.
    fn replayed(&self, seg_bytes: u64, version: u32) -> Result<(Vec<format::Owned>, u64)> {
        Ok(match self.mark {
            Some((seq, epoch)) => {
                replay(&*self.segment, &self.name, seg_bytes, version, seq, epoch)?
            }
            None => (Vec::new(), fresh_epoch()?),
        })
    }

    /// A read-only open: the records past the mark applied in memory.
    fn replay_in_memory(self, seg_bytes: u64, version: u32) -> Result<Box<dyn LogStore>> {
        let (replayed, _) = self.replayed(seg_bytes, version)?;
        self.base.commit_all(coalesce(&replayed))?;
        Ok(with_filter(self.base))
    }

    /// An open without the journal setting: the records settled into the
    /// store, the mark removed, then the file.
    fn settle(self, seg_bytes: u64, version: u32) -> Result<Box<dyn LogStore>> {
        let (replayed, _) = self.replayed(seg_bytes, version)?;
        let mut all = coalesce(&replayed);
        all.push(mark_commit(None));
        self.base.commit_all(all)?;
        if let Some(p) = self.path {
            let jp = journal_path(p);
            std::fs::remove_file(&jp)
                .map_err(|e| LogError::Storage(crate::error::io_at(&jp, &e)))?;
            if let Some(dir) = jp.parent() {
                file::sync_dir(dir);
            }
        }
        Ok(self.base)
    }

    /// A writable open with the journal: the records past the mark
    /// committed to the store, then the journal store started on the
    /// segment.
    fn resume(self, seg_bytes: u64, version: u32) -> Result<Box<dyn LogStore>> {
        let (replayed, last_epoch) = self.replayed(seg_bytes, version)?;
        let Opened {
            base,
            segment,
            name,
            mark,
            ..
        } = self;
        let (seq, mut epoch) = mark.unwrap_or((0, last_epoch));
        let last = seq + replayed.len() as u64;
        if !replayed.is_empty() {
            // Past every epoch a run before the crash could have used.
            epoch = last_epoch + 1;
            let mut all = coalesce(&replayed);
            all.push(mark_commit(Some((last, epoch))));
            base.commit_all(all)?;
        }
        if version < format::VERSION {
            // Nothing in the segment is needed now (what it held is in the
            // store): the header says format 2 before a run starts mid-way,
            // so an older build refuses the segment instead of missing it.
            let io = || -> io::Result<()> {
                segment.write(0, &format::header(seg_bytes))?;
                segment.sync_data()
            };
            io().map_err(|e| io_err(&name, &e))?;
        }
        let store = JournalStore::new(Inner {
            base,
            journal: Some(Journal {
                segment,
                name,
                halves: format::halves(seg_bytes),
                writer: Mutex::new(Writer {
                    half: 0,
                    pos: HEADER_BYTES,
                    seq: last,
                    epoch,
                    marked: mark.is_some(),
                    poisoned: None,
                }),
                handoff: checkpointer::Handoff::default(),
            }),
            overlay: RwLock::new(Overlays::default()),
        })?;
        Ok(Box::new(store))
    }
}

/// The journal's segment, if there is one, and its name for errors: the
/// setting's `backend`, or the file beside the store at `path` (made when
/// the setting asks for a journal, `wanted`, on a writable open).
fn segment_of(
    path: Option<&Path>,
    read_only: bool,
    wanted: bool,
    backend: Option<Arc<dyn PageBackend>>,
) -> Result<(Option<Arc<dyn PageBackend>>, String)> {
    match (backend, path) {
        (Some(b), _) => Ok((Some(b), "the journal backend".to_string())),
        (None, Some(p)) => {
            let jp = journal_path(p);
            let create = wanted && !read_only;
            let seg = file::SegmentFile::open(&jp, !read_only, create)
                .map_err(|e| LogError::Storage(crate::error::io_at(&jp, &e)))?;
            Ok((
                seg.map(|s| Arc::new(s) as Arc<dyn PageBackend>),
                jp.display().to_string(),
            ))
        }
        (None, None) if wanted => Err(Error::InvalidConfig(
            "a journal needs a store opened by path, or a journal backend".into(),
        )),
        (None, None) => Ok((None, "the journal".to_string())),
    }
}

/// `base` with the [`MARK`] entry hidden from the log.
fn with_filter(base: Box<dyn LogStore>) -> Box<dyn LogStore> {
    Box::new(JournalStore {
        inner: Arc::new(Inner {
            base,
            journal: None,
            overlay: RwLock::new(Overlays::default()),
        }),
        checkpointer: None,
    })
}

fn missing(name: &str) -> Error {
    Error::Corrupt(format!(
        "the store was kept with a journal, but {name} is missing or empty: acknowledged \
         commits may be in it; put it back beside the store"
    ))
}

fn io_err(name: &str, e: &io::Error) -> LogError {
    LogError::Storage(io::Error::new(e.kind(), format!("{name}: {e}")).into())
}

/// The epoch of a journal's first records, drawn at random: a segment
/// left behind by an earlier journal (an open without the journal settled
/// it and crashed before removing the file) holds records of small
/// epochs numbered from 1, and a record of the same length at the same
/// place must not make one of them look like the next.
fn fresh_epoch() -> StoreResult<u64> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| {
        LogError::Storage(
            io::Error::other(format!(
                "drawing the journal's epoch from the operating system: {e}"
            ))
            .into(),
        )
    })?;
    // Room for 2^62 checkpoints after it.
    Ok((u64::from_le_bytes(b) >> 2) + 1)
}

/// The [`MARK`] entry of `base`: (sequence, epoch).
fn read_mark(base: &dyn LogStore) -> StoreResult<Option<(u64, u64)>> {
    let Some(entries) = base.read_meta()? else {
        return Ok(None);
    };
    let Some((_, v)) = entries.iter().find(|(k, _)| k == MARK) else {
        return Ok(None);
    };
    match (v.get(..8), v.get(8..16)) {
        (Some(s), Some(e)) if v.len() == 16 => {
            let (seq, epoch) = (
                u64::from_le_bytes(s.try_into().unwrap_or_default()),
                u64::from_le_bytes(e.try_into().unwrap_or_default()),
            );
            // Epochs start below 2^62 + 1 and sequences count commits:
            // either at 2^63 or past is damage, and no `+ 1` on them can
            // overflow.
            if seq >= MARK_LIMIT || epoch >= MARK_LIMIT {
                return Err(LogError::Corrupt(format!(
                    "the metadata entry {MARK:?} holds sequence {seq} and epoch {epoch}: \
                     at least 2^63, which no journal reaches"
                )));
            }
            Ok(Some((seq, epoch)))
        }
        _ => Err(LogError::Corrupt(format!(
            "the metadata entry {MARK:?} is {} bytes, not 16",
            v.len()
        ))),
    }
}

/// The segment's length and format: read from its header, or, for an
/// empty one, made now (`wanted` bytes, zeros, then the header, synced).
fn made(
    segment: &dyn PageBackend,
    name: &str,
    len: u64,
    wanted: Option<u64>,
) -> StoreResult<(u64, u32)> {
    if len > 0 {
        return read_header(segment, name, len);
    }
    let bytes = wanted.unwrap_or(DEFAULT_BYTES);
    let io = || -> io::Result<()> {
        segment.set_len(bytes)?;
        segment.write(0, &format::header(bytes))?;
        segment.sync_data()
    };
    io().map_err(|e| io_err(name, &e))?;
    Ok((bytes, format::VERSION))
}

/// A commit that writes the [`MARK`] entry (or removes it, for `None`).
fn mark_commit(mark: Option<(u64, u64)>) -> Commit<'static> {
    let value = mark.map(|(s, e)| [s.to_le_bytes(), e.to_le_bytes()].concat());
    Commit {
        raw_meta: vec![(MARK.to_string(), value)],
        ..Commit::default()
    }
}

/// The segment's length as its header records it (which must be its
/// length), and its format version.
fn read_header(segment: &dyn PageBackend, name: &str, len: u64) -> StoreResult<(u64, u32)> {
    let damaged = |why: String| LogError::Corrupt(format!("{name}: {why}"));
    if len < HEADER_BYTES {
        return Err(damaged(format!("{len} bytes, shorter than its header")));
    }
    let mut h = [0u8; 32];
    segment.read(0, &mut h).map_err(|e| io_err(name, &e))?;
    let (bytes, version) = format::parse_header(&h).map_err(damaged)?;
    if bytes != len {
        return Err(damaged(format!(
            "its header says {bytes} bytes, the file has {len}"
        )));
    }
    Ok((bytes, version))
}

/// The commits of the records after sequence `seq`, in order, and the
/// epoch of the last run read. Format 1: one run of `epoch` from the
/// segment's start. Format 2: the run of `epoch` starts at either half's
/// start; the run of the next epoch, if any, at the other one. A run ends
/// at its half's end or at the first record that is not its next.
fn replay(
    segment: &dyn PageBackend,
    name: &str,
    len: u64,
    version: u32,
    seq: u64,
    epoch: u64,
) -> StoreResult<(Vec<Owned>, u64)> {
    let mut out = Vec::new();
    if version == 1 {
        read_run(segment, name, (HEADER_BYTES, len), epoch, seq, &mut out)?;
        return Ok((out, epoch));
    }
    let halves = format::halves(len);
    let (mut epoch, mut last_epoch) = (epoch, epoch);
    let mut half = 0;
    for h in [0, 1] {
        if first_is(segment, name, halves[h], epoch, seq + 1)? {
            half = h;
            break;
        }
    }
    loop {
        let before = out.len();
        read_run(segment, name, halves[half], epoch, seq, &mut out)?;
        if out.len() == before {
            return Ok((out, last_epoch));
        }
        last_epoch = epoch;
        epoch += 1;
        half ^= 1;
    }
}

/// Whether the record at the start of `run` has `epoch` and `seq`.
fn first_is(
    segment: &dyn PageBackend,
    name: &str,
    run: (u64, u64),
    epoch: u64,
    seq: u64,
) -> StoreResult<bool> {
    if run.0 + FRAME_BYTES as u64 > run.1 {
        return Ok(false);
    }
    let mut frame = [0u8; FRAME_BYTES];
    segment
        .read(run.0, &mut frame)
        .map_err(|e| io_err(name, &e))?;
    let f = format::parse_frame(&frame);
    Ok(f.epoch == epoch && f.seq == seq)
}

/// Appends to `out` the records of `epoch` from `run`'s start, the first
/// numbered `seq` plus one more than `out` holds, each the next, up to
/// the first that is not one or `run`'s end.
fn read_run(
    segment: &dyn PageBackend,
    name: &str,
    run: (u64, u64),
    epoch: u64,
    seq: u64,
    out: &mut Vec<Owned>,
) -> StoreResult<()> {
    let (mut at, len) = run;
    let mut frame = [0u8; FRAME_BYTES];
    while at + FRAME_BYTES as u64 <= len {
        segment.read(at, &mut frame).map_err(|e| io_err(name, &e))?;
        let f = format::parse_frame(&frame);
        let end = at + FRAME_BYTES as u64 + f.len as u64;
        let want = seq + out.len() as u64 + 1;
        if f.epoch != epoch || f.seq != want || end > len {
            break;
        }
        let mut payload = vec![0u8; f.len];
        segment
            .read(at + FRAME_BYTES as u64, &mut payload)
            .map_err(|e| io_err(name, &e))?;
        if !f.matches(&payload) {
            break; // torn: never acknowledged
        }
        out.push(Owned::decode(
            &payload,
            &format!("{name}, record {want} at byte {at}"),
        )?);
        at = end;
    }
    Ok(())
}

/// `pending` as few commits as apply the same changes: a run of commits
/// that neither drop nor trim becomes one (their rows, the last summary
/// of each bucket, the last change of each metadata entry), so a
/// checkpoint opens each table once per run, not once per commit.
fn coalesce(pending: &[Owned]) -> Vec<Commit<'_>> {
    let mut out: Vec<Commit<'_>> = Vec::new();
    let mut summary_at: HashMap<u64, usize> = HashMap::new();
    let mut meta_at: HashMap<&str, usize> = HashMap::new();
    for o in pending {
        if out.is_empty() || !o.drop_buckets.is_empty() || !o.trims.is_empty() {
            summary_at.clear();
            meta_at.clear();
            out.push(Commit {
                drop_buckets: &o.drop_buckets,
                trims: o.trims.iter().map(|&(b, s, e)| (b, s..=e)).collect(),
                ..Commit::default()
            });
        }
        let Some(c) = out.last_mut() else { break };
        c.rows.extend(o.rows.iter().cloned());
        for (b, v) in &o.summaries {
            if let Some(&i) = summary_at.get(b) {
                c.summaries[i].1.clone_from(v);
            } else {
                summary_at.insert(*b, c.summaries.len());
                c.summaries.push((*b, v.clone()));
            }
        }
        for (k, v) in &o.meta {
            if let Some(&i) = meta_at.get(k.as_str()) {
                c.raw_meta[i].1.clone_from(v);
            } else {
                meta_at.insert(k, c.raw_meta.len());
                c.raw_meta.push((k.clone(), v.clone()));
            }
        }
    }
    out
}

/// A segment's bytes in memory, for reading only (the fuzz entry).
#[derive(Debug)]
struct Bytes(Vec<u8>);

impl PageBackend for Bytes {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let at = usize::try_from(offset).map_err(io::Error::other)?;
        let src = at
            .checked_add(out.len())
            .and_then(|end| self.0.get(at..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn set_len(&self, _: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8]) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// Replays `segment` (a whole journal segment, header included) as an open
/// whose mark is sequence 0 and the first record's epoch would, and
/// decodes every record of every row it replays; returns how many. The
/// fuzz target's entry: never panics, allocates no more than the input.
///
/// # Errors
/// What an open reports for the same bytes.
pub(crate) fn fuzz_segment(segment: &[u8]) -> Result<usize> {
    let seg = Bytes(segment.to_vec());
    let len = segment.len() as u64;
    let (_, version) = read_header(&seg, "the segment", len)?;
    let at = usize::try_from(HEADER_BYTES).unwrap_or(usize::MAX);
    let Some(epoch) = segment
        .get(at + 8..at + 16)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
    else {
        return Ok(0);
    };
    if epoch >= MARK_LIMIT {
        return Ok(0); // no mark an open accepts names it
    }
    let mut n = 0;
    for c in replay(&seg, "the segment", len, version, 0, epoch)?.0 {
        for (_, _, row) in &c.rows {
            for rec in crate::records::read_row(row)? {
                rec?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// A segment of [`MIN_BYTES`] or more holding one record (epoch 1,
/// sequence 1) with `payload`: how the fuzz target reaches the payload's
/// decoder behind the checksum.
pub(crate) fn segment_of_payload(payload: &[u8]) -> Vec<u8> {
    let record = format::record(1, 1, payload);
    let len = (HEADER_BYTES + record.len() as u64).max(MIN_BYTES);
    let mut seg = format::header_of(len, 1); // one run: the whole payload read
    seg.resize(usize::try_from(HEADER_BYTES).unwrap_or(0), 0);
    seg.extend_from_slice(&record);
    seg.resize(usize::try_from(len).unwrap_or(seg.len()), 0);
    seg
}

/// The store of record with a journal in front of it (see the module),
/// and its checkpointer's thread.
pub(crate) struct JournalStore {
    inner: Arc<Inner>,
    checkpointer: Option<JoinHandle<()>>,
}

/// What the store and its checkpointer share.
pub(super) struct Inner {
    base: Box<dyn LogStore>,
    /// `None` for a read-only open (its journal replayed into memory).
    journal: Option<Journal>,
    overlay: RwLock<Overlays>,
}

struct Journal {
    segment: Arc<dyn PageBackend>,
    name: String,
    /// The two halves a run of records is written in, (start, end).
    halves: [(u64, u64); 2],
    writer: Mutex<Writer>,
    handoff: checkpointer::Handoff,
}

struct Writer {
    /// The half the current run is in.
    half: usize,
    /// Where the next record goes.
    pos: u64,
    /// The last sequence written.
    seq: u64,
    /// The epoch of the current run.
    epoch: u64,
    /// Whether the store has the [`MARK`] entry.
    marked: bool,
    /// Why commits are refused, once a write, sync or checkpoint failed.
    poisoned: Option<String>,
}

/// The commits of the run being written (`cur`) and of the run being
/// checkpointed (`old`), where a row read finds them.
#[derive(Default)]
struct Overlays {
    old: Option<Arc<Overlay>>,
    cur: Overlay,
}

/// The commits of one run of records, and where a row read finds them.
#[derive(Default)]
struct Overlay {
    pending: Vec<Owned>,
    /// (bucket, row) to (commit, index in its rows).
    rows: HashMap<(u64, u64), (usize, usize)>,
    /// Buckets whose rows in the store a pending commit deleted.
    hidden: HashMap<u64, Hidden>,
}

/// A row as the overlay knows it.
enum Known {
    /// Written by a pending commit.
    Row(Vec<u8>),
    /// Deleted by a pending commit.
    Gone,
    /// Not touched since the last checkpoint: the store has it, or not.
    Unknown,
}

#[derive(Default)]
struct Hidden {
    dropped: bool,
    trimmed: Vec<(u64, u64)>,
}

impl Overlay {
    fn apply(&mut self, o: Owned) {
        let at = self.pending.len();
        for &b in &o.drop_buckets {
            self.rows.retain(|k, _| k.0 != b);
            self.hidden.insert(
                b,
                Hidden {
                    dropped: true,
                    trimmed: Vec::new(),
                },
            );
        }
        for &(b, s, e) in &o.trims {
            self.rows.retain(|k, _| k.0 != b || !(s..=e).contains(&k.1));
            self.hidden.entry(b).or_default().trimmed.push((s, e));
        }
        for (i, (b, r, _)) in o.rows.iter().enumerate() {
            self.rows.insert((*b, *r), (at, i));
        }
        self.pending.push(o);
    }

    /// What the overlay knows of a row.
    fn row(&self, bucket: u64, row: u64) -> Known {
        if let Some(&(c, i)) = self.rows.get(&(bucket, row))
            && let Some(r) = self.pending.get(c).and_then(|o| o.rows.get(i))
        {
            return Known::Row(r.2.clone());
        }
        match self.hidden.get(&bucket) {
            Some(h) if h.dropped || h.trimmed.iter().any(|&(s, e)| (s..=e).contains(&row)) => {
                Known::Gone
            }
            _ => Known::Unknown,
        }
    }
}

impl Journal {
    fn refused(&self, why: &str) -> LogError {
        LogError::Storage(
            io::Error::other(format!(
                "{}: an earlier write failed ({why}); reopen the store",
                self.name
            ))
            .into(),
        )
    }
}

impl Inner {
    /// The background checkpoint: writes the run the writer left into the
    /// store with `mark`, durably, then forgets it (its half is free).
    fn checkpoint_old(&self, mark: (u64, u64)) -> StoreResult<()> {
        let old = self.overlay.read().old.clone();
        let Some(old) = old else { return Ok(()) };
        let mut all = coalesce(&old.pending);
        all.push(mark_commit(Some(mark)));
        self.base.commit_all(all)?;
        self.overlay.write().old = None;
        Ok(())
    }

    /// Waits for the checkpointer, then writes the current run into the
    /// store with the mark, and starts the next run at its half's start:
    /// every journaled commit is in the store after it.
    fn settle(&self, j: &Journal, w: &mut Writer) -> StoreResult<()> {
        if let Err(why) = j.handoff.idle() {
            w.poisoned = Some(why.clone());
            return Err(j.refused(&why));
        }
        let ov = self.overlay.read();
        if ov.cur.pending.is_empty() {
            return Ok(());
        }
        let next = w.epoch + 1;
        let mut all = coalesce(&ov.cur.pending);
        all.push(mark_commit(Some((w.seq, next))));
        if let Err(e) = self.base.commit_all(all) {
            w.poisoned = Some(format!("a checkpoint failed: {e}"));
            return Err(e);
        }
        drop(ov);
        self.overlay.write().cur = Overlay::default();
        w.epoch = next;
        w.pos = j.halves[w.half].0;
        Ok(())
    }

    /// Hands the current run to the checkpointer (which is idle) and
    /// starts the next one, of the next epoch, at the other half's start.
    fn switch(&self, j: &Journal, w: &mut Writer) {
        {
            let mut ov = self.overlay.write();
            let cur = std::mem::take(&mut ov.cur);
            ov.old = Some(Arc::new(cur));
        }
        let next = w.epoch + 1;
        j.handoff.give((w.seq, next));
        w.epoch = next;
        w.half ^= 1;
        w.pos = j.halves[w.half].0;
    }

    /// The writer, with every journaled commit in the store: for reads
    /// that go to the store.
    fn settled(&self) -> StoreResult<Option<MutexGuard<'_, Writer>>> {
        let Some(j) = &self.journal else {
            return Ok(None);
        };
        let mut w = j.writer.lock();
        self.settle(j, &mut w)?;
        Ok(Some(w))
    }

    fn commit(&self, commit: Commit<'_>) -> StoreResult<()> {
        let Some(j) = &self.journal else {
            return self.base.commit(commit);
        };
        let mut w = j.writer.lock();
        if let Some(why) = &w.poisoned {
            return Err(j.refused(why));
        }
        if let Some(why) = j.handoff.failed() {
            w.poisoned = Some(why.clone());
            return Err(j.refused(&why));
        }
        let mut o = Owned::of(commit);
        if !w.marked {
            // The store's first commit goes to it, with the mark: from
            // then on a build without the journal refuses the store.
            o.meta.push((
                MARK.to_string(),
                Some([w.seq.to_le_bytes(), w.epoch.to_le_bytes()].concat()),
            ));
            self.base.commit(o.commit())?;
            w.marked = true;
            return Ok(());
        }
        let payload = o.encode();
        let len = (FRAME_BYTES + payload.len()) as u64;
        let small = u32::try_from(payload.len()).is_ok();
        loop {
            let (start, end) = j.halves[w.half];
            let fits = small && w.pos + len <= end;
            // The high-water mark: half the half. Past it, the run goes
            // to the checkpointer as soon as the other half is free; a
            // writer waits for it only when its half is full.
            if w.pos > start && (!fits || (w.pos - start) * 2 >= end - start) {
                let free = if fits {
                    j.handoff.try_idle()
                } else {
                    Some(j.handoff.idle())
                };
                match free {
                    Some(Ok(())) => {
                        self.switch(j, &mut w);
                        continue;
                    }
                    Some(Err(why)) => {
                        w.poisoned = Some(why.clone());
                        return Err(j.refused(&why));
                    }
                    None => {}
                }
            }
            if fits {
                break;
            }
            // Larger than a half: straight into the store, once it holds
            // every earlier commit.
            self.settle(j, &mut w)?;
            return self.base.commit(o.commit());
        }
        let record = format::record(w.epoch, w.seq + 1, &payload);
        let written = j
            .segment
            .write(w.pos, &record)
            .and_then(|()| j.segment.sync_data());
        if let Err(e) = written {
            w.poisoned = Some(e.to_string());
            return Err(io_err(&j.name, &e));
        }
        w.pos += len;
        w.seq += 1;
        self.overlay.write().cur.apply(o);
        Ok(())
    }

    fn read_row(&self, bucket: u64, row: u64) -> StoreResult<Option<Vec<u8>>> {
        {
            let ov = self.overlay.read();
            for o in std::iter::once(&ov.cur).chain(ov.old.as_deref()) {
                match o.row(bucket, row) {
                    Known::Row(bytes) => return Ok(Some(bytes)),
                    Known::Gone => return Ok(None),
                    Known::Unknown => {}
                }
            }
        }
        // A run checkpointed since is in the store: it reads the same.
        self.base.read_row(bucket, row)
    }
}

impl JournalStore {
    fn new(inner: Inner) -> StoreResult<JournalStore> {
        let inner = Arc::new(inner);
        let checkpointer = match &inner.journal {
            Some(_) => Some(checkpointer::start(&inner)?),
            None => None,
        };
        Ok(JournalStore {
            inner,
            checkpointer,
        })
    }

    /// Stops the checkpointer once its run is in the store.
    fn stop(&mut self) {
        if let (Some(j), Some(t)) = (&self.inner.journal, self.checkpointer.take()) {
            j.handoff.stop();
            let _ = t.join();
        }
    }
}

impl Drop for JournalStore {
    fn drop(&mut self) {
        self.stop();
        if let Some(j) = &self.inner.journal {
            let mut w = j.writer.lock();
            if w.poisoned.is_none() {
                let _ = self.inner.settle(j, &mut w);
            }
        }
    }
}

fn without_mark(entries: MetaEntries) -> MetaEntries {
    entries.into_iter().filter(|(k, _)| k != MARK).collect()
}

impl LogStore for JournalStore {
    fn read_meta(&self) -> StoreResult<Option<MetaEntries>> {
        let _w = self.inner.settled()?;
        Ok(self.inner.base.read_meta()?.map(without_mark))
    }

    fn table_names(&self) -> StoreResult<Vec<String>> {
        let _w = self.inner.settled()?;
        self.inner.base.table_names()
    }

    fn check_bucket(&self, bucket: u64) -> StoreResult<()> {
        let _w = self.inner.settled()?;
        self.inner.base.check_bucket(bucket)
    }

    fn read_row(&self, bucket: u64, row: u64) -> StoreResult<Option<Vec<u8>>> {
        self.inner.read_row(bucket, row)
    }

    fn tables(&self) -> StoreResult<Vec<(u64, Table)>> {
        let _w = self.inner.settled()?;
        self.inner.base.tables()
    }

    fn row_range(&self, bucket: u64, rows: std::ops::RangeInclusive<u64>) -> StoreResult<Rows> {
        let _w = self.inner.settled()?;
        self.inner.base.row_range(bucket, rows)
    }

    fn view(&self) -> StoreResult<View> {
        let _w = self.inner.settled()?;
        let v = self.inner.base.view()?;
        Ok(View {
            meta: without_mark(v.meta),
            tables: v.tables,
        })
    }

    fn last_row(&self) -> StoreResult<u64> {
        let _w = self.inner.settled()?;
        self.inner.base.last_row()
    }

    fn commit(&self, commit: Commit<'_>) -> StoreResult<()> {
        self.inner.commit(commit)
    }

    fn commit_all(&self, commits: Vec<Commit<'_>>) -> StoreResult<()> {
        for c in commits {
            self.inner.commit(c)?;
        }
        Ok(())
    }

    fn used_bytes(&self) -> StoreResult<Option<u64>> {
        let _w = self.inner.settled()?;
        self.inner.base.used_bytes()
    }

    fn compact(&mut self) -> StoreResult<Option<bool>> {
        // The checkpointer holds the store too: stopped for the compaction.
        self.stop();
        drop(self.inner.settled()?);
        let compacted = match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.base.compact(),
            None => Err(LogError::Storage(
                io::Error::other("the journal's store is still shared; compaction skipped").into(),
            )),
        };
        if let Some(j) = &self.inner.journal {
            j.handoff.restart();
            match checkpointer::start(&self.inner) {
                Ok(handle) => self.checkpointer = Some(handle),
                Err(e) => {
                    j.handoff
                        .fail(format!("the checkpointer could not restart: {e}"));
                    return Err(e);
                }
            }
        }
        compacted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct Mem(std::sync::Mutex<Vec<u8>>);

    impl PageBackend for Mem {
        fn len(&self) -> io::Result<u64> {
            Ok(self.0.lock().expect("lock").len() as u64)
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
            let b = self.0.lock().expect("lock");
            let at = offset as usize;
            out.copy_from_slice(
                b.get(at..at + out.len())
                    .ok_or(io::ErrorKind::UnexpectedEof)?,
            );
            Ok(())
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.0.lock().expect("lock").resize(len as usize, 0);
            Ok(())
        }
        fn sync_data(&self) -> io::Result<()> {
            Ok(())
        }
        fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            let mut b = self.0.lock().expect("lock");
            let at = offset as usize;
            b[at..at + data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    fn one_row(n: u64) -> Vec<u8> {
        Owned {
            rows: vec![(1, n, vec![n as u8; 3])],
            ..Owned::default()
        }
        .encode()
    }

    #[test]
    fn coalescing_keeps_the_order_around_drops_and_the_last_summary_and_entry() {
        let rows = |b: u64, r: u64| Owned {
            rows: vec![(b, r, vec![1])],
            summaries: vec![(b, vec![r as u8])],
            meta: vec![("m".into(), Some(vec![r as u8]))],
            ..Owned::default()
        };
        let dropping = Owned {
            drop_buckets: vec![1],
            ..rows(2, 3)
        };
        let pending = [rows(1, 1), rows(1, 2), dropping, rows(1, 4)];
        let got = coalesce(&pending);
        assert_eq!(got.len(), 2, "a run, then the drop and what follows it");
        assert_eq!(got[0].rows.len(), 2);
        assert_eq!(got[0].summaries, [(1, vec![2])]);
        assert_eq!(got[0].raw_meta, [("m".to_string(), Some(vec![2]))]);
        assert_eq!(got[1].drop_buckets, [1]);
        assert_eq!(got[1].rows.len(), 2);
        assert_eq!(got[1].summaries, [(2, vec![3]), (1, vec![4])]);
        assert_eq!(got[1].raw_meta, [("m".to_string(), Some(vec![4]))]);
    }

    #[test]
    fn the_fuzz_entry_reads_a_real_segment_and_every_cut_of_it_without_panicking() {
        let payload = Owned {
            rows: vec![(1, 1, vec![0xFF; 40])],
            ..Owned::default()
        }
        .encode();
        let seg = segment_of_payload(&payload);
        assert_eq!(seg.len() as u64, MIN_BYTES);
        // A row of garbage: replayed, then refused by the row decoder.
        assert!(fuzz_segment(&seg).is_err());
        let empty = segment_of_payload(&Owned::default().encode());
        assert_eq!(fuzz_segment(&empty).ok(), Some(0));
        for cut in [0, 1, 31, 32, 100, 4096, 4100, 5000] {
            let _ = fuzz_segment(&seg[..cut]);
        }
        let mut flipped = seg.clone();
        for i in (4096..4096 + 40).step_by(3) {
            flipped[i] ^= 0x5A;
            let _ = fuzz_segment(&flipped);
        }
    }

    #[test]
    fn replay_stops_at_a_record_of_another_epoch_even_with_the_next_sequence() -> io::Result<()> {
        let seg = Mem::default();
        seg.set_len(MIN_BYTES)?;
        seg.write(0, &format::header(MIN_BYTES))?;
        let mut at = HEADER_BYTES;
        // Epoch 3 holds 11 and 12; then a stale record of epoch 2 numbered 13.
        for (epoch, seq) in [(3, 11), (3, 12), (2, 13)] {
            let r = format::record(epoch, seq, &one_row(seq));
            seg.write(at, &r)?;
            at += r.len() as u64;
        }
        let got = replay(&seg, "j", MIN_BYTES, 1, 10, 3).expect("replays").0;
        let rows: Vec<u64> = got.iter().map(|o| o.rows[0].1).collect();
        assert_eq!(rows, [11, 12]);
        // And a gap in the sequence ends it too.
        let got = replay(&seg, "j", MIN_BYTES, 1, 11, 3).expect("replays").0;
        assert!(got.is_empty(), "11 is not after 11");
        Ok(())
    }
}
