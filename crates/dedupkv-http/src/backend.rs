//! Which stores the layer runs over: any backend of dedupkv's contract
//! ([`Write`] + [`Settle`]), plus how it waits for a running attempt.
//!
//! Invariant: every method here blocks; the layer calls them only from
//! `spawn_blocking`, never on the async runtime's worker threads.

use std::time::Duration;

#[cfg(doc)]
use dedupkv::contract::Settle;
use dedupkv::contract::Write;
use dedupkv::{Began, BeginOptions, Fingerprint, Key, Result};

/// A backend of dedupkv's operation-level contract the layer can claim
/// keys in: the embedded [`Store`](dedupkv::Store), `PgStore` (feature
/// `postgres`), or your own (`impl Backend for MyStore {}` takes the
/// provided `begin_or_wait`, which does not wait).
///
/// # Examples
/// ```
/// use dedupkv::{Began, BeginOptions, Fingerprint, Key, Store};
/// use dedupkv_http::Backend;
/// use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("http", "k-1");
/// let answer = Backend::begin_or_wait(&store, &key, Fingerprint::NONE, &BeginOptions::new(), Duration::ZERO)?;
/// assert!(matches!(answer, Began::Started(_)));
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait Backend: Write<Claim: Send + 'static> + Send + Sync + 'static {
    /// Whether `begin`, `complete` and `fail` block the calling thread
    /// (a network round trip): then the layer makes them on
    /// `spawn_blocking`. `false` for a backend whose calls return at once
    /// and whose [`Settle::poll_settled`] registers a waker (the embedded
    /// store: its calls decide in memory and the commit wakes the
    /// future): the layer calls it inline and awaits the basis. Default:
    /// `true`.
    const CALLS_BLOCK: bool = true;

    /// `begin`, told once settled; when another attempt holds the key,
    /// waits up to `timeout` for it to finish (the backend's own
    /// `begin_or_wait` where it has one). The provided method does not
    /// wait: it answers as `begin` did.
    ///
    /// # Errors
    /// As [`Write::begin`] and [`Settle::wait`].
    ///
    /// # Examples
    /// See [`Backend`].
    fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Began<Self::Claim>> {
        let _ = timeout;
        begin(self, key, fingerprint, options)
    }
}

impl Backend for dedupkv::Store {
    const CALLS_BLOCK: bool = false;

    fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Began<Self::Claim>> {
        self.begin_or_wait_with(key, fingerprint, options, timeout)
    }
}

#[cfg(feature = "postgres")]
impl Backend for dedupkv_postgres::PgStore {
    fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Began<Self::Claim>> {
        dedupkv_postgres::PgStore::begin_or_wait(self, key, fingerprint, options, timeout)
    }
}

/// `begin` told: the one blocking call every mode starts with.
pub(crate) fn begin<B: Backend + ?Sized>(
    backend: &B,
    key: &Key<'_>,
    fingerprint: Fingerprint,
    options: &BeginOptions,
) -> Result<Began<B::Claim>> {
    let pending = backend.begin(key, fingerprint, options, None)?;
    backend.tell(pending)
}

/// The layer's hold on its backend. The last hold drops the backend off
/// the runtime's threads: a blocking backend's drop blocks (the
/// embedded store joins its threads) or refuses to run inside a runtime
/// (`postgres`'s client closes its connection with a `block_on`).
pub(crate) struct Backed<B: Backend>(Option<std::sync::Arc<B>>);

impl<B: Backend> Backed<B> {
    pub(crate) fn new(backend: std::sync::Arc<B>) -> Backed<B> {
        Backed(Some(backend))
    }

    pub(crate) fn arc(&self) -> &std::sync::Arc<B> {
        // Some until dropped.
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("a backend hold is Some until dropped"))
    }
}

impl<B: Backend> Clone for Backed<B> {
    fn clone(&self) -> Self {
        Backed(self.0.clone())
    }
}

impl<B: Backend> Drop for Backed<B> {
    fn drop(&mut self) {
        let last = self.0.take().and_then(std::sync::Arc::into_inner);
        if let Some(backend) = last {
            if tokio::runtime::Handle::try_current().is_err() {
                return drop(backend);
            }
            // A thread of its own, not the blocking pool: a runtime
            // shutting down drops the tasks it has not started in place.
            let _ = std::thread::Builder::new()
                .name("dedupkv-http-drop".into())
                .spawn(move || drop(backend));
        }
    }
}
