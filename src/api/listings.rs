//! The face's listings for people working a store during an incident:
//! stranded claims and the sequencer's holding area, listed like the
//! dead-letter area (oldest first, by scope and age, paged).

use crate::types::{Held, Listing, Page, Record};
use crate::{Result, Store};

impl Store {
    /// Claims nobody came back for: in progress, their lease lapsed (or
    /// their process is gone), by when they became stranded, oldest first.
    /// Retention evicts a stranded claim with its key, so look here before
    /// it does: each is an operation that may or may not have had its
    /// effect. The record's [`provider_key`](Record::provider_key) is what
    /// to ask the downstream system about.
    ///
    /// [`Listing::older_than`] counts from when the claim became stranded:
    /// the end of its lease; for a claim of a process that is gone (made
    /// before this store was opened: it crashed, or was closed with the
    /// claim held), the opening of this store, if that came before the
    /// lease's end. So a claim stranded by a crash ages from the reopen
    /// at the latest, however long its lease.
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt) if a claim's record is
    /// damaged; [`Error::Storage`](crate::Error::Storage).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Fingerprint, Key, Listing, ManualClock, Store};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let claim = store.begin(&Key::new("shop-42", "ship-7"), Fingerprint::NONE)?;
    /// std::mem::forget(claim); // a worker that hangs: never finishes, never drops
    /// assert!(store.stranded_claims(&Listing::new())?.items.is_empty()); // its lease is live
    /// clock.advance(Duration::from_secs(31));
    /// let page = store.stranded_claims(&Listing::new())?;
    /// assert_eq!(page.items[0].key(), &Key::new("shop-42", "ship-7"));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn stranded_claims(&self, listing: &Listing) -> Result<Page<Record>> {
        self.engine_for("stranded_claims")?.stranded_claims(listing)
    }

    /// The sequencer's holding area across every entity: events whose
    /// predecessor never came (see [`held`](Self::held) for one entity),
    /// by when the predecessor went missing, oldest first; each with its
    /// [`entity`](Held::entity). Reads memory only.
    ///
    /// # Errors
    /// Never today; the `Result` leaves room for a storage-backed listing.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Key, Listing, ManualClock, Store};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).max_hold(Duration::from_secs(60)).open(dir.path().join("s.redb"))?;
    /// let order = Key::new("shop-42", "order-7");
    /// store.sequence(&order, 2, b"shipped")?; // 1 never comes
    /// clock.advance(Duration::from_secs(61));
    /// store.sweep_parked()?;
    /// let page = store.holding_area(&Listing::new())?;
    /// assert_eq!((&page.items[0].entity, page.items[0].seq, page.items[0].missing), (&order, 2, 1));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn holding_area(&self, listing: &Listing) -> Result<Page<Held>> {
        self.engine_for("holding_area")?.holding_area(listing)
    }
}
