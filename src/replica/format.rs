//! The replica's objects, as bytes: segments, snapshot parts and indexes,
//! owner objects, and the local state file. Every object ends with an
//! xxh3-64 checksum of every byte before it, and is decoded with every
//! length checked: damage is an error naming the object, never a panic.
//!
//! ```text
//! segment  := "DKVSEG01" | flags:u8 | epoch:u64 | seq:u64 | max_row:u64
//!             | commits:u32 | commit{commits} | checksum:u64
//!   flags  := 1 FENCE (its epoch's first segment) | 2 RESET (the state
//!             after it is the snapshot of the same seq)
//!   commit := row:var | n:var bucket:var{n} | n:var (bucket:var first:var last:var){n}
//!             | n:var (bucket:var row:var len:var bytes){n}
//!             | n:var (len:var name | 0:u8 | 1:u8 len:var value){n}
//! part     := "DKVPRT01" | seq:u64 | part:u32 | n:var (bucket:var row:var len:var bytes){n}
//!             | checksum:u64
//! index    := "DKVSIX01" | epoch:u64 | seq:u64 | max_row:u64 | rows:u64 | bytes:u64
//!             | parts:u32 | (len:u64 checksum:u64){parts}
//!             | n:var (len:var name len:var value){n} | checksum:u64
//! owner    := "DKVOWN01" | epoch:u64 | at_ms:u64 | len:var label | checksum:u64
//! local    := "DKVLOC01" | epoch:u64 | seq:u64 | clean:u8 | checksum:u64
//!           | "DKVLOC02" | epoch:u64 | seq:u64 | clean:u8 | claiming:u64 | checksum:u64
//!             (written only while an open takes an epoch, so a build that
//!             reads only DKVLOC01 reads every file a finished open left)
//! ```
//!
//! Integers are little-endian; `var` is an unsigned LEB128 varint of at
//! most 10 bytes.

use crate::log::Shipped;
use crate::{Error, Result};

const SEGMENT: &[u8; 8] = b"DKVSEG01";
const PART: &[u8; 8] = b"DKVPRT01";
const INDEX: &[u8; 8] = b"DKVSIX01";
const OWNER: &[u8; 8] = b"DKVOWN01";
const LOCAL: &[u8; 8] = b"DKVLOC01";
/// The local state of an open that was taking an epoch (it has `claiming`).
const LOCAL_CLAIMING: &[u8; 8] = b"DKVLOC02";

/// A segment's first segment of its epoch (the fence).
pub(crate) const FENCE: u8 = 1;
/// A segment after which the state is the snapshot of the same seq.
pub(crate) const RESET: u8 = 2;
/// Bytes of a segment before its first commit.
pub(crate) const SEGMENT_HEAD: usize = 8 + 1 + 8 + 8 + 8 + 4;

/// The head of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentHead {
    pub flags: u8,
    pub epoch: u64,
    pub seq: u64,
    /// The newest row number any commit of the chain wrote, up to and
    /// including this segment.
    pub max_row: u64,
    pub commits: u32,
}

