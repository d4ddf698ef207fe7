//! dedupkv's operation-level contract ([`dedupkv::contract`]) on
//! PostgreSQL: one table shared by every instance of a service, each
//! decision made by the database (issue #31, first landing).
//!
//! Several stateless instances behind a load balancer open a [`PgStore`]
//! on the same database and schema; a retried request that lands on any
//! of them, or two copies landing on two of them at once, is decided once:
//! of concurrent [`begin`](Write::begin)s of one key exactly one is told
//! `Started`, on whichever instance.
//!
//! # What it implements
//! [`Read`], [`Write`] and [`Settle`]: `insert` / `insert_batch`, `begin` /
//! `begin_batch` with leases, fencing tokens and fingerprints, `complete` /
//! `complete_batch` / `fail` / `renew` keyed by the fencing token, `forget`,
//! `get`. [`DeadLetters`]: `fail` with
//! `Failure::Exhausted`, `requeue`, `resolve`. [`Intents`](dedupkv::contract::Intents): `begin` with an
//! intent, `mark_answered`, the provider key every instance derives, and
//! [`PgStore::intent`], [`PgStore::pending_intents`],
//! [`PgStore::duplicate_candidates`]. [`Order`](dedupkv::contract::Order): versions (`advance`,
//! `apply_event`, expiring as records do) and the sequencer (`sequence`,
//! `release_held`, `ack`, and [`PgStore::sweep_parked`]).
//! [`PgStore::begin_or_wait`]: waiting across instances, woken by
//! `LISTEN`/`NOTIFY`. Retention by the database's clock, with
//! [`PgStore::evict_expired`] (batched deletes; why not time partitions:
//! see there). [`PgStore::dead_letters`] lists the dead-letter area.
//! An optional local cache of finished records ([`PgStoreBuilder::cache`]):
//! a repeat of a completed key answered with no round trip.
//!
//! # How each decision is made
//! - `insert` / `insert_batch`: one `INSERT … ON CONFLICT DO UPDATE … WHERE
//!   state = forgotten RETURNING` statement over `unnest`ed arrays (a batch
//!   is one multi-row statement): a row comes back for each new key. Its
//!   keys are sent in key order, so concurrent statements lock rows in one
//!   order and never deadlock. Concurrent `insert`s of one instance share
//!   such a statement (client-side group commit,
//!   [`PgStoreBuilder::group_commit`]).
//! - `begin`: `INSERT … ON CONFLICT DO NOTHING RETURNING` of attempt 1 (one
//!   statement); when the key has a row, a plain `SELECT` answers if the
//!   answer writes nothing (`Completed`, `InProgress`, a fingerprint
//!   mismatch); otherwise, in one transaction, `SELECT … FOR UPDATE`, the
//!   decision again on the locked row, and the takeover, an `UPDATE` with a
//!   new fencing token from a sequence.
//! - `complete`, `fail`, `renew`, and a dropped claim's release: one
//!   conditional `UPDATE … WHERE key AND token = the claim's AND state = in
//!   progress` each; no row updated is [`Error::ClaimLost`]. A zombie is
//!   refused by the database, not by a local check.
//! - `forget`: `SELECT … FOR UPDATE`, then the `UPDATE`, in one transaction.
//! - `fail` with `Failure::Exhausted`: the conditional `UPDATE` of
//!   `complete`, to state dead-lettered; `requeue` and `resolve`: one
//!   `UPDATE … WHERE state = dead-lettered` each.
//! - `begin` with an intent: its columns written by the claim's own
//!   statement (the `INSERT` or the takeover's `UPDATE`);
//!   `mark_answered`: one conditional `UPDATE` by the claim's token.
//! - `advance`: one `INSERT … ON CONFLICT DO UPDATE … RETURNING` on the
//!   entity's row; `apply_event`: the event's insert and the advance in one
//!   transaction.
//! - `sequence`, `release_held`, `ack`: one transaction under the entity's
//!   row lock (an `INSERT … ON CONFLICT DO UPDATE` that makes or locks it,
//!   or `SELECT … FOR UPDATE`), its stored events read, the engine's
//!   decision made on them, what changed written back.
//! - Every statement that ends an attempt a waiter marked also notifies
//!   the channel `dedupkv_done` (`pg_notify` in the same statement, sent
//!   at its commit): what [`PgStore::begin_or_wait`] sleeps on. Attempts
//!   nobody waits for end without a `NOTIFY`: PostgreSQL commits notifying
//!   transactions one at a time.
//!
//! Nothing is read and then written without the row lock. Every answer is
//! given after its transaction committed, so every [`Pending`] is
//! [`Basis::SETTLED`](dedupkv::contract::Basis::SETTLED).
//!
//! # Time
//! Lease time is the database's: `clock_timestamp()` in milliseconds since
//! the Unix epoch, read inside the deciding statement, never an instance's
//! clock. A test may give the store a [`Clock`] instead
//! ([`PgStoreBuilder::clock`]): its reading is then passed to every
//! statement in place of the database's (the conformance suite moves a
//! manual clock).
//!
//! # What it needs from the database
//! PostgreSQL 9.5 or newer (15 is tested), or an engine that speaks its
//! protocol and has: `INSERT … ON CONFLICT (…) DO NOTHING` and `DO UPDATE
//! … WHERE` atomic under concurrent inserts of one key; `RETURNING`;
//! `SELECT … FOR UPDATE` row locks; `UPDATE … FROM unnest(…)`; sequences;
//! transaction-scoped advisory locks (schema creation only); `LISTEN` and
//! `pg_notify` (`begin_or_wait` only); at least READ
//! COMMITTED isolation (the default; a conditional `UPDATE` re-checks its
//! `WHERE` on the row's latest version). Answers are durable as the
//! server's `synchronous_commit` makes commits (on, by default).
//!
//! # In async code
//! Every call blocks its thread for a round trip or more: from async code,
//! run the calls in `spawn_blocking` (as `dedupkv-http` does). Opening a
//! store and dropping a store or an unfinished claim work on a runtime's
//! thread too: the blocking client they need runs off it (the `postgres`
//! client would otherwise panic there, starting a runtime inside one).
//!
//! # Schema
//! Created by [`PgStoreBuilder::open`] in its schema (default `dedupkv`):
//! `dedupkv_schema_version`, `dedupkv_keys`, `dedupkv_versions` (one row
//! per entity), `dedupkv_events` (the sequencer's stored events) and the
//! sequence `dedupkv_token`, at [`SCHEMA_VERSION`] 6. An older schema is
//! migrated in place by the next open, under the same advisory lock: the
//! dead-letter columns (2), the intent columns and the versions' table
//! (3), the waiters' mark (4), the sequencer's columns, the entities'
//! expiry and the events' table (5), and the claims' rounds and the
//! completions' table `dedupkv_completions` (6) are added. A schema written by
//! a newer build is refused with [`Error::InvalidConfig`] naming it.
//!
//! # Examples
//! ```no_run
//! use dedupkv::contract::{Outcome, Settle, Write};
//! use dedupkv::{Began, BeginOptions, Fingerprint, Key};
//! use dedupkv_postgres::PgStore;
//!
//! let store = PgStore::connect("host=127.0.0.1 user=postgres dbname=postgres")?;
//! let key = Key::new("shop-42", "order-7");
//! let p = store.begin(&key, Fingerprint::of("2 parcels"), &BeginOptions::new(), None)?;
//! if let Began::Started(claim) = store.tell(p)? {
//!     // ... charge the card ...
//!     store.tell(store.complete(&claim, Outcome::raw(b"ch_1"))?)?;
//! }
//! # Ok::<(), dedupkv::Error>(())
//! ```

#![allow(clippy::doc_markdown)] // product names (PostgreSQL) are not code

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(doc)]
use dedupkv::contract::DeadLetters;
use dedupkv::contract::{
    BegunBatch, Completion, Handle, Outcome, Pending, Read, Settle, SharedClaim, Tallies, Write,
};
use dedupkv::{
    Began, BeginOptions, Clock, DeadLetter, Error, Failure, Fingerprint, Forget, InProgress,
    Intent, Key, Record, Result, State, Tally,
};
use parking_lot::Mutex;
use postgres::{Client, NoTls, Statement};

mod cache;
mod dead_letters;
mod group;
mod intents;
mod listings;
mod order;
mod sequencer;
mod sql;
mod wait;

use sql::{
    COMPLETED, DEAD_LETTERED, FAILED, FORGOTTEN, IN_PROGRESS, INSERTED, Q, RETRYABLE, STATEMENTS,
    Sql,
};

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 6;

/// The store's default claim lease (the engine's default).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The store's default retention: how long a record is kept after its
/// last write (a day).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(86_400);

/// How many grouped insert statements one instance has in flight at once
/// by default ([`PgStoreBuilder::group_commit`]).
pub const DEFAULT_GROUP_COMMIT: usize = 4;

/// Rows [`PgStore::evict_expired`] deletes per statement.
pub const EVICT_BATCH: i64 = 10_000;

/// The longest scope, id and outcome accepted, in bytes (the engine's
/// defaults; a key is part of the primary key's B-tree entry).
pub const MAX_SCOPE: usize = 256;
/// See [`MAX_SCOPE`].
pub const MAX_ID: usize = 1024;
/// See [`MAX_SCOPE`].
pub const MAX_OUTCOME: usize = 1 << 20;

