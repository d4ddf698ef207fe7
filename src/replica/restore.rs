//! Restore: the newest valid snapshot and every segment after it, up to
//! the place before this owner's fence, written into a new store file
//! (through the log's [`Restorer`]) that replaces the local one whole.
//!
//! Invariants:
//! - a snapshot is read only if the segment of its seq exists and was
//!   written by the snapshot's epoch (one written by an owner fenced
//!   before it finished is skipped);
//! - every segment from the snapshot to the end is read, in order: one
//!   missing, failing its checksum, at the wrong place, of an epoch below
//!   its predecessor's (a fenced owner's past its end), or a RESET whose
//!   snapshot is not valid, is an error naming it — never a smaller store;
//! - the new file is written beside the store and renamed over it only
//!   once whole.

use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use bytes::Bytes;

use super::format::{self, Index, RESET, SEGMENT_HEAD};
use super::objects::{Objects, index_name, number_in, part_name, segment_name};
use super::{RestoreReason, Restored};
use crate::log::Restorer;
use crate::{Error, Result};

/// Objects fetched ahead of the one being written.
const AHEAD: usize = 8;
/// Bytes of segment commits written per storage commit.
const GROUP_BYTES: usize = 64 << 20;

type Fetch = Receiver<std::result::Result<Option<Bytes>, object_store::Error>>;

fn fetched(objects: &Objects, name: &str, rx: &Fetch) -> Result<Bytes> {
    let got = rx.recv().map_err(|_| Error::Io {
        what: "waiting for the replica's runtime",
        source: std::io::Error::other("the task was dropped"),
    })?;
    match got {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(Error::Corrupt(format!(
            "the replica object {} is missing; the replica cannot be restored past it",
            objects.path(name)
        ))),
        Err(e) => Err(super::objects::failed(
            format!("reading {}", objects.path(name)),
            e,
        )),
    }
}

/// Fetches `names` in order, [`AHEAD`] at a time, handing each to `each`.
fn each_fetched(
    objects: &Objects,
    names: &[String],
    mut each: impl FnMut(usize, &str, Bytes) -> Result<()>,
) -> Result<()> {
    let mut pending: std::collections::VecDeque<(usize, Fetch)> =
        std::collections::VecDeque::default();
    let mut next = 0;
    loop {
        while pending.len() < AHEAD && next < names.len() {
            pending.push_back((next, objects.prefetch(&names[next])?));
            next += 1;
        }
        let Some((i, rx)) = pending.pop_front() else {
            return Ok(());
        };
        let bytes = fetched(objects, &names[i], &rx)?;
        each(i, &names[i], bytes)?;
    }
}

/// The snapshot a restore starts from: the newest whose seq's segment was
/// written by its epoch. `segments` are the listed segment places.
fn base(objects: &Objects, segments: &[u64], upto: u64) -> Result<Option<Index>> {
    let mut snaps: Vec<u64> = objects
        .list("snap")?
        .iter()
        .filter(|n| n.ends_with("/index"))
        .filter_map(|n| number_in(n, "snap"))
        .filter(|s| *s <= upto)
        .collect();
    snaps.sort_unstable();
    for seq in snaps.into_iter().rev() {
        if segments.binary_search(&seq).is_err() {
            continue;
        }
        let name = index_name(seq);
        let Some(bytes) = objects.get(&name)? else {
            continue;
        };
        let ix = format::read_index(&bytes, objects.path(&name).as_ref())?;
        if ix.seq != seq {
            return Err(format::damaged(
                objects.path(&name).as_ref(),
                "it names another seq",
            ));
        }
        let seg = segment_name(seq);
        let head = objects
            .head_bytes(&seg, SEGMENT_HEAD as u64)?
            .map(|b| format::segment_head(&b, objects.path(&seg).as_ref()))
            .transpose()?;
        if head.is_some_and(|h| h.epoch == ix.epoch) {
            return Ok(Some(ix));
        }
    }
    Ok(None)
}

/// The error for a chain with no whole snapshot to start from, naming
/// the snapshot it needs: the one at the oldest segment kept (pruning
/// deletes only what a whole snapshot there covers), or, in a chain never
/// pruned, the one its newest RESET segment starts from.
fn no_snapshot(objects: &Objects, segments: &[u64]) -> Result<Error> {
    let mut needed = segments.first().copied().filter(|s| *s > 0);
    if needed.is_none() {
        for seq in segments.iter().rev() {
            let name = segment_name(*seq);
            let head = objects
                .head_bytes(&name, SEGMENT_HEAD as u64)?
                .map(|b| format::segment_head(&b, objects.path(&name).as_ref()))
                .transpose()?;
            if head.is_some_and(|h| h.flags & RESET != 0) {
                needed = Some(*seq);
                break;
            }
        }
    }
    Ok(Error::Corrupt(match needed {
        Some(seq) => format!(
            "the replica snapshot {} is missing or was not written whole (its segment {} is \
             there); the replica cannot be restored without it",
            objects.path(&index_name(seq)),
            objects.path(&segment_name(seq))
        ),
        None => format!(
            "the replica at {} has segments but no snapshot, and none of its segments says \
             which one it needs; the replica cannot be restored",
            objects.path("")
        ),
    }))
}

