//! The public operations. Each one: validate, hash, lock the key's shard,
//! decide and append the log record under that lock, unlock, then wait for
//! durability as the mode requires.
//!
//! Invariants:
//! - a caller is told "new", "started" or "done" only after its record is
//!   durable (in `Immediate` mode), and is told "duplicate" or "in
//!   progress" only after the record it is answered from is durable;
//! - the slot is reserved before the record is queued, so a concurrent
//!   caller of the same key sees the reservation, never a second "new";
//! - a key's bucket never moves to an earlier one, so if any record of a key
//!   is live its latest record is live (recovery relies on this).

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::builder::Config;
use crate::claim::{Begin, Claim, Failure, Forget, InProgress};
use crate::clock::{Clock, to_system_time};
use crate::codec::{TAG_JSON, TAG_RAW};
use crate::error::show_key;
use crate::index::{Pending, Probe, Shard, ShardedIndex, Slot, SlotState};
use crate::key::{KeyHash, KeyHasher};
use crate::log::format::{Kind, RELEASE_ABANDONED, RELEASE_ANY_REQUEST, RecordRef, read_row};
use crate::log::{FileMeta, Location, Log, commit::Batch, open_database};
use crate::retention::{Eviction, Evictor};
use crate::stats::Stats;
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};
use crate::{
    BeginOptions, Durability, Error, Fingerprint, Key, Record, Result, State, StoreBuilder,
};

/// An embedded deduplication and idempotency store.
///
/// Cheap to clone (an `Arc`); share it between threads.
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
    // Declared first so they are dropped (stopped and joined) before `inner`.
    _evictor: Option<Arc<Evictor>>,
    _grower: Option<Arc<crate::index::Grower>>,
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) index: ShardedIndex,
    pub(crate) log: Log,
    pub(crate) hasher: KeyHasher,
    clock: Arc<dyn Clock>,
    pub(crate) cfg: Config,
    tokens: AtomicU64,
    /// The first token of this run: a claim with a lower token was made by
    /// an earlier process, which is gone (a store file is held by one
    /// process at a time), so nobody will finish it.
    run_first_token: u64,
    /// Tokens below this are reserved by the persisted floor.
    token_limit: AtomicU64,
    /// The latest bucket `bucket_of` computed.
    cur_bucket: AtomicU64,
    /// The store's time: the highest clock reading it has used (at open,
    /// at least the latest time it recorded). Only grows.
    time: AtomicU64,
    /// The clock was last seen behind `time` (by more than the slack).
    clock_behind: AtomicBool,
    /// The current bucket at the last complete eviction pass (at open: at
    /// replay): no slot points at an earlier bucket. Slots keep 24 bits
    /// of their bucket, so a clock that jumps far past this must evict
    /// before any slot is read (see [`Inner::time`]).
    pub(crate) evicted_through: AtomicU64,
    /// No record is written into this bucket or an earlier one: an early
    /// eviction closes its victims here before it reads them (see
    /// [`Inner::writable_bucket`]). Only grows.
    pub(crate) closed_bucket: AtomicU64,
    /// One eviction pass at a time.
    pub(crate) evicting: crate::sync::Mutex<()>,
    /// Set when tables were deleted (at open, by eviction): only then can
    /// the file have grown free space worth the automatic compaction check,
    /// which walks every page under the write lock.
    pub(crate) compact_due: crate::sync::AtomicBool,
    pub(crate) counters: StoreCounters,
    /// The file, for a store opened by path (compaction checks its size).
    pub(crate) path: Option<std::path::PathBuf>,
}

/// Store-wide counters that are not per shard.
#[derive(Default)]
pub(crate) struct StoreCounters {
    pub early_buckets: AtomicU64,
    pub evicted_keys: AtomicU64,
    pub clock_behind: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("shards", &self.inner.cfg.shards)
            .field("durability", &self.inner.cfg.durability)
            .finish_non_exhaustive()
    }
}

impl Store {
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

    /// A builder for a store with non-default settings.
    ///
    /// # Examples
    /// See [`StoreBuilder`].
    pub fn builder() -> StoreBuilder {
        StoreBuilder::default()
    }

