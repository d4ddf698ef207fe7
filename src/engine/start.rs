//! The start: a recovered store (see [`recover`](super::recover)) made
//! writable — the first commit, the carrying of what expired tables still
//! hold, the deletion of those tables, the background threads — or, for a
//! read-only open, the same start made in memory and then every write
//! refused.
//!
//! Invariants:
//! - the open makes its first commit itself and fails with that commit's
//!   error: a store that cannot write is never handed out;
//! - the first commit persists a block of fencing tokens above every one
//!   recovered (and rewrites a file of format 1 or 2 as format 3, or any
//!   older file as the newest format with [`Config::upgrade`]); the file
//!   keeps its format otherwise;
//! - what must outlive expiry (entities with events, dead letters,
//!   unanswered intents, kept reconciliation windows) is carried into
//!   live buckets in the commit that deletes the expired tables, or before
//!   it;
//! - a read-only open runs the same start on a file opened for reading
//!   only, whose every write stays in memory (`log::store::read_only`), so
//!   it answers what a writable open of the same file would; it then
//!   stops the committer, starts no thread, and every write answers
//!   [`Error::ReadOnly`](crate::Error::ReadOnly).

use std::path::PathBuf;
use std::time::Duration;

use super::buckets::Buckets;
use super::counters::StoreCounters;
use super::recover::{Recovery, guarded};
use super::time::StoreTime;
use super::tokens::{TOKEN_BLOCK, Tokens};
use super::{Config, Engine, Threads};
use crate::clock::Clock;
use crate::log::{Found, Location, Log, LogSettings};
use crate::sync::Arc;
use crate::{Durability, Result};

impl Engine {
    /// Opens (or creates) the store at `location`: recovery, then the
    /// start; returns the engine and its running threads.
    pub(crate) fn open(
        cfg: Config,
        clock: Arc<dyn Clock>,
        location: Location,
    ) -> Result<(Arc<Engine>, Threads)> {
        let path = location.path().map(std::path::Path::to_path_buf);
        guarded((path.as_deref(), false), || {
            let engine = Self::start(Self::recover(cfg, clock, location)?)?;
            let engine = Arc::new(engine);
            let threads = Threads::start(
                &engine,
                engine.cfg.background_eviction,
                Duration::from_millis(engine.cfg.granularity_ms.clamp(1, 1_000)),
            )?;
            Ok((engine, threads))
        })
    }

    /// Opens the store at `path` read-only: recovery and the start as
    /// [`open`](Self::open) makes them, on the file opened for reading
    /// only (every write redb makes stays in memory); no thread, and every
    /// later write answers [`Error::ReadOnly`](crate::Error::ReadOnly).
    pub(crate) fn open_read_only(
        mut cfg: Config,
        clock: Arc<dyn Clock>,
        path: PathBuf,
    ) -> Result<Arc<Engine>> {
        cfg.upgrade = false;
        cfg.background_eviction = false;
        cfg.durability = Durability::Immediate;
        cfg.quick_repair = false;
        guarded((Some(&path.clone()), true), || {
            let mut engine =
                Self::start(Self::recover(cfg, clock, Location::ReadOnly(path.clone()))?)?;
            engine.log.stop_writing(path);
            Ok(Arc::new(engine))
        })
    }

    /// Makes the recovered store writable: the log and its first commit,
    /// then the carrying of what expired tables hold, committed with the
    /// deletion of those tables.
    fn start(r: Recovery) -> Result<Engine> {
        let log = Log::start(
            r.db,
            Found {
                last_row: r.replayed.last_row,
                buckets: r.replayed.live.iter().copied().collect(),
                manifest: r.meta.manifest,
                summaries: r.replayed.summaries,
                format: r.meta.format,
            },
            // Reserves a block of fencing tokens, persisted by the first
            // commit.
            r.first_token + TOKEN_BLOCK,
            r.cfg.log_settings(),
        )
        // The first commit: an open that cannot write (a full disk, a
        // damaged page) fails here, saying why, instead of handing out a
        // store whose every call then fails.
        .map_err(|e| crate::error::at_path(e, r.path.as_deref()))?;
        let time = StoreTime::starting_at(r.time_floor.max(r.opened_at), r.clock.elapsed_millis());
        let engine = Engine {
            index: r.index,
            log,
            hasher: r.meta.hasher,
            clock: r.clock,
            cfg: r.cfg,
            tokens: Tokens::starting_at(r.first_token),
            time,
            buckets: Buckets::after_replay(r.now_bucket),
            counters: StoreCounters::default(),
            waiters: Arc::default(),
            tick_hook: std::sync::OnceLock::new(),
            path: r.path,
        };
        // A poisoned log (a failed commit, the replica's fence) wakes every
        // `begin_or_wait` at once, to answer the poison. A poison before
        // this is seen by their first `begin`: nobody could wait yet.
        let waiters = Arc::clone(&engine.waiters);
        engine.log.on_poison(Box::new(move || waiters.wake_all()));
        // The expired tables go once the entities that still have events
        // are carried out of them: the carried records are committed in the
        // deletion's commit or before it.
        engine.carry_expired(r.now_bucket)?;
        engine.carry_expired_dead_letters(r.carried.dead_letters)?;
        engine.carry_expired_intents(r.carried.intents)?;
        engine.carry_tallies(&r.carried.tallies, engine.now())?;
        engine.log.drop_buckets(&r.replayed.expired)?;
        Ok(engine)
    }
}

impl Config {
    /// How the log commits, from these settings.
    pub(crate) fn log_settings(&self) -> LogSettings {
        LogSettings {
            durability: self.durability,
            split_at: self.row_split_bytes,
            time_step: self.granularity_ms,
            upgrade: self.upgrade,
            ship: self.ship.clone(),
        }
    }
}
