//! The dead-letter area's vocabulary: [`DeadLetter`], how to list them
//! ([`Listing`], [`Page`]) and how to work them ([`Resolution`]).

use std::time::{Duration, SystemTime};

use crate::clock::{to_ms, to_system_time};
use crate::key::Key;
use crate::types::record::Record;

/// An operation whose retries were exhausted, as the dead-letter area
/// keeps it.
///
/// # Examples
/// ```
/// use dedupkv::{Begin, Failure, Fingerprint, Key, Listing, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("shop-42", "ship-7");
/// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
/// store.fail(&claim, Failure::Exhausted { reason: "carrier down", payload: Some(b"order 7") })?;
/// let page = store.dead_letters(&Listing::new())?;
/// let dl = &page.items[0];
/// assert_eq!((dl.key(), dl.attempts(), dl.reason()), (&key, 1, "carrier down"));
/// assert_eq!(dl.payload(), Some(&b"order 7"[..]));
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub(crate) record: Record,
    pub(crate) first_failed_at: u64,
    pub(crate) failed_at: u64,
    pub(crate) reason: String,
    pub(crate) payload: Option<Vec<u8>>,
}

impl DeadLetter {
    /// A dead letter of `record`'s key (its state `DeadLettered`, its
    /// attempts and first attempt's time), dead-lettered at `failed_at`,
    /// its round's first failure at `first_failed_at`, with the reason
    /// and payload of [`Failure::Exhausted`](crate::Failure::Exhausted)
    /// (for a backend of the [contract](crate::contract) building its
    /// answer, as [`InProgress::new`](crate::InProgress::new)).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{DeadLetter, Key, Record, State};
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    /// let rec = Record::new(Key::new("t", "op"), State::DeadLettered).with_attempts(3);
    /// let dl = DeadLetter::new(rec, at, at, "carrier down".into(), None);
    /// assert_eq!((dl.attempts(), dl.reason(), dl.failed_at()), (3, "carrier down", at));
    /// ```
    #[must_use]
    pub fn new(
        record: Record,
        first_failed_at: SystemTime,
        failed_at: SystemTime,
        reason: String,
        payload: Option<Vec<u8>>,
    ) -> DeadLetter {
        DeadLetter {
            record,
            first_failed_at: to_ms(first_failed_at),
            failed_at: to_ms(failed_at),
            reason,
            payload,
        }
    }

    /// The operation's key.
    ///
    /// # Examples
    /// See [`DeadLetter`].
    pub fn key(&self) -> &Key<'static> {
        self.record.key()
    }

    /// How many attempts were made.
    ///
    /// # Examples
    /// See [`DeadLetter`].
    pub fn attempts(&self) -> u32 {
        self.record.attempts()
    }

    /// When the operation's first attempt was claimed (its first failure
    /// came after it; see [`first_failed_at`](Self::first_failed_at)).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key, Listing, ManualClock, Store};
    /// # use std::time::{Duration, UNIX_EPOCH};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let Begin::Started(c) = store.begin(&Key::new("t", "op"), Fingerprint::NONE)? else { unreachable!() };
    /// clock.advance(Duration::from_secs(90));
    /// store.fail(&c, Failure::Exhausted { reason: "gave up", payload: None })?;
    /// let dl = &store.dead_letters(&Listing::new())?.items[0];
    /// assert_eq!(dl.first_attempt_at(), UNIX_EPOCH + Duration::from_millis(1_700_000_000_000));
    /// assert_eq!(dl.failed_at(), UNIX_EPOCH + Duration::from_millis(1_700_000_090_000));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn first_attempt_at(&self) -> SystemTime {
        self.record.first_seen_at()
    }

    /// When the last attempt failed and the operation was dead-lettered:
    /// the last failure.
    ///
    /// # Examples
    /// See [`first_failed_at`](Self::first_failed_at).
    pub fn failed_at(&self) -> SystemTime {
        to_system_time(self.failed_at)
    }

    /// When the first failure of its round of attempts came (since its
    /// first attempt, or since its latest [`requeue`](crate::Store::requeue)):
    /// a retryable failure ([`Failure::Retryable`](crate::Failure::Retryable)),
    /// a claim dropped without an answer, or an attempt found stranded —
    /// its lease lapsed, or its process was gone, from the store's reopen
    /// at the latest (as [`stranded_claims`](crate::Store::stranded_claims)
    /// counts). If the operation was dead-lettered at its first failure,
    /// the same as [`failed_at`](Self::failed_at). For a dead letter an
    /// older build recorded (store format 3), which kept no such time,
    /// the first attempt's time (it came no earlier).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key, Listing, ManualClock, Store};
    /// # use std::time::{Duration, UNIX_EPOCH};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let key = Key::new("t", "op");
    /// let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
    /// clock.advance(Duration::from_secs(10));
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.fail(&c, Failure::Retryable)?; // the first failure, at +10 s
    /// clock.advance(Duration::from_secs(50));
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.fail(&c, Failure::Exhausted { reason: "gave up", payload: None })?; // the last, at +60 s
    /// let dl = &store.dead_letters(&Listing::new())?.items[0];
    /// assert_eq!(dl.first_failed_at(), at(1_700_000_010_000));
    /// assert_eq!(dl.failed_at(), at(1_700_000_060_000));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn first_failed_at(&self) -> SystemTime {
        to_system_time(self.first_failed_at)
    }

    /// The reason given with [`Failure::Exhausted`](crate::Failure::Exhausted).
    ///
    /// # Examples
    /// See [`DeadLetter`].
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The payload given with it, if any.
    ///
    /// # Examples
    /// See [`DeadLetter`].
    pub fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }

    /// The key's record (state [`State::DeadLettered`](crate::State::DeadLettered)):
    /// fingerprint, provider key, token of the last attempt.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key, Listing, State, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let Begin::Started(c) = store.begin(&Key::new("t", "op"), Fingerprint::of("req"))? else { unreachable!() };
    /// # store.fail(&c, Failure::Exhausted { reason: "gave up", payload: None })?;
    /// let dl = &store.dead_letters(&Listing::new())?.items[0];
    /// assert_eq!(dl.record().state(), State::DeadLettered);
    /// assert_eq!(dl.record().fingerprint(), Some(Fingerprint::of("req")));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn record(&self) -> &Record {
        &self.record
    }
}

