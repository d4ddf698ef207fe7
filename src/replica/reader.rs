//! Reading a replica without owning it: what it holds (its newest owner,
//! segment and snapshot), and a copy of the store it replicates, restored
//! into a new file of the caller's and opened there as a plain store.
//!
//! Invariants:
//! - the reader only lists, reads and HEADs objects: it never creates,
//!   overwrites or deletes one and never takes an epoch, so the owner it
//!   looks at goes on undisturbed (opening with
//!   [`StoreBuilder::replica`](crate::StoreBuilder::replica) would fence it);
//! - a copy is written to a new file only (an existing path is refused),
//!   and opened with no replica: what is done to the copy stays in it;
//! - a copy is the chain up to the newest segment listed when it starts
//!   (what the owner ships later is not in it), restored by the same code
//!   as an owner's restore: a missing or damaged object is an error
//!   naming it, never a smaller store.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::format::{self, SEGMENT_HEAD};
use super::objects::{Objects, number_in, owner_name, segment_name};
use super::{Replica, RestoreReason};
use crate::{Error, Result, Store};

/// Page cache of the restore into the copy.
const COPY_CACHE_BYTES: usize = 64 << 20;
/// Restores tried while the owner keeps replacing the snapshot under the
/// copy (each try starts from a newer snapshot).
const COPY_TRIES: usize = 3;

/// Reads a store's replica without taking it over: what it holds, and a
/// copy of the store in a file of its own. Nothing is ever written to the
/// object store, so the owner goes on serving while an operator looks.
///
/// Opening a store with [`StoreBuilder::replica`](crate::StoreBuilder::replica)
/// is not a way to look: it takes ownership and fences the current owner.
///
/// # Examples
/// ```
/// use dedupkv::replica::{Replica, ReplicaMode, ReplicaReader, object_store::memory::InMemory};
/// use dedupkv::{Key, Store};
/// use std::sync::Arc;
/// # let dir = tempfile::tempdir().unwrap();
/// let objects = Arc::new(InMemory::new());
/// let replica = Replica::new(objects.clone(), "stores/orders-0").mode(ReplicaMode::Synchronous);
/// let owner = Store::builder().replica(replica).open(dir.path().join("live.redb"))?;
/// owner.insert_if_absent(&Key::new("t", "evt-1"))?;
///
/// // An operator, elsewhere: look, without taking the replica over.
/// let reader = ReplicaReader::new(objects, "stores/orders-0");
/// assert_eq!(reader.summary()?.epoch, Some(1));
/// let copy = reader.copy_to(dir.path().join("look.redb"))?;
/// assert!(copy.store.get(&Key::new("t", "evt-1"))?.is_some());
///
/// // The owner was not disturbed.
/// assert!(owner.insert_if_absent(&Key::new("t", "evt-2"))?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ReplicaReader {
    objects: Objects,
    prefix: String,
}

impl std::fmt::Debug for ReplicaReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaReader")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// What a replica holds, read without restoring it; from
/// [`ReplicaReader::summary`].
///
/// # Examples
/// See [`ReplicaReader::summary`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplicaSummary {
    /// The replica's prefix in its object store.
    pub prefix: String,
    /// Objects under the prefix, of every kind.
    pub objects: u64,
    /// The newest ownership epoch taken (its owner is the current owner,
    /// unless it has closed or died since).
    pub epoch: Option<u64>,
    /// The newest epoch's owner label ([`Replica::owner_label`]).
    pub owner: Option<String>,
    /// When the newest epoch was taken (the owner's clock).
    pub owner_since: Option<SystemTime>,
    /// The newest segment's place in the segment sequence.
    pub last_segment: Option<u64>,
    /// The epoch that wrote the newest segment.
    pub last_segment_epoch: Option<u64>,
    /// When the newest segment was written (the object store's clock).
    pub last_segment_written: Option<SystemTime>,
    /// How long ago the newest segment was written, by this machine's
    /// clock (zero if that clock is behind the object store's).
    pub last_segment_age: Option<Duration>,
    /// The newest snapshot's seq (the segment place it is the store as of).
    pub snapshot: Option<u64>,
}

