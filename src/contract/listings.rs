//! What an operator lists during an incident: the dead letters, the
//! intents whose calls may or may not have happened, the duplicate
//! candidates, and one key's intent — on any backend.

use crate::types::{DeadLetter, IntentEntry, Listing, Page};
use crate::{Key, Result};

/// The operator's listings, paged by a [`Listing`]'s cursor.
///
/// # Contract
/// Each answers from what is durable, in the order the engine's
/// listings give (oldest first by when each entry was recorded), a page
/// at a time; a cursor of another listing (or another backend) is
/// refused with [`Error::InvalidArgument`](crate::Error::InvalidArgument).
///
/// # Examples
/// ```
/// use dedupkv::contract::Listings;
/// use dedupkv::{Listing, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// assert!(Listings::dead_letters(&store, &Listing::new())?.items.is_empty());
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait Listings {
    /// A page of the dead-letter area.
    ///
    /// # Errors
    /// A damaged entry; a bad cursor; the backend's read errors.
    fn dead_letters(&self, listing: &Listing) -> Result<Page<DeadLetter>>;

    /// The intent recorded for `key`'s operation, if any.
    ///
    /// # Errors
    /// A bad key; the backend's read errors.
    fn intent(&self, key: &Key<'_>) -> Result<Option<IntentEntry>>;

    /// A page of the pending intents (calls that may or may not have
    /// happened).
    ///
    /// # Errors
    /// As [`dead_letters`](Self::dead_letters).
    fn pending_intents(&self, listing: &Listing) -> Result<Page<IntentEntry>>;

    /// A page of the duplicate candidates (operations whose call may have
    /// happened twice).
    ///
    /// # Errors
    /// As [`dead_letters`](Self::dead_letters).
    fn duplicate_candidates(&self, listing: &Listing) -> Result<Page<IntentEntry>>;
}
