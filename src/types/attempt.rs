//! What an attempt is told and tells: [`InProgress`] (someone else holds
//! the key), [`Failure`] (how an attempt failed) and [`Forget`].

use std::time::SystemTime;

#[cfg(doc)]
use crate::Begin;
use crate::clock::to_system_time;
use crate::types::dead_letter::DeadLetter;
use crate::types::record::Record;

/// What `begin` answers, over a backend's claim handle `C`; the engine's
/// is [`Begin`] (`Began<Claim>`).
///
/// # Examples
/// ```
/// # use dedupkv::{Began, Begin, Fingerprint, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let answer: Began<dedupkv::Claim> = store.begin(&Key::new("t", "e"), Fingerprint::NONE)?;
/// assert!(matches!(answer, Begin::Started(_)));
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a Started claim must be completed or failed"]
pub enum Began<C> {
    /// This caller owns the attempt: do the work, then
    /// [`complete`](crate::Store::complete) or [`fail`](crate::Store::fail).
    Started(C),
    /// The operation finished before (completed, failed permanently, or
    /// recorded by `insert_if_absent`); here is its record and outcome.
    Completed(Record),
    /// Another attempt holds a live lease.
    InProgress(InProgress),
    /// The operation's retries were exhausted and it is in the dead-letter
    /// area: it is not retried until an operator
    /// [`requeue`](crate::Store::requeue)s or
    /// [`resolve`](crate::Store::resolve)s it.
    DeadLettered(DeadLetter),
}

impl<C> Began<C> {
    /// The same answer with its claim (if `Started`) turned by `f`.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::Began;
    ///
    /// let b: Began<u32> = Began::Started(7);
    /// assert!(matches!(b.map_claim(|c| c * 2), Began::Started(14)));
    /// ```
    pub fn map_claim<D>(self, f: impl FnOnce(C) -> D) -> Began<D> {
        match self {
            Began::Started(c) => Began::Started(f(c)),
            Began::Completed(r) => Began::Completed(r),
            Began::InProgress(p) => Began::InProgress(p),
            Began::DeadLettered(d) => Began::DeadLettered(d),
        }
    }
}

/// Details of a claim held by someone else.
///
/// # Examples
/// ```
/// # use dedupkv::{Begin, Fingerprint, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("t", "e");
/// let _first = store.begin(&key, Fingerprint::NONE)?;
/// let Begin::InProgress(info) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
/// assert_eq!(info.attempt(), 1);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InProgress {
    pub(crate) attempt: u32,
    pub(crate) lease_until: u64,
    pub(crate) first_at: u64,
}

impl InProgress {
    /// The details of `attempt`, first claimed at `first_seen_at`, whose
    /// lease ends at `lease_expires_at` (for a backend of the
    /// [contract](crate::contract) building its answer).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::InProgress;
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    /// let info = InProgress::new(2, at + Duration::from_secs(30), at);
    /// assert_eq!(info.attempt(), 2);
    /// assert_eq!(info.lease_expires_at(), at + Duration::from_secs(30));
    /// ```
    #[must_use]
    pub fn new(
        attempt: u32,
        lease_expires_at: SystemTime,
        first_seen_at: SystemTime,
    ) -> InProgress {
        InProgress {
            attempt,
            lease_until: crate::clock::to_ms(lease_expires_at),
            first_at: crate::clock::to_ms(first_seen_at),
        }
    }

    /// The running attempt's number (1 for the first).
    ///
    /// # Examples
    /// See [`InProgress`].
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the running attempt's lease lapses; after it, `begin` takes
    /// the key over.
    ///
    /// # Examples
    /// See [`Begin`].
    pub fn lease_expires_at(&self) -> SystemTime {
        to_system_time(self.lease_until)
    }

    /// When the key was first claimed.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "e");
    /// # let _first = store.begin(&key, Fingerprint::NONE)?;
    /// let Begin::InProgress(info) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert!(info.first_seen_at() < info.lease_expires_at());
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn first_seen_at(&self) -> SystemTime {
        to_system_time(self.first_at)
    }
}

/// The answer of [`Store::forget`](crate::Store::forget).
///
/// # Examples
/// See [`Store::forget`](crate::Store::forget).
#[derive(Debug)]
#[non_exhaustive]
pub enum Forget {
    /// The key's record is replaced by a forget record: this is what was
    /// forgotten.
    Forgotten(Record),
    /// The key is not recorded (or expired, or was forgotten already).
    NotFound,
    /// A live attempt holds the key: nothing was forgotten.
    InProgress(InProgress),
}

/// How an attempt failed, for [`Store::fail`](crate::Store::fail).
///
/// # Examples
/// ```
/// # use dedupkv::{Begin, Failure, Fingerprint, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// # let key = Key::new("t", "e");
/// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
/// store.fail(&claim, Failure::Retryable)?; // the next begin starts attempt 2
/// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
/// assert_eq!(claim.attempt(), 2);
/// # store.complete(&claim, b"")?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure<'a> {
    /// Free the key for another attempt of the same request; the attempt
    /// is counted. The next `begin` must bring the same fingerprint (or
    /// get [`FingerprintMismatch`](crate::Error::FingerprintMismatch)):
    /// this is the default because a retry is the same operation, and a
    /// different request under one key is usually a bug the mismatch
    /// catches.
    Retryable,
    /// Free the key for another attempt with any request: the next
    /// `begin` may bring a corrected request (another fingerprint), which
    /// is recorded from then on. The attempt count and first-attempt time
    /// are kept (the peer libraries delete the record instead, losing both).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "charge-7");
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::of("card 4242, expired"))? else { unreachable!() };
    /// store.fail(&c, Failure::RetryableAnyRequest)?; // "card expired": the client fixes the request
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::of("card 5555"))? else { unreachable!() };
    /// assert_eq!(c.attempt(), 2);
    /// # store.complete(&c, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    RetryableAnyRequest,
    /// Record a terminal failure with this payload; every later `begin`
    /// replays it as [`Begin::Completed`] with a [`Failed`](crate::State::Failed) record.
    Permanent(&'a [u8]),
    /// The operation's retries are exhausted: move it to the dead-letter
    /// area with `reason` (and, if given, `payload`, e.g. the request, for
    /// whoever works the area). Every later `begin` answers
    /// [`Begin::DeadLettered`] until it is
    /// [`requeue`](crate::Store::requeue)d or
    /// [`resolve`](crate::Store::resolve)d; retention never drops it.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Begin, Failure, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "ship-7");
    /// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.fail(&claim, Failure::Exhausted { reason: "carrier down after 5 attempts", payload: None })?;
    /// let Begin::DeadLettered(dl) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!(dl.reason(), "carrier down after 5 attempts");
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    Exhausted {
        /// Why, for the operator (kept whole, within `max_outcome_len`).
        reason: &'a str,
        /// Bytes to keep with it, if any.
        payload: Option<&'a [u8]>,
    },
}
