//! Intents on PostgreSQL (an outbox before external calls): `begin` with
//! an intent writes it in the claim's own statement (the `INSERT` of
//! attempt 1 or the takeover's `UPDATE`), so no claim is durable without
//! it; [`Intents::mark_answered`] records the provider's answer with one
//! conditional `UPDATE` keyed by the claim's fencing token, moving the
//! row's summary of the operation's calls on as the engine's
//! `Calls::answered` does (the statement is `sql::Q::Answer`); the
//! listings read the same columns.
//!
//! The summary, per row: the latest call's answer, whether an earlier
//! call's fate is open, the MD5 of the first reference the provider gave
//! (a second, different reference is a doubt), and the doubt.

use dedupkv::contract::{Handle, Intents, Pending};
use dedupkv::{Answer, Duplicate, Error, IntentEntry, Key, Listing, Page, Result};

use crate::listings::Kind;
use crate::{IN_PROGRESS, MAX_OUTCOME, PgClaim, PgStore, Q, Row, at, check_len, storage};

/// A row's intent, as stored (the intent columns, `sql::INTENT_COLUMNS`).
pub(crate) struct Stored {
    target: String,
    /// `Answered`'s numbers: 0 none, 1 accepted, 2 refused, 3 unknown, 4
    /// asked and not found. The data is the request while the answer is
    /// 0, 3 or 4, else the reference or reason (the engine's rule).
    answer: i16,
    open: bool,
    /// `Doubt`'s numbers: 0 none, 1 after unknown, 2 two references.
    doubt: i16,
    data: Vec<u8>,
    at: i64,
    attempt: i32,
}

impl Stored {
    /// The intent in the row's columns from `first` on; `None` when the
    /// row recorded none.
    pub(crate) fn from(r: &postgres::Row, first: usize) -> Result<Option<Stored>> {
        let get = |e: postgres::Error| {
            Error::Corrupt(format!("a dedupkv_keys intent: {}", crate::describe(&e)))
        };
        let Some(target) = r.try_get::<_, Option<String>>(first).map_err(get)? else {
            return Ok(None);
        };
        Ok(Some(Stored {
            target,
            // (first + 1: whether it is settled, for the listings' SQL.)
            answer: r.try_get(first + 2).map_err(get)?,
            open: r.try_get(first + 3).map_err(get)?,
            doubt: r.try_get(first + 4).map_err(get)?,
            data: r.try_get(first + 5).map_err(get)?,
            at: r.try_get(first + 6).map_err(get)?,
            attempt: r.try_get(first + 7).map_err(get)?,
        }))
    }

    /// The answer to the latest call, as [`IntentEntry::answer`] tells it.
    fn answer(&self) -> Result<Option<Answer<'_>>> {
        Ok(match self.answer {
            0 => None,
            1 => Some(Answer::Accepted(&self.data)),
            2 => Some(Answer::Refused(
                std::str::from_utf8(&self.data).unwrap_or_default(),
            )),
            3 => Some(Answer::Unknown),
            4 => Some(Answer::NotFound),
            other => return Err(Error::Corrupt(format!("unknown intent answer {other}"))),
        })
    }

    fn duplicate(&self) -> Result<Option<Duplicate>> {
        Ok(match self.doubt {
            0 => None,
            1 => Some(Duplicate::AfterUnknown),
            2 => Some(Duplicate::TwoReferences),
            other => return Err(Error::Corrupt(format!("unknown intent doubt {other}"))),
        })
    }
}

impl Row {
    /// The row's intent as the listings show it, if it recorded one.
    pub(crate) fn intent_entry(&self, key: Key<'static>) -> Result<Option<IntentEntry>> {
        let Some(i) = &self.intent else {
            return Ok(None);
        };
        let mut e = IntentEntry::new(
            key,
            i.target.clone(),
            &i.data,
            i.answer()?,
            self.provider_key,
            at(i.at),
            u32::try_from(i.attempt).unwrap_or(0),
        );
        if i.open {
            e = e.with_open_call();
        }
        if let Some(d) = i.duplicate()? {
            e = e.with_duplicate(d);
        }
        Ok(Some(e))
    }
}

