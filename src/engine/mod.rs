//! The engine: the one synchronous core behind [`Store`](crate::Store).
//!
//! Every operation: validate, hash, lock the key's shard, decide and append
//! the log record under that lock (through the write primitive in
//! [`write`](mod@write)), unlock, then return the answer with the rows it
//! rests on (`types::Pending`): the face waits for them
//! ([`Engine::wait_basis`]) or awaits them ([`Engine::poll_basis`]) as the
//! mode requires (`src/contract.rs`).
//!
//! Rooms, by concern:
//! - [`recover`]: the file becomes the index (replaying the log), writing
//!   nothing; [`start`]: a recovered store made writable (the first
//!   commit, carrying what outlives expiry, the threads), or served
//!   read-only; [`format`](mod@format): the file's format, its upgrade
//!   and its verification;
//! - [`write`](mod@write): the write primitive every key write goes through;
//! - [`buckets`] and [`time`]: which bucket a record goes to and when it
//!   expires; the store's time, which never goes back;
//! - [`tokens`]: fencing tokens and their persisted floor;
//! - [`input`]: the checks every call makes on what it is given;
//! - [`dedup`] (insert-if-absent, forget), [`read`] (a key's record),
//!   [`history`] (every record of a key still in the log),
//!   [`claims`] (begin, complete, fail, renew), [`order`] (versions and the
//!   sequencer): the operations;
//! - [`dead_letter`]: the dead-letter area (exhausted operations, kept
//!   until requeued or resolved);
//! - [`intents`]: intents recorded before external calls (an outbox);
//! - [`answers`]: what the provider answered an operation's calls, and
//!   when it is a candidate for a duplicate effect;
//! - [`rounds`]: an operation's rounds of attempts (from its first attempt,
//!   and from each requeue), which retry limits count within;
//! - [`reconcile`]: per-window counts of completions (and, for a scope
//!   that keeps them, their keys); [`reconcile_keys`]: those keys against
//!   the system of record's;
//! - [`listings`]: what an operator lists (dead letters, held events,
//!   stranded claims), oldest first, paged;
//! - [`evict`]: retention, bucket by bucket; [`background`]: the threads;
//! - [`counters`]: store-wide counters and the [`Stats`](crate::Stats)
//!   snapshot;
//! - [`waiters`]: callers waiting for an in-flight result, per key;
//! - [`durable`]: waiting for what an answer rests on, blocking and as a
//!   poll; a call run with its waits deferred (`AsyncStore::call`).
//!
//! Invariants:
//! - a caller is told "new", "started" or "done" only after its record is
//!   durable (in `Immediate` mode), and is told "duplicate" or "in
//!   progress" only after the record it is answered from is durable;
//! - the slot is reserved before the record is queued, so a concurrent
//!   caller of the same key sees the reservation, never a second "new";
//! - a key's bucket never moves to an earlier one, so if any record of a key
//!   is live its latest record is live (recovery relies on this).
//!
//! The engine uses the index, the log and the shared vocabulary; it never
//! uses the public face (`api`), which wraps it.

pub(crate) mod answers;
pub(crate) mod background;
pub(crate) mod buckets;
pub(crate) mod claims;
pub(crate) mod config;
pub(crate) mod counters;
pub(crate) mod dead_letter;
pub(crate) mod dedup;
pub(crate) mod durable;
pub(crate) mod evict;
pub(crate) mod format;
pub(crate) mod history;
pub(crate) mod input;
pub(crate) mod intents;
pub(crate) mod listings;
pub(crate) mod order;
pub(crate) mod read;
pub(crate) mod reconcile;
pub(crate) mod reconcile_keys;
pub(crate) mod records;
pub(crate) mod recover;
pub(crate) mod rounds;
pub(crate) mod start;
pub(crate) mod time;
pub(crate) mod tokens;
pub(crate) mod waiters;
pub(crate) mod write;

use crate::clock::Clock;
use crate::index::ShardedIndex;
use crate::key::KeyHasher;
use crate::log::Log;
use crate::sync::Arc;

/// What the engine's rooms take from the log, named in one place (the open,
/// in `recover.rs` and `start.rs`, uses the log's opening vocabulary too):
/// where a log lives, its open batch, the async front's `Waiting`, what the replica ships through, the commit observer, and
/// the journal's setting (which the builder fills in).
pub(crate) use crate::log::{
    Batch, CommitObserver, JOURNAL_BYTES, JournalSetting, Location, ROW_SPLIT_BYTES, Ship, Waiting,
};
pub(crate) use background::Threads;
pub(crate) use claims::{Begun, Ticket};
pub(crate) use config::Config;
#[cfg(all(feature = "metrics", feature = "replica"))]
pub(crate) use config::DEFAULT_METRICS_LABEL;

/// The engine's state. Its fields are private to the engine's rooms; the
/// face calls its methods.
pub(crate) struct Engine {
    index: ShardedIndex,
    log: Log,
    hasher: KeyHasher,
    clock: Arc<dyn Clock>,
    cfg: Config,
    /// Fencing tokens: the next one, the first of this run, and the floor
    /// (see [`tokens`]).
    tokens: tokens::Tokens,
    /// Where records go, and how far eviction closed and evicted (see
    /// [`buckets`]).
    buckets: buckets::Buckets,
    /// The store's time: the highest time it has used (at open, at least
    /// the latest time it recorded). Only grows (see [`time`](mod@time)).
    time: time::StoreTime,
    counters: counters::StoreCounters,
    /// Callers waiting for an in-flight result, per key (see [`waiters`]).
    /// Shared with the log's poison hook, which wakes them all.
    waiters: Arc<waiters::KeyWaiters>,
    /// Called on every tick of the background evictor (a metrics bridge).
    tick_hook: std::sync::OnceLock<counters::TickHook>,
    /// The file, for a store opened by path (compaction checks its size).
    path: Option<std::path::PathBuf>,
}

impl Engine {
    /// The settings the store was opened with.
    pub(crate) fn config(&self) -> &Config {
        &self.cfg
    }

    /// Commits everything acknowledged so far and waits for it.
    pub(crate) fn flush(&self) -> crate::Result<()> {
        self.log.flush()
    }

    /// Compacts the file now.
    pub(crate) fn compact(&self) -> crate::Result<bool> {
        self.log.compact()
    }
}

impl Engine {
    /// Waits, in `Immediate` mode, until the record an answer is based on
    /// is durable.
    #[inline]
    pub(crate) fn settle_seen(&self, row: u64) -> crate::Result<()> {
        match self.cfg.durability {
            crate::Durability::Immediate => self.log.wait_durable(row),
            crate::Durability::Deferred { .. } => Ok(()),
        }
    }
}
