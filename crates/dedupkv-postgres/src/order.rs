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
//! An entity expires `Entities::retention` after the last version
//! applied to it (or its sequencer's last change), unless it stores
//! events; an expired entity starts afresh (its next version is applied
//! with no previous one). The sequencer shares the entity's row
//! (`crate::sequencer`).

use std::time::Duration;

use dedupkv::contract::{Order, Pending, check_seq, check_version};
use dedupkv::{Advance, Delivered, Error, Key, Result, SequenceOptions, Sequenced, Update};

use crate::{MAX_OUTCOME, PgStore, Q, Shared, check_key, check_len, ms, storage};

/// `version` as stored: order-preserving from `u64` to `int8`.
pub(crate) fn stored(version: u64) -> i64 {
    i64::from_be_bytes((version ^ (1 << 63)).to_be_bytes())
}

pub(crate) fn version_of(stored: i64) -> u64 {
    u64::from_be_bytes(stored.to_be_bytes()) ^ (1 << 63)
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

/// `advance` on `client` (a connection or a transaction).
fn advance_on(
    client: &mut impl postgres::GenericClient,
    (st, sh): (&postgres::Statement, &Shared),
    entity: &Key<'_>,
    version: u64,
) -> Result<Advance> {
    let retention = ms(sh.entities.retention);
    let row = client
        .query_one(
            st,
            &[
                &entity.scope(),
                &entity.id(),
                &stored(version),
                &sh.now(),
                &retention,
            ],
        )
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
        advance_on(&mut c.client, (&st, sh), entity, version).map(Pending::settled)
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
            match advance_on(&mut tx, (&adv, sh), entity, version)? {
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

    /// One transaction under the entity's row lock (see
    /// `crate::sequencer`).
    fn sequence(
        &self,
        entity: &Key<'_>,
        seq: u64,
        payload: &[u8],
        options: &SequenceOptions,
    ) -> Result<Pending<Sequenced>> {
        check_seq(seq)?;
        check_len("payload", payload.len(), MAX_OUTCOME)?;
        let entities = &self.shared.entities;
        let lease = match options.requested_lease() {
            Some(l) if l < Duration::from_millis(1) => {
                return Err(Error::InvalidArgument {
                    what: "lease",
                    reason: format!("{l:?}: a hand-back's lease must be at least 1 ms"),
                });
            }
            Some(l) => ms(l),
            None => ms(entities.handback_lease),
        };
        let max_hold = ms(entities.max_hold);
        let answer = self.on_entity(entity, true, &mut |e, now| {
            e.hold_overdue(now, max_hold);
            e.sequence(seq, payload, now, now.saturating_add(lease))
        })?;
        Ok(Pending::settled(answer.unwrap_or(Sequenced::Duplicate)))
    }

    /// As `sequence`; the hand-back's lease is the store's.
    fn release_held(&self, entity: &Key<'_>) -> Result<Pending<Vec<Delivered>>> {
        let lease = ms(self.shared.entities.handback_lease);
        let out = self.on_entity(entity, false, &mut |e, now| {
            e.release_held(now.saturating_add(lease))
        })?;
        Ok(Pending::settled(out.unwrap_or_default()))
    }

    /// As `sequence`: the acknowledged events are deleted.
    fn ack(&self, entity: &Key<'_>, upto: u64) -> Result<Pending<usize>> {
        let n = self.on_entity(entity, false, &mut |e, _| e.ack(upto))?;
        Ok(Pending::settled(n.unwrap_or(0)))
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
