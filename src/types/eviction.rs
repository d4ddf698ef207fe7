//! What one eviction pass removed: [`Eviction`].

/// What one eviction pass removed.
///
/// # Examples
/// ```
/// # use dedupkv::{Key, ManualClock, Store};
/// # use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// let clock = ManualClock::new(1_700_000_000_000);
/// let store = Store::builder()
///     .clock(clock.clone())
///     .retention(Duration::from_secs(3600))
///     .background_eviction(false) // driven by hand below
///     .open(dir.path().join("s.redb"))?;
/// store.insert_if_absent(&Key::new("t", "e"))?;
/// clock.advance(Duration::from_secs(2 * 3600));
/// let ev = store.evict_expired()?;
/// assert_eq!((ev.buckets, ev.keys), (1, 1));
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Eviction {
    /// Buckets deleted.
    pub buckets: usize,
    /// Keys (and entity states) removed from the index.
    pub keys: u64,
    /// Of the buckets, those evicted before they expired, to honour the
    /// size bound.
    pub early_buckets: usize,
}
