#![cfg_attr(not(feature = "replica"), allow(dead_code))]
//! The log's seam for a replica (`src/replica/`, feature "replica"): what
//! the committer hands a replica after each durable commit, what the
//! replica tells the log back, and how a replica's copy becomes a store
//! file again.
//!
//! The replica reads committed batches here and nowhere else; it never
//! sees the index or the engine.
//!
//! Without the feature only [`Ship`], [`Sink`] and [`Shipped`] are used
//! (by the committer, with no sink set).
//!
//! Invariants:
//! - a [`Sink`] is given every durable commit of the log, in commit order,
//!   one call at a time (the committer holds the commit lock), after the
//!   commit returned `Ok` and before its callers are woken;
//! - with no replica the log holds `None` and copies nothing: the seam
//!   costs one branch per commit;
//! - a synchronous replica's acknowledgement ([`Acks::replicated`]) is the
//!   watermark callers wait on instead of the durable row; a fenced
//!   replica ([`Acks::fence`]) poisons the log, so nothing is acknowledged
//!   after it.

#[cfg(feature = "replica")]
use std::ops::RangeInclusive;
#[cfg(feature = "replica")]
use std::path::{Path, PathBuf};

use super::store::{Commit, LogStore, SUMMARY_ROW};
#[cfg(feature = "replica")]
use super::store::{Location, MetaEntries};
#[cfg(feature = "replica")]
use super::{Storage, open_plain};
use crate::sync::Arc;
#[cfg(feature = "replica")]
use crate::{Error, Result};

/// One durable commit, as the replica ships it: what the storage commit
/// changed, in the order it applied it (drops, trims, rows, metadata).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Shipped {
    /// The commit's newest row number: what a synchronous replica's
    /// acknowledgement covers.
    pub row: u64,
    /// Bucket tables deleted.
    pub drops: Vec<u64>,
    /// Rows deleted from a bucket's table: (bucket, first row, last row).
    pub trims: Vec<(u64, u64, u64)>,
    /// Rows written: (bucket, row number, the sealed row's bytes), and
    /// bucket summaries as rows numbered `SUMMARY_ROW`.
    pub rows: Vec<(u64, u64, Vec<u8>)>,
    /// Metadata entries written (`Some`) or removed (`None`).
    pub meta: Vec<(String, Option<Vec<u8>>)>,
}

impl Shipped {
    /// Bytes this commit carries (rows and metadata values).
    pub(crate) fn bytes(&self) -> usize {
        self.rows.iter().map(|r| r.2.len() + 16).sum::<usize>()
            + self
                .meta
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
            + 8 * self.drops.len()
            + 24 * self.trims.len()
    }

    /// A copy of what `commit` changes, for a sink.
    pub(crate) fn of(row: u64, commit: &Commit<'_>) -> Shipped {
        Shipped {
            row,
            drops: commit.drop_buckets.to_vec(),
            trims: commit
                .trims
                .iter()
                .map(|(b, r)| (*b, *r.start(), *r.end()))
                .collect(),
            // A bucket's summary is its table's row `SUMMARY_ROW`: shipped
            // as one more row, after the commit's rows, so a restored table
            // holds the summary its rows were written with.
            rows: commit
                .rows
                .iter()
                .cloned()
                .chain(
                    commit
                        .summaries
                        .iter()
                        .map(|(b, sum)| (*b, SUMMARY_ROW, sum.clone())),
                )
                .collect(),
            meta: commit
                .meta
                .iter()
                .map(|(k, v)| ((*k).to_string(), v.clone()))
                .chain(commit.raw_meta.iter().cloned())
                .collect(),
        }
    }
}

/// Where the committer hands each durable commit (the replica).
pub(crate) trait Sink: Send + Sync {
    /// Called once, before the log's first commit: how to tell the log
    /// what is replicated, or that the replica was fenced.
    fn attach(&self, acks: Acks);

    /// Called with each durable commit, in commit order, by whoever holds
    /// the commit lock (never two at once). `store` is the log's storage
    /// as of exactly this commit: a [`View`](super::store::View) taken from it now holds this
    /// commit and nothing after it. May block, which holds up later
    /// commits (how a replica that falls behind slows writers).
    fn shipped(&self, commit: Shipped, store: &dyn LogStore);

    /// A caller waits for row `row` to be in the replica: ship it as soon
    /// as its commit is handed over, without waiting for a full segment or
    /// the segment interval. Must not block.
    fn hurry(&self, row: u64);

    /// The log is closing; called after its last commit.
    fn closed(&self);
}

/// A replica as the log holds it.
#[derive(Clone)]
pub(crate) struct Ship {
    pub sink: Arc<dyn Sink>,
    /// Callers wait for [`Acks::replicated`] instead of the durable row.
    pub synchronous: bool,
    /// The replica does not yet hold the rows already in the file (it will
    /// once it acknowledges a row of this run): a synchronous store then
    /// answers nothing based on them until it does.
    pub behind: bool,
}

impl std::fmt::Debug for Ship {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ship")
            .field("synchronous", &self.synchronous)
            .finish_non_exhaustive()
    }
}

