//! Canonical values: a serde `Serializer` that turns any `Serialize` value
//! into a JSON-like tree, and the one byte encoding of that tree that
//! fingerprints and keys from structured data hash.
//!
//! Invariant: two values that are equal in the model below encode to the
//! same bytes, and two that differ encode to different bytes (the encoding
//! is prefix-free, so it is injective). The model (docs/design.md,
//! "Canonical values"):
//!
//! - null: `()`, `None`, a unit struct;
//! - bool;
//! - integer: every integer type is one kind (`5u8` equals `5i64`);
//! - float: `f32` and `f64` as the `f64` bits, every NaN one NaN; a float
//!   is never equal to an integer (`5.0` is not `5`);
//! - string: `str`, `String`, `char`;
//! - sequence: seq, tuple, tuple struct, and bytes (a sequence of integers,
//!   like `Vec<u8>`);
//! - map: map and struct; entries sorted by their encoded key, so
//!   iteration order never matters; a key repeated in one map is refused;
//! - `Some(x)` and a newtype struct are `x`; enums are tagged like
//!   `serde_json` (a unit variant is its name, any other `{name: content}`).
//!
//! Encoding: `0` null, `1` false, `2` true, `3 var` a non-negative and
//! `4 var` a negative integer (`var` the LEB128 of the magnitude), `5` and
//! the eight big-endian bytes of a float, `6 var bytes` a string, `7 var
//! item*` a sequence, `8 var (key value)*` a map. A hashed encoding starts
//! with a domain byte ([`FINGERPRINT_V1`], [`KEY_V1`]).

use std::fmt;

use serde::ser::{self, Serialize};

use crate::{Error, Result};

/// The first byte of a hashed encoding behind `Fingerprint::of_value`; a
/// change of the encoding takes a new one.
pub(crate) const FINGERPRINT_V1: u8 = 1;
/// The first byte of a hashed encoding behind `Key::from_fields`.
pub(crate) const KEY_V1: u8 = 2;

/// Deepest nesting accepted (every compound, option and newtype is a
/// level), so the serializer's recursion stays bounded; `serde_json`
/// decodes 128 levels too.
const MAX_DEPTH: usize = 128;

/// The one NaN.
const NAN_BITS: u64 = 0x7ff8_0000_0000_0000;

/// A value of the canonical model. Map entries keep their serialization
/// order here; the encoder sorts them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int { neg: bool, mag: u128 },
    Float(u64),
    Str(String),
    Seq(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl Value {
    fn int(neg: bool, mag: u128) -> Self {
        Value::Int {
            neg: neg && mag != 0,
            mag,
        }
    }

    fn float(v: f64) -> Self {
        Value::Float(if v.is_nan() { NAN_BITS } else { v.to_bits() })
    }

    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a bool",
            Value::Int { .. } => "an integer",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a sequence",
            Value::Map(_) => "a map",
        }
    }
}

/// JSON-like text, for error messages.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int { neg, mag } => write!(f, "{}{mag}", if *neg { "-" } else { "" }),
            Value::Float(bits) => write!(f, "{:?}", f64::from_bits(*bits)),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Seq(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    write!(f, "{}{v}", if i == 0 { "" } else { "," })?;
                }
                f.write_str("]")
            }
            Value::Map(entries) => {
                f.write_str("{")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    write!(f, "{}{k}:{v}", if i == 0 { "" } else { "," })?;
                }
                f.write_str("}")
            }
        }
    }
}

/// The canonical value of `value`.
pub(crate) fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value> {
    value.serialize(Canon { depth: 0 }).map_err(|e| match e {
        CanonError::TooDeep => Error::InvalidArgument {
            what: "value",
            reason: format!("nests deeper than {MAX_DEPTH} levels"),
        },
        CanonError::Custom(msg) => Error::Codec(format!("the value cannot be serialized: {msg}")),
    })
}

/// The canonical encoding of `value` after the `domain` byte.
pub(crate) fn encode(domain: u8, value: &Value) -> Result<Vec<u8>> {
    let mut out = vec![domain];
    let mut path = Vec::new();
    write(value, &mut path, &mut out)?;
    Ok(out)
}

