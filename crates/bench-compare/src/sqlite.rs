//! SQLite (bundled, via rusqlite) in WAL mode: a `(k BLOB PRIMARY KEY)`
//! table, `INSERT ... ON CONFLICT DO NOTHING RETURNING 1` to tell new from
//! duplicate, one `BEGIN IMMEDIATE` transaction per batch, one connection
//! per worker with a busy timeout.
//!
//! SQLite has one writer at a time. Workers of one instance queue for it on
//! an in-process mutex, as redb's writers queue inside `begin_write`;
//! without it, waiting writers sleep in SQLite's busy handler (1, 2, 5 ...
//! 100 ms steps) and 16 workers measure the backoff, not the engine. Set
//! `DEDUPKV_BENCH_SQLITE_BUSY_WAIT=1` to measure that instead.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL, SQLite) are not code

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};
use tempfile::TempDir;

use crate::contender::{Contender, Instance, Key16, Result, Worker};

const INSERT: &str = "INSERT INTO t(k) VALUES (?1) ON CONFLICT DO NOTHING RETURNING 1";
const UPDATE: &str = "UPDATE t SET outcome = ?2 WHERE k = ?1";

/// Set to `1` to let writers contend through the busy handler only.
pub const BUSY_WAIT_ENV: &str = "DEDUPKV_BENCH_SQLITE_BUSY_WAIT";

fn busy_wait_only() -> bool {
    std::env::var(BUSY_WAIT_ENV).is_ok_and(|v| v == "1")
}

/// SQLite with `synchronous=FULL` or `synchronous=NORMAL`.
pub struct Sqlite {
    full: bool,
    /// `begin_complete` as two transactions (the claim, then the outcome).
    two: bool,
}

impl Sqlite {
    /// `synchronous=FULL`: the WAL is synced at every commit.
    pub fn full() -> Self {
        Self {
            full: true,
            two: false,
        }
    }

    /// `synchronous=FULL`, with `begin_complete` as two durable
    /// transactions: the claim committed before the side effect, the
    /// outcome after it, the guarantee dedupkv's `begin` + `complete`
    /// gives (two durable commits).
    pub fn full_two_transactions() -> Self {
        Self {
            full: true,
            two: true,
        }
    }

    /// `synchronous=NORMAL`: the WAL is synced only at checkpoints.
    pub fn normal() -> Self {
        Self {
            full: false,
            two: false,
        }
    }
}

impl Contender for Sqlite {
    fn id(&self) -> &'static str {
        match (self.full, self.two) {
            (true, true) => "sqlite-full-2tx",
            (true, false) => "sqlite-full",
            (false, _) => "sqlite-normal",
        }
    }

    fn name(&self) -> String {
        format!(
            "SQLite {} WAL {}{}{}",
            rusqlite::version(),
            if self.full { "FULL" } else { "NORMAL" },
            if self.two {
                ", claim + outcome in two transactions"
            } else {
                ""
            },
            if busy_wait_only() {
                " (busy-wait writers)"
            } else {
                ""
            }
        )
    }

    fn durability(&self) -> &'static str {
        if self.full {
            "durable: WAL, synchronous=FULL"
        } else {
            "relaxed durability: WAL, synchronous=NORMAL (power loss drops recent commits)"
        }
    }

    fn open(&self, _expected_keys: usize) -> Result<Box<dyn Instance>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("bench.sqlite");
        let admin = Connection::open(&path)?;
        let mode: String = admin.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if mode != "wal" {
            return Err(format!("SQLite refused WAL mode (got {mode})").into());
        }
        admin.execute_batch("CREATE TABLE t(k BLOB PRIMARY KEY, outcome BLOB)")?;
        Ok(Box::new(SqliteInstance {
            // Kept open so the WAL is not checkpointed and removed whenever
            // the last worker connection closes.
            _admin: Mutex::new(admin),
            path,
            full: self.full,
            two: self.two,
            writer: (!busy_wait_only()).then(|| Arc::new(Mutex::new(()))),
            _dir: dir,
        }))
    }
}

struct SqliteInstance {
    _admin: Mutex<Connection>,
    path: PathBuf,
    full: bool,
    two: bool,
    writer: Option<Arc<Mutex<()>>>,
    _dir: TempDir,
}

impl Instance for SqliteInstance {
    fn worker(&self) -> Result<Box<dyn Worker>> {
        let conn = Connection::open(&self.path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.execute_batch(if self.full {
            "PRAGMA synchronous=FULL"
        } else {
            "PRAGMA synchronous=NORMAL"
        })?;
        // The same 64 MiB of page cache dedupkv and raw redb get (SQLite's
        // default is 2 MiB).
        conn.execute_batch("PRAGMA cache_size=-65536")?;
        Ok(Box::new(SqliteWorker {
            conn,
            two: self.two,
            writer: self.writer.clone(),
        }))
    }
}

struct SqliteWorker {
    conn: Connection,
    two: bool,
    writer: Option<Arc<Mutex<()>>>,
}

/// Waits for the in-process writer turn, if writers take turns.
fn turn(writer: Option<&Arc<Mutex<()>>>) -> Result<Option<MutexGuard<'_, ()>>> {
    writer
        .map(|w| {
            w.lock()
                .map_err(|_| "the SQLite writer lock is poisoned".into())
        })
        .transpose()
}

impl Worker for SqliteWorker {
    fn insert_batch(&mut self, keys: &[Key16]) -> Result<usize> {
        let _turn = turn(self.writer.as_ref())?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut new = 0;
        {
            let mut insert = tx.prepare_cached(INSERT)?;
            for k in keys {
                if insert.query([&k[..]])?.next()?.is_some() {
                    new += 1;
                }
            }
        }
        tx.commit()?;
        Ok(new)
    }

    fn begin_complete(&mut self, key: &Key16, outcome: &[u8]) -> Result<bool> {
        if self.two {
            // The claim, durable; (the side effect would run here); the
            // outcome, durable. Each takes its own writer turn.
            if self.insert_batch(std::slice::from_ref(key))? == 0 {
                return Ok(false);
            }
            let _turn = turn(self.writer.as_ref())?;
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.prepare_cached(UPDATE)?.execute((&key[..], outcome))?;
            tx.commit()?;
            return Ok(true);
        }
        let _turn = turn(self.writer.as_ref())?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let new = tx
            .prepare_cached(INSERT)?
            .query([&key[..]])?
            .next()?
            .is_some();
        if new {
            tx.prepare_cached(UPDATE)?.execute((&key[..], outcome))?;
        }
        tx.commit()?;
        Ok(new)
    }
}
