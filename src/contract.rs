//! The operation-level contract: what a backend of the store promises,
//! per operation, over the shared vocabulary of `types/`.
//!
//! The engine (a redb-backed log under a sharded in-memory index) is the
//! first implementation; the faces ([`Store`](crate::Store), and
//! `AsyncStore` under feature `async`) and the partition set's `Work`
//! handle reach their backend through these traits only, so a second
//! backend (a `PostgreSQL` one, issue #31) plugs in under the same faces, and the
//! test kit's conformance suite runs over any implementation.
//!
//! # Contract
//!
//! A backend implements three traits:
//! - [`Read`]: answers that record nothing;
//! - [`Write`]: operations that record something, each decided
//!   atomically per key (a racer of the same key sees either all of a
//!   call's records or none of them);
//! - [`Settle`]: when an answer may be told;
//!
//! and, for the faces' other calls, [`Order`] (versions and the
//! sequencer), [`DeadLetters`] and [`Intents`].
//!
//! Every call returns its answer as a [`Pending`]: the value together
//! with the [`Basis`] it rests on, the positions in the backend's commit
//! order that must be durable (and, with a synchronous replica,
//! replicated) before the caller may act on the value. The call itself
//! never waits for them: the blocking face waits ([`Settle::wait`]) and
//! the async face awaits ([`Settle::settled`]) the same value. A backend
//! that commits before it returns (a SQL statement in its own
//! transaction) answers [`Basis::SETTLED`].
//!
//! What holds for every method:
//! - **Atomicity.** A call's records for one key are decided under one
//!   lock (or one statement) and become durable together: a crash keeps
//!   all of them or none. A batch call is atomic per item, not as a whole.
//! - **Durability.** What a call recorded is durable once its `Basis` is
//!   settled, under [`Durability::Immediate`](crate::Durability); under
//!   `Deferred` within the mode's delay. Nobody is told "new", "started"
//!   or "done" before that, and nobody is told "duplicate" or "in
//!   progress" before the record it was answered from is durable.
//! - **Errors.** A failed commit poisons the backend: every later call,
//!   and every [`Settle`] of a basis it did not cover, answers
//!   [`Error::Poisoned`](crate::Error::Poisoned); nothing in the failed
//!   commit is acknowledged. A bad argument fails that call alone, before
//!   anything is recorded ([`Error::InvalidArgument`](crate::Error::InvalidArgument),
//!   [`Error::InvalidInput`](crate::Error::InvalidInput)).
//! - **No thread state.** No method depends on the calling thread; the
//!   value and the basis are all the caller needs.
//!
//! A new operation is one method here, one room in the engine, one method
//! of the test kit's specification: every implementation and every
//! generic front fails to compile until it follows.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

pub use crate::api::StoreWaiter;
use crate::types::{
    Advance, Answer, Began, BeginOptions, Delivered, Failure, Forget, Intent, Record, Resolution,
    SequenceOptions, Sequenced, Update,
};
pub use crate::types::{Basis, Pending};
use crate::{Claim, Fingerprint, Key, Result};

mod listings;
mod reconcile_keys;
mod shared;
mod tallies;
mod waits;
pub use listings::Listings;
pub use reconcile_keys::{Completion, reconcile_keys};
pub use shared::{BoxedClaim, BoxedWaiter, SharedBackend, SharedClaim};
pub use tallies::{Tallies, reconcile_tallies, window_start};
pub use waits::Waits;

