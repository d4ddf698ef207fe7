//! The service the layer wraps a handler in: one request's way from its
//! key to the handler, or to a stored response.
//!
//! Invariants: a key is claimed, and the claim settled, before the
//! handler runs; the response is stored, and the store settled, before
//! the first client gets it; every backend call runs on
//! `spawn_blocking`; a claim this request holds is always finished
//! (completed, failed, or released when the request is dropped).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use dedupkv::contract::{Outcome, Pending};
use dedupkv::{Began, Error, Failure, Key};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};

use crate::backend::Backed;
use crate::layer::{Settings, WhileRunning};
use crate::problem::Refusal;
use crate::stored::Stored;
use crate::{Backend, BoxError, IdempotencyLayer, ResponseBody, request};

/// The header a replayed response carries (`true`).
pub const REPLAYED: &str = "idempotent-replayed";
/// The header a replay carries when the first response's body was over
/// [`max_response_body`](IdempotencyLayer::max_response_body) and was not
/// stored: the limit, in bytes.
pub const BODY_OMITTED: &str = "idempotency-body-omitted";

/// The service [`IdempotencyLayer`] wraps a handler in.
///
/// # Examples
/// ```
/// use dedupkv_http::{Idempotency, IdempotencyLayer};
/// use tower::Layer;
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = dedupkv::Store::open(dir.path().join("s.redb"))?;
/// let handler = tower::service_fn(|_req: http::Request<axum::body::Body>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::from("ok")))
/// });
/// let service: Idempotency<_, _> = IdempotencyLayer::new(store).layer(handler);
/// # let _ = service;
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub struct Idempotency<S, B: Backend> {
    pub(crate) inner: S,
    pub(crate) layer: IdempotencyLayer<B>,
}

impl<S: Clone, B: Backend> Clone for Idempotency<S, B> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, B: Backend> std::fmt::Debug for Idempotency<S, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, ReqB, ResB> tower::Service<Request<ReqB>> for Idempotency<S, B>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Backend,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResponseBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The ready service serves this request; its clone the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(serve(inner, self.layer.clone(), req))
    }
}

async fn serve<S, B, ReqB, ResB>(
    mut inner: S,
    layer: IdempotencyLayer<B>,
    req: Request<ReqB>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>>,
    B: Backend,
    ReqB: Body + From<Bytes>,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let settings = Arc::clone(&layer.settings);
    if !settings.methods.contains(req.method()) {
        return inner.call(req).await.map(passed);
    }
    let id = match request::idempotency_key(req.headers(), settings.max_key_len) {
        Ok(Some(id)) => id,
        Ok(None) if !settings.require_key => return inner.call(req).await.map(passed),
        Ok(None) => {
            return Ok(Refusal::new(
                StatusCode::BAD_REQUEST,
                "Idempotency-Key required",
                "this request requires an Idempotency-Key request header".into(),
            )
            .into_response());
        }
        Err(refusal) => return Ok(refusal.into_response()),
    };
    let (parts, body) = req.into_parts();
    let Some(scope) = (settings.scope)(&parts) else {
        return Ok(Refusal::new(
            StatusCode::BAD_REQUEST,
            "No idempotency scope",
            "the request names no scope (tenant) its Idempotency-Key belongs to".into(),
        )
        .into_response());
    };
    let body = match Limited::new(body, settings.max_request_body)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return Ok(Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Request body too large",
                format!(
                    "a request with an Idempotency-Key may carry at most {} bytes",
                    settings.max_request_body
                ),
            )
            .into_response());
        }
        Err(e) => {
            return Ok(Refusal::new(
                StatusCode::BAD_REQUEST,
                "Request body unreadable",
                format!("the request body could not be read: {e}"),
            )
            .into_response());
        }
    };
    let fingerprint = request::fingerprint(&parts, &settings.fingerprint_headers, &body);
    let key = Key::owned(scope.into_bytes(), id.clone().into_bytes());
    let claim = match claim(&layer, key, fingerprint, &id).await {
        Ok(claim) => claim,
        Err(answer) => return Ok(answer),
    };
    let response = match inner
        .call(Request::from_parts(parts, ReqB::from(body)))
        .await
    {
        Ok(response) => response,
        Err(e) => {
            claim.fail(&id).await;
            return Err(e);
        }
    };
    if response.status().is_server_error() {
        claim.fail(&id).await;
        return Ok(passed(response));
    }
    Ok(store_and_answer(response, claim, &settings, &id).await)
}

