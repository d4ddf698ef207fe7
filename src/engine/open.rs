//! Opening a store: the file, recovery (replaying the log into the index),
//! the first commit, and the background threads.
//!
//! Invariants:
//! - recovery replays in log order, the last record of a key wins, and
//!   nothing expired is loaded — except entity records, which are applied
//!   from expired tables too, so entities that still have events are
//!   carried forward before those tables are deleted, and the records of
//!   reconciliation windows still kept (`reconcile`), carried likewise;
//! - the open makes its first commit itself and fails with that commit's
//!   error: a store that cannot write is never handed out;
//! - an open never yields fewer rows than the last commit recorded: in a
//!   format-5 file every bucket table's rows are checked against its
//!   summary during replay (see `log::summary`);
//! - the file keeps its format (from format 3 on) unless the operator asks
//!   for the upgrade ([`Config::upgrade`], [`Engine::upgrade`]); a feature
//!   that needs a newer format asks [`Engine::require_format`] first;
//! - a redb panic while opening is reported as damage, never a crash.

use std::path::Path;
use std::time::Duration;

use super::counters::StoreCounters;
use super::dead_letter::{ExpiredDeadLetter, ExpiredDeadLetters};
use super::intents::{ExpiredIntent, ExpiredIntents};
use super::order::apply_entity_record;
use super::reconcile::Recovered;
use super::time::{MAX_TIME, StoreTime};
use super::tokens::{TOKEN_BLOCK, Tokens};
use super::{Config, Engine, Threads};
use crate::clock::Clock;
use crate::index::intent::{IntentSlot, IntentState};
use crate::index::{Pending, Round, Shard, ShardedIndex, SlotState};
use crate::key::{KeyHash, KeyHasher};
use crate::log::{FileMeta, Found, Location, Log, Replay, open_database};
use crate::records::{
    INTENT_PENDING, INTENT_SETTLED, Kind, RELEASE_ABANDONED, RELEASE_ANY_REQUEST, RecordRef,
    SUMMARIES_FORMAT,
};
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, MutexGuard};
use crate::{Error, Result};