/// When an answer may be told: the blocking wait and the async poll of
/// the same [`Basis`].
///
/// # Contract
/// - [`wait`](Self::wait) returns `Ok` once every position of the basis
///   is as durable as the store's durability mode promises (and
///   replicated, with a synchronous replica); the poll answers `Ready(Ok)`
///   at the same moment. Neither records anything.
/// - Both answer `Err` ([`Error::Poisoned`](crate::Error::Poisoned),
///   [`Error::Fenced`](crate::Error::Fenced)) when a commit the basis
///   needs failed, or the store lost its ownership: then the value must
///   not be told.
/// - A poll that answers `Pending` has registered `cx`'s waker and is
///   woken by the commit that covers the basis (or by the failure); a
///   poll never commits or blocks on its own thread.
///
/// # Examples
/// ```
/// use dedupkv::contract::{Settle, Write};
/// use dedupkv::{Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let pending = Write::insert(&store, &Key::new("t", "a"), None)?;
/// assert!(store.tell(pending)?); // waited for its commit
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait Settle {
    /// A poll's registration, kept by the awaiting future between polls.
    type Waiter: Default + Send + Unpin;

    /// Blocks until `basis` is settled.
    ///
    /// # Errors
    /// See the trait's contract.
    fn wait(&self, basis: Basis) -> Result<()>;

    /// Polls for `basis` to be settled, registering `cx`'s waker in
    /// `waiter` when it is not.
    ///
    /// # Errors
    /// See the trait's contract.
    fn poll_settled(
        &self,
        basis: Basis,
        waiter: &mut Self::Waiter,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>>;

    /// Forgets a registration whose future was dropped before it was
    /// ready.
    fn stop_waiting(&self, waiter: &mut Self::Waiter);

    /// Waits for `pending`'s basis, then gives its value.
    ///
    /// # Errors
    /// Those of [`wait`](Self::wait).
    ///
    /// # Examples
    /// See [`Settle`].
    fn tell<T>(&self, pending: Pending<T>) -> Result<T> {
        let (value, basis) = pending.into_parts();
        self.wait(basis)?;
        Ok(value)
    }

    /// A future ready once `basis` is settled.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::contract::{Settle, Write};
    /// use dedupkv::{Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let store = Store::open(dir.path().join("s.redb"))?;
    /// let (new, basis) = Write::insert(&store, &Key::new("t", "a"), None)?.into_parts();
    /// rt.block_on(store.settled(basis))?;
    /// assert!(new);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    fn settled(&self, basis: Basis) -> Settled<'_, Self>
    where
        Self: Sized,
    {
        Settled {
            backend: self,
            basis,
            waiter: Self::Waiter::default(),
        }
    }
}

/// The future of [`Settle::settled`]. Dropped before it is ready, it only
/// stops waiting: what was recorded stands.
#[must_use = "futures do nothing unless polled"]
pub struct Settled<'a, S: Settle> {
    backend: &'a S,
    basis: Basis,
    waiter: S::Waiter,
}

impl<S: Settle> Future for Settled<'_, S> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = &mut *self;
        this.backend.poll_settled(this.basis, &mut this.waiter, cx)
    }
}

impl<S: Settle> Drop for Settled<'_, S> {
    fn drop(&mut self) {
        self.backend.stop_waiting(&mut self.waiter);
    }
}

impl<S: Settle> std::fmt::Debug for Settled<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settled")
            .field("basis", &self.basis)
            .finish_non_exhaustive()
    }
}

/// The read half: answers that record nothing.
///
/// # Contract
/// A read answers from records that are durable: it waits (blocking, on
/// the calling thread) for a record whose commit is in flight rather than
/// answer from it, so its basis is settled. After a failed commit every
/// read answers [`Error::Poisoned`](crate::Error::Poisoned).
///
/// # Examples
/// ```
/// use dedupkv::contract::{Read, Settle};
/// use dedupkv::{Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// assert!(store.tell(Read::get(&store, &Key::new("t", "a"))?)?.is_none());
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait Read {
    /// The latest record of `key`; `None` if it has none or it expired.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) and
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad key;
    /// [`Error::Corrupt`](crate::Error::Corrupt) for a damaged record;
    /// [`Error::Poisoned`](crate::Error::Poisoned); storage errors.
    fn get(&self, key: &Key<'_>) -> Result<Pending<Option<Record>>>;
}

/// How a claim is completed: its outcome (raw bytes, or a typed value's
/// encoding), and optionally its own retention and an amount for the
/// completion tallies.
///
/// # Examples
/// ```
/// use dedupkv::contract::Outcome;
/// use std::time::Duration;
///
/// let o = Outcome::raw(b"ch_1").retention(Duration::from_secs(60)).amount(100);
/// assert_eq!(o.bytes(), b"ch_1");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Outcome<'a> {
    pub(crate) tag: u8,
    pub(crate) bytes: &'a [u8],
    pub(crate) retention: Option<Duration>,
    pub(crate) amount: i64,
}