/// Which entries a listing returns: optionally one scope, optionally only
/// those older than an age, oldest first, at most `limit` per page, from
/// a cursor.
///
/// # Examples
/// ```
/// use dedupkv::{Listing, Store};
/// use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let mut listing = Listing::new().scope("shop-42").older_than(Duration::from_secs(3600)).limit(50);
/// loop {
///     let page = store.dead_letters(&listing)?;
///     for dl in &page.items {
///         println!("{}: {}", dl.key(), dl.reason());
///     }
///     match page.next {
///         Some(cursor) => listing = listing.after(cursor),
///         None => break,
///     }
/// }
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Listing {
    pub(crate) scope: Option<Vec<u8>>,
    pub(crate) older_than: Option<Duration>,
    pub(crate) after: Option<Cursor>,
    pub(crate) limit: usize,
}

impl Default for Listing {
    fn default() -> Self {
        Listing {
            scope: None,
            older_than: None,
            after: None,
            limit: 100,
        }
    }
}

impl Listing {
    /// Every entry, 100 per page.
    ///
    /// # Examples
    /// See [`Listing`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Only entries of this scope. Default: every scope.
    ///
    /// # Examples
    /// See [`Listing`].
    pub fn scope(mut self, scope: impl AsRef<[u8]>) -> Self {
        self.scope = Some(scope.as_ref().to_vec());
        self
    }

    /// Only entries at least this old. Default: any age.
    ///
    /// # Examples
    /// See [`Listing`].
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// At most `n` entries per page (0 counts as 1). Default: 100.
    ///
    /// # Examples
    /// See [`Listing`].
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n.max(1);
        self
    }

    /// Entries after `cursor` (from the previous [`Page::next`]).
    ///
    /// # Examples
    /// See [`Listing`].
    pub fn after(mut self, cursor: Cursor) -> Self {
        self.after = Some(cursor);
        self
    }

    /// What the listing asks for — its scope, minimum age, cursor and page
    /// size — for a backend outside this crate to honour.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::Listing;
    /// use std::time::Duration;
    ///
    /// let l = Listing::new().scope("shop-42").older_than(Duration::from_secs(60)).limit(10);
    /// assert_eq!(l.requested(), (Some(&b"shop-42"[..]), Some(Duration::from_secs(60)), None, 10));
    /// ```
    #[must_use]
    pub fn requested(&self) -> (Option<&[u8]>, Option<Duration>, Option<Cursor>, usize) {
        (
            self.scope.as_deref(),
            self.older_than,
            self.after,
            self.limit,
        )
    }
}

