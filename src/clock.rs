//! Time, injected: leases, expiry and takeover read the store's [`Clock`],
//! so tests advance a [`ManualClock`] instead of sleeping.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
///
/// The store reads it for lease expiry, takeover and retention. Implement it
/// to drive time yourself; [`SystemClock`] is the default.
///
/// # Examples
/// ```
/// use dedupkv::{Clock, ManualClock};
/// let clock = ManualClock::new(1_000);
/// clock.advance(std::time::Duration::from_secs(2));
/// assert_eq!(clock.now_millis(), 3_000);
/// ```
pub trait Clock: Debug + Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    ///
    /// The store's time never goes backwards: it is the highest reading it
    /// has used, kept across reopen (at least the latest time it recorded).
    /// While the clock reads earlier than that (stepped back, or at 1970
    /// on a machine without a real-time clock), the store holds its time
    /// there, so nothing is forgotten, no lease lapses and no key expires
    /// until the clock catches up; [`Stats::clock_behind`](crate::Stats)
    /// counts such readings and a `tracing` warning marks the episode. A
    /// reading past 9999-12-31 is taken as that date. A clock that jumps
    /// far forward by mistake therefore expires keys early, and the store
    /// keeps that time: keep the clock right (NTP slews, it does not step).
    fn now_millis(&self) -> u64;
}

/// The operating system's wall clock.
///
/// # Examples
/// ```
/// use dedupkv::{Clock, SystemClock};
/// assert!(SystemClock.now_millis() > 1_600_000_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// # Examples
/// ```
/// use dedupkv::{ManualClock, Store};
/// use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// let clock = ManualClock::new(1_700_000_000_000);
/// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
/// clock.advance(Duration::from_secs(60)); // a lease of 30 s has now lapsed
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `millis` milliseconds since the Unix epoch.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Clock, ManualClock};
    /// assert_eq!(ManualClock::new(5).now_millis(), 5);
    /// ```
    pub fn new(millis: u64) -> Self {
        Self(Arc::new(AtomicU64::new(millis)))
    }

    /// Moves the clock forward by `by` (saturating).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Clock, ManualClock};
    /// let c = ManualClock::new(0);
    /// c.advance(std::time::Duration::from_millis(7));
    /// assert_eq!(c.now_millis(), 7);
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let mut cur = self.0.load(Ordering::SeqCst);
        loop {
            match self.0.compare_exchange(
                cur,
                cur.saturating_add(by),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Sets the clock to `millis` milliseconds since the Unix epoch.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Clock, ManualClock};
    /// let c = ManualClock::new(0);
    /// c.set(42);
    /// assert_eq!(c.now_millis(), 42);
    /// ```
    pub fn set(&self, millis: u64) {
        self.0.store(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

pub(crate) fn to_system_time(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(millis)
}

/// `t` in ms since the epoch (0 before it).
pub(crate) fn to_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, millis)
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
