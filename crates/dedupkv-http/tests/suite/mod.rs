//! What every request gets, as plain async functions over any backend:
//! tests/embedded.rs runs them over the embedded store, tests/postgres.rs
//! over PostgreSQL.

#![allow(dead_code)] // each test binary uses what it needs
#![allow(clippy::doc_markdown)] // product names (PostgreSQL) are not code

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use dedupkv_http::{Backend, IdempotencyLayer, WhileRunning};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The routes under test and what they did.
#[derive(Clone)]
pub struct App {
    pub router: Router,
    /// Handler runs, all routes together.
    pub runs: Arc<AtomicUsize>,
    /// `/slow` waits for a permit here.
    pub gate: Arc<Semaphore>,
    /// `/slow` says it started.
    pub entered: Arc<Notify>,
}

pub fn app<B: Backend>(layer: IdempotencyLayer<B>) -> App {
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let entered = Arc::new(Notify::new());
    let (r1, r2, r3, r4) = (runs.clone(), runs.clone(), runs.clone(), runs.clone());
    let (g, e) = (gate.clone(), entered.clone());
    let router = Router::new()
        .route(
            "/charge",
            post(move |body: String| async move {
                let n = r1.fetch_add(1, Ordering::SeqCst) + 1;
                Response::builder()
                    .status(StatusCode::CREATED)
                    .header("content-type", "text/plain")
                    .header("location", format!("/charges/{n}"))
                    .header("x-not-stored", "1")
                    .body(Body::from(format!("charged {n}: {body}")))
                    .expect("valid response")
            }),
        )
        .route(
            "/slow",
            post(move || async move {
                let n = r2.fetch_add(1, Ordering::SeqCst) + 1;
                e.notify_one();
                let _permit = g.acquire().await.expect("gate open");
                format!("slow {n}")
            }),
        )
        .route(
            "/flaky",
            post(move || async move {
                let n = r3.fetch_add(1, Ordering::SeqCst) + 1;
                if n == 1 {
                    (StatusCode::SERVICE_UNAVAILABLE, "try again".to_owned())
                } else {
                    (StatusCode::OK, format!("flaky {n}"))
                }
            }),
        )
        .route(
            "/big",
            post(move || async move {
                r4.fetch_add(1, Ordering::SeqCst);
                vec![b'x'; 4096]
            }),
        )
        .route_layer(layer);
    App {
        router,
        runs,
        gate,
        entered,
    }
}

pub fn req(path: &str, key: Option<&str>, body: &'static str) -> Request<Body> {
    let mut r = Request::post(path);
    if let Some(k) = key {
        r = r.header("idempotency-key", k);
    }
    r.body(Body::from(body)).expect("valid request")
}

/// A liveness bound, not a speed target: a request that hangs (the layer
/// letting a repeat through to a handler that waits) fails the test.
const BOUND: Duration = Duration::from_secs(120);

pub async fn send(app: &App, r: Request<Body>) -> Result<(Response<()>, Bytes), axum::Error> {
    let res = tokio::time::timeout(BOUND, app.router.clone().oneshot(r))
        .await
        .map_err(axum::Error::new)?
        .expect("infallible");
    let (head, body) = res.into_parts();
    Ok((
        Response::from_parts(head, ()),
        body.collect().await?.to_bytes(),
    ))
}

fn runs(app: &App) -> usize {
    app.runs.load(Ordering::SeqCst)
}

/// The first request runs; a repeat gets its stored response (status,
/// chosen headers, body) marked as a replay, and the handler runs once.
pub async fn first_runs_then_repeats_replay<B: Backend>(b: B) -> TestResult {
    let app = app(IdempotencyLayer::new(b));
    let (first, body) = send(&app, req("/charge", Some("k1"), "100 EUR")).await?;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(&body[..], b"charged 1: 100 EUR");
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert_eq!(first.headers()["x-not-stored"], "1");
    for _ in 0..2 {
        let (again, body2) = send(&app, req("/charge", Some("k1"), "100 EUR")).await?;
        assert_eq!(again.status(), StatusCode::CREATED);
        assert_eq!(body2, body);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.headers()["location"], "/charges/1");
        assert_eq!(again.headers()["content-type"], "text/plain");
        assert!(again.headers().get("x-not-stored").is_none());
    }
    assert_eq!(runs(&app), 1);
    // Another key is another operation; a quoted key is the same as bare.
    let (_, body) = send(&app, req("/charge", Some("k2"), "100 EUR")).await?;
    assert_eq!(&body[..], b"charged 2: 100 EUR");
    let (again, _) = send(&app, req("/charge", Some("\"k2\""), "100 EUR")).await?;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(runs(&app), 2);
    Ok(())
}

