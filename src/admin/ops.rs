//! The protocol's operations on one store: a request (one JSON object)
//! in, an answer (one JSON object) out. The endpoint serves them; the
//! command line calls them in-process for its offline reads, so both
//! answer alike.
//!
//! Invariants: a read op calls only reading methods of [`Store`]; a write
//! op runs only when the caller allows writes; no request, however
//! malformed, panics or fails the store.

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::json as render;
use crate::{Error, Key, Listing, Page, Resolution, State, Store};

/// Why a request got no value: its kind (`kind` in the answer) and the
/// message.
pub(crate) struct Refusal {
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

impl Refusal {
    pub(crate) fn new(kind: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn bad(message: impl Into<String>) -> Refusal {
        Refusal::new("bad_request", message)
    }
}

/// `e`'s message, naming `path` first unless it does already.
fn failed(path: &Path, e: &Error) -> Refusal {
    let msg = e.to_string();
    let shown = path.display().to_string();
    let message = if msg.contains(&shown) {
        msg
    } else {
        format!("{shown}: {msg}")
    };
    Refusal::new("failed", message)
}

/// The answer line for `outcome`.
pub(crate) fn answer_of(outcome: Result<Value, Refusal>) -> Value {
    match outcome {
        Ok(v) => json!({ "ok": v }),
        Err(r) => json!({ "error": r.message, "kind": r.kind }),
    }
}

/// The names of the ops that write.
pub(crate) const WRITES: [&str; 6] = [
    "requeue", "resolve", "release", "evict", "compact", "upgrade",
];

/// Runs `request` on `store` (kept at `path`).
pub(crate) fn run(
    store: &Store,
    path: &Path,
    request: &Value,
    writes: bool,
) -> Result<Value, Refusal> {
    let op = op_of(request)?;
    if WRITES.contains(&op) && !writes {
        return Err(Refusal::new(
            "refused",
            format!(
                "{}: `{op}` writes, and this endpoint serves reads only; the process that \
                 holds the store enables writes with AdminOptions::allow_writes(true)",
                path.display()
            ),
        ));
    }
    let now = SystemTime::now();
    let e = |err: Error| failed(path, &err);
    match op {
        "get" => get(store, path, request, now),
        "stats" => stats(store, path),
        "keys" => keys(store, request, now).map_err(e)?,
        "dead_letters" => list(store, request, Store::dead_letters, |d| {
            render::dead_letter(d, now)
        }),
        "held" => list(store, request, Store::holding_area, |h| {
            render::held(h, now)
        }),
        "intents_pending" => list(store, request, Store::pending_intents, |i| {
            render::intent(i, now)
        }),
        "stranded" => list(store, request, Store::stranded_claims, |r| {
            render::record(r, now)
        }),
        "requeue" => {
            let done = store.requeue(&key_of(request)?).map_err(e)?;
            Ok(json!({ "requeued": done }))
        }
        "resolve" => {
            let key = key_of(request)?;
            let done = match (text(request, "completed")?, text(request, "abandon")?) {
                (Some(outcome), None) => {
                    store.resolve(&key, Resolution::Completed(outcome.as_bytes()))
                }
                (None, Some(note)) => store.resolve(&key, Resolution::Abandoned(note)),
                _ => {
                    return Err(Refusal::bad(
                        "`resolve` takes one of `completed` (an outcome) or `abandon` (a note)",
                    ));
                }
            }
            .map_err(e)?;
            Ok(json!({ "resolved": done }))
        }
        "release" => {
            let done = store.release_held(&key_of(request)?).map_err(e)?;
            Ok(json!({ "released": !done.is_empty() }))
        }
        "evict" => {
            let ev = store.evict_expired().map_err(e)?;
            Ok(json!({ "buckets": ev.buckets, "keys": ev.keys }))
        }
        "compact" => Ok(json!({ "compacted": store.compact().map_err(e)? })),
        "upgrade" => Ok(json!({ "upgraded": store.upgrade().map_err(e)? })),
        other => Err(Refusal::bad(format!(
            "unknown op `{other}`; ops: get, stats, keys, dead_letters, held, \
             intents_pending, stranded, requeue, resolve, release, evict, compact, upgrade"
        ))),
    }
}

/// The request's `op`.
pub(crate) fn op_of(request: &Value) -> Result<&str, Refusal> {
    if !request.is_object() {
        return Err(Refusal::bad("a request is one JSON object with an `op`"));
    }
    text(request, "op")?.ok_or_else(|| Refusal::bad("the request has no `op`"))
}

/// The string field `name`, if there.
fn text<'a>(request: &'a Value, name: &str) -> Result<Option<&'a str>, Refusal> {
    match request.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(Refusal::bad(format!("`{name}` must be a string"))),
    }
}

/// The boolean field `name`, false if absent.
fn request_flag(request: &Value, name: &str) -> Result<bool, Refusal> {
    match request.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(Refusal::bad(format!("`{name}` must be true or false"))),
    }
}

/// The request's key: `scope` and `id`.
pub(crate) fn key_of(request: &Value) -> Result<Key<'static>, Refusal> {
    match (text(request, "scope")?, text(request, "id")?) {
        (Some(scope), Some(id)) => Ok(Key::owned(
            scope.as_bytes().to_vec(),
            id.as_bytes().to_vec(),
        )),
        _ => Err(Refusal::bad("this op takes a key: `scope` and `id`")),
    }
}

