//! The journal's bytes: the segment header, the record frame, and a
//! commit as a record's payload. Part of the file format (see
//! docs/design.md, "The journal").
//!
//! - header, at offset 0, [`HEADER_BYTES`] reserved: magic (8), version
//!   (u32), zero (u32), the segment's length (u64), xxh3-64 of those 24
//!   bytes (u64); the rest zeros. Written once, when the segment is made.
//! - record, from [`HEADER_BYTES`], back to back: payload length (u32),
//!   zero (u32), epoch (u64), sequence (u64), xxh3-64 of the 24 bytes
//!   before it and the payload (u64), then the payload.
//! - payload: a [`Commit`]'s parts in its own order, every count a u32,
//!   every number a u64, every byte string its length (u32) and bytes; a
//!   row's bytes are the sealed row the log already writes.
//!
//! All integers little-endian.

use super::super::Commit;
use crate::log::error::LogError;

/// The first bytes of a journal segment.
pub(crate) const MAGIC: [u8; 8] = *b"dkvjrnl\x01";
/// The version of this format: 2 writes each run of records from the
/// start of one of two halves ([`halves`]); 1 had one run, from
/// [`HEADER_BYTES`] to the end (still read; upgraded on a writable open).
pub(crate) const VERSION: u32 = 2;
/// The bytes reserved for the header: records start here.
pub(crate) const HEADER_BYTES: u64 = 4096;
/// The bytes of a record's frame before its payload.
pub(crate) const FRAME_BYTES: usize = 32;

/// A header (format [`VERSION`]) for a segment of `len` bytes.
pub(crate) fn header(len: u64) -> Vec<u8> {
    header_of(len, VERSION)
}

/// A header of format `version` for a segment of `len` bytes.
pub(crate) fn header_of(len: u64, version: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(32);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&h);
    h.extend_from_slice(&sum.to_le_bytes());
    h
}

/// The two halves of a format-2 segment of `len` bytes: (start, end) of
/// each, the second starting at a 512-byte boundary.
pub(crate) fn halves(len: u64) -> [(u64, u64); 2] {
    let mid = HEADER_BYTES + ((len.saturating_sub(HEADER_BYTES) / 2) & !511);
    [(HEADER_BYTES, mid), (mid, len)]
}

/// The segment length and format version a header records, or why it is
/// not a header.
pub(crate) fn parse_header(h: &[u8]) -> Result<(u64, u32), String> {
    if h.len() < 32 {
        return Err("shorter than its header".into());
    }
    if h[..8] != MAGIC {
        return Err("the header does not start with the journal's magic bytes".into());
    }
    let sum = u64::from_le_bytes(le8(&h[24..32]));
    if xxhash_rust::xxh3::xxh3_64(&h[..24]) != sum {
        return Err("the header's checksum does not match".into());
    }
    let version = u32::from_le_bytes(le4(&h[8..12]));
    if !(1..=VERSION).contains(&version) {
        return Err(format!(
            "journal format {version}, this build reads 1 to {VERSION}"
        ));
    }
    Ok((u64::from_le_bytes(le8(&h[16..24])), version))
}

/// One record's frame and payload.
pub(crate) fn record(epoch: u64, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(FRAME_BYTES + payload.len());
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    r.extend_from_slice(&len.to_le_bytes());
    r.extend_from_slice(&0u32.to_le_bytes());
    r.extend_from_slice(&epoch.to_le_bytes());
    r.extend_from_slice(&seq.to_le_bytes());
    let sum = frame_sum(&r[..24], payload);
    r.extend_from_slice(&sum.to_le_bytes());
    r.extend_from_slice(payload);
    r
}

/// A record's frame, read back.
pub(crate) struct Frame {
    pub len: usize,
    pub epoch: u64,
    pub seq: u64,
    sum: u64,
    head: [u8; 24],
}

/// The frame in the first [`FRAME_BYTES`] of `b`.
pub(crate) fn parse_frame(b: &[u8; FRAME_BYTES]) -> Frame {
    let mut head = [0u8; 24];
    head.copy_from_slice(&b[..24]);
    Frame {
        len: u32::from_le_bytes(le4(&b[0..4])) as usize,
        epoch: u64::from_le_bytes(le8(&b[8..16])),
        seq: u64::from_le_bytes(le8(&b[16..24])),
        sum: u64::from_le_bytes(le8(&b[24..32])),
        head,
    }
}

impl Frame {
    /// Whether `payload` is the one this frame was written with.
    pub(crate) fn matches(&self, payload: &[u8]) -> bool {
        self.head[4..8] == [0; 4] && frame_sum(&self.head, payload) == self.sum
    }
}

fn frame_sum(head: &[u8], payload: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(head);
    h.update(payload);
    h.digest()
}

fn le4(b: &[u8]) -> [u8; 4] {
    b.try_into().unwrap_or_default()
}

fn le8(b: &[u8]) -> [u8; 8] {
    b.try_into().unwrap_or_default()
}

/// A commit the journal holds: what a [`Commit`] borrows, owned, and its
/// metadata changes by name.
#[derive(Default, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Owned {
    pub drop_buckets: Vec<u64>,
    pub trims: Vec<(u64, u64, u64)>,
    pub rows: Vec<(u64, u64, Vec<u8>)>,
    pub summaries: Vec<(u64, Vec<u8>)>,
    pub meta: Vec<(String, Option<Vec<u8>>)>,
}

