//! Reconciliation's vocabulary: a window's totals ([`Tally`]) and how they
//! compare with the system of record's ([`Reconciliation`]).

use std::time::{Duration, SystemTime};

/// The completed operations of one scope in one window: how many, and the
/// sum of their amounts ([`Store::complete_with_amount`](crate::Store::complete_with_amount);
/// a plain `complete` counts with amount 0). Also what the caller gives
/// [`Store::reconcile`](crate::Store::reconcile) from the system of record (then `window` is
/// ignored).
///
/// # Examples
/// ```
/// use dedupkv::{Begin, Fingerprint, Key, ManualClock, Store, Tally};
/// use std::time::{Duration, UNIX_EPOCH};
/// # let dir = tempfile::tempdir().unwrap();
/// let clock = ManualClock::new(1_700_002_800_000); // 13:00 UTC
/// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
/// let Begin::Started(c) = store.begin(&Key::new("eu", "charge-1"), Fingerprint::NONE)? else { unreachable!() };
/// store.complete_with_amount(&c, b"ch_1", 2_500)?;
/// let t = &store.tallies("eu")?[0];
/// assert_eq!((t.count, t.amount, t.window), (1, 2_500, Duration::from_secs(3600)));
/// assert_eq!(t.window_start, UNIX_EPOCH + Duration::from_millis(1_700_002_800_000));
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tally {
    /// The window's start.
    pub window_start: SystemTime,
    /// The window's length.
    pub window: Duration,
    /// Completed operations.
    pub count: u64,
    /// The sum of their amounts.
    pub amount: i128,
}

impl Tally {
    /// The totals of the window starting at `window_start`, as the system
    /// of record counts them.
    ///
    /// # Examples
    /// See [`Store::reconcile`](crate::Store::reconcile).
    pub fn new(window_start: SystemTime, count: u64, amount: i128) -> Tally {
        Tally {
            window_start,
            window: Duration::ZERO,
            count,
            amount,
        }
    }
}

/// One window of a reconciliation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowDiff {
    /// The window's start.
    pub window_start: SystemTime,
    /// What the store counted.
    pub ours: (u64, i128),
    /// What the system of record counted.
    pub theirs: (u64, i128),
    /// Operations completed here that the system of record lacks: effects
    /// lost on the way.
    pub missing: u64,
    /// Operations in the system of record beyond those completed here:
    /// duplicate effects, or work done outside the store.
    pub extra: u64,
}

impl WindowDiff {
    /// Whether both sides agree on the count and the amount.
    ///
    /// # Examples
    /// See [`Store::reconcile`](crate::Store::reconcile).
    pub fn is_clean(&self) -> bool {
        self.ours == self.theirs
    }
}

/// The result of [`Store::reconcile`](crate::Store::reconcile): every
/// window either side counted, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconciliation {
    /// Per window, oldest first.
    pub windows: Vec<WindowDiff>,
}

impl Reconciliation {
    /// Whether every window agrees.
    ///
    /// # Examples
    /// See [`Store::reconcile`](crate::Store::reconcile).
    pub fn is_clean(&self) -> bool {
        self.windows.iter().all(WindowDiff::is_clean)
    }

    /// The windows that disagree.
    ///
    /// # Examples
    /// See [`Store::reconcile`](crate::Store::reconcile).
    pub fn differences(&self) -> impl Iterator<Item = &WindowDiff> {
        self.windows.iter().filter(|w| !w.is_clean())
    }
}
