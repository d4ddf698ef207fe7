//! Per-entity versions on PostgreSQL ([`Order::advance`],
//! [`Order::apply_event`]): a table of its own, `dedupkv_versions`, one
//! row per entity (entities and keys are separate namespaces, as on the
//! engine), each decision one `INSERT … ON CONFLICT DO UPDATE … RETURNING`
//! (`sql::Q::Advance`). `apply_event` records the event key as `insert`
//! does and advances the entity in one transaction: a duplicate event
//! changes nothing.
//!
//! Versions run from 0 to `u64::MAX - 1` (the engine's range); they are
//! stored as `int8` with the top bit flipped, which keeps their order.
//!
//! Not yet: the sequencer (`sequence`, `release_held`, `ack` refuse with
//! [`Error::InvalidArgument`]); versions do not expire.

use dedupkv::contract::{Order, Pending};
use dedupkv::{Advance, Delivered, Error, Key, Result, SequenceOptions, Sequenced, Update};

use crate::{PgStore, Q, check_key, storage};

/// `version` as stored: order-preserving from `u64` to `int8`.
fn stored(version: u64) -> i64 {
    i64::from_be_bytes((version ^ (1 << 63)).to_be_bytes())
}

fn version_of(stored: i64) -> u64 {
    u64::from_be_bytes(stored.to_be_bytes()) ^ (1 << 63)
}

fn check_version(version: u64) -> Result<()> {
    if version == u64::MAX {
        return Err(Error::InvalidArgument {
            what: "version",
            reason: "u64::MAX is reserved; versions run from 0 to u64::MAX - 1".into(),
        });
    }
    Ok(())
}

/// The answer of `advance` from the version the entity had (`None`: it
/// had none).
fn decide(previous: Option<i64>, version: u64) -> Advance {
    match previous.map(version_of) {
        Some(cur) if version < cur => Advance::Stale { current: cur },
        Some(cur) if version == cur => Advance::Duplicate,
        previous => Advance::Applied { previous },
    }
}

fn unsupported<T>(what: &'static str) -> Result<T> {
    Err(Error::InvalidArgument {
        what,
        reason: "the sequencer is not supported by the PostgreSQL backend yet".into(),
    })
}

/// `advance` on `client` (a connection or a transaction).
fn advance_on(
    client: &mut impl postgres::GenericClient,
    st: &postgres::Statement,
    entity: &Key<'_>,
    version: u64,
) -> Result<Advance> {
    let row = client
        .query_one(st, &[&entity.scope(), &entity.id(), &stored(version)])
        .map_err(storage)?;
    Ok(decide(row.get(0), version))
}

impl Order for PgStore {
    /// One statement (see the module).
    fn advance(&self, entity: &Key<'_>, version: u64) -> Result<Pending<Advance>> {
        check_version(version)?;
        check_key(entity)?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::Advance)?;
        advance_on(&mut c.client, &st, entity, version).map(Pending::settled)
    }

    /// One transaction: the event's `insert` (the store's retention), then,
    /// if it was new, the entity's advance.
    fn apply_event(
        &self,
        event: &Key<'_>,
        entity: &Key<'_>,
        version: u64,
    ) -> Result<Pending<Update>> {
        check_version(version)?;
        check_key(event)?;
        check_key(entity)?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let (ins, adv) = (c.stmt(&sh.sql, Q::Insert)?, c.stmt(&sh.sql, Q::Advance)?);
        let mut tx = c.client.transaction().map_err(storage)?;
        let (scopes, ids) = (vec![event.scope()], vec![event.id()]);
        let new = !tx
            .query(&ins, &[&sh.now(), &scopes, &ids, &sh.retention_ms])
            .map_err(storage)?
            .is_empty();
        let answer = if new {
            match advance_on(&mut tx, &adv, entity, version)? {
                Advance::Applied { previous } => Update::Applied { previous },
                Advance::Stale { current } => Update::Stale { current },
                _ => Update::SameVersion,
            }
        } else {
            Update::DuplicateEvent
        };
        tx.commit().map_err(storage)?;
        Ok(Pending::settled(answer))
    }

    /// Refused: not yet on this backend.
    fn sequence(
        &self,
        _entity: &Key<'_>,
        _seq: u64,
        _payload: &[u8],
        _options: &SequenceOptions,
    ) -> Result<Pending<Sequenced>> {
        unsupported("sequence")
    }

    /// Refused: not yet on this backend.
    fn release_held(&self, _entity: &Key<'_>) -> Result<Pending<Vec<Delivered>>> {
        unsupported("release_held")
    }

    /// Refused: not yet on this backend.
    fn ack(&self, _entity: &Key<'_>, _upto: u64) -> Result<Pending<usize>> {
        unsupported("ack")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_versions_keep_their_order() {
        let vs = [0, 1, (1 << 63) - 1, 1 << 63, u64::MAX - 1];
        for w in vs.windows(2) {
            assert!(stored(w[0]) < stored(w[1]), "{w:?}");
        }
        for v in vs {
            assert_eq!(version_of(stored(v)), v);
        }
    }
}
