//! Typed payloads: serde values stored next to a one-byte format tag.
//!
//! The tag tells raw bytes and typed values apart and lets a codec be added
//! without rewriting old records. New typed outcomes are JSON (`serde_json`):
//! it is self-describing, so `skip_serializing_if`, `untagged`, `flatten`
//! and internally tagged enums read back, which postcard (tag 1, written by
//! earlier builds and still read) cannot do. [`encode_outcome`] checks that
//! the value reads back before it is stored: an outcome that cannot be
//! replayed would be a lost outcome.

use crate::{Error, Result};

/// Payload stored as the caller's bytes.
pub(crate) const TAG_RAW: u8 = 0;
/// Payload encoded by postcard 1.x (typed outcomes of earlier builds; read only).
pub(crate) const TAG_POSTCARD: u8 = 1;
/// Payload encoded as JSON by `serde_json` (typed outcomes).
pub(crate) const TAG_JSON: u8 = 2;

/// Encodes a typed outcome as JSON and decodes it back as `T`, so a value
/// that would be stored but never replayed is refused here.
pub(crate) fn encode_outcome<T>(value: &T) -> Result<Vec<u8>>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let ty = std::any::type_name::<T>();
    let bytes = serde_json::to_vec(value)
        .map_err(|e| Error::Codec(format!("the outcome ({ty}) cannot be encoded: {e}")))?;
    serde_json::from_slice::<T>(&bytes)
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
        TAG_JSON => serde_json::from_slice(bytes)
            .map_err(|e| Error::Codec(format!("the outcome does not decode as {ty}: {e}"))),
        TAG_POSTCARD => postcard::from_bytes(bytes).map_err(|e| {
            Error::Codec(format!(
                "the (postcard) outcome does not decode as {ty}: {e}"
            ))
        }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tag_check() -> Result<()> {
        let bytes = encode_outcome(&(7u32, "x".to_string()))?;
        assert_eq!(bytes, br#"[7,"x"]"#);
        let back: (u32, String) = from_bytes(TAG_JSON, &bytes)?;
        assert_eq!(back, (7, "x".to_string()));
        assert!(matches!(
            from_bytes::<u32>(TAG_RAW, &bytes),
            Err(Error::Codec(_))
        ));
        assert!(matches!(from_bytes::<u32>(9, &bytes), Err(Error::Codec(_))));
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
        let err = encode_outcome(&f64::NAN).expect_err("NaN is JSON null");
        assert!(err.to_string().contains("cannot be read back"), "{err}");
    }
}