/// Fails, before anything is sent, for an empty scope or id (as the
/// engine: an empty id is a missing key) and for parts over the limits.
fn check_key(key: &Key<'_>) -> Result<()> {
    for (what, part, limit) in [("scope", key.scope(), MAX_SCOPE), ("id", key.id(), MAX_ID)] {
        if part.is_empty() {
            return Err(Error::InvalidArgument {
                what,
                reason: "is empty; a key needs a non-empty scope and id".into(),
            });
        }
        check_len(what, part.len(), limit)?;
    }
    Ok(())
}

fn check_len(what: &'static str, len: usize, limit: usize) -> Result<()> {
    if len > limit {
        return Err(Error::InvalidInput { what, len, limit });
    }
    Ok(())
}

/// What the instance shares with its claims: the pool, the statements,
/// the settings.
struct Shared {
    url: String,
    /// The schema's name (waiters match notifications by it).
    schema: String,
    sql: Sql,
    idle: Mutex<Vec<Conn>>,
    max_idle: usize,
    /// Concurrent inserts' shared statements (`None`: one each).
    group: Option<group::Group>,
    clock: Option<Arc<dyn Clock>>,
    lease_ms: i64,
    /// How long a record is kept after its last write, when the call
    /// names no retention.
    retention_ms: i64,
    /// The sequencer's settings and the entities' retention
    /// ([`PgStoreBuilder::entities`]).
    entities: Entities,
    /// Finished records answered from memory ([`PgStoreBuilder::cache`]).
    cache: Option<cache::Cache>,
    /// Connections taken from the pool ([`PgStore::checkouts`]).
    checkouts: AtomicU64,
    /// The reconciliation window and its counts' retention, ms.
    tallies: (i64, i64),
    /// Where this store's rows are: the URL and the schema. A claim is
    /// finished only by a store of the same origin.
    origin: Arc<str>,
}

/// One pooled connection and its prepared statements.
struct Conn {
    client: Client,
    stmts: [Option<Statement>; STATEMENTS],
}

impl Conn {
    fn stmt(&mut self, sql: &Sql, q: Q) -> Result<Statement> {
        let slot = &mut self.stmts[q as usize];
        if let Some(s) = slot {
            return Ok(s.clone());
        }
        let s = self.client.prepare(&sql.0[q as usize]).map_err(storage)?;
        *slot = Some(s.clone());
        Ok(s)
    }
}

/// A connection taken from the pool, given back when dropped (unless it
/// broke).
struct Pooled<'a> {
    shared: &'a Shared,
    conn: Option<Conn>,
}

impl Pooled<'_> {
    fn conn(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("present until dropped")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take()
            && !c.client.is_closed()
        {
            let mut idle = self.shared.idle.lock();
            if idle.len() < self.shared.max_idle {
                idle.push(c);
                return;
            }
            drop(idle);
            off_runtime(move || drop(c));
        }
    }
}

impl Drop for Shared {
    /// Closes the pool's connections, off any async runtime (see
    /// [`off_runtime`]): a store dropped in async code must not panic.
    fn drop(&mut self) {
        let idle = std::mem::take(self.idle.get_mut());
        if !idle.is_empty() {
            off_runtime(move || drop(idle));
        }
    }
}

/// Runs `f` here, or on a thread of its own when called from inside a
/// tokio runtime: the blocking `postgres` client runs each call (and its
/// close) on a runtime of its own, which tokio refuses to start inside
/// another — it panics. So opening a store, and dropping a store or a
/// claim, work in async code too (they block the calling thread, as every
/// call of this store does; from async code run the calls themselves in
/// `spawn_blocking`).
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| s.spawn(f).join()).unwrap_or_else(|p| std::panic::resume_unwind(p))
}

impl Shared {
    fn pooled(&self) -> Result<Pooled<'_>> {
        self.checkouts.fetch_add(1, Ordering::Relaxed);
        let conn = match self.idle.lock().pop() {
            Some(c) => c,
            None => Conn {
                client: connect(&self.url)?,
                stmts: Default::default(),
            },
        };
        Ok(Pooled {
            shared: self,
            conn: Some(conn),
        })
    }

    /// A call's retention in ms: its own, or the store's.
    fn retention_of(&self, retention: Option<Duration>) -> Result<i64> {
        match retention {
            Some(r) if r < Duration::from_millis(1) => Err(Error::InvalidArgument {
                what: "retention",
                reason: format!("{r:?} is shorter than 1 ms"),
            }),
            Some(r) => Ok(ms(r)),
            None => Ok(self.retention_ms),
        }
    }

    /// The cache's ticket for a read about to be sent (`None`: no cache).
    fn ticket(&self) -> Option<cache::Ticket> {
        self.cache.as_ref().map(cache::Cache::ticket)
    }

    /// The cached final record of `key`, if the cache has it.
    fn cached(&self, key: &Key<'_>) -> Option<Record> {
        self.cache.as_ref()?.get(key, self.now())
    }

    /// `begin`'s answer from the cache, if it has `key`: the record, or
    /// the mismatch of another request (as the database would answer).
    fn cached_begin(&self, key: &Key<'_>, fp: Fingerprint) -> Option<Result<Began<PgClaim>>> {
        let rec = self.cached(key)?;
        Some(match rec.fingerprint() {
            Some(recorded) if recorded != fp => Err(Error::FingerprintMismatch {
                key: format!("{key:?}"),
                recorded,
                requested: fp,
            }),
            _ => Ok(Began::Completed(rec)),
        })
    }

    /// Keeps `key`'s row `r` (read with `Q::Peek`, after `ticket`) in the
    /// cache if its record is final (completed or failed) and live.
    fn remember(&self, ticket: Option<cache::Ticket>, key: &Key<'_>, r: &postgres::Row) {
        let (Some(cache), Some(ticket)) = (&self.cache, ticket) else {
            return;
        };
        let Ok(row) = Row::from(r) else { return };
        let now: i64 = r.get(11);
        if !matches!(row.state, COMPLETED | FAILED) || row.expired(now) {
            return;
        }
        if let Ok(rec) = row.record(key.clone().into_owned()) {
            cache.put(ticket, rec, (row.expires_at, now), self.clock.is_some());
        }
    }

    /// The time passed to statements: the clock's, or `None` for the
    /// database's own.
    fn now(&self) -> Option<i64> {
        self.clock
            .as_ref()
            .map(|c| i64::try_from(c.now_millis()).unwrap_or(i64::MAX))
    }
}

fn connect(url: &str) -> Result<Client> {
    Client::connect(url, NoTls).map_err(|e| {
        let text = format!("connecting to PostgreSQL: {}", describe(&e));
        Error::Storage(std::io::Error::other(Described { text, source: e }).into())
    })
}

/// A PostgreSQL error as the store's storage error, told in full
/// ([`describe`]; the client error is its source).
fn storage(e: postgres::Error) -> Error {
    let text = describe(&e);
    Error::Storage(std::io::Error::other(Described { text, source: e }).into())
}

/// A PostgreSQL error told in full. The client's own text is only "db
/// error" for anything the server says, and a kind ("error connecting to
/// server") for its own: the server's severity, SQLSTATE code, message,
/// detail and hint, or the client's text and each cause's.
pub(crate) fn describe(e: &postgres::Error) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    if let Some(db) = e.as_db_error() {
        let _ = write!(
            text,
            "PostgreSQL {} {}: {}",
            db.severity(),
            db.code().code(),
            db.message()
        );
        if let Some(detail) = db.detail() {
            let _ = write!(text, " (detail: {detail})");
        }
        if let Some(hint) = db.hint() {
            let _ = write!(text, " (hint: {hint})");
        }
        return text;
    }
    let _ = write!(text, "{e}");
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let _ = write!(text, ": {c}");
        cause = c.source();
    }
    text
}

/// A client error with the text [`describe`] made of it.
#[derive(Debug)]
struct Described {
    text: String,
    source: postgres::Error,
}

