//! Per-entity order: stale updates rejected by version, and early events
//! held until their predecessor lands (never dropped).
//!
//! `advance` compares an update's version with the entity's and records
//! the newer one atomically, so a delayed older update cannot overwrite a
//! newer state. `sequence` feeds a gapless per-entity sequence: an event
//! that arrives before its predecessor is parked and handed back, in
//! order, with the predecessor; handed-back events stay stored until
//! acknowledged.
//!
//! ```text
//! cargo run --example entity_order
//! ```

use dedupkv::{Advance, Key, Sequenced, Store};

fn main() -> dedupkv::Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = Store::open(dir.path().join("entities.redb"))?;

    // Versions: the update of version 4 arrives after version 5.
    let order = Key::new("shop-42", "order-7");
    for version in [3, 5, 4, 5] {
        match store.advance(&order, version)? {
            Advance::Applied { previous } => println!("v{version} applied (was {previous:?})"),
            Advance::Stale { current } => println!("v{version} stale: the order is at v{current}"),
            Advance::Duplicate => println!("v{version} seen before"),
            other => println!("v{version}: {other:?}"),
        }
    }
    assert_eq!(store.advance(&order, 4)?, Advance::Stale { current: 5 });

    // A sequence: event 2 arrives first, and waits for event 1.
    let account = Key::new("bank", "acct-1");
    assert_eq!(store.sequence(&account, 2, b"debit 30")?, Sequenced::Parked);
    let Sequenced::Delivered(events) = store.sequence(&account, 1, b"credit 100")? else {
        unreachable!("1 is the next expected event")
    };
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2], "handed back in order");
    for e in &events {
        println!("apply #{}: {}", e.seq, String::from_utf8_lossy(&e.payload));
    }
    // Handled: acknowledge through 2; a redelivery is now a duplicate.
    store.ack(&account, 2)?;
    assert_eq!(
        store.sequence(&account, 1, b"credit 100")?,
        Sequenced::Duplicate
    );
    Ok(())
}
