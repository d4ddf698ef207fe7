//! The runners' async twins (feature `async`): [`RetryPolicy::run_async`]
//! and [`RetryPolicy::call_async`] take async work and drive the same
//! decision steps as `run` and `call` — each step recorded through the
//! [`AsyncStore`], its durability awaited, the work awaited between steps.
//! No second copy of the decisions: the steps are the blocking runners'
//! own, each returning what its answer rests on ([`Pending`](crate::contract::Pending)),
//! which the blocking runner waits for and this one awaits.

use std::fmt;
use std::future::Future;
use std::ops::ControlFlow;

use super::call::{Effect, Step};
use super::limits::dead_letter_before;
use super::retry::{ErrorClass, RetryPolicy};
use super::run::{Raw, Run};
use crate::contract::Write;
use crate::{AsyncStore, Claim, Fingerprint, Key, Result};

#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
impl RetryPolicy {
    /// [`run`](Self::run) with async work (feature `async`): one attempt
    /// of the operation on `key` under a claim, the same order (record,
    /// limits, effect, outcome) and the same answers, without blocking the
    /// executor.
    ///
    /// `work` gets the claim and returns the future of the effect; that
    /// future cannot borrow the claim, so take what it needs (its
    /// [`provider_key_async`](Claim::provider_key_async) future, its
    /// attempt) before the `async move` block.
    ///
    /// # Cancellation
    /// Dropped while `work` runs (or while a step's commit is awaited),
    /// the claim drops with it: the key is released as a dropped claim and
    /// the next attempt is [`interrupted`](Claim::interrupted), so it
    /// checks whether the effect happened. An outcome or failure already
    /// decided stands.
    ///
    /// # Errors
    /// As [`run`](Self::run).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{AsyncStore, ErrorClass, Fingerprint, Key, RetryPolicy, Run, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
    /// let policy = RetryPolicy::new();
    /// let key = Key::new("shop-42", "ship-order-7");
    /// let run = policy
    ///     .run_async(&store, &key, Fingerprint::of("order 7"), |_: &String| ErrorClass::Retryable, |claim| {
    ///         let idempotency_key = claim.provider_key_async();
    ///         async move {
    ///             let idempotency_key = idempotency_key.await.map_err(|e| e.to_string())?;
    ///             // an HTTP call to the carrier, with `idempotency_key`
    ///             Ok(format!("label for {idempotency_key}").into_bytes())
    ///         }
    ///     })
    ///     .await?;
    /// assert!(matches!(run, Run::Done(ref label) if label.starts_with(b"label for ")));
    /// # Ok::<(), dedupkv::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn run_async<E, C, F, Fut>(
        &self,
        store: &AsyncStore,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        classify: C,
        work: F,
    ) -> Result<Run<Vec<u8>, E>>
    where
        E: fmt::Display,
        C: FnOnce(&E) -> ErrorClass,
        F: FnOnce(&Claim) -> Fut,
        Fut: Future<Output = std::result::Result<Vec<u8>, E>>,
    {
        let begun = store
            .call(|s| Write::begin(s, key, fingerprint, &self.begin, None))
            .await?;
        let claim = match self.started::<Raw, Vec<u8>, E>(key, begun)? {
            ControlFlow::Continue(claim) => claim,
            ControlFlow::Break(run) => return Ok(run),
        };
        if let Some(reason) = self.limit_reached(&claim) {
            let unanswered = claim.unanswered_intent();
            return store
                .call(|s| dead_letter_before(s, &claim, reason, None, unanswered))
                .await;
        }
        let done = work(&claim).await;
        store
            .call(|s| self.worked::<Raw, _, E>(s, &claim, done, classify))
            .await
    }

    /// [`call`](Self::call) with an async lookup and send (feature
    /// `async`): the same safe sequence (claim and intent in one commit,
    /// limits, ask first after an interruption, the answer recorded, then
    /// complete, fail or dead letter), each step awaited instead of waited
    /// for. Build the effect with [`Effect::new_async`]. The runner awaits
    /// the claim's [`provider_key_async`](Claim::provider_key_async) before
    /// the lookup or the call, so in them `claim.provider_key()` answers at
    /// once.
    ///
    /// # Cancellation
    /// Dropped while the lookup or the call runs, the claim drops with the
    /// future: the key is released, the intent stays unanswered, and the
    /// next attempt is interrupted and asks the provider first — exactly
    /// as after a worker that died inside the call.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{AsyncStore, Effect, ErrorClass, Fingerprint, Intent, Key, RetryPolicy, Run, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
    /// let request = b"order 7: 2 parcels";
    /// let ship = Effect::new_async(
    ///     Intent { target: "carrier", request },
    ///     |_claim| async { Ok::<_, String>(None) },          // the carrier has no such shipment
    ///     |claim| {
    ///         // Taken by the runner before `send`: at once, without error.
    ///         let idempotency_key = claim.provider_key().map_err(|e| e.to_string());
    ///         async move { Ok(format!("1Z for {}", idempotency_key?).into_bytes()) }
    ///     },
    ///     |_: &String| ErrorClass::Unanswered,
    /// );
    /// let policy = RetryPolicy::new();
    /// let key = Key::new("shop-42", "ship-order-7");
    /// let run = policy.call_async(&store, &key, Fingerprint::of(&request[..]), ship).await?;
    /// assert!(matches!(run, Run::Done(_)));
    /// # Ok::<(), dedupkv::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn call_async<E, L, LF, S, SF, C>(
        &self,
        store: &AsyncStore,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        effect: Effect<'_, L, S, C>,
    ) -> Result<Run<Vec<u8>, E>>
    where
        E: fmt::Display,
        L: FnOnce(&Claim) -> LF,
        LF: Future<Output = std::result::Result<Option<Vec<u8>>, E>>,
        S: FnOnce(&Claim) -> SF,
        SF: Future<Output = std::result::Result<Vec<u8>, E>>,
        C: FnOnce(&E) -> ErrorClass,
    {
        let (intent, lookup, send, classify, amount) = effect.into_parts();
        let step = store
            .call(|s| self.begun::<E>(s, key, fingerprint, intent))
            .await?;
        let claim = match step {
            Step::Answer(run) => return Ok(run),
            Step::Send(claim) => {
                claim.provider_key_async().await?;
                claim
            }
            Step::Ask(claim, limit) => {
                claim.provider_key_async().await?;
                let found = lookup(&claim).await;
                let asked = store
                    .call(|s| self.asked(s, claim, intent, found, amount, limit))
                    .await?;
                match asked {
                    ControlFlow::Continue(claim) => claim,
                    ControlFlow::Break(run) => return Ok(run),
                }
            }
        };
        let answer = send(&claim).await;
        store
            .call(|s| self.sent(s, &claim, intent, answer, classify, amount))
            .await
    }
}
