//! The runner of effects without a provider to ask: one attempt of an
//! operation under a claim, in the safe order (record, limits, effect,
//! outcome), answered as a [`Run`] (which [`RetryPolicy::call`] answers
//! too).

use std::fmt;
use std::ops::ControlFlow;
use std::time::{Duration, SystemTime};

use super::limits::dead_letter_before;
use super::retry::{ErrorClass, GiveUpReason, RetryPolicy};
#[cfg(doc)]
use crate::Failure;
use crate::contract::{Pending, Settle, Write};
use crate::{Begin, Claim, DeadLetter, Error, Fingerprint, Key, Record, Result, State, Store};

/// What [`RetryPolicy::run`] or [`RetryPolicy::call`] did.
///
/// A permanent error is recorded as a permanent failure; retries that run
/// out (attempts or elapsed time, checked before each attempt and after
/// each failure) move the operation to the dead-letter area
/// ([`Store::dead_letters`]), where it waits for an operator.
///
/// # Examples
/// See [`RetryPolicy::run`] and [`RetryPolicy::call`].
#[derive(Debug)]
#[non_exhaustive]
#[must_use = "a Run says whether to wait and call again"]
pub enum Run<T, E> {
    /// This call claimed the key, ran the closure and recorded its outcome
    /// (for `call`: the provider accepted the call, and its reference is
    /// recorded).
    Done(T),
    /// `call` only: an earlier attempt's call had reached the provider (the
    /// lookup found it): its reference is recorded as the outcome, and the
    /// call was not made again.
    Reconciled(T),
    /// The operation completed before: its stored outcome. The closure did
    /// not run.
    Replayed(T),
    /// The operation failed permanently before (a permanent error, or a
    /// dead letter an operator resolved as abandoned): its record, whose
    /// [`outcome`](Record::outcome) is the failure text. The closure did
    /// not run.
    Failed(Record),
    /// The closure failed with a retryable error (for `call`: the
    /// provider refused for now, did not answer, or its lookup could not
    /// tell); the key is released for the next attempt. Call again after
    /// `after`.
    #[non_exhaustive]
    RetryAfter {
        /// How long to wait before the next attempt.
        after: Duration,
        /// The number of the attempt that failed (1 for the first).
        attempt: u32,
        /// The closure's error.
        error: E,
    },
    /// The closure failed and the policy gave up, recording
    /// `"<reason>: <error>"` (cut to 1 KiB and to the store's
    /// `max_outcome_len`): for a permanent error as a permanent failure,
    /// which every later `begin` replays; for exhausted retries as a dead
    /// letter (`dead_lettered`), which every later `run` answers with
    /// [`Run::DeadLettered`] until an operator requeues or resolves it.
    #[non_exhaustive]
    GaveUp {
        /// Attempts made, this one included.
        attempts: u32,
        /// Why the policy stopped.
        reason: GiveUpReason,
        /// The operation went to the dead-letter area.
        dead_lettered: bool,
        /// The closure's error.
        error: E,
    },
    /// The policy's limit was reached before this attempt started (see
    /// [`max_attempts`](crate::RetryPolicyBuilder::max_attempts) and
    /// [`max_elapsed`](crate::RetryPolicyBuilder::max_elapsed)): the
    /// earlier attempts of the round were used up (their workers may have
    /// died inside the work), or its time ran out while no worker ran. The
    /// claim was dead-lettered with `"<reason>; attempt <n> not started"`
    /// ([`Failure::Exhausted`]); the closure did not run.
    #[non_exhaustive]
    Exhausted {
        /// The number of the attempt that was not made.
        attempt: u32,
        /// Which limit was reached.
        reason: GiveUpReason,
    },
    /// The operation is in the dead-letter area (its retries ran out
    /// before); the closure did not run.
    DeadLettered(DeadLetter),
    /// Another attempt holds a live lease; the closure did not run. Call
    /// again after `retry_after`: the key is then finished, or free to take
    /// over.
    #[non_exhaustive]
    InProgress {
        /// Time until the running attempt's lease lapses, by the policy's
        /// clock (zero if it has lapsed already).
        retry_after: Duration,
        /// When the running attempt's lease lapses.
        lease_expires_at: SystemTime,
        /// The running attempt's number.
        attempt: u32,
    },
}