/// A repeat while the first runs gets 409; after, the replay.
pub async fn repeat_while_running_conflicts<B: Backend>(b: B) -> TestResult {
    let app = app(IdempotencyLayer::new(b));
    let entered = app.entered.notified();
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, req("/slow", Some("s1"), "")).await }
    });
    entered.await;
    let (second, body) = send(&app, req("/slow", Some("s1"), "")).await?;
    assert_eq!(second.status(), StatusCode::CONFLICT);
    assert_eq!(second.headers()["content-type"], "application/problem+json");
    assert!(String::from_utf8_lossy(&body).contains("\"status\":409"));
    app.gate.add_permits(1);
    let (first, body) = first.await??;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(&body[..], b"slow 1");
    let (third, body3) = send(&app, req("/slow", Some("s1"), "")).await?;
    assert_eq!(third.headers()["idempotent-replayed"], "true");
    assert_eq!(body3, body);
    assert_eq!(runs(&app), 1);
    Ok(())
}

/// With `WhileRunning::Wait`, a repeat while the first runs waits and
/// gets the first one's response.
pub async fn repeat_while_running_waits<B: Backend>(b: B) -> TestResult {
    let app =
        app(IdempotencyLayer::new(b).while_running(WhileRunning::Wait(Duration::from_secs(60))));
    let entered = app.entered.notified();
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, req("/slow", Some("w1"), "")).await }
    });
    entered.await;
    let second = tokio::spawn({
        let app = app.clone();
        async move { send(&app, req("/slow", Some("w1"), "")).await }
    });
    // Not a timing assertion: either way the second must get the replay;
    // the pause only makes it likely that it waits rather than arrives after.
    tokio::time::sleep(Duration::from_millis(200)).await;
    app.gate.add_permits(1);
    let (first, body1) = first.await??;
    let (second, body2) = second.await??;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(body1, body2);
    assert_eq!(runs(&app), 1);
    Ok(())
}

/// The same key with another body or path gets 422, and does not run.
pub async fn another_request_with_the_key_is_refused<B: Backend>(b: B) -> TestResult {
    let app = app(IdempotencyLayer::new(b));
    send(&app, req("/charge", Some("m1"), "100 EUR")).await?;
    for r in [
        req("/charge", Some("m1"), "200 EUR"),
        req("/charge?currency=USD", Some("m1"), "100 EUR"),
    ] {
        let (res, body) = send(&app, r).await?;
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(String::from_utf8_lossy(&body).contains("m1"));
    }
    assert_eq!(runs(&app), 1);
    Ok(())
}

/// No key where one is required: 400, not run; where none is required,
/// it runs every time. Other methods pass through.
pub async fn a_missing_key<B: Backend>(b: B) -> TestResult {
    let b = Arc::new(b);
    let required = app(IdempotencyLayer::shared(b.clone()).require_key(true));
    let (res, body) = send(&required, req("/charge", None, "1")).await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("requires an Idempotency-Key"));
    assert_eq!(runs(&required), 0);
    let optional = app(IdempotencyLayer::shared(b));
    send(&optional, req("/charge", None, "1")).await?;
    let (res, _) = send(&optional, req("/charge", None, "1")).await?;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(runs(&optional), 2);
    Ok(())
}

/// An empty key, a key over the limit, a key twice: 400 naming why.
pub async fn a_bad_key<B: Backend>(b: B) -> TestResult {
    let app = app(IdempotencyLayer::new(b).max_key_len(16));
    let (res, body) = send(&app, req("/charge", Some(""), "1")).await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("is empty"));
    let (res, body) = send(&app, req("/charge", Some("\"\""), "1")).await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("is empty"));
    let long = "k".repeat(17);
    let (res, body) = send(&app, req("/charge", Some(&long), "1")).await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("limit of 16 bytes"));
    let twice = Request::post("/charge")
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body(Body::from("1"))?;
    let (res, _) = send(&app, twice).await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let (res, _) = send(&app, req("/charge", Some(&"k".repeat(16)), "1")).await?;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(runs(&app), 1);
    Ok(())
}

/// A 5xx frees the key: the retry runs, and its answer is the one stored.
pub async fn a_server_error_frees_the_key<B: Backend>(b: B) -> TestResult {
    let app = app(IdempotencyLayer::new(b));
    let (res, _) = send(&app, req("/flaky", Some("f1"), "")).await?;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().get("idempotent-replayed").is_none());
    let (res, body) = send(&app, req("/flaky", Some("f1"), "")).await?;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(&body[..], b"flaky 2");
    let (res, body) = send(&app, req("/flaky", Some("f1"), "")).await?;
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(&body[..], b"flaky 2");
    assert_eq!(runs(&app), 2);
    Ok(())
}

