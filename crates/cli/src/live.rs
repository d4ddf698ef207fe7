//! The protocol of the admin endpoint (docs/cli.md), spoken either to the
//! process that holds the store (its live endpoint, when one answers
//! beside the path) or, offline, to the store opened here: the same
//! request, the same answer, so both print alike.

use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::{Fail, exit, open};

/// How long the endpoint may take to answer.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoint sockets that may serve `store`: its own
/// (`STORE.admin.sock`), and a partition set's (`BASE/admin.sock` for
/// `BASE` itself or for `BASE/partition-N/store.redb`).
fn sockets(store: &Path) -> Vec<PathBuf> {
    if store.is_dir() {
        return vec![dedupkv::admin::set_socket_path(store)];
    }
    let mut all = vec![dedupkv::admin::socket_path(store)];
    if let Some(base) = store.parent().and_then(Path::parent) {
        all.push(dedupkv::admin::set_socket_path(base));
    }
    all
}

/// A live endpoint for `store`, if one answers (a socket left by a
/// process that is gone does not).
pub fn endpoint(store: &Path) -> Option<(PathBuf, UnixStream)> {
    sockets(store)
        .into_iter()
        .filter(|s| s.exists())
        .find_map(|s| UnixStream::connect(&s).ok().map(|c| (s, c)))
}

/// Sends `request` over `conn` and reads the answer line.
fn send(socket: &Path, mut conn: UnixStream, request: &Value) -> Result<Value, String> {
    let at = |e: std::io::Error| format!("{}: {e}", socket.display());
    conn.set_read_timeout(Some(TIMEOUT)).map_err(at)?;
    conn.set_write_timeout(Some(TIMEOUT)).map_err(at)?;
    let mut line = request.to_string();
    line.push('\n');
    conn.write_all(line.as_bytes()).map_err(at)?;
    let mut answer = String::new();
    BufReader::new(conn).read_line(&mut answer).map_err(at)?;
    serde_json::from_str(&answer).map_err(|e| {
        format!(
            "{}: the endpoint's answer is not JSON: {e}",
            socket.display()
        )
    })
}

/// An answer's value, or its error as a failed command.
fn value(answer: &Value) -> Result<Value, Fail> {
    if let Some(v) = answer.get("ok") {
        return Ok(v.clone());
    }
    let msg = answer["error"]
        .as_str()
        .unwrap_or("the answer has neither ok nor error");
    let code = match answer["kind"].as_str() {
        Some("not_found") => exit::NOT_FOUND,
        _ => exit::ERROR,
    };
    Err(Fail(code, msg.to_owned()))
}

/// Where `request` goes: `store`'s live endpoint if one answers, else
/// the store opened here (read-only, or writable for a write).
pub fn ask(store: &Path, mut request: Value, write: bool) -> Result<Value, Fail> {
    if let Some((socket, conn)) = endpoint(store) {
        if !store.is_dir() {
            let path = store.canonicalize().unwrap_or_else(|_| store.to_path_buf());
            request["store"] = Value::String(path.display().to_string());
        }
        return value(&send(&socket, conn, &request)?);
    }
    if request.get("all").is_some() || request.get("partition").is_some() {
        return Err(Fail(
            exit::ERROR,
            format!(
                "{}: no live admin endpoint answers there; `--all` and `--partition` ask a \
                 partition set's endpoint (BASE/admin.sock); offline, name a partition's \
                 store file",
                store.display()
            ),
        ));
    }
    let s = if write {
        open::writable(store)?
    } else if let Some(key) = one_key(&request) {
        open::read_only_key(store, &key)?
    } else {
        open::read_only(store)?
    };
    let answer = dedupkv::admin::answer(&s, store, &request.to_string(), write);
    value(&serde_json::from_str(&answer).map_err(|e| format!("answer: {e}"))?)
}

/// The key a `get` reads: its offline open loads that key alone (the same
/// answer, without building the index of every other key).
fn one_key(request: &Value) -> Option<dedupkv::Key<'static>> {
    match (&request["op"], &request["scope"], &request["id"]) {
        (Value::String(op), Value::String(scope), Value::String(id)) if op == "get" => {
            Some(dedupkv::Key::new(scope, id).into_owned())
        }
        _ => None,
    }
}
