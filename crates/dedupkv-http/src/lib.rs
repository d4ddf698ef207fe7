//! An `Idempotency-Key` layer for HTTP services: a [`tower`] layer,
//! usable from axum, over any backend of dedupkv's operation-level
//! contract — the embedded [`Store`](dedupkv::Store) for one instance,
//! `PgStore` (feature `postgres`) for several instances behind a load
//! balancer sharing one PostgreSQL database.
//!
//! # What each request gets
//! Semantics of the IETF httpapi draft "The Idempotency-Key HTTP Header
//! Field" (draft-ietf-httpapi-idempotency-key-header-06). On a covered
//! route (a route the layer is applied to, a method in
//! [`methods`](IdempotencyLayer::methods), default `POST` and `PATCH`):
//! - **First request with a key**: the key is claimed in the backend
//!   (`begin`, settled: durable, and decided across instances for
//!   PostgreSQL) *before* the handler runs; the handler's response
//!   (status, the [chosen headers](IdempotencyLayer::store_headers), the
//!   body up to [a limit](IdempotencyLayer::max_response_body)) is stored
//!   as the key's outcome, settled, and then given to the client.
//! - **A repeat after it**: the stored response, with
//!   `idempotent-replayed: true` ([`REPLAYED`]); the handler does not run.
//! - **A repeat while the first runs**: 409 Conflict, or, with
//!   [`WhileRunning::Wait`], the first one's response once it is stored
//!   (the backend's `begin_or_wait`).
//! - **The same key with another request**: 422 Unprocessable Content.
//!   The fingerprint is the method, the path and query, a digest of the
//!   body, and [chosen request headers](IdempotencyLayer::fingerprint_headers).
//! - **No key where one is [required](IdempotencyLayer::require_key)**:
//!   400; an empty key, or one over [`max_key_len`](IdempotencyLayer::max_key_len),
//!   400 naming the limit. No key where none is required: the request
//!   runs as it is, every time.
//! - **The handler fails** (a 5xx response, or the service's error): the
//!   draft does not say what a repeat of a failed request gets; we free
//!   the key ([`Failure::Retryable`](dedupkv::Failure::Retryable)), so a
//!   retry of the same request runs again, and pass the failure to the
//!   client unstored. Every other status (2xx, 3xx, 4xx) is the
//!   handler's answer and is stored. A client that goes away before the
//!   response is stored releases the key the same way.
//! - **A response body over the limit**: the first client gets all of it,
//!   streamed; the key is completed with the status and stored headers
//!   only, and a repeat gets those with an empty body and
//!   `idempotency-body-omitted: <limit>` ([`BODY_OMITTED`]). The handler
//!   still never runs twice.
//!
//! - **A request body over [`max_request_body`](IdempotencyLayer::max_request_body)**
//!   (the layer reads a keyed request's body whole, to fingerprint it):
//!   413, nothing claimed.
//!
//! The layer's own answers are RFC 9457 problem details
//! (`application/problem+json`). Keys are [scoped](IdempotencyLayer::scope)
//! (per tenant; by default all in one scope). A blocking backend's calls
//! (PostgreSQL's) run on tokio's `spawn_blocking`, never on the
//! runtime's worker threads; the embedded store's return at once and
//! their commit is awaited ([`Backend::CALLS_BLOCK`]). Waiting for a
//! running request ([`WhileRunning::Wait`]) holds a blocking thread while
//! it waits.
//!
//! # Examples
//! ```
//! use axum::{Router, routing::post};
//! use dedupkv_http::IdempotencyLayer;
//! use tower::ServiceExt;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
//! let app = Router::new()
//!     .route("/charges", post(|body: String| async move { format!("charged {body}") }))
//!     .route_layer(IdempotencyLayer::new(store).require_key(true));
//!
//! let request = || {
//!     http::Request::post("/charges")
//!         .header("idempotency-key", "order-7")
//!         .body(axum::body::Body::from("100 EUR"))
//! };
//! let first = app.clone().oneshot(request()?).await?;
//! let again = app.oneshot(request()?).await?;
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! # assert_eq!(first.status(), 200);
//! # Ok(())
//! # }
//! ```

#![allow(clippy::doc_markdown)] // product names (PostgreSQL, axum) are not code

/// The README's code, compiled and run as doc tests so it cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}

mod backend;
mod layer;
mod problem;
mod request;
mod service;
mod stored;

pub use backend::Backend;
pub use layer::{DEFAULT_SCOPE, IdempotencyLayer, WhileRunning};
pub use service::{BODY_OMITTED, Idempotency, REPLAYED};

/// The error type of the bodies the layer hands on.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the layer gives: the handler's (passed on,
/// or streamed after the stored part), a replay, or the layer's own.
///
/// # Examples
/// ```
/// use http_body_util::BodyExt;
/// let body: dedupkv_http::ResponseBody = http_body_util::Full::new(bytes::Bytes::from("x"))
///     .map_err(|never| match never {})
///     .boxed_unsync();
/// # let _ = body;
/// ```
pub type ResponseBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;
