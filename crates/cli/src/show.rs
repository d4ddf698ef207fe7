//! Rendering for people and for `--json`: every command builds one JSON
//! value; `--json` prints it on one line, otherwise it is printed as
//! indented `name: value` lines. Times are RFC 3339 with their age, bytes
//! UTF-8 when they are, else hex.

use serde_json::Value;

pub use dedupkv::admin::json::{human, record, time};

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
