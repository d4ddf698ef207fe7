//! The async front (feature `async`): one wrapper over the same core.
//!
//! Each call runs the contract's operation inline — validate, decide and
//! append under the key's shard lock, a few microseconds; it never waits
//! for a commit, and returns what its answer rests on — then awaits the
//! group commit that makes its answer durable: the future is woken by that commit, never by polling,
//! and no executor thread sleeps on it. No runtime is assumed: the wake-up
//! comes from the store's own commit thread, and the timed waits of
//! [`AsyncStore::begin_or_wait`] from one timer thread of its own.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use super::store::Backend;
use super::timer::Sleep;
use super::wait::wait_after;
use crate::contract::{DeadLetters, Intents, Order, Outcome, Pending, Read, Settle, Write};
use crate::engine::Engine;
use crate::engine::durable::Waiting;
use crate::engine::waiters::KeyWaiter;
use crate::sync::Arc;
use crate::types::{
    Advance, BeginOptions, Delivered, Forget, Intent, Record, Resolution, SequenceOptions,
    Sequenced, Update,
};
use crate::{Answer, Began, Begin, Claim, Failure, Fingerprint, Key, Result, Store};
#[cfg(doc)]
use crate::{Durability, Error};

/// The async face of a [`Store`] (feature `async`): the write calls as
/// futures that resolve once their answer is durable (under
/// [`Durability::Immediate`]; at once under `Deferred`), without blocking
/// the executor thread and without tying the store to one runtime.
///
/// Cheap to clone; it shares the store it wraps ([`store`](Self::store)
/// gives the blocking API back, for the reads and the operator's calls).
///
/// Written against the [contract](crate::contract): `B` is the backend,
/// the embedded [`Store`] by default, or any other implementation of the
/// contract's traits (each group of methods needs its trait: [`Write`],
/// [`Intents`], [`DeadLetters`], [`Order`]; [`call`](Self::call) runs
/// any contract call, so a new operation needs no method here). What only
/// the embedded store has — [`flush`](AsyncStore::flush),
/// [`begin_or_wait`](AsyncStore::begin_or_wait), typed outcomes — is on
/// `AsyncStore<Store>`. A backend whose calls do their I/O inline (the
/// blocking client of `dedupkv-postgres`) does it on the thread that polls
/// the future; the embedded store's calls never wait for the disk there.
///
/// A claim's provider key, which with an asynchronous replica waits for
/// the claim's upload, is awaited with
/// [`Claim::provider_key_async`] (a future that owns what it needs).
///
/// # Cancellation
/// A future does nothing until first polled. On its first poll the call
/// is decided and its records appended (the in-memory part, run inline);
/// after that, dropping the future only stops the wait: what was decided
/// stands and becomes durable with the next commit, exactly as if the
/// caller had not been told (a crash before that commit loses it whole,
/// as for a caller who had not been answered yet). No key is ever half
/// recorded. What that means per call:
///
/// | call | dropped after its first poll |
/// |---|---|
/// | `insert_if_absent*`, `insert_batch` | the keys are recorded; a repeat answers "seen" |
/// | `begin*`, `begin_batch` | the claims were made, and drop with the future: each is released as a dropped claim, and the next attempt is [`interrupted`](Claim::interrupted), as for a dropped [`Claim`] |
/// | `complete*`, `fail` | recorded; the claim is finished |
/// | `mark_sent`, `mark_answered` | the answer is recorded |
/// | `renew*` | the lease was moved |
/// | `forget`, `requeue`, `resolve` | done |
/// | `advance`, `apply_event`, `sequence*`, `ack`, `release_held` | applied; events handed back by a dropped `sequence` or `release_held` are not acknowledged, so they are handed back again, as for a consumer that died before handling them |
/// | `begin_or_wait*` | while waiting: nothing is left behind (the waiter leaves its key); a claim it had started drops as above |
/// | `flush`, `get` | nothing changes |
///
/// # Examples
/// ```
/// use dedupkv::{AsyncStore, Begin, Fingerprint, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// # rt.block_on(async {
/// let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
/// let key = Key::new("shop-42", "charge-7");
/// match store.begin(&key, Fingerprint::of("100 EUR")).await? {
///     Begin::Started(claim) => store.complete(&claim, b"ch_1").await?,
///     Begin::Completed(rec) => println!("replay: {:?}", rec.outcome()),
///     Begin::InProgress(_) | Begin::DeadLettered(_) => {}
/// }
/// assert!(store.insert_if_absent(&Key::new("shop-42", "evt_1")).await?);
/// # Ok::<(), dedupkv::Error>(())
/// # }).unwrap();
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
#[derive(Clone, Debug)]
pub struct AsyncStore<B = Store> {
    store: B,
}

