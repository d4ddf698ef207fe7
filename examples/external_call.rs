//! An effect that leaves the system, made exactly once: a carrier call
//! with a provider idempotency key, retried with backoff, and
//! dead-lettered when the carrier keeps refusing.
//!
//! `RetryPolicy::call` records the intent before the call, passes the
//! claim's `provider_key()` (the same on every attempt) to the carrier,
//! asks the carrier first when an earlier attempt's answer is unknown, and
//! completes with the carrier's reference. Here the first answer is lost
//! (a timeout after the carrier accepted): the retry asks, finds the label
//! and does not ship again. An address the carrier always rejects ends in
//! the dead-letter area with the carrier's reason.
//!
//! ```text
//! cargo run --example external_call
//! ```

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use dedupkv::{Effect, ErrorClass, Fingerprint, Intent, Key, Listing, RetryPolicy, Run, Store};

/// A carrier that deduplicates on the idempotency key.
#[derive(Default)]
struct Carrier {
    labels: RefCell<HashMap<String, String>>,
    /// Lose the answer to the next accepted call (a timeout after the write).
    lose_next_answer: Cell<bool>,
}

#[derive(Debug)]
enum CarrierError {
    Timeout,
    BadAddress,
}

impl std::fmt::Display for CarrierError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Timeout => "no answer from the carrier",
            Self::BadAddress => "the carrier rejects the address",
        })
    }
}

impl Carrier {
    fn lookup(&self, idempotency_key: &str) -> Option<Vec<u8>> {
        self.labels
            .borrow()
            .get(idempotency_key)
            .map(|l| l.clone().into_bytes())
    }

    fn ship(&self, idempotency_key: String, address: &str) -> Result<Vec<u8>, CarrierError> {
        if address.is_empty() {
            return Err(CarrierError::BadAddress);
        }
        let mut labels = self.labels.borrow_mut();
        let n = labels.len() + 1;
        let label = labels
            .entry(idempotency_key)
            .or_insert(format!("1Z{n:03}"))
            .clone();
        if self.lose_next_answer.replace(false) {
            return Err(CarrierError::Timeout);
        }
        Ok(label.into_bytes())
    }
}

fn ship_order(
    store: &Store,
    policy: &RetryPolicy,
    carrier: &Carrier,
    order: &str,
    address: &str,
) -> dedupkv::Result<Run<Vec<u8>, CarrierError>> {
    let request = format!("{order} to {address:?}");
    let effect = Effect::new(
        Intent {
            target: "carrier",
            request: request.as_bytes(),
        },
        |claim| Ok(carrier.lookup(&claim.provider_key().expect("kept"))),
        |claim| carrier.ship(claim.provider_key().expect("kept"), address),
        |e: &CarrierError| match e {
            CarrierError::Timeout => ErrorClass::Unanswered,
            CarrierError::BadAddress => ErrorClass::Retryable,
        },
    );
    let key = Key::new("shop-42", order);
    policy.call(store, &key, Fingerprint::of(request.as_bytes()), effect)
}

fn main() -> dedupkv::Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = Store::open(dir.path().join("shipping.redb"))?;
    let policy = RetryPolicy::builder()
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(5))
        .max_attempts(3)
        .build()?;
    let carrier = Carrier::default();

    // The carrier accepts, but its answer is lost.
    carrier.lose_next_answer.set(true);
    let first = ship_order(&store, &policy, &carrier, "order-7", "12 Harbour Road")?;
    let Run::RetryAfter { after, .. } = first else {
        panic!("an unknown answer is retried: {first:?}")
    };
    std::thread::sleep(after);
    // The retry asks the carrier first, finds the label, ships nothing.
    let second = ship_order(&store, &policy, &carrier, "order-7", "12 Harbour Road")?;
    assert!(matches!(second, Run::Reconciled(ref label) if label == b"1Z001"));
    assert_eq!(carrier.labels.borrow().len(), 1, "shipped once");

    // A refused address: retried under the policy, then dead-lettered.
    loop {
        match ship_order(&store, &policy, &carrier, "order-8", "")? {
            Run::RetryAfter { after, .. } => std::thread::sleep(after),
            Run::GaveUp { .. } | Run::Exhausted { .. } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    let dead = store.dead_letters(&Listing::default())?;
    assert_eq!(dead.items.len(), 1);
    println!("dead letter: {}", dead.items[0].reason());
    Ok(())
}
