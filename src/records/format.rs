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
//! [`RecordRef`] and the payload in `outcome` (see [`record`](super::record)).
//! This file writes rows; [`decode`](super::decode) reads them.
//! `idx` orders the records of one commit across all bucket tables (the same
//! row number can appear in several tables). Times are milliseconds since the
//! Unix epoch. Every length is checked against the row before it is used, so
//! decoding arbitrary bytes returns an error, never panics, never
//! allocates more than the input, and never yields more records than the
//! row has bytes.

use super::record::Body;
use super::record::{Kind, RecordRef};

/// The newest row format this build writes and reads.
pub(crate) const ROW_VERSION: u8 = 1;
pub(super) const HEADER: usize = 6;
pub(super) const TRAILER: usize = 8;
/// The tag of a run: plain inserts that follow each other in a row with
/// the same times, scope and id length, written as one record header, a
/// `u16` count and the ids back to back.
pub(super) const RUN: u8 = 9;

/// Appends `v` as a LEB128 varint (7 bits a byte, low first).
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
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
pub(super) struct Prev {
    /// `idx + 1` of the previous record; 0 before the first.
    pub(super) next_idx: u64,
    pub(super) at: u64,
    pub(super) expires: u64,
}

impl Prev {
    pub(super) const START: Prev = Prev {
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

    /// A sealed copy of the row as it stands (as [`finish`](Self::finish)
    /// would make it), the writer left as it was: a read of a row whose
    /// commit has not been made yet.
    pub(crate) fn sealed_copy(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(self.buf.len() + 8);
        buf.extend_from_slice(&self.buf);
        buf[2..6].copy_from_slice(&self.count.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&buf);
        buf.extend_from_slice(&sum.to_le_bytes());
        buf
    }

    /// Writes the count and the checksum; the row is ready to store.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.buf[2..6].copy_from_slice(&self.count.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&self.buf);
        self.buf.extend_from_slice(&sum.to_le_bytes());
        self.buf
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::Result;
    use crate::records::decode::read_row;

    pub(crate) const ALL_KINDS: [Kind; 9] = [
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

    pub(crate) fn sample(kind: Kind, idx: u32, outcome: &[u8]) -> RecordRef<'_> {
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
    pub(crate) fn sealed(mut body: Vec<u8>) -> Vec<u8> {
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
    pub(crate) fn batch_row(n: u32) -> (Vec<u8>, Vec<[u8; 16]>) {
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
    pub(crate) fn plain(id: &[u8]) -> RecordRef<'_> {
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
        pub(crate) fn with_id(self, id: &'a [u8]) -> RecordRef<'a> {
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
}