impl Owned {
    /// `c`, owned (its metadata changes in the order a commit applies them).
    pub(crate) fn of(c: Commit<'_>) -> Owned {
        let mut meta: Vec<(String, Option<Vec<u8>>)> = c
            .meta
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        meta.extend(c.raw_meta);
        Owned {
            drop_buckets: c.drop_buckets.to_vec(),
            trims: c
                .trims
                .into_iter()
                .map(|(b, r)| (b, *r.start(), *r.end()))
                .collect(),
            rows: c.rows,
            summaries: c.summaries,
            meta,
        }
    }

    /// This commit as the storage takes it.
    pub(crate) fn commit(&self) -> Commit<'_> {
        Commit {
            drop_buckets: &self.drop_buckets,
            trims: self.trims.iter().map(|&(b, s, e)| (b, s..=e)).collect(),
            rows: self.rows.clone(),
            summaries: self.summaries.clone(),
            meta: Vec::new(),
            raw_meta: self.meta.clone(),
        }
    }

    /// The payload of this commit's record.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let bytes: usize = self.rows.iter().map(|r| r.2.len() + 24).sum::<usize>()
            + self.summaries.iter().map(|s| s.1.len() + 12).sum::<usize>();
        let mut out = Vec::with_capacity(bytes + 64);
        let count = |out: &mut Vec<u8>, n: usize| {
            out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
        };
        let bytes = |out: &mut Vec<u8>, b: &[u8]| {
            count(out, b.len());
            out.extend_from_slice(b);
        };
        count(&mut out, self.drop_buckets.len());
        for b in &self.drop_buckets {
            out.extend_from_slice(&b.to_le_bytes());
        }
        count(&mut out, self.trims.len());
        for (b, s, e) in &self.trims {
            for n in [b, s, e] {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        count(&mut out, self.rows.len());
        for (b, r, v) in &self.rows {
            out.extend_from_slice(&b.to_le_bytes());
            out.extend_from_slice(&r.to_le_bytes());
            bytes(&mut out, v);
        }
        count(&mut out, self.summaries.len());
        for (b, v) in &self.summaries {
            out.extend_from_slice(&b.to_le_bytes());
            bytes(&mut out, v);
        }
        count(&mut out, self.meta.len());
        for (k, v) in &self.meta {
            bytes(&mut out, k.as_bytes());
            match v {
                Some(v) => {
                    out.push(1);
                    bytes(&mut out, v);
                }
                None => out.push(0),
            }
        }
        out
    }

    /// The commit a record's payload holds; damage is
    /// [`LogError::Corrupt`] saying `what` (the record's place).
    pub(crate) fn decode(payload: &[u8], what: &str) -> Result<Owned, LogError> {
        let mut r = Reader { b: payload, at: 0 };
        let damaged = |why: &str| LogError::Corrupt(format!("{what}: {why}"));
        let mut o = Owned::default();
        let inner = |r: &mut Reader<'_>, o: &mut Owned| -> Option<()> {
            for _ in 0..r.u32()? {
                o.drop_buckets.push(r.u64()?);
            }
            for _ in 0..r.u32()? {
                o.trims.push((r.u64()?, r.u64()?, r.u64()?));
            }
            for _ in 0..r.u32()? {
                o.rows.push((r.u64()?, r.u64()?, r.bytes()?.to_vec()));
            }
            for _ in 0..r.u32()? {
                o.summaries.push((r.u64()?, r.bytes()?.to_vec()));
            }
            for _ in 0..r.u32()? {
                let k = String::from_utf8(r.bytes()?.to_vec()).ok()?;
                let v = match r.take(1)?[0] {
                    0 => None,
                    1 => Some(r.bytes()?.to_vec()),
                    _ => return None,
                };
                o.meta.push((k, v));
            }
            Some(())
        };
        inner(&mut r, &mut o).ok_or_else(|| damaged("its commit does not decode"))?;
        if r.at != payload.len() {
            return Err(damaged("bytes follow its commit"));
        }
        Ok(o)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_round_trips_through_its_payload() {
        let o = Owned {
            drop_buckets: vec![3, 4],
            trims: vec![(5, 1, 9)],
            rows: vec![(5, 10, b"row".to_vec()), (6, 11, Vec::new())],
            summaries: vec![(5, b"sum".to_vec())],
            meta: vec![("a".into(), Some(b"1".to_vec())), ("b".into(), None)],
        };
        let p = o.encode();
        assert_eq!(Owned::decode(&p, "r").expect("decodes"), o);
        for cut in 0..p.len() {
            assert!(Owned::decode(&p[..cut], "r").is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_frame_checks_its_payload_and_a_header_its_bytes() {
        let r = record(2, 7, b"payload");
        let f = parse_frame(r[..FRAME_BYTES].try_into().expect("frame"));
        assert_eq!((f.len, f.epoch, f.seq), (7, 2, 7));
        assert!(f.matches(b"payload"));
        assert!(!f.matches(b"payloaD"));
        let mut h = header(1 << 20);
        assert_eq!(parse_header(&h), Ok((1 << 20, VERSION)));
        h[17] ^= 1;
        assert!(parse_header(&h).is_err());
    }
}