impl Engine {
    /// Opens (or creates) the store at `location`; returns the engine and
    /// its running threads.
    pub(crate) fn open(
        cfg: Config,
        clock: Arc<dyn Clock>,
        location: Location,
    ) -> Result<(Arc<Engine>, Threads)> {
        let place = location
            .path()
            .map_or_else(|| "the store".into(), |p| p.display().to_string());
        let _span = tracing::info_span!("dedupkv.recovery", place = %place).entered();
        // redb 4.6 can panic (rather than fail) on some damaged files; a
        // damaged file must be an error for the caller, not a crash.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::open_unguarded(cfg, clock, location)
        }))
        .unwrap_or_else(|panic| {
            let what = crate::error::panic_message(&*panic);
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

    // The open's steps in the order they must happen; the engine's fields
    // are set in one place.
    #[allow(clippy::too_many_lines)]
    fn open_unguarded(
        mut cfg: Config,
        clock: Arc<dyn Clock>,
        location: Location,
    ) -> Result<(Arc<Engine>, Threads)> {
        let path = location.path().map(Path::to_path_buf);
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|e| Error::Io {
            what: "drawing the key secret from the operating system",
            source: std::io::Error::other(e.to_string()),
        })?;
        let wanted = FileMeta::new(KeyHasher::new(cfg.key_hashing, secret), cfg.granularity_ms);
        let (db, meta) = open_database(
            location,
            cfg.store_options(),
            &wanted,
            cfg.hashing_set,
            cfg.granularity_set,
        )?;
        cfg.granularity_ms = meta.granularity_ms;
        if cfg.retention_ms.max(cfg.tally_retention_ms) / cfg.granularity_ms
            >= crate::index::MAX_BUCKET_SPAN
        {
            return Err(Error::InvalidConfig(format!(
                "retention spans too many buckets of the file's granularity ({} ms)",
                cfg.granularity_ms
            )));
        }
        let index = ShardedIndex::with_capacity(cfg.shards, cfg.expected_keys);
        // The store's time never goes back: not below the floor persisted
        // by earlier runs, nor (below) the latest record's time.
        let time_floor = meta.time_floor.min(MAX_TIME);
        let opened_at = clock.now_millis().clamp(time_floor, MAX_TIME);
        let now_bucket = opened_at / cfg.granularity_ms;
        let mut max_token = 0;
        let mut time_floor = time_floor;
        let checked = meta.format >= SUMMARIES_FORMAT;
        if !checked && !cfg.upgrade {
            note_unchecked(meta.format);
        }
        // The shards stay locked until the block ends.
        let (replayed, expired_dead, expired_intents, tallies) = {
            let mut state = Replaying {
                index: &index,
                shards: index.lock_all(),
                hasher: &meta.hasher,
                expired_dead: ExpiredDeadLetters::new(),
                expired_intents: ExpiredIntents::new(),
                tallies: Recovered::new(&cfg, meta.hasher.secret(), now_bucket),
            };
            let replayed = crate::log::replay(&db, now_bucket, checked, |row, recs| {
                for r in recs {
                    time_floor = time_floor.max(r.rec.at);
                    if !r.expired && r.rec.kind.is_claim_body() {
                        max_token = max_token.max(r.rec.claim_fields().token);
                    }
                }
                state.apply_row(row, recs)
            })?;
            (
                replayed,
                state.expired_dead,
                state.expired_intents,
                state.tallies,
            )
        };
        for i in 0..cfg.shards {
            index.lock_shard(i).settle_entities(now_bucket);
        }
        let tally_carry = tallies.into_index(&index);
        // Fencing tokens never repeat, even once the records that held them
        // expired: continue above the persisted floor, and reserve a block
        // (persisted by the first commit).
        let first_token = (max_token + 1).max(meta.token_floor).max(cfg.token_base);
        tracing::debug!(
            records = replayed.records,
            expired_buckets = replayed.expired.len(),
            "dedupkv store recovered"
        );
        let log = Log::start(
            db,
            Found {
                last_row: replayed.last_row,
                buckets: replayed.live.iter().copied().collect(),
                manifest: meta.manifest,
                summaries: replayed.summaries,
                format: meta.format,
            },
            first_token + TOKEN_BLOCK,
            cfg.log_settings(),
        )
        // The first commit: an open that cannot write (a full disk, a
        // damaged page) fails here, saying why, instead of handing out a
        // store whose every call then fails.
        .map_err(|e| crate::error::at_path(e, path.as_deref()))?;
        let background = cfg.background_eviction;
        let tick = Duration::from_millis(cfg.granularity_ms.clamp(1, 1_000));
        let time = StoreTime::starting_at(time_floor.max(opened_at), clock.elapsed_millis());
        let engine = Arc::new(Engine {
            index,
            log,
            hasher: meta.hasher,
            clock,
            cfg,
            tokens: Tokens::starting_at(first_token),
            cur_bucket: AtomicU64::new(0),
            time,
            evicted_through: AtomicU64::new(now_bucket),
            // Replay wrote nothing before the current bucket: it is closed
            // already (an eviction pass need not flush for it).
            closed_bucket: AtomicU64::new(now_bucket.saturating_sub(1)),
            evicting: Mutex::new(()),
            compact_due: AtomicBool::new(true),
            counters: StoreCounters::default(),
            waiters: Arc::default(),
            tick_hook: std::sync::OnceLock::new(),
            path,
            opened_at: opened_at.max(time_floor),
        });
        // A poisoned log (a failed commit, the replica's fence) wakes every
        // `begin_or_wait` at once, to answer the poison. A poison before
        // this is seen by their first `begin`: nobody could wait yet.
        let waiters = Arc::clone(&engine.waiters);
        engine.log.on_poison(Box::new(move || waiters.wake_all()));
        // The expired tables go once the entities that still have events
        // are carried out of them: the carried records are committed in the
        // deletion's commit or before it.
        engine.carry_expired(now_bucket)?;
        engine.carry_expired_dead_letters(expired_dead)?;
        engine.carry_expired_intents(expired_intents)?;
        engine.carry_tallies(&tally_carry, engine.now())?;
        engine.log.drop_buckets(&replayed.expired)?;
        let threads = Threads::start(&engine, background, tick)?;
        Ok((engine, threads))
    }
}

impl Engine {
    /// The store format of the open file: 3 or 4 for a file an older
    /// build wrote, until [`upgrade`](Self::upgrade); 5 for a new or
    /// upgraded one.
    pub(crate) fn format(&self) -> u32 {
        self.log.format()
    }

    /// The format the engine's own records follow (bodies, counting): the
    /// file's once the open's first commit was made. An upgrade of the
    /// open store changes them from the next open on, so no running
    /// decision (how completions are counted) changes under its callers.
    pub(crate) fn records_format(&self) -> u32 {
        self.log.opened_format()
    }

