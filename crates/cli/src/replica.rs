//! `dedupkv replica inspect`: a replica in a bucket, read through
//! `ReplicaReader` without taking ownership — it never writes an owner
//! object and never fences anybody. This landing reads replicas on a local
//! filesystem (`--dir`); object stores come with the endpoint work.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use clap::Args;
use dedupkv::Key;
use dedupkv::replica::ReplicaReader;
use dedupkv::replica::object_store::local::LocalFileSystem;
use serde_json::{Value, json};

use crate::show;

/// `replica inspect`'s arguments.
#[derive(Args)]
pub struct InspectArgs {
    /// The directory that holds the bucket (a local-filesystem object store).
    #[arg(long)]
    dir: PathBuf,
    /// The replica's prefix in the bucket (the one given to `Replica::new`).
    #[arg(long)]
    prefix: String,
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

/// Inspects the replica: its summary, and with a key or `--copy`, a copy.
pub fn inspect(args: &InspectArgs) -> Result<Value, String> {
    if !args.dir.is_dir() {
        return Err(format!("{}: no such directory", args.dir.display()));
    }
    let fs = LocalFileSystem::new_with_prefix(&args.dir)
        .map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let reader = ReplicaReader::new(Arc::new(fs), &args.prefix);
    let now = SystemTime::now();
    let s = reader.summary().map_err(|e| e.to_string())?;
    let mut v = json!({
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
    });
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
