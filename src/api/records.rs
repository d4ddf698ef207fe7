//! The listing of every live record, for exports, audits and the command
//! line's `keys`.

use crate::types::{Listing, Page, Record};
use crate::{Result, Store};

impl Store {
    /// The store's live records, a page at a time: every key recorded and
    /// not expired or forgotten (dead letters included), each as
    /// [`get`](Self::get) gives it, ordered by a hash of the key (not by
    /// time). [`Listing::scope`] keeps one scope; [`Listing::older_than`]
    /// keeps records last updated at least that long ago; pass the page's
    /// `next` to [`Listing::after`] for the next page.
    ///
    /// A snapshot taken shard by shard, like the other listings: a key
    /// written meanwhile may be left out or shown as it was; a key that
    /// stays is listed once. Each page walks the whole index in memory
    /// (O(keys)) and reads its records from the file; a store opened
    /// [read-only](Self::open_read_only) lists too.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a
    /// cursor of another listing or store;
    /// [`Error::Corrupt`](crate::Error::Corrupt) if a record is damaged;
    /// [`Error::Storage`](crate::Error::Storage).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Key, Listing, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path().join("s.redb"))?;
    /// for id in ["a", "b", "c"] {
    ///     store.insert_if_absent(&Key::new("orders", id))?;
    /// }
    /// store.insert_if_absent(&Key::new("refunds", "r"))?;
    /// let mut ids = Vec::new();
    /// let mut listing = Listing::new().scope("orders").limit(2);
    /// loop {
    ///     let page = store.records(&listing)?;
    ///     ids.extend(page.items.iter().map(|r| r.key().id().to_vec()));
    ///     match page.next {
    ///         Some(cursor) => listing = listing.after(cursor),
    ///         None => break,
    ///     }
    /// }
    /// ids.sort();
    /// assert_eq!(ids, [b"a", b"b", b"c"]);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn records(&self, listing: &Listing) -> Result<Page<Record>> {
        self.engine_for("records")?.records(listing)
    }
}
