//! Errors returned by the store.

use std::fmt;

/// The result type of every fallible call in this crate.
///
/// # Examples
/// ```
/// fn open(path: &std::path::Path) -> dedupkv::Result<dedupkv::Store> {
///     dedupkv::Store::open(path)
/// }
/// # let dir = tempfile::tempdir().unwrap();
/// # open(&dir.path().join("x.redb")).unwrap();
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a store call.
///
/// The enum is `#[non_exhaustive]`: match the variants you branch on and keep a
/// catch-all arm.
///
/// # Examples
/// ```
/// # use dedupkv::{Error, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let too_long = vec![b'x'; 100_000];
/// let err = store.insert_if_absent(&Key::new("tenant", &too_long)).unwrap_err();
/// assert!(matches!(err, Error::InvalidInput { .. }));
/// println!("{err}"); // "invalid input: id is 100000 bytes, the limit is 1024"
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument broke a documented limit; the message names the limit.
    #[error("invalid input: {what} is {len} bytes, the limit is {limit}")]
    InvalidInput {
        /// Which argument (`"scope"`, `"id"`, `"outcome"`).
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The configured limit in bytes.
        limit: usize,
    },
    /// An argument is not one the call accepts (an empty key part, a
    /// reserved value, a request too large for one commit); the message
    /// says which and why. Nothing was recorded; the store is unaffected.
    #[error("invalid input: {what} {reason}")]
    InvalidArgument {
        /// Which argument (`"id"`, `"scope"`, `"version"`, `"seq"`, `"batch"`).
        what: &'static str,
        /// What is wrong with it, for people.
        reason: String,
    },
    /// A builder setting is out of range or contradicts the existing file.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The key was recorded before with a different request fingerprint: the
    /// same operation key was reused for a different operation.
    #[error(
        "fingerprint mismatch for key {key}: it was recorded with fingerprint {recorded}, \
         this request has {requested}"
    )]
    FingerprintMismatch {
        /// The key, rendered for people: `"scope"/"id"`, each part quoted,
        /// quotes, backslashes and non-printable bytes escaped.
        key: String,
        /// The fingerprint stored with the key.
        recorded: crate::Fingerprint,
        /// The fingerprint this call passed.
        requested: crate::Fingerprint,
    },
    /// The claim is no longer the key's active claim: its lease lapsed and
    /// another attempt took the key over, or the key was already finished.
    /// The fenced worker must not publish its result.
    #[error("claim lost for key {key} (attempt {attempt}, token {token}): {reason}")]
    ClaimLost {
        /// The key, rendered for people.
        key: String,
        /// The attempt number of the stale claim.
        attempt: u32,
        /// The fencing token of the stale claim.
        token: u64,
        /// What happened to the key instead.
        reason: &'static str,
    },
    /// The file exists but is not a dedupkv store.
    #[error("not a dedupkv store: {0}")]
    NotAStore(String),
    /// The file was written by a newer, unknown format version.
    #[error("unsupported format version {found} (this build reads up to {supported})")]
    UnsupportedVersion {
        /// The version recorded in the file.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The call needs a newer store format than the open file has: the
    /// file was written by an older build and not upgraded yet (see
    /// [`StoreBuilder::upgrade`](crate::StoreBuilder::upgrade)). Nothing
    /// was changed; the rest of the store works as before.
    #[error(
        "{feature} needs store format {needed}, but this file is format {found}; upgrade it \
         with `StoreBuilder::upgrade(true)` at open or `Store::upgrade()` (after which builds \
         that read only format {found} refuse the file)"
    )]
    NeedsUpgrade {
        /// What needs it (the call, and what it relies on).
        feature: &'static str,
        /// The file's format.
        found: u32,
        /// The format it needs.
        needed: u32,
    },
    /// The store's contents fail a checksum or structural check.
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// The file is already open, in this process or another one.
    #[error("the store file is already open in another process or handle")]
    AlreadyOpen,
    /// A durable commit failed earlier; the store refuses writes until it is
    /// reopened. Nothing in or after the failed batch was acknowledged.
    ///
    /// Reads answer it too — `get`, `intent`, `tallies`, `reconcile`, the
    /// listings (`dead_letters`, `stranded_claims`, `holding_area`,
    /// `pending_intents`, `duplicate_candidates`), `held` and `unacked` —
    /// since the store's memory may hold state the failed commit never made
    /// durable. Only [`Store::stats`](crate::Store::stats) still answers
    /// (its counters include the failed calls). Reopen the store to read
    /// what is durable.
    #[error("the store is poisoned by an earlier failed commit ({0}); reopen it")]
    Poisoned(String),
    /// The store was opened read-only
    /// ([`Store::open_read_only`](crate::Store::open_read_only)) and the
    /// call writes: it answers reads only. Nothing was recorded, and the
    /// file was not touched. Open the store writable to write.
    #[error(
        "the store {} was opened read-only: it answers reads, and this call writes \
         (nothing was recorded); open it with `Store::open` to write",
        path.display()
    )]
    ReadOnly {
        /// The store's file.
        path: std::path::PathBuf,
    },
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// The call reads or manages the embedded engine (its file, index,
    /// listings, statistics), and this store runs over a shared backend
    /// ([`StoreBuilder::open_shared`](crate::StoreBuilder::open_shared)),
    /// which offers the contract's calls only. Nothing was recorded; call
    /// the backend's own method of that name, if it has one.
    #[error(
        "`{call}` is not offered by a store over the shared backend {backend} \
         (nothing was recorded); call it on the backend itself"
    )]
    Unsupported {
        /// The call.
        call: &'static str,
        /// The backend's type.
        backend: &'static str,
    },
    /// Another owner holds this store's replica (feature "replica"): it
    /// took ownership after this store did (this one is fenced, and
    /// acknowledges nothing from now on: every call answers this), or it
    /// won a race to take it (the open fails). The message says which
    /// epoch and where. Close the store: the new owner serves its keys.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The partition is not served by this member's
    /// [`PartitionSet`](crate::partitions::PartitionSet) (feature
    /// "replica"): it was never assigned here, is still being assigned, is
    /// being revoked, or was revoked. Nothing was recorded; the
    /// partition's current owner serves it.
    #[error("partition {partition} {reason}")]
    NotAssigned {
        /// The partition.
        partition: i32,
        /// Which of the above, for people.
        reason: &'static str,
    },
    /// The replica's object store failed (feature "replica"): `what` says
    /// which object and what the store was doing; the object store's own
    /// error is the [`source`](std::error::Error::source).
    #[error("replica: {what}: {source}")]
    Replica {
        /// What the replica was doing, naming the object.
        what: String,
        /// The object store's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A typed payload could not be encoded or decoded.
    #[error("payload codec: {0}")]
    Codec(String),
    /// The storage engine or the file system failed; the message names the
    /// path where it is known. The engine's own error is the
    /// [`source`](std::error::Error::source) of the [`StorageError`].
    #[error("storage: {0}")]
    Storage(#[source] StorageError),
    /// An operating-system facility other than storage failed: a
    /// background thread could not be started, or the random number
    /// generator that draws a new store's key secret failed. `what` says
    /// which; nothing was written.
    #[error("{what}: {source}")]
    Io {
        /// What the store was doing (`"starting the commit thread"`).
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

/// A failure of the storage under the log (the storage engine or the file
/// system beneath it), inside [`Error::Storage`].
///
/// Opaque: branch on [`io_kind`](Self::io_kind), print it, or walk its
/// [`source`](std::error::Error::source) chain, which holds the engine's
/// or the operating system's error.
///
/// # Examples
/// ```
/// # use dedupkv::{Error, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let err = Store::builder().open_existing(dir.path().join("missing.redb")).unwrap_err();
/// let Error::Storage(storage) = &err else { panic!("{err}") };
/// assert_eq!(storage.io_kind(), Some(std::io::ErrorKind::NotFound));
/// assert!(err.to_string().contains("missing.redb"));
/// ```
#[derive(Debug)]
pub struct StorageError(Repr);

#[derive(Debug)]
enum Repr {
    /// The file system (through the storage engine or directly).
    Io(std::io::Error),
    /// The storage engine itself.
    Engine(Box<dyn std::error::Error + Send + Sync>),
}

impl StorageError {
    /// The kind of the I/O error underneath, if this is one (a full disk,
    /// a missing file, a permission problem); `None` for other failures of
    /// the storage engine.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Error, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("none.redb");
    /// match Store::builder().open_existing(&path) {
    ///     Err(Error::Storage(e)) if e.io_kind() == Some(std::io::ErrorKind::NotFound) => {}
    ///     other => panic!("{other:?}"),
    /// }
    /// ```
    #[must_use]
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match &self.0 {
            Repr::Io(e) => Some(e.kind()),
            Repr::Engine(_) => None,
        }
    }

    /// The I/O error underneath, if this is one.
    pub(crate) fn as_io(&self) -> Option<&std::io::Error> {
        match &self.0 {
            Repr::Io(e) => Some(e),
            Repr::Engine(_) => None,
        }
    }

    /// A failure of the storage engine that is not an I/O error.
    pub(crate) fn engine(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StorageError(Repr::Engine(Box::new(e)))
    }
}

impl From<std::io::Error> for StorageError {
    fn from(e: std::io::Error) -> Self {
        StorageError(Repr::Io(e))
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Io(e) => write!(f, "I/O error: {e}"),
            Repr::Engine(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            Repr::Io(e) => Some(e),
            Repr::Engine(e) => Some(&**e),
        }
    }
}

/// `e`, with the path in its message if it is an I/O error.
pub(crate) fn at_path(e: Error, path: Option<&std::path::Path>) -> Error {
    match (e, path) {
        (Error::Storage(s), Some(p)) => match s.as_io() {
            Some(io) => Error::Storage(io_at(p, io)),
            None => Error::Storage(s),
        },
        (e, _) => e,
    }
}

/// An I/O error with the path in its message.
pub(crate) fn io_at(path: &std::path::Path, e: &std::io::Error) -> StorageError {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display())).into()
}