/// Whether the chain up to `upto` holds nothing yet: no snapshot, and no
/// segment with a commit (an owner ships nothing before its first
/// snapshot, so such a chain is fences of owners that never got that far).
pub(crate) fn is_empty(objects: &Objects, upto: u64) -> Result<bool> {
    let snapshots = objects
        .list("snap")?
        .iter()
        .filter(|n| n.ends_with("/index"))
        .filter_map(|n| number_in(n, "snap"))
        .any(|s| s <= upto);
    if snapshots {
        return Ok(false);
    }
    for seq in objects
        .list("seg")?
        .iter()
        .filter_map(|n| number_in(n, "seg"))
        .filter(|s| *s <= upto)
    {
        let name = segment_name(seq);
        let head = objects
            .head_bytes(&name, SEGMENT_HEAD as u64)?
            .map(|b| format::segment_head(&b, objects.path(&name).as_ref()))
            .transpose()?;
        if head.is_some_and(|h| h.commits > 0 || h.flags & RESET != 0) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Rebuilds the store file at `path` from the chain up to segment `upto`.
pub(crate) fn restore(
    objects: &Objects,
    path: &Path,
    cache_bytes: usize,
    upto: u64,
    reason: RestoreReason,
) -> Result<Restored> {
    let _span = tracing::info_span!("dedupkv.replica.restore", upto, reason = ?reason).entered();
    let t0 = Instant::now();
    let mut segments: Vec<u64> = objects
        .list("seg")?
        .iter()
        .filter_map(|n| number_in(n, "seg"))
        .filter(|s| *s <= upto)
        .collect();
    segments.sort_unstable();
    let Some(ix) = base(objects, &segments, upto)? else {
        return Err(no_snapshot(objects, &segments)?);
    };
    let out = Restorer::create(path, cache_bytes)?;
    let mut report = Restored {
        reason,
        records: 0,
        rows: 0,
        bytes: 0,
        duration: t0.elapsed(),
        snapshot: ix.seq,
        segments: 0,
        replaced: None,
    };
    out.meta(ix.meta.clone())?;
    let parts: Vec<String> = (0..ix.parts.len() as u32)
        .map(|p| part_name(ix.seq, p))
        .collect();
    each_fetched(objects, &parts, |i, name, bytes| {
        let what = objects.path(name);
        let (len, sum) = ix.parts[i];
        if bytes.len() as u64 != len || xxhash_rust::xxh3::xxh3_64(&bytes) != sum {
            return Err(format::damaged(
                what.as_ref(),
                "it is not the part its snapshot's index lists",
            ));
        }
        let rows = format::read_part(&bytes, ix.seq, i as u32, what.as_ref())?;
        report.bytes += len;
        count(&mut report, &rows);
        out.rows(rows)
    })?;
    // Every place after the snapshot, none skipped.
    let names: Vec<String> = (ix.seq + 1..=upto).map(segment_name).collect();
    for (i, seq) in (ix.seq + 1..=upto).enumerate() {
        if segments.binary_search(&seq).is_err() {
            return Err(Error::Corrupt(format!(
                "the replica segment {} is missing; the replica cannot be restored past it",
                objects.path(&names[i])
            )));
        }
    }
    let mut epoch = ix.epoch;
    // Commits are written a group per storage commit (one sync each).
    let mut group: Vec<crate::log::Shipped> = Vec::new();
    let mut group_bytes = 0;
    each_fetched(objects, &names, |i, name, bytes| {
        let what = objects.path(name);
        let (head, commits) = format::read_segment(&bytes, what.as_ref())?;
        let seq = ix.seq + 1 + i as u64;
        if head.seq != seq {
            return Err(format::damaged(what.as_ref(), "it names another place"));
        }
        if head.epoch < epoch {
            return Err(Error::Corrupt(format!(
                "the replica segment {what} was written by epoch {} after epoch {epoch} had \
                 fenced it; the replica cannot be restored past it",
                head.epoch
            )));
        }
        if head.flags & RESET != 0 {
            return Err(Error::Corrupt(format!(
                "the replica segment {what} starts from its snapshot, which is missing or \
                 damaged; the replica cannot be restored past it"
            )));
        }
        epoch = head.epoch;
        report.bytes += bytes.len() as u64;
        report.segments += 1;
        for c in commits {
            count(&mut report, &c.rows);
            if group_bytes >= GROUP_BYTES || !Restorer::can_join(&c) {
                out.apply(std::mem::take(&mut group))?;
                group_bytes = 0;
            }
            group_bytes += c.bytes();
            group.push(c);
        }
        Ok(())
    })?;
    out.apply(group)?;
    out.finish()?;
    report.duration = t0.elapsed();
    Ok(report)
}

/// Adds rows to the report: each row's record count is in its header.
/// A bucket's summary travels as a row numbered `SUMMARY_ROW` but is no
/// log row: it is not counted.
fn count(report: &mut Restored, rows: &[(u64, u64, Vec<u8>)]) {
    for (_, row, bytes) in rows {
        if *row == crate::log::SUMMARY_ROW {
            continue;
        }
        report.rows += 1;
        if let Some(c) = bytes.get(2..6) {
            let mut b = [0u8; 4];
            b.copy_from_slice(c);
            report.records += u64::from(u32::from_le_bytes(b));
        }
    }
}
