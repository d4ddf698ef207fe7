//! `Key::from_fields`: a key from selected fields of structured data is the
//! same for every representation of the same selected values, and only for
//! those.

use std::collections::HashMap;

use dedupkv::{Begin, Error, Fingerprint, Key, ManualClock, Result, Store};
use dedupkv_testkit::tempdir;
use serde::Serialize;
use serde_json::json;

#[derive(Serialize, Clone)]
struct Line {
    sku: String,
    qty: u32,
}

#[derive(Serialize, Clone)]
struct Order {
    id: u64,
    lines: Vec<Line>,
    note: Option<String>,
}

#[derive(Serialize, Clone)]
struct Request {
    order: Order,
    customer: String,
    sent_at: u64,
}

fn request() -> Request {
    Request {
        order: Order {
            id: 7,
            lines: vec![
                Line {
                    sku: "a-1".into(),
                    qty: 2,
                },
                Line {
                    sku: "b-2".into(),
                    qty: 1,
                },
            ],
            note: None,
        },
        customer: "c-42".into(),
        sent_at: 1_700_000_000,
    }
}

const PATHS: &[&str] = &["order.id", "customer"];

#[test]
fn a_struct_a_map_and_a_json_value_with_extra_fields_give_one_key() -> Result<()> {
    let want = Key::from_fields("payments", &request(), PATHS)?;
    assert_eq!(want.scope(), b"payments");
    assert_eq!(want.id().len(), 32);
    assert!(want.id().iter().all(|b| b"0123456789abcdef".contains(b)));

    let json = json!({
        "customer": "c-42",
        "order": {"id": 7, "lines": [], "coupon": "SPRING"},
        "sent_at": 1,
        "retry": 3
    });
    assert_eq!(Key::from_fields("payments", &json, PATHS)?, want);

    let mut order: HashMap<&str, serde_json::Value> = HashMap::new();
    order.insert("id", json!(7u8));
    let mut map: HashMap<&str, serde_json::Value> = HashMap::with_capacity(64);
    map.insert("order", serde_json::to_value(&order).expect("json"));
    map.insert("customer", json!("c-42"));
    assert_eq!(Key::from_fields("payments", &map, PATHS)?, want);
    Ok(())
}

#[test]
fn a_different_selected_value_gives_a_different_key() -> Result<()> {
    let want = Key::from_fields("payments", &request(), PATHS)?;
    let mut other = request();
    other.order.id = 8;
    assert_ne!(Key::from_fields("payments", &other, PATHS)?, want);
    let mut other = request();
    other.customer = "c-43".into();
    assert_ne!(Key::from_fields("payments", &other, PATHS)?, want);
    // The same value as another kind ("7", not 7) is another value.
    let json = json!({"customer": "c-42", "order": {"id": "7"}});
    assert_ne!(Key::from_fields("payments", &json, PATHS)?, want);
    // Another scope is another key.
    assert_ne!(Key::from_fields("refunds", &request(), PATHS)?, want);
    // Unselected fields do not matter.
    let mut other = request();
    other.sent_at += 1;
    other.order.note = Some("gift".into());
    assert_eq!(Key::from_fields("payments", &other, PATHS)?, want);
    Ok(())
}

#[test]
fn the_order_of_the_paths_does_not_matter_but_the_paths_do() -> Result<()> {
    let r = request();
    assert_eq!(
        Key::from_fields("s", &r, &["customer", "order.id"])?,
        Key::from_fields("s", &r, &["order.id", "customer"])?
    );
    // Selecting a whole object is not selecting one of its fields.
    let v = json!({"a": {"b": 1}});
    assert_ne!(
        Key::from_fields("s", &v, &["a"])?,
        Key::from_fields("s", &v, &["a.b"])?
    );
    // Nor is the same value under another path.
    assert_ne!(
        Key::from_fields("s", &json!({"x": 1}), &["x"])?,
        Key::from_fields("s", &json!({"y": 1}), &["y"])?
    );
    Ok(())
}

