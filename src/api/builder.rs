//! Opening a store with settings.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::Error;
use crate::clock::{Clock, SystemClock, millis};
use crate::contract::SharedBackend;
use crate::engine::{Config, Location};
use crate::{Durability, Key, KeyHashing, Result, Store};

/// Settings for [`Store`], made by [`Store::builder`].
///
/// # Examples
/// ```
/// use dedupkv::{Durability, Store};
/// use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::builder()
///     .shards(128)
///     .lease(Duration::from_secs(60))
///     .retention(Duration::from_secs(48 * 3600))
///     .durability(Durability::Immediate)
///     .open(dir.path().join("s.redb"))?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[must_use]
pub struct StoreBuilder {
    cfg: Config,
    clock: Arc<dyn Clock>,
    /// A clock was set (refused by `open_shared`).
    clock_set: bool,
    #[cfg(feature = "replica")]
    replica: Option<crate::replica::Replica>,
    #[cfg(feature = "admin")]
    admin: Option<crate::admin::AdminOptions>,
}

impl Default for StoreBuilder {
    fn default() -> Self {
        Self {
            cfg: Config::default(),
            clock: Arc::new(SystemClock),
            clock_set: false,
            #[cfg(feature = "replica")]
            replica: None,
            #[cfg(feature = "admin")]
            admin: None,
        }
    }
}

