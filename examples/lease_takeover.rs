//! Leases and fencing: a worker that stalls past its lease loses the
//! operation to the next attempt, and its late result is refused.
//!
//! While the first attempt runs, a repeat is told "in progress" (with the
//! time the lease ends). Once the lease lapses, the next `begin` takes the
//! operation over with a higher fencing token; the stalled worker's
//! `complete` then fails with `ClaimLost`, so a zombie can never overwrite
//! the attempt that replaced it. A manual clock stands in for waiting.
//!
//! ```text
//! cargo run --example lease_takeover
//! ```

use std::time::Duration;

use dedupkv::{Begin, Error, Fingerprint, Key, ManualClock, Store};

fn main() -> dedupkv::Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let clock = ManualClock::new(1_700_000_000_000);
    let store = Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .open(dir.path().join("jobs.redb"))?;
    let key = Key::new("reports", "monthly-2026-11");

    let Begin::Started(stalled) = store.begin(&key, Fingerprint::NONE)? else {
        unreachable!("a new key")
    };
    // A redelivery while the first attempt runs: not a second start.
    let Begin::InProgress(info) = store.begin(&key, Fingerprint::NONE)? else {
        unreachable!("the lease is live")
    };
    println!("in progress until {:?}", info.lease_expires_at());

    // The first worker stalls (a GC pause, a hung call) past its lease.
    clock.advance(Duration::from_secs(31));
    let Begin::Started(next) = store.begin(&key, Fingerprint::NONE)? else {
        unreachable!("the lease lapsed: taken over")
    };
    assert_eq!(next.attempt(), 2);
    assert!(next.token() > stalled.token(), "fencing tokens only grow");

    // The zombie wakes up and tries to publish: fenced.
    match store.complete(&stalled, b"stale report") {
        Err(Error::ClaimLost { .. }) => println!("the stalled worker's result was refused"),
        other => panic!("expected ClaimLost, got {other:?}"),
    }
    store.complete(&next, b"report v2")?;
    let Begin::Completed(record) = store.begin(&key, Fingerprint::NONE)? else {
        unreachable!("done")
    };
    assert_eq!(record.outcome(), Some(&b"report v2"[..]));
    Ok(())
}
