//! Opening a store with a replica: take ownership, fence earlier owners,
//! then open the local file as it is or restore it first.
//!
//! 1. **Claim**: create the owner object of the epoch after the newest
//!    one (create-only). Of owners racing for it exactly one succeeds;
//!    the others fail with [`Error::Fenced`] and open nothing.
//! 2. **Fence**: create this epoch's first segment (FENCE) at the first
//!    free place of the segment sequence, moving past places an earlier
//!    owner fills meanwhile. From then on every upload of an earlier
//!    owner finds its place taken: it is fenced. The segment before the
//!    fence is where the earlier epoch ended.
//! 3. **Choose**: the local file is used as it is when the local state
//!    file says the epoch that wrote the last segment before the fence
//!    wrote it too (nobody took over since) and it is not older than
//!    that segment; it holds everything that epoch shipped (the file is
//!    durable first), and, after a crash, possibly more, which a RESET
//!    snapshot then ships before anything else. Otherwise the file is
//!    missing, older, or left by a fenced owner: it is moved aside and
//!    restored from the chain up to the fence.
//! 4. The local state file records this epoch before the store opens.
//!
//! The epoch feeds the fencing tokens: this run's first token is at least
//! `epoch · 2^40`, above every token of an earlier epoch (each issues
//! fewer than 2^40).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::{self, FENCE, Local, Owner, SEGMENT_HEAD, SegmentHead};
use super::objects::{Created, Objects, number_in, owner_name, segment_name};
use super::uploader::{Settings, Uploader, read_local, write_local};
use super::{Replica, ReplicaMode, RestoreReason};
use crate::log::ship::{self, Ship};
use crate::{Error, Result};

/// Bits of a fencing token below the epoch.
pub(crate) const EPOCH_SHIFT: u32 = 40;
/// Places tried for the fence before giving up (each taken by an earlier
/// owner still shipping).
const FENCE_TRIES: u64 = 10_000;
/// Owner objects kept (older ones are deleted).
const OWNERS_KEPT: u64 = 16;

/// What the store's open needs from its replica.
pub(crate) struct Prepared {
    pub ship: Ship,
    pub token_base: u64,
    pub uploader: Arc<Uploader>,
}

/// The local state file of the store at `path`.
pub(crate) fn local_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".replica");
    PathBuf::from(p)
}

