//! `dedupkv replica status|inspect|restore`: a replica in a bucket (a
//! local directory, `--dir`, or an object store URL, `--url s3://…`).
//! `status` and `inspect` read it through `ReplicaReader` without taking
//! ownership — they never write an owner object and never fence anybody;
//! `restore` makes a store from it and takes ownership, only with
//! `--take-ownership`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use clap::Args;
use dedupkv::replica::object_store::ObjectStore;
use dedupkv::replica::object_store::local::LocalFileSystem;
use dedupkv::replica::{Replica, ReplicaReader, ReplicaSummary};
use dedupkv::{Key, Store};
use serde_json::{Value, json};

use crate::show;

/// Where the replica is: every `replica` command takes these.
#[derive(Args)]
pub struct Bucket {
    /// The directory that holds the bucket (a local-filesystem object store).
    #[arg(long, required_unless_present = "url", conflicts_with = "url")]
    dir: Option<PathBuf>,
    /// The bucket as a URL: `s3://BUCKET` (credentials, region and endpoint
    /// from the usual `AWS_*` variables: `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`), or
    /// `file:///DIR`.
    #[arg(long)]
    url: Option<String>,
    /// The replica's prefix in the bucket (the one given to `Replica::new`).
    #[arg(long)]
    prefix: String,
}