/// xxh3-128 of the canonical encoding.
pub(crate) fn hash(domain: u8, value: &Value) -> Result<u128> {
    Ok(xxhash_rust::xxh3::xxh3_128(&encode(domain, value)?))
}

/// A path segment for error messages: a map key or a sequence index.
enum Seg<'a> {
    Key(&'a Value),
    Index(usize),
}

fn show_path(path: &[Seg<'_>]) -> String {
    if path.is_empty() {
        return "the top level".into();
    }
    let mut out = String::new();
    for (i, seg) in path.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        match seg {
            Seg::Key(Value::Str(s)) => out.push_str(s),
            Seg::Key(other) => out.push_str(&other.to_string()),
            Seg::Index(n) => out.push_str(&n.to_string()),
        }
    }
    out
}

fn var(mut n: u128, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn write<'a>(value: &'a Value, path: &mut Vec<Seg<'a>>, out: &mut Vec<u8>) -> Result<()> {
    match value {
        Value::Null => out.push(0),
        Value::Bool(b) => out.push(1 + u8::from(*b)),
        Value::Int { neg, mag } => {
            out.push(if *neg { 4 } else { 3 });
            var(*mag, out);
        }
        Value::Float(bits) => {
            out.push(5);
            out.extend_from_slice(&bits.to_be_bytes());
        }
        Value::Str(s) => {
            out.push(6);
            var(s.len() as u128, out);
            out.extend_from_slice(s.as_bytes());
        }
        Value::Seq(items) => {
            out.push(7);
            var(items.len() as u128, out);
            for (i, item) in items.iter().enumerate() {
                path.push(Seg::Index(i));
                write(item, path, out)?;
                path.pop();
            }
        }
        Value::Map(entries) => {
            out.push(8);
            var(entries.len() as u128, out);
            let mut encoded = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let mut key = Vec::new();
                path.push(Seg::Key(k));
                write(k, path, &mut key)?;
                let mut val = Vec::new();
                write(v, path, &mut val)?;
                path.pop();
                encoded.push((key, val, k));
            }
            encoded.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            if let Some(w) = encoded.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(Error::InvalidArgument {
                    what: "value",
                    reason: format!("has the map key {} twice at {}", w[0].2, show_path(path)),
                });
            }
            for (key, val, _) in encoded {
                out.extend_from_slice(&key);
                out.extend_from_slice(&val);
            }
        }
    }
    Ok(())
}

/// Selects the values at dotted `paths` in `value` into the map
/// `{path: value}`, the input of a key from structured data.
pub(crate) fn select(value: &Value, paths: &[&str]) -> Result<Value> {
    if paths.is_empty() {
        return Err(Error::InvalidArgument {
            what: "paths",
            reason: "is empty: a key needs at least one field".into(),
        });
    }
    let mut entries = Vec::with_capacity(paths.len());
    for (i, path) in paths.iter().enumerate() {
        if paths[..i].contains(path) {
            return Err(Error::InvalidArgument {
                what: "paths",
                reason: format!("list {path:?} twice"),
            });
        }
        entries.push((
            Value::Str((*path).to_string()),
            lookup(value, path)?.clone(),
        ));
    }
    Ok(Value::Map(entries))
}

