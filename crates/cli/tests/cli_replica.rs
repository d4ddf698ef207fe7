//! `dedupkv replica inspect` beside the replica's owner: it shows the
//! owner, epoch and lag and a key's record, writes nothing to the bucket,
//! and the owner is never fenced: it keeps acknowledging.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use dedupkv::replica::object_store::local::LocalFileSystem;
use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{Key, Store};
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn dedupkv(args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_dedupkv"))
        .args(args)
        .output()
}

/// Every file under `dir` with its bytes.
fn bucket(dir: &Path) -> std::io::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p.display().to_string(), std::fs::read(&p)?);
            }
        }
    }
    Ok(out)
}

#[test]
fn inspect_reads_the_replica_and_never_fences_its_owner() -> TestResult {
    let dir = tempfile::tempdir()?;
    let bucket_dir = dir.path().join("bucket");
    std::fs::create_dir(&bucket_dir)?;
    let objects = Arc::new(LocalFileSystem::new_with_prefix(&bucket_dir)?);
    let replica = Replica::new(objects, "stores/orders-0")
        .mode(ReplicaMode::Synchronous)
        .owner_label("consumer-7");
    let owner = Store::builder()
        .replica(replica)
        .open(dir.path().join("live.redb"))?;
    owner.insert_if_absent(&Key::new("orders", "4711"))?;
    let before = bucket(&bucket_dir)?;
    let b = bucket_dir.to_str().ok_or("path")?;

    let out = dedupkv(&[
        "replica",
        "inspect",
        "--dir",
        b,
        "--prefix",
        "stores/orders-0",
        "--json",
    ])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["epoch"], 1);
    assert_eq!(v["owner"], "consumer-7");
    assert!(v["lag"].is_string(), "{v}");

    let args = [
        "replica",
        "inspect",
        "--dir",
        b,
        "--prefix",
        "stores/orders-0",
        "--scope",
        "orders",
        "4711",
        "--json",
    ];
    let out = dedupkv(&args)?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["record"]["state"], "Inserted");

    assert_eq!(bucket(&bucket_dir)?, before, "inspect wrote to the bucket");
    // The owner keeps acknowledging: nobody took its replica over.
    assert!(owner.insert_if_absent(&Key::new("orders", "4712"))?);
    // A wrong prefix is an error naming it.
    let out = dedupkv(&["replica", "inspect", "--dir", b, "--prefix", "nope"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)?.contains("nope"));
    Ok(())
}