impl From<Store> for AsyncStore {
    fn from(store: Store) -> AsyncStore {
        AsyncStore::new(store)
    }
}

/// Waits for a log row to be durable; woken by the commit that covers it.
struct Durable<'a> {
    engine: &'a Engine,
    row: u64,
    slot: Option<Arc<Waiting>>,
}

impl Future for Durable<'_> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = &mut *self;
        this.engine.poll_durable(this.row, &mut this.slot, cx)
    }
}

impl Drop for Durable<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.engine.stop_waiting(&slot);
        }
    }
}

/// Ready when a waited key changed (its claim finished) or `sleep` ends.
struct Changed<'w, 'e> {
    waiter: &'w mut KeyWaiter<'e>,
    seen: u64,
    sleep: Sleep,
}

impl Future for Changed<'_, '_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if this.waiter.poll_changed(this.seen, cx).is_ready() {
            return Poll::Ready(());
        }
        Pin::new(&mut this.sleep).poll(cx)
    }
}

impl<B> AsyncStore<B> {
    /// The async face of `store`.
    ///
    /// # Examples
    /// See [`AsyncStore`].
    pub fn new(store: B) -> AsyncStore<B> {
        AsyncStore { store }
    }

    /// The blocking store underneath: for reads, listings, `stats` and the
    /// operator's calls (`evict_expired`, `compact`), which an async caller
    /// runs where blocking is fine (`spawn_blocking`).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{AsyncStore, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
    /// assert_eq!(store.store().stats().keys, 0);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn store(&self) -> &B {
        &self.store
    }
}

impl<B: Settle> AsyncStore<B> {
    /// Runs `op` — one or more calls of the [contract](crate::contract) on
    /// the store, their answers joined into one [`Pending`] — inline, and
    /// resolves with its value once what it rests on is settled: the
    /// named methods of this type are this around one call each; use it
    /// for a sequence that should share one wait (each call's records
    /// still go in call order, so the newest one's commit covers them
    /// all).
    ///
    /// Every contract call returns at once (it decides and appends, it
    /// never waits for a commit): `op` runs exactly once and never blocks
    /// on the store's disk. The blocking [`Store`] methods in `op` would
    /// wait for their commits on this thread; use the contract's.
    ///
    /// # Errors
    /// What `op` returns, and [`Error::Poisoned`] if the commit that was
    /// to make the answer durable failed (then nothing it answered was
    /// acknowledged).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::contract::Write;
    /// use dedupkv::{AsyncStore, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
    /// let (a, b) = (Key::new("t", "a"), Key::new("t", "b"));
    /// // Two inserts, one wait.
    /// let both = store
    ///     .call(|s| Ok(Write::insert(s, &a, None)?.zip(Write::insert(s, &b, None)?)))
    ///     .await?;
    /// assert_eq!(both, (true, true));
    /// # Ok::<(), dedupkv::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn call<T>(&self, op: impl FnOnce(&B) -> Result<Pending<T>>) -> Result<T> {
        let (value, basis) = op(&self.store)?.into_parts();
        if !basis.is_settled() {
            self.store.settled(basis).await?;
        }
        Ok(value)
    }

    /// [`call`](Self::call): the named methods' one body, shared with the
    /// blocking face (which waits for the same basis).
    async fn run<T>(&self, op: impl FnOnce(&B) -> Result<Pending<T>>) -> Result<T> {
        self.call(op).await
    }
}

impl<B: Write> AsyncStore<B> {
    /// [`Store::insert_if_absent`], resolved once durable.
    ///
    /// # Cancellation
    /// See [`AsyncStore`]: the key is recorded once first polled.
    ///
    /// # Errors
    /// As [`Store::insert_if_absent`].
    ///
    /// # Examples
    /// See [`AsyncStore`].
    pub async fn insert_if_absent(&self, key: &Key<'_>) -> Result<bool> {
        self.run(|s| Write::insert(s, key, None)).await
    }

