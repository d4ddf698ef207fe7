//! `dedupkv.meta`: the settings fixed at creation, under a checksum, and
//! the manifest (the set of bucket tables and the persisted floors), under
//! its own; and the check at open that the file holds exactly the tables
//! the manifest lists.
//!
//! Entries (format 5; formats 2 to 4 have the same entries):
//!
//! ```text
//! magic          = "dedupkv store"
//! format         = u32 LE (5)
//! key_hashing    = u8
//! key_secret     = 16 bytes
//! granularity_ms = u64 LE
//! settings_sum   = u64 LE: xxh3-64 of (len:u32 LE | value) for magic,
//!                  format, key_hashing, key_secret, granularity_ms in turn
//! manifest       = version:u8 (=1) | token_floor:var | time_floor:var
//!                  | runs:var | (gap:var | len_minus_1:var){runs} | checksum:u64 LE
//!                  a run is consecutive buckets; `gap` is its first bucket
//!                  minus the end (last + 1) of the run before (0 before
//!                  the first); checksum = xxh3-64 of every byte before it
//! ```
//!
//! Format 1 (no checksum, no manifest, an optional `token_floor` = u64 LE)
//! is read by trusting the tables present once; its first commit rewrites
//! it as format 3. Format 2 differs from 3 only in the record kinds it may
//! hold (3 adds `DeadLetter`, `Intent`, `Tally`): its first commit rewrites
//! `format` and `settings_sum` as 3, so a build that knows only format 2
//! refuses the file as newer rather than meeting a record kind it cannot
//! read. No release wrote either. From format 3 on a file keeps its format
//! until an explicit upgrade ([`upgrade_changes`]), and a build writes into
//! it only what its format holds: format 4 adds the answers in `Intent`
//! bodies, the first failure times in `DeadLetter` bodies and rounds, and
//! the kinds `Keys` and `Amount` (writers ask `Engine::has_format_4_bodies`);
//! format 5 the bucket summaries ([`summary`](super::summary)).
//! Every later format keeps `settings_sum` as defined here, so a build can
//! tell a newer file from a damaged one.

use std::collections::{BTreeMap, BTreeSet};

use super::store::{
    Commit, LogStore, META_NAME, MetaChange, MetaEntries, is_log_table_name, parse_table_name,
    table_name,
};
use crate::key::{KeyHasher, KeyHashing};
use crate::records::FORMAT_VERSION;
use crate::{Error, Result};

const MAGIC: &[u8] = b"dedupkv store";
/// The entries the settings checksum covers, in its order.
const SETTINGS: [&str; 5] = [
    "magic",
    "format",
    "key_hashing",
    "key_secret",
    "granularity_ms",
];
const SETTINGS_SUM: &str = "settings_sum";
const MANIFEST: &str = "manifest";
/// Format 1's fencing-token floor, folded into the manifest by format 2.
const OLD_TOKEN_FLOOR: &str = "token_floor";
const MANIFEST_VERSION: u8 = 1;

/// The settings fixed when a store file is created, and what its manifest
/// says.
#[derive(Clone)]
pub(crate) struct FileMeta {
    /// The file's store format, as found (a new file: [`FORMAT_VERSION`]).
    pub format: u32,
    pub hasher: KeyHasher,
    pub granularity_ms: u64,
    /// The highest clock reading the store has recorded (0 when none).
    pub time_floor: u64,
    /// The lowest fencing token a reopened store may issue.
    pub token_floor: u64,
    /// The bucket tables in the file (all of them, expired ones included).
    pub manifest: Manifest,
}

impl FileMeta {
    /// The settings a new file gets.
    pub(crate) fn new(hasher: KeyHasher, granularity_ms: u64) -> Self {
        FileMeta {
            format: FORMAT_VERSION,
            hasher,
            granularity_ms,
            time_floor: 0,
            token_floor: 0,
            manifest: Manifest::default(),
        }
    }
}

