//! Claims: the right to perform one attempt of an operation.

use std::fmt;
use std::time::SystemTime;

use crate::clock::to_system_time;
use crate::key::KeyHash;
use crate::store::Inner;
use crate::sync::{AtomicBool, AtomicU64, Ordering, Weak};
use crate::{Key, Record};

/// The answer of [`Store::begin`](crate::Store::begin).
///
/// # Examples
/// ```
/// # use dedupkv::{Begin, Fingerprint, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("shop-42", "charge-9");
/// match store.begin(&key, Fingerprint::of("100 EUR"))? {
///     Begin::Started(claim) => store.complete(&claim, b"charged")?,
///     Begin::Completed(record) => println!("replay: {:?}", record.outcome()),
///     Begin::InProgress(info) => println!("retry after {:?}", info.lease_expires_at()),
/// }
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a Started claim must be completed or failed"]
pub enum Begin {
    /// This caller owns the attempt: do the work, then
    /// [`complete`](crate::Store::complete) or [`fail`](crate::Store::fail).
    Started(Claim),
    /// The operation finished before (completed, failed permanently, or
    /// recorded by `insert_if_absent`); here is its record and outcome.
    Completed(Record),
    /// Another attempt holds a live lease.
    InProgress(InProgress),
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
}

/// The right to perform one attempt of an operation, with a lease and a
/// fencing token.
///
/// Finish it with [`Store::complete`](crate::Store::complete) or
/// [`Store::fail`](crate::Store::fail). Dropping an unfinished claim
/// releases the key as a retryable failure (without waiting for that
/// record to be durable; if it is lost in a crash the lease lapses instead).
/// A claim does not keep its store open: once the store is dropped, the
/// claim can no longer be finished and its lease lapses.
///
/// # Examples
/// ```
/// # use dedupkv::{Begin, Fingerprint, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("t", "e");
/// {
///     let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
///     assert_eq!(claim.attempt(), 1);
/// } // dropped: released
/// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
/// assert_eq!(claim.attempt(), 2);
/// # store.complete(&claim, b"")?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub struct Claim {
    /// Weak, so a forgotten or long-lived claim never keeps a closed store open.
    pub(crate) inner: Weak<Inner>,
    pub(crate) key: Key<'static>,
    pub(crate) hash: KeyHash,
    pub(crate) attempt: u32,
    pub(crate) token: u64,
    /// See [`Claim::provider_key`]; fixed for the operation's life.
    pub(crate) provider_key: u128,
    pub(crate) lease_until: AtomicU64,
    pub(crate) finished: AtomicBool,
    /// This attempt took over one that never answered.
    pub(crate) interrupted: bool,
}

impl Claim {
    /// The key this claim is for.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let Begin::Started(c) = store.begin(&Key::new("t", "e"), Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!(c.key().id(), b"e");
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn key(&self) -> &Key<'static> {
        &self.key
    }

    /// The attempt number: 1 for the first, +1 for each takeover or retry.
    ///
    /// # Examples
    /// See [`Claim`].
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether this attempt took over an earlier one that never answered:
    /// its process died (a claim left by an earlier process is taken over
    /// as soon as the store is reopened), its lease lapsed, or its claim
    /// was dropped without `complete` or `fail` (a handler that panicked). That attempt
    /// may have performed its side effect before it stopped: before
    /// repeating an external call, ask the system it called (look the
    /// operation up by its idempotency key) and complete with what it says.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("s.redb");
    /// let key = Key::new("shop-42", "ship-order-7");
    /// {
    ///     let store = Store::open(&path)?;
    ///     let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    ///     std::mem::forget(claim); // the process dies mid-attempt
    /// }
    /// let store = Store::open(&path)?; // restarted: no need to wait out the lease
    /// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!(claim.attempt(), 2);
    /// assert!(claim.interrupted()); // reconcile before calling out again
    /// # store.complete(&claim, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn interrupted(&self) -> bool {
        self.interrupted
    }

    /// The fencing token: unique per attempt, increasing across the store.
    /// Pass it to downstream systems that can reject writes from a stale
    /// attempt (a write carrying a smaller token than one already seen).
    ///
    /// It changes with every attempt, so it is **not** an idempotency key:
    /// a provider that deduplicates on it acts once per attempt. Use
    /// [`provider_key`](Self::provider_key) for that.
    ///
    /// # Examples
    /// See [`Record::token`].
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The idempotency key to pass to external systems (a payment or
    /// shipping provider's `Idempotency-Key`) for this operation: 32
    /// lowercase hex digits.
    ///
    /// It is the same on every attempt of one operation — after a takeover
    /// of a lapsed lease, a [`Failure::Retryable`] or a dropped claim, and
    /// after the store is reopened — so a provider that deduplicates on it
    /// acts once however often the work is retried. It differs between
    /// scopes, between keys, between stores (it is keyed with the store's
    /// persisted secret), and between two operations on one key (after the
    /// first one's record expired). [`Record::provider_key`] reports it too.
    ///
    /// Use it as THE key for external calls; keep [`token`](Self::token)
    /// for fencing.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "ship-order-7");
    /// let Begin::Started(first) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// let idempotency_key = first.provider_key();
    /// store.fail(&first, Failure::Retryable)?; // the provider timed out
    /// let Begin::Started(retry) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_ne!(retry.token(), first.token());
    /// assert_eq!(retry.provider_key(), idempotency_key); // the provider sees one request
    /// # store.complete(&retry, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn provider_key(&self) -> String {
        format!("{:032x}", self.provider_key)
    }

    /// When this claim's lease lapses (moved by [`Store::renew`](crate::Store::renew)).
    ///
    /// # Examples
    /// See [`Record::lease_expires_at`].
    pub fn lease_expires_at(&self) -> SystemTime {
        to_system_time(self.lease_until.load(Ordering::Acquire))
    }

    pub(crate) fn lease_until(&self) -> u64 {
        self.lease_until.load(Ordering::Acquire)
    }
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("key", &self.key)
            .field("attempt", &self.attempt)
            .field("token", &self.token)
            .field("provider_key", &self.provider_key())
            .field("lease_until", &self.lease_until())
            .finish_non_exhaustive()
    }
}

/// The provider key of the operation on (`scope`, `id`) first claimed at
/// `first_at` (ms): SipHash-1-3-128 keyed with the store's persisted secret,
/// over a domain tag, `len(scope)`, scope, id, `first_at` and the request
/// fingerprint. `first_at` and the fingerprint are carried from attempt to
/// attempt (and in every claim record), so every attempt of one operation
/// gets the same key; a corrected request (after
/// `Failure::RetryableAnyRequest`) gets a new one, since a provider refuses
/// (or replays the old answer to) a key reused with other parameters. The
/// fixed-size fields after the variable ones keep the framing unambiguous.
pub(crate) fn provider_key(
    secret: &[u8; 16],
    scope: &[u8],
    id: &[u8],
    first_at: u64,
    fingerprint: u128,
) -> u128 {
    use siphasher::sip128::Hasher128;
    use std::hash::Hasher;
    let mut h = siphasher::sip128::SipHasher13::new_with_key(secret);
    h.write(b"dedupkv provider key v2\0");
    h.write(&(scope.len() as u64).to_le_bytes());
    h.write(scope);
    h.write(id);
    h.write(&first_at.to_le_bytes());
    h.write(&fingerprint.to_le_bytes());
    h.finish128().as_u128()
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.finished.swap(true, Ordering::AcqRel)
            && let Some(inner) = self.inner.upgrade()
        {
            inner.release_dropped(self);
        }
    }
}
