//! Listings for the people who work a store: the dead-letter area, the
//! sequencer's holding area, and stranded claims — each oldest first,
//! filtered by scope and age, paged by a [`Cursor`].
//!
//! A listing is a snapshot taken shard by shard (no store-wide lock): an
//! entry written meanwhile may be left out or shown as it was. Entries are
//! ordered by (time, key hash, sequence number), so a cursor pages without
//! repeating or skipping an entry that stays put.

use super::Engine;
use crate::Result;
use crate::civil::rfc3339;
use crate::clock::to_system_time;
use crate::index::entity::EventState;
use crate::index::{Pending, Shard, SlotState};
use crate::key::KeyHash;
use crate::log::record::Kind;
use crate::types::{Cursor, Held, Listing, Page, Record};

impl Engine {
    /// Every item `collect` finds, shard by shard, as (time, key hash,
    /// sequence number, item), kept if within `listing`'s age and past its
    /// cursor.
    pub(crate) fn items_listed<T>(
        &self,
        listing: &Listing,
        mut collect: impl FnMut(&mut Shard, &mut Vec<(u64, KeyHash, u64, T)>),
    ) -> Vec<(Cursor, T)> {
        let now = self.now();
        let mut found = Vec::new();
        let mut here = Vec::new();
        for i in 0..self.cfg.shards {
            collect(&mut self.index.lock_shard(i), &mut here);
            for (at, h, seq, item) in here.drain(..) {
                let c = cursor(at, h, seq);
                if listed(listing, now, c) {
                    found.push((c, item));
                }
            }
        }
        found
    }

    /// (cursor, (hash, bucket, row)) of every event key whose pending entry
    /// `pick` gives a time for, within `listing`'s age and past its cursor.
    pub(crate) fn keys_listed(
        &self,
        listing: &Listing,
        pick: impl Fn(&Pending, Option<SlotState>) -> Option<u64>,
    ) -> Vec<(Cursor, (KeyHash, u64, u64))> {
        let nb = self.bucket_of(self.now());
        self.items_listed(listing, |shard, out| {
            // Read under the shard's lock: no slot of the shard points
            // past it (one read before the lock could be older than a slot
            // written meanwhile, and widening against it would be wrong).
            let open_row = self.log.open_row();
            for (p, state) in shard.pending_entries() {
                if let Some(at) = pick(p, state)
                    && let Some(s) = shard.get(p.hash)
                {
                    out.push((at, p.hash, 0, (p.hash, s.bucket(nb), s.row(open_row))));
                }
            }
        })
    }

    /// A page of claims whose lease lapsed (or whose process is gone) with
    /// nobody back to finish them, by when the lease lapsed: what retention
    /// would otherwise evict without a word.
    pub(crate) fn stranded_claims(&self, listing: &Listing) -> Result<Page<Record>> {
        self.check_readable()?;
        let now = self.now();
        let found = self.keys_listed(listing, |p, state| {
            let lapsed = p.lease_until <= now || self.orphaned(p.token);
            (state == Some(SlotState::Claimed) && lapsed).then_some(p.lease_until)
        });
        page(
            listing,
            found,
            |(h, bucket, row)| {
                // A record written meanwhile into the same row (a takeover's
                // claim is stranded no more, a finish) is the key's latest.
                let found = self.load_hashed((h, false), bucket, row, |r| {
                    Ok((r.kind == Kind::Claim).then(|| self.record_of(r)))
                })?;
                Ok(found
                    .flatten()
                    .filter(|r| r.lease_until.is_some_and(|l| l <= now) || self.orphaned(r.token)))
            },
            |r| r.key().scope(),
        )
    }

    /// A page of the sequencer's holding area across every entity: events
    /// whose predecessor never came, by when it went missing.
    pub(crate) fn holding_area(&self, listing: &Listing) -> Result<Page<Held>> {
        self.check_readable()?;
        let found = self.items_listed(listing, |shard, out| {
            for e in shard.entities_with_events() {
                for (seq, ev) in &e.held {
                    if let EventState::Held { missing, since } = ev.state {
                        let held = Held {
                            entity: e.key.clone(),
                            seq: *seq,
                            payload: ev.payload.clone(),
                            missing,
                            since: to_system_time(since),
                            reason: held_reason(missing, since),
                        };
                        out.push((since, e.hash, *seq, held));
                    }
                }
            }
        });
        page(listing, found, |h| Ok(Some(h)), |h| h.entity.scope())
    }
}

/// "predecessor N missing since T".
pub(crate) fn held_reason(missing: u64, since: u64) -> String {
    format!("predecessor {missing} missing since {}", rfc3339(since))
}

fn cursor(at: u64, h: KeyHash, seq: u64) -> Cursor {
    Cursor {
        at,
        id: (u128::from(h.hi) << 64) | u128::from(h.lo),
        seq,
    }
}

/// Whether an entry at `cursor` is within `listing`'s age and after its
/// cursor.
fn listed(listing: &Listing, now: u64, cursor: Cursor) -> bool {
    let old_enough = listing
        .older_than
        .is_none_or(|age| cursor.at <= now.saturating_sub(crate::clock::millis(age)));
    old_enough && listing.after.is_none_or(|a| cursor > a)
}

/// The page of `listing` from candidates in any order: sorted, each made
/// into an entry by `take` (`None`: gone meanwhile, skipped), filtered by
/// scope, at most `limit`, with the cursor of the last one if more follow.
pub(crate) fn page<C, T>(
    listing: &Listing,
    mut found: Vec<(Cursor, C)>,
    mut take: impl FnMut(C) -> Result<Option<T>>,
    scope: impl Fn(&T) -> &[u8],
) -> Result<Page<T>> {
    found.sort_unstable_by_key(|e| e.0);
    // One more than a page, to know whether there is a next one.
    let mut items: Vec<(Cursor, T)> = Vec::new();
    for (cursor, c) in found {
        let Some(item) = take(c)? else { continue };
        if listing.scope.as_deref().is_some_and(|s| scope(&item) != s) {
            continue;
        }
        items.push((cursor, item));
        if items.len() > listing.limit {
            break;
        }
    }
    let next = if items.len() > listing.limit {
        items.truncate(listing.limit);
        items.last().map(|(c, _)| *c)
    } else {
        None
    };
    Ok(Page {
        items: items.into_iter().map(|(_, t)| t).collect(),
        next,
    })
}