impl<'a> Outcome<'a> {
    /// An outcome of raw bytes, replayed as they are.
    ///
    /// # Examples
    /// See [`Outcome`].
    #[must_use]
    pub const fn raw(bytes: &'a [u8]) -> Outcome<'a> {
        Outcome {
            tag: crate::codec::TAG_RAW,
            bytes,
            retention: None,
            amount: 0,
        }
    }

    /// An encoded typed outcome (tag as `codec::encode_outcome` gave it).
    pub(crate) const fn tagged(tag: u8, bytes: &'a [u8]) -> Outcome<'a> {
        Outcome {
            tag,
            bytes,
            retention: None,
            amount: 0,
        }
    }

    /// Keeps the key for `retention` after completion instead of the
    /// operation's (never less than its previous record's).
    ///
    /// # Examples
    /// See [`Outcome`].
    #[must_use]
    pub const fn retention(mut self, retention: Duration) -> Outcome<'a> {
        self.retention = Some(retention);
        self
    }

    /// Counts `amount` in the completion tallies of the key's scope.
    ///
    /// # Examples
    /// See [`Outcome`].
    #[must_use]
    pub const fn amount(mut self, amount: i64) -> Outcome<'a> {
        self.amount = amount;
        self
    }

    /// The outcome's bytes.
    ///
    /// # Examples
    /// See [`Outcome`].
    #[must_use]
    pub const fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The retention given with [`retention`](Self::retention), if any
    /// (for a backend outside the crate).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::contract::Outcome;
    /// use std::time::Duration;
    ///
    /// let o = Outcome::raw(b"x").retention(Duration::from_secs(9));
    /// assert_eq!(o.given_retention(), Some(Duration::from_secs(9)));
    /// assert_eq!(Outcome::raw(b"x").given_retention(), None);
    /// ```
    #[must_use]
    pub const fn given_retention(&self) -> Option<Duration> {
        self.retention
    }

    /// The amount given with [`amount`](Self::amount) (0 if none).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::contract::Outcome;
    ///
    /// assert_eq!(Outcome::raw(b"x").amount(120).given_amount(), 120);
    /// ```
    #[must_use]
    pub const fn given_amount(&self) -> i64 {
        self.amount
    }
}

/// What [`Write::begin_batch`] answers: per item, `begin`'s answer or the
/// item's own error, pending on the batch's basis.
pub type BegunBatch<C> = Pending<Vec<Result<Began<C>>>>;

