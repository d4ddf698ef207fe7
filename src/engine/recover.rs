//! Recovery: the file becomes the index and everything else the engine
//! starts from (the hasher, the floors, what expired tables still hold),
//! and nothing is written. [`start`](super::start) then makes the
//! recovered store writable, or, for a read-only open, serves it as is.
//!
//! Invariants:
//! - recovery writes nothing to an existing store: it reads the metadata,
//!   replays every table and builds the index in memory (what must be
//!   carried forward is handed to the start, which writes it); only a
//!   new file gets its metadata as it is created;
//! - recovery replays in log order, the last record of a key wins, and
//!   nothing expired is loaded — except entity records, which are applied
//!   from expired tables too, so entities that still have events are
//!   carried forward before those tables are deleted, and the records of
//!   reconciliation windows still kept (`reconcile`), carried likewise;
//! - a read-only open of one key (`Config::only_key`) replays the same
//!   rows and applies only that key's records, so the key reads as a full
//!   open reads it; the floors (time, fencing tokens) still come from
//!   every record;
//! - an open never yields fewer rows than the last commit recorded: in a
//!   format-5 file every bucket table's rows are checked against its
//!   summary during replay (see `log::summary`);
//! - a redb panic while opening is reported as damage, never a crash.

use std::path::{Path, PathBuf};

use super::dead_letter::{ExpiredDeadLetter, ExpiredDeadLetters};
use super::intents::{ExpiredIntent, ExpiredIntents};
use super::order::apply_entity_record;
use super::reconcile::{Recovered, TallyCarry};
use super::time::MAX_TIME;
use super::{Config, Engine};
use crate::clock::Clock;
use crate::index::intent::{IntentSlot, IntentState};
use crate::index::{Pending, Round, Shard, ShardedIndex, SlotState};
use crate::key::{KeyHash, KeyHasher};
use crate::log::{FileMeta, Location, RedbOptions, Replay, Replayed, Storage, open_database};
use crate::records::{
    INTENT_PENDING, INTENT_SETTLED, Kind, RELEASE_ABANDONED, RELEASE_ANY_REQUEST, RecordRef,
    SUMMARIES_FORMAT,
};
use crate::sync::{Arc, MutexGuard};
use crate::{Error, Result};

/// A recovered store: the index built from the file, and what the start
/// needs besides. Nothing of it has been written.
pub(crate) struct Recovery {
    pub(super) cfg: Config,
    pub(super) clock: Arc<dyn Clock>,
    /// The file, for a store opened by path.
    pub(super) path: Option<PathBuf>,
    pub(super) db: Storage,
    /// The file's settings, floors and manifest, as checked.
    pub(super) meta: FileMeta,
    pub(super) index: ShardedIndex,
    /// What replay found: the newest row, live and expired buckets, the
    /// tables' summaries.
    pub(super) replayed: Replayed,
    /// What expired tables hold that must outlive them (the start
    /// carries it into the open batch).
    pub(super) carried: Carried,
    /// The first fencing token of this run: above every recorded token
    /// and the persisted floor.
    pub(super) first_token: u64,
    /// The store's time: the persisted floor, raised to the latest
    /// record's time.
    pub(super) time_floor: u64,
    /// The store's time at the open (the clock, within the floors).
    pub(super) opened_at: u64,
    /// The bucket of `opened_at`: tables before it have expired.
    pub(super) now_bucket: u64,
}

/// What expired tables hold that must outlive them.
pub(crate) struct Carried {
    /// Dead letters no later record of their key superseded.
    pub(super) dead_letters: ExpiredDeadLetters,
    /// Pending intents no later record of their key superseded.
    pub(super) intents: ExpiredIntents,
    /// The counts and keys of kept reconciliation windows.
    pub(super) tallies: TallyCarry,
}

/// Runs `open` (recovery and start) for the store at `place`, in its
/// tracing span: a redb panic becomes [`Error::Corrupt`], and every
/// `Corrupt` names `place` and what to do (`read_only`: the file may
/// have been changed by a writer during the open).
pub(super) fn guarded<T>(
    (place, read_only): (Option<&Path>, bool),
    open: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let place = place.map_or_else(|| "the store".into(), |p| p.display().to_string());
    let _span = tracing::info_span!("dedupkv.recovery", place = %place).entered();
    // redb 4.6 can panic (rather than fail) on some damaged files; a
    // damaged file must be an error for the caller, not a crash.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(open))
        .unwrap_or_else(|panic| {
            let what = crate::error::panic_message(&*panic);
            Err(Error::Corrupt(format!(
                "the storage engine panicked while opening the file: {what}"
            )))
        })
        .map_err(|e| match e {
            Error::Corrupt(why) if read_only => Error::Corrupt(format!(
                "{place} is damaged, or a writer changed it during this read-only open ({why}); \
                 retry, or use the live admin endpoint (planned); if it persists, export what \
                 is readable, restore from a backup"
            )),
            Error::Corrupt(why) => Error::Corrupt(format!(
                "{place} is damaged ({why}); export what is readable, restore from a backup"
            )),
            other => other,
        })
}

impl Engine {
    /// Recovers the store at `location` (creating it if the location says
    /// so): opens and checks the file, replays its log into a new index.
    /// Writes nothing to an existing store.
    pub(super) fn recover(
        mut cfg: Config,
        clock: Arc<dyn Clock>,
        location: Location,
    ) -> Result<Recovery> {
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
                only: cfg.only_key.as_ref(),
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
        // expired: continue above the persisted floor (the start reserves
        // a block above it).
        let first_token = (max_token + 1).max(meta.token_floor).max(cfg.token_base);
        tracing::debug!(
            records = replayed.records,
            expired_buckets = replayed.expired.len(),
            "dedupkv store recovered"
        );
        Ok(Recovery {
            cfg,
            clock,
            path,
            db,
            meta,
            index,
            replayed,
            carried: Carried {
                dead_letters: expired_dead,
                intents: expired_intents,
                tallies: tally_carry,
            },
            first_token,
            time_floor,
            opened_at,
            now_bucket,
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
    /// The one key whose records are applied, if not all.
    only: Option<&'c (Vec<u8>, Vec<u8>)>,
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
        if let Some((scope, id)) = self.only {
            for r in recs {
                if r.rec.scope == scope.as_slice() && r.rec.id == id.as_slice() {
                    self.apply((r.bucket, row, r.expired), &r.rec, None)?;
                }
            }
            return Ok(());
        }
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

impl Config {
    /// The storage's own options (the cache, the page checks, quick repair).
    pub(crate) fn store_options(&self) -> RedbOptions {
        RedbOptions {
            cache_bytes: self.cache_bytes,
            verify_pages: self.verify_pages,
            quick_repair: self.quick_repair,
            // The operator's upgrade is the call that gives up a rollback:
            // it puts the journal in front of a store kept without one.
            journal: self.journal.clone().map(|mut j| {
                j.asked |= self.upgrade;
                j
            }),
        }
    }
}