impl std::fmt::Display for Described {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Described {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn at(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The provider key the database computed (`sql::provider_key`: 32 hex
/// digits).
fn provider_key_of(hex: &str) -> Result<u128> {
    u128::from_str_radix(hex, 16)
        .map_err(|e| Error::Corrupt(format!("provider key {hex:?} from the database: {e}")))
}

fn fp_bytes(fp: Fingerprint) -> Vec<u8> {
    fp.0.to_be_bytes().to_vec()
}

fn state_of(s: i16) -> Result<State> {
    Ok(match s {
        INSERTED => State::Inserted,
        IN_PROGRESS => State::InProgress,
        RETRYABLE => State::Retryable,
        COMPLETED => State::Completed,
        FAILED => State::Failed,
        FORGOTTEN => State::Forgotten,
        DEAD_LETTERED => State::DeadLettered,
        other => return Err(Error::Corrupt(format!("unknown row state {other}"))),
    })
}

/// One key's row, as read.
struct Row {
    state: i16,
    fp: Vec<u8>,
    attempt: i32,
    first_at: i64,
    lease_until: i64,
    abandoned: bool,
    any_fp: bool,
    outcome: Vec<u8>,
    failed_at: i64,
    first_failed_at: i64,
    payload: Option<Vec<u8>>,
    expires_at: i64,
    provider_key: u128,
    intent: Option<intents::Stored>,
    updated_at: i64,
}

impl Row {
    fn from(r: &postgres::Row) -> Result<Row> {
        let get = |e: postgres::Error| {
            Error::Corrupt(format!("a dedupkv_keys row: {}", crate::describe(&e)))
        };
        Ok(Row {
            state: r.try_get(0).map_err(get)?,
            fp: r.try_get(1).map_err(get)?,
            attempt: r.try_get(2).map_err(get)?,
            first_at: r.try_get(5).map_err(get)?,
            lease_until: r.try_get(6).map_err(get)?,
            abandoned: r.try_get(8).map_err(get)?,
            any_fp: r.try_get(9).map_err(get)?,
            outcome: r.try_get(10).map_err(get)?,
            failed_at: r.try_get(12).map_err(get)?,
            first_failed_at: r.try_get(13).map_err(get)?,
            payload: r.try_get(14).map_err(get)?,
            expires_at: r.try_get(15).map_err(get)?,
            provider_key: provider_key_of(r.try_get(16).map_err(get)?)?,
            intent: intents::Stored::from(r, 17)?,
            updated_at: r.try_get(25).map_err(get)?,
        })
    }

    /// Whether the row expired at `now` (then it is absent).
    fn expired(&self, now: i64) -> bool {
        self.expires_at > 0 && self.expires_at <= now && self.state != DEAD_LETTERED
    }

    fn attempt(&self) -> u32 {
        u32::try_from(self.attempt).unwrap_or(0)
    }

    fn fingerprint(&self) -> Fingerprint {
        let mut b = [0u8; 16];
        if self.fp.len() == 16 {
            b.copy_from_slice(&self.fp);
        }
        Fingerprint(u128::from_be_bytes(b))
    }

    fn record(&self, key: Key<'static>) -> Result<Record> {
        let state = state_of(self.state)?;
        // A row last written before schema version 3 has no update time:
        // its first is the best known. A dead letter never expires here
        // (`expires_at` 0): it is kept at least until the latest time
        // the column can hold.
        let updated = if self.updated_at > 0 {
            self.updated_at
        } else {
            self.first_at
        };
        let expires = if self.expires_at > 0 {
            self.expires_at
        } else {
            i64::MAX
        };
        let rec = Record::new(key, state)
            .with_attempts(self.attempt())
            .with_times(at(self.first_at), at(updated), at(expires));
        let rec = if state == State::Inserted {
            rec
        } else {
            rec.with_fingerprint(self.fingerprint())
                .with_provider_key(self.provider_key)
        };
        Ok(match state {
            State::Completed | State::Failed | State::DeadLettered => {
                rec.with_outcome(self.outcome.clone())
            }
            _ => rec,
        })
    }

    /// The dead letter of a `DEAD_LETTERED` row (its reason is the
    /// outcome; a round with no earlier failure began at the last).
    fn dead_letter(&self, key: Key<'static>) -> Result<DeadLetter> {
        let first = if self.first_failed_at > 0 {
            self.first_failed_at
        } else {
            self.failed_at
        };
        Ok(DeadLetter::new(
            self.record(key)?,
            at(first),
            at(self.failed_at),
            String::from_utf8_lossy(&self.outcome).into_owned(),
            self.payload.clone(),
        ))
    }

    fn in_progress(&self) -> InProgress {
        InProgress::new(self.attempt(), at(self.lease_until), at(self.first_at))
    }
}

/// The contract on PostgreSQL: a handle on one database schema, shared by
/// every instance that opens the same one. Cheap to share across threads
/// (`Sync`) and to clone (one pool, shared: keep a clone beside a
/// `Store` opened on it with `StoreBuilder::open_shared` for the calls
/// only this backend has, such as its listings); its connections are
/// pooled.
///
/// A call whose connection breaks (a server restart, a failover, a
/// firewall dropping idle connections) fails with [`Error::Storage`]
/// saying "connection closed", and is not sent again: a write may have
/// landed before the answer was lost, so `begin` the key again (it
/// replays a completion that landed) or `get` it. The broken connection
/// leaves the pool, so after a restart each idle connection fails at
/// most one call and the calls after it reconnect.
///
/// # Examples
/// ```no_run
/// use dedupkv::contract::{Settle, Write};
/// use dedupkv::Key;
/// use dedupkv_postgres::PgStore;
///
/// let store = PgStore::connect("host=127.0.0.1 user=postgres dbname=postgres")?;
/// assert!(store.tell(store.insert(&Key::new("webhooks", "evt_1"), None)?)?);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Clone)]
pub struct PgStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("statements_for", &self.shared.sql.0[Q::Peek as usize])
            .finish_non_exhaustive()
    }
}

/// How to open a [`PgStore`]: the schema, the default lease, the clock
/// (tests only), the pool's size.
///
/// # Examples
/// ```no_run
/// use dedupkv_postgres::PgStore;
/// use std::time::Duration;
///
/// let store = PgStore::builder("host=127.0.0.1 user=postgres dbname=postgres")
///     .schema("payments")
///     .lease(Duration::from_secs(10))
///     .open()?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[must_use]
pub struct PgStoreBuilder {
    url: String,
    schema: String,
    lease: Duration,
    retention: Duration,
    clock: Option<Arc<dyn Clock>>,
    max_idle: usize,
    group_commit: usize,
    entities: Entities,
    cache: (usize, Duration),
    /// The reconciliation window and how long its counts are kept after
    /// its end ([`PgStoreBuilder::reconcile`]).
    tallies: (Duration, Duration),
}

/// The default reconciliation window ([`PgStoreBuilder::reconcile`]):
/// one hour, as the engine's.
pub const DEFAULT_RECONCILE_WINDOW: Duration = Duration::from_secs(3600);
/// How long a window's counts are kept after its end by default
/// ([`PgStoreBuilder::reconcile`]): 7 days, as the engine's.
pub const DEFAULT_RECONCILE_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// How long a cached record answers at most by default
/// ([`PgStoreBuilder::cache_max_age`]).
pub const DEFAULT_CACHE_MAX_AGE: Duration = Duration::from_secs(60);

/// The entities' settings (versions and the sequencer), each as the
/// engine's of the same name and with its default.
///
/// # Examples
/// See [`PgStoreBuilder::entities`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entities {
    /// How long an entity (its version and sequencer position) is kept
    /// after its last change while it stores no event (one that stores
    /// events never expires). Default 7 days.
    pub retention: Duration,
    /// How long a gap may stay open before the events parked behind it
    /// move to the holding area (at the entity's next `sequence`).
    /// Default 5 minutes.
    pub max_hold: Duration,
    /// How long what the sequencer hands back is held for its caller
    /// when the call names no lease. Default 30 s.
    pub handback_lease: Duration,
}

impl Default for Entities {
    fn default() -> Self {
        Entities {
            retention: Duration::from_secs(7 * 86_400),
            max_hold: Duration::from_secs(300),
            handback_lease: DEFAULT_LEASE,
        }
    }
}

impl Entities {
    /// The defaults (see the fields).
    ///
    /// # Examples
    /// See [`PgStoreBuilder::entities`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`retention`](Self::retention).
    ///
    /// # Examples
    /// See [`PgStoreBuilder::entities`].
    #[must_use]
    pub fn retention(mut self, d: Duration) -> Self {
        self.retention = d;
        self
    }

    /// Sets [`max_hold`](Self::max_hold).
    ///
    /// # Examples
    /// See [`PgStoreBuilder::entities`].
    #[must_use]
    pub fn max_hold(mut self, d: Duration) -> Self {
        self.max_hold = d;
        self
    }

    /// Sets [`handback_lease`](Self::handback_lease).
    ///
    /// # Examples
    /// See [`PgStoreBuilder::entities`].
    #[must_use]
    pub fn handback_lease(mut self, d: Duration) -> Self {
        self.handback_lease = d;
        self
    }
}

impl PgStoreBuilder {
    /// The entities' settings: their retention and the sequencer's hold
    /// and hand-back lease. Default [`Entities::default`] (the engine's
    /// defaults); each at least 1 ms.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv_postgres::{Entities, PgStore};
    /// use std::time::Duration;
    ///
    /// let store = PgStore::builder("host=127.0.0.1 user=postgres dbname=postgres")
    ///     .entities(Entities::new().max_hold(Duration::from_secs(60)).retention(Duration::from_secs(86_400)))
    ///     .open()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn entities(mut self, entities: Entities) -> Self {
        self.entities = entities;
        self
    }