    /// Fails with [`Error::NeedsUpgrade`] unless the file is at least
    /// format `needed` (its format now, or, `for_records`, the one its
    /// records follow since the open): the one check a feature that writes
    /// or reads something only a newer format has makes before it does.
    pub(crate) fn require_format(
        &self,
        feature: &'static str,
        needed: u32,
        for_records: bool,
    ) -> Result<()> {
        let found = if for_records {
            self.records_format()
        } else {
            self.format()
        };
        if found < needed {
            return Err(Error::NeedsUpgrade {
                feature,
                found,
                needed,
            });
        }
        Ok(())
    }

    /// Rewrites the file as the newest format (format 5: every bucket
    /// table gets its summary) in one commit; whether it was older.
    pub(crate) fn upgrade(&self) -> Result<bool> {
        let upgraded = self.log.upgrade()?;
        if upgraded {
            tracing::info!(
                format = self.format(),
                "dedupkv: the file was upgraded; builds that know only older formats refuse it"
            );
        }
        Ok(upgraded)
    }

    /// Reads every bucket table and checks it against its summary, every
    /// row against its checksum; returns the rows read.
    pub(crate) fn verify(&self) -> Result<u64> {
        self.require_format("Store::verify (bucket summaries)", SUMMARIES_FORMAT, false)?;
        self.log.verify().map_err(|e| match (e, &self.path) {
            (Error::Corrupt(why), Some(p)) => {
                Error::Corrupt(format!("{} is damaged ({why})", p.display()))
            }
            (e, _) => e,
        })
    }
}

/// Says that a file of an older format runs without the checks it lacks.
fn note_unchecked(format: u32) {
    tracing::info!(
        format,
        "dedupkv: the file is format {format}: it runs without bucket summaries (an open \
         cannot tell a bucket table that lost rows) until upgraded \
         (StoreBuilder::upgrade, Store::upgrade)"
    );
}

/// Records of a row whose slots are warmed before they are applied.
const WARM: usize = 32;

/// What replay builds: the index, every shard of it locked for the whole
/// replay (nothing else can reach the index before the open returns), so
/// no record takes a lock; and what is kept of expired tables.
struct Replaying<'a, 'c> {
    index: &'a ShardedIndex,
    shards: Vec<MutexGuard<'a, Shard>>,
    hasher: &'a KeyHasher,
    expired_dead: ExpiredDeadLetters,
    expired_intents: ExpiredIntents,
    tallies: Recovered<'c>,
}

impl Replaying<'_, '_> {
    fn shard(&mut self, h: KeyHash) -> &mut Shard {
        let i = self.index.shard_of(h);
        &mut self.shards[i]
    }

