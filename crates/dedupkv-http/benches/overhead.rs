//! The layer's overhead over a bare handler, per request, in one run
//! (docs/performance.md): medians of, interleaved request by request,
//!
//! - `bare`: the axum route without the layer;
//! - `layer, first`: the route behind the layer, a new key each time
//!   (claim, handler, store the response);
//! - `layer, replay`: a key seen before (one `begin` answering the stored
//!   response; the handler does not run);
//! - the backend alone, called from a plain thread: `begin` + `complete`
//!   of a new key, and `begin` of a completed key — the round trips the
//!   layer cannot avoid.
//!
//! Over the embedded store (Immediate durability, a temp dir; set
//! `DEDUPKV_BENCH_DIR` to choose where) and, when `DEDUPKV_PG_URL` is set
//! (scripts/with-postgres.sh), over PostgreSQL.
//!
//! `scripts/with-postgres.sh cargo bench -p dedupkv-http --bench overhead`
//! (`DEDUPKV_HTTP_OPS` requests per variant, default 1000).
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::doc_markdown
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use dedupkv::contract::Outcome;
use dedupkv::{Began, BeginOptions, Fingerprint, Key};
use dedupkv_http::{Backend, IdempotencyLayer};
use http_body_util::BodyExt;
use tower::ServiceExt;

fn router() -> Router {
    Router::new().route(
        "/charge",
        post(|body: String| async move { format!("charged {body}") }),
    )
}

fn req(key: &str) -> http::Request<Body> {
    http::Request::post("/charge")
        .header("idempotency-key", key)
        .body(Body::from("100 EUR"))
        .unwrap()
}

async fn timed(app: &Router, key: &str) -> Duration {
    let t = Instant::now();
    let res = app.clone().oneshot(req(key)).await.unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let d = t.elapsed();
    assert!(!body.is_empty());
    d
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn measure<B: Backend>(name: &str, backend: B, ops: usize, rt: &tokio::runtime::Runtime) {
    let backend = Arc::new(backend);
    let bare = router();
    let layered = router().route_layer(IdempotencyLayer::shared(backend.clone()));
    let (mut t_bare, mut t_first, mut t_replay, mut t_bc, mut t_b) =
        (vec![], vec![], vec![], vec![], vec![]);
    rt.block_on(async {
        // Warm up: connections, pages, code.
        for i in 0..20 {
            timed(&layered, &format!("warm-{i}")).await;
        }
    });
    for i in 0..ops {
        let key = format!("first-{i}");
        t_bare.push(rt.block_on(timed(&bare, &key)));
        t_first.push(rt.block_on(timed(&layered, &key)));
        t_replay.push(rt.block_on(timed(&layered, &key)));
        // The backend alone, from this (non-runtime) thread.
        let k = format!("direct-{i}");
        let key = Key::new("bench", &k);
        let t = Instant::now();
        let p = backend
            .begin(&key, Fingerprint::NONE, &BeginOptions::new(), None)
            .unwrap();
        let Began::Started(claim) = backend.tell(p).unwrap() else {
            panic!("fresh key")
        };
        backend
            .tell(
                backend
                    .complete(&claim, Outcome::raw(b"charged 100 EUR"))
                    .unwrap(),
            )
            .unwrap();
        t_bc.push(t.elapsed());
        let t = Instant::now();
        let p = backend
            .begin(&key, Fingerprint::NONE, &BeginOptions::new(), None)
            .unwrap();
        assert!(matches!(backend.tell(p).unwrap(), Began::Completed(_)));
        t_b.push(t.elapsed());
    }
    let (bare, first, replay, bc, b) = (
        median(t_bare),
        median(t_first),
        median(t_replay),
        median(t_bc),
        median(t_b),
    );
    println!("\n{name}: medians of {ops} requests each (µs)");
    println!("| path | median µs | over bare µs | backend alone µs | layer's own µs |");
    println!("|---|---:|---:|---:|---:|");
    println!("| bare handler | {:.1} | — | — | — |", us(bare));
    let first_over = us(first) - us(bare);
    println!(
        "| layer, first request (begin + handler + complete) | {:.1} | {:.1} | {:.1} (begin + complete) | {:.1} |",
        us(first),
        first_over,
        us(bc),
        first_over - us(bc)
    );
    let replay_over = us(replay) - us(bare);
    println!(
        "| layer, replay (begin answers Completed) | {:.1} | {:.1} | {:.1} (begin) | {:.1} |",
        us(replay),
        replay_over,
        us(b),
        replay_over - us(b)
    );
    let hops: Vec<Duration> = (0..ops)
        .map(|_| {
            let t = Instant::now();
            rt.block_on(async { tokio::task::spawn_blocking(|| ()).await.unwrap() });
            t.elapsed()
        })
        .collect();
    println!(
        "| (a `spawn_blocking` hop alone, from the runtime) | {:.1} | — | — | — |",
        us(median(hops))
    );
    // The last handle off the runtime (postgres's client).
    drop(layered);
    drop(backend);
}

fn main() {
    let ops: usize = std::env::var("DEDUPKV_HTTP_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = match std::env::var("DEDUPKV_BENCH_DIR") {
        Ok(d) => tempfile::tempdir_in(d).unwrap(),
        Err(_) => tempfile::tempdir().unwrap(),
    };
    let store = dedupkv::Store::open(dir.path().join("http.redb")).unwrap();
    measure("embedded store (Immediate)", store, ops, &rt);
    match std::env::var("DEDUPKV_PG_URL") {
        Ok(url) => {
            let schema = format!("http_bench_{}", std::process::id());
            let pg = dedupkv_postgres::PgStore::builder(url)
                .schema(schema)
                .open()
                .unwrap();
            measure("PostgreSQL (synchronous_commit=on, loopback)", pg, ops, &rt);
        }
        Err(_) => println!(
            "\nPostgreSQL skipped: DEDUPKV_PG_URL is not set (run under scripts/with-postgres.sh)"
        ),
    }
}