/// A copy of a replicated store, restored from its replica into a new
/// file and opened there with no replica; from [`ReplicaReader::copy_to`].
///
/// # Examples
/// See [`ReplicaReader::copy_to`].
#[derive(Debug)]
#[non_exhaustive]
pub struct ReplicaCopy {
    /// The copy, a plain local store: read it like any store (writes to
    /// it change the copy only, never the replica).
    pub store: Store,
    /// The snapshot the copy started from (its seq), if the replica had
    /// one (a replica whose owner never shipped one is an empty store).
    pub snapshot: Option<u64>,
    /// The newest segment the copy holds (the chain's newest when the
    /// copy started).
    pub last_segment: Option<u64>,
    /// Segments applied after the snapshot.
    pub segments: u64,
    /// Log records restored (a run of inserts counts once).
    pub records: u64,
    /// Bytes read from the object store.
    pub bytes: u64,
    /// How long the restore took (before the copy's own open).
    pub duration: Duration,
}

/// Listings a summary tries while an object it listed is gone when read.
const SUMMARY_TRIES: u32 = 8;

/// The chain's objects as listed: places, sorted.
struct Chain {
    owners: Vec<u64>,
    segments: Vec<u64>,
    snapshots: Vec<u64>,
}

impl Replica {
    /// A reader of this replica: for looking at it without taking it over
    /// (see [`ReplicaReader`]).
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # let objects = Arc::new(dedupkv::replica::object_store::memory::InMemory::new());
    /// let replica = dedupkv::replica::Replica::new(objects, "stores/orders-0");
    /// let reader = replica.reader();
    /// assert!(reader.summary().is_err()); // nothing replicated there yet
    /// ```
    pub fn reader(&self) -> ReplicaReader {
        ReplicaReader::new(Arc::clone(&self.objects), self.prefix.as_ref())
    }
}

impl ReplicaReader {
    /// A reader of the replica in `objects` under `prefix` (the prefix
    /// given to [`Replica::new`]).
    ///
    /// # Examples
    /// See [`ReplicaReader`].
    #[must_use]
    pub fn new(objects: Arc<dyn object_store::ObjectStore>, prefix: &str) -> ReplicaReader {
        let prefix = object_store::path::Path::from(prefix);
        ReplicaReader {
            prefix: prefix.as_ref().to_string(),
            objects: Objects::new(objects, prefix),
        }
    }

