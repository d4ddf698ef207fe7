//! Claims: the right to perform one attempt of an operation.

use std::fmt;
use std::time::SystemTime;

use std::time::Duration;

use crate::clock::to_system_time;
use crate::codec;
use crate::contract::{BoxedClaim, Outcome, Pending, Settle, SharedClaim, Write};
use crate::engine::{Begun, Ticket};
use crate::types::{Began, BeginOptions, Failure};
#[cfg(doc)]
use crate::types::{InProgress, Record};
#[cfg(doc)]
use crate::{Durability, Error};
use crate::{Fingerprint, Key, Result, Store};

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
///     Begin::DeadLettered(dl) => println!("retries exhausted: {}", dl.reason()),
/// }
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub type Begin = Began<Claim>;

/// The right to perform one attempt of an operation, with a lease and a
/// fencing token.
///
/// Finish it with [`Store::complete`](crate::Store::complete) or
/// [`Store::fail`](crate::Store::fail). Dropping an unfinished claim
/// releases the key as a retryable failure (without waiting for that
/// record to be durable; if it is lost in a crash the lease lapses instead).
/// A claim does not keep its store open: once the store is dropped, the
/// claim can no longer be finished and its lease lapses. Over a shared
/// backend ([`StoreBuilder::open_shared`](crate::StoreBuilder::open_shared))
/// it holds that backend's claim and its accessors answer from it
/// ([`SharedClaim`]); a claim is finished
/// only by a store of the backend that made it.
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
    held: Held,
}

/// Whose claim it is: the engine's, or a shared backend's.
enum Held {
    /// The engine's side: key, attempt, token, lease. It holds the store
    /// weakly, so a forgotten or long-lived claim never keeps a closed
    /// store open.
    Engine(Ticket),
    /// A shared backend's claim (a store opened with
    /// [`StoreBuilder::open_shared`](crate::StoreBuilder::open_shared)).
    Shared(BoxedClaim),
}

impl Claim {
    /// The engine's side of this claim; a shared backend's claim handed
    /// to the engine is refused.
    pub(crate) fn ticket(&self) -> Result<&Ticket> {
        match &self.held {
            Held::Engine(t) => Ok(t),
            Held::Shared(c) => Err(crate::Error::InvalidArgument {
                what: "claim",
                reason: format!(
                    "the claim of {:?} was made by a shared backend, not by this store",
                    c.key()
                ),
            }),
        }
    }

    /// A shared backend's claim, for its store; the engine's claim handed
    /// to a shared backend is refused.
    pub(crate) fn shared(&self) -> Result<&dyn SharedClaim> {
        match &self.held {
            Held::Shared(c) => Ok(&**c),
            Held::Engine(t) => Err(crate::Error::InvalidArgument {
                what: "claim",
                reason: format!(
                    "the claim of {:?} was made by an embedded store, not by this store's shared backend",
                    t.key
                ),
            }),
        }
    }

    /// The claim of a shared backend's `Started` answer.
    pub(crate) fn of_shared(claim: BoxedClaim) -> Claim {
        Claim {
            held: Held::Shared(claim),
        }
    }
}