    /// [`Store::insert_if_absent_for`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::insert_if_absent_for`].
    ///
    /// # Examples
    /// See [`Store::insert_if_absent_for`].
    pub async fn insert_if_absent_for(&self, key: &Key<'_>, retention: Duration) -> Result<bool> {
        self.run(|s| Write::insert(s, key, Some(retention))).await
    }

    /// [`Store::insert_batch`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::insert_batch`].
    ///
    /// # Examples
    /// See [`Store::insert_batch`].
    pub async fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Vec<bool>> {
        self.run(|s| Write::insert_batch(s, keys)).await
    }

    /// [`Store::get`]; a record whose commit is in flight is awaited, not
    /// waited for.
    ///
    /// # Errors
    /// As [`Store::get`].
    ///
    /// # Examples
    /// See [`Store::get`].
    pub async fn get(&self, key: &Key<'_>) -> Result<Option<Record>> {
        self.run(|s| Read::get(s, key)).await
    }

    /// [`Store::forget`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::forget`].
    ///
    /// # Examples
    /// See [`Store::forget`].
    pub async fn forget(&self, key: &Key<'_>) -> Result<Forget> {
        self.run(|s| Write::forget(s, key)).await
    }
}

impl AsyncStore<Store> {
    /// [`Store::flush`]: resolves once everything acknowledged so far is
    /// durable.
    ///
    /// # Errors
    /// [`Error::Poisoned`] if a commit failed.
    ///
    /// # Examples
    /// See [`Store::flush`].
    pub async fn flush(&self) -> Result<()> {
        let engine = match self.store.backend() {
            Backend::Engine(engine) => engine,
            // Every answer was waited for before it was told.
            Backend::Shared(_) => return Ok(()),
        };
        engine.check_readable()?;
        Durable {
            engine,
            row: engine.last_row(),
            slot: None,
        }
        .await
    }
}

impl<B: Write> AsyncStore<B> {
    /// [`Store::begin`], resolved once durable.
    ///
    /// # Cancellation
    /// A claim started by the call drops with the future, released as a
    /// dropped claim: the next attempt is interrupted.
    ///
    /// # Errors
    /// As [`Store::begin`].
    ///
    /// # Examples
    /// See [`AsyncStore`].
    pub async fn begin(&self, key: &Key<'_>, fingerprint: Fingerprint) -> Result<Began<B::Claim>> {
        self.begin_with(key, fingerprint, &BeginOptions::new())
            .await
    }

    /// [`Store::begin_with`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::begin_with`].
    ///
    /// # Examples
    /// See [`Store::begin_with`].
    pub async fn begin_with(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
    ) -> Result<Began<B::Claim>> {
        self.run(|s| Write::begin(s, key, fingerprint, options, None))
            .await
    }
}

impl<B: Intents> AsyncStore<B> {
    /// [`Store::begin_with_intent`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::begin_with_intent`].
    ///
    /// # Examples
    /// See [`Store::begin_with_intent`].
    pub async fn begin_with_intent(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Intent<'_>,
    ) -> Result<Began<B::Claim>> {
        self.run(|s| Write::begin(s, key, fingerprint, options, Some(intent)))
            .await
    }
}

