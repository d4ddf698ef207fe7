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
    /// until the clock catches up (or, with [`ClockBehind::Advance`], runs
    /// on from it at the rate of [`elapsed_millis`](Self::elapsed_millis)); [`Stats::clock_behind`](crate::Stats)
    /// counts such readings and a `tracing` warning marks the episode. A
    /// reading past 9999-12-31 is taken as that date. A clock that jumps
    /// far forward by mistake therefore expires keys early, and the store
    /// keeps that time: keep the clock right (NTP slews, it does not step).
    fn now_millis(&self) -> u64;

    /// Milliseconds on a monotonic clock since an arbitrary start: never
    /// goes back and never jumps when the wall clock is stepped. The store
    /// reads it only with [`ClockBehind::Advance`], to let its time run on
    /// while [`now_millis`](Self::now_millis) reads behind it.
    ///
    /// The default counts from the first call in this process on
    /// [`std::time::Instant`]. A clock that drives time by hand (as
    /// [`ManualClock`] does) overrides it, so its steps and its passing
    /// time can be told apart.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Clock, SystemClock};
    /// let a = SystemClock.elapsed_millis();
    /// assert!(SystemClock.elapsed_millis() >= a);
    /// ```
    fn elapsed_millis(&self) -> u64 {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        millis(START.get_or_init(std::time::Instant::now).elapsed())
    }
}

/// What the store's time does while the clock reads behind it (see
/// [`StoreBuilder::clock_behind`](crate::StoreBuilder::clock_behind)).
///
/// The store's time never goes backwards. When the clock reads earlier than
/// a time the store has used or inherited (the clock was stepped back, or an
/// earlier owner of a replicated store had a clock that ran ahead), the
/// store either holds its time or runs on from it.
///
/// # Examples
/// ```
/// use dedupkv::{ClockBehind, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::builder()
///     .clock_behind(ClockBehind::Advance)
///     .open(dir.path().join("s.redb"))?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockBehind {
    /// The default: the store's time stands still until the clock catches
    /// up: no lease lapses and no key expires meanwhile. Right for a clock
    /// stepped back by a few seconds; a floor a year ahead holds every
    /// lease for a year.
    #[default]
    StandStill,
    /// The store's time runs on from the latest time it reached at the
    /// rate of the monotonic clock ([`Clock::elapsed_millis`]), so leases
    /// lapse and keys expire after the time that really passed. The times
    /// the store records stay ahead of the wall clock by the gap until the
    /// clock catches up. The way out of a time floor inherited from an
    /// owner whose clock ran ahead.
    Advance,
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
///
/// [`set`](Self::set) steps the wall clock (as an operator or NTP stepping
/// it would); [`advance`](Self::advance) is time passing, and moves its
/// [`elapsed_millis`](Clock::elapsed_millis) too.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<Manual>);

#[derive(Debug, Default)]
struct Manual {
    now: AtomicU64,
    elapsed: AtomicU64,
}

impl ManualClock {
    /// A clock reading `millis` milliseconds since the Unix epoch.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Clock, ManualClock};
    /// assert_eq!(ManualClock::new(5).now_millis(), 5);
    /// ```
    pub fn new(millis: u64) -> Self {
        Self(Arc::new(Manual {
            now: AtomicU64::new(millis),
            elapsed: AtomicU64::new(0),
        }))
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
        let by = millis(by);
        for clock in [&self.0.elapsed, &self.0.now] {
            // Saturating: `fetch_add` would wrap at u64::MAX.
            let _ = clock.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                Some(cur.saturating_add(by))
            });
        }
    }

    /// Sets the clock to `millis` milliseconds since the Unix epoch: a
    /// step, so [`elapsed_millis`](Clock::elapsed_millis) stays where it is.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Clock, ManualClock};
    /// let c = ManualClock::new(0);
    /// c.set(42);
    /// assert_eq!(c.now_millis(), 42);
    /// ```
    pub fn set(&self, millis: u64) {
        self.0.now.store(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> u64 {
        self.0.now.load(Ordering::SeqCst)
    }

    fn elapsed_millis(&self) -> u64 {
        self.0.elapsed.load(Ordering::SeqCst)
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
