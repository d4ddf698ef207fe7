//! The layer and its settings: which requests it covers, what it stores,
//! what a repeat of a running request gets, the scope of each key.

use std::sync::Arc;
use std::time::Duration;

use dedupkv::BeginOptions;
use http::request::Parts;
use http::{HeaderName, Method, header};

use crate::Backend;
use crate::backend::Backed;
use crate::service::Idempotency;

/// What a request gets when another request with its key is still
/// running (the draft: 409 Conflict).
///
/// # Examples
/// ```
/// use dedupkv_http::{IdempotencyLayer, WhileRunning};
/// use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
/// let layer = IdempotencyLayer::new(store).while_running(WhileRunning::Wait(Duration::from_secs(10)));
/// # let _ = layer;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhileRunning {
    /// Answer 409 Conflict at once.
    Conflict,
    /// Wait up to this long for the running request to finish, then give
    /// its response (or run, if it failed); 409 if it is still running.
    /// The backend's `begin_or_wait` wakes the waiter (the embedded store
    /// in process, PostgreSQL by `LISTEN`/`NOTIFY` across instances); a
    /// backend without one answers at once, as `Conflict`.
    Wait(Duration),
}

type ScopeFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) max_key_len: usize,
    pub(crate) max_request_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) while_running: WhileRunning,
    pub(crate) scope: Arc<ScopeFn>,
    pub(crate) options: BeginOptions,
}

/// The scope every key is in unless [`IdempotencyLayer::scope`] says
/// otherwise.
pub const DEFAULT_SCOPE: &str = "http";

/// A `tower` layer that runs each request carrying an `Idempotency-Key`
/// once, over a backend of dedupkv's contract (see the crate's docs for
/// what each request gets).
///
/// Apply it to the routes it covers (axum: `.route_layer(…)`, or
/// `post(handler).layer(…)` for one route). Cloning it is cheap; every
/// clone shares the backend.
///
/// # Examples
/// ```
/// use axum::{Router, routing::post};
/// use dedupkv_http::IdempotencyLayer;
/// # let dir = tempfile::tempdir().unwrap();
/// let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
/// let app: Router = Router::new()
///     .route("/charges", post(|| async { "charged" }))
///     .route_layer(IdempotencyLayer::new(store).require_key(true));
/// # let _ = app;
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub struct IdempotencyLayer<B: Backend> {
    pub(crate) backend: Backed<B>,
    pub(crate) settings: Arc<Settings>,
}