/// Claims `key`, or gives the answer without the handler: the stored
/// response, 409, or the layer's refusal.
async fn claim<B: Backend>(
    layer: &IdempotencyLayer<B>,
    key: Key<'static>,
    fingerprint: dedupkv::Fingerprint,
    id: &str,
) -> Result<Held<B>, Response<ResponseBody>> {
    let settings = &*layer.settings;
    let options = settings.options;
    let began = {
        let key = key.clone();
        call(layer.backend.arc(), move |b| {
            b.begin(&key, fingerprint, &options, None)
        })
        .await
    };
    let began = match (began, settings.while_running) {
        (Ok(Began::InProgress(_)), WhileRunning::Wait(timeout)) => {
            blocking(layer.backend.arc(), move |b| {
                b.begin_or_wait(&key, fingerprint, &options, timeout)
            })
            .await
        }
        (began, _) => began,
    };
    match began {
        Ok(Began::Started(claim)) => Ok(Held {
            backend: layer.backend.clone(),
            claim: Some(claim),
        }),
        Ok(Began::Completed(record)) => Err(replay(&record, settings, id)),
        Ok(Began::InProgress(_)) => Err(Refusal::new(
            StatusCode::CONFLICT,
            "Request in progress",
            format!("a request with Idempotency-Key {id:?} is still being processed; retry later"),
        )
        .into_response()),
        Ok(Began::DeadLettered(_)) => Err(Refusal::new(
            StatusCode::CONFLICT,
            "Request held for an operator",
            format!("the request with Idempotency-Key {id:?} is in the dead-letter area"),
        )
        .into_response()),
        Err(e) => Err(refusal_of(&e, id).into_response()),
    }
}

/// Reads the handler's body up to the limit, completes the claim with
/// the response, then answers the first client with all of it.
async fn store_and_answer<B: Backend, ResB>(
    response: Response<ResB>,
    claim: Held<B>,
    settings: &Settings,
    id: &str,
) -> Response<ResponseBody>
where
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let (head, body) = response.into_parts();
    let mut body = Box::pin(body);
    let mut read = VecDeque::new();
    let mut len = 0usize;
    let mut ended = true;
    let mut broken: Option<BoxError> = None;
    while let Some(frame) = body.frame().await {
        match frame.map_err(Into::into) {
            Ok(frame) => {
                len += frame.data_ref().map_or(0, Bytes::len);
                read.push_back(frame);
                if len > settings.max_response_body {
                    ended = false;
                    break;
                }
            }
            Err(e) => {
                broken = Some(e);
                break;
            }
        }
    }
    if let Some(e) = broken {
        claim.fail(id).await;
        return Refusal::new(
            StatusCode::BAD_GATEWAY,
            "Response failed",
            format!("the handler's response body failed: {e}"),
        )
        .into_response();
    }
    let mut stored_body = BytesMut::new();
    if ended {
        for data in read.iter().filter_map(Frame::data_ref) {
            stored_body.extend_from_slice(data);
        }
    }
    let mut headers = HeaderMap::new();
    for name in &settings.stored_headers {
        for value in head.headers.get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let stored = Stored {
        status: head.status,
        headers,
        body_omitted: !ended,
        body: stored_body.freeze(),
    };
    let outcome = stored.encode();
    if let Err(e) = claim
        .finish(move |b, c| b.complete(c, Outcome::raw(&outcome)))
        .await
    {
        // The handler ran: its client gets its answer; a repeat after the
        // lease lapses may run it again.
        tracing::error!(key = id, error = %e, "dedupkv-http: the response could not be stored");
    }
    let rest = if ended { None } else { Some(body) };
    Response::from_parts(head, Resume { read, rest }.boxed_unsync())
}

/// A stored response, as a repeat gets it.
fn replay(record: &dedupkv::Record, settings: &Settings, id: &str) -> Response<ResponseBody> {
    let stored = match record.outcome().map(Stored::decode) {
        Some(Ok(stored)) => stored,
        Some(Err(why)) => {
            tracing::error!(
                key = id,
                why,
                "dedupkv-http: a stored response does not decode"
            );
            return Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Stored response unreadable",
                format!("the response stored for Idempotency-Key {id:?} cannot be read"),
            )
            .into_response();
        }
        None => {
            return Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "No stored response",
                format!("Idempotency-Key {id:?} is recorded without a stored response"),
            )
            .into_response();
        }
    };
    let mut res = Response::new(
        Full::new(stored.body)
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *res.status_mut() = stored.status;
    *res.headers_mut() = stored.headers;
    res.headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    if stored.body_omitted {
        res.headers_mut()
            .insert(BODY_OMITTED, HeaderValue::from(settings.max_response_body));
    }
    res
}

