//! dedupkv's test kit, shared by the integration tests, the loom models and
//! the `ops` fuzz target:
//!
//! - [`FaultBackend`]: one `PageBackend` for every fault and crash
//!   test. Its bytes outlive the store; a [`Plan`] makes it fail writes or
//!   syncs after N operations (an I/O error, `ENOSPC` or a panic); it keeps
//!   durable bytes apart from written ones, so a power-cut image can be
//!   reopened. [`FaultFile`] is its file-level sibling (append, write,
//!   sync, len) for a journal's files, with the same plans, torn writes
//!   included.
//! - [`model`]: the model of the store's semantics that random operation
//!   sequences are checked against.
//! - [`history`]: many threads making every call at once, their recorded
//!   history checked for linearizability against the same model.
//! - [`conformance`]: the operation-level contract's conformance suite, a
//!   driver generic over `dedupkv::contract` and the specification it
//!   checks every answer against; one call runs it on a backend.
//! - Helpers the tests repeat: [`started`], [`is_fault`], [`tempdir`],
//!   and the shared set-up: the start time [`T0`] and [`builder`].
//!
//! It uses dedupkv's public API only, and `std`/`parking_lot` locks (never
//! dedupkv's `sync` module), so it builds and behaves the same under
//! `--cfg dedupkv_loom`.
//!
//! # Examples
//!
//! ```
//! use dedupkv::{Fingerprint, Key, Store};
//! use dedupkv_testkit::{FaultBackend, Plan, is_fault, started};
//!
//! let backend = FaultBackend::new();
//! let store = Store::builder().open_with_backend(backend.clone())?;
//! let claim = started(store.begin(&Key::new("t", "a"), Fingerprint::NONE)?);
//! backend.arm(Plan::after(0).syncs_only());
//! let err = store.complete(&claim, b"done").unwrap_err();
//! assert!(is_fault(&err));
//! # Ok::<(), dedupkv::Error>(())
//! ```

mod backend;
pub mod conformance;
mod file;
pub mod history;
pub mod model;

pub use backend::{FaultBackend, Plan};
pub use file::FaultFile;

use dedupkv::{Begin, Claim, Error, ManualClock, Store, StoreBuilder};

/// The tests' start time on a [`ManualClock`]: 2023-11-14T22:14:00Z, on a
/// minute boundary (so on a bucket boundary for every granularity that
/// divides a minute).
pub const T0: u64 = 1_700_000_040_000;

/// [`T0`] rounded down to an hour: the start of a reconciliation window
/// of the default hour.
pub const T0_HOUR: u64 = T0 - T0 % 3_600_000;

/// The builder every test starts from: `clock`, and no background
/// eviction (a test evicts when it says so). Each test adds its settings.
///
/// # Examples
///
/// ```
/// use dedupkv::{Key, ManualClock};
/// use dedupkv_testkit::{T0, builder, tempdir};
///
/// let clock = ManualClock::new(T0);
/// let dir = tempdir();
/// let store = builder(&clock).open(dir.path().join("s.redb"))?;
/// assert!(store.insert_if_absent(&Key::new("t", "a"))?);
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn builder(clock: &ManualClock) -> StoreBuilder {
    Store::builder()
        .clock(clock.clone())
        .background_eviction(false)
}

/// A minute, the bucket granularity of [`hour_window`].
pub const MIN: std::time::Duration = std::time::Duration::from_secs(60);

/// An hour, the retention of [`hour_window`].
pub const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

/// [`builder`] with an hour's retention in minute buckets: the window the
/// eviction and dead-letter tests move their clock across.
///
/// # Examples
///
/// ```
/// use dedupkv::{Key, ManualClock};
/// use dedupkv_testkit::{HOUR, T0, hour_window, tempdir};
///
/// let clock = ManualClock::new(T0);
/// let dir = tempdir();
/// let store = hour_window(&clock).open(dir.path().join("s.redb"))?;
/// assert!(store.insert_if_absent(&Key::new("t", "a"))?);
/// clock.advance(2 * HOUR);
/// store.evict_expired()?;
/// assert!(store.insert_if_absent(&Key::new("t", "a"))?); // past the window
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn hour_window(clock: &ManualClock) -> StoreBuilder {
    builder(clock).retention(HOUR).bucket_granularity(MIN)
}

/// The claim of a `begin` that started the operation.
///
/// # Panics
///
/// On any other answer, naming it.
///
/// # Examples
///
/// ```
/// use dedupkv::{Fingerprint, Key, Store};
/// use dedupkv_testkit::{started, tempdir};
///
/// let dir = tempdir();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let claim = started(store.begin(&Key::new("t", "job"), Fingerprint::NONE)?);
/// store.complete(&claim, b"done")?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[track_caller]
pub fn started(b: Begin) -> Claim {
    match b {
        Begin::Started(c) => c,
        other => panic!("expected Started, got {other:?}"),
    }
}

/// Whether `e` is what an injected storage fault leads to: the failed
/// commit's storage error, or the poison every later write gets.
///
/// # Examples
///
/// ```
/// use dedupkv::{Key, Store};
/// use dedupkv_testkit::{FaultBackend, Plan, is_fault};
///
/// let backend = FaultBackend::new();
/// let store = Store::builder().open_with_backend(backend.clone())?;
/// backend.arm(Plan::after(0));
/// let err = store.insert_if_absent(&Key::new("t", "a")).unwrap_err();
/// assert!(is_fault(&err));
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn is_fault(e: &Error) -> bool {
    matches!(e, Error::Poisoned(_) | Error::Storage(_))
}

/// A fresh temporary directory, removed when dropped.
///
/// # Panics
///
/// If the directory cannot be made.
///
/// # Examples
///
/// ```
/// let dir = dedupkv_testkit::tempdir();
/// assert!(dir.path().is_dir());
/// ```
#[track_caller]
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// The PostgreSQL server's URL for a test named `test`
/// (`DEDUPKV_PG_URL`, which scripts/with-postgres.sh sets), or `None`
/// after saying on stderr that the test skipped; under CI (`CI` set, not
/// `false` or `0`) a missing server fails the test instead.
///
/// # Examples
///
/// ```
/// if let Some(url) = dedupkv_testkit::pg_url("example") {
///     assert!(!url.is_empty());
/// }
/// ```
#[allow(clippy::doc_markdown)] // product names (PostgreSQL) are not code
pub fn pg_url(test: &str) -> Option<String> {
    use std::io::Write as _;
    if let Ok(u) = std::env::var("DEDUPKV_PG_URL") {
        return Some(u);
    }
    let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "false" | "0"));
    assert!(
        !ci,
        "{test}: DEDUPKV_PG_URL is not set under CI: run it under scripts/with-postgres.sh"
    );
    // Straight to stderr, past the test harness's capture: a skip is said.
    let _ = writeln!(
        std::io::stderr(),
        "skip {test}: DEDUPKV_PG_URL is not set (run under scripts/with-postgres.sh)"
    );
    None
}
