//! The runner of an external call to a provider that deduplicates on an
//! idempotency key and can be asked about one ([`RetryPolicy::call`]): the
//! whole safe sequence, answered as a [`Run`].
//!
//! The decisions are steps ([`Step`]) that record in the store and say
//! what to do next (ask the provider, make the call, or answer); `call`
//! drives them with the caller's closures. An asynchronous front drives
//! the same steps, awaiting its lookup and call between them: there is one
//! copy of the decisions.
//!
//! Invariants:
//! - the intent is recorded in the claim's commit, before any call;
//! - the limits are checked after the claim is taken and before the
//!   provider is called; past them, an earlier call that may have
//!   happened is settled by one lookup first (found: completed; not
//!   found: recorded, then dead-lettered), asked by one claim past
//!   `max_attempts` at most, so a crash loop inside the lookup is bounded
//!   too;
//! - after an interrupted attempt, or an earlier call whose answer is
//!   unknown, the provider is asked before it is called again; a call it
//!   has is completed with its reference, never made twice by this runner;
//! - every answer the provider gave is recorded (`mark_answered`: accepted,
//!   refused, unknown, or, asked, found or not found) before the
//!   operation completes, fails or is released, or the call is made; an
//!   unknown one leaves the intent unanswered, so the next attempt asks
//!   first. A lookup's answer is recorded as one (`Found`, `NotFound`), so
//!   a takeover or a timeout settled by asking is no duplicate candidate.

use std::fmt;
use std::ops::ControlFlow;

use super::limits::{cut, dead_letter_before};
use super::retry::{ErrorClass, GiveUpReason, RetryPolicy};
use super::run::{Raw, Run};
use crate::contract::{Intents, Pending, Settle, Write};
use crate::{Claim, Fingerprint, Intent, Key, Result, Store};
#[cfg(doc)]
use crate::{Failure, Listing};

/// An external call for [`RetryPolicy::call`]: the intent to record, how
/// to ask the provider whether an earlier attempt's call reached it, how
/// to make the call, and how to read its errors.
///
/// - `lookup(&claim)`: ask the provider for the call made with
///   [`claim.provider_key()`](Claim::provider_key). `Ok(Some(reference))`:
///   it has it (its label, charge id, message id); `Ok(None)`: it has no
///   such call; `Err(e)`: it could not tell (down, timed out).
/// - `send(&claim)`: make the call, sending `claim.provider_key()` as the
///   provider's idempotency key. `Ok(reference)`: it accepted; `Err(e)`:
///   see `classify`.
/// - `classify(&e)`: a refusal worth retrying
///   ([`Retryable`](ErrorClass::Retryable): a 503, a 429), a refusal for
///   good ([`Permanent`](ErrorClass::Permanent): a 400, a declined card),
///   or no answer ([`Unanswered`](ErrorClass::Unanswered): a timeout; the
///   call may have happened).
///
/// The reference is what the operation completes with.
///
/// The runner takes the claim's provider key before it runs `lookup` or
/// `send` (with an asynchronous replica, once the claim is uploaded; see
/// [`Claim::provider_key`]), so in them `claim.provider_key()` answers at
/// once and without error; a claim whose key cannot be kept (a fenced
/// owner's) calls neither, and the runner returns that error.
///
/// # Examples
/// See [`RetryPolicy::call`].
#[must_use = "an Effect does nothing until RetryPolicy::call runs it"]
pub struct Effect<'a, L, S, C> {
    intent: Intent<'a>,
    lookup: L,
    send: S,
    classify: C,
    amount: i64,
}

