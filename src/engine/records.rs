//! The listing of every live record (`Store::records`): what an export,
//! an audit or the command line's `keys` reads.
//!
//! Like the other listings (see [`listings`](super::listings)), a
//! snapshot taken shard by shard: a key written meanwhile may be left out
//! or shown as it was. Entries are ordered by key hash (their time part
//! is 0), so a cursor pages without repeating or skipping a key that
//! stays. Shards hold ranges of key hashes in order, so a page walks the
//! shards from its cursor's and stops at the one that fills it: a page of
//! N reads about N keys' worth of shards, not the whole index.

use super::Engine;
use super::buckets::unexpired;
use super::listings::{ListingKind, fill, finish};
use crate::Result;
use crate::index::SlotState;
use crate::key::KeyHash;
use crate::types::{Listing, Page, Record};

impl Engine {
    /// A page of the store's live records (recorded, not expired, not
    /// forgotten; dead letters too), by key hash; `older_than` counts from
    /// a record's last update.
    pub(crate) fn records(&self, listing: &Listing) -> Result<Page<Record>> {
        self.check_readable()?;
        let now = self.now();
        let nb = self.bucket_of(now);
        let cutoff = listing
            .older_than
            .map(|age| now.saturating_sub(crate::clock::millis(age)));
        // Shards hold ranges of key hashes in order: the page starts in the
        // shard of its cursor and stops at the shard that fills it.
        let first = listing.after.map_or(0, |c| {
            self.index.shard_of(KeyHash {
                hi: (c.id >> 64) as u64,
                lo: c.id as u64,
            })
        });
        let mut items = Vec::new();
        for i in first..self.cfg.shards {
            let found =
                self.items_listed_in((listing, ListingKind::Records), i..i + 1, |shard, out| {
                    // Under the shard's lock, as `keys_listed` reads it.
                    let open_row = self.log.open_row();
                    for s in shard.slots() {
                        let live = (unexpired(s, nb) || s.state() == SlotState::DeadLettered)
                            && s.state() != SlotState::Forgotten;
                        if live {
                            let h = KeyHash { hi: s.hi, lo: s.lo };
                            out.push((0, h, 0, (h, s.bucket(nb), s.row(open_row))));
                        }
                    }
                })?;
            let full = fill(
                listing,
                found,
                |(h, bucket, row)| {
                    // `None`: its bucket was evicted meanwhile (expired).
                    let r = self.load_hashed((h, false), bucket, row, |r| Ok(self.record_of(r)))?;
                    Ok(r.filter(|r| cutoff.is_none_or(|c| r.updated <= c)))
                },
                |r| r.key().scope(),
                &mut items,
            )?;
            if full {
                break;
            }
        }
        Ok(finish(listing, items))
    }
}