fn put_var(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_var(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let sum = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Reads an object's bytes: the checksum checked first, then every field
/// against what is left.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'a str,
}

impl<'a> Reader<'a> {
    /// `bytes` without its checksum, once the checksum and `magic` match.
    fn open(bytes: &'a [u8], magic: [u8; 8], what: &'a str) -> Result<Reader<'a>> {
        if bytes.len() < 16 {
            return Err(damaged(what, "it is too short"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        let mut want = [0u8; 8];
        want.copy_from_slice(sum);
        if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(want) {
            return Err(damaged(what, "it fails its checksum"));
        }
        if body[..8] != magic {
            return Err(damaged(what, "it is not an object of this kind"));
        }
        Ok(Reader {
            buf: body,
            pos: 8,
            what,
        })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| damaged(self.what, "a length runs past its end"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn var(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                break;
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(damaged(self.what, "a varint is too long"))
    }

    /// A count of items that each take at least `min` bytes: never more
    /// than what is left could hold.
    fn count(&mut self, min: usize) -> Result<usize> {
        let n = self.var()?;
        let left = (self.buf.len() - self.pos) as u64;
        if n > left / min.max(1) as u64 {
            return Err(damaged(self.what, "a count exceeds its contents"));
        }
        Ok(n as usize)
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.var()?;
        let n = usize::try_from(n).map_err(|_| damaged(self.what, "a length is too large"))?;
        self.take(n)
    }

    fn done(&self) -> Result<()> {
        if self.pos != self.buf.len() {
            return Err(damaged(self.what, "it has bytes after its end"));
        }
        Ok(())
    }
}

/// The error for a damaged replica object.
pub(crate) fn damaged(what: &str, why: &str) -> Error {
    Error::Corrupt(format!(
        "the replica object {what} is damaged: {why}; the replica cannot be restored past it"
    ))
}

/// Encodes a segment.
pub(crate) fn segment(head: SegmentHead, commits: &[Shipped]) -> Vec<u8> {
    segment_of(head, commits.iter())
}

/// Encodes a segment of the commits `commits` yields.
pub(crate) fn segment_of<'a>(
    head: SegmentHead,
    commits: impl ExactSizeIterator<Item = &'a Shipped> + Clone,
) -> Vec<u8> {
    let size: usize = commits.clone().map(Shipped::bytes).sum();
    let mut out = Vec::with_capacity(SEGMENT_HEAD + size + 64 * commits.len() + 8);
    out.extend_from_slice(SEGMENT);
    out.push(head.flags);
    out.extend_from_slice(&head.epoch.to_le_bytes());
    out.extend_from_slice(&head.seq.to_le_bytes());
    out.extend_from_slice(&head.max_row.to_le_bytes());
    out.extend_from_slice(&(commits.len() as u32).to_le_bytes());
    for c in commits {
        put_var(&mut out, c.row);
        put_var(&mut out, c.drops.len() as u64);
        for b in &c.drops {
            put_var(&mut out, *b);
        }
        put_var(&mut out, c.trims.len() as u64);
        for (b, first, last) in &c.trims {
            put_var(&mut out, *b);
            put_var(&mut out, *first);
            put_var(&mut out, *last);
        }
        put_var(&mut out, c.rows.len() as u64);
        for (b, row, bytes) in &c.rows {
            put_var(&mut out, *b);
            put_var(&mut out, *row);
            put_bytes(&mut out, bytes);
        }
        put_var(&mut out, c.meta.len() as u64);
        for (k, v) in &c.meta {
            put_bytes(&mut out, k.as_bytes());
            match v {
                None => out.push(0),
                Some(v) => {
                    out.push(1);
                    put_bytes(&mut out, v);
                }
            }
        }
    }
    seal(out)
}

/// Decodes a segment's head alone (its checksum unchecked: only what a
/// listing needs; [`read_segment`] checks everything).
pub(crate) fn segment_head(bytes: &[u8], what: &str) -> Result<SegmentHead> {
    if bytes.len() < SEGMENT_HEAD || &bytes[..8] != SEGMENT {
        return Err(damaged(what, "it does not start as a segment"));
    }
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let mut c = [0u8; 4];
    c.copy_from_slice(&bytes[33..37]);
    Ok(SegmentHead {
        flags: bytes[8],
        epoch: u64_at(9),
        seq: u64_at(17),
        max_row: u64_at(25),
        commits: u32::from_le_bytes(c),
    })
}

/// Decodes a whole segment, checksum first.
pub(crate) fn read_segment(bytes: &[u8], what: &str) -> Result<(SegmentHead, Vec<Shipped>)> {
    let mut r = Reader::open(bytes, *SEGMENT, what)?;
    let head = SegmentHead {
        flags: r.u8()?,
        epoch: r.u64()?,
        seq: r.u64()?,
        max_row: r.u64()?,
        commits: r.u32()?,
    };
    let mut commits = Vec::with_capacity((head.commits as usize).min(bytes.len() / 5));
    for _ in 0..head.commits {
        let row = r.var()?;
        let n = r.count(1)?;
        let drops = (0..n).map(|_| r.var()).collect::<Result<Vec<_>>>()?;
        let n = r.count(3)?;
        let mut trims = Vec::with_capacity(n);
        for _ in 0..n {
            trims.push((r.var()?, r.var()?, r.var()?));
        }
        let n = r.count(3)?;
        let mut rows = Vec::with_capacity(n);
        for _ in 0..n {
            let (b, row) = (r.var()?, r.var()?);
            rows.push((b, row, r.bytes()?.to_vec()));
        }
        let n = r.count(2)?;
        let mut meta = Vec::with_capacity(n);
        for _ in 0..n {
            let k = String::from_utf8(r.bytes()?.to_vec())
                .map_err(|_| damaged(what, "a metadata name is not UTF-8"))?;
            let v = match r.u8()? {
                0 => None,
                1 => Some(r.bytes()?.to_vec()),
                _ => return Err(damaged(what, "a metadata value has an unknown tag")),
            };
            meta.push((k, v));
        }
        commits.push(Shipped {
            row,
            drops,
            trims,
            rows,
            meta,
        });
    }
    r.done()?;
    Ok((head, commits))
}

/// Encodes a snapshot part: rows of the store as (bucket, row, bytes).
pub(crate) fn part(seq: u64, part: u32, rows: &[(u64, u64, Vec<u8>)]) -> Vec<u8> {
    let size: usize = rows.iter().map(|r| r.2.len() + 12).sum();
    let mut out = Vec::with_capacity(size + 40);
    out.extend_from_slice(PART);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&part.to_le_bytes());
    put_var(&mut out, rows.len() as u64);
    for (b, row, bytes) in rows {
        put_var(&mut out, *b);
        put_var(&mut out, *row);
        put_bytes(&mut out, bytes);
    }
    seal(out)
}

/// Decodes a snapshot part, which must be part `part` of snapshot `seq`.
pub(crate) fn read_part(
    bytes: &[u8],
    seq: u64,
    part: u32,
    what: &str,
) -> Result<Vec<(u64, u64, Vec<u8>)>> {
    let mut r = Reader::open(bytes, *PART, what)?;
    if r.u64()? != seq || r.u32()? != part {
        return Err(damaged(what, "it belongs to another snapshot or place"));
    }
    let n = r.count(3)?;
    let mut rows = Vec::with_capacity(n);
    for _ in 0..n {
        let (b, row) = (r.var()?, r.var()?);
        rows.push((b, row, r.bytes()?.to_vec()));
    }
    r.done()?;
    Ok(rows)
}

/// A snapshot's index: what it holds and how to check its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Index {
    pub epoch: u64,
    pub seq: u64,
    pub max_row: u64,
    pub rows: u64,
    pub bytes: u64,
    /// Each part's length and xxh3-64 checksum, in order.
    pub parts: Vec<(u64, u64)>,
    /// The store's metadata entries.
    pub meta: Vec<(String, Vec<u8>)>,
}

/// Encodes a snapshot index.
pub(crate) fn index(ix: &Index) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + 16 * ix.parts.len());
    out.extend_from_slice(INDEX);
    for v in [ix.epoch, ix.seq, ix.max_row, ix.rows, ix.bytes] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(ix.parts.len() as u32).to_le_bytes());
    for (len, sum) in &ix.parts {
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&sum.to_le_bytes());
    }
    put_var(&mut out, ix.meta.len() as u64);
    for (k, v) in &ix.meta {
        put_bytes(&mut out, k.as_bytes());
        put_bytes(&mut out, v);
    }
    seal(out)
}