#[test]
fn index_segments_walk_into_sequences() -> Result<()> {
    let r = request();
    let k = Key::from_fields("s", &r, &["order.lines.1.sku", "order.id"])?;
    let json = json!({"order": {"id": 7, "lines": [{"sku": "x"}, {"sku": "b-2", "qty": 9}]}});
    assert_eq!(
        Key::from_fields("s", &json, &["order.id", "order.lines.1.sku"])?,
        k
    );
    assert_ne!(
        Key::from_fields("s", &r, &["order.lines.0.sku", "order.id"])?,
        k
    );
    Ok(())
}

fn invalid(err: &Error, what: &str, needles: &[&str]) {
    let msg = err.to_string();
    assert!(
        matches!(err, Error::InvalidArgument { what: w, .. } if *w == what),
        "{msg}"
    );
    for needle in needles {
        assert!(msg.contains(needle), "{needle:?} not in {msg:?}");
    }
}

#[test]
fn a_path_that_selects_nothing_is_refused_by_name() {
    let r = request();
    let cases: &[(&str, &[&str])] = &[
        ("order.number", &["\"order.number\"", "no field \"number\""]),
        ("order.lines.5", &["\"order.lines.5\"", "no index 5"]),
        ("order.lines.first", &["is not an index"]),
        ("order.id.x", &["is an integer"]),
        // A skipped or absent field is missing; a null one would be selected.
        ("order.note", &["no field \"note\""]),
        ("order..id", &["empty segment"]),
        ("", &["empty segment"]),
    ];
    for (path, needles) in cases {
        let err = Key::from_fields("s", &json!({"order": {"id": 7, "lines": []}}), &[path])
            .expect_err(path);
        invalid(&err, "path", needles);
    }
    let err = Key::from_fields("s", &r, &["customer", "order.number"]).expect_err("missing");
    invalid(&err, "path", &["\"order.number\""]);
    assert!(Key::from_fields("s", &json!({"note": null}), &["note"]).is_ok());
}

#[test]
fn an_empty_or_repeated_path_list_is_refused() {
    let err = Key::from_fields("s", &request(), &[]).expect_err("empty");
    invalid(&err, "paths", &["empty"]);
    let err = Key::from_fields("s", &request(), &["customer", "customer"]).expect_err("twice");
    invalid(&err, "paths", &["\"customer\" twice"]);
}

#[test]
fn a_derived_key_dedups_a_retry_that_rebuilt_the_request() -> Result<()> {
    let dir = tempdir();
    let store = Store::builder()
        .clock(ManualClock::new(1_700_000_000_000))
        .open(dir.path().join("s.redb"))?;
    let first = request();
    let key = Key::from_fields("payments", &first, PATHS)?;
    let fp = Fingerprint::of_value(&first.order.lines)?;
    let Begin::Started(claim) = store.begin(&key, fp)? else {
        panic!("fresh key")
    };
    store.complete_value(&claim, &"ch_1".to_string())?;

    // The retry arrives as JSON, with its fields in another order.
    let retry: serde_json::Value = serde_json::from_str(
        r#"{"sent_at": 2, "customer": "c-42",
            "order": {"lines": [{"qty": 2, "sku": "a-1"}, {"qty": 1, "sku": "b-2"}], "id": 7}}"#,
    )
    .expect("json");
    let key = Key::from_fields("payments", &retry, PATHS)?;
    let Begin::Completed(rec) =
        store.begin(&key, Fingerprint::of_value(&retry["order"]["lines"])?)?
    else {
        panic!("the retry is a duplicate")
    };
    assert_eq!(rec.outcome_as::<String>()?, "ch_1");
    Ok(())
}

#[test]
fn the_key_encoding_is_pinned() -> Result<()> {
    // A change here changes every derived key: take a new domain byte and
    // say so in the CHANGELOG instead.
    let key = Key::from_fields("s", &json!({"id": 7, "other": true}), &["id"])?;
    // Domain 2, a map of one entry: "id" -> 7.
    let encoding = b"\x02\x08\x01\x06\x02id\x03\x07";
    let want = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(encoding));
    assert_eq!(key.id(), want.as_bytes());
    assert_eq!(key.id(), b"35a794ec9908df36fd5f444af8c6e6fe");
    Ok(())
}
