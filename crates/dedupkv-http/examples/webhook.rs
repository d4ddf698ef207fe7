//! The payment webhook of issue #31 on two instances: two axum servers,
//! each with its own `PgStore` on one PostgreSQL schema, behind no load
//! balancer at all — every order's request is fired at both instances at
//! once with the same `Idempotency-Key`. The charge runs once per order
//! (0 double charges) and both clients get the first response.
//!
//! ```text
//! scripts/with-postgres.sh cargo run -p dedupkv-http --example webhook
//! ```
//! (`DEDUPKV_PG_URL` names the server; tests/webhook.rs runs the same.)

#![allow(clippy::doc_markdown)] // product names (PostgreSQL) are not code

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::routing::post;
use dedupkv_http::{IdempotencyLayer, WhileRunning};
use dedupkv_postgres::PgStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The payment provider: how many times each order was charged.
type Ledger = Arc<Mutex<HashMap<u32, u32>>>;

/// What the run saw.
#[derive(Debug, Default)]
pub struct Report {
    /// Orders sent (each to both instances).
    pub orders: u32,
    /// Orders charged more than once.
    pub double_charges: u32,
    /// Orders never charged.
    pub uncharged: u32,
    /// Orders whose two clients got different responses.
    pub different_answers: u32,
    /// Responses that were replays of the first.
    pub replays: u32,
}

/// One instance: the webhook route behind the layer, on its own store.
async fn instance(
    url: &str,
    schema: &str,
    name: &'static str,
    ledger: Ledger,
) -> Result<SocketAddr, BoxError> {
    // Opened off the runtime's threads: `postgres` is a blocking client.
    let (url, schema) = (url.to_owned(), schema.to_owned());
    let store =
        tokio::task::spawn_blocking(move || PgStore::builder(url).schema(schema).open()).await??;
    let app = Router::new()
        .route(
            "/orders/{id}/charge",
            post(move |Path(id): Path<u32>| async move {
                // The provider's call: the effect that must happen once.
                let n = {
                    let mut l = ledger
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let n = l.entry(id).or_insert(0);
                    *n += 1;
                    *n
                };
                format!("{{\"charge\":\"ch_{id}_{name}_{n}\"}}")
            }),
        )
        .route_layer(
            IdempotencyLayer::new(store)
                .require_key(true)
                .while_running(WhileRunning::Wait(Duration::from_secs(60))),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// One HTTP/1.1 request on its own connection: status, replayed, body.
async fn send(addr: SocketAddr, path: &str, key: &str) -> Result<(u16, bool, String), BoxError> {
    let mut s = TcpStream::connect(addr).await?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: {key}\r\n\
         content-length: 0\r\nconnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8(buf)?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no end of head")?;
    let status = head.split(' ').nth(1).ok_or("no status")?.parse()?;
    let head = head.to_ascii_lowercase();
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok((status, head.contains("idempotent-replayed: true"), body))
}

fn dechunk(mut s: &str) -> Result<String, BoxError> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").ok_or("bad chunk")?;
        let size = usize::from_str_radix(size.trim(), 16)?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).ok_or("short chunk")?);
        s = rest.get(size + 2..).ok_or("short chunk")?;
    }
}

/// Runs `orders` orders through both instances, `parallel` at a time.
pub async fn run(
    url: &str,
    schema: &str,
    orders: u32,
    parallel: usize,
) -> Result<Report, BoxError> {
    let ledger = Ledger::default();
    let a = instance(url, schema, "a", ledger.clone()).await?;
    let b = instance(url, schema, "b", ledger.clone()).await?;
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel));
    let mut tasks = Vec::new();
    for id in 0..orders {
        let permit = gate.clone().acquire_owned().await?;
        tasks.push(tokio::spawn(async move {
            let path = format!("/orders/{id}/charge");
            let key = format!("order-{id}");
            let both = tokio::join!(send(a, &path, &key), send(b, &path, &key));
            drop(permit);
            Ok::<_, BoxError>((both.0?, both.1?))
        }));
    }
    let mut report = Report {
        orders,
        ..Report::default()
    };
    for t in tasks {
        let ((s1, r1, b1), (s2, r2, b2)) = t.await??;
        if s1 != 200 || s2 != 200 || b1 != b2 {
            report.different_answers += 1;
        }
        report.replays += u32::from(r1) + u32::from(r2);
    }
    let ledger = ledger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for id in 0..orders {
        match ledger.get(&id).copied().unwrap_or(0) {
            0 => report.uncharged += 1,
            1 => {}
            _ => report.double_charges += 1,
        }
    }
    Ok(report)
}

#[allow(dead_code)] // tests/webhook.rs includes this file for `run`
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DEDUPKV_PG_URL")
        .map_err(|_| "DEDUPKV_PG_URL is not set: run under scripts/with-postgres.sh")?;
    let schema = format!("webhook_{}", std::process::id());
    let report = run(&url, &schema, 500, 16).await?;
    println!("{report:#?}");
    if report.double_charges + report.uncharged + report.different_answers > 0 {
        return Err(format!("the webhook did not hold: {report:?}").into());
    }
    Ok(())
}