impl From<Begun> for Begin {
    fn from(b: Begun) -> Begin {
        match b {
            Begun::Started(ticket) => Begin::Started(Claim {
                held: Held::Engine(ticket),
            }),
            Begun::Completed(rec) => Begin::Completed(rec),
            Begun::InProgress(p) => Begin::InProgress(p),
            Begun::DeadLettered(d) => Begin::DeadLettered(d),
        }
    }
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
        match &self.held {
            Held::Engine(t) => &t.key,
            Held::Shared(c) => c.key(),
        }
    }

    /// The attempt number: 1 for the first, +1 for each takeover or retry.
    ///
    /// # Examples
    /// See [`Claim`].
    pub fn attempt(&self) -> u32 {
        match &self.held {
            Held::Engine(t) => t.attempt,
            Held::Shared(c) => c.attempt(),
        }
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
        match &self.held {
            Held::Engine(t) => t.interrupted,
            Held::Shared(c) => c.interrupted(),
        }
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
        match &self.held {
            Held::Engine(t) => t.token,
            Held::Shared(c) => SharedClaim::token(&**c),
        }
    }

    /// The idempotency key to pass to external systems (a payment or
    /// shipping provider's `Idempotency-Key`) for this operation: 32
    /// lowercase hex digits.
    ///
    /// It is the same on every attempt of one operation, on every owner
    /// of the store: after a takeover of a lapsed lease, a
    /// [`Failure::Retryable`] or a dropped claim, after the store is
    /// reopened, and with a replica after the store (or its partition)
    /// moves to another owner, even one restored from the replica after
    /// a lost disk. So a provider that deduplicates on it acts once
    /// however often, and wherever, the work is retried. It differs
    /// between scopes, between keys, between stores (it is keyed with the
    /// store's persisted secret, which a replica carries), and between two
    /// operations on one key (after [`forget`](Store::forget), or after
    /// the first one's record expired). [`Record::provider_key`] reports
    /// it too.
    ///
    /// The key hashes the operation's first claim record (its time and
    /// fingerprint), so it is given out only once that record is where
    /// the store's next owner will read it:
    ///
    /// | store | this call |
    /// |---|---|
    /// | no replica | answers once the claim is durable: at once under [`Durability::Immediate`] (`begin` waited for it); under `Deferred` it commits now |
    /// | synchronous replica | answers once the claim is in the replica: at once under `Immediate` (`begin` waited for it) |
    /// | asynchronous replica | asks the uploader to ship the claim's segment now, without waiting for its interval, and waits for that upload (none if it already went) |
    ///
    /// A claim whose record never reached the replica was never given a
    /// key, so the fresh first attempt the next owner then makes (with a
    /// key of its own) cannot repeat a call. Once it answered, it answers
    /// at once. A caller that never asks pays nothing.
    ///
    /// Use it as THE key for external calls; keep [`token`](Self::token)
    /// for fencing. It blocks: in async code await
    /// [`provider_key_async`](Self::provider_key_async) instead.
    ///
    /// # Errors
    /// Never a key that a later owner would not derive again. Instead:
    /// [`Error::Fenced`] if another owner took the replica over before the
    /// claim was shipped (do not call the provider: the claim is that
    /// owner's to take over); [`Error::Poisoned`] if a commit failed;
    /// [`Error::Closed`] if the store was closed before the key could be
    /// kept. While the object store refuses uploads the call waits, as the
    /// uploader retries.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "ship-order-7");
    /// let Begin::Started(first) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// let idempotency_key = first.provider_key()?;
    /// store.fail(&first, Failure::Retryable)?; // the provider timed out
    /// let Begin::Started(retry) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_ne!(retry.token(), first.token());
    /// assert_eq!(retry.provider_key()?, idempotency_key); // the provider sees one request
    /// # store.complete(&retry, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn provider_key(&self) -> Result<String> {
        match &self.held {
            Held::Engine(t) => t.provider_key().map(hex),
            Held::Shared(c) => c.provider_key(),
        }
    }

    /// [`provider_key`](Self::provider_key) as a future (feature
    /// `async`): woken by the upload that keeps the claim, never blocking
    /// the executor. It owns what it needs (it does not borrow the claim),
    /// so it can move into an `async move` block.
    ///
    /// # Cancellation
    /// Dropping it only stops the wait; a segment it asked for is still
    /// shipped.
    ///
    /// # Errors
    /// As [`provider_key`](Self::provider_key).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{AsyncStore, Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
    /// let Begin::Started(claim) = store.begin(&Key::new("t", "charge-1"), Fingerprint::NONE).await? else { unreachable!() };
    /// let idempotency_key = claim.provider_key_async();
    /// let sent = async move {
    ///     let idempotency_key = idempotency_key.await?;
    ///     // an HTTP call with `Idempotency-Key: {idempotency_key}`
    ///     Ok::<_, dedupkv::Error>(idempotency_key)
    /// };
    /// assert_eq!(sent.await?, claim.provider_key()?);
    /// # store.complete(&claim, b"").await?;
    /// # Ok::<(), dedupkv::Error>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "async")]
    #[cfg_attr(docsrs, doc(cfg(feature = "async")))]
    pub fn provider_key_async(
        &self,
    ) -> impl std::future::Future<Output = Result<String>> + Send + 'static + use<> {
        match &self.held {
            Held::Engine(t) => {
                let (engine, row, key) = t.provider_key_parts();
                KeptKey {
                    engine,
                    row,
                    key,
                    told: None,
                    slot: None,
                }
            }
            // A shared backend tells it with the claim.
            Held::Shared(c) => KeptKey {
                engine: crate::sync::Weak::new(),
                row: 0,
                key: 0,
                told: Some(c.provider_key()),
                slot: None,
            },
        }
    }

    /// When the operation's first attempt was claimed (the same on every
    /// attempt, after restarts too): what a retry policy's maximum elapsed
    /// time counts from.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, ManualClock, Store};
    /// # use std::time::{Duration, UNIX_EPOCH};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let key = Key::new("t", "job");
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// drop(c); // released: the next attempt keeps the first one's time
    /// clock.advance(Duration::from_secs(60));
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!(c.first_seen_at(), UNIX_EPOCH + Duration::from_millis(1_700_000_000_000));
    /// # store.complete(&c, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn first_seen_at(&self) -> SystemTime {
        match &self.held {
            Held::Engine(t) => to_system_time(t.first_at),
            Held::Shared(c) => c.first_seen_at(),
        }
    }

    /// This attempt's number within its round: an operation's first
    /// attempt starts a round, and each [`requeue`](crate::Store::requeue)
    /// starts another. Equal to [`attempt`](Self::attempt) until the
    /// operation is first requeued; 1 for the first attempt after a
    /// requeue. Retry limits count this (see
    /// [`RetryPolicyBuilder::max_attempts`](crate::RetryPolicyBuilder::max_attempts)).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "ship-7");
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.fail(&c, Failure::Retryable)?;
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!((c.attempt(), c.round_attempt()), (2, 2));
    /// store.fail(&c, Failure::Exhausted { reason: "carrier down", payload: None })?;
    /// store.requeue(&key)?; // another round
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!((c.attempt(), c.round_attempt()), (3, 1));
    /// # store.complete(&c, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn round_attempt(&self) -> u32 {
        match &self.held {
            Held::Engine(t) => t.attempt.saturating_sub(t.round.before).max(1),
            Held::Shared(c) => c.round_attempt(),
        }
    }

    /// When this attempt's round began: the operation's first attempt
    /// ([`first_seen_at`](Self::first_seen_at)), or its latest
    /// [`requeue`](crate::Store::requeue). A retry policy's maximum
    /// elapsed time counts from here.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key, ManualClock, Store};
    /// # use std::time::{Duration, UNIX_EPOCH};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let key = Key::new("t", "job");
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!(c.round_started_at(), c.first_seen_at());
    /// store.fail(&c, Failure::Exhausted { reason: "timed out", payload: None })?;
    /// clock.advance(Duration::from_secs(3600));
    /// store.requeue(&key)?;
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!(c.round_started_at(), UNIX_EPOCH + Duration::from_millis(1_700_003_600_000));
    /// assert!(c.first_seen_at() < c.round_started_at()); // the provider key stays the same
    /// # store.complete(&c, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn round_started_at(&self) -> SystemTime {
        match &self.held {
            Held::Engine(t) => to_system_time(t.round.since),
            Held::Shared(c) => c.round_started_at(),
        }
    }

    /// How many attempts of this round before this one ended without an
    /// answer: their process died, their lease lapsed, or their claim was
    /// dropped (each such takeover is [`interrupted`](Self::interrupted)).
    /// Counted by the store across restarts, so a worker that crashes
    /// inside the work every time (a poison message) shows here.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("s.redb");
    /// let key = Key::new("shop-42", "poison");
    /// for _ in 0..2 {
    ///     let store = Store::open(&path)?;
    ///     let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    ///     std::mem::forget(c); // the worker dies inside the work
    /// }
    /// let store = Store::open(&path)?;
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!((c.attempt(), c.interruptions()), (3, 2));
    /// # store.complete(&c, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn interruptions(&self) -> u32 {
        match &self.held {
            Held::Engine(t) => t.round.interrupted,
            Held::Shared(c) => c.interruptions(),
        }
    }

    /// Whether an earlier attempt of this operation recorded an intent
    /// ([`Store::begin_with_intent`]) that nobody marked answered: the call
    /// may have happened. Ask the provider (with [`provider_key`](Self::provider_key))
    /// before calling again.
    ///
    /// # Examples
    /// See [`Store::duplicate_candidates`].
    pub fn unanswered_intent(&self) -> bool {
        match &self.held {
            Held::Engine(t) => t.unanswered_intent,
            Held::Shared(c) => c.unanswered_intent(),
        }
    }

    /// When this claim's lease lapses (moved by [`Store::renew`](crate::Store::renew)).
    ///
    /// # Examples
    /// See [`Record::lease_expires_at`].
    pub fn lease_expires_at(&self) -> SystemTime {
        match &self.held {
            Held::Engine(t) => to_system_time(t.lease_until()),
            Held::Shared(c) => c.lease_expires_at(),
        }
    }
}

