//! A response as the layer stores it in the key's outcome, and back.
//!
//! Format 1: `"DKH" 1`, status (u16 BE), flags (u8: bit 0, body
//! omitted), header count (u16 BE), per header its name (u16 BE length,
//! bytes) and value (u32 BE length, bytes), then the body to the end.
//! Invariant: decoding never panics; anything malformed is an error.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 4] = b"DKH\x01";
const BODY_OMITTED: u8 = 1;

/// A stored response: what a repeat of the request is given.
#[derive(Debug, PartialEq)]
pub(crate) struct Stored {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    /// The body was over the limit: not stored, not replayed.
    pub(crate) body_omitted: bool,
    pub(crate) body: Bytes,
}

impl Stored {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        out.push(if self.body_omitted { BODY_OMITTED } else { 0 });
        // Names are at most 64 KiB (http's limit); values are cut from a
        // request no server accepts past a few KiB: both fit their widths.
        let headers: Vec<_> = self
            .headers
            .iter()
            .filter(|(n, v)| {
                u16::try_from(n.as_str().len()).is_ok() && u32::try_from(v.len()).is_ok()
            })
            .take(usize::from(u16::MAX))
            .collect();
        out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
        for (name, value) in headers {
            out.extend_from_slice(&(name.as_str().len() as u16).to_be_bytes());
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&self.body);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Stored, &'static str> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return Err("not a stored response of format 1");
        }
        let status = StatusCode::from_u16(u16::from_be_bytes(r.array()?))
            .map_err(|_| "a status out of range")?;
        let [flags] = r.array()?;
        let count = u16::from_be_bytes(r.array()?);
        let mut headers = HeaderMap::with_capacity(usize::from(count));
        for _ in 0..count {
            let n = u16::from_be_bytes(r.array()?);
            let name = HeaderName::from_bytes(r.take(usize::from(n))?)
                .map_err(|_| "a header name that is not one")?;
            let n = u32::from_be_bytes(r.array()?);
            let value = HeaderValue::from_bytes(r.take(n as usize)?)
                .map_err(|_| "a header value that is not one")?;
            headers.append(name, value);
        }
        Ok(Stored {
            status,
            headers,
            body_omitted: flags & BODY_OMITTED != 0,
            body: Bytes::copy_from_slice(r.0),
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("cut short");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], &'static str> {
        self.take(N)?.try_into().map_err(|_| "cut short")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_every_cut() {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        );
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        let s = Stored {
            status: StatusCode::CREATED,
            headers,
            body_omitted: false,
            body: Bytes::from_static(b"hello"),
        };
        let bytes = s.encode();
        assert_eq!(Stored::decode(&bytes), Ok(s));
        let body_start = bytes.len() - 5;
        for cut in 0..body_start {
            assert!(Stored::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
