//! Reading a key's record: the index says where, the log row says what.

use super::Engine;
use super::write::Write;
use crate::error::show_key;
use crate::log::format::read_row;
use crate::log::record::{ClaimFields, Kind, RecordRef};
use crate::types::{Record, State};
use crate::{Error, Fingerprint, Key, Result};

impl Engine {
    /// The latest record of `key`, or `None` if it is not recorded (or has
    /// expired).
    pub(crate) fn get(&self, key: &Key<'_>) -> Result<Option<Record>> {
        self.check_key(key)?;
        let h = self.hash(key);
        let (_, nb) = self.time()?;
        let mut shard = self.index.lock(h);
        let Some(s) = Write::new(&mut shard, h, nb).recorded() else {
            return Ok(None);
        };
        let (bucket, row) = (s.bucket(nb), s.row(self.log.open_row()));
        drop(shard);
        self.load(key, bucket, row)
    }

    /// Reads the key's latest record from the row its slot points at;
    /// `None` if the bucket was evicted between the lookup and the read.
    pub(crate) fn load(&self, key: &Key<'_>, bucket: u64, row: u64) -> Result<Option<Record>> {
        self.log.wait_durable(row)?;
        let Some(bytes) = self.log.read_row(bucket, row)? else {
            return Ok(None);
        };
        let where_ = |e: Error| match e {
            Error::Corrupt(m) => Error::Corrupt(format!(
                "{m} (log row {row} of bucket {bucket}, read for key {}{})",
                show_key(key.scope(), key.id()),
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
            if !rec.kind.is_entity() && rec.scope == key.scope() && rec.id == key.id() {
                found = Some(self.record_of(&rec));
            }
        }
        found.map(Some).ok_or_else(|| lost_details(key))
    }

    /// The public record of a log record.
    pub(crate) fn record_of(&self, rec: &RecordRef<'_>) -> Record {
        let state = match rec.kind {
            // Entity records never reach here: `load` skips them.
            Kind::Insert | Kind::Entity | Kind::Park | Kind::Hold => State::Inserted,
            Kind::Claim => State::InProgress,
            Kind::Release => State::Retryable,
            Kind::Complete => State::Completed,
            Kind::Fail => State::Failed,
            Kind::Forget => State::Forgotten,
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
            outcome: finished.then(|| rec.outcome.to_vec()),
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