/// What the manifest records: every bucket table in the file and the
/// floors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub buckets: BTreeSet<u64>,
    pub token_floor: u64,
    pub time_floor: u64,
}

impl Manifest {
    /// The encoded entry, checksum last.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![MANIFEST_VERSION];
        put_varint(&mut out, self.token_floor);
        put_varint(&mut out, self.time_floor);
        let runs = runs(&self.buckets);
        put_varint(&mut out, runs.len() as u64);
        let mut end = 0;
        for (start, len) in runs {
            put_varint(&mut out, start - end);
            put_varint(&mut out, len - 1);
            end = start + len;
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }
}

/// A manifest as read: the floors, and its buckets as runs, which are
/// checked against the tables in the file before anything is built from
/// them (a run costs two bytes of the entry however long it is).
#[derive(Debug, PartialEq, Eq)]
struct Decoded {
    token_floor: u64,
    time_floor: u64,
    /// (first bucket, count), ascending, not touching.
    runs: Vec<(u64, u64)>,
}

fn decode(bytes: &[u8]) -> Result<Decoded> {
    let bad = |why: &str| Error::Corrupt(format!("the manifest in {META_NAME} {why}"));
    let Some(body_len) = bytes.len().checked_sub(8) else {
        return Err(bad("is truncated"));
    };
    let (body, sum) = bytes.split_at(body_len);
    let sum = u64::from_le_bytes(sum.try_into().map_err(|_| bad("is truncated"))?);
    if xxhash_rust::xxh3::xxh3_64(body) != sum {
        return Err(bad("fails its checksum"));
    }
    let (&version, mut rest) = body.split_first().ok_or_else(|| bad("is empty"))?;
    if version != MANIFEST_VERSION {
        return Err(bad(&format!("has unknown version {version}")));
    }
    let mut next = || take_varint(&mut rest).ok_or_else(|| bad("has a bad number"));
    let token_floor = next()?;
    let time_floor = next()?;
    let count = next()?;
    let mut runs = Vec::new();
    let mut end = 0u64;
    for i in 0..count {
        let gap = next()?;
        if i > 0 && gap == 0 {
            return Err(bad("has touching runs"));
        }
        let start = end.checked_add(gap).ok_or_else(|| bad("overflows"))?;
        let len = next()?.checked_add(1).ok_or_else(|| bad("overflows"))?;
        end = start.checked_add(len).ok_or_else(|| bad("overflows"))?;
        runs.push((start, len));
    }
    if !rest.is_empty() {
        return Err(bad("has trailing bytes"));
    }
    Ok(Decoded {
        token_floor,
        time_floor,
        runs,
    })
}