    /// Keeps up to `entries` finished records (completed, or failed for
    /// good) in this instance's memory, so a repeat `begin` or `get` of
    /// such a key is answered with no round trip (the oldest entry goes
    /// when it is full). Default 0: no cache.
    ///
    /// What it never does: answer "absent", "in progress", or any state
    /// that can still change (nothing but a final record read from the
    /// database is kept); answer past the record's expiry (measured from
    /// the database's time of the read); or answer after a `forget` of the
    /// key by this instance. A `forget` on **another** instance is not seen
    /// here: this instance may answer the forgotten record for up to
    /// [`cache_max_age`](Self::cache_max_age) after it read it. Leave the
    /// cache off where keys are forgotten on purpose and must be
    /// claimable again at once from every instance.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv_postgres::PgStore;
    /// use std::time::Duration;
    ///
    /// let store = PgStore::builder("host=127.0.0.1 user=postgres dbname=postgres")
    ///     .cache(100_000)
    ///     .cache_max_age(Duration::from_secs(10))
    ///     .open()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn cache(mut self, entries: usize) -> Self {
        self.cache.0 = entries;
        self
    }

    /// The longest a cached record answers after it was read (default
    /// [`DEFAULT_CACHE_MAX_AGE`]): the bound on how long a `forget` on
    /// another instance goes unseen by this one. At least 1 ms.
    ///
    /// # Examples
    /// See [`cache`](Self::cache).
    pub fn cache_max_age(mut self, max_age: Duration) -> Self {
        self.cache.1 = max_age;
        self
    }

    /// The PostgreSQL schema (namespace) of the tables: lowercase ASCII
    /// letters, digits and `_`, not starting with a digit, at most 63
    /// bytes. Default `dedupkv`. Instances that share keys open the same.
    ///
    /// # Examples
    /// See [`PgStoreBuilder`].
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// How long a record is kept after its last write when the call names
    /// no retention (default [`DEFAULT_RETENTION`]); at least 1 ms. A
    /// claim is kept to its lease end at least; a dead letter never
    /// expires. Expiry is by the database's clock; an expired row is
    /// absent to every call at once and deleted by
    /// [`PgStore::evict_expired`].
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// let store = dedupkv_postgres::PgStore::builder("host=127.0.0.1 user=postgres")
    ///     .retention(Duration::from_secs(7 * 86_400))
    ///     .open()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The claims' lease when `begin`'s options name none (default
    /// [`DEFAULT_LEASE`]); at least 1 ms.
    ///
    /// # Examples
    /// See [`PgStoreBuilder`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Takes lease time from `clock` instead of the database's clock: for
    /// tests that move time by hand. Instances on one database must agree
    /// on time, so production leaves this unset. Times are `int8`
    /// milliseconds in the table: a clock so far ahead that a time plus a
    /// lease or retention passes `i64::MAX` ms (about 292 million years)
    /// fails each write with the server's `22003` (out of range), and
    /// nothing is recorded.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv::ManualClock;
    /// use dedupkv_postgres::PgStore;
    ///
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = PgStore::builder("host=127.0.0.1 user=postgres dbname=postgres")
    ///     .schema("test_1")
    ///     .clock(clock.clone())
    ///     .open()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// How many idle connections the pool keeps (default 16); more are
    /// opened while more callers are busy at once, and closed after.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv_postgres::PgStore;
    ///
    /// let store = PgStore::builder("host=127.0.0.1 user=postgres dbname=postgres")
    ///     .max_idle(4)
    ///     .open()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn max_idle(mut self, n: usize) -> Self {
        self.max_idle = n;
        self
    }

    /// The reconciliation window (default 1 hour) and how long a window's
    /// counts are kept after its end (default 7 days), as the engine's
    /// `reconcile_window` and `reconcile_retention`: every completion is
    /// counted, with its amount, in the window of the database's time when
    /// it completed ([`Tallies`]). Instances of one schema must agree on
    /// the window. `open` fails with [`Error::InvalidConfig`] for a window
    /// under 1 ms or longer than the retention.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv_postgres::PgStore;
    /// use std::time::Duration;
    ///
    /// let store = PgStore::builder("host=127.0.0.1 user=postgres dbname=postgres")
    ///     .reconcile(Duration::from_secs(15 * 60), Duration::from_secs(30 * 86_400))
    ///     .open()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn reconcile(mut self, window: Duration, retention: Duration) -> Self {
        self.tallies = (window, retention);
        self
    }

    /// Client-side group commit of [`insert`](Write::insert): callers of
    /// this instance inserting at the same moment share one multi-row
    /// statement (one transaction, one commit), with at most `statements`
    /// of them in flight at once; `0` sends each insert alone. Default
    /// [`DEFAULT_GROUP_COMMIT`]. Answers are unchanged: each is given after
    /// the commit that decided it, and of concurrent inserts of one key
    /// exactly one is told new. A statement that fails fails every insert
    /// it carried (as [`Error::Storage`] with the server's message). An
    /// insert is sent at once when no statement is in flight (a lone
    /// caller never waits for company); beside one in flight, the queue
    /// goes when it holds its share (one `statements`th) of the inserts
    /// waiting, else when a statement ends. `insert_batch` is one
    /// statement already and is not grouped.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv_postgres::PgStore;
    ///
    /// let store = PgStore::builder("host=127.0.0.1 user=postgres dbname=postgres")
    ///     .group_commit(0) // one statement per insert
    ///     .open()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn group_commit(mut self, statements: usize) -> Self {
        self.group_commit = statements;
        self
    }

    /// Connects, creates the schema if it is absent (under an advisory
    /// lock, so instances starting together create it once) and checks
    /// its version.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad schema name or lease, or a
    /// schema written by a newer build (naming its version table);
    /// [`Error::Storage`] when the server cannot be reached or refuses.
    ///
    /// # Examples
    /// See [`PgStoreBuilder`].
    pub fn open(self) -> Result<PgStore> {
        let s = &self.schema;
        let valid = !s.is_empty()
            && s.len() <= 63
            && !s.as_bytes()[0].is_ascii_digit()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(Error::InvalidConfig(format!(
                "PostgreSQL schema name {s:?}: use lowercase ASCII letters, digits and '_', \
                 not starting with a digit, at most 63 bytes"
            )));
        }
        if self.retention < Duration::from_millis(1) {
            return Err(Error::InvalidConfig(format!(
                "retention {:?}: must be at least 1 ms",
                self.retention
            )));
        }
        for (what, d) in [
            ("lease", self.lease),
            ("entities.retention", self.entities.retention),
            ("entities.max_hold", self.entities.max_hold),
            ("entities.handback_lease", self.entities.handback_lease),
            ("cache_max_age", self.cache.1),
            ("reconcile window", self.tallies.0),
        ] {
            if d < Duration::from_millis(1) {
                return Err(Error::InvalidConfig(format!(
                    "{what} {d:?}: must be at least 1 ms"
                )));
            }
        }
        if self.tallies.0 > self.tallies.1 {
            return Err(Error::InvalidConfig(format!(
                "reconcile window {:?} is longer than its retention {:?}",
                self.tallies.0, self.tallies.1
            )));
        }
        let client = off_runtime(|| {
            let mut client = connect(&self.url)?;
            create_schema(&mut client, s)?;
            Ok::<_, Error>(client)
        })?;
        let shared = Shared {
            schema: s.clone(),
            sql: Sql::new(s),
            idle: Mutex::new(Vec::new()),
            max_idle: self.max_idle,
            group: (self.group_commit > 0).then(|| group::Group::new(self.group_commit)),
            clock: self.clock,
            lease_ms: ms(self.lease),
            retention_ms: ms(self.retention),
            entities: self.entities,
            cache: (self.cache.0 > 0).then(|| cache::Cache::new(self.cache.0, self.cache.1)),
            checkouts: AtomicU64::new(0),
            tallies: (ms(self.tallies.0), ms(self.tallies.1)),
            origin: format!("{}\u{0}{s}", self.url).into(),
            url: self.url,
        };
        shared.idle.lock().push(Conn {
            client,
            stmts: Default::default(),
        });
        Ok(PgStore {
            shared: Arc::new(shared),
        })
    }
}

/// An arbitrary constant: the advisory lock schema creation holds.
const SCHEMA_LOCK: i64 = 0x6465_6475_706b_7631;

fn create_schema(client: &mut Client, s: &str) -> Result<()> {
    let mut tx = client.transaction().map_err(storage)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
        .map_err(storage)?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.dedupkv_schema_version (version int4 NOT NULL);"
    ))
    .map_err(storage)?;
    let found: Option<i32> = tx
        .query_one(
            &format!("SELECT max(version) FROM {s}.dedupkv_schema_version"),
            &[],
        )
        .map_err(storage)?
        .get(0);
    match found {
        Some(v) if v > SCHEMA_VERSION => {
            return Err(Error::InvalidConfig(format!(
                "{s}.dedupkv_schema_version is {v}: written by a newer dedupkv-postgres \
                 (this build knows up to {SCHEMA_VERSION}); upgrade this instance"
            )));
        }
        Some(v) if v >= SCHEMA_VERSION => {}
        Some(v) => migrate(&mut tx, s, v)?,
        None => {
            tx.batch_execute(&format!(
                "CREATE SEQUENCE {s}.dedupkv_token;
                 CREATE TABLE {s}.dedupkv_keys (
                     scope bytea NOT NULL,
                     id bytea NOT NULL,
                     state int2 NOT NULL,
                     fingerprint bytea NOT NULL,
                     attempt int4 NOT NULL,
                     token int8 NOT NULL,
                     first_token int8 NOT NULL,
                     first_at int8 NOT NULL,
                     lease_until int8 NOT NULL,
                     lease_ms int8 NOT NULL,
                     abandoned bool NOT NULL,
                     any_fp bool NOT NULL,
                     outcome bytea NOT NULL,
                     PRIMARY KEY (scope, id));
                 INSERT INTO {s}.dedupkv_schema_version VALUES (1);"
            ))
            .map_err(storage)?;
            migrate(&mut tx, s, 1)?;
        }
    }
    tx.commit().map_err(storage)
}