impl<T, E> Run<T, E> {
    /// How long to wait before calling `run` again: `Some` for
    /// [`RetryAfter`](Run::RetryAfter) and [`InProgress`](Run::InProgress),
    /// `None` when the operation is settled.
    ///
    /// # Examples
    /// See [`RetryPolicy::run`].
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Run::RetryAfter { after, .. } => Some(*after),
            Run::InProgress { retry_after, .. } => Some(*retry_after),
            Run::Done(_)
            | Run::Reconciled(_)
            | Run::Replayed(_)
            | Run::Failed(_)
            | Run::GaveUp { .. }
            | Run::Exhausted { .. }
            | Run::DeadLettered(_) => None,
        }
    }
}

impl RetryPolicy {
    /// Performs one attempt of the operation on `key` under a claim, and
    /// records what came of it; the outcome is bytes (see
    /// [`run_value`](Self::run_value) for a typed one).
    ///
    /// For effects with a provider to ask (a payment, a shipment), use
    /// [`call`](Self::call): it records an intent and asks the provider
    /// after an interrupted attempt before calling again.
    ///
    /// By what [`Store::begin`] answers:
    /// - `Started`: first the policy's limits, counted in the claim's round
    ///   ([`Claim::round_attempt`], [`Claim::round_started_at`]): a claim
    ///   past `max_attempts` (the attempts before it were taken over after
    ///   their workers died) or past `max_elapsed` is dead-lettered without
    ///   running `work`: [`Run::Exhausted`]. Then it runs `work` with the
    ///   claim. `Ok(outcome)` is recorded with [`Store::complete`]:
    ///   [`Run::Done`]. An error `classify` calls
    ///   [`Retryable`](ErrorClass::Retryable) (or
    ///   [`Unanswered`](ErrorClass::Unanswered)), while the policy permits,
    ///   releases the key with [`Failure::Retryable`]: [`Run::RetryAfter`].
    ///   A permanent error is recorded with [`Failure::Permanent`] and the
    ///   text `"permanent error: <error>"`; a retryable one the policy
    ///   gives up on is dead-lettered with [`Failure::Exhausted`] and the
    ///   text `"<reason>: <error>"`: both [`Run::GaveUp`].
    /// - `Completed`: the closure does not run. [`Run::Replayed`] with the
    ///   stored outcome, or [`Run::Failed`] with a permanent failure's record.
    /// - `DeadLettered`: the closure does not run. [`Run::DeadLettered`].
    /// - `InProgress`: the closure does not run. [`Run::InProgress`] with the
    ///   time until that attempt's lease lapses.
    ///
    /// It never sleeps: the caller waits [`Run::retry_after`] and calls
    /// again (below), or hands the key to a queue with that delay.
    ///
    /// A claim taken over from an attempt that never answered is
    /// [`interrupted`](Claim::interrupted): `work` should then ask the
    /// system it calls whether the first call went through (by
    /// [`provider_key`](Claim::provider_key)) before calling again — which
    /// is what [`call`](Self::call) does.
    ///
    /// # Concurrent calls on the same key
    /// One caller runs `work`; the others get `InProgress` (or `Replayed`
    /// once it finished), as with `begin`.
    ///
    /// # Errors
    /// What `begin`, `complete` or `fail` return: [`Error::ClaimLost`] if
    /// the lease lapsed during `work` and another attempt took the key over
    /// (its result must not be published); [`Error::InvalidInput`] for an
    /// outcome over the store's limit (the key is then released as a
    /// retryable failure when the claim drops); [`Error::InvalidArgument`]
    /// for a key recorded by `insert_if_absent`, which has no outcome to
    /// replay. The work's own errors are not errors of `run`: they come
    /// back in `RetryAfter` and `GaveUp`. The limits' dead letter is
    /// recorded before `Exhausted` is answered; if recording it fails, the
    /// error is returned and the claim is released (the next attempt
    /// checks again).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{ErrorClass, Fingerprint, Key, RetryPolicy, Run, Store};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let policy = RetryPolicy::builder()
    ///     .base(Duration::from_millis(1))
    ///     .cap(Duration::from_millis(10))
    ///     .build()?;
    /// let key = Key::new("shop-42", "ship-order-7");
    /// let transient = |_: &String| ErrorClass::Retryable; // every error here is worth a retry
    /// let mut calls = 0;
    /// let label = loop {
    ///     let run = policy.run(&store, &key, Fingerprint::of("order 7"), transient, |claim| {
    ///         calls += 1; // the provider times out once, then answers
    ///         if calls == 1 {
    ///             return Err("timeout".to_string());
    ///         }
    ///         let idempotency_key = claim.provider_key().map_err(|e| e.to_string())?;
    ///         Ok(format!("label for {idempotency_key}").into_bytes())
    ///     })?;
    ///     match run {
    ///         Run::Done(label) | Run::Replayed(label) => break label,
    ///         Run::GaveUp { reason, error, .. } => panic!("{reason}: {error}"),
    ///         Run::Exhausted { reason, .. } => panic!("{reason}"),
    ///         Run::Failed(record) => panic!("failed before: {:?}", record.outcome()),
    ///         other => std::thread::sleep(other.retry_after().unwrap_or_default()),
    ///     }
    /// };
    /// assert!(label.starts_with(b"label for "));
    /// assert_eq!(calls, 2);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn run<E, C, F>(
        &self,
        store: &Store,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        classify: C,
        work: F,
    ) -> Result<Run<Vec<u8>, E>>
    where
        E: fmt::Display,
        C: FnOnce(&E) -> ErrorClass,
        F: FnOnce(&Claim) -> std::result::Result<Vec<u8>, E>,
    {
        self.run_as::<Raw, _, _, _, _>(store, key, fingerprint, classify, work)
    }

    /// [`run`](Self::run) with a typed outcome: recorded with
    /// [`Store::complete_value`] and replayed with
    /// [`Record::outcome_as`].
    ///
    /// # Errors
    /// As `run`, and [`Error::Codec`] if the outcome cannot be stored so
    /// that it reads back as `T`, or a stored one does not decode as `T`.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{ErrorClass, Fingerprint, Key, RetryPolicy, Run, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let policy = RetryPolicy::new();
    /// let key = Key::new("shop-42", "refund-3");
    /// let transient = |_: &String| ErrorClass::Retryable;
    /// let first = policy.run_value(&store, &key, Fingerprint::NONE, transient, |_claim| {
    ///     Ok((201u16, "re_1".to_string())) // (status, refund id)
    /// })?;
    /// assert!(matches!(first, Run::Done((201, _))));
    /// let again: Run<(u16, String), String> =
    ///     policy.run_value(&store, &key, Fingerprint::NONE, transient, |_claim| {
    ///         unreachable!("replayed, not run")
    ///     })?;
    /// assert!(matches!(again, Run::Replayed((201, ref id)) if id == "re_1"));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn run_value<T, E, C, F>(
        &self,
        store: &Store,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        classify: C,
        work: F,
    ) -> Result<Run<T, E>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: fmt::Display,
        C: FnOnce(&E) -> ErrorClass,
        F: FnOnce(&Claim) -> std::result::Result<T, E>,
    {
        self.run_as::<Typed, _, _, _, _>(store, key, fingerprint, classify, work)
    }

    fn run_as<K, T, E, C, F>(
        &self,
        store: &Store,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        classify: C,
        work: F,
    ) -> Result<Run<T, E>>
    where
        K: Outcome<T>,
        E: fmt::Display,
        C: FnOnce(&E) -> ErrorClass,
        F: FnOnce(&Claim) -> std::result::Result<T, E>,
    {
        // Before the work runs: a store that cannot record the outcome
        // must not let the effect happen.
        K::check(store)?;
        let claim =
            match self.started::<K, T, E>(key, store.begin_with(key, fingerprint, &self.begin)?)? {
                ControlFlow::Continue(claim) => claim,
                ControlFlow::Break(run) => return Ok(run),
            };
        if let Some(reason) = self.limit_reached(&claim) {
            let unanswered = claim.unanswered_intent();
            return store.tell(dead_letter_before(store, &claim, reason, None, unanswered)?);
        }
        let done = work(&claim);
        store.tell(self.worked::<K, T, E>(store, &claim, done, classify)?)
    }

    /// Step 3 of `run`: records what came of the work (its outcome, or
    /// its failure as the policy classes it).
    pub(super) fn worked<K: Outcome<T>, T, E: fmt::Display>(
        &self,
        store: &Store,
        claim: &Claim,
        done: std::result::Result<T, E>,
        classify: impl FnOnce(&E) -> ErrorClass,
    ) -> Result<Pending<Run<T, E>>> {
        match done {
            Ok(outcome) => Ok(K::record(store, claim, &outcome)?.map(|()| Run::Done(outcome))),
            Err(error) => {
                let class = classify(&error);
                self.failed(store, claim, class, error, None)
            }
        }
    }

    /// The claim `begun` started, or the answer to a `begin` that started
    /// none.
    pub(super) fn started<K: Outcome<T>, T, E>(
        &self,
        key: &Key<'_>,
        begun: Begin,
    ) -> Result<ControlFlow<Run<T, E>, Claim>> {
        let run = match begun {
            Begin::Started(claim) => return Ok(ControlFlow::Continue(claim)),
            Begin::Completed(record) => match record.state() {
                State::Completed => Run::Replayed(K::replay(&record)?),
                State::Failed => Run::Failed(record),
                _ => {
                    return Err(Error::InvalidArgument {
                        what: "key",
                        reason: format!(
                            "{key} was recorded by insert_if_absent: it has no outcome to replay"
                        ),
                    });
                }
            },
            Begin::DeadLettered(dl) => Run::DeadLettered(dl),
            Begin::InProgress(p) => {
                let lease_expires_at = p.lease_expires_at();
                Run::InProgress {
                    retry_after: lease_expires_at
                        .duration_since(self.now())
                        .unwrap_or(Duration::ZERO),
                    lease_expires_at,
                    attempt: p.attempt(),
                }
            }
        };
        Ok(ControlFlow::Break(run))
    }
}