/// 32 lowercase hex digits.
fn hex(key: u128) -> String {
    format!("{key:032x}")
}

/// The future of [`Claim::provider_key_async`]: ready once the claim's
/// row is kept (`row` 0: it already was).
#[cfg(feature = "async")]
struct KeptKey {
    engine: crate::sync::Weak<crate::engine::Engine>,
    row: u64,
    key: u128,
    /// A shared backend's key, told already.
    told: Option<Result<String>>,
    slot: Option<crate::sync::Arc<crate::engine::durable::Waiting>>,
}

#[cfg(feature = "async")]
impl std::future::Future for KeptKey {
    type Output = Result<String>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<String>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.row > 0 {
            let Some(engine) = this.engine.upgrade() else {
                return Poll::Ready(Err(crate::Error::Closed));
            };
            match engine.poll_kept(this.row, &mut this.slot, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => {
                    // The slot, if any, leaves its list when this drops.
                    this.row = 0;
                    r?;
                }
            }
        }
        if let Some(told) = this.told.take() {
            return Poll::Ready(told);
        }
        Poll::Ready(Ok(hex(this.key)))
    }
}

#[cfg(feature = "async")]
impl Drop for KeptKey {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take()
            && let Some(engine) = self.engine.upgrade()
        {
            engine.stop_waiting_kept(&slot);
        }
    }
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.held {
            Held::Engine(t) => f
                .debug_struct("Claim")
                .field("key", &t.key)
                .field("attempt", &t.attempt)
                .field("token", &t.token)
                .field("lease_until", &t.lease_until())
                .finish_non_exhaustive(),
            Held::Shared(c) => f.debug_tuple("Claim").field(c).finish(),
        }
    }
}