impl<B: Write> AsyncStore<B> {
    /// [`Store::begin_batch`], resolved once durable.
    ///
    /// # Cancellation
    /// The claims started drop with the future, each released as a
    /// dropped claim.
    ///
    /// # Errors
    /// As [`Store::begin_batch`].
    ///
    /// # Examples
    /// See [`Store::begin_batch`].
    pub async fn begin_batch(
        &self,
        items: &[(Key<'_>, Fingerprint)],
    ) -> Result<Vec<Result<Began<B::Claim>>>> {
        self.run(|s| Write::begin_batch(s, items)).await
    }
}

impl AsyncStore<Store> {
    /// [`Store::begin_or_wait`], without blocking: while another attempt
    /// holds the key, the future waits (at most `timeout`) for that
    /// attempt's finish or lease end, woken by the finish or by the
    /// store's timer thread, then begins again. A store poisoned or fenced
    /// meanwhile wakes it at once, with the error.
    ///
    /// # Cancellation
    /// Dropped while waiting, it leaves nothing behind.
    ///
    /// # Errors
    /// As [`Store::begin`], also when the store is poisoned or fenced
    /// while the future waits.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{AsyncStore, Begin, Fingerprint, Key, Store};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
    /// let key = Key::new("shop-42", "charge-7");
    /// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE).await? else { unreachable!() };
    /// let (waited, done) = tokio::join!(
    ///     store.begin_or_wait(&key, Fingerprint::NONE, Duration::from_secs(60)),
    ///     store.complete(&claim, b"ch_1"),
    /// );
    /// done?;
    /// let Begin::Completed(rec) = waited? else { unreachable!() };
    /// assert_eq!(rec.outcome(), Some(&b"ch_1"[..]));
    /// # Ok::<(), dedupkv::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Begin> {
        self.begin_or_wait_with(key, fingerprint, &BeginOptions::new(), timeout)
            .await
    }

    /// [`begin_or_wait`](Self::begin_or_wait) with this operation's own
    /// lease and retention.
    ///
    /// # Errors
    /// As [`Store::begin_with`].
    ///
    /// # Examples
    /// See [`begin_or_wait`](Self::begin_or_wait).
    pub async fn begin_or_wait_with(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Begin> {
        let engine = match self.store.backend() {
            Backend::Engine(engine) => engine,
            // The backend's own wait, on the polling thread (as every call
            // of a backend that answers settled makes its round trip).
            Backend::Shared(_) => {
                return crate::contract::Waits::begin_or_wait(
                    &self.store,
                    key,
                    fingerprint,
                    options,
                    timeout,
                );
            }
        };
        let deadline = Instant::now().checked_add(timeout);
        let first = self.begin_with(key, fingerprint, options).await?;
        if !matches!(first, Begin::InProgress(_)) {
            return Ok(first);
        }
        let mut waiter = engine.wait_on(key)?;
        loop {
            let seen = waiter.generation();
            let answer = self.begin_with(key, fingerprint, options).await?;
            let Some(at_most) = wait_after(&answer, &waiter, deadline) else {
                return Ok(answer);
            };
            Changed {
                waiter: &mut waiter,
                seen,
                sleep: Sleep::until(Instant::now().checked_add(at_most)),
            }
            .await;
        }
    }
}

impl<B: Write> AsyncStore<B> {
    /// [`Store::complete`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::complete`].
    ///
    /// # Examples
    /// See [`AsyncStore`].
    pub async fn complete(&self, claim: &B::Claim, outcome: &[u8]) -> Result<()> {
        self.run(|s| Write::complete(s, claim, Outcome::raw(outcome)))
            .await
    }

    /// [`Store::complete_for`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::complete_for`].
    ///
    /// # Examples
    /// See [`Store::complete_for`].
    pub async fn complete_for(
        &self,
        claim: &B::Claim,
        outcome: &[u8],
        retention: Duration,
    ) -> Result<()> {
        let outcome = Outcome::raw(outcome).retention(retention);
        self.run(|s| Write::complete(s, claim, outcome)).await
    }
}

impl AsyncStore<Store> {
    /// [`Store::complete_value`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::complete_value`].
    ///
    /// # Examples
    /// See [`Store::complete_value`].
    pub async fn complete_value<T>(&self, claim: &Claim, outcome: &T) -> Result<()>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Sync,
    {
        self.run(|s| s.complete_value_pending(claim, outcome)).await
    }
}

impl<B: Write> AsyncStore<B> {
    /// [`Store::complete_with_amount`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::complete_with_amount`].
    ///
    /// # Examples
    /// See [`Store::complete_with_amount`].
    pub async fn complete_with_amount(
        &self,
        claim: &B::Claim,
        outcome: &[u8],
        amount: i64,
    ) -> Result<()> {
        let outcome = Outcome::raw(outcome).amount(amount);
        self.run(|s| Write::complete(s, claim, outcome)).await
    }

    /// [`Store::complete_batch`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::complete_batch`].
    ///
    /// # Examples
    /// See [`Store::begin_batch`].
    pub async fn complete_batch(&self, items: &[(&B::Claim, &[u8])]) -> Result<Vec<Result<()>>> {
        self.run(|s| Write::complete_batch(s, items)).await
    }

    /// [`Store::fail`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::fail`].
    ///
    /// # Examples
    /// See [`Failure`].
    pub async fn fail(&self, claim: &B::Claim, failure: Failure<'_>) -> Result<()> {
        self.run(|s| Write::fail(s, claim, failure)).await
    }

    /// [`Store::renew`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::renew`].
    ///
    /// # Examples
    /// See [`Store::renew`].
    pub async fn renew(&self, claim: &B::Claim) -> Result<SystemTime> {
        self.run(|s| Write::renew(s, claim, None)).await
    }

    /// [`Store::renew_for`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::renew_for`].
    ///
    /// # Examples
    /// See [`Store::renew_for`].
    pub async fn renew_for(&self, claim: &B::Claim, by: Duration) -> Result<SystemTime> {
        self.run(|s| Write::renew(s, claim, Some(by))).await
    }
}

impl<B: Intents> AsyncStore<B> {
    /// [`Store::mark_sent`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::mark_sent`].
    ///
    /// # Examples
    /// See [`Intent`].
    pub async fn mark_sent(&self, claim: &B::Claim, reference: &[u8]) -> Result<()> {
        self.mark_answered(claim, Answer::Accepted(reference)).await
    }

    /// [`Store::mark_answered`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::mark_answered`].
    ///
    /// # Examples
    /// See [`Store::mark_answered`].
    pub async fn mark_answered(&self, claim: &B::Claim, answer: Answer<'_>) -> Result<()> {
        self.run(|s| Intents::mark_answered(s, claim, answer)).await
    }
}

impl<B: DeadLetters> AsyncStore<B> {
    /// [`Store::requeue`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::requeue`].
    ///
    /// # Examples
    /// See [`Store::requeue`].
    pub async fn requeue(&self, key: &Key<'_>) -> Result<bool> {
        self.run(|s| DeadLetters::requeue(s, key)).await
    }

    /// [`Store::resolve`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::resolve`].
    ///
    /// # Examples
    /// See [`Store::resolve`].
    pub async fn resolve(&self, key: &Key<'_>, resolution: Resolution<'_>) -> Result<bool> {
        self.run(|s| DeadLetters::resolve(s, key, resolution)).await
    }
}

impl<B: Order> AsyncStore<B> {
    /// [`Store::advance`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::advance`].
    ///
    /// # Examples
    /// See [`Store::advance`].
    pub async fn advance(&self, entity: &Key<'_>, version: u64) -> Result<Advance> {
        self.run(|s| Order::advance(s, entity, version)).await
    }

    /// [`Store::apply_event`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::apply_event`].
    ///
    /// # Examples
    /// See [`Store::apply_event`].
    pub async fn apply_event(
        &self,
        event: &Key<'_>,
        entity: &Key<'_>,
        version: u64,
    ) -> Result<Update> {
        self.run(|s| Order::apply_event(s, event, entity, version))
            .await
    }

    /// [`Store::sequence`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::sequence`].
    ///
    /// # Examples
    /// See [`Store::sequence`].
    pub async fn sequence(&self, entity: &Key<'_>, seq: u64, payload: &[u8]) -> Result<Sequenced> {
        self.sequence_with(entity, seq, payload, &SequenceOptions::new())
            .await
    }

    /// [`Store::sequence_with`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::sequence_with`].
    ///
    /// # Examples
    /// See [`Store::sequence_with`].
    pub async fn sequence_with(
        &self,
        entity: &Key<'_>,
        seq: u64,
        payload: &[u8],
        options: &SequenceOptions,
    ) -> Result<Sequenced> {
        self.run(|s| Order::sequence(s, entity, seq, payload, options))
            .await
    }

    /// [`Store::release_held`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::release_held`].
    ///
    /// # Examples
    /// See [`Store::release_held`].
    pub async fn release_held(&self, entity: &Key<'_>) -> Result<Vec<Delivered>> {
        self.run(|s| Order::release_held(s, entity)).await
    }

    /// [`Store::ack`], resolved once durable.
    ///
    /// # Errors
    /// As [`Store::ack`].
    ///
    /// # Examples
    /// See [`Store::ack`].
    pub async fn ack(&self, entity: &Key<'_>, upto: u64) -> Result<usize> {
        self.run(|s| Order::ack(s, entity, upto)).await
    }
}