impl<'a, L, S, C> Effect<'a, L, S, C> {
    /// The call described by `intent`, asked about with `lookup`, made
    /// with `send`, its errors read by `classify` (see [`Effect`]).
    ///
    /// # Examples
    /// See [`RetryPolicy::call`].
    pub fn new<E>(intent: Intent<'a>, lookup: L, send: S, classify: C) -> Self
    where
        L: FnOnce(&Claim) -> std::result::Result<Option<Vec<u8>>, E>,
        S: FnOnce(&Claim) -> std::result::Result<Vec<u8>, E>,
        C: FnOnce(&E) -> ErrorClass,
    {
        Effect {
            intent,
            lookup,
            send,
            classify,
            amount: 0,
        }
    }

    /// The amount the completion counts in its reconciliation window
    /// (parcels shipped, cents charged; see
    /// [`Store::complete_with_amount`]). Default: 0.
    ///
    /// # Examples
    /// See [`RetryPolicy::call`].
    pub fn amount(mut self, amount: i64) -> Self {
        self.amount = amount;
        self
    }
}

#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
impl<'a, L, S, C> Effect<'a, L, S, C> {
    /// [`new`](Self::new) with an async `lookup` and `send` (feature
    /// `async`), for [`RetryPolicy::call_async`]. Each gets the claim and
    /// returns the future of the provider's answer; the future cannot
    /// borrow the claim, so take its [`provider_key`](Claim::provider_key)
    /// first.
    ///
    /// # Examples
    /// See [`RetryPolicy::call_async`].
    pub fn new_async<E, LF, SF>(intent: Intent<'a>, lookup: L, send: S, classify: C) -> Self
    where
        L: FnOnce(&Claim) -> LF,
        LF: std::future::Future<Output = std::result::Result<Option<Vec<u8>>, E>>,
        S: FnOnce(&Claim) -> SF,
        SF: std::future::Future<Output = std::result::Result<Vec<u8>, E>>,
        C: FnOnce(&E) -> ErrorClass,
    {
        Effect {
            intent,
            lookup,
            send,
            classify,
            amount: 0,
        }
    }

    /// The effect's parts, for the async runner.
    pub(super) fn into_parts(self) -> (Intent<'a>, L, S, C, i64) {
        (
            self.intent,
            self.lookup,
            self.send,
            self.classify,
            self.amount,
        )
    }
}

impl<L, S, C> fmt::Debug for Effect<'_, L, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Effect")
            .field("intent", &self.intent)
            .field("amount", &self.amount)
            .finish_non_exhaustive()
    }
}

/// What a lookup step decided: the answer, or make the call.
pub(crate) type Asked<E> = ControlFlow<Run<Vec<u8>, E>, Claim>;

/// What the runner of an external call does next; each step has recorded
/// what it decided before it is returned.
pub(crate) enum Step<E> {
    /// Settled: the answer.
    Answer(Run<Vec<u8>, E>),
    /// Ask the provider first (an earlier attempt may have made the call),
    /// then `RetryPolicy::asked`; with a reason, the limits were reached:
    /// ask only to settle the earlier call before the dead letter.
    Ask(Claim, Option<GiveUpReason>),
    /// Make the call, then `RetryPolicy::sent`.
    Send(Claim),
}