/// Renders a key for people: each part in double quotes, `"scope"/"id"`,
/// with `"` and `\` escaped by a backslash, control characters as Rust
/// escapes (`\n`, `\u{0}`) and bytes that are not UTF-8 as `\xff`. The
/// quotes keep `("a/b", "c")` and `("a", "b/c")` apart; other text is
/// printed as is, so ordinary keys stay readable.
pub(crate) fn show_key(scope: &[u8], id: &[u8]) -> String {
    struct Quoted<'a>(&'a [u8]);
    impl fmt::Display for Quoted<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("\"")?;
            for chunk in self.0.utf8_chunks() {
                for c in chunk.valid().chars() {
                    match c {
                        '"' | '\\' => write!(f, "\\{c}")?,
                        c if c.is_control() => write!(f, "{}", c.escape_default())?,
                        c => write!(f, "{c}")?,
                    }
                }
                for b in chunk.invalid() {
                    write!(f, "\\x{b:02x}")?;
                }
            }
            f.write_str("\"")
        }
    }
    format!("{}/{}", Quoted(scope), Quoted(id))
}

/// What a caught panic said (its `&str` or `String` payload).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_key_quotes_each_part_and_escapes_bytes() {
        assert_eq!(show_key(b"shop", b"evt_1"), r#""shop"/"evt_1""#);
        assert_eq!(show_key(b"t", b"a\x00\xff\n"), r#""t"/"a\u{0}\xff\n""#);
        assert_eq!(show_key("café".as_bytes(), b"x"), r#""café"/"x""#);
        // The separator never hides where one part ends.
        assert_eq!(show_key(b"a/b", b"c"), r#""a/b"/"c""#);
        assert_eq!(show_key(b"a", b"b/c"), r#""a"/"b/c""#);
        // Nor can a quote or backslash inside a part fake one.
        assert_eq!(show_key(br#"a"/"b"#, b"c"), r#""a\"/\"b"/"c""#);
        assert_eq!(show_key(b"a", br#"b"/"c"#), r#""a"/"b\"/\"c""#);
        assert_eq!(show_key(br"a\", b"c"), r#""a\\"/"c""#);
    }
}