/// Decodes a snapshot index.
pub(crate) fn read_index(bytes: &[u8], what: &str) -> Result<Index> {
    let mut r = Reader::open(bytes, *INDEX, what)?;
    let (epoch, seq, max_row, rows, total) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let n = r.u32()? as usize;
    if n > bytes.len() / 16 {
        return Err(damaged(what, "a count exceeds its contents"));
    }
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        parts.push((r.u64()?, r.u64()?));
    }
    let n = r.count(2)?;
    let mut meta = Vec::with_capacity(n);
    for _ in 0..n {
        let k = String::from_utf8(r.bytes()?.to_vec())
            .map_err(|_| damaged(what, "a metadata name is not UTF-8"))?;
        meta.push((k, r.bytes()?.to_vec()));
    }
    r.done()?;
    Ok(Index {
        epoch,
        seq,
        max_row,
        rows,
        bytes: total,
        parts,
        meta,
    })
}

/// An owner object: who took ownership in `epoch`, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    pub epoch: u64,
    pub at_ms: u64,
    pub label: String,
}

/// Encodes an owner object.
pub(crate) fn owner(o: &Owner) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + o.label.len());
    out.extend_from_slice(OWNER);
    out.extend_from_slice(&o.epoch.to_le_bytes());
    out.extend_from_slice(&o.at_ms.to_le_bytes());
    put_bytes(&mut out, o.label.as_bytes());
    seal(out)
}

/// Decodes an owner object.
pub(crate) fn read_owner(bytes: &[u8], what: &str) -> Result<Owner> {
    let mut r = Reader::open(bytes, *OWNER, what)?;
    let (epoch, at_ms) = (r.u64()?, r.u64()?);
    let label = String::from_utf8_lossy(r.bytes()?).into_owned();
    r.done()?;
    Ok(Owner {
        epoch,
        at_ms,
        label,
    })
}