/// The write half: operations that record something.
///
/// # Contract
/// Each method decides atomically per key and returns at once with its
/// answer [`Pending`] on what it wrote (its basis' `written`) and on what
/// it answered from (`read`); see the module's contract for what holds
/// when that basis is settled. Errors are the call's own: nothing of a
/// call that failed was recorded, except where a method says otherwise
/// (batches answer per item).
///
/// # Examples
/// ```
/// use dedupkv::contract::{Outcome, Settle, Write};
/// use dedupkv::{Begin, BeginOptions, Fingerprint, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("t", "op");
/// let p = Write::begin(&store, &key, Fingerprint::NONE, &BeginOptions::new(), None)?;
/// let Begin::Started(claim) = store.tell(p)? else { unreachable!() };
/// store.tell(Write::complete(&store, &claim, Outcome::raw(b"done"))?)?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait Write: Read + Settle {
    /// The backend's handle of a started attempt (the engine's is
    /// [`Claim`]).
    type Claim: Handle;

    /// Records `key` if it has no live record, kept for `retention` (the
    /// store's if `None`); the value says whether it was new.
    ///
    /// Atomic: of concurrent calls on one key exactly one is told `true`.
    /// Durable once settled: the key's Insert record (when new), or the
    /// record it was found by (when not).
    ///
    /// # Errors
    /// A bad key or retention ([`Error::InvalidArgument`](crate::Error::InvalidArgument),
    /// [`Error::InvalidInput`](crate::Error::InvalidInput),
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig));
    /// [`Error::Poisoned`](crate::Error::Poisoned); storage errors.
    fn insert(&self, key: &Key<'_>, retention: Option<Duration>) -> Result<Pending<bool>>;

    /// [`insert`](Self::insert) of every key, the new ones in one commit
    /// (usually); a key repeated is new at its first position only.
    ///
    /// Atomic per key. Every key is checked before any is recorded.
    ///
    /// # Errors
    /// As `insert`, for the call as a whole; and a call over the store's
    /// `max_batch_bytes`.
    fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Pending<Vec<bool>>>;

    /// Forgets `key` on purpose, unless a live attempt holds it.
    ///
    /// Atomic: decided against the key's state under the lock that
    /// appends the Forget record. Durable once settled: the Forget record
    /// (or the record the refusal was read from).
    ///
    /// # Errors
    /// As [`insert`](Self::insert).
    fn forget(&self, key: &Key<'_>) -> Result<Pending<Forget>>;

    /// Starts an attempt of the operation `key` (with `options`' lease
    /// and retention, and `intent` recorded with the claim if given), or
    /// tells what became of it.
    ///
    /// Atomic: of concurrent calls on one key exactly one is told
    /// `Started`. Durable once settled: the claim record (and its
    /// intent), or the record the answer was read from.
    ///
    /// # Errors
    /// [`Error::FingerprintMismatch`](crate::Error::FingerprintMismatch)
    /// when the key's operation has another fingerprint; bad options;
    /// otherwise as [`insert`](Self::insert).
    fn begin(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Option<Intent<'_>>,
    ) -> Result<Pending<Began<Self::Claim>>>;

    /// [`begin`](Self::begin) of every item with the store's options, the
    /// claims in one commit (usually).
    ///
    /// Atomic per item. Every key is checked before any is recorded.
    ///
    /// # Errors
    /// As `begin` for the call as a whole; a fingerprint mismatch is the
    /// item's own error in the list.
    fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<BegunBatch<Self::Claim>>;

    /// Completes `claim` with `outcome`: every later `begin` of the key
    /// answers `Completed` with it.
    ///
    /// Atomic: refused unless `claim` is the key's active claim (its
    /// fencing token is the key's). Durable once settled: the Complete
    /// record (and the tally and intent records it closes).
    ///
    /// # Errors
    /// [`Error::ClaimLost`](crate::Error::ClaimLost) when another attempt
    /// took the key over or the claim was finished; an outcome over the
    /// limit; otherwise as [`insert`](Self::insert).
    fn complete(&self, claim: &Self::Claim, outcome: Outcome<'_>) -> Result<Pending<()>>;

    /// [`complete`](Self::complete) of every item with raw outcomes, in
    /// one commit (usually).
    ///
    /// # Errors
    /// A call over `max_batch_bytes` and a failed commit for the call as a
    /// whole; `ClaimLost` and an outcome over the limit per item.
    fn complete_batch(&self, items: &[(&Self::Claim, &[u8])]) -> Result<Pending<Vec<Result<()>>>>;

    /// Fails `claim` as `failure` says (free the key, keep a terminal
    /// failure, or move it to the dead-letter area).
    ///
    /// Atomic and durable as [`complete`](Self::complete).
    ///
    /// # Errors
    /// As `complete`.
    fn fail(&self, claim: &Self::Claim, failure: Failure<'_>) -> Result<Pending<()>>;

    /// Extends `claim`'s lease to now + `by` (its own lease if `None`);
    /// the value is the new expiry.
    ///
    /// Atomic as [`complete`](Self::complete). Durable once settled: the
    /// claim record carrying the new lease.
    ///
    /// # Errors
    /// As `complete`, and a bad lease.
    fn renew(&self, claim: &Self::Claim, by: Option<Duration>) -> Result<Pending<SystemTime>>;

    /// The longest outcome (or failure text with its payload) this
    /// backend records, in bytes. What is built on the contract (the retry
    /// runners' dead letters and refusals) cuts what it records to it, so
    /// a long error text never keeps a failure from being recorded. No
    /// limit by default.
    fn max_outcome_len(&self) -> usize {
        usize::MAX
    }
}

/// The ordering half: per-entity versions and the sequencer, over the
/// same [`Pending`] answers as [`Write`]. A backend may implement
/// [`Write`] without it (the conformance suite drives `Write`); the
/// faces offer these calls for a backend that has it.
///
/// # Contract
/// Each call is decided atomically per entity (under one lock, or one
/// statement) and is durable once its basis is settled, as [`Write`]'s.
/// A duplicate (an old version, an event seen before) records nothing
/// and rests on the entity's record it was answered from.
///
/// # Examples
/// ```
/// use dedupkv::contract::{Order, Settle};
/// use dedupkv::{Advance, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let order = Key::new("orders", "o-1");
/// let p = Order::advance(&store, &order, 3)?;
/// assert!(matches!(store.tell(p)?, Advance::Applied { previous: None }));
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait Order: Settle {
    /// Advances `entity`'s version to `version` if it is newer.
    ///
    /// # Errors
    /// A bad key or version (0); [`Error::Poisoned`](crate::Error::Poisoned);
    /// storage errors.
    fn advance(&self, entity: &Key<'_>, version: u64) -> Result<Pending<Advance>>;

    /// Records `event` once and advances `entity` to `version` if newer, in
    /// one decision.
    ///
    /// # Errors
    /// As [`advance`](Self::advance), and a bad event key.
    fn apply_event(
        &self,
        event: &Key<'_>,
        entity: &Key<'_>,
        version: u64,
    ) -> Result<Pending<Update>>;

    /// Delivers `entity`'s event `seq` in sequence order: now (with every
    /// parked successor), parked until its predecessors come, or a
    /// duplicate.
    ///
    /// # Errors
    /// As [`advance`](Self::advance), a payload over the limit, a bad
    /// lease in `options`.
    fn sequence(
        &self,
        entity: &Key<'_>,
        seq: u64,
        payload: &[u8],
        options: &SequenceOptions,
    ) -> Result<Pending<Sequenced>>;

    /// Hands back `entity`'s held events, in order.
    ///
    /// # Errors
    /// As [`advance`](Self::advance).
    fn release_held(&self, entity: &Key<'_>) -> Result<Pending<Vec<Delivered>>>;

    /// Acknowledges `entity`'s handed-back events up to `upto`; the value
    /// is how many were acknowledged.
    ///
    /// # Errors
    /// As [`advance`](Self::advance).
    fn ack(&self, entity: &Key<'_>, upto: u64) -> Result<Pending<usize>>;
}

/// The dead-letter area's exits: an operator's requeue or resolution of
/// an operation whose retries were exhausted.
///
/// # Contract
/// Atomic per key; durable once the basis is settled, as [`Write`]'s.
/// The value is `false`, and nothing is recorded, for a key that is not
/// dead-lettered.
///
/// # Examples
/// ```
/// use dedupkv::contract::{DeadLetters, Settle};
/// use dedupkv::{Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// assert!(!store.tell(DeadLetters::requeue(&store, &Key::new("t", "a"))?)?);
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait DeadLetters: Write {
    /// Makes the key claimable again, its next attempt numbered after the
    /// last.
    ///
    /// # Errors
    /// As [`Write::insert`].
    fn requeue(&self, key: &Key<'_>) -> Result<Pending<bool>>;

    /// Closes the dead letter with a final outcome or a note.
    ///
    /// # Errors
    /// As [`Write::insert`], and an outcome or note over the limit.
    fn resolve(&self, key: &Key<'_>, resolution: Resolution<'_>) -> Result<Pending<bool>>;
}

/// Intents recorded before external calls (an outbox): what the provider
/// answered the claim's call. (The intent itself is recorded by
/// [`Write::begin`], with the claim.)
///
/// # Contract
/// Refused unless the claim is the key's active one; durable once the
/// basis is settled, as [`Write`]'s.
///
/// # Examples
/// ```
/// use dedupkv::contract::{Intents, Settle};
/// use dedupkv::{Answer, BeginOptions, Begin, Fingerprint, Intent, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let intent = Intent { target: "carrier", request: b"2 parcels" };
/// let key = Key::new("t", "ship");
/// let Begin::Started(c) = store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent)? else { unreachable!() };
/// store.tell(Intents::mark_answered(&store, &c, Answer::Accepted(b"1Z"))?)?;
/// # store.complete(&c, b"")?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait Intents: Write {
    /// Records `answer` to the claim's recorded intent.
    ///
    /// # Errors
    /// `ClaimLost` for a claim no longer active; a claim that recorded no
    /// intent; a reference or reason over the limit.
    fn mark_answered(&self, claim: &Self::Claim, answer: Answer<'_>) -> Result<Pending<()>>;
}

/// Refuses `u64::MAX` as an entity's version: versions run from 0 to
/// `u64::MAX - 1` on every backend ([`Order::advance`],
/// [`Order::apply_event`]); a backend checks before it records anything.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (`what:
/// "version"`) for `u64::MAX`.
///
/// # Examples
/// ```
/// use dedupkv::contract::check_version;
///
/// assert!(check_version(u64::MAX - 1).is_ok());
/// assert!(check_version(u64::MAX).is_err());
/// ```
pub fn check_version(version: u64) -> Result<()> {
    if version == u64::MAX {
        return Err(crate::Error::InvalidArgument {
            what: "version",
            reason: "u64::MAX is reserved; versions run from 0 to u64::MAX - 1".into(),
        });
    }
    Ok(())
}

/// Refuses sequence numbers outside `1..u64::MAX` for
/// [`Order::sequence`]: the sequencer starts at 1, and the number after
/// the last one must be representable.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (`what:
/// "seq"`) for 0 and `u64::MAX`.
///
/// # Examples
/// ```
/// use dedupkv::contract::check_seq;
///
/// assert!(check_seq(1).is_ok());
/// assert!(check_seq(0).is_err() && check_seq(u64::MAX).is_err());
/// ```
pub fn check_seq(seq: u64) -> Result<()> {
    if seq == 0 || seq == u64::MAX {
        return Err(crate::Error::InvalidArgument {
            what: "seq",
            reason: format!("{seq} is outside 1..=u64::MAX - 1 (sequences start at 1)"),
        });
    }
    Ok(())
}

/// What every backend's claim handle tells its holder.
///
/// A handle names one attempt of one key; finishing it (`complete`,
/// `fail`, `renew`) is refused once another attempt holds the key.
///
/// # Examples
/// ```
/// use dedupkv::contract::Handle;
/// use dedupkv::{Begin, Fingerprint, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let Begin::Started(claim) = store.begin(&Key::new("t", "e"), Fingerprint::NONE)? else { unreachable!() };
/// assert_eq!(Handle::attempt(&claim), 1);
/// # store.complete(&claim, b"")?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait Handle {
    /// The key the attempt is for.
    fn key(&self) -> &Key<'static>;
    /// The attempt's number (1 for the first).
    fn attempt(&self) -> u32;
    /// The previous attempt never answered (its lease lapsed, its process
    /// died, or its claim was dropped): check whether its effect happened.
    fn interrupted(&self) -> bool;
}

impl Handle for Claim {
    fn key(&self) -> &Key<'static> {
        Claim::key(self)
    }

    fn attempt(&self) -> u32 {
        Claim::attempt(self)
    }

    fn interrupted(&self) -> bool {
        Claim::interrupted(self)
    }
}