/// Brings a schema of version `from` to [`SCHEMA_VERSION`], in the
/// creating transaction, under its advisory lock: version 2 adds the
/// dead-letter and expiry columns and the expiry index (a version-1 row
/// never expires); version 3 the intent columns (a row of an older
/// version has no intent), `updated_at` and the table
/// `dedupkv_versions`; version 4 the `waited` mark (a finish notifies
/// only rows a waiter marked); version 5 the sequencer (see
/// [`migrate_to_5`]). Instances of an older build that are already
/// running keep working on it (one starting later refuses the newer
/// version): they never write the new columns (an intent an older
/// instance's takeover leaves behind stays, as an attempt without an
/// intent leaves it on the engine; its writes leave `updated_at` behind)
/// and never meet a dead-lettered row unless a newer instance made one.
/// An older instance's `begin_or_wait` does not mark what it waits for,
/// so a newer instance's finish does not wake it: it wakes at the lease
/// end it was told or its timeout instead. A schema-5 instance writes no
/// round and counts no completion: a requeue it makes grants no new
/// round, its takeover counts no interruption and its new operation on a
/// reused row leaves the row's previous round behind (until a newer
/// instance starts a new operation there), and its completions are
/// missing from the tallies — so finish a rolling upgrade before relying
/// on retry limits or reconciliation.
fn migrate(tx: &mut postgres::Transaction<'_>, s: &str, from: i32) -> Result<()> {
    if from < 2 {
        migrate_to_2(tx, s)?;
    }
    if from < 3 {
        migrate_to_3(tx, s)?;
    }
    if from < 4 {
        tx.batch_execute(&format!(
            "ALTER TABLE {s}.dedupkv_keys ADD COLUMN IF NOT EXISTS waited bool NOT NULL DEFAULT false;
             INSERT INTO {s}.dedupkv_schema_version VALUES (4);"
        ))
        .map_err(storage)?;
    }
    if from < 5 {
        migrate_to_5(tx, s)?;
    }
    migrate_to_6(tx, s)
}

/// Version 6: the claim's round (attempts before it, its start, its
/// interruptions), as the engine keeps it, so retry limits count within a
/// round and a requeue starts a new one (a row from before is in its
/// operation's first round, uninterrupted); and the table
/// `dedupkv_completions`, one row per completion (the reconciliation's
/// counts: [`Tallies`]), written by the completing statement (insert
/// only: completions of one scope never wait for each other's row lock).
/// Completions from before are not counted.
fn migrate_to_6(tx: &mut postgres::Transaction<'_>, s: &str) -> Result<()> {
    tx.batch_execute(&format!(
        "ALTER TABLE {s}.dedupkv_keys
             ADD COLUMN IF NOT EXISTS round_before int4 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS round_since int8 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS round_interrupted int4 NOT NULL DEFAULT 0;
         CREATE TABLE IF NOT EXISTS {s}.dedupkv_completions (
             scope bytea NOT NULL,
             id bytea NOT NULL,
             at int8 NOT NULL,
             amount int8 NOT NULL,
             provider_key text NOT NULL);
         CREATE INDEX IF NOT EXISTS dedupkv_completions_scope ON {s}.dedupkv_completions (scope, at);
         INSERT INTO {s}.dedupkv_schema_version VALUES (6);"
    ))
    .map_err(storage)
}

/// Version 5: the sequencer's state on the entity's row (`next`,
/// `gap_since`; `version` NULL for an entity that has none), the entity's
/// expiry (NULL on a row from before: it expires from its next write on;
/// 0 while it stores events) and the table of stored events.
fn migrate_to_5(tx: &mut postgres::Transaction<'_>, s: &str) -> Result<()> {
    tx.batch_execute(&format!(
        "ALTER TABLE {s}.dedupkv_versions
             ALTER COLUMN version DROP NOT NULL,
             ADD COLUMN IF NOT EXISTS next int8 NOT NULL DEFAULT {no_next},
             ADD COLUMN IF NOT EXISTS gap_since int8 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS expires_at int8;
         CREATE INDEX IF NOT EXISTS dedupkv_versions_expiry ON {s}.dedupkv_versions (expires_at)
             WHERE expires_at > 0;
         CREATE TABLE IF NOT EXISTS {s}.dedupkv_events (
             scope bytea NOT NULL,
             id bytea NOT NULL,
             seq int8 NOT NULL,
             state int2 NOT NULL,
             payload bytea NOT NULL,
             at int8 NOT NULL,
             missing int8 NOT NULL,
             since int8 NOT NULL,
             handed_until int8 NOT NULL,
             PRIMARY KEY (scope, id, seq));
         INSERT INTO {s}.dedupkv_schema_version VALUES (5);",
        no_next = sql::NO_NEXT,
    ))
    .map_err(storage)
}

fn migrate_to_3(tx: &mut postgres::Transaction<'_>, s: &str) -> Result<()> {
    tx.batch_execute(&format!(
        "ALTER TABLE {s}.dedupkv_keys
             ADD COLUMN IF NOT EXISTS intent_target text,
             ADD COLUMN IF NOT EXISTS intent_settled bool NOT NULL DEFAULT false,
             ADD COLUMN IF NOT EXISTS intent_answer int2 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS intent_open bool NOT NULL DEFAULT false,
             ADD COLUMN IF NOT EXISTS intent_ref bytea,
             ADD COLUMN IF NOT EXISTS intent_doubt int2 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS intent_data bytea NOT NULL DEFAULT ''::bytea,
             ADD COLUMN IF NOT EXISTS intent_at int8 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS intent_attempt int4 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS updated_at int8 NOT NULL DEFAULT 0;
         CREATE TABLE IF NOT EXISTS {s}.dedupkv_versions (
             scope bytea NOT NULL,
             id bytea NOT NULL,
             version int8 NOT NULL,
             previous int8,
             PRIMARY KEY (scope, id));
         CREATE INDEX IF NOT EXISTS dedupkv_keys_dead ON {s}.dedupkv_keys (failed_at)
             WHERE state = {DEAD_LETTERED};
         INSERT INTO {s}.dedupkv_schema_version VALUES (3);"
    ))
    .map_err(storage)
}

fn migrate_to_2(tx: &mut postgres::Transaction<'_>, s: &str) -> Result<()> {
    tx.batch_execute(&format!(
        "ALTER TABLE {s}.dedupkv_keys
             ADD COLUMN IF NOT EXISTS failed_at int8 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS first_failed_at int8 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS payload bytea,
             ADD COLUMN IF NOT EXISTS expires_at int8 NOT NULL DEFAULT 0,
             ADD COLUMN IF NOT EXISTS retention_ms int8 NOT NULL DEFAULT 0;
         CREATE INDEX IF NOT EXISTS dedupkv_keys_expiry ON {s}.dedupkv_keys (expires_at)
             WHERE expires_at > 0;
         INSERT INTO {s}.dedupkv_schema_version VALUES (2);"
    ))
    .map_err(storage)
}

impl PgStore {
    /// Opens the default schema (`dedupkv`) with the default settings;
    /// `url` is a libpq-style connection string.
    ///
    /// # Errors
    /// As [`PgStoreBuilder::open`].
    ///
    /// # Examples
    /// See [`PgStore`].
    pub fn connect(url: &str) -> Result<PgStore> {
        PgStore::builder(url).open()
    }

    /// A builder for a store on `url` (a libpq-style connection string).
    ///
    /// # Examples
    /// See [`PgStoreBuilder`].
    pub fn builder(url: impl Into<String>) -> PgStoreBuilder {
        PgStoreBuilder {
            url: url.into(),
            schema: "dedupkv".into(),
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            clock: None,
            max_idle: 16,
            group_commit: DEFAULT_GROUP_COMMIT,
            entities: Entities::default(),
            cache: (0, DEFAULT_CACHE_MAX_AGE),
            tallies: (DEFAULT_RECONCILE_WINDOW, DEFAULT_RECONCILE_RETENTION),
        }
    }

