//! The layer over PostgreSQL: every answer of tests/suite, on a fresh
//! schema each. The server is `DEDUPKV_PG_URL`'s (scripts/with-postgres.sh
//! starts one); without it these tests say they skipped, and under CI
//! (`CI` set, not `false` or `0`) they fail instead.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL) are not code

mod suite;

use std::sync::atomic::{AtomicU32, Ordering};

use dedupkv_postgres::PgStore;

fn open(test: &str) -> Result<Option<PgStore>, Box<dyn std::error::Error + Send + Sync>> {
    static N: AtomicU32 = AtomicU32::new(0);
    let Some(url) = dedupkv_testkit::pg_url(test) else {
        return Ok(None);
    };
    let schema = format!(
        "http_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos()
    );
    Ok(Some(PgStore::builder(url).schema(schema).open()?))
}

suite_tests!(open);
