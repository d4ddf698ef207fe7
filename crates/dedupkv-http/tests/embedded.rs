//! The layer over the embedded store: every answer of tests/suite.

mod suite;

/// A fresh store in a temporary directory (kept for the test's life).
#[allow(clippy::unnecessary_wraps)] // the suite's opener may fail or skip
fn open(_test: &str) -> Result<Option<dedupkv::Store>, Box<dyn std::error::Error + Send + Sync>> {
    let dir = tempfile::tempdir()?;
    let store = dedupkv::Store::open(dir.path().join("http.redb"))?;
    // The directory lives as long as the test process: the store's file
    // must outlast the test, and a temp dir is removed at exit anyway.
    std::mem::forget(dir);
    Ok(Some(store))
}

suite_tests!(open);