impl Store {
    /// Starts an idempotent operation, or tells what became of it.
    ///
    /// - A new key (or one released for retry, or one whose claim's lease
    ///   lapsed) is claimed: [`Begin::Started`] with an attempt number, a
    ///   lease and a fencing token.
    /// - A key with a live claim: [`Begin::InProgress`] with the lease expiry.
    /// - A finished key: [`Begin::Completed`] with the stored outcome.
    ///
    /// # Concurrent calls on the same key
    /// Exactly one caller gets `Started`; the others get `InProgress` (or
    /// `Completed` once it finished).
    ///
    /// # Errors
    /// [`Error::FingerprintMismatch`] if the key was begun with another
    /// fingerprint; otherwise as [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "refund-17");
    /// let params = Fingerprint::of("refund 30 EUR");
    /// let Begin::Started(claim) = store.begin(&key, params)? else { unreachable!() };
    /// store.complete(&claim, b"refund id re_123")?;
    /// let Begin::Completed(rec) = store.begin(&key, params)? else { unreachable!() };
    /// assert_eq!(rec.outcome(), Some(&b"refund id re_123"[..]));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn begin(&self, key: &Key<'_>, fingerprint: Fingerprint) -> Result<Begin> {
        self.begin_with(key, fingerprint, &BeginOptions::new())
    }

    /// [`begin`](Self::begin) with this operation's own lease and
    /// retention (see [`BeginOptions`]). The claim keeps its lease for
    /// [`renew`](Self::renew), and its completion or failure keeps the key
    /// for the operation's retention.
    ///
    /// # Errors
    /// As `begin`, and [`Error::InvalidArgument`] for a lease of 0 or a
    /// lease or retention spanning 2^22 buckets or more, or a retention
    /// shorter than the store's `max_retry_window`.
    ///
    /// # Examples
    /// See [`BeginOptions`].
    pub fn begin_with(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
    ) -> Result<Begin> {
        self.tell(Write::begin(self, key, fingerprint, options, None)?)
    }

    /// Begins every `(key, fingerprint)` in one go: the claims of the new
    /// keys are recorded in one durable commit (usually; never more than a
    /// few), and the answer at index `i` is what [`begin`](Self::begin)
    /// would have said for item `i`. A key repeated within the batch is
    /// `Started` at its first position and `InProgress` after.
    ///
    /// With [`complete_batch`](Self::complete_batch) this gives a batch
    /// consumer exactly-once effects at two commits per batch: record
    /// first (`begin_batch`), handle each `Started` item, then record the
    /// outcomes (`complete_batch`), then acknowledge upstream. A crash
    /// between the two leaves the claims in progress; the restarted
    /// consumer's `begin_batch` takes them over at once, each marked
    /// [`interrupted`](Claim::interrupted) so the handler reconciles
    /// before acting again. (`insert_batch` then handle is at-most-once: a
    /// crash after the insert loses the events it had not handled.) This
    /// holds under [`Durability::Immediate`]; under `Deferred` a crash may
    /// also lose acknowledged claims and outcomes of the last `max_delay`.
    ///
    /// Every key is validated, and the call's size checked against
    /// `max_batch_bytes`, before any is recorded.
    ///
    /// # Errors
    /// The call fails as a whole for an invalid key or a call over
    /// `max_batch_bytes` ([`Error::InvalidInput`],
    /// [`Error::InvalidArgument`]), and for a failed commit
    /// ([`Error::Poisoned`], [`Error::Storage`]). An item whose key was
    /// begun with another fingerprint gets its own
    /// [`Error::FingerprintMismatch`] in the returned list.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let ids = ["evt-1", "evt-2", "evt-1"];
    /// let items: Vec<_> = ids.iter().map(|id| (Key::new("orders", id), Fingerprint::NONE)).collect();
    /// let mut claims = Vec::new();
    /// for answer in store.begin_batch(&items)? {
    ///     match answer? {
    ///         Begin::Started(claim) => claims.push(claim), // handle it
    ///         Begin::Completed(_) | Begin::InProgress(_) | Begin::DeadLettered(_) => {} // done, or someone has it
    ///     }
    /// }
    /// assert_eq!(claims.len(), 2);
    /// let done: Vec<_> = claims.iter().map(|c| (c, &b"ok"[..])).collect();
    /// for r in store.complete_batch(&done)? {
    ///     r?; // a claim taken over meanwhile says ClaimLost here
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<Vec<Result<Begin>>> {
        self.tell(Write::begin_batch(self, items)?)
    }

    /// Completes many claims, each with its outcome, in one durable commit
    /// (usually); the result at index `i` is that of item `i`. See
    /// [`begin_batch`](Self::begin_batch) for the pattern.
    ///
    /// # Errors
    /// The call fails as a whole for one over `max_batch_bytes`
    /// ([`Error::InvalidInput`]) and for a failed commit
    /// ([`Error::Poisoned`], [`Error::Storage`]): then treat every item as
    /// not completed and `begin` the keys again to see. An item whose claim
    /// is no longer the key's active one gets its own [`Error::ClaimLost`],
    /// and one whose outcome is over `max_outcome_len` its own
    /// [`Error::InvalidInput`], in the returned list.
    ///
    /// # Examples
    /// See [`begin_batch`](Self::begin_batch).
    pub fn complete_batch(&self, items: &[(&Claim, &[u8])]) -> Result<Vec<Result<()>>> {
        self.tell(Write::complete_batch(self, items)?)
    }

    /// Completes a claim with its outcome; every later `begin` of the key
    /// returns [`Begin::Completed`] with exactly these bytes.
    ///
    /// # Errors
    /// [`Error::ClaimLost`] if the claim is no longer the key's active one
    /// (a newer attempt took over, or it was already finished): the caller
    /// must not publish its result. [`Error::InvalidInput`] for an outcome
    /// over the limit. Otherwise as [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// See [`begin`](Self::begin).
    pub fn complete(&self, claim: &Claim, outcome: &[u8]) -> Result<()> {
        self.tell(Write::complete(self, claim, Outcome::raw(outcome))?)
    }

    /// [`complete`](Self::complete), keeping this key for `retention` after
    /// completion instead of the store's retention (never less than its
    /// previous record's).
    ///
    /// # Errors
    /// As `complete`, and [`Error::InvalidConfig`] for a retention longer
    /// than 2^22 buckets.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let Begin::Started(c) = store.begin(&Key::new("t", "refund"), Fingerprint::NONE)? else { unreachable!() };
    /// store.complete_for(&c, b"re_1", Duration::from_secs(30 * 86_400))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn complete_for(&self, claim: &Claim, outcome: &[u8], retention: Duration) -> Result<()> {
        let outcome = Outcome::raw(outcome).retention(retention);
        self.tell(Write::complete(self, claim, outcome)?)
    }

    /// Completes a claim with a typed outcome, stored as CBOR (RFC 8949, a
    /// self-describing binary encoding); read it back with
    /// [`Record::outcome_as`].
    ///
    /// Every value serde can serialize reads back as its type: NaN (with
    /// its sign and payload), infinities and `-0.0` bit for bit, the whole
    /// `u128`/`i128` range, bytes (`serde_bytes` or `Vec<u8>`), maps with any
    /// key type, and every serde attribute: `rename`/`rename_all`,
    /// `default`, `skip_serializing_if`, `flatten`, and externally,
    /// internally (`tag`), adjacently (`tag` + `content`) tagged and
    /// `untagged` enums. One bit is not kept: an `f32` signalling NaN reads
    /// back quiet (same sign and payload); every `f64` reads back exactly.
    /// (A value that CBOR does not read back but JSON does, such as a `()`
    /// inside a `flatten`ed or `untagged` type, is stored as JSON, as
    /// earlier builds stored every typed outcome.)
    ///
    /// The value is encoded, then decoded back as `T` before anything is
    /// recorded: an outcome that would be stored but could not be replayed
    /// is refused, and the claim stays usable (the work already happened:
    /// complete it with bytes or another value, or fail it). Refused that
    /// way is what serde cannot read back from any self-describing
    /// encoding, a `u128`/`i128` inside a `flatten`ed, `untagged` or
    /// internally tagged type (serde buffers those without 128-bit
    /// integers), and a `Serialize` that fails or nests deeper than 128
    /// levels. What such an encoding cannot tell apart reads back as one
    /// value: `Some(None)` and `Some(())` as `None`.
    ///
    /// # Errors
    /// [`Error::Codec`] if the value cannot be encoded, or "cannot be read
    /// back" as `T`; [`Error::InvalidInput`] if its encoding is over
    /// `max_outcome_len`. Nothing is recorded then, and the claim can still
    /// be completed or failed. Otherwise as [`complete`](Self::complete).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "quote");
    /// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// // (ratio, limit): 0/0 and unbounded are ordinary values.
    /// store.complete_value(&claim, &(f64::NAN, f64::INFINITY))?;
    /// let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// let (ratio, limit): (f64, f64) = rec.outcome_as()?;
    /// assert!(ratio.is_nan() && limit == f64::INFINITY);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn complete_value<T>(&self, claim: &Claim, outcome: &T) -> Result<()>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        self.tell(self.complete_value_pending(claim, outcome)?)
    }

    /// [`complete_value`](Self::complete_value), its answer pending.
    pub(crate) fn complete_value_pending<T>(
        &self,
        claim: &Claim,
        outcome: &T,
    ) -> Result<Pending<()>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let (tag, bytes) =
            codec::encode_outcome(self.engine_for("complete_value")?.outcome_tags(), outcome)?;
        Write::complete(self, claim, Outcome::tagged(tag, &bytes))
    }

    /// Fails a claim: [`Failure::Retryable`] frees the key for another
    /// attempt; [`Failure::Permanent`] stores a terminal failure that later
    /// `begin`s replay.
    ///
    /// # Errors
    /// As [`complete`](Self::complete).
    ///
    /// # Examples
    /// See [`Failure`].
    pub fn fail(&self, claim: &Claim, failure: Failure<'_>) -> Result<()> {
        self.tell(Write::fail(self, claim, failure)?)
    }

    /// Extends a claim's lease to now + the configured lease; returns the
    /// new expiry. A claim whose lease lapsed may still renew if nobody took
    /// it over.
    ///
    /// # Errors
    /// [`Error::ClaimLost`] if another attempt took the key over; otherwise
    /// as [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, ManualClock, Store};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let Begin::Started(claim) = store.begin(&Key::new("t", "job"), Fingerprint::NONE)? else { unreachable!() };
    /// clock.advance(Duration::from_secs(20));
    /// let until = store.renew(&claim)?; // 30 s from now, not from the start
    /// assert_eq!(until, claim.lease_expires_at());
    /// # store.complete(&claim, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn renew(&self, claim: &Claim) -> Result<SystemTime> {
        self.tell(Write::renew(self, claim, None)?)
    }

    /// [`renew`](Self::renew) to now + `by`, instead of now + the claim's
    /// lease; `by` becomes the claim's lease for later renewals.
    ///
    /// # Errors
    /// As `renew`, and [`Error::InvalidArgument`] for 0 or a span of 2^22
    /// buckets or more.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, ManualClock, Store};
    /// # use std::time::{Duration, UNIX_EPOCH};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let Begin::Started(claim) = store.begin(&Key::new("t", "export"), Fingerprint::NONE)? else { unreachable!() };
    /// // The export turned out large: hold the key for 10 more minutes.
    /// let until = store.renew_for(&claim, Duration::from_secs(600))?;
    /// assert_eq!(until, UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + 600_000));
    /// # store.complete(&claim, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn renew_for(&self, claim: &Claim, by: Duration) -> Result<SystemTime> {
        self.tell(Write::renew(self, claim, Some(by))?)
    }
}