    pub(crate) fn open_with(
        cfg: Config,
        clock: Arc<dyn Clock>,
        location: Location,
    ) -> Result<Store> {
        let place = location
            .path()
            .map_or_else(|| "the store".into(), |p| p.display().to_string());
        // redb 4.6 can panic (rather than fail) on some damaged files; a
        // damaged file must be an error for the caller, not a crash.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::open_unguarded(cfg, clock, location)
        }))
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::Corrupt(format!(
                "the storage engine panicked while opening the file: {what}"
            )))
        })
        .map_err(|e| match e {
            Error::Corrupt(why) => Error::Corrupt(format!(
                "{place} is damaged ({why}); export what is readable, restore from a backup"
            )),
            other => other,
        })
    }

    fn open_unguarded(mut cfg: Config, clock: Arc<dyn Clock>, location: Location) -> Result<Store> {
        let path = location.path().map(Path::to_path_buf);
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|e| Error::Io {
            what: "drawing the key secret from the operating system",
            source: std::io::Error::other(e.to_string()),
        })?;
        let wanted = FileMeta::new(KeyHasher::new(cfg.key_hashing, secret), cfg.granularity_ms);
        let (db, meta) = open_database(
            location,
            cfg.cache_bytes,
            &wanted,
            cfg.hashing_set,
            cfg.granularity_set,
        )?;
        cfg.granularity_ms = meta.granularity_ms;
        if cfg.retention_ms / cfg.granularity_ms >= crate::index::MAX_BUCKET_SPAN {
            return Err(Error::InvalidConfig(format!(
                "retention spans too many buckets of the file's granularity ({} ms)",
                cfg.granularity_ms
            )));
        }
        let index = ShardedIndex::with_capacity(cfg.shards, cfg.expected_keys);
        // The store's time never goes back: not below the floor persisted
        // by earlier runs, nor (below) the latest record's time.
        let time_floor = meta.time_floor.min(MAX_TIME);
        let now_bucket = clock.now_millis().clamp(time_floor, MAX_TIME) / cfg.granularity_ms;
        let mut max_token = 0;
        let mut time_floor = time_floor;
        let replayed = crate::log::recovery::replay(&db, now_bucket, |bucket, row, rec| {
            time_floor = time_floor.max(rec.at);
            if rec.kind.is_entity() {
                let h = meta.hasher.hash_entity(rec.scope, rec.id);
                crate::order::apply_entity_record(&mut index.lock(h), h, bucket, row, rec)
            } else {
                max_token = max_token.max(rec.token);
                let h = meta.hasher.hash(rec.scope, rec.id);
                apply_record(&mut index.lock(h), h, bucket, row, rec);
                Ok(())
            }
        })?;
        for i in 0..cfg.shards {
            index.lock_shard(i).settle_entities(now_bucket);
        }
        // Fencing tokens never repeat, even once the records that held them
        // expired: continue above the persisted floor, and reserve a block
        // (persisted by the first commit).
        let first_token = (max_token + 1).max(meta.token_floor);
        tracing::debug!(
            records = replayed.records,
            expired_buckets = replayed.expired.len(),
            "dedupkv store recovered"
        );
        let log = Log::start(
            db,
            replayed.last_row,
            replayed.live.iter().copied().collect(),
            first_token + TOKEN_BLOCK,
            meta.manifest,
            crate::log::commit::LogSettings {
                durability: cfg.durability,
                quick_repair: cfg.quick_repair,
                split_at: cfg.row_split_bytes,
                time_step: cfg.granularity_ms,
            },
        )
        // The first commit: an open that cannot write (a full disk, a
        // damaged page) fails here, saying why, instead of handing out a
        // store whose every call then fails.
        .map_err(|e| crate::log::at_path(e, path.as_deref()))?;
        let background = cfg.background_eviction;
        let tick = Duration::from_millis(cfg.granularity_ms.clamp(1, 1_000));
        let inner = Arc::new(Inner {
            index,
            log,
            hasher: meta.hasher,
            clock,
            cfg,
            tokens: AtomicU64::new(first_token),
            run_first_token: first_token,
            token_limit: AtomicU64::new(first_token + TOKEN_BLOCK),
            cur_bucket: AtomicU64::new(0),
            time: AtomicU64::new(time_floor),
            clock_behind: AtomicBool::new(false),
            evicted_through: AtomicU64::new(now_bucket),
            // Replay wrote nothing before the current bucket: it is closed
            // already (an eviction pass need not flush for it).
            closed_bucket: AtomicU64::new(now_bucket.saturating_sub(1)),
            evicting: crate::sync::Mutex::new(()),
            compact_due: crate::sync::AtomicBool::new(true),
            counters: StoreCounters::default(),
            path,
        });
        // The expired tables go once the entities that still have events
        // are carried out of them: the carried records are committed in the
        // deletion's commit or before it.
        inner.carry_expired(now_bucket)?;
        inner.log.drop_buckets(&replayed.expired)?;
        Self::start_threads(inner, background, tick)
    }

    /// Starts the background threads of a store that is open: the evictor
    /// (if on) and the grower.
    fn start_threads(inner: Arc<Inner>, background: bool, tick: Duration) -> Result<Store> {
        let evictor = if background {
            Some(Arc::new(Evictor::start(Arc::downgrade(&inner), tick)?))
        } else {
            None
        };
        // A model checker cannot follow a thread it did not start.
        let grower = if cfg!(dedupkv_loom) {
            None
        } else {
            Some(Arc::new(
                crate::index::Grower::start(Arc::downgrade(&inner), |i: &Inner| &i.index).map_err(
                    |source| Error::Io {
                        what: "starting the index growth thread",
                        source,
                    },
                )?,
            ))
        };
        Ok(Store {
            _evictor: evictor,
            _grower: grower,
            inner,
        })
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
        self.insert_one(key, self.inner.cfg.retention_ms)
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
        self.insert_one(key, self.inner.check_retention(retention)?)
    }

    fn insert_one(&self, key: &Key<'_>, retention_ms: u64) -> Result<bool> {
        let inner = &*self.inner;
        let (h, now, nb) = inner.write_start(key)?;
        let mut shard = inner.index.lock(h);
        let probe = shard.probe(h);
        if let Some(s) = Inner::live_at(&shard, probe, nb) {
            let row = s.row(inner.log.open_row());
            shard.counters.duplicates += 1;
            drop(shard);
            inner.settle_seen(row)?;
            return Ok(false);
        }
        let prev_bucket = Inner::forgotten_at(&shard, probe, nb);
        let row = {
            let mut batch = inner.log.batch()?;
            let mut rec = Inner::insert_record(key, now, retention_ms);
            inner.append_at(
                &mut shard,
                &mut batch,
                probe,
                h,
                SlotState::Inserted,
                prev_bucket,
                &mut rec,
            )
        };
        shard.counters.new_keys += 1;
        drop(shard);
        inner.log.settle(row)?;
        Ok(true)
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
        let inner = &*self.inner;
        inner.check_batch(
            keys.iter()
                .map(|k| inner.check_key(k).map(|()| key_bytes(k))),
        )?;
        inner.log.check()?;
        let (now, nb) = inner.time()?;
        let order = inner.by_shard(keys);
        let mut out = vec![false; keys.len()];
        let mut wait_new = 0;
        let mut wait_seen = 0;
        let mut one_shard = |shard: &mut Shard, group: &[(u32, u32, KeyHash)]| -> Result<()> {
            let warm = group.iter().fold(0, |acc, &(_, _, h)| acc ^ shard.touch(h));
            std::hint::black_box(warm);
            let mut batch = inner.log.batch()?;
            for &(_, i, h) in group {
                let probe = shard.probe(h);
                if let Some(s) = Inner::live_at(shard, probe, nb) {
                    wait_seen = wait_seen.max(s.row(inner.log.open_row()));
                    shard.counters.duplicates += 1;
                    continue;
                }
                let prev_bucket = Inner::forgotten_at(shard, probe, nb);
                let mut rec = Inner::insert_record(&keys[i as usize], now, inner.cfg.retention_ms);
                let row = inner.append_at(
                    shard,
                    &mut batch,
                    probe,
                    h,
                    SlotState::Inserted,
                    prev_bucket,
                    &mut rec,
                );
                wait_new = wait_new.max(row);
                shard.counters.new_keys += 1;
                out[i as usize] = true;
            }
            Ok(())
        };
        // A shard that is busy (the grower may be rehashing it) is left for
        // last, so the batch does not follow the grower from shard to shard.
        let mut busy = Vec::new();
        for group in order.chunk_by(|a, b| a.0 == b.0) {
            match inner.index.try_lock_shard(group[0].0 as usize) {
                Some(mut shard) => one_shard(&mut shard, group)?,
                None => busy.push(group),
            }
        }
        for group in busy {
            one_shard(&mut inner.index.lock_shard(group[0].0 as usize), group)?;
        }
        if wait_new > 0 {
            inner.log.settle(wait_new)?;
        }
        inner.settle_seen(wait_seen)?;
        Ok(out)
    }

    /// Starts an idempotent operation, or tells what became of it.
    ///
    /// - A new key (or one released for retry, or one whose claim's lease
    ///   lapsed) is claimed: [`Begin::Started`] with an attempt number, a
    ///   lease and a fencing token.
    /// - A key with a live claim: [`Begin::InProgress`] with the lease expiry.
    /// - A finished key: [`Begin::Completed`] with the stored outcome.
    ///
    /// # Concurrent calls on the same key
    /// Exactly one caller gets `Started`; the others get `InProgress` (or
    /// `Completed` once it finished).
    ///
    /// # Errors
    /// [`Error::FingerprintMismatch`] if the key was begun with another
    /// fingerprint; otherwise as [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "refund-17");
    /// let params = Fingerprint::of("refund 30 EUR");
    /// let Begin::Started(claim) = store.begin(&key, params)? else { unreachable!() };
    /// store.complete(&claim, b"refund id re_123")?;
    /// let Begin::Completed(rec) = store.begin(&key, params)? else { unreachable!() };
    /// assert_eq!(rec.outcome(), Some(&b"refund id re_123"[..]));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn begin(&self, key: &Key<'_>, fingerprint: Fingerprint) -> Result<Begin> {
        self.begin_with(key, fingerprint, &BeginOptions::new())
    }

    /// [`begin`](Self::begin) with this operation's own lease and
    /// retention (see [`BeginOptions`]). The claim keeps its lease for
    /// [`renew`](Self::renew), and its completion or failure keeps the key
    /// for the operation's retention.
    ///
    /// # Errors
    /// As `begin`, and [`Error::InvalidArgument`] for a lease of 0 or a
    /// lease or retention spanning 2^22 buckets or more, or a retention
    /// shorter than the store's `max_retry_window`.
    ///
    /// # Examples
    /// See [`BeginOptions`].
    pub fn begin_with(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
    ) -> Result<Begin> {
        let op = self.inner.op(options)?;
        let mut waits = Waits::default();
        let answer = self.begin_waiting(key, fingerprint, op, &mut waits)?;
        waits.settle(&self.inner)?;
        Ok(answer)
    }

    /// Begins every `(key, fingerprint)` in one go: the claims of the new
    /// keys are recorded in one durable commit (usually; never more than a
    /// few), and the answer at index `i` is what [`begin`](Self::begin)
    /// would have said for item `i`. A key repeated within the batch is
    /// `Started` at its first position and `InProgress` after.
    ///
    /// With [`complete_batch`](Self::complete_batch) this gives a batch
    /// consumer exactly-once effects at two commits per batch: record
    /// first (`begin_batch`), handle each `Started` item, then record the
    /// outcomes (`complete_batch`), then acknowledge upstream. A crash
    /// between the two leaves the claims in progress; the restarted
    /// consumer's `begin_batch` takes them over at once, each marked
    /// [`interrupted`](Claim::interrupted) so the handler reconciles
    /// before acting again. (`insert_batch` then handle is at-most-once: a
    /// crash after the insert loses the events it had not handled.) This
    /// holds under [`Durability::Immediate`]; under `Deferred` a crash may
    /// also lose acknowledged claims and outcomes of the last `max_delay`.
    ///
    /// Every key is validated, and the call's size checked against
    /// `max_batch_bytes`, before any is recorded.
    ///
    /// # Errors
    /// The call fails as a whole for an invalid key or a call over
    /// `max_batch_bytes` ([`Error::InvalidInput`],
    /// [`Error::InvalidArgument`]), and for a failed commit
    /// ([`Error::Poisoned`], [`Error::Storage`]). An item whose key was
    /// begun with another fingerprint gets its own
    /// [`Error::FingerprintMismatch`] in the returned list.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let ids = ["evt-1", "evt-2", "evt-1"];
    /// let items: Vec<_> = ids.iter().map(|id| (Key::new("orders", id), Fingerprint::NONE)).collect();
    /// let mut claims = Vec::new();
    /// for answer in store.begin_batch(&items)? {
    ///     match answer? {
    ///         Begin::Started(claim) => claims.push(claim), // handle it
    ///         Begin::Completed(_) | Begin::InProgress(_) => {} // done, or someone has it
    ///     }
    /// }
    /// assert_eq!(claims.len(), 2);
    /// let done: Vec<_> = claims.iter().map(|c| (c, &b"ok"[..])).collect();
    /// for r in store.complete_batch(&done)? {
    ///     r?; // a claim taken over meanwhile says ClaimLost here
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<Vec<Result<Begin>>> {
        let inner = &*self.inner;
        inner.check_batch(
            items
                .iter()
                .map(|(k, _)| inner.check_key(k).map(|()| key_bytes(k) + CLAIM_BYTES)),
        )?;
        inner.log.check()?;
        let op = inner.op(&BeginOptions::new())?;
        let mut waits = Waits::default();
        let mut out = Vec::with_capacity(items.len());
        for (key, fingerprint) in items {
            match self.begin_waiting(key, *fingerprint, op, &mut waits) {
                Ok(answer) => out.push(Ok(answer)),
                Err(e @ Error::FingerprintMismatch { .. }) => out.push(Err(e)),
                Err(e) => return Err(e),
            }
        }
        waits.settle(inner)?;
        Ok(out)
    }

    /// Completes many claims, each with its outcome, in one durable commit
    /// (usually); the result at index `i` is that of item `i`. See
    /// [`begin_batch`](Self::begin_batch) for the pattern.
    ///
    /// # Errors
    /// The call fails as a whole for one over `max_batch_bytes`
    /// ([`Error::InvalidInput`]) and for a failed commit
    /// ([`Error::Poisoned`], [`Error::Storage`]): then treat every item as
    /// not completed and `begin` the keys again to see. An item whose claim
    /// is no longer the key's active one gets its own [`Error::ClaimLost`],
    /// and one whose outcome is over `max_outcome_len` its own
    /// [`Error::InvalidInput`], in the returned list.
    ///
    /// # Examples
    /// See [`begin_batch`](Self::begin_batch).
    pub fn complete_batch(&self, items: &[(&Claim, &[u8])]) -> Result<Vec<Result<()>>> {
        let inner = &*self.inner;
        inner.check_batch(
            items
                .iter()
                .map(|(c, outcome)| Ok(key_bytes(c.key()) + CLAIM_BYTES + outcome.len())),
        )?;
        let mut last = 0;
        let mut out = Vec::with_capacity(items.len());
        for (claim, outcome) in items {
            match inner.finish(claim, Kind::Complete, TAG_RAW, outcome, None) {
                Ok(row) => {
                    last = last.max(row);
                    out.push(Ok(()));
                }
                Err(e @ (Error::ClaimLost { .. } | Error::InvalidInput { .. })) => out.push(Err(e)),
                Err(e) => return Err(e),
            }
        }
        if last > 0 {
            inner.log.settle(last)?;
        }
        Ok(out)
    }

    /// [`begin`](Self::begin) without waiting for durability: the rows its
    /// answer waits for go into `waits`.
    fn begin_waiting(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        op: Op,
        waits: &mut Waits,
    ) -> Result<Begin> {
        loop {
            // `None`: the key's record was evicted between the lookup and
            // the read (it just expired); look again.
            if let Some(answer) = self.begin_once(key, fingerprint, op, waits)? {
                return Ok(answer);
            }
        }
    }

    fn begin_once(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        op: Op,
        waits: &mut Waits,
    ) -> Result<Option<Begin>> {
        let inner = &*self.inner;
        let (h, now, nb) = inner.write_start(key)?;
        let mut shard = inner.index.lock(h);
        let slot = Inner::recorded_at(&shard, shard.probe(h), nb);
        let (attempt, first_at, prev_bucket, interrupted) = match slot {
            None => {
                shard.remove(h);
                (1, now, None, false)
            }
            Some(s) => {
                let bucket = s.bucket(nb);
                match s.state() {
                    // A new operation, kept no shorter than the forget
                    // record, and first claimed later than the forgotten
                    // one (even within its millisecond, or while the
                    // store's time stands still), so its provider key
                    // differs.
                    SlotState::Forgotten => (
                        1,
                        Inner::after_forgotten(&shard, h, now),
                        Some(bucket),
                        false,
                    ),
                    SlotState::Inserted | SlotState::Completed | SlotState::Failed => {
                        let row = s.row(inner.log.open_row());
                        drop(shard);
                        return inner.replay(key, h, bucket, row, fingerprint);
                    }
                    SlotState::Claimed | SlotState::Released => {
                        let p = *shard.pending(h).ok_or_else(|| Inner::lost_details(key))?;
                        let freed = s.state() == SlotState::Released && p.any_request;
                        if p.params != fingerprint.0 && !freed {
                            shard.counters.conflicts += 1;
                            return Err(mismatch(key, Fingerprint(p.params), fingerprint));
                        }
                        // A claim of an earlier process is taken over at
                        // once: its holder is gone, and waiting out its
                        // lease only stalls the restarted consumer.
                        let orphaned = p.token < inner.run_first_token;
                        if s.state() == SlotState::Claimed && now < p.lease_until && !orphaned {
                            let row = s.row(inner.log.open_row());
                            shard.counters.in_progress += 1;
                            drop(shard);
                            waits.seen = waits.seen.max(row);
                            return Ok(Some(Begin::InProgress(InProgress {
                                attempt: p.attempt,
                                lease_until: p.lease_until,
                                first_at: p.first_at,
                            })));
                        }
                        // An attempt that never answered: its process died,
                        // its lease lapsed, or its claim was dropped.
                        let interrupted = s.state() == SlotState::Claimed || p.abandoned;
                        if interrupted {
                            shard.counters.takeovers += 1;
                        }
                        (
                            p.attempt.saturating_add(1),
                            p.first_at,
                            Some(bucket),
                            interrupted,
                        )
                    }
                }
            }
        };
        let token = inner.tokens.fetch_add(1, Ordering::Relaxed);
        let lease_until = now.saturating_add(op.lease_ms);
        let p = Pending {
            hash: h,
            attempt,
            token,
            first_at,
            lease_until,
            params: fingerprint.0,
            lease_ms: op.lease_ms,
            retention_ms: op.retention_ms,
            any_request: false,
            abandoned: false,
        };
        let mut rec = Inner::claim_record(key.scope(), key.id(), &p, now);
        let row = {
            let mut batch = inner.log.batch()?;
            inner.reserve_token(&mut batch, token);
            inner.append(
                &mut shard,
                &mut batch,
                h,
                SlotState::Claimed,
                prev_bucket,
                &mut rec,
            )
        };
        shard.set_pending(p);
        shard.counters.started += 1;
        drop(shard);
        waits.new = waits.new.max(row);
        Ok(Some(Begin::Started(self.new_claim(key, &p, interrupted))))
    }

    /// The handle of claim `p` just recorded on `key`.
    fn new_claim(&self, key: &Key<'_>, p: &Pending, interrupted: bool) -> Claim {
        Claim {
            inner: Arc::downgrade(&self.inner),
            key: key.clone().into_owned(),
            hash: p.hash,
            attempt: p.attempt,
            token: p.token,
            provider_key: crate::claim::provider_key(
                &self.inner.hasher.secret(),
                key.scope(),
                key.id(),
                p.first_at,
                p.params,
            ),
            lease_until: AtomicU64::new(p.lease_until),
            finished: AtomicBool::new(false),
            interrupted,
        }
    }

    /// Completes a claim with its outcome; every later `begin` of the key
    /// returns [`Begin::Completed`] with exactly these bytes.
    ///
    /// # Errors
    /// [`Error::ClaimLost`] if the claim is no longer the key's active one
    /// (a newer attempt took over, or it was already finished): the caller
    /// must not publish its result. [`Error::InvalidInput`] for an outcome
    /// over the limit. Otherwise as [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// See [`begin`](Self::begin).
    pub fn complete(&self, claim: &Claim, outcome: &[u8]) -> Result<()> {
        self.inner
            .finish(claim, Kind::Complete, TAG_RAW, outcome, None)
            .and_then(|row| self.inner.log.settle(row))
    }

    /// [`complete`](Self::complete), keeping this key for `retention` after
    /// completion instead of the store's retention (never less than its
    /// previous record's).
    ///
    /// # Errors
    /// As `complete`, and [`Error::InvalidConfig`] for a retention longer
    /// than 2^22 buckets.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let Begin::Started(c) = store.begin(&Key::new("t", "refund"), Fingerprint::NONE)? else { unreachable!() };
    /// store.complete_for(&c, b"re_1", Duration::from_secs(30 * 86_400))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn complete_for(&self, claim: &Claim, outcome: &[u8], retention: Duration) -> Result<()> {
        let retention_ms = self.inner.check_retention(retention)?;
        self.inner
            .finish(claim, Kind::Complete, TAG_RAW, outcome, Some(retention_ms))
            .and_then(|row| self.inner.log.settle(row))
    }

    /// Completes a claim with a typed outcome, stored as JSON (`serde_json`);
    /// read it back with [`Record::outcome_as`].
    ///
    /// The value is encoded, then decoded back as `T` before anything is
    /// recorded: an outcome that would be stored but could not be replayed
    /// is refused, and the claim stays usable (complete it with another
    /// value, or fail it). Every serde attribute that `serde_json` round-trips
    /// is supported: `rename`/`rename_all`, `default`,
    /// `skip_serializing_if`, `flatten`, and externally, internally
    /// (`tag`), adjacently (`tag` + `content`) tagged and `untagged` enums.
    /// Not supported, and refused here: non-finite floats (JSON has no NaN
    /// or infinity; they encode as `null`), map keys that JSON cannot
    /// write as strings (a tuple or struct key), nesting deeper than 128
    /// levels. JSON also cannot tell `Some(None)` from `None` in an
    /// `Option<Option<_>>`: that reads back as `None`.
    ///
    /// # Errors
    /// [`Error::Codec`] if the value cannot be encoded, or "cannot be read
    /// back" as `T`; nothing is recorded then. Otherwise as
    /// [`complete`](Self::complete).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Error, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let Begin::Started(claim) = store.begin(&Key::new("t", "e"), Fingerprint::NONE)? else { unreachable!() };
    /// // NaN would be stored as `null`, which does not read back as an f64:
    /// assert!(matches!(store.complete_value(&claim, &f64::NAN), Err(Error::Codec(_))));
    /// store.complete_value(&claim, &1.5f64)?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn complete_value<T>(&self, claim: &Claim, outcome: &T) -> Result<()>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let bytes = crate::codec::encode_outcome(outcome)?;
        self.inner
            .finish(claim, Kind::Complete, TAG_JSON, &bytes, None)
            .and_then(|row| self.inner.log.settle(row))
    }

    /// Fails a claim: [`Failure::Retryable`] frees the key for another
    /// attempt; [`Failure::Permanent`] stores a terminal failure that later
    /// `begin`s replay.
    ///
    /// # Errors
    /// As [`complete`](Self::complete).
    ///
    /// # Examples
    /// See [`Failure`].
    pub fn fail(&self, claim: &Claim, failure: Failure<'_>) -> Result<()> {
        let res = match failure {
            Failure::Retryable => self.inner.finish(claim, Kind::Release, TAG_RAW, &[], None),
            Failure::RetryableAnyRequest => {
                self.inner
                    .finish(claim, Kind::Release, RELEASE_ANY_REQUEST, &[], None)
            }
            Failure::Permanent(payload) => {
                self.inner.finish(claim, Kind::Fail, TAG_RAW, payload, None)
            }
        };
        res.and_then(|row| self.inner.log.settle(row))
    }

    /// Extends a claim's lease to now + the configured lease; returns the
    /// new expiry. A claim whose lease lapsed may still renew if nobody took
    /// it over.
    ///
    /// # Errors
    /// [`Error::ClaimLost`] if another attempt took the key over; otherwise
    /// as [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, ManualClock, Store};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let Begin::Started(claim) = store.begin(&Key::new("t", "job"), Fingerprint::NONE)? else { unreachable!() };
    /// clock.advance(Duration::from_secs(20));
    /// let until = store.renew(&claim)?; // 30 s from now, not from the start
    /// assert_eq!(until, claim.lease_expires_at());
    /// # store.complete(&claim, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn renew(&self, claim: &Claim) -> Result<SystemTime> {
        self.renew_by(claim, None)
    }

    /// [`renew`](Self::renew) to now + `by`, instead of now + the claim's
    /// lease; `by` becomes the claim's lease for later renewals.
    ///
    /// # Errors
    /// As `renew`, and [`Error::InvalidArgument`] for 0 or a span of 2^22
    /// buckets or more.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, ManualClock, Store};
    /// # use std::time::{Duration, UNIX_EPOCH};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let Begin::Started(claim) = store.begin(&Key::new("t", "export"), Fingerprint::NONE)? else { unreachable!() };
    /// // The export turned out large: hold the key for 10 more minutes.
    /// let until = store.renew_for(&claim, Duration::from_secs(600))?;
    /// assert_eq!(until, UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + 600_000));
    /// # store.complete(&claim, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn renew_for(&self, claim: &Claim, by: Duration) -> Result<SystemTime> {
        let lease_ms = self.inner.check_lease(by)?;
        self.renew_by(claim, Some(lease_ms))
    }

    fn renew_by(&self, claim: &Claim, lease_ms: Option<u64>) -> Result<SystemTime> {
        let inner = &*self.inner;
        inner.log.check()?;
        let (now, nb) = inner.time()?;
        inner.check_owner(claim)?;
        let h = claim.hash;
        let mut shard = inner.index.lock(h);
        let (p, bucket) = Inner::active(&mut shard, claim, nb)?;
        let lease_ms = lease_ms.unwrap_or(p.lease_ms);
        let lease_until = now.saturating_add(lease_ms);
        let p = Pending {
            lease_until,
            lease_ms,
            ..p
        };
        let mut rec = Inner::claim_record(claim.key.scope(), claim.key.id(), &p, now);
        let row = {
            let mut batch = inner.log.batch()?;
            inner.append(
                &mut shard,
                &mut batch,
                h,
                SlotState::Claimed,
                Some(bucket),
                &mut rec,
            )
        };
        shard.set_pending(p);
        claim.lease_until.store(lease_until, Ordering::Release);
        drop(shard);
        inner.log.settle(row)?;
        Ok(to_system_time(lease_until))
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
        let inner = &*self.inner;
        inner.check_key(key)?;
        let h = inner.hash(key);
        let (_, nb) = inner.time()?;
        let shard = inner.index.lock(h);
        let Some(s) = Inner::recorded_at(&shard, shard.probe(h), nb) else {
            return Ok(None);
        };
        let (bucket, row) = (s.bucket(nb), s.row(inner.log.open_row()));
        drop(shard);
        inner.load(key, bucket, row)
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
        let inner = &*self.inner;
        loop {
            let (h, now, nb) = inner.write_start(key)?;
            let shard = inner.index.lock(h);
            let Some(s) = Inner::live(&shard, h, nb) else {
                return Ok(Forget::NotFound);
            };
            if s.state() == SlotState::Claimed
                && let Some(p) = shard.pending(h)
                && now < p.lease_until
                && p.token >= inner.run_first_token
            {
                let p = *p;
                let row = s.row(inner.log.open_row());
                drop(shard);
                inner.settle_seen(row)?;
                return Ok(Forget::InProgress(InProgress {
                    attempt: p.attempt,
                    lease_until: p.lease_until,
                    first_at: p.first_at,
                }));
            }
            let (bucket, row) = (s.bucket(nb), s.row(inner.log.open_row()));
            drop(shard);
            // What is forgotten, for the caller's audit (read outside the
            // lock; the decision below re-checks the slot).
            let Some(old) = inner.load(key, bucket, row)? else {
                continue; // evicted meanwhile: look again
            };
            let mut shard = inner.index.lock(h);
            if Inner::live(&shard, h, nb)
                .is_none_or(|s2| s2.row(row) != row || s2.bucket(bucket) != bucket)
            {
                continue; // written meanwhile: decide again
            }
            let mut rec = RecordRef {
                kind: Kind::Forget,
                idx: 0,
                at: now,
                expires: now.saturating_add(inner.cfg.retention_ms),
                scope: key.scope(),
                id: key.id(),
                attempt: old.attempts,
                token: old.token,
                first_at: old.first_seen,
                lease_until: 0,
                params: old.fingerprint.map_or(0, |f| f.0),
                outcome_tag: TAG_RAW,
                outcome: &[],
            };
            let row = {
                let mut batch = inner.log.batch()?;
                inner.append(
                    &mut shard,
                    &mut batch,
                    h,
                    SlotState::Forgotten,
                    Some(bucket),
                    &mut rec,
                )
            };
            // Kept for the next operation's first-attempt time (see
            // `begin_once`).
            shard.set_pending(Pending {
                hash: h,
                attempt: 0,
                token: 0,
                first_at: old.first_seen,
                lease_until: 0,
                params: 0,
                lease_ms: 0,
                retention_ms: 0,
                any_request: false,
                abandoned: false,
            });
            shard.counters.forgotten += 1;
            drop(shard);
            inner.log.settle(row)?;
            return Ok(Forget::Forgotten(old));
        }
    }

    /// Commits everything acknowledged so far and waits for it (useful in
    /// [`Durability::Deferred`] mode before a planned shutdown; dropping the
    /// store does the same).
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
        self.inner.log.flush()
    }
    /// Evicts every expired time bucket now — from the index, then from
    /// disk (one `delete_table` per bucket, in one commit) — and, when a
    /// `max_keys` bound is exceeded, the oldest live buckets. The background
    /// evictor calls this on every tick; call it yourself when you drive
    /// time (a [`ManualClock`](crate::ManualClock)) or turned the background
    /// evictor off.
    ///
    /// Expired keys are never answered as present, evicted or not.
    ///
    /// # Errors
    /// [`Error::Poisoned`] or [`Error::Storage`] if the deletion commit fails.
    ///
    /// # Examples
    /// See [`Eviction`].
    pub fn evict_expired(&self) -> Result<Eviction> {
        self.inner.evict()
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
        self.inner.log.compact()
    }

    /// Counters and sizes.
    ///
    /// # Examples
    /// See [`Stats`].
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let (keys, bytes, counters) = inner.index.usage();
        let mut s = Stats::from_parts(keys, bytes, inner.log.commits(), &counters);
        let now = inner.now();
        let g = inner.cfg.granularity_ms;
        let oldest = inner.log.buckets().into_iter().find(|b| *b >= now / g);
        s.effective_window = oldest.map_or(Duration::from_millis(inner.cfg.retention_ms), |b| {
            Duration::from_millis(
                now.saturating_add(inner.cfg.retention_ms)
                    .saturating_sub(b.saturating_mul(g)),
            )
        });
        s.retention = Duration::from_millis(inner.cfg.retention_ms);
        let [entities, parked, held, unacked] = inner.index.entity_usage();
        s.entities = entities as u64;
        s.parked_now = parked as u64;
        s.held_now = held as u64;
        s.unacked_now = unacked as u64;
        s.evicted_keys = inner.counters.evicted_keys.load(Ordering::Relaxed);
        s.early_evicted_buckets = inner.counters.early_buckets.load(Ordering::Relaxed);
        s.clock_behind = inner.counters.clock_behind.load(Ordering::Relaxed);
        s
    }
}

