//! The on-disk record format (version 1), hand-written little-endian.
//!
//! A log row is the value of one entry in a bucket table, keyed by the row
//! number (`u64`, increasing across the whole store):
//!
//! ```text
//! row     := version:u8 (=1) | flags:u8 (=0) | count:u32 | record{count} | checksum:u64
//!            checksum = xxh3-64 of every byte before it
//! record  := kind:u8 | idx:u32 | at:u64 | expires:u64
//!            | scope_len:u16 | id_len:u16 | scope | id | body
//! body    := (kind = Insert)            nothing
//!          | (kind = Claim .. Release)  attempt:u32 | token:u64 | first_at:u64 | lease_until:u64
//!                                      | params:u128 | outcome_tag:u8 | outcome_len:u32 | outcome
//!          | (kind = Entity .. Hold)    value:u64 | aux:u64 | aux2:u64 | payload_len:u32 | payload
//! ```
//! Entity records (`Entity`, `Park`, `Hold`) keep `value`,
//! `aux` and `aux2` in the `token`, `first_at` and `lease_until` fields of
//! [`RecordRef`] and the payload in `outcome`.
//! `idx` orders the records of one commit across all bucket tables (the same
//! row number can appear in several tables). Times are milliseconds since the
//! Unix epoch. Every length is checked against the row before it is used, so
//! decoding arbitrary bytes returns an error, never panics, and never
//! allocates more than the input.

use crate::{Error, Result};

/// The newest row format this build writes and reads.
pub(crate) const ROW_VERSION: u8 = 1;
const HEADER: usize = 6;
const TRAILER: usize = 8;

/// What a record says happened to its key. The latest record of a key is
/// its whole state: every record is self-contained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A plain `insert_if_absent` key.
    Insert = 1,
    /// A claim began, was taken over, or was renewed.
    Claim = 2,
    /// The claim completed with an outcome.
    Complete = 3,
    /// The claim failed permanently; the outcome is the error payload.
    Fail = 4,
    /// The claim was released for a retry (retryable failure or drop).
    Release = 5,
    /// An entity's whole core state: `value` = version + 1 (0: none),
    /// `aux` = next expected sequence number (0: no sequencer state),
    /// `aux2` = when the current sequence gap opened (0: no gap). Parked and
    /// held events below `aux` are consumed.
    Entity = 6,
    /// An early event was parked (`value` = seq, `aux` = when, payload).
    Park = 7,
    /// A parked event went to the holding area (`value` = seq, `aux` = the
    /// missing predecessor, `aux2` = since when, payload).
    Hold = 8,
}

/// The shape of a record's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    Empty,
    Claim,
    Entity,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Insert,
            2 => Kind::Claim,
            3 => Kind::Complete,
            4 => Kind::Fail,
            5 => Kind::Release,
            6 => Kind::Entity,
            7 => Kind::Park,
            8 => Kind::Hold,
            _ => return None,
        })
    }

    pub(crate) fn body(self) -> Body {
        match self {
            Kind::Insert => Body::Empty,
            Kind::Claim | Kind::Complete | Kind::Fail | Kind::Release => Body::Claim,
            Kind::Entity | Kind::Park | Kind::Hold => Body::Entity,
        }
    }

    /// Entity records live in the entity namespace of the index.
    pub(crate) fn is_entity(self) -> bool {
        self.body() == Body::Entity
    }
}

/// One record, borrowing its byte fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordRef<'a> {
    pub kind: Kind,
    pub idx: u32,
    pub at: u64,
    pub expires: u64,
    pub scope: &'a [u8],
    pub id: &'a [u8],
    pub attempt: u32,
    pub token: u64,
    pub first_at: u64,
    pub lease_until: u64,
    pub params: u128,
    pub outcome_tag: u8,
    pub outcome: &'a [u8],
}

