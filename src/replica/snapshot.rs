//! Snapshots: the store as of one commit (every metadata entry and every
//! bucket table's rows, as the file holds them), written as parts of at
//! most [`PART_BYTES`] and an index written last, so a snapshot without
//! its index is unfinished and never read. And pruning: once a snapshot
//! is whole, the segments and snapshots before it are deleted.
//!
//! A snapshot holds what the file holds, byte for byte, rather than the
//! live records re-encoded: a restore then rebuilds exactly the file the
//! owner had (the manifest and the tables agree), and the store's own
//! recovery decides what is live, as it does for the file. Retention
//! bounds it as it bounds the file: expired tables are deleted from the
//! file, so from the next snapshot.

use std::sync::atomic::{AtomicBool, Ordering};

use super::format::{self, Index};
use super::objects::{Objects, index_name, number_in, part_name};
use crate::log::View;
use crate::{Error, Result};

/// A snapshot part is cut at this many bytes of rows.
pub(crate) const PART_BYTES: usize = 16 << 20;

/// Writes snapshot `seq` (written by `epoch`) from `view`; stops early,
/// unfinished, when `stop` is set.
pub(crate) fn write(
    objects: &Objects,
    view: View,
    seq: u64,
    epoch: u64,
    stop: &AtomicBool,
) -> Result<Index> {
    let mut ix = Index {
        epoch,
        seq,
        max_row: 0,
        rows: 0,
        bytes: 0,
        parts: Vec::new(),
        meta: view.meta,
    };
    let mut rows: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    let mut size = 0;
    let flush = |rows: &mut Vec<(u64, u64, Vec<u8>)>, ix: &mut Index| -> Result<()> {
        if stop.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let n = ix.parts.len() as u32;
        let bytes = format::part(seq, n, rows);
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
        let len = bytes.len() as u64;
        put_retrying(objects, &part_name(seq, n), &bytes)?;
        ix.parts.push((len, sum));
        ix.bytes += len;
        rows.clear();
        Ok(())
    };
    for (bucket, table) in view.tables {
        for row in table {
            let (n, bytes) = row.map_err(Error::from)?;
            ix.max_row = ix.max_row.max(n);
            ix.rows += 1;
            size += bytes.len() + 12;
            rows.push((bucket, n, bytes));
            if size >= PART_BYTES {
                flush(&mut rows, &mut ix)?;
                size = 0;
            }
        }
    }
    if !rows.is_empty() || ix.parts.is_empty() {
        flush(&mut rows, &mut ix)?;
    }
    let bytes = format::index(&ix);
    ix.bytes += bytes.len() as u64;
    put_retrying(objects, &index_name(seq), &bytes)?;
    Ok(ix)
}

/// A write retried a few times (a part is written again whole).
fn put_retrying(objects: &Objects, name: &str, bytes: &[u8]) -> Result<()> {
    let mut wait = std::time::Duration::from_millis(20);
    let mut tries = 0;
    loop {
        match objects.put(name, bytes.to_vec()) {
            Ok(()) => return Ok(()),
            Err(e) if tries >= 5 => return Err(e),
            Err(_) => {
                tries += 1;
                std::thread::sleep(wait);
                wait *= 2;
            }
        }
    }
}

/// Deletes the segments and snapshots before snapshot `seq` (which is
/// whole and in the chain).
pub(crate) fn prune(objects: &Objects, seq: u64) -> Result<()> {
    for name in objects.list("seg")? {
        if number_in(&name, "seg").is_some_and(|s| s < seq) {
            objects.delete(&name)?;
        }
    }
    // The index first, so a snapshot half deleted is an unfinished one.
    let mut names = objects.list("snap")?;
    names.sort_by_key(|n| !n.ends_with("/index"));
    for name in names {
        if number_in(&name, "snap").is_some_and(|s| s < seq) {
            objects.delete(&name)?;
        }
    }
    Ok(())
}
