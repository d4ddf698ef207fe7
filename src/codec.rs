//! Typed payloads: serde values stored next to a one-byte format tag.
//!
//! The tag tells raw bytes and typed values apart and lets a codec be added
//! without rewriting old records. New typed outcomes are CBOR (RFC 8949,
//! through `ciborium`, tag 3): self-describing, so `skip_serializing_if`,
//! `untagged`, `flatten` and internally tagged enums read back, and binary,
//! so every `f64` bit pattern (NaN payloads, infinities, -0.0) and the
//! whole `u128`/`i128` range read back, which JSON (tag 2) cannot do. A
//! value CBOR does not read back but JSON does (a `()` inside a `flatten`ed
//! or `untagged` type) is stored as JSON, so nothing that earlier builds
//! stored is refused now. Tags 1 (postcard) and 2 (JSON) of earlier builds
//! are read. [`encode_outcome`] checks that the value reads back before it
//! is stored: an outcome that cannot be replayed would be a lost outcome.

use crate::{Error, Result};

/// Payload stored as the caller's bytes.
pub(crate) const TAG_RAW: u8 = 0;
/// Payload encoded by postcard 1.x (typed outcomes of earlier builds; read only).
pub(crate) const TAG_POSTCARD: u8 = 1;
/// Payload encoded as JSON by `serde_json` (typed outcomes of earlier
/// builds, and values that only JSON reads back).
pub(crate) const TAG_JSON: u8 = 2;
/// Payload encoded as CBOR by `ciborium` 0.2 (typed outcomes).
pub(crate) const TAG_CBOR: u8 = 3;

/// The tags `complete_value` tries, in order: the first whose encoding
/// reads back is stored. The one switch between codecs: a store that must
/// stay readable by builds before tag 3 would pass `&[TAG_JSON]` instead
/// (docs/design.md, "Outcome encoding").
pub(crate) const WRITE_TAGS: &[u8] = &[TAG_CBOR, TAG_JSON];

/// Nesting deeper than this is refused when decoding (as `serde_json` does):
/// decoding recurses once per level.
const MAX_DEPTH: usize = 128;

/// Encodes a typed outcome under the first of `tags` whose encoding
/// decodes back as `T`, and returns that tag and the bytes; a value that
/// would be stored but never replayed is refused here, with the first
/// tag's error.
pub(crate) fn encode_outcome<T>(tags: &[u8], value: &T) -> Result<(u8, Vec<u8>)>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let mut first = None;
    for &tag in tags {
        match encode_as(tag, value) {
            Ok(bytes) => return Ok((tag, bytes)),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_else(|| Error::Codec("no outcome codec to write with".into())))
}

/// Encodes `value` under `tag` and checks that it decodes back as `T`.
fn encode_as<T>(tag: u8, value: &T) -> Result<Vec<u8>>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let ty = std::any::type_name::<T>();
    let bytes = match tag {
        TAG_CBOR => {
            let mut out = Vec::new();
            ciborium::into_writer(value, &mut out)
                .map(|()| out)
                .map_err(|e| match e {
                    ciborium::ser::Error::Value(msg) => msg,
                    ciborium::ser::Error::Io(e) => e.to_string(),
                })
        }
        TAG_JSON => serde_json::to_vec(value).map_err(|e| e.to_string()),
        other => Err(format!("format tag {other} is not written")),
    }
    .map_err(|e| Error::Codec(format!("the outcome ({ty}) cannot be encoded: {e}")))?;
    decode::<T>(tag, &bytes)
        .map_err(|e| Error::Codec(format!("the outcome ({ty}) cannot be read back: {e}")))?;
    Ok(bytes)
}

/// Postcard bytes of a value (for the deprecated `Fingerprint::of_postcard`).
pub(crate) fn to_postcard<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(value).map_err(|e| Error::Codec(e.to_string()))
}

/// Decodes a typed payload by its format tag.
pub(crate) fn from_bytes<T: serde::de::DeserializeOwned>(tag: u8, bytes: &[u8]) -> Result<T> {
    let ty = std::any::type_name::<T>();
    match tag {
        TAG_CBOR | TAG_JSON | TAG_POSTCARD => decode(tag, bytes)
            .map_err(|e| Error::Codec(format!("the outcome does not decode as {ty}: {e}"))),
        TAG_RAW => Err(Error::Codec(
            "the outcome was stored as raw bytes (complete), not as a typed value \
             (complete_value): read it with Record::outcome"
                .into(),
        )),
        other => Err(Error::Codec(format!(
            "the outcome has format tag {other}, which this build does not know"
        ))),
    }
}

