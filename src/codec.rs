//! Typed payloads: serde values encoded with postcard 1.x.
//!
//! Every stored payload carries a one-byte format tag next to it, so raw bytes
//! and typed values can be told apart and a future codec can be added without
//! rewriting old records. bincode, named in the original design card, is
//! unmaintained (RUSTSEC-2025-0141); postcard is its maintained equivalent.

use crate::{Error, Result};

/// Payload stored as the caller's bytes.
pub(crate) const TAG_RAW: u8 = 0;
/// Payload encoded by postcard 1.x.
pub(crate) const TAG_POSTCARD: u8 = 1;

pub(crate) fn to_bytes<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(value).map_err(|e| Error::Codec(e.to_string()))
}

pub(crate) fn from_bytes<T: serde::de::DeserializeOwned>(tag: u8, bytes: &[u8]) -> Result<T> {
    if tag != TAG_POSTCARD {
        return Err(Error::Codec(format!(
            "payload has format tag {tag}, not a typed (postcard) payload"
        )));
    }
    postcard::from_bytes(bytes).map_err(|e| Error::Codec(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tag_check() -> Result<()> {
        let bytes = to_bytes(&(7u32, "x"))?;
        let back: (u32, String) = from_bytes(TAG_POSTCARD, &bytes)?;
        assert_eq!(back, (7, "x".to_string()));
        assert!(matches!(
            from_bytes::<u32>(TAG_RAW, &bytes),
            Err(Error::Codec(_))
        ));
        assert!(matches!(
            from_bytes::<String>(TAG_POSTCARD, &[0xff, 0xff]),
            Err(Error::Codec(_))
        ));
        Ok(())
    }
}