fn lookup<'a>(value: &'a Value, path: &str) -> Result<&'a Value> {
    let bad = |reason: String| Error::InvalidArgument {
        what: "path",
        reason: format!("{path:?} {reason}"),
    };
    let mut at = value;
    let mut done = 0; // bytes of `path` walked, for "where"
    for seg in path.split('.') {
        let here = if done == 0 {
            "the top level".to_string()
        } else {
            format!("{:?}", &path[..done - 1])
        };
        if seg.is_empty() {
            return Err(bad("has an empty segment".into()));
        }
        at = match at {
            Value::Map(entries) => {
                let mut found = entries
                    .iter()
                    .filter(|(k, _)| matches!(k, Value::Str(s) if s == seg));
                let first = found
                    .next()
                    .ok_or_else(|| bad(format!("selects nothing: {here} has no field {seg:?}")))?;
                if found.next().is_some() {
                    return Err(bad(format!(
                        "is ambiguous: {here} has the key {seg:?} twice"
                    )));
                }
                &first.1
            }
            Value::Seq(items) => {
                let index = seg
                    .parse::<usize>()
                    .ok()
                    .filter(|i| i.to_string() == seg)
                    .ok_or_else(|| {
                        bad(format!(
                            "selects nothing: {here} is a sequence and {seg:?} is not an index"
                        ))
                    })?;
                items.get(index).ok_or_else(|| {
                    bad(format!(
                        "selects nothing: {here} has {} items, no index {index}",
                        items.len()
                    ))
                })?
            }
            other => {
                return Err(bad(format!(
                    "selects nothing: {here} is {}, not a map or a sequence",
                    other.kind()
                )));
            }
        };
        done += seg.len() + 1;
    }
    Ok(at)
}

/// Why a value has no canonical form.
#[derive(Debug)]
enum CanonError {
    /// The value's `Serialize` failed.
    Custom(String),
    TooDeep,
}

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CanonError::Custom(msg) => f.write_str(msg),
            CanonError::TooDeep => write!(f, "nests deeper than {MAX_DEPTH} levels"),
        }
    }
}

impl std::error::Error for CanonError {}

impl ser::Error for CanonError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        CanonError::Custom(msg.to_string())
    }
}

/// The serializer: builds a [`Value`].
#[derive(Clone, Copy)]
struct Canon {
    depth: usize,
}

impl Canon {
    fn child(self) -> std::result::Result<Canon, CanonError> {
        if self.depth >= MAX_DEPTH {
            return Err(CanonError::TooDeep);
        }
        Ok(Canon {
            depth: self.depth + 1,
        })
    }
}

type R = std::result::Result<Value, CanonError>;

fn variant(name: &'static str, content: Value) -> Value {
    Value::Map(vec![(Value::Str(name.into()), content)])
}

impl ser::Serializer for Canon {
    type Ok = Value;
    type Error = CanonError;
    type SerializeSeq = SeqBuilder;
    type SerializeTuple = SeqBuilder;
    type SerializeTupleStruct = SeqBuilder;
    type SerializeTupleVariant = SeqBuilder;
    type SerializeMap = MapBuilder;
    type SerializeStruct = MapBuilder;
    type SerializeStructVariant = MapBuilder;

