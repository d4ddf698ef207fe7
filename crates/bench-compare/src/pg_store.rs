//! dedupkv's PostgreSQL backend (`dedupkv-postgres`), with its client-side
//! group commit of concurrent inserts and without: the same server and
//! durability (`synchronous_commit=on`) as the plain `INSERT … ON
//! CONFLICT` contender beside it.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL) are not code

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use dedupkv::contract::{Outcome, Settle, Write};
use dedupkv::{Began, BeginOptions, Fingerprint, Key};
use dedupkv_postgres::PgStore;
use postgres::{Client, NoTls};

use crate::contender::{Contender, Instance, Key16, Result, SCOPE, Worker};

static SCHEMAS: AtomicU32 = AtomicU32::new(0);

/// A `PgStore` on the server at `url`, grouping up to `statements`
/// concurrent inserts' statements in flight (`0`: one statement each).
pub struct PgBackend {
    url: String,
    statements: usize,
}

impl PgBackend {
    /// The backend with its default group commit, or as many statements
    /// in flight as `DEDUPKV_BENCH_PG_GROUP` says (for a sweep).
    pub fn grouped(url: &str) -> Self {
        let statements = std::env::var("DEDUPKV_BENCH_PG_GROUP")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(dedupkv_postgres::DEFAULT_GROUP_COMMIT);
        Self {
            url: url.to_owned(),
            statements,
        }
    }

    /// The backend sending each insert alone.
    pub fn ungrouped(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            statements: 0,
        }
    }
}

impl Contender for PgBackend {
    fn id(&self) -> &'static str {
        if self.statements == 0 {
            "dedupkv-pg-single"
        } else {
            "dedupkv-pg"
        }
    }

    fn name(&self) -> String {
        if self.statements == 0 {
            "dedupkv on PostgreSQL, one statement per insert".into()
        } else {
            format!(
                "dedupkv on PostgreSQL, group commit ({} in flight)",
                self.statements
            )
        }
    }

    fn durability(&self) -> &'static str {
        "durable: synchronous_commit=on"
    }

    fn open(&self, _expected_keys: usize) -> Result<Box<dyn Instance>> {
        let schema = format!(
            "dedupkv_bench_{}_{}",
            std::process::id(),
            SCHEMAS.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = Client::connect(&self.url, NoTls)?;
        admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
        let store = self.store(&schema)?;
        admin.batch_execute("CHECKPOINT")?;
        Ok(Box::new(PgBackendInstance {
            store: Arc::new(store),
            schema,
            admin: Some(std::sync::Mutex::new(admin)),
        }))
    }

    fn attach(&self, name: &str) -> Result<Box<dyn Instance>> {
        Ok(Box::new(PgBackendInstance {
            store: Arc::new(self.store(name)?),
            schema: name.to_owned(),
            admin: None,
        }))
    }

    fn shared(&self) -> bool {
        true
    }
}

impl PgBackend {
    /// A store on `schema` (created when absent), as this contender sets it up.
    fn store(&self, schema: &str) -> Result<PgStore> {
        Ok(PgStore::builder(self.url.as_str())
            .schema(schema)
            .group_commit(self.statements)
            .max_idle(128)
            .open()?)
    }
}

struct PgBackendInstance {
    store: Arc<PgStore>,
    schema: String,
    /// The opener's connection, which drops the schema; `None` when attached.
    admin: Option<std::sync::Mutex<Client>>,
}

impl Drop for PgBackendInstance {
    fn drop(&mut self) {
        if let Some(Ok(admin)) = self.admin.as_mut().map(std::sync::Mutex::get_mut) {
            let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        }
    }
}

impl Instance for PgBackendInstance {
    fn shared_name(&self) -> Option<String> {
        Some(self.schema.clone())
    }

    fn worker(&self) -> Result<Box<dyn Worker>> {
        Ok(Box::new(PgBackendWorker {
            store: Arc::clone(&self.store),
        }))
    }
}

struct PgBackendWorker {
    store: Arc<PgStore>,
}

impl Worker for PgBackendWorker {
    fn insert_batch(&mut self, keys: &[Key16]) -> Result<usize> {
        let s = &*self.store;
        if let [key] = keys {
            return Ok(usize::from(s.tell(s.insert(&Key::new(SCOPE, key), None)?)?));
        }
        let keys: Vec<Key<'_>> = keys.iter().map(|k| Key::new(SCOPE, k)).collect();
        let news = s.tell(s.insert_batch(&keys)?)?;
        Ok(news.into_iter().filter(|&n| n).count())
    }

    fn begin_complete(&mut self, key: &Key16, outcome: &[u8]) -> Result<bool> {
        let s = &*self.store;
        let began = s.tell(s.begin(
            &Key::new(SCOPE, key),
            Fingerprint::NONE,
            &BeginOptions::new(),
            None,
        )?)?;
        let Began::Started(claim) = began else {
            return Ok(false);
        };
        s.tell(s.complete(&claim, Outcome::raw(outcome))?)?;
        Ok(true)
    }
}
