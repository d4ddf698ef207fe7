//! The comparison harness: dedupkv against raw redb, SQLite, PostgreSQL and
//! an in-memory map, every contender behind one small trait
//! ([`contender::Contender`]) running the same generated workloads
//! ([`workload`]). `benches/compare.rs` is the command that runs and
//! reports them; `tests/compare_smoke.rs` runs every contender tiny.
//!
//! A workspace member of its own (as redb keeps its rivals in
//! redb-bench-compare), so the library never depends on the rival engines.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL, SQLite) are not code

// One file with no `crate::` paths, shared with the library rather than copied.
#[path = "../../../src/civil.rs"]
mod civil;

pub mod contender;
pub mod dedup;
pub mod floor;
pub mod lineup;
pub mod machine;
pub mod memory;
pub mod options;
pub mod pg;
pub mod pg_store;
pub mod processes;
pub mod redb_table;
pub mod report;
pub mod runner;
pub mod scenarios;
pub mod sqlite;
pub mod svg;
pub mod targets;
pub mod workload;

use std::path::PathBuf;

/// The workspace root (the library's directory), where `target/` and
/// `docs/` are.
///
/// # Examples
///
/// ```
/// let root = dedupkv_bench_compare::workspace_root();
/// assert!(root.join("docs/design.md").exists());
/// ```
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}
