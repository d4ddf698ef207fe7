//! The store behind the command line's timings in docs/performance.md:
//! `build PATH N` makes a store of N inserted keys (`bench`/`k{i}`) and one
//! key with a history (`bench`/`order-4711`: a released attempt, then a
//! completed one); `serve PATH` holds it with a live admin endpoint and
//! keeps inserting keys (`live`/`w{i}`, a batch of 100 every 10 ms) until
//! killed, so `dedupkv` reads it through the endpoint while it takes
//! writes.
//!
//! ```sh
//! cargo run --release -p dedupkv-cli --no-default-features --example big_store -- build /tmp/big.redb 10000000
//! ```

use std::time::Duration;

use dedupkv::admin::AdminOptions;
use dedupkv::{Begin, Failure, Fingerprint, Key, Store};

/// Keys per commit while building.
const BATCH: u64 = 10_000;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["build", path, n] => build(path, n.parse()?),
        ["serve", path] => serve(path),
        _ => Err("usage: big_store build PATH N | big_store serve PATH".into()),
    }
}

fn build(path: &str, n: u64) -> Result<()> {
    let store = Store::builder().open(path)?;
    let key = Key::new("bench", "order-4711");
    if let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? {
        store.fail(&c, Failure::Retryable)?;
    }
    let mut ids = Vec::with_capacity(BATCH as usize);
    for start in (0..n).step_by(BATCH as usize) {
        ids.clear();
        ids.extend((start..(start + BATCH).min(n)).map(|i| format!("k{i}")));
        let keys: Vec<Key<'_>> = ids.iter().map(|id| Key::new("bench", id)).collect();
        store.insert_batch(&keys)?;
    }
    if let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? {
        store.complete(&c, b"charged")?;
    }
    eprintln!("{path}: {n} keys");
    Ok(())
}

fn serve(path: &str) -> Result<()> {
    let store = Store::builder()
        .admin_socket(AdminOptions::new())
        .open_existing(path)?;
    eprintln!(
        "{path}: serving {}",
        dedupkv::admin::socket_path(path).display()
    );
    for round in 0u64.. {
        let ids: Vec<String> = (0..100).map(|i| format!("w{}", round * 100 + i)).collect();
        let keys: Vec<Key<'_>> = ids.iter().map(|id| Key::new("live", id)).collect();
        store.insert_batch(&keys)?;
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
