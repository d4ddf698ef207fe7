//! The public face: [`Store`]. Each method delegates to the engine in a
//! few lines; the claim and ordering calls are in `api/claim.rs` and
//! `api/order.rs`.

use std::path::Path;
use std::time::Duration;

use crate::clock::Clock;
use crate::contract::{Read, Settle, SharedBackend, Write};
use crate::engine::{Config, Engine, Location, Threads};
use crate::sync::Arc;
use crate::types::{Eviction, Forget, Record, Stats};
#[cfg(doc)]
use crate::{Durability, Error, State};
use crate::{Key, Result, StoreBuilder};

/// An embedded deduplication and idempotency store.
///
/// Cheap to clone (an `Arc`); share it between threads. It runs over the
/// embedded engine (a file: [`open`](Self::open)), or over a shared
/// backend that several processes use at once (the `PostgreSQL` one:
/// [`StoreBuilder::open_shared`]).
///
/// # Examples
/// ```
/// use dedupkv::{Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("dedup.redb"))?;
/// assert!(store.insert_if_absent(&Key::new("shop-42", "evt_1"))?);  // new: handle it
/// assert!(!store.insert_if_absent(&Key::new("shop-42", "evt_1"))?); // duplicate: skip
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Clone)]
pub struct Store {
    /// The live admin endpoint (feature "admin"), stopped when the last
    /// handle goes; the endpoint's own handle has none.
    #[cfg(feature = "admin")]
    admin: Option<Arc<crate::admin::AdminServer>>,
    // Declared first so they are dropped (stopped and joined) before the
    // engine.
    _threads: Threads,
    backend: Backend,
    /// The engine's metrics (none over a shared backend).
    #[cfg(feature = "metrics")]
    metrics: Option<Arc<crate::metrics::Bridge>>,
    /// The replica's uploader (feature "replica").
    #[cfg(feature = "replica")]
    replica: Option<Arc<crate::replica::uploader::Uploader>>,
}

/// What a [`Store`] runs over: the embedded engine, or a shared backend
/// (`PostgreSQL`) chosen at open
/// ([`StoreBuilder::open_shared`](crate::StoreBuilder::open_shared)).
#[derive(Clone)]
pub(crate) enum Backend {
    Engine(Arc<Engine>),
    Shared(std::sync::Arc<dyn SharedBackend>),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.backend {
            Backend::Engine(engine) => {
                let cfg = engine.config();
                f.debug_struct("Store")
                    .field("shards", &cfg.shards)
                    .field("durability", &cfg.durability)
                    .finish_non_exhaustive()
            }
            Backend::Shared(b) => f
                .debug_struct("Store")
                .field("backend", &b.backend_name())
                .finish_non_exhaustive(),
        }
    }
}

impl Store {
    /// Opens the engine at `location` (the builder's way in).
    pub(crate) fn open_with(
        cfg: Config,
        clock: Arc<dyn Clock>,
        location: Location,
    ) -> Result<Store> {
        let (engine, threads) = Engine::open(cfg, clock, location)?;
        Ok(Store::serving(engine, threads))
    }

    /// Opens the engine at `path` read-only (the builder's way in).
    pub(crate) fn open_read_only_with(
        cfg: Config,
        clock: Arc<dyn Clock>,
        path: &Path,
    ) -> Result<Store> {
        let engine = Engine::open_read_only(cfg, clock, path.to_path_buf())?;
        Ok(Store::serving(engine, Threads::none()))
    }

    fn serving(engine: Arc<Engine>, threads: Threads) -> Store {
        Store {
            #[cfg(feature = "admin")]
            admin: None,
            _threads: threads,
            #[cfg(feature = "metrics")]
            metrics: Some(crate::metrics::Bridge::install(&engine)),
            backend: Backend::Engine(engine),
            #[cfg(feature = "replica")]
            replica: None,
        }
    }

    /// A store over `backend` (the builder's way in).
    pub(crate) fn shared(backend: impl SharedBackend) -> Store {
        Store {
            #[cfg(feature = "admin")]
            admin: None,
            _threads: Threads::none(),
            #[cfg(feature = "metrics")]
            metrics: None,
            backend: Backend::Shared(std::sync::Arc::new(backend)),
            #[cfg(feature = "replica")]
            replica: None,
        }
    }