impl Bucket {
    /// The object store the replica is in.
    fn objects(&self) -> Result<Arc<dyn ObjectStore>, String> {
        let local = |dir: &std::path::Path| -> Result<Arc<dyn ObjectStore>, String> {
            if !dir.is_dir() {
                return Err(format!("{}: no such directory", dir.display()));
            }
            let fs = LocalFileSystem::new_with_prefix(dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            Ok(Arc::new(fs))
        };
        match (&self.dir, &self.url) {
            (Some(dir), _) => local(dir),
            (None, Some(url)) => {
                if let Some(dir) = url.strip_prefix("file://") {
                    return local(std::path::Path::new(dir));
                }
                if url.starts_with("s3://") || url.starts_with("s3a://") {
                    return s3(url);
                }
                Err(format!(
                    "{url}: not a bucket URL this tool reads (s3://BUCKET or file:///DIR)"
                ))
            }
            (None, None) => Err("give the bucket: --dir DIR or --url s3://BUCKET".into()),
        }
    }

    /// What the bucket holds of the replica, read without owning it.
    fn summary(&self) -> Result<(ReplicaReader, ReplicaSummary), String> {
        let reader = ReplicaReader::new(self.objects()?, &self.prefix);
        let s = reader.summary().map_err(|e| e.to_string())?;
        Ok((reader, s))
    }
}

/// An S3 bucket (or an S3 API: `AWS_ENDPOINT`) from its URL and the
/// `AWS_*` variables; conditional puts by `ETag`, which ownership needs.
#[cfg(feature = "s3")]
fn s3(url: &str) -> Result<Arc<dyn ObjectStore>, String> {
    use dedupkv::replica::object_store::aws::{AmazonS3Builder, S3ConditionalPut};
    let s3 = AmazonS3Builder::from_env()
        .with_url(url)
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .build()
        .map_err(|e| format!("{url}: {e}"))?;
    Ok(Arc::new(s3))
}

#[cfg(not(feature = "s3"))]
fn s3(url: &str) -> Result<Arc<dyn ObjectStore>, String> {
    Err(format!(
        "{url}: this dedupkv was built without S3 (the dedupkv-cli feature `s3`, on by default)"
    ))
}

/// `replica status`'s arguments.
#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    bucket: Bucket,
    /// One JSON value on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `replica restore`'s arguments.
#[derive(Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    bucket: Bucket,
    /// The store file to make (refused if it exists).
    #[arg(long)]
    to: PathBuf,
    /// Take ownership of the replica: its owner now is fenced (every call
    /// it makes fails with `Fenced`) and the new store ships to the
    /// replica from here on. Without it, nothing happens (for a copy that
    /// takes nothing, use `replica inspect --copy PATH`).
    #[arg(long)]
    take_ownership: bool,
    /// The label the new owner writes in the owner object.
    #[arg(long, default_value = "dedupkv-cli")]
    owner_label: String,
    /// One JSON value on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `replica inspect`'s arguments.
#[derive(Args)]
pub struct InspectArgs {
    #[command(flatten)]
    bucket: Bucket,
    /// Also show this key's record (needs ID): read from a copy of the
    /// replica restored into a scratch file, deleted afterwards.
    #[arg(long, requires = "id")]
    scope: Option<String>,
    /// The key's id.
    id: Option<String>,
    /// Keep the restored copy at this new path (refused if it exists).
    #[arg(long)]
    copy: Option<PathBuf>,
    /// One JSON value on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The replica's summary: owner, epoch, newest segment and its age (the
/// lag), newest snapshot. Reads only.
pub fn status(args: &StatusArgs) -> Result<Value, String> {
    Ok(summary_json(&args.bucket.summary()?.1, SystemTime::now()))
}

/// Makes a store at `--to` from the replica and takes ownership of it,
/// only with `--take-ownership`.
pub fn restore(args: &RestoreArgs) -> Result<Value, String> {
    if !args.take_ownership {
        return Err(format!(
            "restoring {} takes ownership of the replica and fences its current owner \
             (its calls fail with Fenced from then on): add --take-ownership to do that, \
             or use `dedupkv replica inspect --copy PATH` for a copy that takes nothing",
            args.bucket.prefix
        ));
    }
    if args.to.exists() {
        return Err(format!(
            "{}: exists; restore makes a new file (move the old one away first)",
            args.to.display()
        ));
    }
    let replica =
        Replica::new(args.bucket.objects()?, &args.bucket.prefix).owner_label(&args.owner_label);
    let store = Store::builder()
        .replica(replica)
        .open(&args.to)
        .map_err(|e| format!("{}: {e}", args.to.display()))?;
    let status = store.replica_status();
    let keys = store.stats().keys;
    store
        .flush()
        .map_err(|e| format!("{}: {e}", args.to.display()))?;
    drop(store);
    let restored = status.as_ref().and_then(|s| s.restored.as_ref());
    Ok(json!({
        "path": args.to.display().to_string(),
        "epoch": status.as_ref().map(|s| s.epoch),
        "keys": keys,
        "records": restored.map(|r| r.records),
        "segments": restored.map(|r| r.segments),
        "bytes": restored.map(|r| r.bytes),
    }))
}

fn summary_json(s: &ReplicaSummary, now: SystemTime) -> Value {
    json!({
        "prefix": s.prefix,
        "objects": s.objects,
        "epoch": s.epoch,
        "owner": s.owner,
        "owner_since": s.owner_since.map(|t| show::time(t, now)),
        "last_segment": s.last_segment,
        "last_segment_epoch": s.last_segment_epoch,
        "last_segment_written": s.last_segment_written.map(|t| show::time(t, now)),
        "lag": s.last_segment_age.map(show::human),
        "snapshot": s.snapshot,
    })
}

/// Inspects the replica: its summary, and with a key or `--copy`, a copy.
pub fn inspect(args: &InspectArgs) -> Result<Value, String> {
    let now = SystemTime::now();
    let (reader, s) = args.bucket.summary()?;
    let mut v = summary_json(&s, now);
    let wants_key = args.scope.as_ref().zip(args.id.as_ref());
    if wants_key.is_none() && args.copy.is_none() {
        return Ok(v);
    }
    let scratch = args.copy.is_none();
    let path = args.copy.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("dedupkv-inspect-{}.redb", std::process::id()))
    });
    let copy = reader.copy_to(&path).map_err(|e| e.to_string());
    let result = copy.and_then(|c| {
        v["copy"] = json!({
            "path": path.display().to_string(),
            "records": c.records,
            "segments": c.segments,
            "bytes": c.bytes,
        });
        if let Some((scope, id)) = wants_key {
            let record = c
                .store
                .get(&Key::new(scope, id))
                .map_err(|e| e.to_string())?;
            v["record"] = record.map_or(Value::Null, |r| show::record(&r, now));
        }
        Ok(())
    });
    if scratch {
        let _ = std::fs::remove_file(&path);
    }
    result.map(|()| v)
}
