//! The dead-letter calls of the face: list, requeue, resolve (the engine's
//! `dead_letter` room does the work).

use crate::contract::{DeadLetters, Listings, Settle};
use crate::types::{DeadLetter, Listing, Page, Resolution};
use crate::{Key, Result, Store};

impl Store {
    /// A page of the dead-letter area: operations whose retries were
    /// exhausted ([`Failure::Exhausted`](crate::Failure::Exhausted)),
    /// oldest failure first, filtered and paged by `listing`. A dead letter
    /// stays until it is requeued, resolved or its key forgotten: retention
    /// never drops it, and it survives reopen and crashes.
    /// [`Stats::oldest_dead_letter`](crate::Stats::oldest_dead_letter) says
    /// how long the oldest has waited.
    ///
    /// The listing is a snapshot taken shard by shard: an entry requeued
    /// meanwhile may be left out.
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt) if a dead letter's record
    /// is damaged; [`Error::Storage`](crate::Error::Storage).
    ///
    /// # Examples
    /// See [`Listing`] and [`DeadLetter`].
    pub fn dead_letters(&self, listing: &Listing) -> Result<Page<DeadLetter>> {
        Listings::dead_letters(self, listing)
    }

    /// Requeues a dead letter: the key becomes claimable again, and its
    /// next attempt is numbered after the last one (its history is kept:
    /// attempts, first-attempt time, provider key). It starts a new round
    /// of attempts ([`Claim::round_attempt`](crate::Claim::round_attempt)
    /// counts from 1 again, [`Claim::round_started_at`](crate::Claim::round_started_at)
    /// is now), so a retry policy grants it another `max_attempts` and
    /// `max_elapsed`. `false` if the key is not in the dead-letter area.
    ///
    /// # Concurrent calls on the same key
    /// Decided under the key's shard lock like every write: of two
    /// requeues one returns `true`.
    ///
    /// # Errors
    /// As [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Begin, Failure, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "ship-7");
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.fail(&c, Failure::Exhausted { reason: "carrier down", payload: None })?;
    /// assert!(store.requeue(&key)?); // the carrier is back
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// assert_eq!(c.attempt(), 2);
    /// # store.complete(&c, b"")?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn requeue(&self, key: &Key<'_>) -> Result<bool> {
        self.tell(DeadLetters::requeue(self, key)?)
    }

    /// Closes a dead letter for good: with an outcome every later `begin`
    /// replays ([`Resolution::Completed`]), or with a note stored as a
    /// permanent failure ([`Resolution::Abandoned`]). `false` if the key is
    /// not in the dead-letter area.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for an outcome
    /// or note over `max_outcome_len`; otherwise as
    /// [`insert_if_absent`](Self::insert_if_absent).
    ///
    /// # Examples
    /// See [`Resolution`].
    pub fn resolve(&self, key: &Key<'_>, resolution: Resolution<'_>) -> Result<bool> {
        self.tell(DeadLetters::resolve(self, key, resolution)?)
    }
}