/// Where a listing stopped; pass it to [`Listing::after`] for the next
/// page. Entries are ordered oldest first (ties in a fixed order), so
/// paging never repeats or skips an entry that stays put.
///
/// A cursor belongs to the listing that made it: the store (its file) and
/// the kind of listing. Passed to another store, or to another listing of
/// the same store (a [`dead_letters`](crate::Store::dead_letters) cursor
/// to [`pending_intents`](crate::Store::pending_intents)), it is refused
/// with [`Error::InvalidArgument`](crate::Error::InvalidArgument)
/// (`what: "cursor"`) instead of starting that listing at a position that
/// means nothing there. It stays valid across reopens of the same file.
///
/// # Examples
/// ```
/// use dedupkv::{Begin, Error, Failure, Fingerprint, Key, Listing, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// for id in ["a", "b"] {
///     let Begin::Started(c) = store.begin(&Key::new("t", id), Fingerprint::NONE)? else { unreachable!() };
///     store.fail(&c, Failure::Exhausted { reason: "gave up", payload: None })?;
/// }
/// let page = store.dead_letters(&Listing::new().limit(1))?;
/// let cursor = page.next.expect("a second page");
/// assert_eq!(store.dead_letters(&Listing::new().after(cursor))?.items.len(), 1);
/// let other = Store::open(dir.path().join("other.redb"))?;
/// assert!(matches!(
///     other.dead_letters(&Listing::new().after(cursor)),
///     Err(Error::InvalidArgument { what: "cursor", .. })
/// ));
/// assert!(matches!(
///     store.stranded_claims(&Listing::new().after(cursor)),
///     Err(Error::InvalidArgument { what: "cursor", .. })
/// ));
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    /// The store whose listing made it (a hash of its file's key secret).
    pub(crate) store: u64,
    /// The kind of listing that made it.
    pub(crate) listing: u8,
    pub(crate) at: u64,
    pub(crate) id: u128,
    pub(crate) seq: u64,
}

impl Cursor {
    /// Where it stands within its listing.
    pub(crate) fn position(self) -> (u64, u128, u64) {
        (self.at, self.id, self.seq)
    }

    /// A cursor made by a backend outside this crate: `store` names the
    /// store and `listing` the kind of listing that made it (the backend
    /// refuses a cursor whose two differ from its own), `at` and `id`
    /// where it stands (an entry's time and a tie-breaker).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::Cursor;
    ///
    /// let c = Cursor::of_backend(7, 1, 1_700_000_000_000, 42);
    /// assert_eq!(c.backend_parts(), (7, 1, 1_700_000_000_000, 42));
    /// ```
    #[must_use]
    pub const fn of_backend(store: u64, listing: u8, at: u64, id: u128) -> Cursor {
        Cursor {
            store,
            listing,
            at,
            id,
            seq: 0,
        }
    }

    /// The parts [`of_backend`](Self::of_backend) takes: the store, the
    /// kind of listing, the time and the tie-breaker.
    ///
    /// # Examples
    /// See [`of_backend`](Self::of_backend).
    #[must_use]
    pub const fn backend_parts(&self) -> (u64, u8, u64, u128) {
        (self.store, self.listing, self.at, self.id)
    }
}

/// One page of a listing.
///
/// # Examples
/// See [`Listing`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page<T> {
    /// The entries, oldest first.
    pub items: Vec<T>,
    /// Where the next page starts, if there is one.
    pub next: Option<Cursor>,
}

impl<T> Page<T> {
    /// A page of `items`, the next starting at `next`: for a backend
    /// outside this crate.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::Page;
    ///
    /// let page = Page::new(vec![1, 2], None);
    /// assert_eq!(page.items, [1, 2]);
    /// ```
    #[must_use]
    pub fn new(items: Vec<T>, next: Option<Cursor>) -> Page<T> {
        Page { items, next }
    }
}

/// How an operator closes a dead letter with [`resolve`](crate::Store::resolve).
///
/// # Examples
/// ```
/// use dedupkv::{Begin, Failure, Fingerprint, Key, Resolution, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("shop-42", "ship-7");
/// # let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
/// # store.fail(&c, Failure::Exhausted { reason: "carrier down", payload: None })?;
/// // Shipped by hand: record the outcome every later begin replays.
/// assert!(store.resolve(&key, Resolution::Completed(b"label 1Z999 (by hand)"))?);
/// let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
/// assert_eq!(rec.outcome(), Some(&b"label 1Z999 (by hand)"[..]));
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution<'a> {
    /// The operation is done after all: store this outcome.
    Completed(&'a [u8]),
    /// It will not be done: store a final failure with this note.
    Abandoned(&'a str),
}
