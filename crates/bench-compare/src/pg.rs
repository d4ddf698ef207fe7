//! PostgreSQL via the `postgres` crate: one connection per worker,
//! `synchronous_commit=on`, `INSERT ... ON CONFLICT DO NOTHING RETURNING 1`.
//! One key per op is one autocommit statement; a batch is one multi-row
//! `INSERT ... SELECT unnest($1)` statement (one transaction), with its keys
//! sorted so concurrent batches lock keys in the same order and cannot
//! deadlock.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL, SQLite) are not code

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use postgres::{Client, NoTls, Statement};

use crate::contender::{Contender, Instance, Key16, Result, Worker};

/// The environment variable holding the server's connection string.
pub const URL_ENV: &str = "DEDUPKV_PG_URL";

static TABLES: AtomicU32 = AtomicU32::new(0);

/// PostgreSQL at a connection string (`host=... port=... user=... dbname=...`).
pub struct Postgres {
    url: String,
    version: String,
    /// `begin_complete` as two transactions (the claim, then the outcome).
    two: bool,
}

impl Postgres {
    /// Connects once to check the server and learn its version.
    pub fn connect(url: &str) -> Result<Self> {
        let mut c = Client::connect(url, NoTls)?;
        let version: String = c.query_one("SHOW server_version", &[])?.get(0);
        Ok(Self {
            url: url.to_owned(),
            version,
            two: false,
        })
    }

    /// The same server, with `begin_complete` as two transactions: the
    /// claim committed before the side effect, the outcome after it (the
    /// guarantee of dedupkv's `begin` + `complete`).
    #[must_use]
    pub fn two_transactions(&self) -> Self {
        Self {
            url: self.url.clone(),
            version: self.version.clone(),
            two: true,
        }
    }

    /// Server settings that decide what a commit costs, for the report.
    pub fn settings(&self) -> Result<String> {
        let mut c = Client::connect(&self.url, NoTls)?;
        let mut out = Vec::new();
        for name in [
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "full_page_writes",
        ] {
            let v: String = c.query_one(&format!("SHOW {name}"), &[])?.get(0);
            out.push(format!("{name}={v}"));
        }
        Ok(out.join(", "))
    }
}

impl Contender for Postgres {
    fn id(&self) -> &'static str {
        if self.two { "postgres-2tx" } else { "postgres" }
    }

    fn name(&self) -> String {
        let major = self.version.split(['.', ' ']).next().unwrap_or("?");
        let two = if self.two {
            ", claim + outcome in two transactions"
        } else {
            ""
        };
        format!("PostgreSQL {major}{two}")
    }

    fn durability(&self) -> &'static str {
        "durable: synchronous_commit=on"
    }

    fn open(&self, _expected_keys: usize) -> Result<Box<dyn Instance>> {
        let table = format!(
            "dedupkv_bench_{}_{}",
            std::process::id(),
            TABLES.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = Client::connect(&self.url, NoTls)?;
        admin.batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table}(k bytea PRIMARY KEY, outcome bytea)"
        ))?;
        // Not mid-run: flush dirty pages (earlier runs) before the clock starts.
        admin.batch_execute("CHECKPOINT")?;
        Ok(Box::new(PgInstance {
            url: self.url.clone(),
            two: self.two,
            table,
            admin: Some(Mutex::new(admin)),
        }))
    }

    fn attach(&self, name: &str) -> Result<Box<dyn Instance>> {
        Ok(Box::new(PgInstance {
            url: self.url.clone(),
            two: self.two,
            table: name.to_owned(),
            admin: None,
        }))
    }

    fn shared(&self) -> bool {
        true
    }
}

struct PgInstance {
    url: String,
    two: bool,
    table: String,
    /// The opener's connection, which drops the table; `None` when attached.
    admin: Option<Mutex<Client>>,
}

impl Drop for PgInstance {
    fn drop(&mut self) {
        if let Some(Ok(admin)) = self.admin.as_mut().map(Mutex::get_mut) {
            let _ = admin.batch_execute(&format!("DROP TABLE IF EXISTS {}", self.table));
        }
    }
}

impl Instance for PgInstance {
    fn shared_name(&self) -> Option<String> {
        Some(self.table.clone())
    }

    fn worker(&self) -> Result<Box<dyn Worker>> {
        let mut client = Client::connect(&self.url, NoTls)?;
        client.batch_execute("SET synchronous_commit = on")?;
        let t = &self.table;
        let insert_one = client.prepare(&format!(
            "INSERT INTO {t}(k) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1"
        ))?;
        let insert_many = client.prepare(&format!(
            "INSERT INTO {t}(k) SELECT unnest($1::bytea[]) ON CONFLICT DO NOTHING RETURNING 1"
        ))?;
        let update = client.prepare(&format!("UPDATE {t} SET outcome = $2 WHERE k = $1"))?;
        Ok(Box::new(PgWorker {
            client,
            two: self.two,
            insert_one,
            insert_many,
            update,
        }))
    }
}

struct PgWorker {
    client: Client,
    two: bool,
    insert_one: Statement,
    insert_many: Statement,
    update: Statement,
}

impl Worker for PgWorker {
    fn insert_batch(&mut self, keys: &[Key16]) -> Result<usize> {
        if let [key] = keys {
            return Ok(self.client.query(&self.insert_one, &[&&key[..]])?.len());
        }
        let mut sorted: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        sorted.sort_unstable();
        Ok(self.client.query(&self.insert_many, &[&sorted])?.len())
    }

    fn begin_complete(&mut self, key: &Key16, outcome: &[u8]) -> Result<bool> {
        if self.two {
            let new = !self
                .client
                .query(&self.insert_one, &[&&key[..]])?
                .is_empty();
            if new {
                self.client.execute(&self.update, &[&&key[..], &outcome])?;
            }
            return Ok(new);
        }
        let mut tx = self.client.transaction()?;
        let new = !tx.query(&self.insert_one, &[&&key[..]])?.is_empty();
        if new {
            tx.execute(&self.update, &[&&key[..], &outcome])?;
        }
        tx.commit()?;
        Ok(new)
    }
}
