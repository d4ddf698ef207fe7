//! A replica of the store in object storage (feature "replica"): every
//! durable commit shipped as checksummed segments, snapshots of the whole
//! store, ownership fenced by the object store's create-only writes, and
//! restore.
//!
//! Rooms:
//! - `format`: the objects' bytes (segments, snapshot parts and
//!   indexes, owner objects, the local state file);
//! - `objects`: the object store as blocking calls on the replica's
//!   own runtime;
//! - `open`: taking ownership, the fence, and the choice between the
//!   local file and a restore;
//! - `restore`: a snapshot and the segments after it, back into a file;
//! - `uploader`: the sink the log hands its commits to, and the thread
//!   that ships them; `snapshot`: writing and pruning snapshots;
//! - `reader`: reading a replica without owning it (a summary, and a
//!   copy of the store in a new file).
//!
//! Invariants:
//! - one owner per store at a time: taking ownership creates the owner
//!   object of the next epoch (create-only; of racers exactly one wins),
//!   then the epoch's first segment (the fence) at the first free place
//!   of the one segment sequence all epochs share; segments are created
//!   create-only, one at a time, so an earlier owner's next upload finds
//!   its place taken, and that owner is fenced (it acknowledges nothing
//!   more);
//! - a segment holds whole commits in commit order; the state after
//!   segment `s` is the state after every commit of segments up to `s`,
//!   or, after a RESET segment, the snapshot of the same seq;
//! - a snapshot of seq `s` is the store as of the last commit of segment
//!   `s`, written by that segment's epoch; one of another epoch (an owner
//!   fenced before it finished) is never read;
//! - a restore reads one snapshot and every segment after it, in order:
//!   a missing, damaged or out-of-order segment is an error naming it,
//!   never a smaller store, and a segment of an epoch below its
//!   predecessor's (a fenced owner's, past its end) is refused;
//! - the replica reads committed batches from the log's seam
//!   (`log::ship`) and writes only to its object store and its own state
//!   file beside the store.

pub(crate) mod format;
pub(crate) mod objects;
pub(crate) mod open;
mod reader;
pub(crate) mod restore;
pub(crate) mod snapshot;
pub(crate) mod uploader;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use reader::{ReplicaCopy, ReplicaReader, ReplicaSummary};

/// The `object_store` crate this build uses: name its stores through this
/// path so the versions agree.
pub use object_store;

/// Where and how a store's replica is kept; give it to
/// [`StoreBuilder::replica`](crate::StoreBuilder::replica).
///
/// Opening the store then takes ownership of the replica, restores the
/// file from it when the file is missing, older than the replica or was
/// left by a fenced owner, and ships every commit to it from then on.
///
/// **Opening with a replica takes it over.** The open fences the current
/// owner, wherever it runs: that owner's next write fails with
/// [`Error::Fenced`](crate::Error::Fenced) and it serves nothing more
/// until it is opened again (taking the replica back, fencing this one).
/// Open with a replica only where this process is to serve the store. To
/// look at a replica — its keys, its newest segment's age — without
/// disturbing its owner, use a [`ReplicaReader`] ([`Replica::reader`]),
/// which never writes to the object store.
///
/// # Examples
/// ```
/// use dedupkv::replica::{Replica, ReplicaMode, object_store::local::LocalFileSystem};
/// use dedupkv::{Key, Store};
/// use std::sync::Arc;
/// # let dir = tempfile::tempdir().unwrap();
/// # let bucket = dir.path().join("bucket");
/// # std::fs::create_dir(&bucket).unwrap();
/// let objects = Arc::new(LocalFileSystem::new_with_prefix(&bucket)?);
/// let replica = Replica::new(objects, "stores/orders-0").mode(ReplicaMode::Synchronous);
/// let store = Store::builder().replica(replica.clone()).open(dir.path().join("a.redb"))?;
/// assert!(store.insert_if_absent(&Key::new("t", "evt-1"))?); // in the replica when it returns
/// drop(store);
///
/// // Another machine: no local file, so the store is restored first.
/// let store = Store::builder().replica(replica).open(dir.path().join("b.redb"))?;
/// assert!(store.replica_status().and_then(|s| s.restored).is_some());
/// assert!(!store.insert_if_absent(&Key::new("t", "evt-1"))?); // still a duplicate
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct Replica {
    pub(crate) objects: Arc<dyn object_store::ObjectStore>,
    pub(crate) prefix: object_store::path::Path,
    pub(crate) mode: ReplicaMode,
    pub(crate) segment_interval: Duration,
    pub(crate) segment_bytes: usize,
    pub(crate) max_lag_bytes: usize,
    pub(crate) snapshot_after_bytes: Option<u64>,
    pub(crate) snapshot_after_segments: Option<u64>,
    pub(crate) snapshot_interval: Duration,
    pub(crate) label: String,
    pub(crate) close_timeout: Duration,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("objects", &self.objects.to_string())
            .field("prefix", &self.prefix.as_ref())
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// When a write is acknowledged, relative to the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReplicaMode {
    /// Acknowledged once durable in the local file, as without a replica;
    /// an uploader ships it in the background, at most
    /// [`Replica::max_lag_bytes`] behind (writers wait beyond that).
    /// Losing the machine loses what was not shipped yet.
    #[default]
    Asynchronous,
    /// Acknowledged only once its segment is in the object store (one
    /// upload per group commit; the commits of callers that arrive while
    /// an upload is in flight share the next one). Losing the machine
    /// loses nothing acknowledged. Needs [`Durability::Immediate`](crate::Durability::Immediate).
    Synchronous,
}