/// Decodes `bytes` with the codec of a typed tag; the error as text.
fn decode<T: serde::de::DeserializeOwned>(tag: u8, bytes: &[u8]) -> Result<T, String> {
    match tag {
        TAG_CBOR => {
            ciborium::de::from_reader_with_recursion_limit(bytes, MAX_DEPTH).map_err(|e| match e {
                ciborium::de::Error::Semantic(_, msg) => msg,
                ciborium::de::Error::Syntax(at) => format!("not CBOR at byte {at}"),
                ciborium::de::Error::Io(e) => format!("{e:?}"),
                ciborium::de::Error::RecursionLimitExceeded => {
                    format!("nested deeper than {MAX_DEPTH} levels")
                }
            })
        }
        TAG_JSON => serde_json::from_slice(bytes).map_err(|e| format!("(JSON) {e}")),
        TAG_POSTCARD => postcard::from_bytes(bytes).map_err(|e| format!("(postcard) {e}")),
        other => Err(format!("format tag {other} is not a typed value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `complete_value` stores for `value`.
    fn written<T>(value: &T) -> Result<(u8, Vec<u8>)>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        encode_outcome(WRITE_TAGS, value)
    }

    #[test]
    fn round_trip_and_tag_check() -> Result<()> {
        let (tag, bytes) = written(&(7u32, "x".to_string()))?;
        assert_eq!(tag, TAG_CBOR);
        // An array of 2: the integer 7, the text "x".
        assert_eq!(bytes, b"\x82\x07\x61x");
        let back: (u32, String) = from_bytes(tag, &bytes)?;
        assert_eq!(back, (7, "x".to_string()));
        assert!(matches!(
            from_bytes::<u32>(TAG_RAW, &bytes),
            Err(Error::Codec(_))
        ));
        assert!(matches!(from_bytes::<u32>(9, &bytes), Err(Error::Codec(_))));
        assert!(matches!(
            from_bytes::<String>(TAG_CBOR, &[0xff]),
            Err(Error::Codec(_))
        ));
        Ok(())
    }

    /// Tag 3 is pinned (RFC 8949): structs are maps keyed by field name
    /// (what `skip_serializing_if` and internally tagged enums need), a float
    /// is the shortest width that holds its bits exactly, an integer beyond
    /// 64 bits a bignum (tags 2 and 3).
    #[test]
    fn the_cbor_layout_is_pinned() -> Result<()> {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct R {
            id: String,
            cents: u64,
        }
        let r = R {
            id: "r".into(),
            cents: 5,
        };
        assert_eq!(
            written(&r)?,
            (TAG_CBOR, b"\xa2\x62id\x61r\x65cents\x05".to_vec())
        );
        let (_, bytes) = written(&(f64::NAN, -0.0f32, 0.1f64, u128::MAX, i128::MIN))?;
        let mut want = vec![0x85, 0xf9, 0x7e, 0x00, 0xf9, 0x80, 0x00, 0xfb];
        want.extend(0.1f64.to_be_bytes());
        want.extend([0xc2, 0x50]);
        want.extend(u128::MAX.to_be_bytes());
        want.extend([0xc3, 0x50]);
        want.extend((i128::MAX as u128).to_be_bytes()); // -1 - i128::MIN
        assert_eq!(bytes, want);
        Ok(())
    }

    /// The one bit pattern CBOR (ciborium) does not keep: an `f32`
    /// signalling NaN is widened to `f64` on the way in, which quiets it;
    /// its sign and payload stay.
    #[test]
    fn an_f32_signalling_nan_reads_back_quiet() -> Result<()> {
        let (tag, bytes) = written(&f32::from_bits(0x7fa0_0001))?;
        let back: f32 = from_bytes(tag, &bytes)?;
        assert_eq!(back.to_bits(), 0x7fe0_0001);
        Ok(())
    }

    /// A `()` inside a buffered type (`flatten`, `untagged`) does not read
    /// back from CBOR (null is buffered as "none", which is not a unit), but
    /// does from JSON: such a value is stored as JSON, as earlier builds
    /// stored it.
    #[test]
    fn what_only_json_reads_back_is_stored_as_json() -> Result<()> {
        #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Flat {
            #[serde(flatten)]
            inner: Unit,
        }
        #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Unit {
            ack: (),
        }
        let flat = Flat {
            inner: Unit { ack: () },
        };
        assert!(encode_outcome(&[TAG_CBOR], &flat).is_err());
        let (tag, bytes) = written(&flat)?;
        assert_eq!((tag, &bytes[..]), (TAG_JSON, &br#"{"ack":null}"#[..]));
        assert_eq!(from_bytes::<Flat>(tag, &bytes)?, flat);
        // Refused by both: the first tag's error.
        let err = written(&(f64::NAN, flat)).expect_err("NaN and a buffered unit");
        assert!(err.to_string().contains("cannot be read back"), "{err}");
        assert!(!err.to_string().contains("JSON"), "{err}");
        Ok(())
    }

    /// Tag 2 bytes as earlier builds wrote them (`serde_json`, with
    /// `float_roundtrip`) still decode, floats bit for bit.
    #[test]
    fn json_payloads_still_decode() -> Result<()> {
        // The JSON writer is what earlier builds' `complete_value` ran.
        let (_, bytes) = encode_outcome(&[TAG_JSON], &(7u32, "x".to_string()))?;
        assert_eq!(bytes, br#"[7,"x"]"#);
        let err = encode_outcome(&[TAG_JSON], &f64::NAN).expect_err("NaN is JSON null");
        assert!(err.to_string().contains("cannot be read back"), "{err}");
        let err = encode_outcome(&[TAG_RAW], &1u8).expect_err("not a typed tag");
        assert!(err.to_string().contains("cannot be encoded"), "{err}");
        let back: (u32, String) = from_bytes(TAG_JSON, br#"[7,"x"]"#)?;
        assert_eq!(back, (7, "x".to_string()));
        let back: Vec<f64> = from_bytes(TAG_JSON, b"[0.1,-0.0,0.6666666666666666,5e-324]")?;
        let bits: Vec<u64> = back.iter().map(|f| f.to_bits()).collect();
        let want: Vec<u64> = [0.1, -0.0, 2.0 / 3.0, 5e-324]
            .iter()
            .map(|f: &f64| f.to_bits())
            .collect();
        assert_eq!(bits, want);
        let back: u128 = from_bytes(TAG_JSON, b"340282366920938463463374607431768211455")?;
        assert_eq!(back, u128::MAX);
        assert!(matches!(
            from_bytes::<String>(TAG_JSON, &[0xff, 0xff]),
            Err(Error::Codec(_))
        ));
        Ok(())
    }

    #[test]
    fn postcard_payloads_still_decode() -> Result<()> {
        let bytes = to_postcard(&(7u32, "x"))?;
        let back: (u32, String) = from_bytes(TAG_POSTCARD, &bytes)?;
        assert_eq!(back, (7, "x".to_string()));
        assert!(matches!(
            from_bytes::<String>(TAG_POSTCARD, &[0xff, 0xff]),
            Err(Error::Codec(_))
        ));
        Ok(())
    }

    #[test]
    fn an_outcome_that_does_not_read_back_is_refused() {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Flat {
            #[serde(flatten)]
            inner: Wide,
        }
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Wide {
            big: u128,
        }
        // serde buffers flattened fields without 128-bit integers.
        let err = written(&Flat {
            inner: Wide { big: 1 },
        })
        .expect_err("a flattened u128 does not read back");
        assert!(err.to_string().contains("cannot be read back"), "{err}");
    }

    #[test]
    fn nesting_is_limited_when_decoding() {
        // `n` nested one-element arrays around a 0.
        let nested = |n: usize| {
            let mut bytes = vec![0x81; n];
            bytes.push(0);
            from_bytes::<serde::de::IgnoredAny>(TAG_CBOR, &bytes)
        };
        let err = nested(MAX_DEPTH + 1).expect_err("deeper than MAX_DEPTH");
        assert!(err.to_string().contains("nested deeper than 128"), "{err}");
        assert!(nested(MAX_DEPTH).is_ok());
    }
}
