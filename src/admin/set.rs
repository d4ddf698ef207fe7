//! One endpoint for every store of a [`PartitionSet`]: each request names
//! its partition (`partition`, or `store`: the partition's file), or asks
//! every assigned partition (`"all": true` on a `get`).
//!
//! Invariant: a partition's store is reached only through
//! [`PartitionSet::work`], so a request racing a revoke either runs
//! before the hand-over or is answered `NotAssigned`.

use std::path::Path;

use serde_json::{Value, json};

use super::ops::{self, Refusal};
use super::{AdminOptions, AdminServer, server, set_socket_path};
use crate::Result;
use crate::partitions::PartitionSet;

impl AdminServer {
    /// Serves every store of `set` on one socket (default
    /// [`set_socket_path`] of the set's base directory) until the handle
    /// is dropped; partitions assigned or revoked meanwhile are served or
    /// not as they come and go. Each request reaches its store through
    /// [`PartitionSet::work`], so a revoke waits for it like for any
    /// handler. The handle keeps a clone of the set: drop it with the set.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) naming the directory when it is
    /// writable by group or others, naming the socket when a live
    /// endpoint answers there or another kind of file is in the way, and
    /// for a failed bind.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::admin::{AdminOptions, AdminServer};
    /// use dedupkv::partitions::PartitionSet;
    /// use dedupkv::replica::{Replica, object_store::memory::InMemory};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let objects = std::sync::Arc::new(InMemory::new());
    /// let set = PartitionSet::new(dir.path(), move |p| {
    ///     Ok(dedupkv::Store::builder().replica(Replica::new(objects.clone(), &format!("p/{p}"))))
    /// });
    /// set.assign(0)?;
    /// let admin = AdminServer::partitions(&set, AdminOptions::new())?;
    /// assert_eq!(admin.path(), dir.path().join("admin.sock"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn partitions(set: &PartitionSet, opts: AdminOptions) -> Result<AdminServer> {
        let AdminOptions {
            path,
            writes,
            max_request,
        } = opts;
        let socket = path.unwrap_or_else(|| set_socket_path(set.base()));
        std::fs::create_dir_all(set.base()).map_err(|e| crate::Error::Io {
            what: "starting the admin endpoint",
            source: std::io::Error::new(e.kind(), format!("{}: {e}", set.base().display())),
        })?;
        let set = set.clone();
        let answer = move |r: &Value| run(&set, r, writes);
        let running = server::start(&socket, max_request, Box::new(answer))?;
        Ok(AdminServer { running })
    }
}

/// Runs `request` on the partition it names, or on every partition.
fn run(set: &PartitionSet, request: &Value, writes: bool) -> std::result::Result<Value, Refusal> {
    let op = ops::op_of(request)?;
    if request.get("all").and_then(Value::as_bool) == Some(true) {
        if op != "get" {
            return Err(Refusal::bad("`all` goes with `get` only"));
        }
        return get_all(set, request, writes);
    }
    let partition = match (request.get("partition"), request.get("store")) {
        (Some(p), _) => p
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| Refusal::bad("`partition` must be a partition number"))?,
        (None, Some(Value::String(path))) => partition_of(set, Path::new(path))?,
        _ if op == "stats" => {
            return Ok(json!({ "assigned": set.assigned(), "fenced": set.fenced() }));
        }
        _ => {
            return Err(Refusal::bad(format!(
                "this endpoint serves the partition set at {}: name `partition` or `store`, \
                 or `\"all\": true` with `get`",
                set.base().display()
            )));
        }
    };
    on(set, partition, request, writes)
}

/// `request` on `partition`'s store.
fn on(
    set: &PartitionSet,
    partition: i32,
    request: &Value,
    writes: bool,
) -> std::result::Result<Value, Refusal> {
    let path = set.path_of(partition);
    let answered = set
        .work(partition)
        .and_then(|w| w.with(|store| Ok(ops::run(store, &path, request, writes))));
    answered.map_err(|e| {
        let kind = match e {
            crate::Error::NotAssigned { .. } => "not_assigned",
            _ => "failed",
        };
        Refusal::new(kind, format!("partition {partition}: {e}"))
    })?
}

/// The assigned partition whose store is at `path`.
fn partition_of(set: &PartitionSet, path: &Path) -> std::result::Result<i32, Refusal> {
    let same = |a: &Path| match (a.canonicalize(), path.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == path,
    };
    set.assigned()
        .into_iter()
        .find(|&p| same(&set.path_of(p)))
        .ok_or_else(|| {
            Refusal::new(
                "failed",
                format!(
                    "{}: not the store of a partition assigned to this member (assigned: {:?})",
                    path.display(),
                    set.assigned()
                ),
            )
        })
}

/// `get` on every assigned partition: the first that holds the key.
fn get_all(
    set: &PartitionSet,
    request: &Value,
    writes: bool,
) -> std::result::Result<Value, Refusal> {
    let key = ops::key_of(request)?;
    let assigned = set.assigned();
    for &p in &assigned {
        match on(set, p, request, writes) {
            Ok(mut v) => {
                v["partition"] = json!(p);
                return Ok(v);
            }
            // Not there, or revoked since the list was taken.
            Err(r) if r.kind == "not_found" || r.kind == "not_assigned" => {}
            Err(r) => return Err(r),
        }
    }
    Err(Refusal::new(
        "not_found",
        format!(
            "{}: no record of {key} in the assigned partitions {assigned:?}",
            set.base().display()
        ),
    ))
}
