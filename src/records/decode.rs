//! Reading a row: the checks and the decoder of [`format`](super::format)'s
//! layout. Every length is checked against the row before it is used, so
//! decoding arbitrary bytes returns an error, never panics, never
//! allocates more than the input, and never yields more records than the
//! row has bytes.

use super::format::{HEADER, Prev, ROW_VERSION, RUN, TRAILER};
use super::record::{Body, Kind, RecordRef};
use crate::{Error, Result};

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
    use crate::records::format::tests::{batch_row, sample, sealed};
    use crate::records::format::{RowWriter, put_varint};

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