/// Consecutive buckets as (first, count) runs.
fn runs(buckets: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in buckets {
        match out.last_mut() {
            Some((start, len)) if *start + *len == b => *len += 1,
            _ => out.push((b, 1)),
        }
    }
    out
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn take_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        let part = u64::from(b & 0x7f);
        if shift == 63 && part > 1 {
            return None;
        }
        v |= part << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// xxh3-64 over the settings, each as its length (u32 LE) and bytes.
fn settings_sum(values: [&[u8]; 5]) -> u64 {
    let mut buf = Vec::new();
    for v in values {
        buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
        buf.extend_from_slice(v);
    }
    xxhash_rust::xxh3::xxh3_64(&buf)
}

/// Reads and checks the metadata of an existing store, or writes it into
/// an empty file.
pub(crate) fn read_or_init(db: &dyn LogStore, wanted: &FileMeta) -> Result<FileMeta> {
    if let Some(entries) = db.read_meta()? {
        let (meta, decoded) = check_meta(entries)?;
        return check_tables(db, meta, decoded.as_ref());
    }
    let names = db.table_names()?;
    if names.is_empty() {
        return init(db, wanted);
    }
    Err(without_meta(&names))
}

/// Reads and checks the metadata of an existing store, writing nothing
/// (the read-only open): a database without it is not a store, or a
/// damaged one.
pub(crate) fn read_existing(db: &dyn LogStore) -> Result<FileMeta> {
    let Some(entries) = db.read_meta()? else {
        return Err(without_meta(&db.table_names()?));
    };
    let (meta, decoded) = check_meta(entries)?;
    check_tables(db, meta, decoded.as_ref())
}

/// A database without our metadata table, holding the tables `names`:
/// ours, with its metadata gone (a damaged table tree or a damaged name),
/// or someone else's database.
fn without_meta(names: &[String]) -> Error {
    if let Some(ours) = names.iter().find(|n| looks_like_ours(n)) {
        return Error::Corrupt(format!(
            "the table {META_NAME} is missing, but the file has the dedupkv table {ours:?}"
        ));
    }
    Error::NotAStore("a redb database without dedupkv tables".into())
}

/// A table of ours: a bucket table, or one byte off `dedupkv.meta`.
fn looks_like_ours(name: &str) -> bool {
    let off_by = |a: &str, b: &str| {
        a.len() == b.len() && a.bytes().zip(b.bytes()).filter(|(x, y)| x != y).count() <= 1
    };
    is_log_table_name(name) || off_by(name, META_NAME)
}

/// The settings, checked, and the manifest as read (none in format 1).
fn check_meta(entries: MetaEntries) -> Result<(FileMeta, Option<Decoded>)> {
    let entries: BTreeMap<String, Vec<u8>> = entries.into_iter().collect();
    let get = |k: &str| -> Result<&[u8]> {
        entries
            .get(k)
            .map(Vec::as_slice)
            .ok_or_else(|| Error::Corrupt(format!("the {META_NAME} entry {k:?} is missing")))
    };
    let values = [
        get(SETTINGS[0])?,
        get(SETTINGS[1])?,
        get(SETTINGS[2])?,
        get(SETTINGS[3])?,
        get(SETTINGS[4])?,
    ];
    let version = u32::from_le_bytes(fixed(values[1], "format")?);
    let known = extra_entries(version, &entries, values)?;
    if let Some(k) = entries
        .keys()
        .find(|k| !SETTINGS.contains(&k.as_str()) && !known.contains(&k.as_str()))
    {
        return Err(Error::Corrupt(format!(
            "{META_NAME} has an unknown entry {k:?}"
        )));
    }
    if values[0] != MAGIC {
        return Err(Error::Corrupt(format!(
            "the {META_NAME} entry \"magic\" is wrong"
        )));
    }
    let kind = values[2]
        .first()
        .filter(|_| values[2].len() == 1)
        .and_then(|t| KeyHashing::from_tag(*t))
        .ok_or_else(|| Error::Corrupt("unknown key hashing tag".into()))?;
    let secret: [u8; 16] = fixed(values[3], "key_secret")?;
    let granularity_ms = u64::from_le_bytes(fixed(values[4], "granularity_ms")?);
    if granularity_ms == 0 {
        return Err(Error::Corrupt("the bucket granularity is zero".into()));
    }
    let decoded = if version == 1 {
        None
    } else {
        Some(decode(get(MANIFEST)?)?)
    };
    let token_floor = match (&decoded, entries.get(OLD_TOKEN_FLOOR)) {
        (Some(d), _) => d.token_floor,
        (None, Some(v)) => u64::from_le_bytes(fixed(v, OLD_TOKEN_FLOOR)?),
        (None, None) => 0,
    };
    let time_floor = decoded.as_ref().map_or(0, |d| d.time_floor);
    let meta = FileMeta {
        format: version,
        hasher: KeyHasher::new(kind, secret),
        granularity_ms,
        time_floor,
        token_floor,
        manifest: Manifest {
            buckets: BTreeSet::new(),
            token_floor,
            time_floor,
        },
    };
    Ok((meta, decoded))
}

/// The entries a file of format `version` holds besides the settings,
/// once its settings checksum (from format 2) is checked.
fn extra_entries(
    version: u32,
    entries: &BTreeMap<String, Vec<u8>>,
    values: [&[u8]; 5],
) -> Result<&'static [&'static str]> {
    match (version, entries.get(SETTINGS_SUM)) {
        (1, None) => Ok(&[OLD_TOKEN_FLOOR]),
        (0 | 1, _) => Err(Error::Corrupt(format!(
            "the {META_NAME} entry \"format\" says {version}, which does not match its other entries"
        ))),
        (_, None) => Err(Error::Corrupt(format!(
            "the {META_NAME} entry {SETTINGS_SUM:?} is missing"
        ))),
        (_, Some(sum)) => {
            let sum = u64::from_le_bytes(fixed(sum, SETTINGS_SUM)?);
            if settings_sum(values) != sum {
                return Err(Error::Corrupt(format!(
                    "the settings in {META_NAME} (magic, format, key hashing, secret, \
                     granularity) fail their checksum"
                )));
            }
            if version > FORMAT_VERSION {
                return Err(Error::UnsupportedVersion {
                    found: version,
                    supported: FORMAT_VERSION,
                });
            }
            Ok(&[SETTINGS_SUM, MANIFEST])
        }
    }
}

