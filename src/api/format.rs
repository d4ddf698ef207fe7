//! The file's store format on an open store: which it is, the explicit
//! upgrade, and the check only the newest format allows.

#[cfg(doc)]
use crate::{Error, StoreBuilder};
use crate::{Result, Store};

impl Store {
    /// The store format of the open file: 5 for a file this build created
    /// or upgraded; 3 or 4 for one an older build wrote, until
    /// [`upgrade`](Self::upgrade) (or [`StoreBuilder::upgrade`]). Also in
    /// [`Stats::format`](crate::Stats::format). 0 for a store over a
    /// shared backend (it has no file).
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// assert_eq!(store.format(), 5);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[must_use]
    pub fn format(&self) -> u32 {
        self.engine_for("format").map_or(0, |e| e.format())
    }

    /// Rewrites a file of an older store format as the newest one, in one
    /// commit, and returns whether it was older. Until then the store runs
    /// on the older format, so the build that wrote the file can still
    /// open it; afterwards that build refuses it (`UnsupportedVersion`),
    /// so upgrade once a rollback is no longer wanted. Format 5 adds a
    /// summary to every bucket table, which every later open checks (a
    /// table that lost rows is [`Error::Corrupt`], never a smaller store),
    /// and which [`verify`](Self::verify) needs, at once; what format 4
    /// adds to a format-3 file's records (the provider's answers, first
    /// failure times, counting in the shards and kept keys) starts with
    /// the next open.
    ///
    /// # Errors
    /// [`Error::Poisoned`] or [`Error::Storage`] if the commit fails (the
    /// file then keeps its format).
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// assert!(!store.upgrade()?, "a new file is the newest format already");
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn upgrade(&self) -> Result<bool> {
        self.engine_for("upgrade")?.upgrade()
    }

    /// Reads every bucket table of the file, as of one commit, and checks
    /// its rows against the summary stored beside them and each row
    /// against its checksum (what every open does); returns the rows
    /// read. Commits go on meanwhile. For a scrub of a live store, or of a
    /// backup opened before it is trusted.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the damaged table (and the path);
    /// [`Error::NeedsUpgrade`] on a file of format 3 or 4, which has no
    /// summaries; [`Error::Storage`] if a read fails.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::Key;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// store.insert_if_absent(&Key::new("t", "a"))?;
    /// assert_eq!(store.verify()?, 1);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn verify(&self) -> Result<u64> {
        self.engine_for("verify")?.verify()
    }
}
