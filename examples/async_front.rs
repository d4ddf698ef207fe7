//! The async front: the same store from async tasks, with futures that
//! never block an executor thread.
//!
//! Eight tasks receive the same webhook at once. Exactly one is told to
//! handle it; `begin_or_wait` makes the others wait for that attempt's
//! outcome and hand it back, as a webhook endpoint answers a retried
//! request with the first response.
//!
//! ```text
//! cargo run --example async_front
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dedupkv::{AsyncStore, Begin, Fingerprint, Key, Store};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> dedupkv::Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = AsyncStore::new(Store::open(dir.path().join("webhooks.redb"))?);
    let handled = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (store, handled) = (store.clone(), Arc::clone(&handled));
        tasks.push(tokio::spawn(async move {
            let key = Key::new("psp", "evt_42");
            let body = Fingerprint::of("payment_intent.succeeded pi_1");
            match store
                .begin_or_wait(&key, body, Duration::from_secs(5))
                .await?
            {
                Begin::Started(claim) => {
                    handled.fetch_add(1, Ordering::SeqCst); // handle the event
                    store.complete(&claim, b"200 OK").await?;
                    Ok::<_, dedupkv::Error>(b"200 OK".to_vec())
                }
                Begin::Completed(record) => Ok(record.outcome().unwrap_or_default().to_vec()),
                other => panic!("waited for the outcome: {other:?}"),
            }
        }));
    }
    for task in tasks {
        let response = task.await.expect("the task ran")?;
        assert_eq!(response, b"200 OK");
    }
    assert_eq!(handled.load(Ordering::SeqCst), 1, "handled once");
    println!("8 deliveries, handled once, every one answered 200 OK");
    Ok(())
}