/// Checks the tables in the file against the manifest (a format-1 file
/// has none: its tables are trusted once) and that each opens as a bucket
/// table.
fn check_tables(
    db: &dyn LogStore,
    mut meta: FileMeta,
    decoded: Option<&Decoded>,
) -> Result<FileMeta> {
    let mut found = BTreeSet::new();
    for name in db.table_names()? {
        if name == META_NAME {
            continue;
        }
        match parse_table_name(&name) {
            Some(b) if table_name(b) == name => {
                found.insert(b);
            }
            _ => {
                return Err(Error::Corrupt(format!(
                    "the file has an unknown table {name:?}"
                )));
            }
        }
    }
    let m = &mut meta.manifest;
    if let Some(d) = decoded {
        if let Some(b) = found.iter().find(|b| !in_runs(&d.runs, **b)) {
            return Err(Error::Corrupt(format!(
                "the table {:?} is not in the manifest",
                table_name(*b)
            )));
        }
        for &(start, len) in &d.runs {
            let mut want = start;
            for &b in found.range(start..start + len) {
                if b != want {
                    break;
                }
                want += 1;
            }
            if want != start + len {
                return Err(Error::Corrupt(format!(
                    "the manifest lists the table {:?}, which is missing",
                    table_name(want)
                )));
            }
        }
    } else {
        tracing::warn!(
            tables = found.len(),
            "dedupkv: a format-1 file has no manifest; trusting its {} bucket tables \
             and writing one in the first commit",
            found.len()
        );
    }
    m.buckets = found;
    for b in &m.buckets {
        db.check_bucket(*b)?;
    }
    Ok(meta)
}

fn in_runs(runs: &[(u64, u64)], b: u64) -> bool {
    let i = runs.partition_point(|&(start, _)| start <= b);
    i > 0 && b - runs[i - 1].0 < runs[i - 1].1
}

/// Writes a new file's metadata.
fn init(db: &dyn LogStore, wanted: &FileMeta) -> Result<FileMeta> {
    let hashing = [wanted.hasher.kind().tag()];
    let format = FORMAT_VERSION.to_le_bytes();
    let granularity = wanted.granularity_ms.to_le_bytes();
    let values: [&[u8]; 5] = [
        MAGIC,
        &format,
        &hashing,
        &wanted.hasher.secret(),
        &granularity,
    ];
    let manifest = Manifest::default();
    let mut meta: Vec<MetaChange> = SETTINGS
        .iter()
        .zip(values)
        .map(|(k, v)| (*k, Some(v.to_vec())))
        .collect();
    meta.push((
        SETTINGS_SUM,
        Some(settings_sum(values).to_le_bytes().to_vec()),
    ));
    meta.push((MANIFEST, Some(manifest.encode())));
    db.commit(Commit {
        meta,
        ..Commit::default()
    })?;
    Ok(FileMeta {
        manifest,
        time_floor: 0,
        token_floor: 0,
        ..wanted.clone()
    })
}