/// Sets a key's slot (and pending details) from a replayed record.
fn apply_record(shard: &mut Shard, h: KeyHash, bucket: u64, row: u64, rec: &RecordRef<'_>) {
    let pending = Pending {
        hash: h,
        attempt: rec.attempt,
        token: rec.token,
        first_at: rec.first_at,
        lease_until: rec.lease_until,
        params: rec.params,
        // Not recorded as such, and never read: a recovered claim belongs
        // to a process that is gone, and the next attempt brings its own.
        lease_ms: rec.lease_until.saturating_sub(rec.at).max(1),
        retention_ms: rec.expires.saturating_sub(rec.at),
        any_request: rec.kind == Kind::Release && rec.outcome_tag == RELEASE_ANY_REQUEST,
        abandoned: rec.kind == Kind::Release && rec.outcome_tag == RELEASE_ABANDONED,
    };
    let state = match rec.kind {
        Kind::Insert => SlotState::Inserted,
        Kind::Claim => SlotState::Claimed,
        Kind::Release => SlotState::Released,
        Kind::Complete => SlotState::Completed,
        Kind::Fail => SlotState::Failed,
        Kind::Forget => SlotState::Forgotten,
        // Entity records are applied by `order::apply_entity_record`.
        Kind::Entity | Kind::Park | Kind::Hold => return,
    };
    shard.put(h, state, bucket, row);
    if matches!(
        state,
        SlotState::Claimed | SlotState::Released | SlotState::Forgotten
    ) {
        shard.set_pending(pending);
    } else {
        shard.remove_pending(h);
    }
}