    fn serialize_bool(self, v: bool) -> R {
        Ok(Value::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> R {
        self.serialize_i128(i128::from(v))
    }
    fn serialize_i16(self, v: i16) -> R {
        self.serialize_i128(i128::from(v))
    }
    fn serialize_i32(self, v: i32) -> R {
        self.serialize_i128(i128::from(v))
    }
    fn serialize_i64(self, v: i64) -> R {
        self.serialize_i128(i128::from(v))
    }
    fn serialize_i128(self, v: i128) -> R {
        Ok(Value::int(v < 0, v.unsigned_abs()))
    }
    fn serialize_u8(self, v: u8) -> R {
        self.serialize_u128(u128::from(v))
    }
    fn serialize_u16(self, v: u16) -> R {
        self.serialize_u128(u128::from(v))
    }
    fn serialize_u32(self, v: u32) -> R {
        self.serialize_u128(u128::from(v))
    }
    fn serialize_u64(self, v: u64) -> R {
        self.serialize_u128(u128::from(v))
    }
    fn serialize_u128(self, v: u128) -> R {
        Ok(Value::int(false, v))
    }
    fn serialize_f32(self, v: f32) -> R {
        Ok(Value::float(f64::from(v)))
    }
    fn serialize_f64(self, v: f64) -> R {
        Ok(Value::float(v))
    }
    fn serialize_char(self, v: char) -> R {
        Ok(Value::Str(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> R {
        Ok(Value::Str(v.to_string()))
    }
    fn serialize_bytes(self, v: &[u8]) -> R {
        Ok(Value::Seq(
            v.iter()
                .map(|&b| Value::int(false, u128::from(b)))
                .collect(),
        ))
    }
    fn serialize_none(self) -> R {
        Ok(Value::Null)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> R {
        value.serialize(self.child()?)
    }
    fn serialize_unit(self) -> R {
        Ok(Value::Null)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> R {
        Ok(Value::Null)
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> R {
        Ok(Value::Str(variant.into()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> R {
        value.serialize(self.child()?)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        name: &'static str,
        value: &T,
    ) -> R {
        Ok(variant(name, value.serialize(self.child()?)?))
    }
    fn serialize_seq(self, len: Option<usize>) -> std::result::Result<SeqBuilder, CanonError> {
        Ok(SeqBuilder {
            inner: self.child()?,
            items: Vec::with_capacity(len.unwrap_or(0).min(4096)),
            variant: None,
        })
    }
    fn serialize_tuple(self, len: usize) -> std::result::Result<SeqBuilder, CanonError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> std::result::Result<SeqBuilder, CanonError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        name: &'static str,
        len: usize,
    ) -> std::result::Result<SeqBuilder, CanonError> {
        let mut seq = self.child()?.serialize_seq(Some(len))?;
        seq.variant = Some(name);
        Ok(seq)
    }
    fn serialize_map(self, len: Option<usize>) -> std::result::Result<MapBuilder, CanonError> {
        Ok(MapBuilder {
            inner: self.child()?,
            entries: Vec::with_capacity(len.unwrap_or(0).min(4096)),
            key: None,
            variant: None,
        })
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> std::result::Result<MapBuilder, CanonError> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        name: &'static str,
        len: usize,
    ) -> std::result::Result<MapBuilder, CanonError> {
        let mut map = self.child()?.serialize_map(Some(len))?;
        map.variant = Some(name);
        Ok(map)
    }
}

/// Builds a sequence (and the content of a tuple variant).
struct SeqBuilder {
    inner: Canon,
    items: Vec<Value>,
    variant: Option<&'static str>,
}

impl SeqBuilder {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> std::result::Result<(), CanonError> {
        self.items.push(value.serialize(self.inner)?);
        Ok(())
    }

    fn finish(self) -> Value {
        let seq = Value::Seq(self.items);
        match self.variant {
            Some(name) => variant(name, seq),
            None => seq,
        }
    }
}

/// The four sequence-like serde traits, all pushing to one `SeqBuilder`.
macro_rules! seq_builder {
    ($($trait_:ident :: $method:ident),+) => {$(
        impl ser::$trait_ for SeqBuilder {
            type Ok = Value;
            type Error = CanonError;
            fn $method<T: Serialize + ?Sized>(
                &mut self,
                value: &T,
            ) -> std::result::Result<(), CanonError> {
                self.push(value)
            }
            fn end(self) -> R {
                Ok(self.finish())
            }
        }
    )+};
}

seq_builder!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// Builds a map or struct (and the content of a struct variant).
struct MapBuilder {
    inner: Canon,
    entries: Vec<(Value, Value)>,
    key: Option<Value>,
    variant: Option<&'static str>,
}

impl MapBuilder {
    fn finish(self) -> R {
        if self.key.is_some() {
            return Err(CanonError::Custom("a map key without a value".into()));
        }
        let map = Value::Map(self.entries);
        Ok(match self.variant {
            Some(name) => variant(name, map),
            None => map,
        })
    }

    fn field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> std::result::Result<(), CanonError> {
        let value = value.serialize(self.inner)?;
        self.entries.push((Value::Str(key.into()), value));
        Ok(())
    }
}

impl ser::SerializeMap for MapBuilder {
    type Ok = Value;
    type Error = CanonError;
    fn serialize_key<T: Serialize + ?Sized>(
        &mut self,
        key: &T,
    ) -> std::result::Result<(), CanonError> {
        if self.key.is_some() {
            return Err(CanonError::Custom("a map key without a value".into()));
        }
        self.key = Some(key.serialize(self.inner)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> std::result::Result<(), CanonError> {
        let key = self
            .key
            .take()
            .ok_or_else(|| CanonError::Custom("a map value without a key".into()))?;
        self.entries.push((key, value.serialize(self.inner)?));
        Ok(())
    }
    fn end(self) -> R {
        self.finish()
    }
}

impl ser::SerializeStruct for MapBuilder {
    type Ok = Value;
    type Error = CanonError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> std::result::Result<(), CanonError> {
        self.field(key, value)
    }
    fn end(self) -> R {
        self.finish()
    }
}

impl ser::SerializeStructVariant for MapBuilder {
    type Ok = Value;
    type Error = CanonError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> std::result::Result<(), CanonError> {
        self.field(key, value)
    }
    fn end(self) -> R {
        self.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
        encode(0, &to_value(v).expect("value")).expect("encode")
    }

    #[test]
    fn the_encoding_is_the_documented_one() {
        assert_eq!(bytes(&()), [0, 0]);
        assert_eq!(bytes(&(false, true)), [0, 7, 2, 1, 2]);
        assert_eq!(bytes(&300u16), [0, 3, 0xac, 0x02]);
        assert_eq!(bytes(&-1i8), [0, 4, 1]);
        assert_eq!(bytes(&u128::MAX).len(), 2 + 19);
        assert_eq!(bytes(&1.0f64), [0, 5, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes("ab"), [0, 6, 2, b'a', b'b']);
        // Entries sorted by encoded key: "a" (6 1 'a') before "bb" (6 2 ..)
        // and before the integer key 1 (3 1).
        let mut m = std::collections::HashMap::new();
        m.insert("bb", 1u8);
        m.insert("a", 2u8);
        assert_eq!(
            bytes(&m),
            [0, 8, 2, 6, 1, b'a', 3, 2, 6, 2, b'b', b'b', 3, 1]
        );
    }

    #[test]
    fn zero_has_no_sign() {
        assert_eq!(Value::int(true, 0), Value::int(false, 0));
    }

    #[test]
    fn a_deep_value_is_refused_not_overflowed() {
        assert!(matches!(
            to_value(&Nest(MAX_DEPTH + 5)),
            Err(Error::InvalidArgument { what: "value", .. })
        ));
        assert!(to_value(&Nest(MAX_DEPTH - 1)).is_ok());
    }

    /// `n` nested one-element sequences around a 0.
    struct Nest(usize);

    impl Serialize for Nest {
        fn serialize<S: ser::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            use ser::SerializeSeq;
            if self.0 == 0 {
                return s.serialize_u8(0);
            }
            let mut seq = s.serialize_seq(Some(1))?;
            seq.serialize_element(&Nest(self.0 - 1))?;
            seq.end()
        }
    }

    #[test]
    fn select_walks_maps_and_sequences() -> Result<()> {
        let v = to_value(&serde_json::json!({"order": {"id": 7, "items": ["a", "b"]}}))?;
        let sel = select(&v, &["order.items.1", "order.id"])?;
        assert_eq!(
            sel,
            Value::Map(vec![
                (Value::Str("order.items.1".into()), Value::Str("b".into())),
                (Value::Str("order.id".into()), Value::int(false, 7)),
            ])
        );
        for (path, needle) in [
            ("order.nope", "has no field \"nope\""),
            ("order.items.2", "has 2 items, no index 2"),
            ("order.items.01", "is not an index"),
            ("order.id.x", "is an integer, not a map"),
            ("order..id", "empty segment"),
            ("", "empty segment"),
        ] {
            let err = select(&v, &[path]).expect_err(path);
            let msg = err.to_string();
            assert!(
                matches!(err, Error::InvalidArgument { what: "path", .. }),
                "{msg}"
            );
            assert!(msg.contains(needle), "{path}: {msg}");
            assert!(msg.contains(&format!("{path:?}")), "{path}: {msg}");
        }
        Ok(())
    }
}
