//! Rendering for people and for `--json`: every command builds one JSON
//! value; `--json` prints it on one line, otherwise it is printed as
//! indented `name: value` lines. Times are RFC 3339 with their age, bytes
//! UTF-8 when they are, else hex.

use std::time::{Duration, SystemTime};

use dedupkv::{DeadLetter, Held, IntentEntry, Record};
use serde_json::{Map, Value, json};

/// A time as `{"at": RFC 3339, "age": "3h 2m ago"}` (or "in 5m").
pub fn time(t: SystemTime, now: SystemTime) -> Value {
    let age = match now.duration_since(t) {
        Ok(d) => format!("{} ago", human(d)),
        Err(e) => format!("in {}", human(e.duration())),
    };
    json!({ "at": humantime::format_rfc3339_millis(t).to_string(), "age": age })
}

/// A duration to the second, `0s` for less.
pub fn human(d: Duration) -> String {
    if d.as_secs() == 0 {
        return "0s".into();
    }
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// Bytes as a UTF-8 string, or `{"hex": ...}` when they are not UTF-8.
pub fn bytes(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => Value::String(s.to_owned()),
        Err(_) => json!({ "hex": hex(b) }),
    }
}

/// Lowercase hex.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write as _;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

/// A record as a person wants it: state, attempts, times, lease and
/// holder token, fingerprint, outcome, provider key.
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

/// A dead letter: its record, reason, attempts and times.
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

/// Prints `v`: one JSON line with `json`, else indented lines.
pub fn print(v: &Value, json: bool) {
    if json {
        println!("{v}");
    } else {
        let mut out = String::new();
        text(v, 0, &mut out);
        print!("{out}");
    }
}

fn text(v: &Value, depth: usize, out: &mut String) {
    use std::fmt::Write as _;
    let pad = "  ".repeat(depth);
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if let Some(s) = inline(v) {
                    let _ = writeln!(out, "{pad}{k}: {s}");
                } else {
                    let _ = writeln!(out, "{pad}{k}:");
                    text(v, depth + 1, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let _ = writeln!(out, "{pad}- [{i}]");
                text(v, depth + 1, out);
            }
        }
        other => {
            let _ = writeln!(out, "{pad}{}", inline(other).unwrap_or_default());
        }
    }
}

/// A value that fits on one line: scalars, a time, hex bytes.
fn inline(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("-".into()),
        Value::String(s) => Some(s.clone()),
        Value::Bool(_) | Value::Number(_) => Some(v.to_string()),
        Value::Object(m) if m.len() == 2 && m.contains_key("at") && m.contains_key("age") => {
            Some(format!("{} ({})", m["at"].as_str()?, m["age"].as_str()?))
        }
        Value::Object(m) if m.len() == 1 && m.contains_key("hex") => {
            Some(format!("hex {}", m["hex"].as_str()?))
        }
        Value::Array(a) if a.is_empty() => Some("(none)".into()),
        _ => None,
    }
}