    /// Deletes every expired row (never a dead letter), then every expired
    /// entity (never one that stores events), [`EVICT_BATCH`]
    /// at a time, each batch its own statement, so no transaction holds
    /// many row locks or runs long; the value is how many were deleted.
    /// Rows a concurrent call holds locked are skipped and left to a later
    /// pass. Calls need no eviction to be correct (an expired row is
    /// absent to them already); it only reclaims the space. Run it from
    /// one instance on a timer (several at once only share the work).
    ///
    /// Batched deletes rather than time partitions dropped whole: the
    /// table's primary key is the key, which every `INSERT … ON CONFLICT`
    /// relies on; a partitioned table's unique key must contain the
    /// partition key (the expiry), and a row's expiry moves with each
    /// write, so partitioning by time would split one key over partitions
    /// and move rows between them.
    ///
    /// # Errors
    /// Storage errors; the batches deleted before one stay deleted.
    ///
    /// # Examples
    /// ```no_run
    /// let store = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
    /// let deleted = store.evict_expired()?;
    /// # let _ = deleted;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn evict_expired(&self) -> Result<u64> {
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let mut total = 0;
        for q in [Q::Evict, Q::EvictEntities] {
            let st = c.stmt(&sh.sql, q)?;
            loop {
                let n = c
                    .client
                    .execute(&st, &[&sh.now(), &EVICT_BATCH])
                    .map_err(storage)?;
                total += n;
                if n < u64::try_from(EVICT_BATCH).unwrap_or(u64::MAX) {
                    break;
                }
            }
        }
        // Counts of windows past their retention (not records: not in the
        // total).
        let st = c.stmt(&sh.sql, Q::EvictCompletions)?;
        let (window, keep) = sh.tallies;
        while c
            .client
            .execute(&st, &[&sh.now(), &EVICT_BATCH, &window, &keep])
            .map_err(storage)?
            >= u64::try_from(EVICT_BATCH).unwrap_or(u64::MAX)
        {}
        Ok(total)
    }

    /// How many times this instance took a connection to send statements
    /// (each is one round trip or more); a call answered from the cache
    /// ([`PgStoreBuilder::cache`]) takes none. For tests and metrics.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv::contract::Read;
    /// use dedupkv::Key;
    ///
    /// let store = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
    /// let before = store.checkouts();
    /// store.get(&Key::new("t", "a"))?;
    /// assert_eq!(store.checkouts(), before + 1);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn checkouts(&self) -> u64 {
        self.shared.checkouts.load(Ordering::Relaxed)
    }

    /// `begin` of one key: attempt 1 by one `INSERT … ON CONFLICT DO
    /// NOTHING` (autocommit); else the answer from a plain read when it
    /// writes nothing (a replay, a live lease, a mismatch); else, in a
    /// transaction, the decision again on the locked row and the takeover.
    fn begin_one(
        &self,
        key: &Key<'_>,
        fp: Fingerprint,
        (lease_ms, retention_ms): (i64, i64),
        intent: Option<Intent<'_>>,
    ) -> Result<Began<PgClaim>> {
        check_key(key)?;
        let (target, request) = (intent.map(|i| i.target), intent.map(|i| i.request));
        let sh = &*self.shared;
        if let Some(answer) = sh.cached_begin(key, fp) {
            return answer;
        }
        let ticket = sh.ticket();
        let now = sh.now();
        let (scope, id, fpb) = (key.scope(), key.id(), fp_bytes(fp));
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let (ins, peek, lock, take) = (
            c.stmt(&sh.sql, Q::Begin1)?,
            c.stmt(&sh.sql, Q::Peek)?,
            c.stmt(&sh.sql, Q::Lock)?,
            c.stmt(&sh.sql, Q::Take)?,
        );
        let started = |attempt: u32, r: &postgres::Row, told: (bool, bool)| {
            PgClaim::claimed(key, attempt, r, told, &self.shared).map(Began::Started)
        };
        if let Some(r) = c
            .client
            .query_opt(
                &ins,
                &[
                    &now,
                    &scope,
                    &id,
                    &fpb,
                    &lease_ms,
                    &retention_ms,
                    &target,
                    &request,
                ],
            )
            .map_err(storage)?
        {
            return started(1, &r, (false, false));
        }
        if let Some(seen) = c
            .client
            .query_opt(&peek, &[&now, &scope, &id])
            .map_err(storage)?
            && let Decision::Answer(answer) = decide(key, fp, &fpb, &seen)?
        {
            sh.remember(ticket, key, &seen);
            return Ok(*answer);
        }
        let mut tx = c.client.transaction().map_err(storage)?;
        let Some(locked) = tx.query_opt(&lock, &[&now, &scope, &id]).map_err(storage)? else {
            // Expired and deleted by an eviction since the insert met it:
            // absent now, so the insert decides (a new row is not expired).
            drop(tx);
            drop(pooled);
            return self.begin_one(key, fp, (lease_ms, retention_ms), intent);
        };
        let (attempt, first_at, told, stranded, new_op, now) = match decide(key, fp, &fpb, &locked)?
        {
            Decision::Answer(answer) => {
                tx.commit().map_err(storage)?;
                return Ok(*answer);
            }
            Decision::Take(t) => (t.attempt, t.first_at, t.told, t.stranded, t.new_op, t.now),
        };
        let attempt_i = i32::try_from(attempt).unwrap_or(i32::MAX);
        let r = tx
            .query_one(
                &take,
                &[
                    &scope,
                    &id,
                    &fpb,
                    &attempt_i,
                    &first_at,
                    &now.saturating_add(lease_ms),
                    &lease_ms,
                    &new_op,
                    &stranded,
                    &now,
                    &retention_ms,
                    &target,
                    &request,
                    &told.0,
                ],
            )
            .map_err(storage)?;
        tx.commit().map_err(storage)?;
        started(attempt, &r, told)
    }

    /// Finishes `claim` as `state` with `outcome`, by its fencing token.
    /// Finishes `claim` as `state` with `outcome` (for a dead letter: its
    /// reason, with `payload`), by its fencing token.
    fn finish(
        &self,
        claim: &PgClaim,
        (state, outcome): (i16, &[u8]),
        any_fp: bool,
        payload: Option<&[u8]>,
    ) -> Result<()> {
        self.finish_counted(claim, (state, outcome), any_fp, payload, (0, None))
    }

    /// [`finish`](Self::finish) with a completion's amount (counted in its
    /// window) and the outcome's own retention (ms; `None`: the
    /// operation's).
    fn finish_counted(
        &self,
        claim: &PgClaim,
        (state, outcome): (i16, &[u8]),
        any_fp: bool,
        payload: Option<&[u8]>,
        (amount, retention): (i64, Option<i64>),
    ) -> Result<()> {
        claim.check_origin(&self.shared)?;
        check_len("outcome", outcome.len(), MAX_OUTCOME)?;
        check_len("payload", payload.map_or(0, <[u8]>::len), MAX_OUTCOME)?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::Finish)?;
        let (scope, id) = (claim.key.scope(), claim.key.id());
        let n = c
            .client
            .execute(
                &st,
                &[
                    &scope,
                    &id,
                    &claim.token,
                    &state,
                    &outcome,
                    &any_fp,
                    &sh.now(),
                    &payload,
                    &amount,
                    &retention,
                ],
            )
            .map_err(storage)?;
        if n == 1 {
            claim.finished.store(true, Ordering::Release);
            Ok(())
        } else {
            Err(claim.lost())
        }
    }
}

/// What `begin` does with a key's row (read with `Q::Peek` or `Q::Lock`,
/// the time in column 11).
enum Decision {
    /// Answer without writing (boxed: a record is large).
    Answer(Box<Began<PgClaim>>),
    /// Start the next attempt (under the row lock).
    Take(Take),
}

/// The next attempt `decide` starts.
struct Take {
    attempt: u32,
    first_at: i64,
    /// The previous attempt never answered; an earlier attempt's intent
    /// is pending (the engine's `IntentState::Pending`: its call may have
    /// happened).
    told: (bool, bool),
    /// The previous attempt's lease lapsed: its round's first failure
    /// (if it is the first).
    stranded: bool,
    new_op: bool,
    now: i64,
}

fn decide(key: &Key<'_>, fp: Fingerprint, fpb: &[u8], r: &postgres::Row) -> Result<Decision> {
    let row = Row::from(r)?;
    let now: i64 = r.get(11);
    let answer = |b| Ok(Decision::Answer(Box::new(b)));
    match row.state {
        _ if row.expired(now) || row.state == FORGOTTEN => Ok(Decision::Take(Take {
            attempt: 1,
            first_at: now,
            told: (false, false),
            stranded: false,
            new_op: true,
            now,
        })),
        INSERTED => answer(Began::Completed(row.record(key.clone().into_owned())?)),
        _ if row.fp != fpb && !(row.state == RETRYABLE && row.any_fp) => {
            Err(Error::FingerprintMismatch {
                key: format!("{key:?}"),
                recorded: row.fingerprint(),
                requested: fp,
            })
        }
        COMPLETED | FAILED => answer(Began::Completed(row.record(key.clone().into_owned())?)),
        DEAD_LETTERED => answer(Began::DeadLettered(
            row.dead_letter(key.clone().into_owned())?,
        )),
        IN_PROGRESS if now < row.lease_until => answer(Began::InProgress(row.in_progress())),
        _ => Ok(Decision::Take(Take {
            attempt: row.attempt() + 1,
            first_at: row.first_at,
            // Columns 17 and 18: the intent's target and whether it is
            // settled (`INTENT_COLUMNS`).
            told: (
                row.state == IN_PROGRESS || row.abandoned,
                r.try_get::<_, Option<String>>(17).ok().flatten().is_some()
                    && !r.try_get::<_, bool>(18).unwrap_or(true),
            ),
            stranded: row.state == IN_PROGRESS,
            new_op: false,
            now,
        })),
    }
}

impl Settle for PgStore {
    type Waiter = ();

    /// Every answer was committed before it was given: nothing to wait for.
    fn wait(&self, _basis: dedupkv::contract::Basis) -> Result<()> {
        Ok(())
    }

