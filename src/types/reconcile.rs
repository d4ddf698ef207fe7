//! Reconciliation's vocabulary: a window's totals ([`Tally`]) and how they
//! compare with the system of record's ([`Reconciliation`]); a window's
//! keys as the system of record lists them ([`WindowKeys`]) and how they
//! compare with the store's ([`KeyReconciliation`]).

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
    /// The sum of their amounts: each an `i64`
    /// ([`Store::complete_with_amount`](crate::Store::complete_with_amount)),
    /// summed in an `i128` so the sum never overflows.
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

/// Which key of an operation the system of record lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyKind {
    /// The operation's id within its scope (the `id` of its [`Key`](crate::Key)),
    /// as the caller sent it along (an order number in the request).
    Id,
    /// Its [`Claim::provider_key`](crate::Claim::provider_key), 32 hex
    /// digits (either case), as sent in an `Idempotency-Key` header.
    ProviderKey,
}

/// The keys the system of record lists for one window, bucketed by its own
/// clock: what [`Store::reconcile_keys`](crate::Store::reconcile_keys)
/// compares with the keys the store kept.
///
/// # Examples
/// See [`Store::reconcile_keys`](crate::Store::reconcile_keys).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowKeys {
    /// The window's start: a boundary of the store's `reconcile_window`.
    pub window_start: SystemTime,
    /// Which key `keys` are.
    pub kind: KeyKind,
    /// The keys, in any order; one listed twice is two effects.
    pub keys: Vec<Vec<u8>>,
}

impl WindowKeys {
    /// The operation ids the system of record lists for the window starting
    /// at `window_start`.
    ///
    /// # Examples
    /// See [`Store::reconcile_keys`](crate::Store::reconcile_keys).
    pub fn ids<K: AsRef<[u8]>>(
        window_start: SystemTime,
        keys: impl IntoIterator<Item = K>,
    ) -> WindowKeys {
        Self::new(window_start, KeyKind::Id, keys)
    }

    /// The provider keys the system of record lists for the window starting
    /// at `window_start`.
    ///
    /// # Examples
    /// See [`Store::reconcile_keys`](crate::Store::reconcile_keys).
    pub fn provider_keys<K: AsRef<[u8]>>(
        window_start: SystemTime,
        keys: impl IntoIterator<Item = K>,
    ) -> WindowKeys {
        Self::new(window_start, KeyKind::ProviderKey, keys)
    }

    fn new<K: AsRef<[u8]>>(
        window_start: SystemTime,
        kind: KeyKind,
        keys: impl IntoIterator<Item = K>,
    ) -> WindowKeys {
        WindowKeys {
            window_start,
            kind,
            keys: keys.into_iter().map(|k| k.as_ref().to_vec()).collect(),
        }
    }
}

/// One window of a key reconciliation: which keys disagree. Keys are of
/// the kind the call was given (provider keys as 32 lowercase hex digits
/// on the store's side); each list is sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyWindowDiff {
    /// The window's start.
    pub window_start: SystemTime,
    /// Keys the system of record lists here that the store completed in
    /// this window, or across one of its boundaries within the settle
    /// margin (those are in `straddled` too).
    pub matched: u64,
    /// Operations completed here in this window that the system of record
    /// lists neither here nor, within the settle margin, in the window
    /// next to it: effects lost, or never made.
    pub missing: Vec<Vec<u8>>,
    /// Keys the system of record lists here that the store did not
    /// complete in this window nor, within the settle margin, in the one
    /// next to it: duplicate effects (a key listed twice), or work done
    /// outside the store.
    pub extra: Vec<Vec<u8>>,
    /// Keys the system of record lists here that the store completed in
    /// the window next to it, within the settle margin of their common
    /// boundary: one operation seen on both sides of a boundary, matched
    /// once.
    pub straddled: Vec<Vec<u8>>,
    /// Operations completed here within the settle margin of a boundary
    /// whose other side the call did not give: the system of record may
    /// list them there. Reconcile that window with this one to settle them.
    pub unsettled: Vec<Vec<u8>>,
}

impl KeyWindowDiff {
    /// Whether nothing is missing, extra or unsettled.
    ///
    /// # Examples
    /// See [`Store::reconcile_keys`](crate::Store::reconcile_keys).
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.extra.is_empty() && self.unsettled.is_empty()
    }
}

/// The result of [`Store::reconcile_keys`](crate::Store::reconcile_keys):
/// every window the call gave, and every window between them that the
/// store completed operations in, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyReconciliation {
    /// Per window, oldest first.
    pub windows: Vec<KeyWindowDiff>,
}

impl KeyReconciliation {
    /// Whether every window is clean.
    ///
    /// # Examples
    /// See [`Store::reconcile_keys`](crate::Store::reconcile_keys).
    pub fn is_clean(&self) -> bool {
        self.windows.iter().all(KeyWindowDiff::is_clean)
    }

    /// The windows that are not clean.
    ///
    /// # Examples
    /// See [`Store::reconcile_keys`](crate::Store::reconcile_keys).
    pub fn differences(&self) -> impl Iterator<Item = &KeyWindowDiff> {
        self.windows.iter().filter(|w| !w.is_clean())
    }
}
