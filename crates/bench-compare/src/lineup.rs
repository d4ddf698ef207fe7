//! The contenders of a comparison run, in table order.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL, SQLite) are not code

use crate::contender::{Contender, Result};
use crate::dedup::Dedupkv;
use crate::floor::Floor;
use crate::memory::Memory;
use crate::pg::Postgres;
use crate::pg_store::PgBackend;
use crate::redb_table::RedbTable;
use crate::sqlite::Sqlite;

/// The contenders that can run here, and why the others cannot.
pub struct Lineup {
    /// In table order.
    pub contenders: Vec<Box<dyn Contender>>,
    /// One line per skipped contender, saying why.
    pub skipped: Vec<String>,
}

/// Every contender that can run here. PostgreSQL runs only when `pg_url`
/// is given; a given server that cannot be reached is an error, not a skip.
pub fn all(pg_url: Option<&str>) -> Result<Lineup> {
    let mut list: Vec<Box<dyn Contender>> = vec![
        Box::new(Dedupkv::immediate()),
        Box::new(Dedupkv::journal()),
        Box::new(Dedupkv::deferred_10ms()),
        Box::new(RedbTable),
        Box::new(Sqlite::full()),
        Box::new(Sqlite::full_two_transactions()),
        Box::new(Sqlite::normal()),
    ];
    let mut skipped = Vec::new();
    match pg_url {
        Some(url) => {
            let pg = Postgres::connect(url).map_err(|e| {
                format!(
                    "{} is set but the server is unusable: {e}",
                    crate::pg::URL_ENV
                )
            })?;
            let two = pg.two_transactions();
            list.push(Box::new(pg));
            list.push(Box::new(two));
            list.push(Box::new(PgBackend::grouped(url)));
            list.push(Box::new(PgBackend::ungrouped(url)));
        }
        None => skipped.push(format!(
            "PostgreSQL skipped: {} is not set (run under scripts/with-postgres.sh)",
            crate::pg::URL_ENV
        )),
    }
    list.push(Box::new(Floor::fdatasync_4k()));
    list.push(Box::new(Floor::dsync_4k()));
    list.push(Box::new(Floor::fdatasync_record()));
    list.push(Box::new(Memory));
    Ok(Lineup {
        contenders: list,
        skipped,
    })
}

/// The connection string from the environment, if set and not blank.
pub fn pg_url_from_env() -> Option<String> {
    std::env::var(crate::pg::URL_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
}