/// The lease and retention of one operation, in ms.
#[derive(Clone, Copy)]
struct Op {
    lease_ms: u64,
    retention_ms: u64,
}

/// What a claim's record adds to a batch call's log, besides its key.
const CLAIM_BYTES: usize = 48;

/// The log rows a call's answers rest on: `new`, its own records (made
/// durable as the durability mode requires); `seen`, records written
/// before that its answers were read from (durable before it answers, in
/// `Immediate` mode).
#[derive(Default)]
struct Waits {
    new: u64,
    seen: u64,
}

impl Waits {
    fn settle(&self, inner: &Inner) -> Result<()> {
        if self.new > 0 {
            inner.log.settle(self.new)?;
        }
        inner.settle_seen(self.seen)
    }
}

/// The latest time the store uses: 9999-12-31T23:59:59.999Z. A clock
/// reading past it (a broken clock, a test's `u64::MAX`) is held there, so
/// a lease or retention added to it never saturates into "forever ago".
pub(crate) const MAX_TIME: u64 = 253_402_300_799_999;

/// How far the clock may read behind the store's time before it counts
/// as behind (callers racing across a millisecond always differ a little).
const CLOCK_SLACK_MS: u64 = 1_000;

/// How far the current bucket may move past the last eviction before a
/// call evicts first. Slots widen their bucket exactly within 2^23 of the
/// bucket they are compared with, and live slots reach up to
/// [`MAX_BUCKET_SPAN`](crate::index::MAX_BUCKET_SPAN) (2^22) ahead: 2^21
/// behind keeps every comparison inside that.
const FORCE_EVICT_SPAN: u64 = crate::index::MAX_BUCKET_SPAN / 2;

