//! An idempotent operation with a stored, typed outcome.
//!
//! `begin` claims the operation key durably before the work runs; the
//! first attempt completes it with its outcome (any `serde` type); every
//! repeat gets that outcome back instead of running again. A repeat with
//! different content under the same key (another amount for the same
//! charge id) is refused by its fingerprint, not replayed.
//!
//! ```text
//! cargo run --example stored_outcome
//! ```

use dedupkv::{Begin, Error, Fingerprint, Key, Store};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    cents: u64,
}

fn charge(store: &Store, id: &str, cents: u64, calls: &mut u32) -> dedupkv::Result<Receipt> {
    let key = Key::new("shop-42", id);
    match store.begin(&key, Fingerprint::of(cents.to_le_bytes()))? {
        Begin::Started(claim) => {
            *calls += 1; // the side effect: charge the card
            let receipt = Receipt {
                charge_id: format!("ch_{calls}"),
                cents,
            };
            store.complete_value(&claim, &receipt)?;
            Ok(receipt)
        }
        Begin::Completed(record) => record.outcome_as(),
        other => panic!("a single caller sees no other answer: {other:?}"),
    }
}

fn main() -> dedupkv::Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = Store::open(dir.path().join("charges.redb"))?;
    let mut calls = 0;
    let first = charge(&store, "charge-7", 10_000, &mut calls)?;
    let again = charge(&store, "charge-7", 10_000, &mut calls)?;
    assert_eq!(first, again, "the repeat replays the first receipt");
    assert_eq!(calls, 1, "the card was charged once");
    // The same key with other content: a client bug, not a retry.
    match charge(&store, "charge-7", 99_900, &mut calls) {
        Err(Error::FingerprintMismatch { .. }) => {}
        other => panic!("expected a fingerprint mismatch, got {other:?}"),
    }
    println!("charged once: {first:?}");
    Ok(())
}