impl RecordRef<'_> {
    /// Bytes this record takes in a row.
    pub(crate) fn encoded_len(&self) -> usize {
        let head = 1 + 4 + 8 + 8 + 2 + 2 + self.scope.len() + self.id.len();
        match self.kind.body() {
            Body::Empty => head,
            Body::Claim => head + 4 + 8 + 8 + 8 + 16 + 1 + 4 + self.outcome.len(),
            Body::Entity => head + 8 + 8 + 8 + 4 + self.outcome.len(),
        }
    }

    /// Appends the record to `out`. Lengths must already be within the
    /// format's field widths (the store validates them first).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!(u16::try_from(self.scope.len()).is_ok());
        debug_assert!(u16::try_from(self.id.len()).is_ok());
        out.reserve(self.encoded_len());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.idx.to_le_bytes());
        out.extend_from_slice(&self.at.to_le_bytes());
        out.extend_from_slice(&self.expires.to_le_bytes());
        out.extend_from_slice(&(self.scope.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.id.len() as u16).to_le_bytes());
        out.extend_from_slice(self.scope);
        out.extend_from_slice(self.id);
        match self.kind.body() {
            Body::Empty => {}
            Body::Claim => {
                out.extend_from_slice(&self.attempt.to_le_bytes());
                out.extend_from_slice(&self.token.to_le_bytes());
                out.extend_from_slice(&self.first_at.to_le_bytes());
                out.extend_from_slice(&self.lease_until.to_le_bytes());
                out.extend_from_slice(&self.params.to_le_bytes());
                out.push(self.outcome_tag);
                out.extend_from_slice(&(self.outcome.len() as u32).to_le_bytes());
                out.extend_from_slice(self.outcome);
            }
            Body::Entity => {
                out.extend_from_slice(&self.token.to_le_bytes());
                out.extend_from_slice(&self.first_at.to_le_bytes());
                out.extend_from_slice(&self.lease_until.to_le_bytes());
                out.extend_from_slice(&(self.outcome.len() as u32).to_le_bytes());
                out.extend_from_slice(self.outcome);
            }
        }
    }
}

/// A row being filled: header space, then records; `finish` seals it.
#[derive(Debug, Default)]
pub(crate) struct RowWriter {
    buf: Vec<u8>,
    count: u32,
}

impl RowWriter {
    pub(crate) fn new() -> Self {
        let mut buf = Vec::with_capacity(4096);
        buf.extend_from_slice(&[ROW_VERSION, 0, 0, 0, 0, 0]);
        Self { buf, count: 0 }
    }

    pub(crate) fn push(&mut self, rec: &RecordRef<'_>) {
        rec.encode(&mut self.buf);
        self.count += 1;
    }

    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Writes the count and the checksum; the row is ready to store.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.buf[2..6].copy_from_slice(&self.count.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&self.buf);
        self.buf.extend_from_slice(&sum.to_le_bytes());
        self.buf
    }
}

/// Checks a row's version and checksum and iterates over its records.
pub(crate) fn read_row(row: &[u8]) -> Result<RowReader<'_>> {
    if row.len() < HEADER + TRAILER {
        return Err(corrupt("row shorter than its header"));
    }
    let (body, sum) = row.split_at(row.len() - TRAILER);
    let want = u64::from_le_bytes(sum.try_into().map_err(|_| corrupt("checksum"))?);
    if xxhash_rust::xxh3::xxh3_64(body) != want {
        return Err(corrupt("row checksum mismatch"));
    }
    if body[0] != ROW_VERSION {
        return Err(Error::UnsupportedVersion {
            found: u32::from(body[0]),
            supported: u32::from(ROW_VERSION),
        });
    }
    let mut r = Cursor { buf: body, pos: 2 };
    let count = r.u32()?;
    Ok(RowReader {
        cur: r,
        left: count,
    })
}

/// Iterator over the records of a checked row.
pub(crate) struct RowReader<'a> {
    cur: Cursor<'a>,
    left: u32,
}