/// Fencing tokens reserved per persisted floor.
const TOKEN_BLOCK: u64 = 1 << 20;

/// The error for a claim that is not (or no longer) the key's active one.
fn lost(claim: &Claim, reason: &'static str) -> Error {
    Error::ClaimLost {
        key: claim.key.to_string(),
        attempt: claim.attempt,
        token: claim.token,
        reason,
    }
}

fn mismatch(key: &Key<'_>, recorded: Fingerprint, requested: Fingerprint) -> Error {
    Error::FingerprintMismatch {
        key: key.to_string(),
        recorded,
        requested,
    }
}

impl Inner {
    /// The store's time: the clock's reading, never earlier than a time
    /// the store has already used or recorded, never past [`MAX_TIME`].
    pub(crate) fn now(&self) -> u64 {
        let reading = self.clock.now_millis().min(MAX_TIME);
        let time = self.time.load(Ordering::Relaxed);
        if reading > time {
            // Another caller may have moved it further meanwhile.
            let time = self.time.fetch_max(reading, Ordering::Relaxed).max(reading);
            if self.clock_behind.load(Ordering::Relaxed) {
                self.clock_caught_up();
            }
            return time;
        }
        if time - reading > CLOCK_SLACK_MS {
            self.clock_is_behind(reading, time);
        }
        time
    }