impl Replica {
    /// A replica in `objects` under `prefix` (one prefix per store, such
    /// as `"stores/orders-3"`), with the defaults below. An empty prefix
    /// (or one of slashes only) would put the store's objects at the
    /// bucket's root, beside other stores' objects: opening the store
    /// refuses it.
    pub fn new(objects: Arc<dyn object_store::ObjectStore>, prefix: &str) -> Replica {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into());
        Replica {
            objects,
            prefix: object_store::path::Path::from(prefix),
            mode: ReplicaMode::Asynchronous,
            segment_interval: Duration::from_millis(100),
            segment_bytes: 8 << 20,
            max_lag_bytes: 64 << 20,
            snapshot_after_bytes: None,
            snapshot_after_segments: None,
            snapshot_interval: Duration::from_secs(24 * 3600),
            label: format!("{host}:{}", std::process::id()),
            close_timeout: Duration::from_secs(60),
        }
    }

    /// Asynchronous (default) or synchronous shipping; see [`ReplicaMode`].
    ///
    /// # Examples
    /// See [`Replica`].
    pub fn mode(mut self, mode: ReplicaMode) -> Self {
        self.mode = mode;
        self
    }

    /// How long the asynchronous uploader gathers commits before it cuts
    /// a segment. Default: 100 ms (figures: `docs/performance.md`); at
    /// least 1 ms. A synchronous replica cuts one whenever no upload is
    /// in flight.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # let objects = Arc::new(dedupkv::replica::object_store::memory::InMemory::new());
    /// let r = dedupkv::replica::Replica::new(objects, "s").segment_interval(std::time::Duration::from_millis(50));
    /// ```
    pub fn segment_interval(mut self, d: Duration) -> Self {
        self.segment_interval = d;
        self
    }

    /// A segment is cut once it holds this many bytes (one commit larger
    /// than this is a segment of its own). Default: 8 MiB; at least 1.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # let objects = Arc::new(dedupkv::replica::object_store::memory::InMemory::new());
    /// let r = dedupkv::replica::Replica::new(objects, "s").segment_bytes(1 << 20);
    /// ```
    pub fn segment_bytes(mut self, n: usize) -> Self {
        self.segment_bytes = n;
        self
    }

    /// The most bytes of commits waiting to be shipped: a commit past it
    /// waits (and its callers with it) until the uploader catches up, so
    /// the lag is bounded and the queue never grows without bound.
    /// Default: 64 MiB; at least 1.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # let objects = Arc::new(dedupkv::replica::object_store::memory::InMemory::new());
    /// let r = dedupkv::replica::Replica::new(objects, "s").max_lag_bytes(16 << 20);
    /// ```
    pub fn max_lag_bytes(mut self, n: usize) -> Self {
        self.max_lag_bytes = n;
        self
    }

    /// A new snapshot is written once this many bytes of segments were
    /// shipped since the last one (then the segments and snapshots before
    /// it are deleted). Default: the size of the last snapshot, at least
    /// 64 MiB, with every segment counted as 256 KiB besides its bytes —
    /// so the replica holds at most about two copies of the store, and a
    /// restore reads at most one snapshot and about as much in segments,
    /// in bytes and in requests (see also
    /// [`snapshot_after_segments`](Self::snapshot_after_segments) and
    /// [`snapshot_interval`](Self::snapshot_interval)). Setting it
    /// replaces the default rule by this many bytes.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # let objects = Arc::new(dedupkv::replica::object_store::memory::InMemory::new());
    /// let r = dedupkv::replica::Replica::new(objects, "s").snapshot_after_bytes(256 << 20);
    /// ```
    pub fn snapshot_after_bytes(mut self, n: u64) -> Self {
        self.snapshot_after_bytes = Some(n);
        self
    }

    /// A new snapshot is also written once this many segments were
    /// shipped since the last one, whatever their size. Default: none
    /// beyond the default byte rule, which already counts every segment
    /// as 256 KiB besides its bytes (a restore pays one request per
    /// object), so a replica of lone synchronous commits takes a snapshot
    /// every 256 segments while the store is under 64 MiB. At least 1.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # let objects = Arc::new(dedupkv::replica::object_store::memory::InMemory::new());
    /// let r = dedupkv::replica::Replica::new(objects, "s").snapshot_after_segments(1_000);
    /// ```
    pub fn snapshot_after_segments(mut self, n: u64) -> Self {
        self.snapshot_after_segments = Some(n);
        self
    }

    /// A new snapshot is also written once the last one is this old and
    /// anything was shipped since, so records that expired leave the
    /// replica (they leave the file at once, the replica with its next
    /// snapshot). Default: 24 hours; at least 1 ms.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # let objects = Arc::new(dedupkv::replica::object_store::memory::InMemory::new());
    /// let r = dedupkv::replica::Replica::new(objects, "s")
    ///     .snapshot_interval(std::time::Duration::from_secs(6 * 3600));
    /// ```
    pub fn snapshot_interval(mut self, d: Duration) -> Self {
        self.snapshot_interval = d;
        self
    }

    /// Who this owner is, written into its owner object (for people).
    /// Default: `$HOSTNAME:pid`.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # let objects = Arc::new(dedupkv::replica::object_store::memory::InMemory::new());
    /// let r = dedupkv::replica::Replica::new(objects, "s").owner_label("consumer-7");
    /// ```
    pub fn owner_label(mut self, label: &str) -> Self {
        self.label = label.to_string();
        self
    }

    /// How long closing the store waits for the uploader to ship what is
    /// left. Default: 60 s. Past it the store closes anyway, leaving the
    /// tail in the local file only (its next open ships it).
    /// `Duration::ZERO` does not wait; `Duration::MAX` waits without a
    /// limit.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # let objects = Arc::new(dedupkv::replica::object_store::memory::InMemory::new());
    /// let r = dedupkv::replica::Replica::new(objects, "s").close_timeout(std::time::Duration::from_secs(5));
    /// ```
    pub fn close_timeout(mut self, d: Duration) -> Self {
        self.close_timeout = d;
        self
    }

    /// Checks the settings.
    pub(crate) fn validate(&self, durability: crate::Durability) -> crate::Result<()> {
        let bad = |m: &str| Err(crate::Error::InvalidConfig(m.into()));
        if self.prefix.as_ref().is_empty() {
            return bad(
                "the replica's prefix is empty (or only slashes): the store's objects would \
                 sit at the bucket's root, beside other stores' objects; give each store a \
                 prefix of its own, such as \"stores/orders-3\"",
            );
        }
        if self.segment_interval.is_zero() {
            return bad("the replica's segment interval must be at least 1 ms");
        }
        if self.snapshot_after_segments == Some(0) {
            return bad("the replica's snapshot_after_segments must be at least 1");
        }
        if self.snapshot_interval.is_zero() {
            return bad("the replica's snapshot interval must be at least 1 ms");
        }
        if self.segment_bytes == 0 || self.max_lag_bytes == 0 {
            return bad("the replica's segment bytes and max lag bytes must be at least 1");
        }
        if self.mode == ReplicaMode::Synchronous && durability != crate::Durability::Immediate {
            return bad("a synchronous replica needs Durability::Immediate");
        }
        Ok(())
    }
}

