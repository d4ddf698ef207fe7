//! Per-call settings.

use std::time::Duration;

/// Settings of one operation, for [`Store::begin_with`](crate::Store::begin_with):
/// its lease and its retention, instead of the store's.
///
/// A handler knows its own deadline (a function invocation's remaining
/// time, an HTTP request's timeout): give the claim a lease to match. An
/// operation type with its own retry window on a shared store keeps its
/// keys for its own retention, shorter or longer than the store's
/// (never shorter than the store's `max_retry_window`, when one is set).
///
/// # Examples
/// ```
/// use dedupkv::{Begin, BeginOptions, Fingerprint, Key, Store};
/// use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let opts = BeginOptions::new()
///     .lease(Duration::from_secs(5))            // this handler's deadline
///     .retention(Duration::from_secs(2 * 3600)); // this source retries for 2 h
/// let Begin::Started(claim) = store.begin_with(&Key::new("t", "op"), Fingerprint::NONE, &opts)? else {
///     unreachable!()
/// };
/// store.complete(&claim, b"done")?; // kept for 2 h, not the store's 24 h
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use]
pub struct BeginOptions {
    pub(crate) lease: Option<Duration>,
    pub(crate) retention: Option<Duration>,
}

impl BeginOptions {
    /// The store's settings for everything.
    ///
    /// # Examples
    /// See [`BeginOptions`].
    pub fn new() -> Self {
        Self::default()
    }

    /// This claim's lease: how long others wait before taking the key
    /// over, and what [`renew`](crate::Store::renew) extends it by.
    /// Default: the store's lease. Must be at least 1 ms and span fewer
    /// than 2^22 buckets.
    ///
    /// # Examples
    /// See [`BeginOptions`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long the operation's key is kept after its latest record (the
    /// claim, then its outcome): the store's retention by default. It may
    /// be shorter than the store's, but not shorter than the store's
    /// `max_retry_window`; a key's retention never ends earlier than its
    /// previous record's.
    ///
    /// # Examples
    /// See [`BeginOptions`].
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// The lease [`lease`](Self::lease) asked for (`None`: the store's),
    /// for a backend outside this crate to honour.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::BeginOptions;
    /// use std::time::Duration;
    ///
    /// let o = BeginOptions::new().lease(Duration::from_secs(5));
    /// assert_eq!(o.requested_lease(), Some(Duration::from_secs(5)));
    /// assert_eq!(BeginOptions::new().requested_lease(), None);
    /// ```
    #[must_use]
    pub const fn requested_lease(&self) -> Option<Duration> {
        self.lease
    }

    /// The retention [`retention`](Self::retention) asked for (`None`: the
    /// store's), for a backend outside this crate to honour.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::BeginOptions;
    /// use std::time::Duration;
    ///
    /// let o = BeginOptions::new().retention(Duration::from_secs(60));
    /// assert_eq!(o.requested_retention(), Some(Duration::from_secs(60)));
    /// ```
    #[must_use]
    pub const fn requested_retention(&self) -> Option<Duration> {
        self.retention
    }
}