/// The request's listing filters (`scope`, `older_than` such as `"7d"`)
/// and its `limit` (default 100).
fn filters(request: &Value) -> Result<(Listing, usize), Refusal> {
    let mut listing = Listing::new();
    if let Some(scope) = text(request, "scope")? {
        listing = listing.scope(scope);
    }
    if let Some(age) = text(request, "older_than")? {
        let age = humantime::parse_duration(age)
            .map_err(|e| Refusal::bad(format!("`older_than` `{age}`: {e}")))?;
        listing = listing.older_than(age);
    }
    let limit = match request.get("limit") {
        None | Some(Value::Null) => 100,
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| Refusal::bad("`limit` must be a whole number"))?,
    };
    Ok((listing, limit))
}

/// Up to `limit` items of a listing, page after page.
fn pages<T>(
    store: &Store,
    listing: Listing,
    limit: usize,
    next: impl Fn(&Store, &Listing) -> crate::Result<Page<T>>,
) -> crate::Result<Vec<T>> {
    let mut all = Vec::new();
    let mut listing = listing.limit(limit.clamp(1, 1000));
    loop {
        let page = next(store, &listing)?;
        all.extend(page.items);
        match page.next {
            Some(c) if all.len() < limit => listing = listing.after(c),
            _ => break,
        }
    }
    all.truncate(limit);
    Ok(all)
}

fn list<T>(
    store: &Store,
    request: &Value,
    next: impl Fn(&Store, &Listing) -> crate::Result<Page<T>>,
    each: impl Fn(&T) -> Value,
) -> Result<Value, Refusal> {
    let (listing, limit) = filters(request)?;
    let items =
        pages(store, listing, limit, next).map_err(|e| Refusal::new("failed", e.to_string()))?;
    Ok(Value::Array(items.iter().map(each).collect()))
}

/// A state's name as requests and answers spell it.
fn state_name(s: State) -> String {
    format!("{s:?}")
}

/// `keys`: live records by scope, `state` and age.
fn keys(store: &Store, request: &Value, now: SystemTime) -> crate::Result<Result<Value, Refusal>> {
    let (listing, limit) = match filters(request) {
        Ok(f) => f,
        Err(r) => return Ok(Err(r)),
    };
    let state = match request.get("state") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(other) => {
            return Ok(Err(Refusal::bad(format!(
                "state is {other}: a state's name such as \"Completed\""
            ))));
        }
    };
    let mut listing = listing.limit(limit.clamp(1, 1000));
    let mut items = Vec::new();
    'pages: loop {
        let page = store.records(&listing)?;
        for r in &page.items {
            if items.len() >= limit {
                break 'pages;
            }
            if state.is_none_or(|s| state_name(r.state()).eq_ignore_ascii_case(s)) {
                items.push(render::record(r, now));
            }
        }
        match page.next {
            Some(c) => listing = listing.after(c),
            None => break,
        }
    }
    Ok(Ok(Value::Array(items)))
}

/// `get`: the record, its intent and its dead-letter reason; with
/// `"history": true` every record of the key still in the store, oldest
/// first (a scan of the key's buckets).
fn get(store: &Store, path: &Path, request: &Value, now: SystemTime) -> Result<Value, Refusal> {
    let key = &key_of(request)?;
    let e = |err: Error| failed(path, &err);
    let Some(record) = store.get(key).map_err(e)? else {
        return Err(Refusal::new(
            "not_found",
            format!("{}: no record of {key}", path.display()),
        ));
    };
    let mut v = render::record(&record, now);
    let intent = store.intent(key).map_err(e)?;
    v["intent"] = intent.map_or(Value::Null, |i| render::intent(&i, now));
    let mut dead = Value::Null;
    if record.state() == State::DeadLettered {
        let scoped = Listing::new().scope(key.scope());
        let all = pages(store, scoped, usize::MAX, Store::dead_letters).map_err(e)?;
        if let Some(d) = all.iter().find(|d| d.key() == key) {
            dead = json!({ "reason": d.reason(), "failed": render::time(d.failed_at(), now) });
        }
    }
    v["dead_letter"] = dead;
    if request_flag(request, "history")? {
        let history = store.history(key).map_err(e)?;
        v["history"] = history.iter().map(|r| render::attempt(r, now)).collect();
    }
    Ok(v)
}

/// `stats`: the store's counts, its window and its file's size.
fn stats(store: &Store, path: &Path) -> Result<Value, Refusal> {
    let s = store.stats();
    let size = std::fs::metadata(path)
        .map_err(|e| Refusal::new("failed", format!("{}: {e}", path.display())))?;
    let human = |d: Duration| render::human(d);
    let v = json!({
        "file": path.display().to_string(),
        "file_bytes": size.len(),
        "format": s.format,
        "keys": s.keys,
        "in_progress": s.in_progress,
        "dead_letters": s.dead_letters_now,
        "oldest_dead_letter": s.oldest_dead_letter.map(human),
        "stranded_claims": s.stranded_claims,
        "intents_pending": s.intents_pending,
        "parked_events": s.parked_now,
        "held_events": s.held_now,
        "unacked_events": s.unacked_now,
        "entities": s.entities,
        "retention": human(s.retention),
        "effective_window": human(s.effective_window),
        "index_bytes": s.index_bytes,
    });
    #[cfg(feature = "replica")]
    let v = replica(store, v);
    Ok(v)
}

/// `stats` with the store's replica, when it has one.
#[cfg(feature = "replica")]
fn replica(store: &Store, mut v: Value) -> Value {
    let human = |d: Duration| render::human(d);
    if let Some(r) = store.replica_status() {
        v["replica"] = json!({
            "epoch": r.epoch,
            "fenced": r.fenced,
            "last_segment": r.last_segment,
            "lag": human(r.lag),
            "lag_bytes": r.lag_bytes,
            "upload_failures": r.upload_failures,
            "last_error": r.last_error,
            "snapshots": r.snapshots,
        });
    }
    v
}
