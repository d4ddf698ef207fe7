//! The on-disk record format (version 1), hand-written little-endian.
//!
//! A log row is the value of one entry in a bucket table, keyed by the row
//! number (`u64`, increasing across the whole store):
//!
//! ```text
//! row     := version:u8 (=1) | flags:u8 (=0) | count:u32 | record{count} | checksum:u64
//!            checksum = xxh3-64 of every byte before it
//! record  := kind:u8 | idx_gap:var | at:zvar | expires:zvar
//!            | scope_len_plus_1:var | scope | id_len:var | id | body
//!          | 9:u8 | idx_gap:var | at:zvar | expires:zvar                 (a run)
//!            | scope_len_plus_1:var | scope | id_len:var | n:u16 | id{n}
//! body    := (kind = Insert)            nothing
//!          | (kind = Claim .. Release)  attempt:var | token:var | first_at:zvar | lease_until:zvar
//!                                      | params:u128 | outcome_tag:u8 | outcome_len:var | outcome
//!          | (kind = Entity .. Hold)    value:var | aux:var | aux2:var | payload_len:var | payload
//! ```
//! `var` is an unsigned LEB128 varint of at most 64 bits (10 bytes);
//! `zvar` a zigzag varint of a wrapping difference. Each record is encoded
//! against the previous record of the same row (for the first: index 0,
//! times 0): `idx_gap` is `idx` minus the previous `idx + 1`; `at` and
//! `expires` are differences from the previous record's; a scope length of
//! 0 repeats the previous record's scope (otherwise it is the length + 1);
//! a claim's `first_at` and `lease_until` are differences from its own
//! `at`. A plain insert in one scope thus costs six bytes besides its id
//! (46 in the fixed-width layout it replaced).
//!
//! A run (tag 9) holds `n` ≥ 2 plain inserts that follow each other with
//! consecutive indexes, the same times and scope, and ids of one length:
//! one header, the count, the ids. The row's `count` counts it once, and
//! the record after it is encoded against its last insert. Empty ids never
//! form a run, so every record takes at least a byte of its row. A
//! batch of 1,000 16-byte ids is then about 16,000 bytes, which fits one
//! 16 KiB redb page, where 22,000 bytes took a 32 KiB one.
//!
//! Entity records (`Entity`, `Park`, `Hold`) keep `value`,
//! `aux` and `aux2` in the `token`, `first_at` and `lease_until` fields of
//! [`RecordRef`] and the payload in `outcome`.
//! `idx` orders the records of one commit across all bucket tables (the same
//! row number can appear in several tables). Times are milliseconds since the
//! Unix epoch. Every length is checked against the row before it is used, so
//! decoding arbitrary bytes returns an error, never panics, never
//! allocates more than the input, and never yields more records than the
//! row has bytes.

use crate::{Error, Result};

/// The newest row format this build writes and reads.
pub(crate) const ROW_VERSION: u8 = 1;
const HEADER: usize = 6;
const TRAILER: usize = 8;
/// The tag of a run: plain inserts that follow each other in a row with
/// the same times, scope and id length, written as one record header, a
/// `u16` count and the ids back to back.
const RUN: u8 = 9;

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
    /// `aux2` = when the current sequence gap opened (0: no gap), payload =
    /// the ack mark (empty: `aux`; else 8 bytes little-endian). Parked and
    /// held events below the ack mark are consumed; those from it to `aux`
    /// were handed back and are not acknowledged yet.
    Entity = 6,
    /// An early event was parked, or the next expected one delivered
    /// (`value` = seq, `aux` = when, payload).
    Park = 7,
    /// A parked event went to the holding area (`value` = seq, `aux` = the
    /// missing predecessor, `aux2` = since when, payload).
    Hold = 8,
    /// The key was forgotten on purpose (`Store::forget`): absent from
    /// now on, the record kept for audit until it expires. Its claim
    /// fields are those of the record it replaced. (Tag 9 is a run.)
    Forget = 10,
}