impl<B: Backend> Clone for IdempotencyLayer<B> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            backend: self.backend.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<B: Backend> std::fmt::Debug for IdempotencyLayer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &*self.settings;
        f.debug_struct("IdempotencyLayer")
            .field("methods", &s.methods)
            .field("require_key", &s.require_key)
            .field("max_key_len", &s.max_key_len)
            .field("max_request_body", &s.max_request_body)
            .field("max_response_body", &s.max_response_body)
            .field("stored_headers", &s.stored_headers)
            .field("fingerprint_headers", &s.fingerprint_headers)
            .field("while_running", &s.while_running)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> IdempotencyLayer<B> {
    /// A layer over `backend` with the default settings.
    ///
    /// # Examples
    /// See [`IdempotencyLayer`].
    pub fn new(backend: B) -> IdempotencyLayer<B> {
        IdempotencyLayer::shared(Arc::new(backend))
    }

    /// A layer over a backend shared with the rest of the service. The
    /// layer drops its last handle off the runtime's threads; drop yours
    /// the same way (`spawn_blocking`) or outside the runtime: a blocking
    /// client (`postgres`) panics when closed inside one.
    ///
    /// # Examples
    /// ```
    /// use dedupkv_http::IdempotencyLayer;
    /// use std::sync::Arc;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = Arc::new(dedupkv::Store::open(dir.path().join("s.redb"))?);
    /// let layer = IdempotencyLayer::shared(Arc::clone(&store));
    /// # let _ = layer;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn shared(backend: Arc<B>) -> IdempotencyLayer<B> {
        IdempotencyLayer {
            backend: Backed::new(backend),
            settings: Arc::new(Settings {
                methods: vec![Method::POST, Method::PATCH],
                require_key: false,
                max_key_len: 255,
                max_request_body: 1 << 20,
                max_response_body: 64 << 10,
                stored_headers: vec![header::CONTENT_TYPE, header::LOCATION],
                fingerprint_headers: Vec::new(),
                while_running: WhileRunning::Conflict,
                scope: Arc::new(|_: &Parts| Some(DEFAULT_SCOPE.to_owned())),
                options: BeginOptions::new(),
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Settings)) -> Self {
        f(Arc::make_mut(&mut self.settings));
        self
    }

    /// The methods the layer covers; others pass through untouched.
    /// Default: `POST` and `PATCH` (the draft's non-idempotent methods).
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// let layer = dedupkv_http::IdempotencyLayer::new(store).methods([http::Method::POST]);
    /// # let _ = layer;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[must_use]
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.with(|s| s.methods = methods.into_iter().collect())
    }

    /// Whether a covered request without the key is refused (400) rather
    /// than run as it is, every time. Default: `false`.
    ///
    /// # Examples
    /// See [`IdempotencyLayer`].
    #[must_use]
    pub fn require_key(self, required: bool) -> Self {
        self.with(|s| s.require_key = required)
    }

    /// The longest key accepted, in bytes; a longer one gets 400 naming
    /// the limit. Default: 255. The backend's own limit (the embedded
    /// store's `max_id`, 1024 by default) still applies.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// let layer = dedupkv_http::IdempotencyLayer::new(store).max_key_len(64);
    /// # let _ = layer;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[must_use]
    pub fn max_key_len(self, bytes: usize) -> Self {
        self.with(|s| s.max_key_len = bytes)
    }

    /// The largest request body of a keyed request, in bytes: the layer
    /// reads it whole to fingerprint it; a larger one gets 413 and the
    /// key is not claimed. Default: 1 MiB.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// let layer = dedupkv_http::IdempotencyLayer::new(store).max_request_body(64 << 10);
    /// # let _ = layer;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[must_use]
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.with(|s| s.max_request_body = bytes)
    }

    /// The largest response body stored, in bytes. A larger response is
    /// streamed to the first client whole, and the key is completed with
    /// its status and stored headers only: a repeat gets those, an empty
    /// body and `idempotency-body-omitted: <limit>` (the handler never
    /// runs twice). Default: 64 KiB; the stored outcome must also fit the
    /// backend's limit (the embedded store's `max_outcome`, 1 MiB).
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// let layer = dedupkv_http::IdempotencyLayer::new(store).max_response_body(256 << 10);
    /// # let _ = layer;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[must_use]
    pub fn max_response_body(self, bytes: usize) -> Self {
        self.with(|s| s.max_response_body = bytes)
    }

    /// The response headers stored and replayed (every other header
    /// reaches the first client only). Default: `content-type`,
    /// `location`.
    ///
    /// # Examples
    /// ```
    /// use http::header::{CONTENT_TYPE, ETAG};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// let layer = dedupkv_http::IdempotencyLayer::new(store).store_headers([CONTENT_TYPE, ETAG]);
    /// # let _ = layer;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[must_use]
    pub fn store_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.with(|s| s.stored_headers = names.into_iter().collect())
    }

    /// Request headers that are part of the fingerprint, besides the
    /// method, the path and query, and the body. Default: none.
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// let layer = dedupkv_http::IdempotencyLayer::new(store)
    ///     .fingerprint_headers([http::header::CONTENT_TYPE]);
    /// # let _ = layer;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[must_use]
    pub fn fingerprint_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.with(|s| s.fingerprint_headers = names.into_iter().collect())
    }

    /// What a repeat of a running request gets. Default:
    /// [`WhileRunning::Conflict`].
    ///
    /// # Examples
    /// See [`WhileRunning`].
    #[must_use]
    pub fn while_running(self, mode: WhileRunning) -> Self {
        self.with(|s| s.while_running = mode)
    }

    /// The key's scope, from the request's head (a tenant from a header or
    /// the authenticated principal): the same key in two scopes is two
    /// operations. `None` refuses the request (400). Default: every
    /// request in [`DEFAULT_SCOPE`].
    ///
    /// # Examples
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// let layer = dedupkv_http::IdempotencyLayer::new(store).scope(|req| {
    ///     let tenant = req.headers.get("x-tenant")?.to_str().ok()?;
    ///     Some(format!("tenant:{tenant}"))
    /// });
    /// # let _ = layer;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[must_use]
    pub fn scope(self, scope: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.with(|s| s.scope = Arc::new(scope))
    }

    /// The lease and retention of each claim. The lease must outlast the
    /// handler: past it, a repeat takes the key over and runs again.
    /// Default: the backend's.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::BeginOptions;
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
    /// let layer = dedupkv_http::IdempotencyLayer::new(store)
    ///     .begin_options(BeginOptions::new().lease(Duration::from_secs(60)));
    /// # let _ = layer;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[must_use]
    pub fn begin_options(self, options: BeginOptions) -> Self {
        self.with(|s| s.options = options)
    }
}

impl<S, B: Backend> tower::Layer<S> for IdempotencyLayer<B> {
    type Service = Idempotency<S, B>;

    fn layer(&self, inner: S) -> Idempotency<S, B> {
        Idempotency {
            inner,
            layer: self.clone(),
        }
    }
}
