//! The calls for effects that leave the system: an intent recorded with
//! the claim, marked sent when the provider answers, listed while it is
//! not (the engine's `intents` room does the work).

use super::store::Backend;
#[cfg(doc)]
use crate::Duplicate;
#[cfg(doc)]
use crate::Error;
use crate::contract::{Intents, Listings, Settle, Write};
use crate::types::{Answer, BeginOptions, IntentEntry, Listing, Page};
use crate::{Begin, Claim, Fingerprint, Intent, Key, Result, Store};

impl Store {
    /// [`begin_with`](Self::begin_with), recording `intent` — what this
    /// attempt is about to call, and with what — in the claim's own commit,
    /// before the call. Send [`Claim::provider_key`] with the call: the
    /// same on every attempt and on every owner of the store, so the
    /// provider's own deduplication carries the guarantee past the
    /// network. Then [`mark_sent`](Self::mark_sent)
    /// when it answers, and `complete`.
    ///
    /// Until it is marked sent (or the operation completes or fails for
    /// good), the intent is *unanswered*: the call may or may not have
    /// happened. [`pending_intents`](Self::pending_intents) lists those
    /// (reconcile them by asking the provider with the provider key
    /// before any new attempt), and the next attempt's
    /// [`Claim::unanswered_intent`] says so. An unanswered intent survives
    /// crashes, reopen and retention.
    ///
    /// An answer other than `Started` records nothing.
    ///
    /// # Errors
    /// As `begin_with`, and [`Error::InvalidInput`] for an intent (target
    /// and request) over `max_outcome_len`.
    ///
    /// # Examples
    /// See [`Intent`].
    pub fn begin_with_intent(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Intent<'_>,
    ) -> Result<Begin> {
        self.tell(Write::begin(self, key, fingerprint, options, Some(intent))?)
    }

    /// Records that the provider accepted the claim's call, with its
    /// reference (a tracking number, a charge id): one durable commit.
    /// The same as [`mark_answered`](Self::mark_answered) with
    /// [`Answer::Accepted`].
    ///
    /// # Errors
    /// As `mark_answered`.
    ///
    /// # Examples
    /// See [`Intent`].
    pub fn mark_sent(&self, claim: &Claim, reference: &[u8]) -> Result<()> {
        self.mark_answered(claim, Answer::Accepted(reference))
    }

    /// Records what the provider answered the claim's intent: one durable
    /// commit. To this attempt's call: [`Answer::Accepted`] with its
    /// reference, [`Answer::Refused`] with its reason (it had no effect),
    /// [`Answer::Unknown`] (no answer came: it may have happened). Or,
    /// asked with the [`provider_key`](Claim::provider_key) before calling
    /// again (as [`Claim::unanswered_intent`] says to):
    /// [`Answer::Found`] with its reference, [`Answer::NotFound`].
    ///
    /// An accepted, found or refused call settles the intent (no longer
    /// listed by [`pending_intents`](Self::pending_intents), and the next
    /// attempt need not ask first); an unknown one leaves it unanswered.
    /// [`duplicate_candidates`](Self::duplicate_candidates) then lists the
    /// operation only if more than one call may have reached the provider
    /// and it did not confirm one effect (see [`Duplicate`]): record every
    /// answer, including a lookup's, so a 503, a takeover or a timeout
    /// settled by asking first is not listed.
    ///
    /// # Errors
    /// [`Error::ClaimLost`] if the claim is no longer the key's active one;
    /// [`Error::InvalidArgument`] if it recorded no intent;
    /// [`Error::InvalidInput`] for a reference or reason that, with the
    /// intent's target, is over `max_outcome_len`.
    ///
    /// # Examples
    /// See [`Answer`].
    pub fn mark_answered(&self, claim: &Claim, answer: Answer<'_>) -> Result<()> {
        self.tell(Intents::mark_answered(self, claim, answer)?)
    }

    /// The operation's intent, if it recorded one that is unanswered or
    /// was marked sent.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    ///
    /// # Examples
    /// See [`IntentEntry::reference`].
    pub fn intent(&self, key: &Key<'_>) -> Result<Option<IntentEntry>> {
        Listings::intent(self, key)
    }

    /// Unanswered intents, oldest first (by when they were recorded;
    /// [`Listing::older_than`] counts from then): the calls that may or may
    /// not have happened. Reconcile each by asking the provider with its
    /// [`provider_key`](IntentEntry::provider_key), before any new attempt.
    ///
    /// # Errors
    /// As [`dead_letters`](Self::dead_letters).
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn pending_intents(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        Listings::pending_intents(self, listing)
    }

    /// The candidates for a duplicate external effect, to check against
    /// the system of record, oldest first (by when their intent was first
    /// recorded): operations where more than one call may have reached the
    /// provider and it did not confirm one effect — it accepted two calls
    /// with different references, or a call whose fate was unknown was
    /// followed by another without asking the provider in between (see
    /// [`Duplicate`] and [`mark_answered`](Self::mark_answered)). A call
    /// refused, a lookup's answer, or the same reference again (a provider
    /// that deduplicates on the provider key) lists nothing. Kept until
    /// their records expire, through early eviction (`max_keys`) too.
    ///
    /// # Errors
    /// As [`dead_letters`](Self::dead_letters).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Answer, Begin, BeginOptions, Duplicate, Fingerprint, Intent, Key, Listing, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let intent = Intent { target: "carrier", request: b"order 7" };
    /// let begin = |key: &Key<'_>| store.begin_with_intent(key, Fingerprint::NONE, &BeginOptions::new(), intent);
    /// for (id, ask_first) in [("ship-7", true), ("ship-8", false)] {
    ///     let key = Key::new("shop-42", id);
    ///     drop(begin(&key)?); // the worker died after calling the carrier, before it answered
    ///     let Begin::Started(again) = begin(&key)? else { unreachable!() };
    ///     assert!(again.unanswered_intent()); // ask the carrier first
    ///     if ask_first {
    ///         store.mark_answered(&again, Answer::Found(b"1Z999"))?; // it has it: no second call
    ///     } else {
    ///         store.mark_sent(&again, b"1Z999")?; // called again without asking
    ///     }
    ///     store.complete(&again, b"1Z999")?;
    /// }
    /// let twice = store.duplicate_candidates(&Listing::new())?;
    /// assert_eq!(twice.items.len(), 1);
    /// assert_eq!(twice.items[0].key(), &Key::new("shop-42", "ship-8"));
    /// assert_eq!(twice.items[0].duplicate(), Some(Duplicate::AfterUnknown));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn duplicate_candidates(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        Listings::duplicate_candidates(self, listing)
    }
}

impl Listings for Store {
    fn dead_letters(&self, listing: &Listing) -> Result<Page<crate::DeadLetter>> {
        match self.backend() {
            Backend::Engine(engine) => engine.dead_letters(listing),
            Backend::Shared(b) => b.dead_letters(listing),
        }
    }

    fn intent(&self, key: &Key<'_>) -> Result<Option<IntentEntry>> {
        match self.backend() {
            Backend::Engine(engine) => engine.intent(key),
            Backend::Shared(b) => b.intent(key),
        }
    }

    fn pending_intents(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        match self.backend() {
            Backend::Engine(engine) => engine.pending_intents(listing),
            Backend::Shared(b) => b.pending_intents(listing),
        }
    }

    fn duplicate_candidates(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        match self.backend() {
            Backend::Engine(engine) => engine.duplicate_candidates(listing),
            Backend::Shared(b) => b.duplicate_candidates(listing),
        }
    }
}
