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
use super::objects::{Created, Listing, Objects, owner_name, segment_name};
use super::uploader::{Settings, Uploader, read_local, write_local};
use super::{Replica, ReplicaMode, RestoreReason};
use crate::engine::tokens::EPOCH_SHIFT;
use crate::log::{self, Ship};
use crate::{Error, Result};

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
    /// The file was restored from the replica: a new file of this build,
    /// which gets the default journal as a new store does.
    pub restored: bool,
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

/// The newest epoch the replica shows: its owner objects' and its newest
/// segment's (owner objects can be deleted by a lifecycle rule or a
/// cleanup; the newest segment never is, as pruning keeps it). `newest`
/// is the head of the newest segment.
fn newest_epoch(listing: &Listing, newest: Option<SegmentHead>) -> u64 {
    let owners = listing.owners.last().copied().unwrap_or(0);
    owners.max(newest.map_or(0, |h| h.epoch))
}

/// Step 1: epoch `epoch`, taken create-only.
fn claim(objects: &Objects, listing: &Listing, epoch: u64, label: &str) -> Result<()> {
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
    for old in listing.owners.iter().filter(|e| **e + OWNERS_KEPT < epoch) {
        let _ = objects.delete(&owner_name(*old));
    }
    Ok(())
}

/// Step 2: this epoch's first segment at the first free place after
/// `last` (the newest listed segment, whose head is `newest`). Returns its
/// place and the head of the segment before it (where the earlier epoch
/// ended), if any.
fn fence(
    objects: &Objects,
    epoch: u64,
    last: Option<u64>,
    newest: Option<SegmentHead>,
) -> Result<(u64, Option<SegmentHead>)> {
    let mut before = newest;
    let first = last.map_or(0, |s| s + 1);
    for place in first..first.saturating_add(FENCE_TRIES) {
        let head = SegmentHead {
            flags: FENCE,
            epoch,
            seq: place,
            max_row: before.map_or(0, |h| h.max_row),
            commits: 0,
        };
        let body = format::segment(head, &[]);
        match objects.create(&segment_name(place), body.clone())? {
            Created::Created => return Ok((place, before)),
            // Ours: an earlier try went through unseen (a lost response).
            Created::Exists if objects.get(&segment_name(place))?.as_deref() == Some(&body[..]) => {
                return Ok((place, before));
            }
            Created::Exists => {}
        }
        let taken = head_of(objects, place)?;
        if let Some(h) = taken
            && h.epoch >= epoch
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

/// The segment an earlier owner ended at, looking past the fences that
/// opens from this disk left when they died between taking their epoch
/// and recording it (epochs above `local.epoch` up to `local.claiming`,
/// each a lone fence with no commit): those fences change nothing, and
/// taking them for another owner's would throw away the file's tail.
fn before_own_fences(
    objects: &Objects,
    mut before: Option<SegmentHead>,
    local: Option<Local>,
) -> Result<Option<SegmentHead>> {
    let Some(l) = local else { return Ok(before) };
    while let Some(h) = before {
        let own = h.flags == FENCE && h.commits == 0 && h.epoch > l.epoch && h.epoch <= l.claiming;
        if !own {
            break;
        }
        before = match h.seq.checked_sub(1) {
            Some(s) => head_of(objects, s)?,
            None => None,
        };
    }
    Ok(before)
}

/// Step 3: why the local file must be restored, if it must.
fn choose(
    file: Option<&log::LocalFile>,
    local: Option<Local>,
    before: Option<SegmentHead>,
) -> Option<RestoreReason> {
    // A state file with no epoch yet belongs to no replica.
    let local = local.filter(|l| l.epoch != 0);
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

/// `path` with `suffix` appended to its name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// Restores the file at `path` from the chain up to `upto`. The local
/// file (if any) is moved aside to `path.replaced-<epoch>` only once the
/// restored file is whole, under a name no other open uses, so neither a
/// failed restore nor a later one loses it.
fn restore_aside(
    objects: &Objects,
    path: &Path,
    cache_bytes: usize,
    (upto, epoch): (u64, u64),
    reason: RestoreReason,
) -> Result<super::Restored> {
    let io = |at: &Path, e: &std::io::Error| Error::Storage(crate::error::io_at(at, e));
    let fresh = beside(path, ".restored");
    let mut r = super::restore::restore(objects, &fresh, cache_bytes, upto, reason)?;
    let replaced = if path.exists() {
        let aside = beside(path, &format!(".replaced-{epoch}"));
        std::fs::rename(path, &aside).map_err(|e| io(path, &e))?;
        // Then its journal, under the matching name: the file aside may
        // need it (acknowledged commits). In this order a crash never
        // leaves the store at `path` without its journal; a segment left
        // behind is only reused by the restored file (a fresh epoch: none
        // of its records is replayed).
        let journal = log::journal_path(path);
        if journal.exists() {
            std::fs::rename(&journal, log::journal_path(&aside)).map_err(|e| io(&journal, &e))?;
        }
        Some(aside)
    } else {
        None
    };
    std::fs::rename(&fresh, path).map_err(|e| io(path, &e))?;
    sync_dir_of(path)?;
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

/// Makes the renames in `path`'s directory durable.
fn sync_dir_of(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::Storage(crate::error::io_at(dir, &e)))
}

/// What the store file at `path` holds, read before anything is taken:
/// a damaged file is an error naming it (the storage engine can panic
/// on some damage rather than fail), never a panic, and never after an
/// epoch was taken for it.
fn inspect(path: &Path) -> Result<Option<log::LocalFile>> {
    let damaged = |why: String| {
        Error::Corrupt(format!(
            "{} is damaged ({why}); move it aside to restore the store from its replica",
            path.display()
        ))
    };
    std::panic::catch_unwind(|| log::inspect(path))
        .unwrap_or_else(|panic| {
            let what = crate::error::panic_message(&*panic);
            Err(damaged(format!(
                "the storage engine panicked reading it: {what}"
            )))
        })
        .map_err(|e| match e {
            Error::Corrupt(why) if !why.contains(&*path.to_string_lossy()) => damaged(why),
            e @ (Error::NotAStore(_) | Error::UnsupportedVersion { .. }) => damaged(e.to_string()),
            e => e,
        })
}

/// Whether the chain up to `upto` provably holds nothing yet: no snapshot,
/// every place from 0 there (nothing was pruned, which only a snapshot
/// does), and each a lone fence (owners that never shipped a commit).
/// Anything else that is not a restorable chain is an error, never an
/// empty store.
fn provably_empty(objects: &Objects, listing: &Listing, upto: u64) -> Result<bool> {
    let upto_len = upto.saturating_add(1);
    let places = listing.segments.iter().filter(|s| **s <= upto).count() as u64;
    if listing.indexes.iter().any(|s| *s <= upto) || places != upto_len {
        return Ok(false);
    }
    super::restore::is_empty(objects, upto)
}

/// Listings tried while the newest segment listed is gone when read.
const LIST_TRIES: usize = 8;

/// The prefix's listing, its newest segment's place and that segment's
/// head. A live owner prunes the segments before a new snapshot as soon
/// as the snapshot's own segment is there, so the newest segment of a
/// listing can be gone a moment later (a newer one then exists): the
/// prefix is listed again. Still gone after that, it is an error.
fn newest_listed(objects: &Objects) -> Result<(Listing, Option<u64>, Option<SegmentHead>)> {
    let mut tries = 0;
    loop {
        let listing = objects.listing()?;
        let last = listing.segments.last().copied();
        let newest = last.map(|s| head_of(objects, s)).transpose()?.flatten();
        if last.is_none() || newest.is_some() {
            return Ok((listing, last, newest));
        }
        tries += 1;
        if tries >= LIST_TRIES {
            return Err(Error::Corrupt(format!(
                "the replica segment {} was listed but cannot be read; the replica is not \
                 used while its newest segment is missing",
                objects.path(&segment_name(last.unwrap_or(0)))
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(10 << tries.min(5)));
    }
}

/// How long an owner object with no fence after it is taken for an open
/// still under way (its fence is moments away) rather than a damaged
/// replica.
const OPENING_MS: u64 = 60_000;

/// The error for a replica with owner objects (up to `epoch`) but no
/// segment: an open taking it right now (the caller lost a race), opens
/// that died between taking an epoch and fencing, or segments deleted
/// by someone else. Only the first is told apart (by the owner object's
/// time); the others are never taken for an empty replica.
fn owners_without_segments(objects: &Objects, listing: &Listing, epoch: u64) -> Error {
    let name = owner_name(epoch);
    let owner = match objects.get(&name) {
        Ok(Some(b)) => format::read_owner(&b, objects.path(&name).as_ref()).ok(),
        _ => None,
    };
    if let Some(o) = owner
        && now_ms().abs_diff(o.at_ms) < OPENING_MS
    {
        return Error::Fenced(format!(
            "{:?} is taking the replica at {} (epoch {epoch}) right now; this one opened nothing",
            o.label,
            objects.path("")
        ));
    }
    Error::Corrupt(format!(
        "the replica at {} has owner objects (epochs {} to {epoch}) but no segment: opens \
         that died between taking an epoch and fencing, or segments deleted by someone else; \
         it is not taken for an empty replica (if no store ever wrote there, delete its owner \
         objects)",
        objects.path(""),
        listing.owners.first().copied().unwrap_or(0),
    ))
}

/// Takes ownership of `replica` for the store at `path`, restoring the
/// file first when it must.
pub(crate) fn prepare(path: &Path, replica: &Replica, cache_bytes: usize) -> Result<Prepared> {
    let objects = Objects::new(Arc::clone(&replica.objects), replica.prefix.clone());
    let local_file = local_path(path);
    let local = read_local(&local_file)?;
    let file = inspect(path)?;
    let (listing, last, newest) = newest_listed(&objects)?;
    // Owner objects but no segment: owners that never fenced (opens that
    // died between the two steps, from this disk or another) or a replica
    // whose segments were deleted. Only the first can be proved, and only
    // for epochs this disk was taking.
    if last.is_none() && !listing.indexes.is_empty() {
        return Err(Error::Corrupt(format!(
            "the replica at {} has snapshots but no segment; it is not used as it is",
            objects.path("")
        )));
    }
    let mine = local.map_or(0, |l| l.epoch.max(l.claiming));
    if last.is_none()
        && let Some(newest_owner) = listing.owners.last().copied().filter(|e| *e > mine)
    {
        return Err(owners_without_segments(&objects, &listing, newest_owner));
    }
    let epoch = newest_epoch(&listing, newest).max(mine) + 1;
    // Step 0: say which epoch this disk is taking before it is taken.
    write_local(
        &local_file,
        Local {
            claiming: epoch,
            ..local.unwrap_or_default()
        },
    )?;
    claim(&objects, &listing, epoch, &replica.label)?;
    let (place, before) = fence(&objects, epoch, last, newest)?;
    let mut before = before_own_fences(&objects, before, local)?;
    if before.is_some() && provably_empty(&objects, &listing, place.saturating_sub(1))? {
        // Only fences so far: as good as a new replica.
        before = None;
    }
    let (restored, reset, max_row) = if let Some(reason) = choose(file.as_ref(), local, before) {
        let upto = place.saturating_sub(1);
        let r = restore_aside(&objects, path, cache_bytes, (upto, epoch), reason)?;
        let max_row = inspect(path)?.map_or(0, |f| f.last_row);
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
            claiming: 0,
        },
    )?;
    let synchronous = replica.mode == ReplicaMode::Synchronous;
    let was_restored = restored.is_some();
    let uploader = Uploader::start(
        objects,
        Settings {
            mode: replica.mode,
            interval: replica.segment_interval,
            segment_bytes: replica.segment_bytes,
            max_lag_bytes: replica.max_lag_bytes,
            snapshot_after: replica.snapshot_after_bytes,
            snapshot_after_segments: replica.snapshot_after_segments,
            snapshot_interval: replica.snapshot_interval,
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
            sink: Arc::clone(&uploader) as Arc<dyn crate::log::Sink>,
            synchronous,
            behind: reset,
        },
        token_base: epoch << EPOCH_SHIFT,
        uploader,
        restored: was_restored,
    })
}