/// The replica's own state beside the store file: the epoch that last
/// wrote the file (0: none yet), after a clean close the last segment it
/// shipped, and while an open takes a new epoch, that epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Local {
    pub epoch: u64,
    pub seq: u64,
    /// The file holds exactly the chain up to `seq` (a clean close).
    pub clean: bool,
    /// An open from this disk was taking this epoch (0: none): written
    /// before it creates the owner object, so a later open knows a fence
    /// of this epoch (or a lower one above `epoch`) is its own, not
    /// another owner's.
    pub claiming: u64,
}

/// Encodes the local state.
pub(crate) fn local(l: Local) -> Vec<u8> {
    let mut out = Vec::with_capacity(41);
    out.extend_from_slice(if l.claiming == 0 {
        LOCAL
    } else {
        LOCAL_CLAIMING
    });
    out.extend_from_slice(&l.epoch.to_le_bytes());
    out.extend_from_slice(&l.seq.to_le_bytes());
    out.push(u8::from(l.clean));
    if l.claiming != 0 {
        out.extend_from_slice(&l.claiming.to_le_bytes());
    }
    seal(out)
}

/// Decodes the local state.
pub(crate) fn read_local(bytes: &[u8], what: &str) -> Result<Local> {
    let claiming = bytes.get(..8) == Some(LOCAL_CLAIMING.as_slice());
    let mut r = Reader::open(bytes, if claiming { *LOCAL_CLAIMING } else { *LOCAL }, what)?;
    let mut l = Local {
        epoch: r.u64()?,
        seq: r.u64()?,
        clean: r.u8()? == 1,
        claiming: 0,
    };
    if claiming {
        l.claiming = r.u64()?;
    }
    r.done()?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit() -> Shipped {
        Shipped {
            row: 7,
            drops: vec![3],
            trims: vec![(4, 1, 2)],
            rows: vec![(5, 7, vec![1, 2, 3]), (6, 7, vec![])],
            meta: vec![("manifest".into(), Some(vec![9; 12])), ("old".into(), None)],
        }
    }

    #[test]
    fn a_segment_reads_back_and_any_flipped_byte_is_damage() -> Result<()> {
        let head = SegmentHead {
            flags: FENCE,
            epoch: 3,
            seq: 11,
            max_row: 7,
            commits: 2,
        };
        let bytes = segment(head, &[commit(), Shipped::default()]);
        let (h, c) = read_segment(&bytes, "s")?;
        assert_eq!(h, head);
        assert_eq!(segment_head(&bytes, "s")?, head);
        assert_eq!(c, vec![commit(), Shipped::default()]);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(
                matches!(read_segment(&bad, "s"), Err(Error::Corrupt(_))),
                "byte {i}"
            );
        }
        for n in 0..bytes.len() {
            assert!(read_segment(&bytes[..n], "s").is_err());
        }
        Ok(())
    }

    #[test]
    fn parts_indexes_owners_and_local_state_read_back() -> Result<()> {
        let rows = vec![(1, 2, vec![3; 40]), (1, 3, vec![4])];
        assert_eq!(read_part(&part(9, 2, &rows), 9, 2, "p")?, rows);
        assert!(read_part(&part(9, 2, &rows), 9, 3, "p").is_err());
        let ix = Index {
            epoch: 2,
            seq: 9,
            max_row: 3,
            rows: 2,
            bytes: 41,
            parts: vec![(10, 20)],
            meta: vec![("magic".into(), b"dedupkv store".to_vec())],
        };
        assert_eq!(read_index(&index(&ix), "i")?, ix);
        let o = Owner {
            epoch: 5,
            at_ms: 6,
            label: "host:1".into(),
        };
        assert_eq!(read_owner(&owner(&o), "o")?, o);
        let l = Local {
            epoch: 5,
            seq: 8,
            clean: true,
            claiming: 0,
        };
        assert_eq!(read_local(&local(l), "l")?, l);
        assert_eq!(
            &local(l)[..8],
            LOCAL,
            "a finished open's state reads in older builds"
        );
        let c = Local { claiming: 7, ..l };
        assert_eq!(read_local(&local(c), "l")?, c);
        for i in 0..local(c).len() {
            let mut bad = local(c);
            bad[i] ^= 0x04;
            assert!(read_local(&bad, "l").is_err(), "byte {i}");
        }
        Ok(())
    }
}
