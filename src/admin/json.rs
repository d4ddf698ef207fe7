//! The JSON forms of records and listings, shared by the endpoint's
//! answers and the `dedupkv` command line's offline reads, so both print
//! the same thing. Times are RFC 3339 with their age, bytes UTF-8 when
//! they are, else hex; provider keys in the hex the provider sees.

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

use crate::{DeadLetter, Held, IntentEntry, Record, State};

/// A time as `{"at": RFC 3339, "age": "3h 2m ago"}` (or `"in 5m"`).
///
/// # Examples
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// let v = dedupkv::admin::json::time(UNIX_EPOCH, UNIX_EPOCH + Duration::from_secs(90));
/// assert_eq!(v["at"], "1970-01-01T00:00:00.000Z");
/// assert_eq!(v["age"], "1m 30s ago");
/// ```
pub fn time(t: SystemTime, now: SystemTime) -> Value {
    let age = match now.duration_since(t) {
        Ok(d) => format!("{} ago", human(d)),
        Err(e) => format!("in {}", human(e.duration())),
    };
    json!({ "at": humantime::format_rfc3339_millis(t).to_string(), "age": age })
}

/// A duration to the second, `0s` for less.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// assert_eq!(dedupkv::admin::json::human(Duration::from_secs(36 * 3600)), "1day 12h");
/// ```
pub fn human(d: Duration) -> String {
    if d.as_secs() == 0 {
        return "0s".into();
    }
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// Bytes as a UTF-8 string, or `{"hex": ...}` when they are not UTF-8.
///
/// # Examples
/// ```
/// assert_eq!(dedupkv::admin::json::bytes(b"ok"), "ok");
/// assert_eq!(dedupkv::admin::json::bytes(&[0xff])["hex"], "ff");
/// ```
pub fn bytes(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => Value::String(s.to_owned()),
        Err(_) => json!({ "hex": hex(b) }),
    }
}

/// Lowercase hex.
fn hex(b: &[u8]) -> String {
    use std::fmt::Write as _;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

/// A record as a person wants it: state, attempts, times, lease and
/// holder token, fingerprint, outcome, provider key.
///
/// # Examples
/// ```
/// use dedupkv::{Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// store.insert_if_absent(&Key::new("orders", "4711"))?;
/// let r = store.get(&Key::new("orders", "4711"))?.expect("just inserted");
/// let v = dedupkv::admin::json::record(&r, std::time::SystemTime::now());
/// assert_eq!(v["state"], "Inserted");
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn record(r: &Record, now: SystemTime) -> Value {
    let mut m = Map::new();
    m.insert("scope".into(), bytes(r.key().scope()));
    m.insert("id".into(), bytes(r.key().id()));
    m.insert("state".into(), Value::String(format!("{:?}", r.state())));
    m.insert("attempts".into(), json!(r.attempts()));
    m.insert("token".into(), json!(r.token()));
    m.insert("first_seen".into(), time(r.first_seen_at(), now));
    m.insert("updated".into(), time(r.updated_at(), now));
    m.insert("expires".into(), time(r.expires_at(), now));
    m.insert(
        "lease_expires".into(),
        r.lease_expires_at().map_or(Value::Null, |t| time(t, now)),
    );
    m.insert(
        "fingerprint".into(),
        r.fingerprint()
            .map_or(Value::Null, |f| json!(f.to_string())),
    );
    m.insert("provider_key".into(), json!(r.provider_key()));
    m.insert("outcome".into(), r.outcome().map_or(Value::Null, bytes));
    Value::Object(m)
}

/// One record of a key's history ([`Store::history`](crate::Store::history)):
/// its kind (the state it left the key in), when it was made, the attempt
/// and its fencing token, the replica epoch of the owner that issued the
/// token (a token of epoch `e` is at least `e * 2^40`; 0 without a
/// replica), and its outcome or failure.
///
/// # Examples
/// ```
/// use dedupkv::{Begin, Fingerprint, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("payments", "order-4711");
/// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
/// store.complete(&c, b"charged")?;
/// let now = std::time::SystemTime::now();
/// let h: Vec<_> = store.history(&key)?.iter().map(|r| dedupkv::admin::json::attempt(r, now)).collect();
/// assert_eq!((h[0]["kind"].as_str(), h[1]["kind"].as_str()), (Some("InProgress"), Some("Completed")));
/// assert_eq!(h[1]["outcome"], "charged");
/// assert_eq!(h[1]["owner_epoch"], 0);
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn attempt(r: &Record, now: SystemTime) -> Value {
    let (outcome, failure) = match r.outcome() {
        Some(o) if r.is_failure() || r.state() == State::DeadLettered => (Value::Null, bytes(o)),
        Some(o) => (bytes(o), Value::Null),
        None => (Value::Null, Value::Null),
    };
    json!({
        "kind": format!("{:?}", r.state()),
        "at": time(r.updated_at(), now),
        "attempt": r.attempts(),
        "token": r.token(),
        "owner_epoch": r.token() >> crate::engine::tokens::EPOCH_SHIFT,
        "outcome": outcome,
        "failure": failure,
    })
}

/// A dead letter: its record, reason, attempts and times.
///
/// # Examples
/// See [`record`]; the dead-letter listing of the endpoint answers these.
pub fn dead_letter(d: &DeadLetter, now: SystemTime) -> Value {
    json!({
        "record": record(d.record(), now),
        "reason": d.reason(),
        "attempts": d.attempts(),
        "first_attempt": time(d.first_attempt_at(), now),
        "first_failed": time(d.first_failed_at(), now),
        "failed": time(d.failed_at(), now),
        "payload": d.payload().map_or(Value::Null, bytes),
    })
}

/// An event of the sequencer's holding area.
///
/// # Examples
/// See [`record`]; the held listing of the endpoint answers these.
pub fn held(h: &Held, now: SystemTime) -> Value {
    json!({
        "scope": bytes(h.entity.scope()),
        "entity": bytes(h.entity.id()),
        "seq": h.seq,
        "missing": h.missing,
        "since": time(h.since, now),
        "reason": h.reason,
        "payload": bytes(&h.payload),
    })
}

/// An intent: target, request, reference, answer, provider key.
///
/// # Examples
/// See [`record`]; the pending-intents listing of the endpoint answers
/// these.
pub fn intent(i: &IntentEntry, now: SystemTime) -> Value {
    json!({
        "scope": bytes(i.key().scope()),
        "id": bytes(i.key().id()),
        "target": i.target(),
        "attempt": i.attempt(),
        "sent": i.is_sent(),
        "recorded": time(i.recorded_at(), now),
        "request": i.request().map_or(Value::Null, bytes),
        "reference": i.reference().map_or(Value::Null, bytes),
        "answer": i.answer().map_or(Value::Null, |a| json!(format!("{a:?}"))),
        "provider_key": i.provider_key(),
    })
}