/// The metadata change that writes `manifest`.
pub(crate) fn manifest_change(manifest: &Manifest) -> MetaChange {
    (MANIFEST, Some(manifest.encode()))
}

/// The metadata changes that rewrite the file as format `to` (from the
/// entries `db` holds) and write `manifest`: `format` and `settings_sum`
/// rewritten, and a format-1 file's token floor entry removed (the
/// manifest holds it). What else a format needs (format 5's summaries)
/// the same commit writes.
pub(crate) fn upgrade_changes(
    db: &dyn LogStore,
    manifest: &Manifest,
    to: u32,
) -> Result<Vec<MetaChange>> {
    let entries: BTreeMap<String, Vec<u8>> =
        db.read_meta()?.unwrap_or_default().into_iter().collect();
    let format = to.to_le_bytes();
    let mut values: Vec<Vec<u8>> = Vec::with_capacity(SETTINGS.len());
    for k in SETTINGS {
        let v = if k == "format" {
            format.to_vec()
        } else {
            entries
                .get(k)
                .cloned()
                .ok_or_else(|| Error::Corrupt(format!("the {META_NAME} entry {k:?} is missing")))?
        };
        values.push(v);
    }
    let sum = settings_sum([&values[0], &values[1], &values[2], &values[3], &values[4]]);
    Ok(vec![
        ("format", Some(format.to_vec())),
        (SETTINGS_SUM, Some(sum.to_le_bytes().to_vec())),
        (OLD_TOKEN_FLOOR, None),
        manifest_change(manifest),
    ])
}

fn fixed<const N: usize>(v: &[u8], what: &str) -> Result<[u8; N]> {
    v.try_into()
        .map_err(|_| Error::Corrupt(format!("the {META_NAME} entry {what:?} has the wrong size")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(buckets: impl IntoIterator<Item = u64>) -> Manifest {
        Manifest {
            buckets: buckets.into_iter().collect(),
            token_floor: 1 << 40,
            time_floor: 1_700_000_000_000,
        }
    }

    #[test]
    fn manifests_round_trip() -> Result<()> {
        for m in [
            manifest([]),
            manifest([0]),
            manifest([u64::MAX - 1]),
            manifest([3, 4, 5, 9, 11, 12, 1_000_000]),
            manifest((28_333_000..28_334_440).chain([40_000_000])),
        ] {
            let d = decode(&m.encode())?;
            let buckets: BTreeSet<u64> = d.runs.iter().flat_map(|&(s, n)| s..s + n).collect();
            assert_eq!(
                (d.token_floor, d.time_floor, &buckets),
                (m.token_floor, m.time_floor, &m.buckets)
            );
            assert!(m.buckets.iter().all(|b| in_runs(&d.runs, *b)));
        }
        Ok(())
    }

    #[test]
    fn a_day_of_minute_buckets_stays_small() {
        // Minute buckets of one day, with a week of stragglers past it.
        let day = manifest(
            (28_333_000..28_333_000 + 1_440).chain((0..7).map(|d| 28_340_000 + d * 1_440)),
        );
        let len = day.encode().len();
        assert!(len < 64, "{len} bytes");
    }

    #[test]
    fn any_damaged_byte_is_corrupt() {
        let bytes = manifest([7, 8, 9, 100]).encode();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    matches!(decode(&bad), Err(Error::Corrupt(_))),
                    "byte {i} bit {bit}"
                );
            }
        }
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "{len}");
        }
    }

    #[test]
    fn the_settings_checksum_separates_its_fields() {
        let a = settings_sum([b"ab", b"c", b"", b"", b""]);
        let b = settings_sum([b"a", b"bc", b"", b"", b""]);
        assert_ne!(a, b);
    }
}