impl<'a> Iterator for RowReader<'a> {
    type Item = Result<RecordRef<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            if self.cur.pos != self.cur.buf.len() {
                self.cur.pos = self.cur.buf.len();
                return Some(Err(corrupt("trailing bytes after the last record")));
            }
            return None;
        }
        self.left -= 1;
        let rec = self.cur.record();
        if rec.is_err() {
            self.left = 0;
            self.cur.pos = self.cur.buf.len();
        }
        Some(rec)
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| corrupt("record runs past the end of its row"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        s.try_into().map_err(|_| corrupt("short field"))
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn u128(&mut self) -> Result<u128> {
        Ok(u128::from_le_bytes(self.array()?))
    }

    fn record(&mut self) -> Result<RecordRef<'a>> {
        let kind = Kind::from_u8(self.u8()?).ok_or_else(|| corrupt("unknown record kind"))?;
        let idx = self.u32()?;
        let at = self.u64()?;
        let expires = self.u64()?;
        let scope_len = usize::from(self.u16()?);
        let id_len = usize::from(self.u16()?);
        let scope = self.take(scope_len)?;
        let id = self.take(id_len)?;
        let mut rec = RecordRef {
            kind,
            idx,
            at,
            expires,
            scope,
            id,
            attempt: 0,
            token: 0,
            first_at: at,
            lease_until: 0,
            params: 0,
            outcome_tag: 0,
            outcome: &[],
        };
        match kind.body() {
            Body::Empty => {}
            Body::Claim => {
                rec.attempt = self.u32()?;
                rec.token = self.u64()?;
                rec.first_at = self.u64()?;
                rec.lease_until = self.u64()?;
                rec.params = self.u128()?;
                rec.outcome_tag = self.u8()?;
                let len = self.u32()? as usize;
                rec.outcome = self.take(len)?;
            }
            Body::Entity => {
                rec.token = self.u64()?;
                rec.first_at = self.u64()?;
                rec.lease_until = self.u64()?;
                let len = self.u32()? as usize;
                rec.outcome = self.take(len)?;
            }
        }
        Ok(rec)
    }
}

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("log row: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(kind: Kind, idx: u32, outcome: &[u8]) -> RecordRef<'_> {
        RecordRef {
            kind,
            idx,
            at: 10,
            expires: 20,
            scope: b"tenant",
            id: b"evt",
            attempt: 2,
            token: 99,
            first_at: 5,
            lease_until: 40,
            params: 0xdead_beef,
            outcome_tag: 1,
            outcome,
        }
    }

    #[test]
    fn round_trip_every_kind() -> Result<()> {
        let mut w = RowWriter::new();
        let kinds = [
            Kind::Insert,
            Kind::Claim,
            Kind::Complete,
            Kind::Fail,
            Kind::Release,
            Kind::Entity,
            Kind::Park,
            Kind::Hold,
        ];
        for (i, k) in kinds.iter().enumerate() {
            w.push(&sample(*k, i as u32, b"out"));
        }
        let row = w.finish();
        let back: Vec<_> = read_row(&row)?.collect::<Result<_>>()?;
        assert_eq!(back.len(), kinds.len());
        assert_eq!(back[0].kind, Kind::Insert);
        assert_eq!(back[0].first_at, back[0].at);
        assert_eq!(back[2], sample(Kind::Complete, 2, b"out"));
        // Entity records keep value, aux, aux2 and the payload.
        let park = &back[6];
        assert_eq!(park.kind, Kind::Park);
        assert_eq!((park.token, park.first_at, park.lease_until), (99, 5, 40));
        assert_eq!(park.outcome, b"out");
        Ok(())
    }

    #[test]
    fn flipped_bit_is_corrupt_not_panic() {
        let mut w = RowWriter::new();
        w.push(&sample(Kind::Complete, 0, b"xyz"));
        let row = w.finish();
        for i in 0..row.len() {
            let mut bad = row.clone();
            bad[i] ^= 0x10;
            let res: Result<Vec<_>> = read_row(&bad).and_then(Iterator::collect);
            assert!(res.is_err(), "flip at byte {i} went unnoticed");
        }
    }

    #[test]
    fn truncated_rows_are_errors() {
        let mut w = RowWriter::new();
        w.push(&sample(Kind::Claim, 0, b""));
        let row = w.finish();
        for n in 0..row.len() {
            let res: Result<Vec<_>> = read_row(&row[..n]).and_then(Iterator::collect);
            assert!(res.is_err());
        }
    }

    #[test]
    fn newer_version_is_reported() {
        let mut w = RowWriter::new();
        w.push(&sample(Kind::Insert, 0, b""));
        let mut row = w.finish();
        row[0] = 9;
        let n = row.len();
        let sum = xxhash_rust::xxh3::xxh3_64(&row[..n - 8]);
        row[n - 8..].copy_from_slice(&sum.to_le_bytes());
        assert!(matches!(
            read_row(&row).err(),
            Some(Error::UnsupportedVersion { found: 9, .. })
        ));
    }
}
