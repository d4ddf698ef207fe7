//! Reading a key's record: the index says where, the log row says what.

use super::Engine;
use super::write::Write;
use crate::error::show_key;
use crate::key::KeyHash;
use crate::records::{ClaimFields, Kind, RecordRef, read_row};
use crate::types::{Basis, DeadLetter, Pending, Record, State};
use crate::{Error, Fingerprint, Key, Result};

impl Engine {
    /// What every read starts with: after a failed commit the index may
    /// hold state that never became durable, so no read answers from it
    /// (`Poisoned`, like every write); a reopened store reads what is
    /// durable. A read-only store reads.
    #[inline]
    pub(crate) fn check_readable(&self) -> Result<()> {
        self.log.check_readable()
    }

    /// The latest record of `key`, or `None` if it is not recorded (or has
    /// expired), resting on the row it was read from.
    pub(crate) fn get(&self, key: &Key<'_>) -> Result<Pending<Option<Record>>> {
        self.check_readable()?;
        self.check_key(key)?;
        let h = self.hash(key);
        loop {
            let (_, nb) = self.time()?;
            let mut shard = self.index.lock(h);
            let Some(s) = Write::new(&mut shard, h, nb).recorded() else {
                return Ok(Pending::settled(None));
            };
            let (bucket, row) = (s.bucket(nb), s.row(self.log.open_row()));
            drop(shard);
            if let Some(rec) = self.load(key, bucket, row)? {
                return Ok(Pending::new(Some(rec), Basis::read(row)));
            }
            // Its bucket was deleted under us: expired, unless eviction
            // carried the record elsewhere (a dead letter); look again.
            let moved = self
                .index
                .lock(h)
                .get(h)
                .is_some_and(|s| !s.is_at(bucket, row));
            if !moved {
                return Ok(Pending::settled(None));
            }
        }
    }

    /// Reads the key's latest record from the row its slot points at;
    /// `None` if the bucket was evicted between the lookup and the read.
    /// The row may still be on its way to the storage (see
    /// `Log::read_row_unsettled`): an answer built from it rests on it.
    pub(crate) fn load(&self, key: &Key<'_>, bucket: u64, row: u64) -> Result<Option<Record>> {
        self.load_with(key, bucket, row, |rec| Ok(self.record_of(rec)))
    }

    /// [`load`](Self::load), closing the row if it is still open: no
    /// record joins it after this read, so a slot still pointing at the
    /// row later means the record read is still the key's latest.
    pub(crate) fn load_closed(
        &self,
        key: &Key<'_>,
        bucket: u64,
        row: u64,
    ) -> Result<Option<Record>> {
        self.load_in((key, false, true), (bucket, row), |rec| {
            Ok(self.record_of(rec))
        })
    }

