//! A backend the [`Store`](crate::Store) holds behind a pointer: the
//! contract with its claim type and its waiter erased, so one `Store`
//! type runs over the engine or over a backend of another crate
//! (the `PostgreSQL` backend, `dedupkv_postgres::PgStore`), chosen when it is opened
//! ([`StoreBuilder::open_shared`](crate::StoreBuilder::open_shared)).
//!
//! Nothing here is written by hand per backend: every backend that
//! implements [`Write`], [`Order`], [`DeadLetters`], [`Intents`],
//! [`Tallies`], [`Waits`] and [`Listings`], with a claim that is a [`SharedClaim`], is a
//! [`SharedBackend`].

use std::any::Any;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use super::{
    Basis, BegunBatch, DeadLetters, Handle, Intents, Listings, Order, Outcome, Pending, Settle,
    Tallies, Waits, Write,
};
use crate::types::{
    Advance, Answer, Began, BeginOptions, DeadLetter, Delivered, Failure, Forget, Intent,
    IntentEntry, Listing, Page, Record, Resolution, SequenceOptions, Sequenced, Update,
};
use crate::{Error, Fingerprint, Key, Result, Tally};

/// The claim of a [`SharedBackend`]: what [`Claim`](crate::Claim)'s
/// accessors answer when its store runs over that backend.
///
/// # Contract
/// Every value is the backend's record of the attempt, as it stood when
/// the attempt started (the same on every instance that shares the
/// backend): `token` is the attempt's fencing token, `provider_key` the
/// operation's key for an external provider (the same on every attempt),
/// the round's figures count as the engine's do (a requeue starts a new
/// round; an attempt that never answered counts one interruption).
///
/// # Examples
/// ```
/// use dedupkv::contract::{Handle, SharedClaim};
/// use dedupkv::Key;
/// use std::time::{SystemTime, UNIX_EPOCH};
///
/// #[derive(Debug)]
/// struct MyClaim(Key<'static>);
/// impl Handle for MyClaim {
///     fn key(&self) -> &Key<'static> { &self.0 }
///     fn attempt(&self) -> u32 { 1 }
///     fn interrupted(&self) -> bool { false }
/// }
/// impl SharedClaim for MyClaim {
///     fn token(&self) -> u64 { 7 }
///     fn provider_key(&self) -> dedupkv::Result<String> { Ok(format!("{:032x}", 7)) }
///     fn first_seen_at(&self) -> SystemTime { UNIX_EPOCH }
///     fn round_attempt(&self) -> u32 { 1 }
///     fn round_started_at(&self) -> SystemTime { UNIX_EPOCH }
///     fn interruptions(&self) -> u32 { 0 }
///     fn unanswered_intent(&self) -> bool { false }
///     fn lease_expires_at(&self) -> SystemTime { UNIX_EPOCH }
/// }
/// assert_eq!(MyClaim(Key::new("t", "a")).token(), 7);
/// ```
pub trait SharedClaim: Handle + Any + Send + Sync + std::fmt::Debug {
    /// The attempt's fencing token ([`Claim::token`](crate::Claim::token)).
    fn token(&self) -> u64;
    /// The operation's provider key, 32 hex digits
    /// ([`Claim::provider_key`](crate::Claim::provider_key)).
    ///
    /// # Errors
    /// The backend's, when it cannot tell it yet.
    fn provider_key(&self) -> Result<String>;
    /// When the operation's first attempt started.
    fn first_seen_at(&self) -> SystemTime;
    /// The attempt's number within its round (1 for the round's first).
    fn round_attempt(&self) -> u32;
    /// When the attempt's round started.
    fn round_started_at(&self) -> SystemTime;
    /// The round's attempts that ended without an answer.
    fn interruptions(&self) -> u32;
    /// An earlier attempt recorded an intent and no answer to it.
    fn unanswered_intent(&self) -> bool;
    /// When the attempt's lease ends, as the backend set it.
    fn lease_expires_at(&self) -> SystemTime;
}

/// A shared backend's claim, boxed: the claim of a
/// [`Store`](crate::Store) opened on a [`SharedBackend`].
pub type BoxedClaim = Box<dyn SharedClaim>;

/// A waiter of a [`SharedBackend`], boxed (its own
/// [`Settle::Waiter`], once a poll made one).
pub type BoxedWaiter = Option<Box<dyn Any + Send>>;

