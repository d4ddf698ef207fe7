//! Listings for the people who work a store: the dead-letter area, the
//! sequencer's holding area, and stranded claims — each oldest first,
//! filtered by scope and age, paged by a [`Cursor`].
//!
//! A listing is a snapshot taken shard by shard (no store-wide lock): an
//! entry written meanwhile may be left out or shown as it was. Entries are
//! ordered by (time, key hash, sequence number), so a cursor pages without
//! repeating or skipping an entry that stays put.
//!
//! Invariant: a cursor is accepted only by the listing that made it — the
//! same store (a hash of the file's key secret) and the same kind of
//! listing ([`ListingKind`]); any other is `InvalidArgument`, never a page
//! of something else from an arbitrary position.

use super::Engine;
use crate::civil::rfc3339;
use crate::clock::to_system_time;
use crate::index::entity::EventState;
use crate::index::{Pending, Shard, SlotState};
use crate::key::KeyHash;
use crate::records::Kind;
use crate::types::{Cursor, Held, Listing, Page, Record};
use crate::{Error, Result};

/// Where a listed key's latest record is: its hash, bucket and row.
pub(crate) type KeyAt = (KeyHash, u64, u64);

/// Which listing a [`Cursor`] pages (its number is in the cursor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListingKind {
    DeadLetters = 1,
    StrandedClaims = 2,
    HoldingArea = 3,
    PendingIntents = 4,
    DuplicateCandidates = 5,
    Records = 6,
}

impl ListingKind {
    fn name(self) -> &'static str {
        match self {
            ListingKind::DeadLetters => "dead_letters",
            ListingKind::StrandedClaims => "stranded_claims",
            ListingKind::HoldingArea => "holding_area",
            ListingKind::PendingIntents => "pending_intents",
            ListingKind::DuplicateCandidates => "duplicate_candidates",
            ListingKind::Records => "records",
        }
    }

    fn of(n: u8) -> Option<ListingKind> {
        [
            ListingKind::DeadLetters,
            ListingKind::StrandedClaims,
            ListingKind::HoldingArea,
            ListingKind::PendingIntents,
            ListingKind::DuplicateCandidates,
            ListingKind::Records,
        ]
        .into_iter()
        .find(|k| *k as u8 == n)
    }
}

impl Engine {
    /// Every item `collect` finds, shard by shard, as (time, key hash,
    /// sequence number, item), kept if within `listing`'s age and past its
    /// cursor; `InvalidArgument` for a cursor of another store's listing
    /// or of another kind of listing.
    pub(crate) fn items_listed<T>(
        &self,
        listing: (&Listing, ListingKind),
        collect: impl FnMut(&mut Shard, &mut Vec<(u64, KeyHash, u64, T)>),
    ) -> Result<Vec<(Cursor, T)>> {
        self.items_listed_in(listing, 0..self.cfg.shards, collect)
    }

    /// [`items_listed`](Self::items_listed) of the shards `shards` only.
    pub(crate) fn items_listed_in<T>(
        &self,
        (listing, kind): (&Listing, ListingKind),
        shards: std::ops::Range<usize>,
        mut collect: impl FnMut(&mut Shard, &mut Vec<(u64, KeyHash, u64, T)>),
    ) -> Result<Vec<(Cursor, T)>> {
        self.check_cursor(listing, kind)?;
        let now = self.now();
        let store = self.listing_store_id();
        let mut found = Vec::new();
        let mut here = Vec::new();
        for i in shards {
            collect(&mut self.index.lock_shard(i), &mut here);
            for (at, h, seq, item) in here.drain(..) {
                let c = cursor((store, kind), at, h, seq);
                if listed(listing, now, c) {
                    found.push((c, item));
                }
            }
        }
        Ok(found)
    }

    /// The store's part of its cursors: a hash of the file's key secret,
    /// the same for every open of the file, and another for another file.
    fn listing_store_id(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(&self.hasher.secret(), CURSOR_SEED)
    }

    /// Fails for a cursor that `kind`'s listing of this store did not make.
    fn check_cursor(&self, listing: &Listing, kind: ListingKind) -> Result<()> {
        let Some(c) = listing.after else {
            return Ok(());
        };
        let reason = if c.store != self.listing_store_id() {
            "it comes from a listing of another store".to_owned()
        } else if c.listing != kind as u8 {
            format!(
                "it comes from {}, not {}",
                ListingKind::of(c.listing).map_or("another listing", ListingKind::name),
                kind.name()
            )
        } else {
            return Ok(());
        };
        Err(Error::InvalidArgument {
            what: "cursor",
            reason,
        })
    }