/// What a replica tells the log (see `ack.rs` for what each does).
#[derive(Clone)]
pub(crate) struct Acks(pub(super) crate::sync::Weak<dyn AckTarget>);

/// The log's side of [`Acks`].
pub(crate) trait AckTarget: Send + Sync {
    fn replicated(&self, row: u64);
    fn commit_soon(&self);
    fn fence(&self, why: String);
}

impl Acks {
    /// Every commit up to row `row` is in the replica.
    pub(crate) fn replicated(&self, row: u64) {
        if let Some(t) = self.0.upgrade() {
            t.replicated(row);
        }
    }

    /// Makes the log commit soon, even with nothing to commit (the sink
    /// then gets a commit to take a view in).
    pub(crate) fn commit_soon(&self) {
        if let Some(t) = self.0.upgrade() {
            t.commit_soon();
        }
    }

    /// Another owner took the replica over: the log refuses everything
    /// from now on as [fenced](crate::Error::Fenced).
    pub(crate) fn fence(&self, why: String) {
        if let Some(t) = self.0.upgrade() {
            t.fence(why);
        }
    }
}

#[cfg(feature = "replica")]
/// What a store file on disk holds, as far as a replica needs to know
/// before opening it.
pub(crate) struct LocalFile {
    /// The newest row number in the file.
    pub last_row: u64,
}

#[cfg(feature = "replica")]
/// Reads what a replica needs of the store file at `path`, without
/// opening it as a store; `None` when there is no file.
pub(crate) fn inspect(path: &Path) -> Result<Option<LocalFile>> {
    if !path.exists() {
        return Ok(None);
    }
    // The default journal: a store kept with one keeps it (no setting
    // would settle it, and the open that follows would find it without).
    let db = open_plain(
        Location::Existing(path.to_path_buf()),
        1 << 20,
        Some(super::JournalSetting::default_on()),
    )?;
    Ok(Some(LocalFile {
        last_row: db.last_row()?,
    }))
}

#[cfg(feature = "replica")]
/// A store file being rebuilt from a replica: created empty at a
/// temporary path beside the store, filled commit by commit, and moved
/// into place by [`Restorer::finish`] once it is whole.
pub(crate) struct Restorer {
    db: Storage,
    tmp: PathBuf,
    path: PathBuf,
}

#[cfg(feature = "replica")]
impl Restorer {
    /// Starts a new file for `path` (at `path` + `.restoring`, replacing
    /// what an interrupted restore left there).
    pub(crate) fn create(path: &Path, cache_bytes: usize) -> Result<Restorer> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".restoring");
        let tmp = PathBuf::from(tmp);
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Storage(crate::error::io_at(&tmp, &e))),
        }
        let db = open_plain(Location::Path(tmp.clone()), cache_bytes, None)?;
        Ok(Restorer {
            db,
            tmp,
            path: path.to_path_buf(),
        })
    }

    /// Writes a snapshot's metadata entries.
    pub(crate) fn meta(&self, entries: MetaEntries) -> Result<()> {
        self.db.commit(Commit {
            raw_meta: entries.into_iter().map(|(k, v)| (k, Some(v))).collect(),
            ..Commit::default()
        })?;
        Ok(())
    }

    /// Writes rows of a snapshot: (bucket, row number, bytes).
    pub(crate) fn rows(&self, rows: Vec<(u64, u64, Vec<u8>)>) -> Result<()> {
        self.db.commit(Commit {
            rows,
            ..Commit::default()
        })?;
        Ok(())
    }

    /// Applies shipped commits in order, as one storage commit. Only the
    /// first may delete tables or rows (a commit's deletions come before
    /// its writes, so later deletions would move ahead of earlier writes);
    /// [`Restorer::can_join`] says whether a commit may join a group.
    pub(crate) fn apply(&self, group: Vec<Shipped>) -> Result<()> {
        let mut it = group.into_iter();
        let Some(first) = it.next() else {
            return Ok(());
        };
        let trims: Vec<(u64, RangeInclusive<u64>)> = first
            .trims
            .into_iter()
            .map(|(b, s, e)| (b, s..=e))
            .collect();
        let (mut rows, mut raw_meta) = (first.rows, first.meta);
        for c in it {
            debug_assert!(Self::can_join(&c));
            rows.extend(c.rows);
            raw_meta.extend(c.meta);
        }
        self.db.commit(Commit {
            drop_buckets: &first.drops,
            trims,
            rows,
            summaries: Vec::new(),
            meta: Vec::new(),
            raw_meta,
        })?;
        Ok(())
    }

    /// Whether `c` may join a group after its first commit (it deletes
    /// nothing).
    pub(crate) fn can_join(c: &Shipped) -> bool {
        c.drops.is_empty() && c.trims.is_empty()
    }

    /// Closes the rebuilt file and moves it to the store's path (replacing
    /// what is there), durably.
    pub(crate) fn finish(self) -> Result<()> {
        let Restorer { db, tmp, path } = self;
        drop(db);
        std::fs::rename(&tmp, &path).map_err(|e| Error::Storage(crate::error::io_at(&path, &e)))?;
        if let Some(dir) = path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| Error::Storage(crate::error::io_at(dir, &e)))?;
        }
        Ok(())
    }
}