    /// This store, serving its admin endpoint until its last handle goes.
    #[cfg(feature = "admin")]
    pub(crate) fn with_admin(
        mut self,
        path: &Path,
        opts: &crate::admin::AdminOptions,
    ) -> Result<Store> {
        let server = crate::admin::AdminServer::store(self.clone(), path, opts)?;
        self.admin = Some(Arc::new(server));
        Ok(self)
    }

    /// This store, with the replica it ships to.
    #[cfg(feature = "replica")]
    pub(crate) fn with_replica(mut self, up: Arc<crate::replica::uploader::Uploader>) -> Store {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.watch_replica(&up);
        }
        self.replica = Some(up);
        self
    }

    /// Waits until every write acknowledged so far is in the replica
    /// (feature "replica"). A synchronous replica is always there
    /// already; an asynchronous one ships what is left now, without
    /// waiting for its interval. Closing the store does this too (within
    /// [`Replica::close_timeout`](crate::replica::Replica::close_timeout)).
    ///
    /// # Errors
    /// [`Error::Fenced`] when another owner took the replica over;
    /// [`Error::InvalidConfig`] for a store without a replica; the
    /// errors of [`flush`](Self::flush).
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// use dedupkv::replica::{Replica, object_store::memory::InMemory};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let replica = Replica::new(Arc::new(InMemory::new()), "s");
    /// let store = dedupkv::Store::builder().replica(replica).open(dir.path().join("s.redb"))?;
    /// store.insert_if_absent(&dedupkv::Key::new("t", "a"))?;
    /// store.sync_replica()?; // now a lost disk loses nothing of it
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[cfg(feature = "replica")]
    #[cfg_attr(docsrs, doc(cfg(feature = "replica")))]
    pub fn sync_replica(&self) -> Result<()> {
        let Some(up) = &self.replica else {
            return Err(crate::Error::InvalidConfig(
                "this store has no replica".into(),
            ));
        };
        self.engine_for("sync_replica")?.flush()?;
        up.sync()
    }

    /// [`sync_replica`](Self::sync_replica), for a hand-over that must
    /// end by `until` (`None`: no limit): `Ok(false)` when `until` passed
    /// before the tail was shipped (it stays in the local file). Closing
    /// the store then waits for the uploader until `until` at the latest
    /// too.
    #[cfg(feature = "replica")]
    pub(crate) fn sync_replica_until(&self, until: Option<std::time::Instant>) -> Result<bool> {
        let Some(up) = &self.replica else {
            return Err(crate::Error::InvalidConfig(
                "this store has no replica".into(),
            ));
        };
        if let Some(at) = until {
            up.close_by(at);
        }
        self.engine_for("sync_replica")?.flush()?;
        up.sync_until(until)
    }

    /// What the store's replica is doing (feature "replica"); `None`
    /// without one.
    ///
    /// # Examples
    /// See [`Replica`](crate::replica::Replica).
    #[cfg(feature = "replica")]
    #[cfg_attr(docsrs, doc(cfg(feature = "replica")))]
    pub fn replica_status(&self) -> Option<crate::replica::ReplicaStatus> {
        self.replica.as_ref().map(|u| u.status())
    }

    /// How long each shipped segment's oldest commit waited, for the lag
    /// measurement (`benches/replica.rs`). Not part of the API.
    #[cfg(feature = "replica")]
    #[doc(hidden)]
    pub fn replica_lag_samples(&self) -> Vec<Duration> {
        self.replica
            .as_ref()
            .map(|u| u.lag_samples())
            .unwrap_or_default()
    }

    /// The longest outcome (or failure payload) this store records.
    pub(crate) fn max_outcome_len(&self) -> usize {
        match &self.backend {
            Backend::Engine(engine) => engine.config().max_outcome,
            Backend::Shared(b) => b.max_outcome_len(),
        }
    }

    /// The metrics bridge.
    #[cfg(feature = "metrics")]
    pub(crate) fn metrics(&self) -> Option<&crate::metrics::Bridge> {
        self.metrics.as_deref()
    }

    /// Counts a batch call (in `Stats`, and the metrics bridge's histogram).
    pub(crate) fn count_batch(&self, call: &'static str, items: usize) {
        if let Backend::Engine(engine) = &self.backend {
            engine.count_batch(items);
        }
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.batch(call, items);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = call;
    }

    /// What the store runs over (the engine or a shared backend), for the
    /// face's other rooms.
    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The engine, for `call`, which only the engine offers; over a shared
    /// backend [`Error::Unsupported`].
    pub(crate) fn engine_for(&self, call: &'static str) -> Result<&Arc<Engine>> {
        match &self.backend {
            Backend::Engine(engine) => Ok(engine),
            Backend::Shared(b) => Err(crate::Error::Unsupported {
                call,
                backend: b.backend_name(),
            }),
        }
    }

    /// Opens the store at `path` with default settings, creating it if it
    /// does not exist.
    ///
    /// # Errors
    /// See [`StoreBuilder::open`].
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::open(dir.path().join("dedup.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        StoreBuilder::default().open(path)
    }

    /// Opens the store at `path` with default settings; unlike
    /// [`open`](Self::open), a missing file is an error, never a new store.
    ///
    /// # Errors
    /// See [`StoreBuilder::open_existing`].
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("dedup.redb");
    /// # drop(dedupkv::Store::open(&path)?);
    /// let store = dedupkv::Store::open_existing(&path)?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Store> {
        StoreBuilder::default().open_existing(path)
    }

    /// Opens the store at `path` read-only, with default settings: it
    /// answers every read, and never writes to the file. See
    /// [`StoreBuilder::open_read_only`] for what it promises, and what it
    /// gives while another process writes the file.
    ///
    /// # Errors
    /// See [`StoreBuilder::open_read_only`].
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Error, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("dedup.redb");
    /// # Store::open(&path)?.insert_if_absent(&Key::new("shop-42", "evt_1"))?;
    /// let store = Store::open_read_only(&path)?;
    /// assert!(store.get(&Key::new("shop-42", "evt_1"))?.is_some());
    /// assert!(matches!(
    ///     store.insert_if_absent(&Key::new("shop-42", "evt_2")),
    ///     Err(Error::ReadOnly { .. })
    /// ));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Store> {
        StoreBuilder::default().open_read_only(path)
    }

    /// A builder for a store with non-default settings.
    ///
    /// # Examples
    /// See [`StoreBuilder`].
    pub fn builder() -> StoreBuilder {
        StoreBuilder::default()
    }

    /// Records `key` if it is not already recorded; `true` means it is new
    /// and the caller should handle the event, `false` that it was seen.
    ///
    /// The check and the record are one step under the key's shard lock.
    /// Under [`Durability::Immediate`] the call returns after the record is
    /// durable.
    ///
    /// # Concurrent calls on the same key
    /// Exactly one caller gets `true`; the others get `false` once the
    /// winner's record is durable.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty scope or id,
    /// [`Error::InvalidInput`] for a key over the limits,
    /// [`Error::Poisoned`] after a failed commit, [`Error::Storage`].
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "evt_1");
    /// if store.insert_if_absent(&key)? {
    ///     // first delivery: handle the event
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn insert_if_absent(&self, key: &Key<'_>) -> Result<bool> {
        self.tell(Write::insert(self, key, None)?)
    }

    /// [`insert_if_absent`](Self::insert_if_absent) with this key's own
    /// retention instead of the store's. A key's retention can grow this
    /// way but never end earlier than its previous record's.
    ///
    /// # Errors
    /// As `insert_if_absent`, and [`Error::InvalidConfig`] for a retention
    /// longer than 2^22 buckets.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, Store};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// // This source retries for a week.
    /// store.insert_if_absent_for(&Key::new("slow-partner", "evt-9"), Duration::from_secs(7 * 86_400))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn insert_if_absent_for(&self, key: &Key<'_>, retention: Duration) -> Result<bool> {
        self.tell(Write::insert(self, key, Some(retention))?)
    }

    /// Records many keys in one durable commit; the flag at index `i` says
    /// whether `keys[i]` was new. A key repeated within `keys` is new at its
    /// first position only.
    ///
    /// Every key is validated before any is recorded.
    ///
    /// # Errors
    /// As [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let keys = [Key::new("t", "a"), Key::new("t", "b"), Key::new("t", "a")];
    /// assert_eq!(store.insert_batch(&keys)?, vec![true, true, false]);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Vec<bool>> {
        self.tell(Write::insert_batch(self, keys)?)
    }

    /// The latest record of `key`, or `None` if it is not recorded (or has
    /// expired). Reads the log row the index points at.
    ///
    /// # Errors
    /// As [`insert_if_absent`](Self::insert_if_absent), and
    /// [`Error::Corrupt`] if the row fails its checksum.
    ///
    /// # Examples
    /// See [`Record`].
    pub fn get(&self, key: &Key<'_>) -> Result<Option<Record>> {
        self.tell(Read::get(self, key)?)
    }

    /// Forgets a key on purpose: a durable record that makes it absent, so
    /// the next `insert_if_absent` is new and the next `begin` starts a new
    /// operation (attempt 1, a new provider key). For an operator clearing
    /// a bad outcome, or a caller reprocessing on purpose.
    ///
    /// A claim in progress is never removed: a key claimed by a live
    /// attempt answers [`Forget::InProgress`] (fail or complete it first; a
    /// claim whose lease lapsed, or whose process is gone, can be
    /// forgotten). The forget record stays, for audit, for the store's
    /// retention: [`get`](Self::get) shows it as [`State::Forgotten`] with
    /// the attempts and fingerprint of what it replaced, and
    /// [`Stats::forgotten`] counts them.
    ///
    /// # Concurrent calls on the same key
    /// Decided under the key's shard lock like every write: a `begin`
    /// racing a `forget` either sees the old record or starts anew.
    ///
    /// # Errors
    /// As [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Begin, Fingerprint, Forget, Key, State, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "report-7");
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.complete(&c, b"a bad report")?;
    /// let Forget::Forgotten(old) = store.forget(&key)? else { unreachable!() };
    /// assert_eq!(old.outcome(), Some(&b"a bad report"[..]));
    /// assert_eq!(store.get(&key)?.map(|r| r.state()), Some(State::Forgotten));
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!(c.attempt(), 1); // a new operation
    /// # store.complete(&c, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn forget(&self, key: &Key<'_>) -> Result<Forget> {
        self.tell(Write::forget(self, key)?)
    }

    /// Commits everything acknowledged so far and waits for it (useful in
    /// [`Durability::Deferred`] mode before a planned shutdown; dropping the
    /// store does the same). Over a shared backend it returns at once:
    /// every answer was committed before it was told.
    ///
    /// # Errors
    /// [`Error::Poisoned`] if a commit failed.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Durability, Key, Store};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = Store::builder()
    ///     .durability(Durability::Deferred { max_delay: Duration::from_millis(50) })
    ///     .open(dir.path().join("s.redb"))?;
    /// store.insert_if_absent(&Key::new("t", "e"))?; // acknowledged, maybe not durable
    /// store.flush()?;                                 // now durable
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn flush(&self) -> Result<()> {
        match &self.backend {
            Backend::Engine(engine) => engine.flush(),
            // Every answer was waited for before it was told.
            Backend::Shared(_) => Ok(()),
        }
    }

    /// Evicts every expired time bucket now — from the index, then from
    /// disk (one `delete_table` per bucket, in one commit) — and, when a
    /// `max_keys` bound is exceeded, the oldest live buckets. The background
    /// evictor calls this on every tick; call it yourself when you drive
    /// time (a [`ManualClock`](crate::ManualClock)) or turned the background
    /// evictor off.
    ///
    /// Expired keys are never answered as present, evicted or not. It also
    /// wakes callers of [`begin_or_wait`](Self::begin_or_wait) whose
    /// awaited lease has lapsed by the store's time, so they take over.
    ///
    /// # Errors
    /// [`Error::Poisoned`] or [`Error::Storage`] if the deletion commit fails.
    ///
    /// # Examples
    /// See [`Eviction`].
    pub fn evict_expired(&self) -> Result<Eviction> {
        let engine = self.engine_for("evict_expired")?;
        let evicted = engine.evict();
        // Time moved: callers waiting on a lapsed lease take over now.
        engine.wake_lapsed();
        evicted
    }

    /// Compacts the store file now, giving the space freed by eviction back
    /// to the file system. Commits wait while it runs (it needs the file to
    /// itself), so prefer a quiet moment; the background evictor does it by
    /// itself when more than the `compact_when_free` fraction of a file of
    /// at least 64 MiB is free. Returns whether anything was compacted.
    ///
    /// # Errors
    /// [`Error::Poisoned`], [`Error::Storage`].
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// store.compact()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn compact(&self) -> Result<bool> {
        self.engine_for("compact")?.compact()
    }

    /// Counters and sizes (all zero over a shared backend: it keeps its
    /// own).
    ///
    /// # Examples
    /// See [`Stats`].
    pub fn stats(&self) -> Stats {
        match &self.backend {
            Backend::Engine(engine) => engine.stats(),
            Backend::Shared(_) => Stats::default(),
        }
    }
}