    fn poll_settled(
        &self,
        _basis: dedupkv::contract::Basis,
        (): &mut (),
        _cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn stop_waiting(&self, (): &mut ()) {}
}

impl Read for PgStore {
    fn get(&self, key: &Key<'_>) -> Result<Pending<Option<Record>>> {
        check_key(key)?;
        let sh = &*self.shared;
        if let Some(rec) = sh.cached(key) {
            return Ok(Pending::settled(Some(rec)));
        }
        let ticket = sh.ticket();
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::Peek)?;
        let row = c
            .client
            .query_opt(&st, &[&sh.now(), &key.scope(), &key.id()])
            .map_err(storage)?;
        let rec = match row {
            Some(r) => {
                sh.remember(ticket, key, &r);
                let row = Row::from(&r)?;
                let now: i64 = r.get(11);
                (!row.expired(now))
                    .then(|| row.record(key.clone().into_owned()))
                    .transpose()?
            }
            None => None,
        };
        Ok(Pending::settled(rec))
    }
}

impl PgStore {
    /// `insert` of every key, kept `retention_ms` after: one multi-row
    /// statement.
    fn insert_keys(&self, keys: &[Key<'_>], retention_ms: i64) -> Result<Pending<Vec<bool>>> {
        keys.iter().try_for_each(check_key)?;
        // A key repeated is new at its first position only: one row each.
        let mut first: std::collections::HashMap<(&[u8], &[u8]), usize> =
            std::collections::HashMap::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            first.entry((k.scope(), k.id())).or_insert(i);
        }
        // In key order, so concurrent statements lock rows in one order
        // and cannot deadlock each other.
        let mut unique: Vec<(&[u8], &[u8])> = first.keys().copied().collect();
        unique.sort_unstable();
        let (scopes, ids): (Vec<&[u8]>, Vec<&[u8]>) = unique.into_iter().unzip();
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::Insert)?;
        let rows = c
            .client
            .query(&st, &[&sh.now(), &scopes, &ids, &retention_ms])
            .map_err(storage)?;
        let mut new = vec![false; keys.len()];
        for r in &rows {
            let (s, i): (&[u8], &[u8]) = (r.get(0), r.get(1));
            if let Some(&at) = first.get(&(s, i)) {
                new[at] = true;
            }
        }
        Ok(Pending::settled(new))
    }
}

impl Write for PgStore {
    type Claim = PgClaim;

    fn insert(&self, key: &Key<'_>, retention: Option<Duration>) -> Result<Pending<bool>> {
        let retention = self.shared.retention_of(retention)?;
        if let Some(group) = &self.shared.group {
            check_key(key)?;
            let new = group.insert(key, retention, |run| {
                self.tell(self.insert_keys(&run.keys, run.retention_ms)?)
            })?;
            return Ok(Pending::settled(new));
        }
        let news = self.insert_keys(std::slice::from_ref(key), retention)?;
        Ok(news.map(|v| v.first().copied().unwrap_or(false)))
    }

    fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Pending<Vec<bool>>> {
        self.insert_keys(keys, self.shared.retention_ms)
    }

    fn forget(&self, key: &Key<'_>) -> Result<Pending<Forget>> {
        check_key(key)?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let (lock, forget) = (c.stmt(&sh.sql, Q::Lock)?, c.stmt(&sh.sql, Q::Forget)?);
        let (scope, id) = (key.scope(), key.id());
        let mut tx = c.client.transaction().map_err(storage)?;
        let Some(locked) = tx
            .query_opt(&lock, &[&sh.now(), &scope, &id])
            .map_err(storage)?
        else {
            return Ok(Pending::settled(Forget::NotFound));
        };
        let row = Row::from(&locked)?;
        let now: i64 = locked.get(11);
        let answer = match row.state {
            _ if row.expired(now) => Forget::NotFound,
            FORGOTTEN => Forget::NotFound,
            IN_PROGRESS if now < row.lease_until => Forget::InProgress(row.in_progress()),
            _ => {
                tx.execute(&forget, &[&scope, &id, &now]).map_err(storage)?;
                Forget::Forgotten(row.record(key.clone().into_owned())?)
            }
        };
        tx.commit().map_err(storage)?;
        if let Some(cache) = &sh.cache {
            cache.forgot(key);
        }
        Ok(Pending::settled(answer))
    }

    /// The intent (if any) is recorded by the claim's own statement.
    fn begin(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Option<Intent<'_>>,
    ) -> Result<Pending<Began<PgClaim>>> {
        if let Some(i) = intent {
            check_len(
                "intent",
                i.target.len().saturating_add(i.request.len()),
                MAX_OUTCOME,
            )?;
        }
        let lease = match options.requested_lease() {
            Some(l) if l < Duration::from_millis(1) => {
                return Err(Error::InvalidArgument {
                    what: "lease",
                    reason: format!("{l:?} is shorter than 1 ms"),
                });
            }
            Some(l) => ms(l),
            None => self.shared.lease_ms,
        };
        let retention = self.shared.retention_of(options.requested_retention())?;
        self.begin_one(key, fingerprint, (lease, retention), intent)
            .map(Pending::settled)
    }

    /// Each item in its own transaction (atomic per item).
    fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<BegunBatch<PgClaim>> {
        items.iter().try_for_each(|(k, _)| check_key(k))?;
        let mut out = Vec::with_capacity(items.len());
        for (k, fp) in items {
            match self.begin_one(
                k,
                *fp,
                (self.shared.lease_ms, self.shared.retention_ms),
                None,
            ) {
                Err(e @ Error::FingerprintMismatch { .. }) => out.push(Err(e)),
                other => out.push(Ok(other?)),
            }
        }
        Ok(Pending::settled(out))
    }

    /// The outcome's retention (if any) keeps the key from now on; its
    /// amount is counted in the completion's window ([`Tallies`]). A typed
    /// outcome's format tag is not kept: it replays as raw bytes.
    fn complete(&self, claim: &PgClaim, outcome: Outcome<'_>) -> Result<Pending<()>> {
        let retention = outcome
            .given_retention()
            .map(|d| self.shared.retention_of(Some(d)))
            .transpose()?;
        self.finish_counted(
            claim,
            (COMPLETED, outcome.bytes()),
            false,
            None,
            (outcome.given_amount(), retention),
        )
        .map(Pending::settled)
    }

    /// One `UPDATE … FROM unnest(…)` statement for the whole batch.
    fn complete_batch(&self, items: &[(&PgClaim, &[u8])]) -> Result<Pending<Vec<Result<()>>>> {
        items
            .iter()
            .try_for_each(|(c, _)| c.check_origin(&self.shared))?;
        // A claim named twice completes at its first position only.
        let mut seen = std::collections::HashSet::with_capacity(items.len());
        let once: Vec<bool> = items.iter().map(|(c, _)| seen.insert(c.token)).collect();
        let (mut scopes, mut ids, mut tokens, mut outcomes) = (vec![], vec![], vec![], vec![]);
        let fits: Vec<bool> = items.iter().map(|(_, o)| o.len() <= MAX_OUTCOME).collect();
        for ((claim, outcome), _) in items
            .iter()
            .zip(&once)
            .filter(|(_, o)| **o)
            .filter(|((_, o), _)| o.len() <= MAX_OUTCOME)
        {
            scopes.push(claim.key.scope());
            ids.push(claim.key.id());
            tokens.push(claim.token);
            outcomes.push(*outcome);
        }
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::CompleteBatch)?;
        let rows = c
            .client
            .query(&st, &[&scopes, &ids, &tokens, &outcomes, &sh.now()])
            .map_err(storage)?;
        let done: std::collections::HashSet<i64> = rows.iter().map(|r| r.get(0)).collect();
        let answers = items
            .iter()
            .zip(&once)
            .zip(&fits)
            .map(|(((claim, outcome), first), fits)| {
                if !fits {
                    check_len("outcome", outcome.len(), MAX_OUTCOME)
                } else if *first && done.contains(&claim.token) {
                    claim.finished.store(true, Ordering::Release);
                    Ok(())
                } else {
                    Err(claim.lost())
                }
            })
            .collect();
        Ok(Pending::settled(answers))
    }

    /// `Failure::Exhausted` moves the key to the dead-letter area (see
    /// [`DeadLetters`]).
    fn fail(&self, claim: &PgClaim, failure: Failure<'_>) -> Result<Pending<()>> {
        match failure {
            Failure::Permanent(payload) => self.finish(claim, (FAILED, payload), false, None),
            Failure::Retryable => self.finish(claim, (RETRYABLE, b""), false, None),
            Failure::RetryableAnyRequest => self.finish(claim, (RETRYABLE, b""), true, None),
            Failure::Exhausted { reason, payload } => {
                self.finish(claim, (DEAD_LETTERED, reason.as_bytes()), false, payload)
            }
            other => Err(Error::InvalidArgument {
                what: "failure",
                reason: format!("{other:?} is not known to this build of the PostgreSQL backend"),
            }),
        }
        .map(Pending::settled)
    }

    fn renew(&self, claim: &PgClaim, by: Option<Duration>) -> Result<Pending<SystemTime>> {
        let by = match by {
            Some(d) if d < Duration::from_millis(1) => {
                return Err(Error::InvalidArgument {
                    what: "lease",
                    reason: format!("{d:?} is shorter than 1 ms"),
                });
            }
            other => other.map(ms),
        };
        claim.check_origin(&self.shared)?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::Renew)?;
        let row = c
            .client
            .query_opt(
                &st,
                &[
                    &sh.now(),
                    &claim.key.scope(),
                    &claim.key.id(),
                    &claim.token,
                    &by,
                ],
            )
            .map_err(storage)?;
        match row {
            Some(r) => {
                let until: i64 = r.get(0);
                claim.lease_until.store(until, Ordering::Release);
                Ok(Pending::settled(at(until)))
            }
            None => Err(claim.lost()),
        }
    }

    /// [`MAX_OUTCOME`].
    fn max_outcome_len(&self) -> usize {
        MAX_OUTCOME
    }
}