    /// [`load`](Self::load), made into `T` by `f`.
    pub(crate) fn load_with<T>(
        &self,
        key: &Key<'_>,
        bucket: u64,
        row: u64,
        f: impl FnOnce(&RecordRef<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        self.load_of((key, false), bucket, row, f)
    }

    /// [`load_with`](Self::load_with) of the key's state record, or of
    /// its Intent record if `intent`.
    pub(crate) fn load_of<T>(
        &self,
        (key, intent): (&Key<'_>, bool),
        bucket: u64,
        row: u64,
        f: impl FnOnce(&RecordRef<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        self.load_in((key, intent, false), (bucket, row), f)
    }

    /// [`load_of`](Self::load_of), the row closed first if `close`.
    fn load_in<T>(
        &self,
        (key, intent, close): (&Key<'_>, bool, bool),
        (bucket, row): (u64, u64),
        f: impl FnOnce(&RecordRef<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        let found = self.find_in_row(
            (bucket, row, close),
            |rec| wanted(rec, intent) && rec.scope == key.scope() && rec.id == key.id(),
            &|| show_key(key.scope(), key.id()),
            f,
        )?;
        found.or_else(|| lost_details(key))
    }

    /// The latest record of the key hashed `h` in the row its slot points
    /// at (its intent record, if `intent`), made into `T` by `f`
    /// (listings, which know keys by hash only).
    pub(crate) fn load_hashed<T>(
        &self,
        (h, intent): (KeyHash, bool),
        bucket: u64,
        row: u64,
        f: impl FnOnce(&RecordRef<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        // A listing answers at once: only from durable rows.
        self.log.wait_durable(row)?;
        let found = self.find_in_row(
            (bucket, row, false),
            |rec| wanted(rec, intent) && self.hasher.hash(rec.scope, rec.id) == h,
            &|| format!("hashed {:016x}{:016x}", h.hi, h.lo),
            f,
        )?;
        found.or_else(|| {
            Error::Corrupt(format!(
                "the index points at log row {row} of bucket {bucket}, which has no record of \
                 the key hashed {:016x}{:016x}",
                h.hi, h.lo
            ))
        })
    }

    /// The last record in (`bucket`, `row`) that `is_it`, made
    /// into `T` by `f`, the row closed first if `close` (see
    /// `Log::read_row_unsettled`). `show` names the key in an error.
    fn find_in_row<T>(
        &self,
        (bucket, row, close): (u64, u64, bool),
        is_it: impl Fn(&RecordRef<'_>) -> bool,
        show: &dyn Fn() -> String,
        f: impl FnOnce(&RecordRef<'_>) -> Result<T>,
    ) -> Result<Found<T>> {
        let Some(bytes) = self.log.read_row_unsettled(bucket, row, close)? else {
            return Ok(Found::Evicted);
        };
        let where_ = |e: Error| match e {
            Error::Corrupt(m) => Error::Corrupt(format!(
                "{m} (log row {row} of bucket {bucket}, read for key {}{})",
                show(),
                self.path
                    .as_deref()
                    .map(|p| format!(", in {}", p.display()))
                    .unwrap_or_default()
            )),
            other => other,
        };
        let mut found = None;
        for rec in read_row(&bytes).map_err(where_)? {
            let rec = rec.map_err(where_)?;
            if is_it(&rec) {
                found = Some(rec);
            }
        }
        match found {
            Some(rec) => f(&rec).map(Found::Record).map_err(where_),
            None => Ok(Found::Missing),
        }
    }

    /// The dead letter a `DeadLetter` record holds.
    pub(crate) fn dead_letter_of(&self, rec: &RecordRef<'_>) -> Result<DeadLetter> {
        let body = rec.dead_letter_body()?;
        let record = self.record_of(rec);
        Ok(DeadLetter {
            // Not recorded before format 4: the first attempt's time, a
            // lower bound.
            first_failed_at: match body.first_failed_at {
                0 => rec.claim_fields().first_at.min(body.failed_at),
                at => at,
            },
            record,
            failed_at: body.failed_at,
            reason: body.reason.to_owned(),
            payload: body.payload.map(<[u8]>::to_vec),
        })
    }

    /// The public record of a log record.
    pub(crate) fn record_of(&self, rec: &RecordRef<'_>) -> Record {
        let state = match rec.kind {
            // Only key-state records reach here: `load` skips the others.
            Kind::Insert
            | Kind::Entity
            | Kind::Park
            | Kind::Hold
            | Kind::Intent
            | Kind::Tally
            | Kind::Keys
            | Kind::Amount => State::Inserted,
            Kind::Claim => State::InProgress,
            Kind::Release => State::Retryable,
            Kind::Complete => State::Completed,
            Kind::Fail => State::Failed,
            Kind::Forget => State::Forgotten,
            Kind::DeadLetter => State::DeadLettered,
        };
        let finished = matches!(rec.kind, Kind::Complete | Kind::Fail);
        // An inserted key is no operation; nor is its forget record
        // (attempt 0: every begun key has attempt 1 or more).
        let c = match rec.kind {
            Kind::Insert => ClaimFields {
                first_at: rec.at,
                ..ClaimFields::default()
            },
            _ => rec.claim_fields(),
        };
        let operation = match rec.kind {
            Kind::Insert => false,
            Kind::Forget => c.attempt > 0,
            _ => true,
        };
        Record {
            key: Key::owned(rec.scope.to_vec(), rec.id.to_vec()),
            state,
            attempts: c.attempt,
            token: c.token,
            first_seen: c.first_at,
            updated: rec.at,
            expires: rec.expires,
            lease_until: (rec.kind == Kind::Claim).then_some(c.lease_until),
            fingerprint: operation.then_some(Fingerprint(c.params)),
            provider_key: operation.then(|| {
                crate::key::provider_key(
                    &self.hasher.secret(),
                    rec.scope,
                    rec.id,
                    c.first_at,
                    c.params,
                )
            }),
            outcome_tag: rec.outcome_tag,
            outcome: if rec.kind == Kind::DeadLetter {
                // The reason; `Store::dead_letters` gives the rest.
                rec.dead_letter_body()
                    .ok()
                    .map(|b| b.reason.as_bytes().to_vec())
            } else {
                finished.then(|| rec.outcome.to_vec())
            },
        }
    }
}

/// Whether `rec` is a key's state record, or (`intent`) its Intent record.
fn wanted(rec: &RecordRef<'_>, intent: bool) -> bool {
    if intent {
        rec.kind == Kind::Intent
    } else {
        rec.kind.is_key_state()
    }
}

/// What a row holds of a key.
enum Found<T> {
    /// The row's bucket was evicted meanwhile.
    Evicted,
    Record(T),
    Missing,
}

impl<T> Found<T> {
    /// The record, `None` if evicted, or `missing()` (damage) if the row
    /// does not hold it.
    fn or_else(self, missing: impl FnOnce() -> Error) -> Result<Option<T>> {
        match self {
            Found::Evicted => Ok(None),
            Found::Record(t) => Ok(Some(t)),
            Found::Missing => Err(missing()),
        }
    }
}

/// The index points at a row without the key: damage.
pub(crate) fn lost_details(key: &Key<'_>) -> Error {
    Error::Corrupt(format!(
        "the index points at a log row without key {}",
        show_key(key.scope(), key.id())
    ))
}