/// The answer to a backend error of `begin`.
fn refusal_of(e: &Failed, id: &str) -> Refusal {
    match e {
        Failed::Store(Error::FingerprintMismatch { .. }) => Refusal::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Idempotency-Key reused",
            format!(
                "Idempotency-Key {id:?} was first used with another request \
                 (method, path and query, body, or fingerprinted headers)"
            ),
        ),
        Failed::Store(Error::InvalidArgument { .. } | Error::InvalidInput { .. }) => Refusal::new(
            StatusCode::BAD_REQUEST,
            "Invalid Idempotency-Key",
            format!("the Idempotency-Key request header is refused by the store: {e}"),
        ),
        _ => {
            tracing::error!(key = id, error = %e, "dedupkv-http: the key could not be claimed");
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Idempotency store unavailable",
                "the request was not run: its Idempotency-Key could not be claimed".into(),
            )
        }
    }
}

/// The handler's response as it is (not a covered request, or not
/// stored).
fn passed<ResB>(res: Response<ResB>) -> Response<ResponseBody>
where
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    res.map(|b| b.map_err(Into::into).boxed_unsync())
}

/// Why a blocking backend call did not answer.
#[derive(Debug)]
enum Failed {
    Store(Error),
    Panicked,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Store(e) => e.fmt(f),
            Failed::Panicked => f.write_str("the backend call panicked"),
        }
    }
}

/// Makes the call `f` on the backend and awaits its answer's basis: on
/// tokio's blocking pool for a backend whose calls block, else inline.
async fn call<B: Backend, T: Send + 'static>(
    backend: &Arc<B>,
    f: impl FnOnce(&B) -> dedupkv::Result<Pending<T>> + Send + 'static,
) -> Result<T, Failed> {
    if B::CALLS_BLOCK {
        return blocking(backend, move |b| b.tell(f(b)?)).await;
    }
    let (value, basis) = f(backend).map_err(Failed::Store)?.into_parts();
    backend.settled(basis).await.map_err(Failed::Store)?;
    Ok(value)
}

/// Runs `f` on the backend on tokio's blocking pool.
async fn blocking<B: Backend, T: Send + 'static>(
    backend: &Arc<B>,
    f: impl FnOnce(&B) -> dedupkv::Result<T> + Send + 'static,
) -> Result<T, Failed> {
    let backend = Arc::clone(backend);
    match tokio::task::spawn_blocking(move || f(&backend)).await {
        Ok(answer) => answer.map_err(Failed::Store),
        Err(_) => Err(Failed::Panicked),
    }
}

/// A claim this request holds: finished on purpose, or released when the
/// request is dropped (the client went away), off the runtime's threads.
struct Held<B: Backend> {
    backend: Backed<B>,
    claim: Option<B::Claim>,
}

impl<B: Backend> Held<B> {
    async fn finish(
        mut self,
        f: impl FnOnce(&B, &B::Claim) -> dedupkv::Result<Pending<()>> + Send + 'static,
    ) -> Result<(), Failed> {
        let Some(claim) = self.claim.take() else {
            return Ok(());
        };
        call(self.backend.arc(), move |b| f(b, &claim)).await
    }

    /// Frees the key for a retry of the same request.
    async fn fail(self, id: &str) {
        if let Err(e) = self.finish(|b, c| b.fail(c, Failure::Retryable)).await {
            // The lease lapses instead: a retry runs after it.
            tracing::warn!(key = id, error = %e, "dedupkv-http: a failed request's key could not be freed");
        }
    }
}

impl<B: Backend> Drop for Held<B> {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(move || drop(claim))),
                Err(_) => drop(claim),
            }
        }
    }
}

/// The first client's body: the frames read to store it, then the rest
/// of the handler's body (a body over the limit).
struct Resume<B> {
    read: VecDeque<Frame<Bytes>>,
    rest: Option<Pin<Box<B>>>,
}

impl<B> Body for Resume<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match &mut this.rest {
            Some(rest) => rest.as_mut().poll_frame(cx).map_err(Into::into),
            None => Poll::Ready(None),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let read: u64 = self
            .read
            .iter()
            .filter_map(Frame::data_ref)
            .map(|d| d.len() as u64)
            .sum();
        match &self.rest {
            None => http_body::SizeHint::with_exact(read),
            Some(rest) => {
                let rest = rest.size_hint();
                let mut hint = http_body::SizeHint::new();
                // The upper bound first: a lower bound over it panics.
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint.set_lower(rest.lower().saturating_add(read));
                hint
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && self
                .rest
                .as_ref()
                .is_none_or(|r| Body::is_end_stream(r.as_ref().get_ref()))
    }
}