/// How the runner records an outcome and replays a stored one.
pub(super) trait Outcome<T> {
    /// Fails if `store` cannot record such an outcome.
    fn check(store: &Store) -> Result<()>;
    fn record(store: &Store, claim: &Claim, outcome: &T) -> Result<Pending<()>>;
    fn replay(record: &Record) -> Result<T>;
}

/// Raw bytes: `complete` and `Record::outcome`.
pub(super) struct Raw;

impl Outcome<Vec<u8>> for Raw {
    fn check(_: &Store) -> Result<()> {
        Ok(())
    }

    fn record(store: &Store, claim: &Claim, outcome: &Vec<u8>) -> Result<Pending<()>> {
        Write::complete(store, claim, crate::contract::Outcome::raw(outcome))
    }

    fn replay(record: &Record) -> Result<Vec<u8>> {
        Ok(record.outcome().unwrap_or_default().to_vec())
    }
}

/// Typed values: `complete_value` and `Record::outcome_as`.
pub(super) struct Typed;

impl<T: serde::Serialize + serde::de::DeserializeOwned> Outcome<T> for Typed {
    /// A shared backend keeps raw bytes only (`Error::Unsupported`).
    fn check(store: &Store) -> Result<()> {
        store.engine_for("run_value").map(|_| ())
    }

    fn record(store: &Store, claim: &Claim, outcome: &T) -> Result<Pending<()>> {
        store.complete_value_pending(claim, outcome)
    }

    fn replay(record: &Record) -> Result<T> {
        record.outcome_as()
    }
}
