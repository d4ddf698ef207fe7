//! `dedupkv replica inspect` beside the replica's owner: it shows the
//! owner, epoch and lag and a key's record, writes nothing to the bucket,
//! and the owner is never fenced: it keeps acknowledging.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use dedupkv::replica::object_store::ObjectStore;
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

/// The owner's object store, the tool's `--url` for it, and the
/// environment the tool runs with.
type SharedBucket = (Arc<dyn ObjectStore>, String, Vec<(String, String)>);

/// The object store the owner ships to, and the `--url` the tool reads it
/// at: an S3 API when `DEDUPKV_S3_ENDPOINT` is set (scripts/with-s3.sh,
/// as in CI), else a local directory as a `file://` URL. With S3 the tool
/// gets its endpoint and credentials from the AWS_* variables, as a user's
/// would.
fn shared_bucket(dir: &Path) -> Result<SharedBucket, Box<dyn std::error::Error>> {
    if let Ok(endpoint) = std::env::var("DEDUPKV_S3_ENDPOINT") {
        use dedupkv::replica::object_store::aws::AmazonS3Builder;
        let bucket = std::env::var("DEDUPKV_S3_BUCKET").unwrap_or_else(|_| "dedupkv-test".into());
        let s3 = AmazonS3Builder::new()
            .with_endpoint(&endpoint)
            .with_allow_http(true)
            .with_bucket_name(&bucket)
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .build()?;
        let env = [
            ("AWS_ENDPOINT", endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ];
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        return Ok((Arc::new(s3), format!("s3://{bucket}"), env));
    }
    let b = dir.join("bucket");
    std::fs::create_dir(&b)?;
    let url = format!("file://{}", b.display());
    Ok((
        Arc::new(LocalFileSystem::new_with_prefix(&b)?),
        url,
        Vec::new(),
    ))
}

fn dedupkv_env(args: &[&str], env: &[(String, String)]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_dedupkv"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
}

/// A prefix no other run of this test shares (one S3 bucket serves all).
fn unique_prefix(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("cli/{name}-{}-{nanos}", std::process::id())
}

#[test]
fn status_reads_the_bucket_at_a_url_and_restore_takes_over_only_when_told() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (objects, url, env) = shared_bucket(dir.path())?;
    let prefix = unique_prefix("restore");
    let owner = Store::builder()
        .replica(
            Replica::new(objects, &prefix)
                .mode(ReplicaMode::Synchronous)
                .owner_label("consumer-3"),
        )
        .open(dir.path().join("live.redb"))?;
    owner.insert_if_absent(&Key::new("orders", "4711"))?;

    let out = dedupkv_env(
        &[
            "replica", "status", "--url", &url, "--prefix", &prefix, "--json",
        ],
        &env,
    )?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["epoch"], 1, "{v}");
    assert_eq!(v["owner"], "consumer-3", "{v}");

    // Without --take-ownership: refused, saying how, and nothing happens.
    let to = dir.path().join("restored.redb");
    let to_s = to.to_str().ok_or("path")?;
    let out = dedupkv_env(
        &[
            "replica", "restore", "--url", &url, "--prefix", &prefix, "--to", to_s,
        ],
        &env,
    )?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)?.contains("--take-ownership"));
    assert!(!to.exists(), "a refused restore made a file");
    assert!(
        owner.insert_if_absent(&Key::new("orders", "4712"))?,
        "a refused restore fenced the owner"
    );

    // With it: the new file holds the owner's keys, and the owner is fenced.
    let out = dedupkv_env(
        &[
            "replica",
            "restore",
            "--url",
            &url,
            "--prefix",
            &prefix,
            "--to",
            to_s,
            "--take-ownership",
            "--json",
        ],
        &env,
    )?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["epoch"], 2, "{v}");
    assert_eq!(v["keys"], 2, "{v}");
    let copy = Store::open_read_only(&to)?;
    assert!(copy.get(&Key::new("orders", "4712"))?.is_some());
    drop(copy);
    assert!(
        matches!(
            owner.insert_if_absent(&Key::new("orders", "4713")),
            Err(dedupkv::Error::Fenced(_))
        ),
        "the old owner still writes after a restore took its replica over"
    );

    // A second restore onto the same path is refused, naming it.
    let out = dedupkv_env(
        &[
            "replica",
            "restore",
            "--url",
            &url,
            "--prefix",
            &prefix,
            "--to",
            to_s,
            "--take-ownership",
        ],
        &env,
    )?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)?.contains(to_s));
    // An unknown scheme says which it takes.
    let out = dedupkv(&["replica", "status", "--url", "ftp://x", "--prefix", "p"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)?.contains("s3://"));
    Ok(())
}

#[test]
fn stats_through_the_live_endpoint_show_the_owners_replica() -> TestResult {
    let dir = tempfile::tempdir()?;
    let bucket_dir = dir.path().join("bucket");
    std::fs::create_dir(&bucket_dir)?;
    let objects = Arc::new(LocalFileSystem::new_with_prefix(&bucket_dir)?);
    let path = dir.path().join("live.redb");
    let owner = Store::builder()
        .replica(Replica::new(objects, "stores/orders-1").mode(ReplicaMode::Synchronous))
        .admin_socket(dedupkv::admin::AdminOptions::new())
        .open(&path)?;
    owner.insert_if_absent(&Key::new("orders", "1"))?;
    let out = dedupkv(&["stats", "--store", path.to_str().ok_or("path")?, "--json"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["replica"]["epoch"], 1, "{v}");
    assert_eq!(v["replica"]["fenced"], false, "{v}");
    assert_eq!(v["replica"]["upload_failures"], 0, "{v}");
    assert!(v["replica"]["last_segment"].is_u64(), "{v}");
    Ok(())
}