/// What the provider said, as the runner records it with
/// `mark_answered`.
enum Answer<'a> {
    /// It accepted the call, with this reference.
    Accepted(&'a [u8]),
    /// Asked, it has the call, with this reference.
    Found(&'a [u8]),
    /// It refused the call.
    Refused(&'a dyn fmt::Display),
    /// No answer came to the call.
    Unknown,
    /// Asked, it has no such call.
    NotFound,
}

impl RetryPolicy {
    /// Performs one attempt of the external call `effect` for the
    /// operation on `key`, in the safe order, and records what came of it:
    ///
    /// 1. [`Store::begin_with_intent`]: the claim and the intent, in one
    ///    durable commit, before any call. A key that finished, is held
    ///    elsewhere or is dead-lettered is answered as by [`run`](Self::run),
    ///    without a call.
    /// 2. The policy's limits, counted in the claim's round (see
    ///    [`max_attempts`](crate::RetryPolicyBuilder::max_attempts) and
    ///    [`max_elapsed`](crate::RetryPolicyBuilder::max_elapsed)): past
    ///    them, the call is not made. If an earlier attempt's call may have
    ///    happened (as in 3), `lookup` settles it first — found: recorded
    ///    and completed, [`Run::Reconciled`]; not found: recorded
    ///    ([`Answer::NotFound`](crate::Answer::NotFound)) — unless this claim is more than one past
    ///    `max_attempts` (the lookup itself may be what kills the worker).
    ///    Then the operation is dead-lettered with the intent's request as
    ///    the payload: [`Run::Exhausted`].
    /// 3. If the claim took over an attempt that never answered
    ///    ([`Claim::interrupted`]) or an earlier call's answer is unknown
    ///    ([`Claim::unanswered_intent`]): `lookup` first. Found: the
    ///    reference is recorded ([`Store::mark_answered`] with
    ///    [`Answer::Found`](crate::Answer::Found)) and completed with, and
    ///    the call is not made again: [`Run::Reconciled`]. Not found:
    ///    recorded ([`Answer::NotFound`](crate::Answer::NotFound)), then on
    ///    to the call. Could not tell: released for a retry under the
    ///    policy, the intent still unanswered: [`Run::RetryAfter`] (or
    ///    [`Run::GaveUp`], dead-lettered, when the policy gives up).
    /// 4. `send`. Accepted: `mark_sent` with the reference, then
    ///    [`Store::complete_with_amount`] with it: [`Run::Done`]. Refused:
    ///    [`Answer::Refused`](crate::Answer::Refused) with the error (the
    ///    provider answered, so the next attempt need not ask), then, by `classify`, a retry
    ///    ([`Run::RetryAfter`]), a dead letter when the policy gives up, or
    ///    a permanent failure ([`Run::GaveUp`]). No answer
    ///    ([`ErrorClass::Unanswered`]): [`Answer::Unknown`](crate::Answer::Unknown)
    ///    recorded, released for a retry, so the next attempt asks first.
    ///
    /// It never sleeps: wait [`Run::retry_after`] and call again, or hand
    /// the key to a queue with that delay. [`run`](Self::run) stays for
    /// effects without a provider to ask.
    ///
    /// # Concurrent calls on the same key
    /// One caller asks and calls; the others get [`Run::InProgress`] (or
    /// [`Run::Replayed`] once it finished), as with `begin`.
    ///
    /// # Errors
    /// What `begin_with_intent`, `mark_sent`, `complete_with_amount` or
    /// `fail` return: [`Error::ClaimLost`](crate::Error::ClaimLost) if the
    /// lease lapsed during the lookup or the call and another attempt took
    /// the key over; [`Error::InvalidInput`](crate::Error::InvalidInput)
    /// for an intent, or a provider's reference, over the store's
    /// `max_outcome_len`. The claim is then released when it drops (the
    /// next attempt is interrupted, and asks the provider first). What
    /// [`Claim::provider_key`] returns ([`Error::Fenced`](crate::Error::Fenced)
    /// for an owner whose replica was taken over before the claim was
    /// uploaded), before either closure runs. The closures' own errors
    /// come back in `RetryAfter` and `GaveUp`.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Effect, ErrorClass, Fingerprint, Intent, Key, RetryPolicy, Run, Store};
    /// use std::cell::RefCell;
    /// use std::collections::HashMap;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// // A carrier that deduplicates on the idempotency key.
    /// let shipments: RefCell<HashMap<String, String>> = RefCell::default();
    /// let policy = RetryPolicy::new();
    /// let key = Key::new("shop-42", "ship-order-7");
    /// let request = b"order 7: 2 parcels to 12 Harbour Road";
    /// let ship = || {
    ///     Effect::new(
    ///         Intent { target: "carrier", request },
    ///         |claim| {
    ///             let idempotency_key = claim.provider_key().map_err(|e| e.to_string())?;
    ///             Ok(shipments.borrow().get(&idempotency_key).map(|l| l.clone().into_bytes()))
    ///         },
    ///         |claim| {
    ///             let idempotency_key = claim.provider_key().map_err(|e| e.to_string())?;
    ///             let mut s = shipments.borrow_mut();
    ///             let label = format!("1Z{:03}", s.len() + 1);
    ///             Ok(s.entry(idempotency_key).or_insert(label).clone().into_bytes())
    ///         },
    ///         |_: &String| ErrorClass::Unanswered,
    ///     )
    ///     .amount(2)
    /// };
    /// let run = policy.call(&store, &key, Fingerprint::of(&request[..]), ship())?;
    /// assert!(matches!(run, Run::Done(ref label) if label == b"1Z001"));
    /// // A redelivery replays the label: the carrier is not asked or called.
    /// let again = policy.call(&store, &key, Fingerprint::of(&request[..]), ship())?;
    /// assert!(matches!(again, Run::Replayed(ref label) if label == b"1Z001"));
    /// assert_eq!(shipments.borrow().len(), 1);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn call<E, L, S, C>(
        &self,
        store: &Store,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        effect: Effect<'_, L, S, C>,
    ) -> Result<Run<Vec<u8>, E>>
    where
        E: fmt::Display,
        L: FnOnce(&Claim) -> std::result::Result<Option<Vec<u8>>, E>,
        S: FnOnce(&Claim) -> std::result::Result<Vec<u8>, E>,
        C: FnOnce(&E) -> ErrorClass,
    {
        let Effect {
            intent,
            lookup,
            send,
            classify,
            amount,
        } = effect;
        let claim = match store.tell(self.begun(store, key, fingerprint, intent)?)? {
            Step::Answer(run) => return Ok(run),
            Step::Send(claim) => {
                claim.provider_key()?;
                claim
            }
            Step::Ask(claim, limit) => {
                claim.provider_key()?;
                let found = lookup(&claim);
                match store.tell(self.asked(store, claim, intent, found, amount, limit)?)? {
                    ControlFlow::Continue(claim) => claim,
                    ControlFlow::Break(run) => return Ok(run),
                }
            }
        };
        let sent = send(&claim);
        store.tell(self.sent(store, &claim, intent, sent, classify, amount)?)
    }

    /// Step 1 and 2: claims the key with `intent` and checks the limits.
    pub(crate) fn begun<E>(
        &self,
        store: &Store,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        intent: Intent<'_>,
    ) -> Result<Pending<Step<E>>> {
        let (begun, basis) =
            Write::begin(store, key, fingerprint, &self.begin, Some(intent))?.into_parts();
        let claim = match self.started::<Raw, _, E>(key, begun)? {
            ControlFlow::Continue(claim) => claim,
            ControlFlow::Break(run) => return Ok(Pending::new(Step::Answer(run), basis)),
        };
        let step = |step| Ok(Pending::new(step, basis));
        let ask = claim.interrupted() || claim.unanswered_intent();
        if let Some(reason) = self.limit_reached(&claim) {
            // An earlier call may have happened: settle it first, asking
            // from one claim past `max_attempts` at most, so a lookup that
            // crashes its worker is bounded too.
            if ask && claim.round_attempt() <= self.max_attempts.saturating_add(1) {
                return step(Step::Ask(claim, Some(reason)));
            }
            let unanswered = claim.unanswered_intent();
            let run = dead_letter_before(store, &claim, reason, Some(intent.request), unanswered)?;
            return Ok(run.map(Step::Answer).after(basis));
        }
        step(if ask {
            Step::Ask(claim, None)
        } else {
            Step::Send(claim)
        })
    }

    /// Step 3: records what the provider's lookup found; `Continue`: it
    /// has no such call, make it. Past the limits (`limit`), the
    /// operation completes if the provider has the call, and is
    /// dead-lettered otherwise, with the lookup's answer recorded.
    pub(crate) fn asked<E: fmt::Display>(
        &self,
        store: &Store,
        claim: Claim,
        intent: Intent<'_>,
        found: std::result::Result<Option<Vec<u8>>, E>,
        amount: i64,
        limit: Option<GiveUpReason>,
    ) -> Result<Pending<Asked<E>>> {
        let payload = Some(intent.request);
        let run = match (found, limit) {
            (Ok(Some(reference)), _) => {
                let done = accepted(store, &claim, intent, (true, &reference), amount)?;
                done.map(|()| Run::Reconciled(reference))
            }
            (Ok(None), None) => {
                // Settles the earlier call before this one is made.
                let asked = record(store, &claim, intent, &Answer::NotFound)?;
                return Ok(asked.map(|()| ControlFlow::Continue(claim)));
            }
            (Ok(None), Some(reason)) => {
                let asked = record(store, &claim, intent, &Answer::NotFound)?.basis();
                dead_letter_before(store, &claim, reason, payload, false)?.after(asked)
            }
            (Err(error), None) => {
                self.failed(store, &claim, ErrorClass::Unanswered, error, payload)?
            }
            (Err(_), Some(reason)) => dead_letter_before(store, &claim, reason, payload, true)?,
        };
        Ok(run.map(ControlFlow::Break))
    }

    /// Step 4: records what came of the call.
    pub(crate) fn sent<E: fmt::Display>(
        &self,
        store: &Store,
        claim: &Claim,
        intent: Intent<'_>,
        sent: std::result::Result<Vec<u8>, E>,
        classify: impl FnOnce(&E) -> ErrorClass,
        amount: i64,
    ) -> Result<Pending<Run<Vec<u8>, E>>> {
        match sent {
            Ok(reference) => {
                let done = accepted(store, claim, intent, (false, &reference), amount)?;
                Ok(done.map(|()| Run::Done(reference)))
            }
            Err(error) => {
                let class = classify(&error);
                let answer = if class == ErrorClass::Unanswered {
                    Answer::Unknown
                } else {
                    Answer::Refused(&error)
                };
                let answered = record(store, claim, intent, &answer)?.basis();
                let failed = self.failed(store, claim, class, error, Some(intent.request))?;
                Ok(failed.after(answered))
            }
        }
    }
}

/// The provider has the call, with `reference` (it accepted it, or,
/// `found`, asked, it has it): its answer recorded, then the outcome.
fn accepted(
    store: &Store,
    claim: &Claim,
    intent: Intent<'_>,
    (found, reference): (bool, &[u8]),
    amount: i64,
) -> Result<Pending<()>> {
    let answer = if found {
        Answer::Found(reference)
    } else {
        Answer::Accepted(reference)
    };
    let answered = record(store, claim, intent, &answer)?.basis();
    let outcome = crate::contract::Outcome::raw(reference).amount(amount);
    Ok(Write::complete(store, claim, outcome)?.after(answered))
}

/// Records the provider's answer to the claim's intent (one that did not
/// come as `Unknown`: the intent stays unanswered).
fn record(
    store: &Store,
    claim: &Claim,
    intent: Intent<'_>,
    answer: &Answer<'_>,
) -> Result<Pending<()>> {
    let text;
    let answer = match answer {
        Answer::Accepted(reference) => crate::Answer::Accepted(reference),
        Answer::Found(reference) => crate::Answer::Found(reference),
        Answer::Refused(error) => {
            // Within the intent record's limit, with its target.
            let limit = store.max_outcome_len().saturating_sub(intent.target.len());
            text = cut(error.to_string(), limit);
            crate::Answer::Refused(&text)
        }
        Answer::Unknown => crate::Answer::Unknown,
        Answer::NotFound => crate::Answer::NotFound,
    };
    Intents::mark_answered(store, claim, answer)
}