/// The contract with its claim and waiter erased, so a
/// [`Store`](crate::Store) holds the backend behind a pointer. Implemented
/// for every backend of the whole contract whose claim is a
/// [`SharedClaim`]; a claim handed back must be one this backend made,
/// else the call answers
/// [`Error::InvalidArgument`].
///
/// Each method is the contract method of the same name (see
/// [`Write`], [`Order`], [`DeadLetters`], [`Intents`], [`Settle`]).
///
/// # Examples
/// ```
/// use dedupkv::contract::SharedBackend;
///
/// // Any backend of the whole contract whose claim is a `SharedClaim`
/// // is one (PostgreSQL's `PgStore`); a `Store` opens on it:
/// fn open_on(backend: impl SharedBackend) -> dedupkv::Result<dedupkv::Store> {
///     dedupkv::Store::builder().open_shared(backend)
/// }
/// ```
#[allow(missing_docs)] // each method is documented on its contract trait
pub trait SharedBackend: Send + Sync + 'static {
    /// The backend's name, for errors (its type's name).
    fn backend_name(&self) -> &'static str;
    fn get(&self, key: &Key<'_>) -> Result<Pending<Option<Record>>>;
    fn insert(&self, key: &Key<'_>, retention: Option<Duration>) -> Result<Pending<bool>>;
    fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Pending<Vec<bool>>>;
    fn forget(&self, key: &Key<'_>) -> Result<Pending<Forget>>;
    fn begin(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Option<Intent<'_>>,
    ) -> Result<Pending<Began<BoxedClaim>>>;
    fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<BegunBatch<BoxedClaim>>;
    fn complete(&self, claim: &dyn SharedClaim, outcome: Outcome<'_>) -> Result<Pending<()>>;
    fn complete_batch(
        &self,
        items: &[(&dyn SharedClaim, &[u8])],
    ) -> Result<Pending<Vec<Result<()>>>>;
    fn fail(&self, claim: &dyn SharedClaim, failure: Failure<'_>) -> Result<Pending<()>>;
    fn renew(&self, claim: &dyn SharedClaim, by: Option<Duration>) -> Result<Pending<SystemTime>>;
    fn mark_answered(&self, claim: &dyn SharedClaim, answer: Answer<'_>) -> Result<Pending<()>>;
    fn advance(&self, entity: &Key<'_>, version: u64) -> Result<Pending<Advance>>;
    fn apply_event(
        &self,
        event: &Key<'_>,
        entity: &Key<'_>,
        version: u64,
    ) -> Result<Pending<Update>>;
    fn sequence(
        &self,
        entity: &Key<'_>,
        seq: u64,
        payload: &[u8],
        options: &SequenceOptions,
    ) -> Result<Pending<Sequenced>>;
    fn release_held(&self, entity: &Key<'_>) -> Result<Pending<Vec<Delivered>>>;
    fn ack(&self, entity: &Key<'_>, upto: u64) -> Result<Pending<usize>>;
    fn requeue(&self, key: &Key<'_>) -> Result<Pending<bool>>;
    fn resolve(&self, key: &Key<'_>, resolution: Resolution<'_>) -> Result<Pending<bool>>;
    fn wait(&self, basis: Basis) -> Result<()>;
    fn poll_settled(
        &self,
        basis: Basis,
        waiter: &mut BoxedWaiter,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>>;
    fn stop_waiting(&self, waiter: &mut BoxedWaiter);
    fn max_outcome_len(&self) -> usize;
    fn tally_window(&self) -> Duration;
    fn tallies(&self, scope: &[u8]) -> Result<Vec<Tally>>;
    fn completions(
        &self,
        scope: &[u8],
        starts: std::ops::RangeInclusive<u64>,
    ) -> Result<Vec<super::Completion>>;
    fn dead_letters(&self, listing: &Listing) -> Result<Page<DeadLetter>>;
    fn intent(&self, key: &Key<'_>) -> Result<Option<IntentEntry>>;
    fn pending_intents(&self, listing: &Listing) -> Result<Page<IntentEntry>>;
    fn duplicate_candidates(&self, listing: &Listing) -> Result<Page<IntentEntry>>;
    fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Began<BoxedClaim>>;
}

/// `claim` as the backend `B`'s own claim type.
fn own<'c, B: Write>(backend: &B, claim: &'c dyn SharedClaim) -> Result<&'c B::Claim>
where
    B::Claim: SharedClaim,
{
    let any: &dyn Any = claim;
    any.downcast_ref::<B::Claim>()
        .ok_or_else(|| Error::InvalidArgument {
            what: "claim",
            reason: format!(
                "the claim of {:?} was made by another backend than this store's ({})",
                claim.key(),
                name_of(backend)
            ),
        })
}

fn name_of<B>(_: &B) -> &'static str {
    std::any::type_name::<B>()
}

fn boxed<C: SharedClaim>(began: Began<C>) -> Began<BoxedClaim> {
    began.map_claim(|c| Box::new(c) as BoxedClaim)
}

impl<B> SharedBackend for B
where
    B: Write + Order + DeadLetters + Intents + Tallies + Waits + Listings + Send + Sync + 'static,
    B::Claim: SharedClaim,
    B::Waiter: 'static,
{
    fn backend_name(&self) -> &'static str {
        name_of(self)
    }

    fn get(&self, key: &Key<'_>) -> Result<Pending<Option<Record>>> {
        super::Read::get(self, key)
    }

    fn insert(&self, key: &Key<'_>, retention: Option<Duration>) -> Result<Pending<bool>> {
        Write::insert(self, key, retention)
    }

    fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Pending<Vec<bool>>> {
        Write::insert_batch(self, keys)
    }

    fn forget(&self, key: &Key<'_>) -> Result<Pending<Forget>> {
        Write::forget(self, key)
    }

    fn begin(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Option<Intent<'_>>,
    ) -> Result<Pending<Began<BoxedClaim>>> {
        Ok(Write::begin(self, key, fingerprint, options, intent)?.map(boxed))
    }

    fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<BegunBatch<BoxedClaim>> {
        Ok(Write::begin_batch(self, items)?
            .map(|all| all.into_iter().map(|r| r.map(boxed)).collect()))
    }

    fn complete(&self, claim: &dyn SharedClaim, outcome: Outcome<'_>) -> Result<Pending<()>> {
        Write::complete(self, own(self, claim)?, outcome)
    }

    fn complete_batch(
        &self,
        items: &[(&dyn SharedClaim, &[u8])],
    ) -> Result<Pending<Vec<Result<()>>>> {
        let items = items
            .iter()
            .map(|&(c, o)| Ok((own(self, c)?, o)))
            .collect::<Result<Vec<_>>>()?;
        Write::complete_batch(self, &items)
    }

    fn fail(&self, claim: &dyn SharedClaim, failure: Failure<'_>) -> Result<Pending<()>> {
        Write::fail(self, own(self, claim)?, failure)
    }

    fn renew(&self, claim: &dyn SharedClaim, by: Option<Duration>) -> Result<Pending<SystemTime>> {
        Write::renew(self, own(self, claim)?, by)
    }

    fn mark_answered(&self, claim: &dyn SharedClaim, answer: Answer<'_>) -> Result<Pending<()>> {
        Intents::mark_answered(self, own(self, claim)?, answer)
    }

    fn advance(&self, entity: &Key<'_>, version: u64) -> Result<Pending<Advance>> {
        Order::advance(self, entity, version)
    }

    fn apply_event(
        &self,
        event: &Key<'_>,
        entity: &Key<'_>,
        version: u64,
    ) -> Result<Pending<Update>> {
        Order::apply_event(self, event, entity, version)
    }

    fn sequence(
        &self,
        entity: &Key<'_>,
        seq: u64,
        payload: &[u8],
        options: &SequenceOptions,
    ) -> Result<Pending<Sequenced>> {
        Order::sequence(self, entity, seq, payload, options)
    }

    fn release_held(&self, entity: &Key<'_>) -> Result<Pending<Vec<Delivered>>> {
        Order::release_held(self, entity)
    }

    fn ack(&self, entity: &Key<'_>, upto: u64) -> Result<Pending<usize>> {
        Order::ack(self, entity, upto)
    }

    fn requeue(&self, key: &Key<'_>) -> Result<Pending<bool>> {
        DeadLetters::requeue(self, key)
    }

    fn resolve(&self, key: &Key<'_>, resolution: Resolution<'_>) -> Result<Pending<bool>> {
        DeadLetters::resolve(self, key, resolution)
    }

    fn wait(&self, basis: Basis) -> Result<()> {
        Settle::wait(self, basis)
    }

    fn poll_settled(
        &self,
        basis: Basis,
        waiter: &mut BoxedWaiter,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        let slot = waiter.get_or_insert_with(|| Box::new(B::Waiter::default()));
        match slot.downcast_mut::<B::Waiter>() {
            Some(w) => Settle::poll_settled(self, basis, w, cx),
            // Only this impl fills the slot, always with `B::Waiter`.
            None => Poll::Ready(Err(Error::InvalidArgument {
                what: "waiter",
                reason: format!("a waiter of another backend than {}", name_of(self)),
            })),
        }
    }

    fn stop_waiting(&self, waiter: &mut BoxedWaiter) {
        if let Some(w) = waiter.as_mut().and_then(|w| w.downcast_mut::<B::Waiter>()) {
            Settle::stop_waiting(self, w);
        }
        *waiter = None;
    }

    fn max_outcome_len(&self) -> usize {
        Write::max_outcome_len(self)
    }

    fn tally_window(&self) -> Duration {
        Tallies::tally_window(self)
    }

    fn tallies(&self, scope: &[u8]) -> Result<Vec<Tally>> {
        Tallies::tallies(self, scope)
    }

    fn completions(
        &self,
        scope: &[u8],
        starts: std::ops::RangeInclusive<u64>,
    ) -> Result<Vec<super::Completion>> {
        Tallies::completions(self, scope, starts)
    }

    fn dead_letters(&self, listing: &Listing) -> Result<Page<DeadLetter>> {
        Listings::dead_letters(self, listing)
    }

    fn intent(&self, key: &Key<'_>) -> Result<Option<IntentEntry>> {
        Listings::intent(self, key)
    }

    fn pending_intents(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        Listings::pending_intents(self, listing)
    }

    fn duplicate_candidates(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        Listings::duplicate_candidates(self, listing)
    }

    fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Began<BoxedClaim>> {
        Ok(boxed(Waits::begin_or_wait(
            self,
            key,
            fingerprint,
            options,
            timeout,
        )?))
    }
}