impl StoreBuilder {
    /// Number of index shards, a power of two from 1 to 65,536.
    /// Default: 64.
    ///
    /// # Errors
    /// `open` fails with [`Error::InvalidConfig`] for other values.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().shards(16).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn shards(mut self, n: usize) -> Self {
        self.cfg.shards = n;
        self
    }

    /// When writes are acknowledged. Default: [`Durability::Immediate`].
    ///
    /// # Examples
    /// See [`Durability`].
    pub fn durability(mut self, d: Durability) -> Self {
        self.cfg.durability = d;
        self
    }

    /// How long a claim is held before another `begin` may take it over.
    /// Default: 30 s. Must be at least 1 ms and at most the retention.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder()
    ///     .lease(std::time::Duration::from_secs(5))
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn lease(mut self, d: Duration) -> Self {
        self.cfg.lease_ms = millis(d);
        self
    }

    /// How long a key is remembered after its latest record (insertion,
    /// claim or completion). Default: 24 hours. Keys are kept at least this
    /// long, rounded up to the end of a time bucket; an event that arrives
    /// after its key expired is new again.
    ///
    /// # Errors
    /// `open` fails if retention is shorter than the lease or longer than
    /// 2^22 bucket granularities.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder()
    ///     .retention(std::time::Duration::from_secs(7 * 24 * 3600))
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn retention(mut self, d: Duration) -> Self {
        self.cfg.retention_ms = millis(d);
        self
    }

    /// Width of a retention time bucket; keys expire a bucket at a time.
    /// Default: 60 s; at least 1 s. Fixed when the file is created:
    /// reopening with a different value is an error. (The index keeps 24
    /// bits of a key's bucket, so eviction — background or
    /// [`Store::evict_expired`] — must run at least once every 2^22 buckets:
    /// 48 days at 1 s, 8 years at 60 s.)
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder()
    ///     .bucket_granularity(std::time::Duration::from_secs(10))
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn bucket_granularity(mut self, d: Duration) -> Self {
        self.cfg.granularity_ms = millis(d);
        self.cfg.granularity_set = true;
        self
    }

    /// redb's page cache size. Default: 64 MiB (redb's own default is 1 GiB;
    /// the index, not the cache, answers lookups here).
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().cache_size(16 << 20).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cfg.cache_bytes = bytes;
        self
    }

    /// redb quick repair: one more sync per commit, in exchange for a reopen
    /// after a crash without redb's full file check. Default: off (it made
    /// no measurable difference to reopen time; see `docs/performance.md`).
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().quick_repair(true).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn quick_repair(mut self, on: bool) -> Self {
        self.cfg.quick_repair = on;
        self
    }

    /// The key-hash function for a new file. Default:
    /// [`KeyHashing::SipHash13`]. Fixed at creation: reopening with a
    /// different explicit choice is an error.
    ///
    /// # Examples
    /// See [`KeyHashing`].
    pub fn key_hashing(mut self, k: KeyHashing) -> Self {
        self.cfg.key_hashing = k;
        self.cfg.hashing_set = true;
        self
    }

    /// The time source. Default: [`SystemClock`].
    ///
    /// # Examples
    /// See [`ManualClock`](crate::ManualClock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self.clock_set = true;
        self
    }

    /// What the store's time does while the clock reads behind it.
    /// Default: [`ClockBehind::StandStill`](crate::ClockBehind::StandStill).
    ///
    /// The store's time never goes backwards, and it is inherited: the
    /// file keeps the latest time the store used, and a replica's new owner
    /// continues from its predecessor's records. A store whose earlier
    /// owner's clock ran a year ahead would stand still for a year (no lease
    /// lapses, no key expires). With [`ClockBehind::Advance`](crate::ClockBehind::Advance) its time runs
    /// on from there at the rate of [`Clock::elapsed_millis`] (a monotonic
    /// clock), so leases lapse and keys expire after the time that really
    /// passed; the times it records stay ahead of the wall clock by the gap.
    /// A lease never lapses sooner than its length in real time in either
    /// mode. Set it on every owner of a replicated store whose owners' clocks
    /// may disagree.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{ClockBehind, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = Store::builder()
    ///     .clock_behind(ClockBehind::Advance)
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn clock_behind(mut self, mode: crate::ClockBehind) -> Self {
        self.cfg.clock_behind = mode;
        self
    }

    /// Longest scope in bytes. Default: 256; at most 65,535.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().max_scope_len(64).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn max_scope_len(mut self, n: usize) -> Self {
        self.cfg.max_scope = n;
        self
    }

    /// Longest id in bytes. Default: 1,024; at most 65,535.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().max_id_len(128).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn max_id_len(mut self, n: usize) -> Self {
        self.cfg.max_id = n;
        self
    }

    /// Largest outcome (or failure payload) in bytes. Default: 1 MiB; at
    /// most 64 MiB.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().max_outcome_len(4096).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn max_outcome_len(mut self, n: usize) -> Self {
        self.cfg.max_outcome = n;
        self
    }

    /// Keys to make room for up front, spread over the shards, so the index
    /// does not grow while it fills. Default: 0.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().expected_keys(100_000).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn expected_keys(mut self, n: usize) -> Self {
        self.cfg.expected_keys = n;
        self
    }
    /// Whether a background thread evicts expired buckets (waking every
    /// granularity, at most every second). Default: on. Off, call
    /// [`Store::evict_expired`] yourself.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().background_eviction(false).open(dir.path().join("s.redb"))?;
    /// s.evict_expired()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn background_eviction(mut self, on: bool) -> Self {
        self.cfg.background_eviction = on;
        self
    }

    /// A bound on the keys kept. Over it, eviction drops the oldest live
    /// buckets early, which shrinks the dedup window; that is surfaced in
    /// [`Stats::early_evicted_buckets`](crate::Stats::early_evicted_buckets),
    /// [`Stats::effective_window`](crate::Stats::effective_window) and a
    /// `tracing` warning. Enforced at each eviction pass. Dead letters do
    /// not count: they are kept until worked whatever the bound, so they
    /// never make eviction drop live buckets early. Default: none.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().max_keys(50_000_000).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn max_keys(mut self, n: u64) -> Self {
        self.cfg.max_keys = Some(n);
        self
    }

    /// The upstream's longest retry window (how late a redelivery can
    /// come). Opening fails if the retention is shorter: a redelivery after
    /// the retention would be handled twice. Default: not checked.
    ///
    /// # Errors
    /// `open` fails with [`Error::InvalidConfig`] when retention < window.
    ///
    /// # Examples
    /// ```
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let err = dedupkv::Store::builder()
    ///     .retention(Duration::from_secs(3600))
    ///     .max_retry_window(Duration::from_secs(3 * 86_400)) // the broker retries for 3 days
    ///     .open(dir.path().join("s.redb"))
    ///     .unwrap_err();
    /// assert!(matches!(err, dedupkv::Error::InvalidConfig(_)));
    /// ```
    pub fn max_retry_window(mut self, window: Duration) -> Self {
        self.cfg.max_retry_window_ms = Some(millis(window));
        self
    }

    /// How long an entity's version and sequencer state is kept after its
    /// latest change, separately from event keys. Default: 7 days. After it,
    /// the entity starts afresh (see [`Store::advance`] and
    /// [`Store::sequence`]). Entities with parked, held or unacknowledged
    /// events are kept, however long the store is closed.
    ///
    /// # Errors
    /// `open` fails with [`Error::InvalidConfig`] for 0 (every entity
    /// would be forgotten as it is written), or for one spanning 2^22
    /// buckets or more.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder()
    ///     .entity_retention(std::time::Duration::from_secs(30 * 86_400))
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn entity_retention(mut self, d: Duration) -> Self {
        self.cfg.entity_retention_ms = millis(d);
        self
    }

    /// How long the sequencer waits for a missing predecessor before it
    /// moves the parked successors to the holding area. Default: 5 minutes.
    /// The move happens on the entity's next event, on
    /// [`Store::sweep_parked`], or on the background evictor's sweep, which
    /// runs every quarter of `max_hold` (at least every second).
    ///
    /// # Examples
    /// See [`Held`](crate::Held).
    pub fn max_hold(mut self, d: Duration) -> Self {
        self.cfg.max_hold_ms = millis(d);
        self
    }

    /// How long what the sequencer hands back ([`Store::sequence`],
    /// [`Store::release_held`]) is held for its handler: until it is
    /// acknowledged or this lease lapses, a redelivery of those events
    /// answers [`Sequenced::Handling`](crate::Sequenced::Handling) instead
    /// of handing them to a second consumer. Default: 30 s; at least 1 ms.
    /// [`Store::sequence_with`] sets it per call. Leases live in memory: a
    /// restarted store hands every unacknowledged event back at once.
    ///
    /// # Errors
    /// `open` fails with [`Error::InvalidConfig`] for 0.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder()
    ///     .handback_lease(std::time::Duration::from_secs(120))
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn handback_lease(mut self, d: Duration) -> Self {
        self.cfg.handback_lease_ms = millis(d);
        self
    }

    /// The background evictor compacts the file when more than this fraction
    /// of it is free (and it is at least 64 MiB); `None` never compacts by
    /// itself ([`Store::compact`] still does). Default: `Some(0.5)`. Space
    /// freed by eviction is reused by later commits either way, so under
    /// steady churn the file stops growing; compaction gives it back after
    /// the store shrinks.
    ///
    /// # Errors
    /// `open` fails with [`Error::InvalidConfig`] outside `0.0..1.0`.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().compact_when_free(Some(0.3)).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn compact_when_free(mut self, fraction: Option<f64>) -> Self {
        self.cfg.compact_when_free = fraction;
        self
    }

    /// The length of a reconciliation window: completed operations are
    /// counted (and their amounts summed) per scope per window, durably,
    /// for [`Store::reconcile`]. Default: 1 hour. `open` fails with
    /// [`Error::InvalidConfig`] for 0 or a window longer than the
    /// reconciliation retention.
    ///
    /// # Examples
    /// ```
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::builder()
    ///     .reconcile_window(Duration::from_secs(15 * 60))
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn reconcile_window(mut self, window: Duration) -> Self {
        self.cfg.tally_window_ms = millis(window);
        self
    }

    /// How long a reconciliation window's totals (and kept keys) are kept
    /// after the window ends. Default: 7 days. `open` fails with
    /// [`Error::InvalidConfig`] for one spanning 2^22 buckets or more.
    ///
    /// # Examples
    /// ```
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::builder()
    ///     .reconcile_retention(Duration::from_secs(30 * 86_400))
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn reconcile_retention(mut self, retention: Duration) -> Self {
        self.cfg.tally_retention_ms = millis(retention);
        self
    }

    /// Keeps the keys of the operations completed in `scope`, per
    /// reconciliation window, for [`Store::reconcile_keys`]: which
    /// operation a count is missing, or which one is extra. Call once per
    /// scope. Default: no scope keeps keys.
    ///
    /// Cost, per completed operation, until `reconcile_retention` after
    /// its window's end: 32 bytes of memory plus its id (a `Vec` may hold
    /// up to twice what it uses while it grows), nothing more on the
    /// completion's commit, and some 20 bytes plus its id in a `Keys`
    /// record once its `Complete` record leaves the log (eviction writes
    /// the keys again before it deletes them). Memory is bounded by the
    /// completions of one retention and stays flat under steady traffic.
    /// Keys are kept from the open that names the scope on: a window that
    /// began before it holds only the keys whose records were still in
    /// the log.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::builder()
    ///     .reconcile_keys_of("shipments")
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn reconcile_keys_of(mut self, scope: impl AsRef<[u8]>) -> Self {
        let scope = scope.as_ref().to_vec();
        if !self.cfg.tally_keys.contains(&scope) {
            self.cfg.tally_keys.push(scope);
        }
        self
    }

    /// The most log one batch call (`insert_batch`, `begin_batch`,
    /// `complete_batch`) may write, in bytes, counted as its keys and
    /// outcomes plus 32 bytes per key. A larger call fails with
    /// [`Error::InvalidInput`] (`what: "batch"`) before anything is
    /// recorded, and every other caller goes on; split it. It bounds the
    /// memory one call holds until its commit. Default: 256 MiB (about
    /// 3 million 64-byte keys).
    ///
    /// # Errors
    /// `open` fails with [`Error::InvalidConfig`] for 0.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Error, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = Store::builder().max_batch_bytes(1 << 10).open(dir.path().join("s.redb"))?;
    /// let ids: Vec<String> = (0..100).map(|i| format!("evt-{i}")).collect();
    /// let keys: Vec<Key<'_>> = ids.iter().map(|id| Key::new("t", id)).collect();
    /// assert!(matches!(store.insert_batch(&keys), Err(Error::InvalidInput { what: "batch", .. })));
    /// assert_eq!(store.insert_batch(&keys[..10])?, vec![true; 10]);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn max_batch_bytes(mut self, bytes: usize) -> Self {
        self.cfg.max_batch_bytes = bytes;
        self
    }

    /// The journal in front of the store file: a preallocated segment of
    /// `bytes` beside it (its name with `.journal` added; the length is
    /// fixed when the segment is made, a later open keeps it), so a durable
    /// commit is one sequential write and one `fdatasync` there; the
    /// commits are moved into the store file by a background checkpoint
    /// as the segment fills (a writer waits only when it is full), before
    /// a scan, and at close. Their records stay in memory until then: the
    /// journal holds at most `bytes` of them. See docs/design.md, "The
    /// journal".
    ///
    /// Default: on, 16 MiB, for a store this open creates at a path and
    /// for a store that has a journal. A store kept without one (made by
    /// an earlier build, or opened with `journal(None)`) stays without
    /// until opened with `journal(Some(..))` or
    /// [`upgrade(true)`](Self::upgrade): a build without the journal
    /// refuses a store that has one, so it is not added behind an
    /// operator's back. A store on a [`PageBackend`](crate::PageBackend)
    /// has none. `None` turns it off: an open without it moves a journal
    /// it finds into the file and removes it (the way back to a build
    /// without the journal).
    ///
    /// # Errors
    /// `open` fails with [`Error::InvalidConfig`] for fewer than 8 KiB or
    /// more than 4 GiB, or for `Some` on
    /// [`open_with_backend`](Self::open_with_backend); with
    /// [`Error::Corrupt`] naming the journal when it is damaged, or
    /// missing from a store kept with one.
    ///
    /// # Examples
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("s.redb");
    /// let s = dedupkv::Store::open(&path)?;
    /// assert!(s.insert_if_absent(&dedupkv::Key::new("orders", "o-1"))?);
    /// assert!(dir.path().join("s.redb.journal").exists());
    /// drop(s);
    /// // Off: the journal is settled into the store file and removed.
    /// let s = dedupkv::Store::builder().journal(None).open(&path)?;
    /// assert!(!dir.path().join("s.redb.journal").exists());
    /// assert!(!s.insert_if_absent(&dedupkv::Key::new("orders", "o-1"))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn journal(mut self, bytes: Option<u64>) -> Self {
        self.cfg.journal = bytes.map(|bytes| crate::engine::JournalSetting {
            bytes,
            backend: self.cfg.journal.take().and_then(|j| j.backend),
            asked: true,
        });
        self
    }

    /// Opens a store on `store`'s pages with its journal on `journal`'s
    /// (fault and crash tests of the journal). Not part of the API.
    ///
    /// # Errors
    /// As [`open_with_backend`](Self::open_with_backend) and
    /// [`journal`](Self::journal).
    ///
    /// # Examples
    /// See `tests/journal.rs`.
    #[doc(hidden)]
    pub fn open_with_backends(
        mut self,
        store: impl crate::PageBackend,
        journal: impl crate::PageBackend,
    ) -> Result<Store> {
        let bytes = self
            .cfg
            .journal
            .as_ref()
            .map_or(crate::engine::JOURNAL_BYTES, |j| j.bytes);
        self.cfg.journal = Some(crate::engine::JournalSetting {
            bytes,
            backend: Some(Arc::new(journal)),
            asked: true,
        });
        self.open_with_backend(store)
    }

    /// Where the log closes a row and starts the next, in bytes (at most,
    /// and by default, 256 MiB). Not part of the API: tests lower it to
    /// drive commits of several rows.
    #[doc(hidden)]
    pub fn row_split_bytes(mut self, bytes: usize) -> Self {
        self.cfg.row_split_bytes = bytes;
        self
    }

    /// The most log one eviction commit deletes, in bytes. A bucket's table
    /// is deleted a slice of rows per commit, oldest first, each slice
    /// about this size, before the table itself is dropped: redb frees a
    /// dropped table's pages inside one commit, and writers wait for that
    /// commit, so a large bucket dropped whole stalls every writer.
    /// Smaller slices mean shorter stalls and more commits. Default: 1 MiB.
    ///
    /// # Errors
    /// `open` fails with [`Error::InvalidConfig`] for 0.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let s = dedupkv::Store::builder().evict_slice_bytes(256 << 10).open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn evict_slice_bytes(mut self, bytes: usize) -> Self {
        self.cfg.evict_slice_bytes = bytes;
        self
    }

    /// Upgrade a file written by an older build to this build's store
    /// format, in the open's first commit. Off, a file of an older format
    /// (3 or 4) is opened and written as it is, so the build it came from
    /// can still open it (a deploy can be rolled back), and what needs a
    /// newer format is unavailable: the open cannot check its bucket
    /// tables against their summaries, [`Store::verify`] answers
    /// [`Error::NeedsUpgrade`], and a format-3 file gets format 3's
    /// records (no provider answers but accepted or found ones, no kept
    /// keys). On, the file is rewritten as the newest format (5): every
    /// bucket table gets its summary, and builds that read only older
    /// formats refuse the file (`UnsupportedVersion`) from then on. A new file is always created in the newest format; files
    /// of formats 1 and 2 (which no release wrote) are rewritten as format
    /// 3 by their first commit either way. [`Store::upgrade`] does the
    /// same on an open store. On also puts the default
    /// [`journal`](Self::journal) in front of a store kept without one
    /// (unless `journal(None)`); [`Store::upgrade`] does not (the journal
    /// is chosen at open). Default: false.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("s.redb");
    /// let store = dedupkv::Store::builder().upgrade(true).open(&path)?;
    /// assert_eq!(store.format(), 5);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn upgrade(mut self, on: bool) -> Self {
        self.cfg.upgrade = on;
        self
    }

    /// Check every page of the file when it is opened: redb verifies the
    /// checksum of every page of the committed trees (each branch page
    /// holds its children's checksums) and rebuilds its allocator state
    /// from them, where otherwise it trusts a file that was closed cleanly
    /// as it finds it. A damaged byte anywhere in a page the store relies
    /// on then fails the open as [`Error::Corrupt`]. Off, the open reads
    /// only what replay needs: rows missing from a bucket table are still
    /// caught (by the bucket summaries, format 5), but a damaged byte in
    /// redb's own allocator state can make the first commit write over a
    /// live page, and some damaged pages make redb panic, or abort the
    /// process, instead of failing. The check reads the whole file once
    /// more (replay reads most of it anyway; docs/performance.md has
    /// figures). Default: true.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// // A large file, reopened often, on a medium trusted not to flip bits.
    /// let store = dedupkv::Store::builder()
    ///     .verify_pages_on_open(false)
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn verify_pages_on_open(mut self, on: bool) -> Self {
        self.cfg.verify_pages = on;
        self
    }

    /// The value of the `store` label on every series this store
    /// publishes through the `metrics` facade (feature `metrics`): name
    /// each store of a process apart. Default: `"default"`; the store of
    /// partition `P` of a [`PartitionSet`](crate::partitions::PartitionSet)
    /// whose builder names no label publishes as `"partition-P"`.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::builder()
    ///     .metrics_label("orders")
    ///     .open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(mut self, label: impl Into<String>) -> Self {
        self.cfg.metrics_label = label.into();
        self
    }

    /// A partition set's store of `partition` publishes as
    /// `partition-P` unless its builder named a label of its own, so the
    /// set's stores do not overwrite each other's gauges.
    #[cfg(all(feature = "metrics", feature = "replica"))]
    pub(crate) fn label_partition(mut self, partition: i32) -> Self {
        if self.cfg.metrics_label == crate::engine::DEFAULT_METRICS_LABEL {
            self.cfg.metrics_label = format!("partition-{partition}");
        }
        self
    }

    /// Serves the store's live admin endpoint (feature "admin", Unix
    /// only): a Unix socket beside the file (`STORE.admin.sock`, see
    /// [`admin::socket_path`](crate::admin::socket_path)), mode 0600,
    /// answered by a thread of the store's until its last handle is
    /// dropped, when the socket is removed. The `dedupkv` command line
    /// reads there while this process holds the store; operator writes
    /// only with [`AdminOptions::allow_writes`](crate::admin::AdminOptions::allow_writes).
    /// Default: none (no thread, no socket). Only with `open` and
    /// `open_existing`.
    ///
    /// # Errors
    /// The open fails (and closes the store again) with
    /// [`Error::Io`] naming the directory when it is writable by group or
    /// others, naming the socket when a live endpoint answers there (a
    /// socket whose process is gone is replaced) or another kind of file
    /// is in the way; `open_read_only` and `open_with_backend` fail with
    /// [`Error::InvalidConfig`].
    ///
    /// # Examples
    /// ```
    /// use dedupkv::admin::AdminOptions;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("s.redb");
    /// let store = dedupkv::Store::builder().admin_socket(AdminOptions::new()).open(&path)?;
    /// assert!(dedupkv::admin::socket_path(&path).exists());
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[cfg(feature = "admin")]
    #[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
    pub fn admin_socket(mut self, options: crate::admin::AdminOptions) -> Self {
        self.admin = Some(options);
        self
    }

    /// Opens the store at `path`, creating it if it does not exist, and
    /// rebuilds the index from its log. (Use
    /// [`open_existing`](Self::open_existing) where a missing file must be
    /// an error.)
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for bad settings; [`Error::NotAStore`] for
    /// a file that is not a dedupkv store (an empty file included);
    /// [`Error::UnsupportedVersion`]; [`Error::Corrupt`] for a damaged
    /// store (its message names the path and the damage);
    /// [`Error::AlreadyOpen`]; [`Error::Storage`] when the file cannot be
    /// read or the open's first commit cannot be written (a full disk),
    /// naming the path.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::builder().open(dir.path().join("s.redb"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn open(self, path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        self.open_at(Location::Path(path.clone()), &path)
    }

    /// Opens the store at `path`, which must already hold one: unlike
    /// [`open`](Self::open) it never creates a file, so a mistyped path or a
    /// missing volume cannot start a service with an empty dedup window.
    ///
    /// # Errors
    /// As [`open`](Self::open); a missing file is [`Error::Storage`] with
    /// an I/O error of kind [`NotFound`](std::io::ErrorKind::NotFound)
    /// naming the path.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("s.redb");
    /// assert!(dedupkv::Store::builder().open_existing(&path).is_err()); // nothing there yet
    /// drop(dedupkv::Store::builder().open(&path)?);
    /// let store = dedupkv::Store::builder().open_existing(&path)?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn open_existing(self, path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        self.open_at(Location::Existing(path.clone()), &path)
    }

    /// `open` and `open_existing`: the engine, then the admin endpoint if
    /// any (a store whose endpoint cannot start is closed again).
    fn open_at(self, location: Location, path: &Path) -> Result<Store> {
        self.validate()?;
        #[cfg(feature = "admin")]
        let admin = self.admin.clone();
        let store = self.open_engine(location, path)?;
        #[cfg(feature = "admin")]
        if let Some(opts) = admin {
            return store.with_admin(path, &opts);
        }
        Ok(store)
    }

    /// The replica's take-over if any, then the engine.
    #[cfg_attr(not(feature = "replica"), allow(unused_variables))]
    fn open_engine(self, location: Location, path: &Path) -> Result<Store> {
        #[cfg(feature = "replica")]
        if self.replica.is_some() {
            return self.open_replicated(location, path);
        }
        Store::open_with(self.cfg, self.clock, location)
    }

    /// Opens a store over a shared backend instead of a file: the same
    /// [`Store`] (and [`AsyncStore`](crate::AsyncStore)), its calls
    /// answered by `backend` — the `PostgreSQL` backend `dedupkv_postgres::PgStore`,
    /// which every instance of a service shares, so a retried request on
    /// any instance meets the first one's record.
    ///
    /// The contract's calls (`insert_if_absent`, `begin`, `complete` and
    /// `complete_for`, `fail`, `renew`, `forget`, `get`, batches, versions
    /// and the sequencer, `requeue`/`resolve`, intents' answers, `tallies`,
    /// `reconcile` and `reconcile_keys`, the listings `dead_letters`,
    /// `intent`, `pending_intents` and `duplicate_candidates`) and what is
    /// built on them (the retry runners
    /// `run`/`call`, `begin_or_wait` through the backend's own wait,
    /// `AsyncStore`) work as on the engine. Calls that read or manage the
    /// engine itself (`records`, `stranded_claims`, `holding_area`, `held`,
    /// `unacked`, `sweep_parked`, `history`, `upgrade`, `verify`, `compact`, `evict_expired`, typed outcomes: `complete_value` and
    /// `run_value`, which refuses before its work runs) answer
    /// [`Error::Unsupported`] naming the call:
    /// keep a clone of the backend for its own. `stats` is all zeros,
    /// `format` 0, `flush` returns at once (every answer was committed
    /// before it was told); there is no replica (`sync_replica` answers
    /// [`Error::InvalidConfig`]) and no metrics. A claim is finished only
    /// by a store of the backend that made it (else `InvalidArgument`; in
    /// `complete_batch`, for the whole call).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when this builder has any setting (they
    /// are the embedded engine's: set the backend's own, e.g. lease and
    /// retention on `PgStoreBuilder`).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Begin, Fingerprint, Key, Store};
    ///
    /// // With `dedupkv-postgres`:
    /// // let pg = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
    /// // let store = Store::builder().open_shared(pg)?;
    /// fn charge(store: &Store, order: &str) -> dedupkv::Result<()> {
    ///     let key = Key::new("shop-42", order);
    ///     if let Begin::Started(claim) = store.begin(&key, Fingerprint::of("100 EUR"))? {
    ///         // call the provider with `claim.provider_key()?`, then:
    ///         store.complete(&claim, b"ch_1")?;
    ///     }
    ///     Ok(())
    /// }
    /// # let dir = tempfile::tempdir().unwrap();
    /// # charge(&Store::open(dir.path().join("s.redb"))?, "o-1")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn open_shared(self, backend: impl SharedBackend) -> Result<Store> {
        // Debug compares every setting, including ones without `PartialEq`.
        let changed =
            format!("{:?}", self.cfg) != format!("{:?}", Config::default()) || self.clock_set;
        #[cfg(feature = "replica")]
        let changed = changed || self.replica.is_some();
        #[cfg(feature = "admin")]
        let changed = changed || self.admin.is_some();
        if changed {
            return Err(Error::InvalidConfig(format!(
                "open_shared: this builder's settings are the embedded engine's and do not apply \
                 to the shared backend {}; set the backend's own (lease, retention, clock) and \
                 open with `Store::builder().open_shared(backend)`",
                backend.backend_name()
            )));
        }
        Ok(Store::shared(backend))
    }

    /// Opens the store at `path` read-only: it answers every read —
    /// [`get`](Store::get), the listings ([`dead_letters`](Store::dead_letters),
    /// [`stranded_claims`](Store::stranded_claims),
    /// [`holding_area`](Store::holding_area),
    /// [`pending_intents`](Store::pending_intents),
    /// [`duplicate_candidates`](Store::duplicate_candidates)),
    /// [`intent`](Store::intent), [`held`](Store::held),
    /// [`unacked`](Store::unacked), [`stats`](Store::stats),
    /// [`tallies`](Store::tallies), [`reconcile`](Store::reconcile),
    /// [`reconcile_keys`](Store::reconcile_keys), [`format`](Store::format),
    /// [`verify`](Store::verify) — and every call that writes (the
    /// upgrade, compaction and eviction included) fails with
    /// [`Error::ReadOnly`] naming the path, recording nothing.
    ///
    /// What it promises:
    /// - the file is opened for reading only: not a byte of it changes,
    ///   nor its modification time, and no file is created (no lock file,
    ///   no sidecar; a missing file is an error);
    /// - it takes no lock: a process that has the store open for writing
    ///   goes on undisturbed, and a writer can open the store while this
    ///   handle is open;
    /// - it answers what a writable open at the same moment would: a file
    ///   that needs recovery (a crash left it, or a live writer holds it)
    ///   is recovered in memory, and what the open's first commit writes
    ///   (what outlives expiry — dead letters, unanswered intents, entities
    ///   with events, kept reconciliation windows — carried out of expired
    ///   tables, which are then deleted) is made in memory too;
    /// - a file of an older format is read as it is, never upgraded
    ///   ([`Store::format`] answers its format; the formats 1 and 2, which
    ///   no release wrote, read as 3, as a writable open makes them);
    /// - no background thread: nothing is evicted or compacted, while
    ///   expiry still follows the store's time. Eviction must run once
    ///   every 2^22 buckets (see
    ///   [`bucket_granularity`](Self::bucket_granularity)): a handle kept
    ///   open longer than 2^21 buckets answers `ReadOnly`; reopen it.
    ///
    /// Of the settings, those that say how to read apply (the clock, the
    /// cache size, [`verify_pages_on_open`](Self::verify_pages_on_open),
    /// shards, key limits, the reconciliation settings, and the checks of
    /// [`key_hashing`](Self::key_hashing) and
    /// [`bucket_granularity`](Self::bucket_granularity) against the file);
    /// those that say how to write are ignored.
    ///
    /// **A file another process is writing**: the handle is a snapshot of
    /// the file as of the open (later commits are not seen; reopen to see
    /// them). The file is read while that process changes it, and no lock
    /// keeps its pages in place: if its commits race the open, the open may
    /// fail with [`Error::Corrupt`] naming the path, and later reads may
    /// fail the same way once its commits reuse pages the snapshot reads.
    /// The file is not damaged: retry, or ask that process's live admin
    /// endpoint (feature "admin", `StoreBuilder::admin_socket`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] with a replica or
    /// [`upgrade(true)`](Self::upgrade) (a read-only open never writes)
    /// or for bad settings; [`Error::Storage`] with an I/O error naming
    /// the path for a missing or unreadable file; [`Error::NotAStore`]
    /// naming the path for a directory or an empty file, and for a file
    /// that is not a dedupkv store; [`Error::UnsupportedVersion`];
    /// [`Error::Corrupt`] naming the path for a damaged store (or one
    /// changed under the open, above).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Error, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("s.redb");
    /// let writer = Store::open(&path)?;
    /// writer.insert_if_absent(&Key::new("orders", "4711"))?;
    /// // Beside the running writer, which it does not disturb.
    /// let reader = Store::builder().cache_size(8 << 20).open_read_only(&path)?;
    /// assert!(reader.get(&Key::new("orders", "4711"))?.is_some());
    /// let err = reader.insert_if_absent(&Key::new("orders", "4712")).unwrap_err();
    /// assert!(matches!(err, Error::ReadOnly { .. }));
    /// writer.insert_if_absent(&Key::new("orders", "4712"))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn open_read_only(self, path: impl AsRef<Path>) -> Result<Store> {
        self.validate()?;
        #[cfg(feature = "admin")]
        if self.admin.is_some() {
            return Err(Error::InvalidConfig(
                "a read-only open serves no admin endpoint (the process that holds the store writable does)".into(),
            ));
        }
        #[cfg(feature = "replica")]
        if self.replica.is_some() {
            return Err(Error::InvalidConfig(
                "a read-only open takes no replica (it would take the replica over); \
                 read a replica with ReplicaReader"
                    .into(),
            ));
        }
        if self.cfg.upgrade {
            return Err(Error::InvalidConfig(
                "a read-only open never upgrades the file; open it writable with upgrade(true)"
                    .into(),
            ));
        }
        Store::open_read_only_with(self.cfg, self.clock, path.as_ref())
    }

    /// [`open_read_only`](Self::open_read_only) for reads of one key: the
    /// open reads every table of the file, as the full open does, but
    /// loads only `key`'s records into the index, so it does not build an
    /// index of every other key (on 10M keys: under a second, where the
    /// full open takes seconds; docs/performance.md). `key` reads exactly
    /// as the full read-only open reads it — [`get`](Store::get),
    /// [`intent`](Store::intent), [`history`](Store::history), its dead
    /// letter — expired, forgotten and re-claimed records, and commits
    /// still in the journal, included. Every other key reads as absent,
    /// and listings and [`stats`](Store::stats) see `key` alone. It writes
    /// nothing, as the full read-only open.
    ///
    /// # Errors
    /// Those of [`open_read_only`](Self::open_read_only).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("s.redb");
    /// let writer = Store::open(&path)?;
    /// writer.insert_batch(&[Key::new("orders", "4711"), Key::new("orders", "4712")])?;
    /// let key = Key::new("orders", "4711");
    /// let reader = Store::builder().open_read_only_key(&path, &key)?;
    /// assert!(reader.get(&key)?.is_some());
    /// // Only that key was loaded.
    /// assert!(reader.get(&Key::new("orders", "4712"))?.is_none());
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn open_read_only_key(mut self, path: impl AsRef<Path>, key: &Key<'_>) -> Result<Store> {
        self.cfg.only_key = Some((key.scope().to_vec(), key.id().to_vec()));
        self.open_read_only(path)
    }

    /// Opens a store on pages the caller supplies (an in-memory file, or
    /// a fault-injecting one in tests) instead of a file at a path.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    ///
    /// # Examples
    /// See [`PageBackend`](crate::PageBackend) for an in-memory store.
    /// ```
    /// # #[derive(Debug, Default)]
    /// # struct Memory(std::sync::Mutex<Vec<u8>>);
    /// # impl dedupkv::PageBackend for Memory {
    /// #     fn len(&self) -> std::io::Result<u64> { Ok(self.0.lock().unwrap().len() as u64) }
    /// #     fn read(&self, at: u64, out: &mut [u8]) -> std::io::Result<()> {
    /// #         let b = self.0.lock().unwrap();
    /// #         out.copy_from_slice(b.get(at as usize..at as usize + out.len()).ok_or(std::io::ErrorKind::UnexpectedEof)?);
    /// #         Ok(())
    /// #     }
    /// #     fn set_len(&self, len: u64) -> std::io::Result<()> { self.0.lock().unwrap().resize(len as usize, 0); Ok(()) }
    /// #     fn sync_data(&self) -> std::io::Result<()> { Ok(()) }
    /// #     fn write(&self, at: u64, data: &[u8]) -> std::io::Result<()> {
    /// #         self.0.lock().unwrap()[at as usize..at as usize + data.len()].copy_from_slice(data);
    /// #         Ok(())
    /// #     }
    /// # }
    /// let store = dedupkv::Store::builder().open_with_backend(Memory::default())?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn open_with_backend(self, backend: impl crate::PageBackend) -> Result<Store> {
        self.validate()?;
        #[cfg(feature = "admin")]
        if self.admin.is_some() {
            return Err(Error::InvalidConfig(
                "a store on a page backend has no path to put an admin socket beside".into(),
            ));
        }
        #[cfg(feature = "replica")]
        if self.replica.is_some() {
            return Err(Error::InvalidConfig(
                "a replica needs a store opened by path (its state file lives beside it)".into(),
            ));
        }
        Store::open_with(self.cfg, self.clock, Location::Backend(Box::new(backend)))
    }

    /// Keeps a replica of the store in object storage (feature
    /// "replica"): opening takes ownership of it, restores the file from
    /// it first when the file is missing, older than the replica, or was
    /// left by an owner fenced since, and ships every commit to it.
    /// Default: none. Not with
    /// [`open_with_backend`](Self::open_with_backend).
    ///
    /// **The open takes the replica over**: it fences the current owner,
    /// wherever it runs, whose next write then fails with
    /// [`Error::Fenced`]. Never open with a replica just to look at it:
    /// [`ReplicaReader`](crate::replica::ReplicaReader) reads a replica
    /// (a summary, or a copy of the store in a new file) without writing
    /// to the object store.
    ///
    /// # Errors
    /// `open` fails with [`Error::InvalidConfig`] for a synchronous
    /// replica without [`Durability::Immediate`], with [`Error::Fenced`]
    /// when another owner took the replica at the same moment, with
    /// [`Error::Corrupt`] naming a replica object that is missing or
    /// damaged, and with [`Error::Replica`] when the object store fails.
    ///
    /// # Examples
    /// See [`Replica`](crate::replica::Replica).
    #[cfg(feature = "replica")]
    #[cfg_attr(docsrs, doc(cfg(feature = "replica")))]
    pub fn replica(mut self, replica: crate::replica::Replica) -> Self {
        self.replica = Some(replica);
        self
    }

    /// Opens with the replica: ownership, restore, then the engine.
    #[cfg(feature = "replica")]
    fn open_replicated(mut self, location: Location, path: &Path) -> Result<Store> {
        let Some(replica) = self.replica.take() else {
            return Err(Error::InvalidConfig("no replica".into()));
        };
        replica.validate(self.cfg.durability)?;
        let prepared = crate::replica::open::prepare(path, &replica, self.cfg.cache_bytes)?;
        self.cfg.ship = Some(prepared.ship);
        self.cfg.token_base = prepared.token_base;
        if prepared.restored
            && let Some(j) = self.cfg.journal.as_mut()
        {
            j.asked = true;
        }
        let uploader = prepared.uploader;
        match Store::open_with(self.cfg, self.clock, location) {
            Ok(store) => Ok(store.with_replica(uploader)),
            Err(e) => {
                uploader.abandon();
                Err(e)
            }
        }
    }

    fn validate(&self) -> Result<()> {
        self.cfg.validate()
    }
}