fn head_of(objects: &Objects, seq: u64) -> Result<Option<SegmentHead>> {
    let name = segment_name(seq);
    objects
        .head_bytes(&name, SEGMENT_HEAD as u64)?
        .map(|b| format::segment_head(&b, objects.path(&name).as_ref()))
        .transpose()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Step 1: the epoch after the newest, taken create-only.
fn claim(objects: &Objects, label: &str) -> Result<u64> {
    let owners: Vec<u64> = objects
        .list("owner")?
        .iter()
        .filter_map(|n| number_in(n, "owner"))
        .collect();
    let epoch = owners.iter().copied().max().unwrap_or(0) + 1;
    if epoch >= 1 << (64 - EPOCH_SHIFT) {
        return Err(Error::InvalidConfig(format!(
            "the replica at {} has used every epoch",
            objects.path("")
        )));
    }
    let owner = format::owner(&Owner {
        epoch,
        at_ms: now_ms(),
        label: label.to_string(),
    });
    if objects.create(&owner_name(epoch), owner)? == Created::Exists {
        let name = owner_name(epoch);
        let who = objects
            .get(&name)?
            .and_then(|b| format::read_owner(&b, &name).ok())
            .map_or_else(|| "another owner".into(), |o| format!("{:?}", o.label));
        return Err(Error::Fenced(format!(
            "{who} took epoch {epoch} of the replica at {} at the same time; this one \
             opened nothing",
            objects.path("")
        )));
    }
    for old in owners.iter().filter(|e| **e + OWNERS_KEPT < epoch) {
        let _ = objects.delete(&owner_name(*old));
    }
    Ok(epoch)
}

/// Step 2: this epoch's first segment at the first free place. Returns
/// its place and the head of the segment before it (where the earlier
/// epoch ended), if any.
fn fence(objects: &Objects, epoch: u64) -> Result<(u64, Option<SegmentHead>)> {
    let last = objects
        .list("seg")?
        .iter()
        .filter_map(|n| number_in(n, "seg"))
        .max();
    let mut before = match last {
        Some(s) => head_of(objects, s)?,
        None => None,
    };
    let first = last.map_or(0, |s| s + 1);
    for place in first..first.saturating_add(FENCE_TRIES) {
        let head = SegmentHead {
            flags: FENCE,
            epoch,
            seq: place,
            max_row: before.map_or(0, |h| h.max_row),
            commits: 0,
        };
        if objects.create(&segment_name(place), format::segment(head, &[]))? == Created::Created {
            return Ok((place, before));
        }
        let taken = head_of(objects, place)?;
        if let Some(h) = taken
            && h.epoch > epoch
        {
            return Err(Error::Fenced(format!(
                "epoch {} took the replica at {} while epoch {epoch} was taking it",
                h.epoch,
                objects.path("")
            )));
        }
        before = taken;
    }
    Err(Error::Replica {
        what: format!("fencing the replica at {}", objects.path("")),
        source: "an earlier owner keeps filling the segment sequence".into(),
    })
}

/// Step 3: why the local file must be restored, if it must.
fn choose(
    file: Option<&ship::LocalFile>,
    local: Option<Local>,
    before: Option<SegmentHead>,
) -> Option<RestoreReason> {
    match (file, local, before) {
        (_, _, None) => None,
        (None, _, Some(_)) => Some(RestoreReason::Missing),
        (Some(f), Some(l), Some(h)) if h.epoch == l.epoch => {
            ((l.clean && l.seq < h.seq) || f.last_row < h.max_row).then_some(RestoreReason::Older)
        }
        (Some(_), Some(l), Some(h)) if h.epoch > l.epoch => Some(RestoreReason::Fenced),
        (Some(_), _, Some(_)) => Some(RestoreReason::Foreign),
    }
}

/// Restores the file at `path` from the chain up to `upto`, moving the
/// local file (if any) aside first.
fn restore_aside(
    objects: &Objects,
    path: &Path,
    cache_bytes: usize,
    upto: u64,
    reason: RestoreReason,
) -> Result<super::Restored> {
    let replaced = if path.exists() {
        let mut aside = path.as_os_str().to_owned();
        aside.push(".replaced");
        let aside = PathBuf::from(aside);
        std::fs::rename(path, &aside).map_err(|e| Error::Storage(crate::log::io_at(path, &e)))?;
        Some(aside)
    } else {
        None
    };
    let mut r = super::restore::restore(objects, path, cache_bytes, upto, reason)?;
    r.replaced = replaced;
    tracing::info!(
        records = r.records,
        bytes = r.bytes,
        seconds = r.duration.as_secs_f64(),
        ?reason,
        "dedupkv store restored from its replica"
    );
    Ok(r)
}

/// Takes ownership of `replica` for the store at `path`, restoring the
/// file first when it must.
pub(crate) fn prepare(path: &Path, replica: &Replica, cache_bytes: usize) -> Result<Prepared> {
    let objects = Objects::new(Arc::clone(&replica.objects), replica.prefix.clone());
    let epoch = claim(&objects, &replica.label)?;
    let (place, mut before) = fence(&objects, epoch)?;
    if before.is_some() && super::restore::is_empty(&objects, place.saturating_sub(1))? {
        // Only fences so far: as good as a new replica.
        before = None;
    }
    let local_file = local_path(path);
    let local = read_local(&local_file)?;
    let file = ship::inspect(path)?;
    let (restored, reset, max_row) = if let Some(reason) = choose(file.as_ref(), local, before) {
        let upto = place.saturating_sub(1);
        let r = restore_aside(&objects, path, cache_bytes, upto, reason)?;
        let max_row = ship::inspect(path)?.map_or(0, |f| f.last_row);
        (Some(r), false, max_row)
    } else {
        // The file is the chain's (or the chain holds nothing): it goes on
        // from the fence, after a RESET unless it is exactly the chain.
        let exact = matches!((local, before), (Some(l), Some(h))
            if l.clean && h.epoch == l.epoch && l.seq == h.seq);
        (None, !exact, file.map_or(0, |f| f.last_row))
    };
    // Step 4: record the epoch before the file is written.
    write_local(
        &local_file,
        Local {
            epoch,
            seq: place,
            clean: false,
        },
    )?;
    let synchronous = replica.mode == ReplicaMode::Synchronous;
    let uploader = Uploader::start(
        objects,
        Settings {
            mode: replica.mode,
            interval: replica.segment_interval,
            segment_bytes: replica.segment_bytes,
            max_lag_bytes: replica.max_lag_bytes,
            snapshot_after: replica.snapshot_after_bytes,
            close_timeout: replica.close_timeout,
            epoch,
            local: local_file,
        },
        place + 1,
        max_row,
        reset,
        restored,
    )?;
    Ok(Prepared {
        ship: Ship {
            sink: Arc::clone(&uploader) as Arc<dyn crate::log::ship::Sink>,
            synchronous,
            behind: reset,
        },
        token_base: epoch << EPOCH_SHIFT,
        uploader,
    })
}