/// What the replica of an open store is doing; from
/// [`Store::replica_status`](crate::Store::replica_status).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplicaStatus {
    /// The ownership epoch this store holds (its tokens are at least
    /// `epoch · 2^40`).
    pub epoch: u64,
    /// What the open restored, if it restored.
    pub restored: Option<Restored>,
    /// The newest segment in the object store written by this owner.
    pub last_segment: Option<u64>,
    /// Bytes of commits not shipped yet.
    pub lag_bytes: u64,
    /// How long the oldest commit not shipped yet has waited.
    pub lag: Duration,
    /// Uploads that failed and were retried.
    pub upload_failures: u64,
    /// The last upload failure, if any.
    pub last_error: Option<String>,
    /// Snapshots written by this owner.
    pub snapshots: u64,
    /// This owner was fenced by a later one (every call now answers
    /// [`Error::Fenced`](crate::Error::Fenced)).
    pub fenced: bool,
}

/// What opening a store restored from its replica.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Restored {
    /// Why it restored.
    pub reason: RestoreReason,
    /// Log records restored (a run of inserts counts once).
    pub records: u64,
    /// Log rows restored.
    pub rows: u64,
    /// Bytes read from the object store.
    pub bytes: u64,
    /// How long the restore took (before the store's own open).
    pub duration: Duration,
    /// The snapshot it started from (its seq).
    pub snapshot: u64,
    /// Segments applied after the snapshot.
    pub segments: u64,
    /// Where the local file that was replaced went, if there was one.
    pub replaced: Option<PathBuf>,
}

/// Why a store was restored from its replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RestoreReason {
    /// There was no local file.
    Missing,
    /// The local file is older than the replica (a copy from before
    /// commits the replica holds).
    Older,
    /// The local file was left by an owner another owner fenced since.
    Fenced,
    /// The local file carries no record of belonging to this replica.
    Foreign,
}