    #[cold]
    fn clock_is_behind(&self, reading: u64, time: u64) {
        self.counters.clock_behind.fetch_add(1, Ordering::Relaxed);
        if !self.clock_behind.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                clock_ms = reading,
                store_ms = time,
                behind_ms = time - reading,
                "dedupkv: the clock reads earlier than the store's time; the store's time \
                 stands still (no lease lapses, no key expires) until the clock catches up"
            );
        }
    }

    #[cold]
    fn clock_caught_up(&self) {
        if self.clock_behind.swap(false, Ordering::Relaxed) {
            tracing::warn!("dedupkv: the clock caught up with the store's time");
        }
    }

    /// The store's time and its bucket, for a call about to read or write
    /// slots. If the time has moved so far past the last eviction that a
    /// slot's 24 bucket bits could wrap, evicts first (under no lock).
    pub(crate) fn time(&self) -> Result<(u64, u64)> {
        let now = self.now();
        let nb = self.bucket_of(now);
        if nb
            >= self
                .evicted_through
                .load(Ordering::Relaxed)
                .saturating_add(FORCE_EVICT_SPAN)
        {
            self.evict()?;
        }
        Ok((now, nb))
    }

    /// The bucket of a time. The current bucket and its start are cached, so
    /// the hot path compares instead of dividing (a 64-bit division is tens
    /// of micro-ops, enough to stop the processor from overlapping one
    /// call's cache misses with the next call's).
    pub(crate) fn bucket_of(&self, ms: u64) -> u64 {
        let cached = self.cur_bucket.load(Ordering::Relaxed);
        let g = self.cfg.granularity_ms;
        let start = cached.saturating_mul(g);
        if ms >= start && ms - start < g {
            return cached;
        }
        let b = ms / g;
        if b > cached {
            self.cur_bucket.store(b, Ordering::Relaxed);
        }
        b
    }

    fn hash(&self, key: &Key<'_>) -> KeyHash {
        self.hasher.hash(key.scope(), key.id())
    }

    /// Each key's (shard, position in `keys`, hash), grouped by shard and
    /// in input order within a shard: a counting sort, a pass to count and
    /// one to place (a comparison sort of a 1,000-key batch cost more than
    /// hashing it).
    fn by_shard(&self, keys: &[Key<'_>]) -> Vec<(u32, u32, KeyHash)> {
        let hashed: Vec<(u32, KeyHash)> = keys
            .iter()
            .map(|k| {
                let h = self.hash(k);
                (self.index.shard_of(h) as u32, h)
            })
            .collect();
        // starts[s] = where shard s's keys begin.
        let mut starts = vec![0usize; self.index.shard_count() + 1];
        for &(s, _) in &hashed {
            starts[s as usize + 1] += 1;
        }
        for s in 1..starts.len() {
            starts[s] += starts[s - 1];
        }
        let mut order = vec![(0, 0, KeyHash::default()); keys.len()];
        for (i, &(s, h)) in hashed.iter().enumerate() {
            order[starts[s as usize]] = (s, i as u32, h);
            starts[s as usize] += 1;
        }
        order
    }
    fn check_retention(&self, retention: Duration) -> Result<u64> {
        let ms = crate::clock::millis(retention);
        if ms == 0 {
            return Err(Error::InvalidArgument {
                what: "retention",
                reason: "is 0: a key kept for no time deduplicates nothing".into(),
            });
        }
        if ms / self.cfg.granularity_ms >= crate::index::MAX_BUCKET_SPAN {
            return Err(Error::InvalidConfig(format!(
                "a retention of {ms} ms spans more than {} buckets of {} ms",
                crate::index::MAX_BUCKET_SPAN - 1,
                self.cfg.granularity_ms
            )));
        }
        if let Some(window) = self.cfg.max_retry_window_ms
            && ms < window
        {
            return Err(Error::InvalidArgument {
                what: "retention",
                reason: format!(
                    "of {ms} ms is shorter than the store's max retry window ({window} ms): \
                     a redelivery after it would be handled twice"
                ),
            });
        }
        Ok(ms)
    }

    /// Tokens are reserved in blocks: the first token at or past the
    /// reserved limit persists a higher floor in this very commit, so no
    /// token is handed out (durably) before its reservation is. The caller
    /// holds the batch lock.
    fn reserve_token(&self, batch: &mut Batch, token: u64) {
        if token >= self.token_limit.load(Ordering::Acquire) {
            let limit = token + TOKEN_BLOCK;
            self.token_limit.fetch_max(limit, Ordering::AcqRel);
            batch.raise_token_floor(limit);
        }
    }

    /// The lease and retention of an operation begun with `options`.
    fn op(&self, options: &BeginOptions) -> Result<Op> {
        Ok(Op {
            lease_ms: match options.lease {
                Some(d) => self.check_lease(d)?,
                None => self.cfg.lease_ms,
            },
            retention_ms: match options.retention {
                Some(d) => self.check_retention(d)?,
                None => self.cfg.retention_ms,
            },
        })
    }

    /// A per-call lease in ms: at least 1 ms, and short enough that a
    /// claim's record stays within the buckets a slot can represent.
    fn check_lease(&self, lease: Duration) -> Result<u64> {
        let ms = crate::clock::millis(lease);
        if ms == 0 {
            return Err(Error::InvalidArgument {
                what: "lease",
                reason: "is 0; a claim's lease must be at least 1 ms".into(),
            });
        }
        if ms / self.cfg.granularity_ms >= crate::index::MAX_BUCKET_SPAN {
            return Err(Error::InvalidArgument {
                what: "lease",
                reason: format!(
                    "of {ms} ms spans more than {} buckets of {} ms",
                    crate::index::MAX_BUCKET_SPAN - 1,
                    self.cfg.granularity_ms
                ),
            });
        }
        Ok(ms)
    }

    /// What every write on an event key starts with: validate the key,
    /// refuse if poisoned, hash it, read the clock. Returns the hash, now
    /// and the current bucket.
    fn write_start(&self, key: &Key<'_>) -> Result<(KeyHash, u64, u64)> {
        self.check_key(key)?;
        self.log.check()?;
        let (now, nb) = self.time()?;
        Ok((self.hash(key), now, nb))
    }

    /// Fails for an empty scope or id (an empty id is a missing key: taken
    /// as one, every event without an id would be a duplicate of the first)
    /// and for parts over the limits.
    pub(crate) fn check_key(&self, key: &Key<'_>) -> Result<()> {
        for (what, part) in [("scope", key.scope()), ("id", key.id())] {
            if part.is_empty() {
                return Err(Error::InvalidArgument {
                    what,
                    reason: "is empty; a key needs a non-empty scope and id".into(),
                });
            }
        }
        check_len("scope", key.scope().len(), self.cfg.max_scope)?;
        check_len("id", key.id().len(), self.cfg.max_id)
    }

    /// Checks every item of a batch call (each gives its log bytes, or its
    /// error) and fails for a call over `max_batch_bytes`, before anything
    /// is recorded.
    pub(crate) fn check_batch(&self, items: impl Iterator<Item = Result<usize>>) -> Result<()> {
        let mut total = 0usize;
        for bytes in items {
            total = total.saturating_add(bytes?);
        }
        check_len("batch", total, self.cfg.max_batch_bytes)
    }

    /// Fails for a payload over `max_outcome_len`.
    pub(crate) fn check_payload(&self, payload: &[u8]) -> Result<()> {
        check_len("payload", payload.len(), self.cfg.max_outcome)
    }

    /// Appends an Insert record for a key that is absent (never recorded,
    /// expired or forgotten) and points its slot at it. Caller holds the
    /// shard and batch locks.
    pub(crate) fn append_insert(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        h: KeyHash,
        key: &Key<'_>,
        now: u64,
    ) -> u64 {
        shard.remove_pending(h);
        let probe = shard.probe(h);
        let prev_bucket = Self::forgotten_at(shard, probe, now / self.cfg.granularity_ms);
        let mut rec = Self::insert_record(key, now, self.cfg.retention_ms);
        self.append_at(
            shard,
            batch,
            probe,
            h,
            SlotState::Inserted,
            prev_bucket,
            &mut rec,
        )
    }

    /// The key's slot if the key is present: recorded, not expired, not
    /// forgotten.
    pub(crate) fn live(shard: &Shard, h: KeyHash, now_bucket: u64) -> Option<Slot> {
        Self::live_at(shard, shard.probe(h), now_bucket)
    }

    /// [`live`](Self::live) from a probe of the key.
    fn live_at(shard: &Shard, probe: Probe, now_bucket: u64) -> Option<Slot> {
        Self::recorded_at(shard, probe, now_bucket).filter(|s| s.state() != SlotState::Forgotten)
    }

    /// The first-attempt time of a new operation on a forgotten key: now,
    /// but later than the forgotten operation's (kept in `pending`).
    fn after_forgotten(shard: &Shard, h: KeyHash, now: u64) -> u64 {
        now.max(shard.pending(h).map_or(0, |p| p.first_at.saturating_add(1)))
    }

    /// The bucket of the key's forget record, if that is its latest record
    /// and has not expired: the key is absent, but its next record must not
    /// go to an earlier bucket (or a reopen after that record expired would
    /// bring the forget record back).
    fn forgotten_at(shard: &Shard, probe: Probe, now_bucket: u64) -> Option<u64> {
        Self::recorded_at(shard, probe, now_bucket)
            .filter(|s| s.state() == SlotState::Forgotten)
            .map(|s| s.bucket(now_bucket))
    }

    /// The key's slot if its latest record has not expired, forgotten or not.
    fn recorded_at(shard: &Shard, probe: Probe, now_bucket: u64) -> Option<Slot> {
        shard.slot(probe).copied().filter(|s| {
            let b = s.bucket(now_bucket);
            // No live record is further out than the longest retention; a
            // bucket that widens past it is a long-expired one wrapping.
            b >= now_bucket && b - now_bucket < crate::index::MAX_BUCKET_SPAN
        })
    }

    /// The record of claim `p` on (`scope`, `id`), written at `now`: by
    /// `begin`, by `renew`, and by eviction carrying a live claim out of a
    /// bucket it deletes.
    pub(crate) fn claim_record<'k>(
        scope: &'k [u8],
        id: &'k [u8],
        p: &Pending,
        now: u64,
    ) -> RecordRef<'k> {
        RecordRef {
            kind: Kind::Claim,
            idx: 0,
            at: now,
            expires: now.saturating_add(p.retention_ms).max(p.lease_until),
            scope,
            id,
            attempt: p.attempt,
            token: p.token,
            first_at: p.first_at,
            lease_until: p.lease_until,
            params: p.params,
            outcome_tag: TAG_RAW,
            outcome: &[],
        }
    }

    fn insert_record<'k>(key: &'k Key<'_>, now: u64, retention_ms: u64) -> RecordRef<'k> {
        RecordRef {
            kind: Kind::Insert,
            idx: 0,
            at: now,
            expires: now.saturating_add(retention_ms),
            scope: key.scope(),
            id: key.id(),
            attempt: 0,
            token: 0,
            first_at: now,
            lease_until: 0,
            params: 0,
            outcome_tag: TAG_RAW,
            outcome: &[],
        }
    }

    /// Appends `rec` and points the key's slot at it. Caller holds the
    /// shard lock and the batch lock. The bucket never moves earlier than
    /// `prev_bucket`.
    pub(crate) fn append(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        h: KeyHash,
        state: SlotState,
        prev_bucket: Option<u64>,
        rec: &mut RecordRef<'_>,
    ) -> u64 {
        let probe = shard.probe(h);
        self.append_at(shard, batch, probe, h, state, prev_bucket, rec)
    }

    /// [`append`](Self::append) where `probe` was made for `h` with no
    /// change to the shard since, saving a second walk of the slot run.
    #[allow(clippy::too_many_arguments)]
    fn append_at(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        probe: Probe,
        h: KeyHash,
        state: SlotState,
        prev_bucket: Option<u64>,
        rec: &mut RecordRef<'_>,
    ) -> u64 {
        let g = self.cfg.granularity_ms;
        let mut bucket = rec.expires / g;
        if let Some(pb) = prev_bucket
            && pb > bucket
        {
            bucket = pb;
            rec.expires = rec.expires.max(pb.saturating_mul(g));
        }
        let bucket = self.writable_bucket(bucket, rec);
        let row = batch.push(bucket, rec);
        shard.put_at(probe, h, state, bucket, row);
        row
    }

    /// `bucket`, unless an early eviction has closed it: then the first
    /// open bucket, with `rec` expiring no earlier than it. A record with a
    /// per-call (or entity) retention shorter than the store's can aim at a
    /// bucket that eviction is deleting; written there after eviction read
    /// the bucket, it would be deleted under a live slot. The caller holds
    /// the batch lock, which orders this read after an eviction's
    /// close-then-flush.
    pub(crate) fn writable_bucket(&self, bucket: u64, rec: &mut RecordRef<'_>) -> u64 {
        let closed = self.closed_bucket.load(Ordering::Acquire);
        if bucket > closed {
            return bucket;
        }
        let open = closed.saturating_add(1);
        rec.expires = rec
            .expires
            .max(open.saturating_mul(self.cfg.granularity_ms));
        open
    }

    /// Waits, in `Immediate` mode, until the record an answer is based on
    /// is durable.
    pub(crate) fn settle_seen(&self, row: u64) -> Result<()> {
        match self.cfg.durability {
            Durability::Immediate => self.log.wait_durable(row),
            Durability::Deferred { .. } => Ok(()),
        }
    }

    /// Fails for a claim made by another store.
    fn check_owner(&self, claim: &Claim) -> Result<()> {
        if std::ptr::eq(claim.inner.as_ptr(), self) {
            return Ok(());
        }
        Err(self.fenced(claim, "the claim was made by another store"))
    }

    /// Counts a refused `complete`, `fail` or `renew` in `Stats::fenced`
    /// and returns its error. The caller does not hold the shard lock.
    fn fenced(&self, claim: &Claim, reason: &'static str) -> Error {
        self.index.lock(claim.hash).counters.fenced += 1;
        lost(claim, reason)
    }

    /// The claim's pending details and slot bucket, if it is still the
    /// key's active claim.
    fn active(shard: &mut Shard, claim: &Claim, nb: u64) -> Result<(Pending, u64)> {
        let h = claim.hash;
        let reason = match Self::live(shard, h, nb) {
            None if Self::forgotten_at(shard, shard.probe(h), nb).is_some() => {
                "the key was forgotten"
            }
            None => "the key expired",
            Some(s) => match s.state() {
                SlotState::Claimed => match shard.pending(h) {
                    Some(p) if p.token == claim.token => return Ok((*p, s.bucket(nb))),
                    _ => "its lease lapsed and a newer attempt took the key over",
                },
                SlotState::Released => "the key was released for a retry",
                SlotState::Completed => "the key was already completed",
                SlotState::Failed => "the key already failed permanently",
                SlotState::Inserted => "the key was recorded by insert_if_absent",
                SlotState::Forgotten => "the key was forgotten",
            },
        };
        shard.counters.fenced += 1;
        Err(lost(claim, reason))
    }

    /// Writes a Complete, Fail or Release record for an active claim;
    /// returns its row (not yet settled).
    fn finish(
        &self,
        claim: &Claim,
        kind: Kind,
        tag: u8,
        outcome: &[u8],
        retention_ms: Option<u64>,
    ) -> Result<u64> {
        check_len("outcome", outcome.len(), self.cfg.max_outcome)?;
        self.log.check()?;
        self.check_owner(claim)?;
        if claim.finished.load(Ordering::Acquire) {
            return Err(self.fenced(claim, "this claim was already finished"));
        }
        let (now, nb) = self.time()?;
        let h = claim.hash;
        let mut shard = self.index.lock(h);
        let (p, bucket) = Self::active(&mut shard, claim, nb)?;
        let mut rec = RecordRef {
            kind,
            idx: 0,
            at: now,
            expires: now.saturating_add(retention_ms.unwrap_or(p.retention_ms)),
            scope: claim.key.scope(),
            id: claim.key.id(),
            attempt: p.attempt,
            token: p.token,
            first_at: p.first_at,
            lease_until: p.lease_until,
            params: p.params,
            outcome_tag: tag,
            outcome,
        };
        let state = match kind {
            Kind::Complete => SlotState::Completed,
            Kind::Fail => SlotState::Failed,
            _ => SlotState::Released,
        };
        let row = {
            let mut batch = self.log.batch()?;
            self.append(&mut shard, &mut batch, h, state, Some(bucket), &mut rec)
        };
        match state {
            SlotState::Released => {
                shard.set_pending(Pending {
                    lease_until: 0,
                    any_request: tag == RELEASE_ANY_REQUEST,
                    abandoned: tag == RELEASE_ABANDONED,
                    ..p
                });
                shard.counters.released += 1;
            }
            SlotState::Failed => {
                shard.remove_pending(h);
                shard.counters.failed += 1;
            }
            _ => {
                shard.remove_pending(h);
                shard.counters.completed += 1;
            }
        }
        claim.finished.store(true, Ordering::Release);
        Ok(row)
    }

    /// Releases a claim dropped without an answer. Does not wait: if the
    /// record is lost in a crash, the lease lapses instead.
    pub(crate) fn release_dropped(&self, claim: &Claim) {
        claim.finished.store(false, Ordering::Release);
        match self.finish(claim, Kind::Release, RELEASE_ABANDONED, &[], None) {
            Ok(_) => self.log.kick(),
            Err(e) => tracing::debug!(key = %claim.key, error = %e, "dropped claim not released"),
        }
    }

    /// Answers `begin` on a finished key from its log record.
    fn replay(
        &self,
        key: &Key<'_>,
        h: KeyHash,
        bucket: u64,
        row: u64,
        fingerprint: Fingerprint,
    ) -> Result<Option<Begin>> {
        let Some(rec) = self.load(key, bucket, row)? else {
            // Its bucket was deleted under us: the key expired. Drop the
            // slot if nobody rewrote it meanwhile, so the retry sees it
            // absent (and the retry loop ends).
            let mut shard = self.index.lock(h);
            if shard
                .get(h)
                .is_some_and(|s| s.bucket(bucket) == bucket && s.row(row) == row)
            {
                shard.remove(h);
            }
            return Ok(None);
        };
        let mut shard = self.index.lock(h);
        if rec.state != State::Inserted && rec.fingerprint != Some(fingerprint) {
            shard.counters.conflicts += 1;
            return Err(mismatch(
                key,
                rec.fingerprint.unwrap_or(Fingerprint::NONE),
                fingerprint,
            ));
        }
        shard.counters.replays += 1;
        Ok(Some(Begin::Completed(rec)))
    }

    /// Reads the key's latest record from the row its slot points at.
    fn load(&self, key: &Key<'_>, bucket: u64, row: u64) -> Result<Option<Record>> {
        self.log.wait_durable(row)?;
        let Some(bytes) = self.log.read_row(bucket, row)? else {
            // The bucket was evicted between the lookup and the read.
            return Ok(None);
        };
        let where_ = |e: Error| match e {
            Error::Corrupt(m) => Error::Corrupt(format!(
                "{m} (log row {row} of bucket {bucket}, read for key {}{})",
                show_key(key.scope(), key.id()),
                self.path
                    .as_deref()
                    .map(|p| format!(", in {}", p.display()))
                    .unwrap_or_default()
            )),
            other => other,
        };
        let mut found = None;
        for rec in read_row(&bytes).map_err(where_)? {
            let rec = rec.map_err(where_)?;
            if !rec.kind.is_entity() && rec.scope == key.scope() && rec.id == key.id() {
                found = Some(Record::from_log(&rec, &self.hasher.secret()));
            }
        }
        found.map(Some).ok_or_else(|| Self::lost_details(key))
    }

    fn lost_details(key: &Key<'_>) -> Error {
        Error::Corrupt(format!(
            "the index points at a log row without key {}",
            show_key(key.scope(), key.id())
        ))
    }
}

/// What a key costs a batch call's log, as `max_batch_bytes` counts it.
fn key_bytes(key: &Key<'_>) -> usize {
    key.scope().len() + key.id().len() + 32
}

fn check_len(what: &'static str, len: usize, limit: usize) -> Result<()> {
    if len > limit {
        return Err(Error::InvalidInput { what, len, limit });
    }
    Ok(())
}