impl Intents for PgStore {
    /// One conditional `UPDATE … WHERE key AND token = the claim's AND
    /// state = in progress AND an intent was recorded`; when no row is
    /// updated, a read tells a claim that recorded no intent
    /// ([`Error::InvalidArgument`]) from a lost one ([`Error::ClaimLost`]).
    fn mark_answered(&self, claim: &PgClaim, answer: Answer<'_>) -> Result<Pending<()>> {
        claim.check_origin(&self.shared)?;
        let (kind, data): (i16, &[u8]) = match answer {
            Answer::Accepted(r) => (1, r),
            Answer::Refused(reason) => (2, reason.as_bytes()),
            Answer::Unknown => (3, b""),
            Answer::NotFound => (4, b""),
            Answer::Found(r) => (5, r),
            other => {
                return Err(Error::InvalidArgument {
                    what: "answer",
                    reason: format!(
                        "{other:?} is not known to this build of the PostgreSQL backend"
                    ),
                });
            }
        };
        check_len("intent", data.len(), MAX_OUTCOME)?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let (st, peek) = (c.stmt(&sh.sql, Q::Answer)?, c.stmt(&sh.sql, Q::Peek)?);
        let (scope, id) = (claim.key.scope(), claim.key.id());
        let attempt = i32::try_from(claim.attempt).unwrap_or(i32::MAX);
        let n = c
            .client
            .execute(&st, &[&scope, &id, &claim.token, &kind, &data, &attempt])
            .map_err(storage)?;
        if n == 1 {
            return Ok(Pending::settled(()));
        }
        // Nothing updated: only the error's wording is read here.
        let row = c
            .client
            .query_opt(&peek, &[&sh.now(), &scope, &id])
            .map_err(storage)?;
        let active_without_intent = match &row {
            Some(r) => {
                let token: i64 = r.get(3);
                let state: i16 = r.get(0);
                token == claim.token && state == IN_PROGRESS && Row::from(r)?.intent.is_none()
            }
            None => false,
        };
        if active_without_intent {
            return Err(Error::InvalidArgument {
                what: "claim",
                reason: format!(
                    "{:?} attempt {} recorded no intent (begin it with an intent)",
                    claim.key(),
                    claim.attempt()
                ),
            });
        }
        Err(claim.lost())
    }
}

impl PgStore {
    /// The operation's intent, if it recorded one (as
    /// [`Store::intent`](dedupkv::Store::intent)).
    ///
    /// # Errors
    /// A bad key; [`Error::Corrupt`] for a row this build cannot read;
    /// storage errors.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv::contract::{Settle, Write};
    /// use dedupkv::{Began, BeginOptions, Fingerprint, Intent, Key};
    ///
    /// let store = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
    /// let key = Key::new("shop-42", "ship-7");
    /// let intent = Intent { target: "carrier", request: b"order 7" };
    /// let p = store.begin(&key, Fingerprint::NONE, &BeginOptions::new(), Some(intent))?;
    /// if let Began::Started(claim) = store.tell(p)? {
    ///     let e = store.intent(&key)?.expect("recorded with the claim");
    ///     assert_eq!(e.provider_key(), claim.provider_key());
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn intent(&self, key: &Key<'_>) -> Result<Option<IntentEntry>> {
        crate::check_key(key)?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::Peek)?;
        let Some(r) = c
            .client
            .query_opt(&st, &[&sh.now(), &key.scope(), &key.id()])
            .map_err(storage)?
        else {
            return Ok(None);
        };
        let row = Row::from(&r)?;
        if row.expired(r.get(11)) {
            return Ok(None);
        }
        row.intent_entry(key.clone().into_owned())
    }

    /// Unanswered intents of open operations, oldest first (by when they
    /// were recorded), one page of `listing`: the calls that may or may
    /// not have happened (as
    /// [`Store::pending_intents`](dedupkv::Store::pending_intents)).
    /// Reconcile each by asking the provider with its
    /// [`provider_key`](IntentEntry::provider_key), the one every instance
    /// derives.
    ///
    /// # Errors
    /// As [`intent`](Self::intent), and [`Error::InvalidArgument`]
    /// (`what: "cursor"`) for a cursor of another listing or schema.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv::Listing;
    ///
    /// let store = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
    /// for e in store.pending_intents(&Listing::new())?.items {
    ///     println!("ask {} about {}", e.target(), e.provider_key());
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn pending_intents(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        self.list_intents((Q::PendingIntents, Kind::PendingIntents), listing)
    }

    /// The candidates for a duplicate external effect, oldest first, one
    /// page of `listing`: operations where more than one call may have
    /// reached the provider and it did not confirm one effect (as
    /// [`Store::duplicate_candidates`](dedupkv::Store::duplicate_candidates);
    /// see [`Duplicate`]).
    ///
    /// # Errors
    /// As [`pending_intents`](Self::pending_intents).
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv::Listing;
    ///
    /// let store = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
    /// for e in store.duplicate_candidates(&Listing::new().scope("payments"))?.items {
    ///     println!("check {:?}: {:?}", e.key(), e.duplicate());
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn duplicate_candidates(&self, listing: &Listing) -> Result<Page<IntentEntry>> {
        self.list_intents((Q::Doubted, Kind::DuplicateCandidates), listing)
    }

    fn list_intents(&self, q: (Q, Kind), listing: &Listing) -> Result<Page<IntentEntry>> {
        self.list(q, listing, |r, key| Row::from(r)?.intent_entry(key))
    }
}