    /// Applies replayed records of row `row` in log order, [`WARM`] at a time,
    /// in three passes: the hash of each live event key, then a read of
    /// each one's slot ([`Shard::touch`], which changes nothing), then the
    /// records. Replay is bound by the index's cache and TLB misses, about
    /// one per key; the middle pass is a short loop of independent reads,
    /// so the processor waits for the misses of the whole chunk together,
    /// as a batch insert does (docs/performance.md). Nothing in it may
    /// wait for a read: no hashing between the reads (its instructions
    /// fill the processor's window while one read waits, so the next does
    /// not start) and no lock (a locked instruction waits for every read
    /// before it).
    fn apply_row(&mut self, row: u64, recs: &[Replay<'_>]) -> Result<()> {
        let mut hashes = [None; WARM];
        for chunk in recs.chunks(WARM) {
            let hashes = &mut hashes[..chunk.len()];
            for (r, h) in chunk.iter().zip(hashes.iter_mut()) {
                *h = (!r.expired && r.rec.kind.is_key_state())
                    .then(|| self.hasher.hash(r.rec.scope, r.rec.id));
            }
            let mut warm = 0;
            for h in hashes.iter().flatten() {
                warm ^= self.shard(*h).touch(*h);
            }
            std::hint::black_box(warm);
            for (r, h) in chunk.iter().zip(hashes.iter()) {
                self.apply((r.bucket, row, r.expired), &r.rec, *h)?;
            }
        }
        Ok(())
    }

    /// Applies one replayed record: an entity's to the entity (entities
    /// with events outlive their tables' expiry); a live event key's to
    /// its slot (`slot`: its key's hash, if the caller computed it
    /// already); an expired one's only if it is a dead letter (kept in
    /// `expired_dead` until a later record of its key supersedes it).
    fn apply(
        &mut self,
        (bucket, row, expired): (u64, u64, bool),
        rec: &RecordRef<'_>,
        slot: Option<KeyHash>,
    ) -> Result<()> {
        if rec.kind.is_tally() || rec.kind == Kind::Complete {
            self.tallies.apply(rec, expired)?;
            if rec.kind.is_tally() {
                return Ok(());
            }
        }
        if rec.kind.is_entity() {
            let h = self.hasher.hash_entity(rec.scope, rec.id);
            return apply_entity_record(self.shard(h), h, bucket, row, rec);
        }
        if rec.kind == Kind::Intent {
            return self.apply_intent_record((bucket, row, expired), rec);
        }
        if !expired {
            let h = slot.unwrap_or_else(|| self.hasher.hash(rec.scope, rec.id));
            return apply_record(self.shard(h), h, bucket, row, rec);
        }
        if rec.kind == Kind::DeadLetter {
            let body = rec.dead_letter_body()?;
            self.expired_dead.insert(
                self.hasher.hash(rec.scope, rec.id),
                ExpiredDeadLetter {
                    scope: rec.scope.to_vec(),
                    id: rec.id.to_vec(),
                    claim: rec.claim_fields(),
                    failed_at: body.failed_at,
                    body: rec.outcome.to_vec(),
                },
            );
        } else if !self.expired_dead.is_empty() {
            self.expired_dead
                .remove(&self.hasher.hash(rec.scope, rec.id));
        }
        Ok(())
    }

    /// Applies a replayed `Intent` record: the latest of a key wins; an
    /// expired pending one is kept in `expired_intents` until a later one
    /// supersedes it.
    fn apply_intent_record(
        &mut self,
        (bucket, row, expired): (u64, u64, bool),
        rec: &RecordRef<'_>,
    ) -> Result<()> {
        let h = self.hasher.hash(rec.scope, rec.id);
        let body = rec.intent_body()?;
        self.expired_intents.remove(&h);
        if expired {
            if rec.outcome_tag == INTENT_PENDING {
                self.expired_intents.insert(
                    h,
                    ExpiredIntent {
                        scope: rec.scope.to_vec(),
                        id: rec.id.to_vec(),
                        claim: rec.claim_fields(),
                        body: rec.outcome.to_vec(),
                    },
                );
            }
            return Ok(());
        }
        let shard = self.shard(h);
        let state = match rec.outcome_tag {
            INTENT_PENDING => IntentState::Pending,
            INTENT_SETTLED => IntentState::Settled,
            _ => {
                shard.remove_intent(h);
                return Ok(());
            }
        };
        shard.set_intent(IntentSlot {
            hash: h,
            bucket,
            row,
            recorded_at: body.recorded_at,
            attempt: rec.claim_fields().attempt,
            state,
            calls: body.calls,
        });
        Ok(())
    }
}

/// Sets a key's slot (and pending details) from a replayed record.
fn apply_record(
    shard: &mut Shard,
    h: KeyHash,
    bucket: u64,
    row: u64,
    rec: &RecordRef<'_>,
) -> Result<()> {
    if rec.kind == Kind::Insert {
        shard.put(h, SlotState::Inserted, bucket, row);
        shard.remove_pending(h);
        return Ok(());
    }
    let c = rec.claim_fields();
    let pending = Pending {
        hash: h,
        attempt: c.attempt,
        token: c.token,
        first_at: c.first_at,
        lease_until: c.lease_until,
        params: c.params,
        // Not recorded as such, and never read: a recovered claim belongs
        // to a process that is gone, and the next attempt brings its own.
        lease_ms: c.lease_until.saturating_sub(rec.at).max(1),
        retention_ms: rec.expires.saturating_sub(rec.at),
        any_request: rec.kind == Kind::Release && rec.outcome_tag == RELEASE_ANY_REQUEST,
        abandoned: rec.kind == Kind::Release && rec.outcome_tag == RELEASE_ABANDONED,
        failed_at: match rec.kind {
            Kind::DeadLetter => rec.dead_letter_body()?.failed_at,
            _ => 0,
        },
        round: Round::of_record(rec, c.first_at)?,
    };
    let state = match rec.kind {
        Kind::Claim => SlotState::Claimed,
        Kind::Release => SlotState::Released,
        Kind::Complete => SlotState::Completed,
        Kind::Fail => SlotState::Failed,
        Kind::Forget => SlotState::Forgotten,
        Kind::DeadLetter => SlotState::DeadLettered,
        // Entity records are applied by `order::apply_entity_record`.
        Kind::Insert
        | Kind::Entity
        | Kind::Park
        | Kind::Hold
        | Kind::Intent
        | Kind::Tally
        | Kind::Keys
        | Kind::Amount => {
            return Ok(());
        }
    };
    shard.put(h, state, bucket, row);
    if matches!(
        state,
        SlotState::Claimed | SlotState::Released | SlotState::Forgotten | SlotState::DeadLettered
    ) {
        shard.set_pending(pending);
    } else {
        shard.remove_pending(h);
    }
    Ok(())
}