    /// What the replica holds, from its listing and a few small reads
    /// (the newest owner object, the newest segment's head): its newest
    /// epoch and owner, its newest segment's place, epoch and age, its
    /// newest snapshot. Restores nothing, writes nothing.
    ///
    /// # Errors
    /// [`Error::Replica`] naming the prefix when it holds no replica (no
    /// objects at all, or none a replica writes: a wrong prefix) or when
    /// the object store fails; [`Error::Corrupt`] naming the newest owner
    /// object or segment when it is damaged.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::replica::{Replica, ReplicaReader, object_store::memory::InMemory};
    /// # use std::sync::Arc;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let objects = Arc::new(InMemory::new());
    /// let replica = Replica::new(objects.clone(), "s").owner_label("consumer-7");
    /// let owner = dedupkv::Store::builder().replica(replica).open(dir.path().join("a.redb"))?;
    /// let summary = ReplicaReader::new(objects, "s").summary()?;
    /// assert_eq!(summary.owner.as_deref(), Some("consumer-7"));
    /// assert!(summary.last_segment.is_some() && summary.last_segment_age.is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn summary(&self) -> Result<ReplicaSummary> {
        // A live owner prunes what a new snapshot covers: an object listed
        // a moment ago can be gone when read (a newer one then exists), so
        // the prefix is listed again; still gone after that, it is an error.
        let mut tries = 0;
        loop {
            match self.summary_once()? {
                Ok(summary) => return Ok(summary),
                Err(gone) => {
                    tries += 1;
                    if tries >= SUMMARY_TRIES {
                        return Err(self.gone(&gone));
                    }
                    std::thread::sleep(Duration::from_millis(10 << tries.min(5)));
                }
            }
        }
    }

    /// One try of [`summary`](Self::summary): the summary, or the name of
    /// an object listed and gone when read.
    fn summary_once(&self) -> Result<std::result::Result<ReplicaSummary, String>> {
        let chain = self.chain()?;
        let objects = self.objects.count()?;
        let (mut epoch, mut owner, mut owner_since) = (None, None, None);
        if let Some(&e) = chain.owners.last() {
            let name = owner_name(e);
            let what = self.objects.path(&name);
            let Some(bytes) = self.objects.get(&name)? else {
                return Ok(Err(name));
            };
            let o = format::read_owner(&bytes, what.as_ref())?;
            epoch = Some(o.epoch);
            owner = Some(o.label);
            owner_since = SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(o.at_ms));
        }
        let (mut last_segment_epoch, mut last_segment_written, mut last_segment_age) =
            (None, None, None);
        if let Some(&seq) = chain.segments.last() {
            let name = segment_name(seq);
            let what = self.objects.path(&name);
            let Some(head) = self.objects.head_bytes(&name, SEGMENT_HEAD as u64)? else {
                return Ok(Err(name));
            };
            last_segment_epoch = Some(format::segment_head(&head, what.as_ref())?.epoch);
            let Some(written) = self.objects.modified(&name)? else {
                return Ok(Err(name));
            };
            last_segment_written = Some(written);
            last_segment_age = Some(
                SystemTime::now()
                    .duration_since(written)
                    .unwrap_or(Duration::ZERO),
            );
        }
        Ok(Ok(ReplicaSummary {
            prefix: self.prefix.clone(),
            objects,
            epoch,
            owner,
            owner_since,
            last_segment: chain.segments.last().copied(),
            last_segment_epoch,
            last_segment_written,
            last_segment_age,
            snapshot: chain.snapshots.last().copied(),
        }))
    }

    /// Restores the store the replica holds — its newest valid snapshot
    /// and every segment after it, up to the newest — into a new file at
    /// `path`, and opens it there as a plain store with no replica, to be
    /// read like any store ([`Store::get`], the listings). The replica is
    /// only read: its owner goes on undisturbed, and the copy holds what
    /// the owner had shipped when the copy started (in
    /// [`ReplicaMode::Synchronous`](super::ReplicaMode::Synchronous),
    /// everything it had acknowledged).
    ///
    /// `path` must not exist, so that a copy never replaces a store.
    /// When the owner replaces its snapshot during the copy (and deletes
    /// the segments before it), the copy starts again from the new one, a
    /// few times at most.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `path` (or a restore's leftover
    /// beside it, `path` + `.restoring`) exists; [`Error::Replica`]
    /// naming the prefix when it holds no replica, or naming the object
    /// when the object store fails; [`Error::Corrupt`] naming a replica
    /// object that is missing or damaged; [`Error::Storage`] naming the
    /// path when the file cannot be written. No file is left at `path`
    /// after an error.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::replica::{Replica, ReplicaMode, ReplicaReader, object_store::memory::InMemory};
    /// use dedupkv::{Key, Store};
    /// # use std::sync::Arc;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let objects = Arc::new(InMemory::new());
    /// let replica = Replica::new(objects.clone(), "s").mode(ReplicaMode::Synchronous);
    /// let owner = Store::builder().replica(replica).open(dir.path().join("live.redb"))?;
    /// owner.insert_if_absent(&Key::new("t", "evt-1"))?;
    ///
    /// let reader = ReplicaReader::new(objects, "s");
    /// let copy = reader.copy_to(dir.path().join("look.redb"))?;
    /// assert!(copy.store.get(&Key::new("t", "evt-1"))?.is_some());
    /// assert!(copy.store.get(&Key::new("t", "evt-9"))?.is_none());
    /// // Never over an existing file (a live store's, say).
    /// assert!(reader.copy_to(dir.path().join("live.redb")).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn copy_to(&self, path: impl AsRef<Path>) -> Result<ReplicaCopy> {
        let path = path.as_ref();
        let leftover = restoring(path);
        for p in [path, leftover.as_path()] {
            if p.symlink_metadata().is_ok() {
                return Err(exists(p));
            }
        }
        // The path is ours from here: created new, so never another's file.
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(exists(path)),
            Err(e) => return Err(Error::Storage(crate::error::io_at(path, &e))),
        }
        let copy = self.copy_into(path);
        if copy.is_err() {
            for p in [path, leftover.as_path()] {
                let _ = std::fs::remove_file(p);
            }
        }
        copy
    }

    /// [`copy_to`](Self::copy_to) once `path` is reserved (an empty file
    /// of ours).
    fn copy_into(&self, path: &Path) -> Result<ReplicaCopy> {
        let mut tries = 0;
        loop {
            tries += 1;
            let chain = self.chain()?;
            let Some(&upto) = chain.segments.last() else {
                return empty_copy(path);
            };
            if super::restore::is_empty(&self.objects, upto)? {
                return empty_copy(path);
            }
            match super::restore::restore(
                &self.objects,
                path,
                COPY_CACHE_BYTES,
                upto,
                RestoreReason::Missing,
            ) {
                Ok(r) => {
                    let store = Store::builder().open_existing(path)?;
                    return Ok(ReplicaCopy {
                        store,
                        snapshot: Some(r.snapshot),
                        last_segment: Some(upto),
                        segments: r.segments,
                        records: r.records,
                        bytes: r.bytes,
                        duration: r.duration,
                    });
                }
                Err(e) => {
                    // A newer snapshot means the owner pruned under us:
                    // start again from it. Otherwise the damage is real.
                    let moved = self.chain()?.snapshots.last() != chain.snapshots.last();
                    if !moved || tries >= COPY_TRIES {
                        return Err(e);
                    }
                    let _ = std::fs::remove_file(restoring(path));
                }
            }
        }
    }

    /// The chain as listed; an error naming the prefix when it holds no
    /// replica.
    fn chain(&self) -> Result<Chain> {
        let numbers = |dir: &str, names: Vec<String>| {
            let mut v: Vec<u64> = names.iter().filter_map(|n| number_in(n, dir)).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let owners = numbers("owner", self.objects.list("owner")?);
        let segments = numbers("seg", self.objects.list("seg")?);
        let snap: Vec<String> = self
            .objects
            .list("snap")?
            .into_iter()
            .filter(|n| n.ends_with("/index"))
            .collect();
        let snapshots = numbers("snap", snap);
        if owners.is_empty() && segments.is_empty() && snapshots.is_empty() {
            let n = self.objects.count()?;
            let why = if n == 0 {
                "it holds no objects: no store was ever replicated there (check the object \
                 store and the prefix)"
                    .to_string()
            } else {
                format!(
                    "it holds {n} objects but none a replica writes (owner/, seg/, snap/) \
                     directly under it: is this a store's prefix?"
                )
            };
            return Err(Error::Replica {
                what: format!("reading the replica at {}", self.prefix),
                source: why.into(),
            });
        }
        Ok(Chain {
            owners,
            segments,
            snapshots,
        })
    }

    /// The error for an object that was listed and is gone.
    fn gone(&self, name: &str) -> Error {
        Error::Corrupt(format!(
            "the replica object {} was listed but is gone",
            self.objects.path(name)
        ))
    }
}

/// Where a restore into `path` writes before it renames.
fn restoring(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".restoring");
    PathBuf::from(p)
}

fn exists(path: &Path) -> Error {
    Error::InvalidArgument {
        what: "the copy's path",
        reason: format!(
            "{} exists already: a replica is copied into a new file only, so that a copy \
             never replaces a store",
            path.display()
        ),
    }
}

/// The copy of a replica that holds no commit yet: an empty store.
fn empty_copy(path: &Path) -> Result<ReplicaCopy> {
    std::fs::remove_file(path).map_err(|e| Error::Storage(crate::error::io_at(path, &e)))?;
    let store = Store::builder().open(path)?;
    Ok(ReplicaCopy {
        store,
        snapshot: None,
        last_segment: None,
        segments: 0,
        records: 0,
        bytes: 0,
        duration: Duration::ZERO,
    })
}
