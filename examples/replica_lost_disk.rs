//! A store that survives the loss of its disk: a synchronous replica in
//! object storage, restored on another machine.
//!
//! With `ReplicaMode::Synchronous` a call is acknowledged only once its
//! commit is in the object store, so a lost disk loses nothing that was
//! acknowledged. The next owner opens with the same replica and no local
//! file: the store is restored first, and taking it over fences the old
//! owner. A local directory stands in for the bucket (any `object_store`
//! backend works: S3, GCS, Azure).
//!
//! ```text
//! cargo run --example replica_lost_disk --features replica
//! ```

use std::sync::Arc;

use dedupkv::replica::object_store::local::LocalFileSystem;
use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{Key, Store};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let bucket = dir.path().join("bucket");
    std::fs::create_dir(&bucket)?;
    let objects = Arc::new(LocalFileSystem::new_with_prefix(&bucket)?);
    let replica = Replica::new(objects, "stores/orders-0").mode(ReplicaMode::Synchronous);

    let machine_a = dir.path().join("machine-a");
    std::fs::create_dir(&machine_a)?;
    {
        let store = Store::builder()
            .replica(replica.clone())
            .open(machine_a.join("orders.redb"))?;
        for id in ["evt-1", "evt-2", "evt-3"] {
            // Acknowledged: in the bucket when it returns.
            assert!(store.insert_if_absent(&Key::new("orders", id))?);
        }
    }
    std::fs::remove_dir_all(&machine_a)?; // the disk is gone

    let machine_b = dir.path().join("machine-b");
    std::fs::create_dir(&machine_b)?;
    let store = Store::builder()
        .replica(replica)
        .open(machine_b.join("orders.redb"))?;
    let status = store.replica_status().expect("opened with a replica");
    println!("restored: {:?}, epoch {}", status.restored, status.epoch);
    for id in ["evt-1", "evt-2", "evt-3"] {
        assert!(
            !store.insert_if_absent(&Key::new("orders", id))?,
            "{id} is still a duplicate"
        );
    }
    Ok(())
}
