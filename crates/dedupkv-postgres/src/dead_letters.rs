//! The dead-letter area on PostgreSQL: `Failure::Exhausted` leaves the
//! key's row `DEAD_LETTERED` (its reason in the outcome column, its
//! payload and failure times beside it); `begin` then answers
//! `DeadLettered` from any instance until an operator requeues or
//! resolves it, each one conditional `UPDATE … WHERE state =
//! dead-lettered` (no row updated: it was not a dead letter).

use dedupkv::contract::{DeadLetters, Pending};
use dedupkv::{DeadLetter, Error, Key, Listing, Page, Resolution, Result};

use crate::{COMPLETED, FAILED, MAX_OUTCOME, PgStore, Q, Row, check_key, check_len, storage};

impl DeadLetters for PgStore {
    /// One `UPDATE`: the row becomes retryable, its next attempt numbered
    /// after the last, a new round of failures begun.
    fn requeue(&self, key: &Key<'_>) -> Result<Pending<bool>> {
        check_key(key)?;
        let now = self.shared.now();
        self.dead_letter_update(Q::Requeue, &[&key.scope(), &key.id(), &now])
    }

    /// One `UPDATE`: `Completed` stores the outcome (every later `begin`
    /// replays it), `Abandoned` a final failure with the note.
    fn resolve(&self, key: &Key<'_>, resolution: Resolution<'_>) -> Result<Pending<bool>> {
        check_key(key)?;
        let (state, bytes): (i16, &[u8]) = match resolution {
            Resolution::Completed(outcome) => (COMPLETED, outcome),
            Resolution::Abandoned(note) => (FAILED, note.as_bytes()),
            other => {
                return Err(Error::InvalidArgument {
                    what: "resolution",
                    reason: format!(
                        "{other:?} is not known to this build of the PostgreSQL backend"
                    ),
                });
            }
        };
        check_len("outcome", bytes.len(), MAX_OUTCOME)?;
        let now = self.shared.now();
        self.dead_letter_update(Q::Resolve, &[&key.scope(), &key.id(), &state, &bytes, &now])
    }
}

impl PgStore {
    /// The dead-letter area, shared by every instance: keys whose retries
    /// were exhausted ([`Failure::Exhausted`](dedupkv::Failure::Exhausted)),
    /// in the order they reached it (oldest first), one page of `listing`
    /// (its scope, minimum age by the database's time, page size, and
    /// cursor), as the engine's [`Store::dead_letters`](dedupkv::Store::dead_letters).
    /// A dead letter stays until it is requeued or resolved (retention
    /// never drops it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (`what: "cursor"`) for a cursor of
    /// another listing or schema; [`Error::Corrupt`] for a row this build
    /// cannot read; storage errors.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv::Listing;
    ///
    /// let store = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
    /// let mut listing = Listing::new().scope("payments").limit(100);
    /// loop {
    ///     let page = store.dead_letters(&listing)?;
    ///     for d in &page.items {
    ///         println!("{:?} failed: {}", d.key(), d.reason());
    ///     }
    ///     match page.next {
    ///         Some(cursor) => listing = listing.after(cursor),
    ///         None => break,
    ///     }
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn dead_letters(&self, listing: &Listing) -> Result<Page<DeadLetter>> {
        self.list(
            (Q::DeadLetters, crate::listings::Kind::DeadLetters),
            listing,
            |r, key| Row::from(r)?.dead_letter(key).map(Some),
        )
    }

    /// Runs `q` (an `UPDATE` of a dead-lettered row): whether a row was
    /// updated.
    fn dead_letter_update(
        &self,
        q: Q,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Pending<bool>> {
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, q)?;
        let n = c.client.execute(&st, params).map_err(storage)?;
        Ok(Pending::settled(n == 1))
    }
}