/// The `outcome_tag` of a `Release` record that frees the key for any
/// request (`Failure::RetryableAnyRequest`); 0 keeps the fingerprint.
/// Release records carry no outcome, so the tag is free for this.
pub(crate) const RELEASE_ANY_REQUEST: u8 = 1;
/// The `outcome_tag` of a `Release` record written for a claim dropped
/// without an answer (a handler that panicked or returned early): the next
/// attempt is told it interrupted one, as after a takeover.
pub(crate) const RELEASE_ABANDONED: u8 = 2;

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
            10 => Kind::Forget,
            _ => return None,
        })
    }

    pub(crate) fn body(self) -> Body {
        match self {
            Kind::Insert => Body::Empty,
            Kind::Claim | Kind::Complete | Kind::Fail | Kind::Release | Kind::Forget => Body::Claim,
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

impl<'a> RecordRef<'a> {
    /// A record with its header fields only, its body empty (what a plain
    /// insert decodes to; the decoder fills in any other body).
    fn bare(
        kind: Kind,
        idx: u32,
        (at, expires): (u64, u64),
        scope: &'a [u8],
        id: &'a [u8],
    ) -> Self {
        RecordRef {
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
        }
    }
}

/// Appends `v` as a LEB128 varint (7 bits a byte, low first).
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends `v - base` zigzag-encoded (small either way round), wrapping.
fn put_delta(out: &mut Vec<u8>, v: u64, base: u64) {
    let d = v.wrapping_sub(base);
    put_varint(out, (d << 1) ^ (d >> 63).wrapping_neg());
}

/// A row being filled: header space, then records; `finish` seals it.
/// Each record is encoded against the one before it in the row (index,
/// times and scope), so a batch of plain inserts costs little more than
/// its ids.
#[derive(Debug)]
pub(crate) struct RowWriter {
    buf: Vec<u8>,
    /// Records as encoded: a run counts once.
    count: u32,
    prev: Prev,
    /// Where the previous record's scope sits in `buf`.
    prev_scope: (usize, usize),
    /// The previous record, if it was a plain insert: a following insert
    /// like it extends it into (or along) a run.
    tail: Option<Tail>,
}

/// A plain insert, or a run of them, at the end of the row.
#[derive(Debug, Clone, Copy)]
struct Tail {
    /// Where its kind byte sits.
    kind_pos: usize,
    /// Where its id (a run: its count) starts.
    id_pos: usize,
    id_len: usize,
    /// Ids in it (1: a plain insert, not a run yet).
    ids: u16,
}

/// The fields the next record is encoded against.
#[derive(Debug, Clone, Copy)]
struct Prev {
    /// `idx + 1` of the previous record; 0 before the first.
    next_idx: u64,
    at: u64,
    expires: u64,
}

impl Prev {
    const START: Prev = Prev {
        next_idx: 0,
        at: 0,
        expires: 0,
    };
}

impl RowWriter {
    pub(crate) fn new() -> Self {
        let mut buf = Vec::with_capacity(4096);
        buf.extend_from_slice(&[ROW_VERSION, 0, 0, 0, 0, 0]);
        Self {
            buf,
            count: 0,
            prev: Prev::START,
            prev_scope: (0, usize::MAX),
            tail: None,
        }
    }

    /// Appends a record. Lengths must already be within the format's limits
    /// (the store validates them first).
    pub(crate) fn push(&mut self, rec: &RecordRef<'_>) {
        debug_assert!(
            u64::from(rec.idx) >= self.prev.next_idx,
            "idx goes up in a row"
        );
        debug_assert!(u16::try_from(rec.scope.len()).is_ok());
        debug_assert!(u16::try_from(rec.id.len()).is_ok());
        if self.extend_run(rec) {
            return;
        }
        let kind_pos = self.buf.len();
        let repeats_scope = self.repeats_scope(rec.scope);
        let out = &mut self.buf;
        out.push(rec.kind as u8);
        put_varint(out, u64::from(rec.idx).wrapping_sub(self.prev.next_idx));
        put_delta(out, rec.at, self.prev.at);
        put_delta(out, rec.expires, self.prev.expires);
        if repeats_scope {
            put_varint(out, 0);
        } else {
            put_varint(out, rec.scope.len() as u64 + 1);
            self.prev_scope = (out.len(), rec.scope.len());
            out.extend_from_slice(rec.scope);
        }
        put_varint(out, rec.id.len() as u64);
        let id_pos = out.len();
        out.extend_from_slice(rec.id);
        self.tail = (rec.kind == Kind::Insert).then_some(Tail {
            kind_pos,
            id_pos,
            id_len: rec.id.len(),
            ids: 1,
        });
        let out = &mut self.buf;
        match rec.kind.body() {
            Body::Empty => {}
            Body::Claim => {
                put_varint(out, u64::from(rec.attempt));
                put_varint(out, rec.token);
                put_delta(out, rec.first_at, rec.at);
                put_delta(out, rec.lease_until, rec.at);
                out.extend_from_slice(&rec.params.to_le_bytes());
                out.push(rec.outcome_tag);
                put_varint(out, rec.outcome.len() as u64);
                out.extend_from_slice(rec.outcome);
            }
            Body::Entity => {
                put_varint(out, rec.token);
                put_varint(out, rec.first_at);
                put_varint(out, rec.lease_until);
                put_varint(out, rec.outcome.len() as u64);
                out.extend_from_slice(rec.outcome);
            }
        }
        self.prev = Prev {
            next_idx: u64::from(rec.idx) + 1,
            at: rec.at,
            expires: rec.expires,
        };
        self.count += 1;
    }

    /// Appends `rec` to the run (or plain insert) that ends the row if it
    /// is a plain insert that directly follows it with the same times,
    /// scope and id length; the first such insert turns the plain insert
    /// into a run of two. Returns whether it did.
    fn extend_run(&mut self, rec: &RecordRef<'_>) -> bool {
        let Some(mut tail) = self.tail else {
            return false;
        };
        let follows = rec.kind == Kind::Insert
            && u64::from(rec.idx) == self.prev.next_idx
            && rec.at == self.prev.at
            && rec.expires == self.prev.expires
            && rec.id.len() == tail.id_len
            // Empty ids stay records of their own: a run of them would be
            // records without bytes, which a reader could not bound.
            && tail.id_len > 0
            && tail.ids < u16::MAX
            && self.repeats_scope(rec.scope);
        if !follows {
            return false;
        }
        if tail.ids == 1 {
            self.buf[tail.kind_pos] = RUN;
            self.buf.splice(tail.id_pos..tail.id_pos, [0, 0]);
        }
        tail.ids += 1;
        let count = tail.id_pos;
        self.buf[count..count + 2].copy_from_slice(&tail.ids.to_le_bytes());
        self.buf.extend_from_slice(rec.id);
        self.tail = Some(tail);
        self.prev.next_idx += 1;
        true
    }

    /// Whether `scope` is the previous record's.
    fn repeats_scope(&self, scope: &[u8]) -> bool {
        let (start, len) = self.prev_scope;
        self.buf.get(start..start.saturating_add(len)) == Some(scope)
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
    let mut r = Cursor {
        buf: body,
        pos: 2,
        prev: Prev::START,
        prev_scope: None,
        run: None,
    };
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
        if let Some(rec) = self.cur.run_next() {
            if rec.is_err() {
                self.left = 0;
                self.cur.run = None;
                self.cur.pos = self.cur.buf.len();
            }
            return Some(rec);
        }
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
            self.cur.run = None;
            self.cur.pos = self.cur.buf.len();
        }
        Some(rec)
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    prev: Prev,
    prev_scope: Option<&'a [u8]>,
    /// The rest of a run being read: ids left and their length.
    run: Option<(u16, usize)>,
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
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// A LEB128 varint of at most 64 bits; overlong or overflowing forms
    /// are corrupt.
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(corrupt("varint overflows 64 bits"));
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("varint longer than 10 bytes"))
    }

    /// A length that must fit in the rest of the row.
    fn len(&mut self) -> Result<usize> {
        let n = self.varint()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.buf.len() - self.pos)
            .ok_or_else(|| corrupt("length runs past the end of its row"))
    }

    fn u32_varint(&mut self) -> Result<u32> {
        u32::try_from(self.varint()?).map_err(|_| corrupt("field wider than 32 bits"))
    }

    /// The inverse of `put_delta`.
    fn delta(&mut self, base: u64) -> Result<u64> {
        let z = self.varint()?;
        Ok(base.wrapping_add((z >> 1) ^ (z & 1).wrapping_neg()))
    }
    fn u128(&mut self) -> Result<u128> {
        Ok(u128::from_le_bytes(self.array()?))
    }

    /// The next insert of the run being read, if any.
    fn run_next(&mut self) -> Option<Result<RecordRef<'a>>> {
        let (left, id_len) = self.run?;
        self.run = (left > 1).then_some((left - 1, id_len));
        Some(self.run_insert(id_len))
    }

    /// One insert of a run: the previous record's times and scope, the
    /// next index, the next `id_len` bytes.
    fn run_insert(&mut self, id_len: usize) -> Result<RecordRef<'a>> {
        let idx = u32::try_from(self.prev.next_idx)
            .map_err(|_| corrupt("record index wider than 32 bits"))?;
        let id = self.take(id_len)?;
        let scope = self
            .prev_scope
            .ok_or_else(|| corrupt("run without a scope"))?;
        self.prev.next_idx += 1;
        Ok(RecordRef::bare(
            Kind::Insert,
            idx,
            (self.prev.at, self.prev.expires),
            scope,
            id,
        ))
    }

    fn record(&mut self) -> Result<RecordRef<'a>> {
        let tag = self.u8()?;
        let run = tag == RUN;
        let kind = if run {
            Kind::Insert
        } else {
            Kind::from_u8(tag).ok_or_else(|| corrupt("unknown record kind"))?
        };
        let idx = self
            .prev
            .next_idx
            .checked_add(self.varint()?)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| corrupt("record index wider than 32 bits"))?;
        let at = self.delta(self.prev.at)?;
        let expires = self.delta(self.prev.expires)?;
        let scope = match self.len()? {
            0 => self
                .prev_scope
                .ok_or_else(|| corrupt("first record repeats a scope"))?,
            n => self.take(n - 1)?,
        };
        self.prev_scope = Some(scope);
        let id_len = self.len()?;
        // Every record, runs included, takes at least one byte of its own:
        // a row cannot decode to more records than it has bytes.
        let run_ids = if run {
            let ids = u16::from_le_bytes(self.array()?);
            let fits = usize::from(ids)
                .checked_mul(id_len)
                .is_some_and(|n| n <= self.buf.len() - self.pos);
            if ids < 2 || id_len == 0 || !fits {
                return Err(corrupt(
                    "run of fewer than two ids, of empty ids, or past the end of its row",
                ));
            }
            ids
        } else {
            0
        };
        let id = self.take(id_len)?;
        if scope.len() > usize::from(u16::MAX) || id.len() > usize::from(u16::MAX) {
            return Err(corrupt("scope or id longer than 65,535 bytes"));
        }
        if run_ids > 0 {
            self.run = Some((run_ids - 1, id_len));
        }
        let mut rec = RecordRef::bare(kind, idx, (at, expires), scope, id);
        match kind.body() {
            Body::Empty => {}
            Body::Claim => {
                rec.attempt = self.u32_varint()?;
                rec.token = self.varint()?;
                rec.first_at = self.delta(at)?;
                rec.lease_until = self.delta(at)?;
                rec.params = self.u128()?;
                rec.outcome_tag = self.u8()?;
                let len = self.len()?;
                rec.outcome = self.take(len)?;
            }
            Body::Entity => {
                rec.token = self.varint()?;
                rec.first_at = self.varint()?;
                rec.lease_until = self.varint()?;
                let len = self.len()?;
                rec.outcome = self.take(len)?;
            }
        }
        self.prev = Prev {
            next_idx: u64::from(idx) + 1,
            at,
            expires,
        };
        Ok(rec)
    }
}

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("log row: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_KINDS: [Kind; 9] = [
        Kind::Insert,
        Kind::Claim,
        Kind::Complete,
        Kind::Fail,
        Kind::Release,
        Kind::Entity,
        Kind::Park,
        Kind::Hold,
        Kind::Forget,
    ];

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
        let kinds = ALL_KINDS;
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

    /// Seals `body` (header and records) as a row with a valid checksum.
    fn sealed(mut body: Vec<u8>) -> Vec<u8> {
        let sum = xxhash_rust::xxh3::xxh3_64(&body);
        body.extend_from_slice(&sum.to_le_bytes());
        body
    }

    #[test]
    fn records_encode_against_the_previous_one() -> Result<()> {
        let mut w = RowWriter::new();
        let mut recs = Vec::new();
        // Times going back and forth, gaps in idx, scopes repeating and
        // changing (including to the empty scope), extreme values.
        let times = [
            (1_700_000_000_000, 1_700_086_400_000),
            (1_699_999_999_990, 1_700_086_400_000),
            (u64::MAX, 0),
            (0, u64::MAX),
            (5, 5),
        ];
        let scopes: [&[u8]; 5] = [b"a", b"a", b"", b"", b"tenant-b"];
        let mut idx = 0;
        for (i, ((at, expires), scope)) in times.iter().zip(scopes).enumerate() {
            let mut r = sample(Kind::Claim, idx, b"o");
            (r.at, r.expires, r.scope) = (*at, *expires, scope);
            r.first_at = at.wrapping_sub(7);
            r.lease_until = u64::MAX - i as u64;
            r.token = u64::MAX;
            idx += 1 + i as u32 * 1_000;
            recs.push(r);
        }
        if let Some(r) = recs.last_mut() {
            r.idx = u32::MAX;
        }
        for r in &recs {
            w.push(r);
        }
        let row = w.finish();
        let back: Vec<_> = read_row(&row)?.collect::<Result<_>>()?;
        assert_eq!(back, recs);
        Ok(())
    }

    fn any_kind() -> impl proptest::strategy::Strategy<Value = Kind> {
        proptest::sample::select(ALL_KINDS.to_vec())
    }

    /// Drawn fields of one record: kind, index gap, times and numbers,
    /// (attempt, params, tag), scope, id.
    type Drawn = (Kind, u32, [u64; 6], (u32, u128, u8), &'static [u8], Vec<u8>);

    /// Records from drawn fields, each field kept only where its kind has
    /// it (as the decoder returns them); then pushes them through a row
    /// and compares.
    fn round_trips(
        drawn: Vec<Drawn>,
    ) -> std::result::Result<(), proptest::test_runner::TestCaseError> {
        let mut idx = 0u32;
        let owned: Vec<_> = drawn
            .into_iter()
            .map(|(kind, gap, t, (attempt, params, tag), scope, id)| {
                idx += gap;
                let r = (kind, idx, t, attempt, params, tag, scope, id);
                idx += 1;
                r
            })
            .collect();
        let recs: Vec<RecordRef<'_>> = owned
            .iter()
            .map(|(kind, idx, t, attempt, params, tag, scope, id)| {
                let claim = kind.body() == Body::Claim;
                RecordRef {
                    kind: *kind,
                    idx: *idx,
                    at: t[0],
                    expires: t[1],
                    scope,
                    id,
                    attempt: if claim { *attempt } else { 0 },
                    token: if *kind == Kind::Insert { 0 } else { t[2] },
                    first_at: if *kind == Kind::Insert { t[0] } else { t[3] },
                    lease_until: if *kind == Kind::Insert { 0 } else { t[4] },
                    params: if claim { *params } else { 0 },
                    outcome_tag: if claim { *tag } else { 0 },
                    outcome: if *kind == Kind::Insert {
                        &[]
                    } else {
                        &id[..id.len() / 2]
                    },
                }
            })
            .collect();
        let mut w = RowWriter::new();
        for r in &recs {
            w.push(r);
        }
        let row = w.finish();
        let back: Vec<_> = read_row(&row)?.collect::<Result<_>>()?;
        proptest::prop_assert_eq!(back, recs);
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn any_records_round_trip(drawn in proptest::collection::vec(
            (
                any_kind(),
                0u32..3,
                proptest::prelude::any::<[u64; 6]>(),
                proptest::prelude::any::<(u32, u128, u8)>(),
                proptest::sample::select(vec![&b""[..], b"a", b"tenant"]),
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20),
            ),
            1..20,
        )) {
            round_trips(drawn)?;
        }

        /// Mostly plain inserts with few distinct times, scopes and id
        /// lengths: runs start, grow and break in every way.
        #[test]
        fn run_prone_records_round_trip(drawn in proptest::collection::vec(
            (
                proptest::prop_oneof![6 => proptest::strategy::Just(Kind::Insert), 1 => any_kind()],
                proptest::prop_oneof![5 => proptest::strategy::Just(0u32), 1 => proptest::strategy::Just(1u32)],
                proptest::sample::select(vec![[10, 15, 3, 4, 5, 6], [11, 15, 3, 4, 5, 6], [10, 16, 3, 4, 5, 6]]),
                proptest::prelude::any::<(u32, u128, u8)>(),
                proptest::sample::select(vec![&b""[..], b"a", b"a", b"a"]),
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3),
            ),
            1..200,
        )) {
            round_trips(drawn)?;
        }
    }

    #[test]
    fn plain_inserts_at_different_times_cost_six_bytes_besides_the_id() {
        let mut w = RowWriter::new();
        let mut r = sample(Kind::Insert, 0, b"");
        (r.at, r.expires, r.id) = (1_700_000_000_000, 1_700_086_400_000, b"0123456789abcdef");
        w.push(&r);
        let first = w.len();
        for i in 1..100 {
            r.idx = i;
            r.at += 1 + u64::from(i % 3);
            r.expires = r.at + 86_400_000;
            w.push(&r);
        }
        assert_eq!(w.len() - first, 99 * (6 + 16));
    }

    /// A batch's inserts: 1,000 16-byte ids in one scope at one time.
    fn batch_row(n: u32) -> (Vec<u8>, Vec<[u8; 16]>) {
        let ids: Vec<[u8; 16]> = (0..n)
            .map(|i| {
                let mut id = [i as u8; 16];
                id[..4].copy_from_slice(&i.to_le_bytes());
                id
            })
            .collect();
        let mut w = RowWriter::new();
        for (i, id) in ids.iter().enumerate() {
            let mut r = sample(Kind::Insert, i as u32, b"");
            (r.at, r.expires, r.id) = (1_700_000_000_000, 1_700_086_400_000, id);
            w.push(&r);
        }
        (w.finish(), ids)
    }

    #[test]
    fn a_batch_of_plain_inserts_is_one_run_of_its_ids() -> Result<()> {
        let (row, ids) = batch_row(1_000);
        // Header, one record header, the run's count, the ids, checksum:
        // under redb's 16 KiB page, where 22 bytes a record took 32 KiB.
        let record_header = 1 + 1 + 6 + 6 + 1 + b"tenant".len() + 1;
        assert_eq!(row.len(), HEADER + record_header + 2 + 1_000 * 16 + TRAILER);
        assert!(row.len() < 16_384 - 64);
        let back: Vec<_> = read_row(&row)?.collect::<Result<_>>()?;
        assert_eq!(back.len(), 1_000);
        for (i, (rec, id)) in back.iter().zip(&ids).enumerate() {
            assert_eq!(
                rec,
                &RecordRef {
                    idx: i as u32,
                    at: 1_700_000_000_000,
                    expires: 1_700_086_400_000,
                    first_at: 1_700_000_000_000,
                    id,
                    ..plain(b"")
                }
            );
        }
        Ok(())
    }

    /// A plain insert as the decoder returns it: no claim fields.
    fn plain(id: &[u8]) -> RecordRef<'_> {
        RecordRef {
            attempt: 0,
            token: 0,
            first_at: 10, // `at`, as a plain insert decodes
            lease_until: 0,
            params: 0,
            outcome_tag: 0,
            ..sample(Kind::Insert, 0, b"")
        }
        .with_id(id)
    }

    impl<'a> RecordRef<'a> {
        fn with_id(self, id: &'a [u8]) -> RecordRef<'a> {
            RecordRef { id, ..self }
        }
    }

    #[test]
    fn a_run_past_its_count_continues_in_a_new_one() -> Result<()> {
        let (row, ids) = batch_row(70_000);
        assert_eq!(
            u32::from_le_bytes(row[2..6].try_into().unwrap()),
            2,
            "65,535 ids, then the rest"
        );
        let back: Vec<_> = read_row(&row)?.collect::<Result<_>>()?;
        assert_eq!(back.len(), 70_000);
        assert!(
            back.iter()
                .zip(&ids)
                .enumerate()
                .all(|(i, (r, id))| r.idx == i as u32 && r.id == id)
        );
        Ok(())
    }

    #[test]
    fn empty_ids_never_form_a_run() -> Result<()> {
        let mut w = RowWriter::new();
        let recs: Vec<_> = (0..3)
            .map(|i| RecordRef {
                idx: i,
                ..plain(b"")
            })
            .collect();
        for r in &recs {
            w.push(r);
        }
        let row = w.finish();
        assert_eq!(u32::from_le_bytes(row[2..6].try_into().unwrap()), 3);
        assert_eq!(read_row(&row)?.collect::<Result<Vec<_>>>()?, recs);
        Ok(())
    }

    /// A row of one hand-made run record: `scope`, ids of `id_len`, a count
    /// of `ids`, then `tail` bytes.
    fn run_row(scope: &[u8], id_len: u8, ids: u16, tail: &[u8]) -> Vec<u8> {
        let mut row = vec![ROW_VERSION, 0, 1, 0, 0, 0, RUN, 0, 0, 0];
        put_varint(&mut row, scope.len() as u64 + 1);
        row.extend_from_slice(scope);
        row.extend_from_slice(&[id_len]);
        row.extend_from_slice(&ids.to_le_bytes());
        row.extend_from_slice(tail);
        sealed(row)
    }

    #[test]
    fn a_run_of_empty_ids_is_corrupt() {
        // Eight bytes that would otherwise decode to 65,535 records.
        let row = run_row(b"", 0, u16::MAX, b"");
        let items: Vec<_> = read_row(&row).expect("header").collect();
        assert_eq!(items.len(), 1);
        assert!(matches!(&items[0], Err(Error::Corrupt(_))), "{items:?}");
    }

    #[test]
    fn an_error_ends_the_records_even_inside_a_run() {
        // A scope past the 65,535-byte limit, found after the count.
        let row = run_row(&vec![b's'; 70_000], 1, 3, b"abc");
        let items: Vec<_> = read_row(&row).expect("header").collect();
        assert_eq!(items.len(), 1, "nothing after the error");
        assert!(matches!(&items[0], Err(Error::Corrupt(_))));
    }

    #[test]
    fn resealed_damage_to_a_run_never_multiplies_records() {
        let (row, _) = batch_row(3);
        let body = &row[..row.len() - TRAILER];
        for i in HEADER..body.len() {
            for mask in [0x01, 0x80, 0xff] {
                let mut bad = body.to_vec();
                bad[i] ^= mask;
                let bad = sealed(bad);
                if let Ok(records) = read_row(&bad) {
                    assert!(records.count() <= bad.len(), "byte {i} ^ {mask:#x}");
                }
            }
        }
    }

    #[test]
    fn a_lone_plain_insert_is_not_a_run() {
        let (one, _) = batch_row(1);
        let (two, _) = batch_row(2);
        assert_eq!(one[HEADER], Kind::Insert as u8);
        assert_eq!(two[HEADER], RUN);
        // The second insert costs its id and the two count bytes.
        assert_eq!(two.len() - one.len(), 16 + 2);
    }

    #[test]
    fn runs_break_where_times_scope_index_or_id_length_differ() -> Result<()> {
        let mut w = RowWriter::new();
        let mut recs = Vec::new();
        let ids: [&[u8]; 4] = [b"aaaa", b"bbbb", b"cc", b"dddd"];
        let mut idx = 0;
        for (at, scope, gap, id) in [
            (10, &b"s"[..], 0, ids[0]),
            (10, b"s", 0, ids[1]), // run of two
            (10, b"s", 0, ids[2]), // other id length
            (10, b"s", 0, ids[3]),
            (11, b"s", 0, ids[0]), // other time
            (11, b"t", 0, ids[1]), // other scope
            (11, b"t", 1, ids[3]), // a gap in the index
            (11, b"t", 0, ids[0]),
        ] {
            idx += gap;
            let r = RecordRef {
                at,
                expires: at + 5,
                first_at: at,
                idx,
                scope,
                ..plain(id)
            };
            w.push(&r);
            recs.push(r);
            idx += 1;
        }
        let row = w.finish();
        let back: Vec<_> = read_row(&row)?.collect::<Result<_>>()?;
        assert_eq!(back, recs);
        assert_eq!(
            u32::from_le_bytes(row[2..6].try_into().unwrap()),
            6,
            "two runs of two, four alone"
        );
        Ok(())
    }

    #[test]
    fn damaged_runs_are_corrupt_not_panics() {
        let (row, _) = batch_row(3);
        let count = HEADER + 1 + 1 + 6 + 6 + 1 + b"tenant".len() + 1;
        // 2 leaves a third id as trailing bytes; 4 runs past the row.
        for ids in [0u16, 1, 2, 4, u16::MAX] {
            let mut bad = row[..row.len() - TRAILER].to_vec();
            bad[count..count + 2].copy_from_slice(&ids.to_le_bytes());
            let sum = xxhash_rust::xxh3::xxh3_64(&bad);
            bad.extend_from_slice(&sum.to_le_bytes());
            let res: Result<Vec<_>> = read_row(&bad).and_then(Iterator::collect);
            assert!(matches!(res, Err(Error::Corrupt(_))), "{ids} ids: {res:?}");
        }
    }

    #[test]
    fn bad_varints_and_scope_repeats_are_corrupt() {
        let head = |count: u32| {
            let mut b = vec![ROW_VERSION, 0];
            b.extend_from_slice(&count.to_le_bytes());
            b
        };
        // An 11-byte varint for idx_gap.
        let mut long = head(1);
        long.push(Kind::Insert as u8);
        long.extend_from_slice(&[0x80; 10]);
        long.push(0);
        // A 10-byte varint whose last byte overflows 64 bits.
        let mut over = head(1);
        over.push(Kind::Insert as u8);
        over.extend_from_slice(&[0xff; 9]);
        over.push(0x02);
        // The first record repeats a scope that does not exist.
        let mut repeat = head(1);
        repeat.extend_from_slice(&[Kind::Insert as u8, 0, 0, 0, 0, 1, b'x']);
        // An idx that does not fit 32 bits.
        let mut wide = head(1);
        wide.push(Kind::Insert as u8);
        put_varint(&mut wide, 1 << 32);
        wide.extend_from_slice(&[0, 0, 1, 1, b'x']);
        // A length past the end of the row.
        let mut past = head(1);
        past.extend_from_slice(&[Kind::Insert as u8, 0, 0, 0, 1, 100, b'x']);
        for (name, body) in [
            ("long", long),
            ("over", over),
            ("repeat", repeat),
            ("wide", wide),
            ("past", past),
        ] {
            let row = sealed(body);
            let res: Result<Vec<_>> = read_row(&row).and_then(Iterator::collect);
            assert!(matches!(res, Err(Error::Corrupt(_))), "{name}: {res:?}");
        }
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
        row.truncate(row.len() - 8);
        row[0] = 9;
        let row = sealed(row);
        assert!(matches!(
            read_row(&row).err(),
            Some(Error::UnsupportedVersion { found: 9, .. })
        ));
    }
}