/// A started attempt on PostgreSQL: the key, the attempt and its fencing
/// token. Dropped unfinished, it releases the key (one conditional
/// `UPDATE`; the next attempt is told it was interrupted); if that fails,
/// the lease lapses instead.
///
/// # Examples
/// ```no_run
/// use dedupkv::contract::{Handle, Settle, Write};
/// use dedupkv::{Began, BeginOptions, Fingerprint, Key};
/// use dedupkv_postgres::PgStore;
///
/// let store = PgStore::connect("host=127.0.0.1 user=postgres dbname=postgres")?;
/// let p = store.begin(&Key::new("t", "op"), Fingerprint::NONE, &BeginOptions::new(), None)?;
/// if let Began::Started(claim) = store.tell(p)? {
///     assert_eq!(claim.attempt(), 1);
///     let provider_key = claim.provider_key(); // the same on every instance
///     # let _ = provider_key;
/// }
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug)]
pub struct PgClaim {
    key: Key<'static>,
    attempt: u32,
    token: i64,
    provider_key: u128,
    interrupted: bool,
    /// The operation's first attempt, ms (the database's clock).
    first_at: i64,
    /// The lease's end, ms, as the last `begin` or `renew` set it.
    lease_until: AtomicI64,
    round: Round,
    /// An earlier attempt's intent was pending when this one started.
    intent_open: bool,
    /// The store's origin (see `Shared::origin`).
    origin: Arc<str>,
    finished: AtomicBool,
    shared: Weak<Shared>,
}

/// A claim's round, as its row keeps it (schema version 6): the attempts
/// before it, its start (0: the operation's first attempt), its
/// interruptions.
#[derive(Debug, Clone, Copy)]
struct Round {
    before: u32,
    since: i64,
    interrupted: u32,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl PgClaim {
    /// The claim of attempt `attempt` of `key`, from the row `begin`'s
    /// statement returned (`RETURNING token, first_token, provider key,
    /// CLAIMED`).
    fn claimed(
        key: &Key<'_>,
        attempt: u32,
        r: &postgres::Row,
        (interrupted, unanswered): (bool, bool),
        shared: &Arc<Shared>,
    ) -> Result<PgClaim> {
        Ok(PgClaim {
            key: key.clone().into_owned(),
            attempt,
            token: r.get(0),
            provider_key: provider_key_of(r.get(2))?,
            interrupted,
            first_at: r.get(3),
            lease_until: AtomicI64::new(r.get(4)),
            round: Round {
                before: u32::try_from(r.get::<_, i32>(5)).unwrap_or(0),
                since: r.get(6),
                interrupted: u32::try_from(r.get::<_, i32>(7)).unwrap_or(0),
            },
            intent_open: unanswered,
            origin: shared.origin.clone(),
            finished: AtomicBool::new(false),
            shared: Arc::downgrade(shared),
        })
    }

    /// The operation's idempotency key for an external provider, 32 hex
    /// digits: the same for every attempt of the operation, from every
    /// instance, computed by the database from the row's own fields (the
    /// key, the fencing token of the operation's first attempt, which the
    /// database's sequence handed out, and the request fingerprint), never
    /// from the instance; a corrected request
    /// ([`Failure::RetryableAnyRequest`]) gets a new one. The record
    /// [`get`](Read::get) answers carries the same
    /// ([`Record::provider_key`]).
    ///
    /// # Examples
    /// See [`PgClaim`].
    pub fn provider_key(&self) -> String {
        format!("{:032x}", self.provider_key)
    }

    /// The attempt's fencing token (from the database's sequence).
    ///
    /// # Examples
    /// ```no_run
    /// # use dedupkv::contract::{Settle, Write};
    /// # use dedupkv::{Began, BeginOptions, Fingerprint, Key};
    /// # let store = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
    /// # let p = store.begin(&Key::new("t", "op"), Fingerprint::NONE, &BeginOptions::new(), None)?;
    /// if let Began::Started(claim) = store.tell(p)? {
    ///     assert!(claim.token() > 0);
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Fails unless this claim was made by a store of `sh`'s origin (the
    /// same URL and schema): a token is unique within a schema only.
    fn check_origin(&self, sh: &Shared) -> Result<()> {
        if self.origin == sh.origin {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            what: "claim",
            reason: format!(
                "the claim of {:?} was made by a store of another database or schema than {:?}",
                self.key, sh.schema
            ),
        })
    }

    fn lost(&self) -> Error {
        Error::ClaimLost {
            key: format!("{:?}", self.key),
            attempt: self.attempt,
            token: u64::try_from(self.token).unwrap_or(0),
            reason: "another attempt holds the key, or this one finished",
        }
    }
}

impl Handle for PgClaim {
    fn key(&self) -> &Key<'static> {
        &self.key
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn interrupted(&self) -> bool {
        self.interrupted
    }
}

/// What a [`Store`](dedupkv::Store) opened on this backend
/// ([`StoreBuilder::open_shared`](dedupkv::StoreBuilder::open_shared))
/// tells of its claims: the row's values when the attempt started, times
/// from the database's clock (or the builder's), the lease's end as the
/// last `renew` of this handle set it.
///
/// # Examples
/// ```no_run
/// # use dedupkv::contract::{Settle, SharedClaim, Write};
/// # use dedupkv::{Began, BeginOptions, Fingerprint, Key};
/// # let store = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
/// # let p = store.begin(&Key::new("t", "op"), Fingerprint::NONE, &BeginOptions::new(), None)?;
/// if let Began::Started(claim) = store.tell(p)? {
///     assert_eq!(claim.round_attempt(), 1);
/// }
/// # Ok::<(), dedupkv::Error>(())
/// ```
impl SharedClaim for PgClaim {
    fn token(&self) -> u64 {
        u64::try_from(self.token).unwrap_or(0)
    }

    fn provider_key(&self) -> Result<String> {
        Ok(PgClaim::provider_key(self))
    }

    fn first_seen_at(&self) -> SystemTime {
        at(self.first_at)
    }

    fn round_attempt(&self) -> u32 {
        self.attempt.saturating_sub(self.round.before).max(1)
    }

    fn round_started_at(&self) -> SystemTime {
        at(if self.round.since == 0 {
            self.first_at
        } else {
            self.round.since
        })
    }

    fn interruptions(&self) -> u32 {
        self.round.interrupted
    }

    fn unanswered_intent(&self) -> bool {
        self.intent_open
    }

    fn lease_expires_at(&self) -> SystemTime {
        at(self.lease_until.load(Ordering::Acquire))
    }
}

impl Drop for PgClaim {
    fn drop(&mut self) {
        if self.finished.load(Ordering::Acquire) {
            return;
        }
        let Some(sh) = self.shared.upgrade() else {
            return;
        };
        let release = || -> Result<u64> {
            let mut pooled = sh.pooled()?;
            let c = pooled.conn();
            let st = c.stmt(&sh.sql, Q::Release)?;
            c.client
                .execute(
                    &st,
                    &[&self.key.scope(), &self.key.id(), &self.token, &sh.now()],
                )
                .map_err(storage)
        };
        // A failed release leaves the lease to lapse: nothing is lost.
        let _ = off_runtime(release);
    }
}

impl Tallies for PgStore {
    fn tally_window(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.shared.tallies.0).unwrap_or(0))
    }

    /// Every completion is kept (with its id and provider key) until its
    /// window's retention ends, so every scope reconciles by key.
    fn completions(&self, scope: &[u8], starts: RangeInclusive<u64>) -> Result<Vec<Completion>> {
        check_key(&Key::new(scope, b"-"))?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::Completions)?;
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let rows = c
            .client
            .query(
                &st,
                &[
                    &scope,
                    &sh.tallies.0,
                    &clamp(*starts.start()),
                    &clamp(*starts.end()),
                ],
            )
            .map_err(storage)?;
        rows.iter()
            .map(|r| {
                let pk: String = r.get(2);
                Ok(Completion::new(
                    at(r.get(0)),
                    r.get(1),
                    provider_key_of(&pk)?,
                    at(r.get(3)),
                ))
            })
            .collect()
    }

    /// One `SELECT … GROUP BY` window over `dedupkv_completions`.
    fn tallies(&self, scope: &[u8]) -> Result<Vec<Tally>> {
        check_key(&Key::new(scope, b"-"))?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::Tallies)?;
        let (window, keep) = sh.tallies;
        let rows = c
            .client
            .query(&st, &[&sh.now(), &scope, &window, &keep])
            .map_err(storage)?;
        rows.iter()
            .map(|r| {
                let sum: String = r.get(2);
                let amount = sum.parse::<i128>().map_err(|e| {
                    Error::Corrupt(format!(
                        "a window's sum {sum:?} of {scope:?} is no i128: {e}"
                    ))
                })?;
                let mut t = Tally::new(
                    at(r.get(0)),
                    u64::try_from(r.get::<_, i64>(1)).unwrap_or(0),
                    amount,
                );
                t.window = self.tally_window();
                Ok(t)
            })
            .collect()
    }
}
