//! `Fingerprint::of_value` is canonical: equal values give equal
//! fingerprints whatever their map type or iteration order, a Rust value
//! and the `serde_json::Value` of its JSON agree, and different values
//! differ.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;

use dedupkv::{Error, Fingerprint, Result};
use proptest::prelude::*;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::json;

fn fp<T: Serialize + ?Sized>(value: &T) -> Fingerprint {
    Fingerprint::of_value(value).expect("fingerprintable")
}

fn entries() -> Vec<(String, u64)> {
    (0..40u64).map(|i| (format!("field-{i}"), i * 7)).collect()
}

#[test]
fn equal_hash_maps_fingerprint_the_same_whatever_their_order() {
    let reference: BTreeMap<String, u64> = entries().into_iter().collect();
    let want = fp(&reference);
    for i in 0..16 {
        let mut order = entries();
        let n = order.len();
        order.rotate_left(i * 5 % n);
        if i % 2 == 1 {
            order.reverse();
        }
        let mut map = HashMap::with_capacity(i * 8);
        map.extend(order);
        assert_eq!(map, reference.clone().into_iter().collect());
        assert_eq!(fp(&map), want, "HashMap #{i}");
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Charge {
    // Declared out of order: fields are sorted like map keys.
    currency: String,
    amount: u64,
    card: String,
}

fn charge() -> Charge {
    Charge {
        currency: "EUR".into(),
        amount: 100,
        card: "4242".into(),
    }
}

#[test]
fn a_struct_a_map_and_a_json_value_with_the_same_fields_agree() {
    #[derive(Serialize)]
    struct Ab {
        b: &'static str,
        a: &'static str,
    }
    let want = fp(&charge());
    let json = json!({"amount": 100, "card": "4242", "currency": "EUR"});
    assert_eq!(fp(&json), want);
    let parsed: serde_json::Value =
        serde_json::from_str(r#"{"card":"4242","currency":"EUR","amount":100}"#).expect("json");
    assert_eq!(fp(&parsed), want);

    let mut map: HashMap<&str, serde_json::Value> = HashMap::new();
    map.insert("card", json!("4242"));
    map.insert("amount", json!(100u8));
    map.insert("currency", json!("EUR"));
    assert_eq!(fp(&map), want);

    let strings: BTreeMap<&str, &str> = BTreeMap::from([("a", "1"), ("b", "2")]);
    assert_eq!(fp(&strings), fp(&Ab { b: "2", a: "1" }));
}

#[test]
fn nested_maps_and_maps_inside_sequences_are_canonical() {
    let inner =
        |k: u32| -> BTreeMap<String, u32> { (0..12).map(|i| (format!("k{i}"), i * k)).collect() };
    let outer: BTreeMap<String, BTreeMap<String, u32>> =
        (0..6).map(|k| (format!("o{k}"), inner(k))).collect();
    let seq: Vec<BTreeMap<String, u32>> = (0..6).map(inner).collect();
    let want_outer = fp(&outer);
    let want_seq = fp(&seq);
    for cap in [0, 3, 64] {
        let mut hashed: HashMap<String, HashMap<String, u32>> = HashMap::with_capacity(cap);
        for (k, v) in outer.iter().rev() {
            let mut m = HashMap::with_capacity(cap);
            m.extend(v.iter().rev().map(|(a, b)| (a.clone(), *b)));
            hashed.insert(k.clone(), m);
        }
        assert_eq!(fp(&hashed), want_outer, "capacity {cap}");
        let hashed_seq: Vec<HashMap<String, u32>> = seq
            .iter()
            .map(|m| {
                let mut h = HashMap::with_capacity(cap);
                h.extend(m.iter().map(|(a, b)| (a.clone(), *b)));
                h
            })
            .collect();
        assert_eq!(fp(&hashed_seq), want_seq, "capacity {cap}");
    }
    let json = serde_json::to_value(&outer).expect("json");
    assert_eq!(fp(&json), want_outer);
}

#[test]
fn every_integer_type_is_one_kind() {
    let five = fp(&5i64);
    for other in [
        fp(&5u8),
        fp(&5u16),
        fp(&5u32),
        fp(&5u64),
        fp(&5u128),
        fp(&5usize),
        fp(&5i8),
        fp(&5i128),
        fp(&json!(5)),
    ] {
        assert_eq!(other, five);
    }
    assert_eq!(fp(&-5i8), fp(&-5i128));
    assert_eq!(fp(&u128::MAX), fp(&u128::MAX));
    assert_ne!(fp(&u128::MAX), fp(&i128::MIN));
    assert_ne!(fp(&-5i64), five);
    // A float is another kind, as in JSON (5 and 5.0 are different texts).
    assert_ne!(fp(&5.0f64), five);
}

#[test]
fn floats_are_their_f64_bits_with_one_nan() {
    assert_eq!(fp(&1.5f32), fp(&1.5f64));
    assert_eq!(fp(&f64::NAN), fp(&-f64::NAN));
    assert_eq!(fp(&f64::NAN), fp(&f64::from_bits(0x7ff0_0000_0000_0001)));
    assert_eq!(fp(&f32::NAN), fp(&f64::NAN));
    assert_ne!(fp(&0.0f64), fp(&-0.0f64));
    assert_ne!(fp(&0.1f64), fp(&f64::from(0.1f32)));
}

#[derive(Serialize)]
struct Wrapper(u32);

#[derive(Serialize)]
struct Nothing;

#[derive(Serialize)]
enum Event {
    Ping,
    Amount(u64),
    Pair(u8, u8),
    Move { from: String, to: String },
}

#[test]
fn options_newtypes_units_and_enums_are_their_json() {
    assert_eq!(fp(&Some(5u32)), fp(&5u32));
    assert_eq!(fp(&Wrapper(5)), fp(&5u32));
    assert_eq!(fp(&None::<u32>), fp(&()));
    assert_eq!(fp(&Nothing), fp(&()));
    assert_eq!(fp(&()), fp(&json!(null)));
    assert_eq!(fp(&'x'), fp(&"x"));
    assert_eq!(fp(&(1u8, "a")), fp(&json!([1, "a"])));

    assert_eq!(fp(&Event::Ping), fp(&"Ping"));
    assert_eq!(fp(&Event::Amount(5)), fp(&json!({"Amount": 5})));
    assert_eq!(fp(&Event::Pair(1, 2)), fp(&json!({"Pair": [1, 2]})));
    assert_eq!(
        fp(&Event::Move {
            from: "a".into(),
            to: "b".into()
        }),
        fp(&json!({"Move": {"to": "b", "from": "a"}}))
    );
    for (value, json) in [
        (Event::Ping, json!("Ping")),
        (Event::Amount(5), json!({"Amount": 5})),
    ] {
        assert_eq!(serde_json::to_value(&value).expect("json"), json);
    }
}

/// Serializes through `serialize_bytes` (what `serde_bytes` does).
struct Bytes(&'static [u8]);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

#[test]
fn bytes_are_a_sequence_of_integers() {
    assert_eq!(fp(&Bytes(b"\x01\x02\xff")), fp(&vec![1u8, 2, 255]));
    assert_eq!(fp(&Bytes(b"\x01\x02\xff")), fp(&json!([1, 2, 255])));
    assert_ne!(fp(&Bytes(b"ab")), fp(&"ab"));
}

#[test]
fn different_values_fingerprint_differently() {
    let values = [
        fp(&1u8),
        fp(&"1"),
        fp(&1.0f64),
        fp(&true),
        fp(&false),
        fp(&()),
        fp(&0u8),
        fp(&""),
        fp(&[1u8, 2]),
        fp(&[2u8, 1]),
        fp(&json!({"a": 1})),
        fp(&json!({"a": 2})),
        fp(&json!({"b": 1})),
        fp(&json!({"a": 1, "b": 1})),
        fp(&json!([])),
        fp(&json!({})),
        fp(&json!([[1], 2])),
        fp(&json!([1, [2]])),
        fp(&["ab", "c"]),
        fp(&["a", "bc"]),
        fp(&json!({"a": "b"})),
        fp(&json!(["a", "b"])),
        fp(&json!([["a", "b"]])),
        fp(&BTreeMap::from([(1u8, 1u8)])),
        fp(&BTreeMap::from([("1", 1u8)])),
    ];
    for (i, a) in values.iter().enumerate() {
        for (j, b) in values.iter().enumerate().skip(i + 1) {
            assert_ne!(a, b, "values #{i} and #{j}");
        }
    }
}

/// A map that serializes the same key twice.
struct Twice;

impl Serialize for Twice {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("k", &1)?;
        m.serialize_entry("k", &2)?;
        m.end()
    }
}

#[test]
fn a_map_with_a_repeated_key_is_refused_and_named() {
    let err = Fingerprint::of_value(&BTreeMap::from([("order", vec![Twice])]))
        .expect_err("a repeated key is not a map");
    let msg = err.to_string();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{msg}");
    assert!(msg.contains("\"k\""), "{msg}");
    assert!(msg.contains("order.0"), "{msg}");
}

#[test]
fn the_canonical_encoding_is_pinned() -> Result<()> {
    // A change here changes every stored fingerprint: take a new version
    // byte and say so in the CHANGELOG instead.
    let value = json!({"amount": 100, "currency": "EUR", "lines": [1, -2, 2.5, null, true]});
    let mut encoding = vec![1u8, 8, 3]; // version 1, a map of 3 entries
    // Entries sorted by encoded key: "lines" (6 5 ..) < "amount" (6 6 ..) < "currency" (6 8 ..).
    encoding.extend_from_slice(b"\x06\x05lines\x07\x05\x03\x01\x04\x02");
    encoding.extend_from_slice(&[5, 0x40, 0x04, 0, 0, 0, 0, 0, 0, 0, 2]);
    encoding.extend_from_slice(b"\x06\x06amount\x03\x64");
    encoding.extend_from_slice(b"\x06\x08currency\x06\x03EUR");
    let fp = Fingerprint::of_value(&value)?;
    assert_eq!(fp, Fingerprint(xxhash_rust::xxh3::xxh3_128(&encoding)));
    assert_eq!(fp.to_string(), "325f788b490f0f01a888226a2bf55558");
    Ok(())
}

#[test]
#[allow(deprecated)]
fn the_postcard_fingerprint_of_earlier_builds_is_kept() -> Result<()> {
    assert_eq!(
        Fingerprint::of_postcard(&(7u32, "x"))?,
        Fingerprint::of([7u8, 1, b'x'])
    );
    Ok(())
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Kind {
    Unit,
    Newtype(i32),
    Tuple(u8, String),
    Struct { x: i64, y: Option<bool> },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    id: String,
    amount: i64,
    price: f64,
    tags: Vec<String>,
    attrs: HashMap<String, u32>,
    nested: Vec<HashMap<String, Vec<i16>>>,
    note: Option<String>,
    kind: Kind,
    big: u128,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Unit),
        any::<i32>().prop_map(Kind::Newtype),
        (any::<u8>(), "[a-z]{0,4}").prop_map(|(a, b)| Kind::Tuple(a, b)),
        (any::<i64>(), any::<Option<bool>>()).prop_map(|(x, y)| Kind::Struct { x, y }),
    ]
}

fn order() -> impl Strategy<Value = Order> {
    (
        "[a-z0-9]{0,8}",
        any::<i64>(),
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()),
        prop::collection::vec("\\PC{0,6}", 0..4),
        prop::collection::hash_map("[a-z]{1,6}", any::<u32>(), 0..12),
        prop::collection::vec(
            prop::collection::hash_map(
                "[a-c]{1,3}",
                prop::collection::vec(any::<i16>(), 0..3),
                0..5,
            ),
            0..3,
        ),
        any::<Option<String>>(),
        kind(),
        any::<u128>(),
    )
        .prop_map(
            |(id, amount, price, tags, attrs, nested, note, kind, big)| Order {
                id,
                amount,
                price,
                tags,
                attrs,
                nested,
                note,
                kind,
                big,
            },
        )
}

fn agrees<T: Serialize + Debug>(
    a: &T,
    b: &impl Serialize,
) -> std::result::Result<(), TestCaseError> {
    prop_assert_eq!(fp(a), fp(b), "{:?}", a);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A value, its round trip through JSON, and the `serde_json::Value`
    /// of its JSON fingerprint the same.
    #[test]
    fn a_value_and_its_json_round_trip_fingerprint_the_same(order in order()) {
        let bytes = serde_json::to_vec(&order).expect("encode");
        let back: Order = serde_json::from_slice(&bytes).expect("decode");
        prop_assert_eq!(&back, &order);
        agrees(&order, &back)?;
        if order.big <= u128::from(u64::MAX) {
            // serde_json::Value holds integers up to u64 only.
            let value = serde_json::to_value(&order).expect("to_value");
            agrees(&order, &value)?;
        }
        let clone = order.clone();
        agrees(&order, &clone)?;
    }
}