    /// (cursor, (hash, bucket, row)) of every event key whose pending entry
    /// `pick` gives a time for, within `listing`'s age and past its cursor.
    pub(crate) fn keys_listed(
        &self,
        listing: (&Listing, ListingKind),
        pick: impl Fn(&Pending, Option<SlotState>) -> Option<u64>,
    ) -> Result<Vec<(Cursor, KeyAt)>> {
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
    /// nobody back to finish them, by when they became stranded (see
    /// [`stranded_since`](Self::stranded_since)): what retention would
    /// otherwise evict without a word.
    pub(crate) fn stranded_claims(&self, listing: &Listing) -> Result<Page<Record>> {
        self.check_readable()?;
        let now = self.now();
        let found = self.keys_listed((listing, ListingKind::StrandedClaims), |p, state| {
            (state == Some(SlotState::Claimed))
                .then(|| self.stranded_since(p.token, p.lease_until))
                .filter(|since| *since <= now)
        })?;
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

    /// When a claim with `token` and lease end `lease_until` became
    /// stranded, as the operator sees it: when its lease lapses; for a
    /// claim of an earlier process (gone, so nobody finishes it), when
    /// this run opened the store if that came first — a store reopened
    /// after a crash shows the dead process's claims as stranded from the
    /// reopen, however long their leases were.
    pub(crate) fn stranded_since(&self, token: u64, lease_until: u64) -> u64 {
        if self.orphaned(token) {
            lease_until.min(self.time.opened_at())
        } else {
            lease_until
        }
    }

    /// A page of the sequencer's holding area across every entity: events
    /// whose predecessor never came, by when it went missing.
    pub(crate) fn holding_area(&self, listing: &Listing) -> Result<Page<Held>> {
        self.check_readable()?;
        let found = self.items_listed((listing, ListingKind::HoldingArea), |shard, out| {
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
        })?;
        page(listing, found, |h| Ok(Some(h)), |h| h.entity.scope())
    }
}

/// "predecessor N missing since T".
pub(crate) fn held_reason(missing: u64, since: u64) -> String {
    format!("predecessor {missing} missing since {}", rfc3339(since))
}

/// Seeds the hash of the key secret that cursors carry (not the key
/// hashes' own use of the secret).
const CURSOR_SEED: u64 = 0x6375_7273_6f72_0001; // "cursor", 1

fn cursor((store, kind): (u64, ListingKind), at: u64, h: KeyHash, seq: u64) -> Cursor {
    Cursor {
        store,
        listing: kind as u8,
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
    old_enough
        && listing
            .after
            .is_none_or(|a| cursor.position() > a.position())
}

/// The page of `listing` from candidates in any order: sorted, each made
/// into an entry by `take` (`None`: gone meanwhile, skipped), filtered by
/// scope, at most `limit`, with the cursor of the last one if more follow.
pub(crate) fn page<C, T>(
    listing: &Listing,
    found: Vec<(Cursor, C)>,
    take: impl FnMut(C) -> Result<Option<T>>,
    scope: impl Fn(&T) -> &[u8],
) -> Result<Page<T>> {
    let mut items = Vec::new();
    fill(listing, found, take, scope, &mut items)?;
    Ok(finish(listing, items))
}

/// Adds to `items` the entries of `found` (candidates in any order, all
/// after those `items` holds): sorted, each made into an entry by `take`
/// (`None`: gone meanwhile, skipped), filtered by scope, until `items`
/// holds one more than a page (to know whether a next one follows).
/// `true` once it does.
pub(crate) fn fill<C, T>(
    listing: &Listing,
    mut found: Vec<(Cursor, C)>,
    mut take: impl FnMut(C) -> Result<Option<T>>,
    scope: impl Fn(&T) -> &[u8],
    items: &mut Vec<(Cursor, T)>,
) -> Result<bool> {
    found.sort_unstable_by_key(|e| e.0);
    for (cursor, c) in found {
        if items.len() > listing.limit {
            break;
        }
        let Some(item) = take(c)? else { continue };
        if listing.scope.as_deref().is_some_and(|s| scope(&item) != s) {
            continue;
        }
        items.push((cursor, item));
    }
    Ok(items.len() > listing.limit)
}

/// The page of `items` (one more than a page if a next one follows): at
/// most `limit`, with the cursor of the last one if more follow.
pub(crate) fn finish<T>(listing: &Listing, mut items: Vec<(Cursor, T)>) -> Page<T> {
    let next = if items.len() > listing.limit {
        items.truncate(listing.limit);
        items.last().map(|(c, _)| *c)
    } else {
        None
    };
    Page {
        items: items.into_iter().map(|(_, t)| t).collect(),
        next,
    }
}
