//! Listings paged as the engine's: a [`Listing`] (scope, minimum age,
//! page size, cursor) in, a [`Page`] out, oldest first.
//!
//! Invariants: entries are ordered by (time, MD5 of the key), so a cursor
//! pages without repeating or skipping an entry that stays put; a cursor
//! is accepted only by the listing that made it — the same schema (its
//! name's hash) and the same kind of listing — any other is
//! `InvalidArgument` (`what: "cursor"`). Ages are by the database's time.

use dedupkv::{Cursor, DeadLetter, Error, IntentEntry, Key, Listing, Page, Result};

use crate::{PgStore, Q, storage};

/// Which listing a cursor pages (the engine's numbers for the same
/// listings).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    DeadLetters = 1,
    PendingIntents = 4,
    DuplicateCandidates = 5,
}

impl Kind {
    fn name(n: u8) -> &'static str {
        match n {
            1 => "dead_letters",
            4 => "pending_intents",
            5 => "duplicate_candidates",
            _ => "another listing",
        }
    }
}

/// The schema's part of its cursors: FNV-1a over the schema's name (so a
/// cursor of another schema is refused; one of a schema of the same name
/// on another database is not told apart).
fn store_tag(schema: &str) -> u64 {
    "dedupkv-postgres/"
        .bytes()
        .chain(schema.bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

impl PgStore {
    /// One page of the listing `q` (of `kind`), each row made an item by
    /// `item` (given the row and its key; `None` leaves it out).
    pub(crate) fn list<T>(
        &self,
        (q, kind): (Q, Kind),
        listing: &Listing,
        item: impl Fn(&postgres::Row, Key<'static>) -> Result<Option<T>>,
    ) -> Result<Page<T>> {
        let sh = &*self.shared;
        let tag = store_tag(&sh.schema);
        let (scope, older_than, after, limit) = listing.requested();
        let position = match after.map(|c| c.backend_parts()) {
            None => None,
            Some((store, listing, at, id)) if store == tag && listing == kind as u8 => Some((
                i64::try_from(at).unwrap_or(i64::MAX),
                id.to_be_bytes().to_vec(),
            )),
            Some((store, listing, ..)) => {
                return Err(Error::InvalidArgument {
                    what: "cursor",
                    reason: if store == tag {
                        format!(
                            "it comes from {}, not {}",
                            Kind::name(listing),
                            Kind::name(kind as u8)
                        )
                    } else {
                        "it comes from a listing of another store".into()
                    },
                });
            }
        };
        let age = older_than.map(crate::ms);
        let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let (at, kh) = position.unzip();
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, q)?;
        let rows = c
            .client
            .query(&st, &[&sh.now(), &scope, &fetch, &age, &at, &kh])
            .map_err(storage)?;
        let get = |e: postgres::Error| {
            Error::Corrupt(format!("a dedupkv_keys row: {}", crate::describe(&e)))
        };
        let mut items = Vec::with_capacity(rows.len().min(limit));
        let mut next = None;
        for (i, r) in rows.iter().enumerate() {
            if i == limit {
                break;
            }
            let key = Key::owned(
                r.try_get::<_, Vec<u8>>("scope").map_err(get)?,
                r.try_get::<_, Vec<u8>>("id").map_err(get)?,
            );
            if let Some(x) = item(r, key)? {
                items.push(x);
            }
            if i + 1 == limit && rows.len() > limit {
                let at: i64 = r.try_get("list_at").map_err(get)?;
                let kh: Vec<u8> = r.try_get("list_kh").map_err(get)?;
                let id = <[u8; 16]>::try_from(kh.as_slice())
                    .map_err(|_| Error::Corrupt("a listing's key order is not 16 bytes".into()))?;
                next = Some(Cursor::of_backend(
                    tag,
                    kind as u8,
                    u64::try_from(at).unwrap_or(0),
                    u128::from_be_bytes(id),
                ));
            }
        }
        Ok(Page::new(items, next))
    }
}

/// The contract's listings are this backend's own, so a `Store` opened on
/// it (`StoreBuilder::open_shared`) lists them too.
impl dedupkv::contract::Listings for PgStore {
    fn dead_letters(&self, listing: &Listing) -> Result<Page<DeadLetter>> {
        PgStore::dead_letters(self, listing)
    }

    fn intent(&self, key: &Key<'_>) -> Result<Option<IntentEntry>> {
        PgStore::intent(self, key)
    }

    fn pending_intents(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        PgStore::pending_intents(self, listing)
    }

    fn duplicate_candidates(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        PgStore::duplicate_candidates(self, listing)
    }
}
