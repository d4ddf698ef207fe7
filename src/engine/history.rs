//! A key's history (`Store::history`): every record of the key still in
//! the log, oldest first — what an operator reads when "order 4711 was
//! charged twice".
//!
//! Invariants:
//! - a read: it takes a shard lock only to read the key's slot, and
//!   writes nothing (it works on the read-only open);
//! - a key's records go to buckets that never move earlier (see
//!   [`buckets`](super::buckets)), so every record of a key whose slot is
//!   recorded lies in a bucket no later than the slot's; a key with no
//!   recorded slot (expired, or never written) may still have records in
//!   any bucket eviction has not deleted yet, so all are scanned;
//! - rows are numbered in commit order across buckets, and records within
//!   a row in append order: (row, position) is the order they were made.

use super::Engine;
use super::write::Write;
use crate::error::show_key;
use crate::types::Record;
use crate::{Error, Key, Result};

impl Engine {
    /// Every state record of `key` in the buckets it can be in, oldest
    /// first (its intent records are not state: `Store::intent` has the
    /// latest). A snapshot of the last commit before each bucket's scan.
    pub(crate) fn history(&self, key: &Key<'_>) -> Result<Vec<Record>> {
        self.check_readable()?;
        self.check_key(key)?;
        let h = self.hash(key);
        let (_, nb) = self.time()?;
        let last = {
            let mut shard = self.index.lock(h);
            Write::new(&mut shard, h, nb)
                .recorded()
                .map(|s| s.bucket(nb))
        };
        let mut found = Vec::new();
        for b in self.log.buckets() {
            if last.is_some_and(|last| b > last) {
                break;
            }
            self.log
                .scan_bucket(b, |row, _, records| {
                    for (i, rec) in records.enumerate() {
                        let rec = rec?;
                        if rec.kind.is_key_state() && rec.scope == key.scope() && rec.id == key.id()
                        {
                            found.push(((row, i), self.record_of(&rec)));
                        }
                    }
                    Ok(())
                })
                .map_err(|e| self.naming(e, b, key))?;
        }
        // Buckets are scanned oldest first, but eviction carries a dead
        // letter into a later bucket: order by when each was made.
        found.sort_by_key(|(at, _)| *at);
        Ok(found.into_iter().map(|(_, r)| r).collect())
    }

    /// `e`, naming the bucket, the key and the file when it is damage.
    fn naming(&self, e: Error, bucket: u64, key: &Key<'_>) -> Error {
        match e {
            Error::Corrupt(m) => Error::Corrupt(format!(
                "{m} (bucket {bucket}, read for the history of key {}{})",
                show_key(key.scope(), key.id()),
                self.path
                    .as_deref()
                    .map(|p| format!(", in {}", p.display()))
                    .unwrap_or_default()
            )),
            other => other,
        }
    }
}
