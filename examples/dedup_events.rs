//! Processed-events deduplication: record each event id before handling it,
//! and handle it only if it was new.
//!
//! A queue delivers at least once: here every event arrives twice, and a
//! batch of redeliveries arrives in one call. Each id is recorded durably
//! by an atomic insert-if-absent before the handler runs, so the handler
//! runs once per event, also across a restart of the consumer.
//!
//! ```text
//! cargo run --example dedup_events
//! ```

use dedupkv::{Key, Store};

fn main() -> dedupkv::Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("events.redb");
    let mut handled = Vec::new();
    {
        let store = Store::open(&path)?;
        for id in ["evt_1", "evt_2", "evt_1", "evt_3", "evt_2"] {
            // Durable before it answers `true`: handle only then.
            if store.insert_if_absent(&Key::new("orders", id))? {
                handled.push(id);
            }
        }
        // A redelivered batch: one durable commit, one answer per key.
        let ids = ["evt_3", "evt_4"];
        let batch: Vec<Key<'_>> = ids.iter().map(|id| Key::new("orders", *id)).collect();
        for (id, new) in ids.into_iter().zip(store.insert_batch(&batch)?) {
            if new {
                handled.push(id);
            }
        }
    }
    // The consumer restarts: the store remembers what it handled.
    let store = Store::open(&path)?;
    assert!(!store.insert_if_absent(&Key::new("orders", "evt_4"))?);
    assert_eq!(handled, ["evt_1", "evt_2", "evt_3", "evt_4"]);
    println!("handled once each: {handled:?}");
    Ok(())
}