/// The inner service's error frees the key too.
pub async fn an_inner_error_frees_the_key<B: Backend>(b: B) -> TestResult {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let svc = tower::service_fn(move |_req: Request<Body>| {
        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if n == 1 {
                Err("connection to the payment provider reset")
            } else {
                Ok(Response::new(Body::from(format!("ok {n}"))))
            }
        }
    });
    let svc = tower::Layer::layer(&IdempotencyLayer::new(b), svc);
    let first = svc.clone().oneshot(req("/x", Some("e1"), "")).await;
    assert!(first.is_err());
    let res = svc.clone().oneshot(req("/x", Some("e1"), "")).await?;
    assert_eq!(&res.into_body().collect().await?.to_bytes()[..], b"ok 2");
    let res = svc.oneshot(req("/x", Some("e1"), "")).await?;
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    Ok(())
}

/// A body over the limit: the first client gets all of it; a repeat
/// gets the status, an empty body and the omitted header; one run.
pub async fn a_response_over_the_limit<B: Backend>(b: B) -> TestResult {
    let app = app(IdempotencyLayer::new(b).max_response_body(1024));
    let (res, body) = send(&app, req("/big", Some("b1"), "")).await?;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(body.len(), 4096);
    let (res, body) = send(&app, req("/big", Some("b1"), "")).await?;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(res.headers()["idempotency-body-omitted"], "1024");
    assert!(body.is_empty());
    assert_eq!(runs(&app), 1);
    Ok(())
}

/// Keys are per scope: the same key of two tenants is two operations.
pub async fn keys_are_scoped_per_tenant<B: Backend>(b: B) -> TestResult {
    let layer = IdempotencyLayer::new(b)
        .scope(|req| Some(req.headers.get("x-tenant")?.to_str().ok()?.to_owned()));
    let app = app(layer);
    let tenant = |t: &str| {
        Request::post("/charge")
            .header("idempotency-key", "same")
            .header("x-tenant", t)
            .body(Body::from("1"))
            .expect("valid request")
    };
    let (_, a) = send(&app, tenant("a")).await?;
    let (_, b) = send(&app, tenant("b")).await?;
    assert_ne!(a, b);
    let (again, a2) = send(&app, tenant("a")).await?;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(a, a2);
    let (res, _) = send(&app, req("/charge", Some("same"), "1")).await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(runs(&app), 2);
    Ok(())
}

/// Eight identical requests at once: the handler runs exactly once; the
/// others get 409 (or, waiting, the same response).
pub async fn concurrent_identical_requests_run_once<B: Backend>(b: B) -> TestResult {
    let b = Arc::new(b);
    for (round, mode) in [
        WhileRunning::Conflict,
        WhileRunning::Wait(Duration::from_secs(60)),
    ]
    .into_iter()
    .enumerate()
    {
        let app = app(IdempotencyLayer::shared(b.clone()).while_running(mode));
        let key = format!("c{round}");
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (app, key) = (app.clone(), key.clone());
                tokio::spawn(async move { send(&app, req("/charge", Some(&key), "9")).await })
            })
            .collect();
        let mut bodies = Vec::new();
        for t in tasks {
            let (res, body) = t.await??;
            match res.status() {
                StatusCode::CREATED => bodies.push(body),
                StatusCode::CONFLICT => assert_eq!(mode, WhileRunning::Conflict),
                other => panic!("unexpected {other}"),
            }
        }
        assert_eq!(runs(&app), 1, "{mode:?}");
        assert!(bodies.iter().all(|b| b == &bodies[0]));
        if mode != WhileRunning::Conflict {
            assert_eq!(bodies.len(), 8);
        }
    }
    // The last handle, off the runtime: `postgres`'s client refuses to
    // close inside one.
    tokio::task::spawn_blocking(move || drop(b)).await?;
    Ok(())
}

/// Every test above, each on a fresh backend from `open`.
#[macro_export]
macro_rules! suite_tests {
    ($open:expr) => {
        suite_tests!(@each $open;
            first_runs_then_repeats_replay,
            repeat_while_running_conflicts,
            repeat_while_running_waits,
            another_request_with_the_key_is_refused,
            a_missing_key,
            a_bad_key,
            a_server_error_frees_the_key,
            an_inner_error_frees_the_key,
            a_response_over_the_limit,
            keys_are_scoped_per_tenant,
            concurrent_identical_requests_run_once);
    };
    (@each $open:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() -> suite::TestResult {
                // Opened off the runtime's threads: a blocking client.
                let Some(backend) = tokio::task::spawn_blocking(|| $open(stringify!($name))).await?? else {
                    return Ok(());
                };
                suite::$name(backend).await
            }
        )*
    };
}
