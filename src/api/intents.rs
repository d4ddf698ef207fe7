//! The calls for effects that leave the system: an intent recorded with
//! the claim, marked sent when the provider answers, listed while it is
//! not (the engine's `intents` room does the work).

#[cfg(doc)]
use crate::Error;
use crate::engine::Engine;
use crate::types::{BeginOptions, IntentEntry, Listing, Page};
use crate::{Begin, Claim, Fingerprint, Intent, Key, Result, Store};

impl Store {
    /// [`begin_with`](Self::begin_with), recording `intent` — what this
    /// attempt is about to call, and with what — in the claim's own commit,
    /// before the call. Send [`Claim::provider_key`] with the call: the
    /// same on every attempt, so the provider's own deduplication carries
    /// the guarantee past the network. Then [`mark_sent`](Self::mark_sent)
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
        Engine::begin_with_intent(self.engine(), key, fingerprint, options, intent).map(Begin::from)
    }

    /// Records that the provider answered the claim's intent, with its
    /// reference (a tracking number, a charge id): one durable commit. The
    /// intent is no longer ambiguous; it stays listed by
    /// [`duplicate_candidates`](Self::duplicate_candidates) if an attempt
    /// after the first sent it.
    ///
    /// # Errors
    /// [`Error::ClaimLost`] if the claim is no longer the key's active one;
    /// [`Error::InvalidArgument`] if it recorded no intent;
    /// [`Error::InvalidInput`] for a reference over `max_outcome_len`.
    ///
    /// # Examples
    /// See [`Intent`].
    pub fn mark_sent(&self, claim: &Claim, reference: &[u8]) -> Result<()> {
        self.engine().mark_sent(claim.ticket(), reference)
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
        self.engine().intent(key)
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
        self.engine()
            .intents_listed(listing, crate::index::intent::IntentState::Pending, 0)
    }

    /// Intents marked sent by an attempt after the first: the operations
    /// where an earlier attempt may have reached the provider too — the
    /// candidates for a duplicate external effect, to check against the
    /// system of record. Kept until their records expire.
    ///
    /// # Errors
    /// As [`dead_letters`](Self::dead_letters).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Begin, BeginOptions, Fingerprint, Intent, Key, Listing, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "ship-7");
    /// let intent = Intent { target: "carrier", request: b"order 7" };
    /// let first = store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent)?;
    /// drop(first); // the worker died after calling the carrier, before it answered
    /// let Begin::Started(again) = store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent)? else { unreachable!() };
    /// assert!(again.unanswered_intent()); // ask the carrier first
    /// store.mark_sent(&again, b"1Z999")?;
    /// store.complete(&again, b"1Z999")?;
    /// let twice = store.duplicate_candidates(&Listing::new())?;
    /// assert_eq!(twice.items[0].key(), &key);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn duplicate_candidates(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        self.engine()
            .intents_listed(listing, crate::index::intent::IntentState::Sent, 1)
    }
}
