//! What the layer reads from a request: the `Idempotency-Key` field and
//! the request's fingerprint.
//!
//! Invariant: nothing here panics on what a client sent; every refusal is
//! a [`Refusal`] naming the field and the limit.

use bytes::Bytes;
use dedupkv::Fingerprint;
use http::header::{HeaderMap, HeaderName};
use http::request::Parts;

use crate::problem::Refusal;

/// The request field the draft names.
pub(crate) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The key the request carries: `Ok(None)` when it carries none.
///
/// The draft makes the field a Structured Field String (`"…"`, RFC 8941);
/// a bare token (what most clients send) is taken as it is. Refused: the
/// field twice, an empty key, a key over `max_len` bytes, bytes outside
/// visible ASCII, a malformed quoted string.
pub(crate) fn idempotency_key(
    headers: &HeaderMap,
    max_len: usize,
) -> Result<Option<String>, Refusal> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Refusal::bad_key("appears more than once"));
    }
    let raw = value.as_bytes();
    let key = match raw {
        [b'"', inner @ .., b'"'] => unquote(inner)?,
        [b'"', ..] => return Err(Refusal::bad_key("opens a quoted string it does not close")),
        _ => raw.to_vec(),
    };
    if key.is_empty() {
        return Err(Refusal::bad_key("is empty"));
    }
    if key.len() > max_len {
        return Err(Refusal::bad_key(&format!(
            "is {} bytes, longer than the limit of {max_len} bytes",
            key.len()
        )));
    }
    if !key.iter().all(|b| (0x20..0x7f).contains(b)) {
        return Err(Refusal::bad_key("holds bytes outside visible ASCII"));
    }
    // Visible ASCII only, checked above: valid UTF-8.
    String::from_utf8(key)
        .map(Some)
        .map_err(|_| Refusal::bad_key("is not UTF-8"))
}

/// The content of an RFC 8941 string: `\"` and `\\` are the only escapes.
fn unquote(inner: &[u8]) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(Refusal::bad_key("has an escape other than \\\" or \\\\")),
            },
            b'"' => return Err(Refusal::bad_key("has an unescaped quote inside its string")),
            _ => out.push(b),
        }
    }
    Ok(out)
}

/// The request's fingerprint: xxh3-128 over its method, path and query,
/// the values of `headers` (in the order given), and its body, each
/// length-prefixed so no two different requests share an encoding.
pub(crate) fn fingerprint(parts: &Parts, headers: &[HeaderName], body: &Bytes) -> Fingerprint {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(b"dedupkv-http fingerprint 1");
    field(parts.method.as_str().as_bytes());
    field(
        parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
            .as_bytes(),
    );
    for name in headers {
        let values = parts.headers.get_all(name);
        field(name.as_str().as_bytes());
        field(&(values.iter().count() as u64).to_le_bytes());
        for v in values {
            field(v.as_bytes());
        }
    }
    field(body);
    Fingerprint(h.digest128())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: &'static str) -> Result<Option<String>, Refusal> {
        let mut h = HeaderMap::new();
        h.insert(IDEMPOTENCY_KEY, http::HeaderValue::from_static(v));
        idempotency_key(&h, 8)
    }

    #[test]
    fn keys_bare_and_quoted() {
        assert_eq!(key("abc").ok().flatten().as_deref(), Some("abc"));
        assert_eq!(key("\"a\\\"b\"").ok().flatten().as_deref(), Some("a\"b"));
        assert!(key("\"\"").is_err());
        assert!(key("\"abc").is_err());
        assert!(key("\"a\\nb\"").is_err());
        assert!(key("123456789").is_err());
        assert!(idempotency_key(&HeaderMap::new(), 8).is_ok_and(|k| k.is_none()));
    }

    #[test]
    fn fingerprints_differ_by_field_boundaries() {
        let parts = |uri: &str| http::Request::post(uri).body(()).map(|r| r.into_parts().0);
        let (Ok(a), Ok(b)) = (parts("/ab"), parts("/a")) else {
            unreachable!("valid URIs")
        };
        assert_ne!(
            fingerprint(&a, &[], &Bytes::from_static(b"c")),
            fingerprint(&b, &[], &Bytes::from_static(b"bc"))
        );
    }
}
