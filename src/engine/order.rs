//! Ordering: per-entity versions that reject stale updates, and a
//! sequencer that holds early events until their predecessor lands.
//!
//! Entities live in their own namespace of the index (their keys are hashed
//! in another domain, so an entity and an event key with the same scope and
//! id never meet), in a per-shard table of [`Entity`] states.
//!
//! Invariants:
//! - every decision is made under the entity's shard lock and its records
//!   are appended before the lock is released, like every other write; an
//!   answer is given only once its records are durable (`Immediate`);
//! - an `Entity` record holds the entity's whole core state (version, next
//!   sequence number, gap start, ack mark), so the latest one wins at
//!   recovery; `Park` and `Hold` records below the ack mark are consumed,
//!   those from it to `next` are events handed back and not acknowledged;
//! - what the sequencer hands back stays stored until `ack`: a delivered
//!   event is written as a Park record in the batch that delivers it, and
//!   successors keep the records they were parked or held with;
//! - an unacknowledged event is handed to one live handler at a time: it
//!   carries its hand-back's lease end, in memory only (a restart means its
//!   holder is gone, so replay gives it none and it is handed back at
//!   once), and a redelivery before that end answers `Handling`;
//! - an entity's core records never move to an earlier bucket, and eviction
//!   re-logs (carries forward) the records of parked, held and
//!   unacknowledged events and of entities that still have some, in the
//!   commit that deletes the bucket
//!   or before it — so a parked or held event is never dropped. A store
//!   closed past a bucket's expiry does the same at open: recovery applies
//!   the entity records of expired tables, drops the entities left without
//!   events, and carries the others before the tables are deleted.

use std::collections::BTreeMap;

use super::Engine;
use super::listings::held_reason;
use super::write::Batch;
use super::write::{Next, Write};
use crate::clock::to_system_time;
// Versions' and sequence numbers' ranges, shared with other backends.
use crate::contract::{check_seq, check_version};
use crate::index::Shard;
use crate::index::entity::{Entity, EventState, FRESH, Stored};
use crate::key::KeyHash;
use crate::records::{Kind, RecordRef};
use crate::types::{
    Advance, Basis, Delivered, Handling, Held, Pending, SequenceOptions, Sequenced, Unacked, Update,
};
use crate::{Error, Key, Result};

impl Engine {
    fn entity_expiry(&self, now: u64) -> u64 {
        now.saturating_add(self.cfg.entity_retention_ms)
    }

    /// Appends the entity's core record; the bucket never moves earlier.
    pub(crate) fn log_core(&self, batch: &mut Batch, e: &mut Entity, now: u64) -> u64 {
        let key = e.key.clone();
        let mark = e.core_payload();
        e.fresh = false;
        let mut rec = RecordRef::entity_core(
            key.scope(),
            key.id(),
            (now, self.entity_expiry(now)),
            (e.version, e.next, e.gap_since),
            &mark,
        );
        let (bucket, row) = self.place(batch, Some(e.bucket), &mut rec);
        e.bucket = bucket;
        e.row = row;
        row
    }

    /// Appends the record of stored event `seq` (Park or Hold, as its
    /// state says); returns its bucket.
    pub(crate) fn log_event(
        &self,
        batch: &mut Batch,
        key: &Key<'_>,
        seq: u64,
        ev: &Stored,
        now: u64,
    ) -> u64 {
        let (scope, id) = (key.scope(), key.id());
        let at = (now, self.entity_expiry(now));
        let mut rec = match ev.state {
            EventState::Parked { at: parked } => {
                RecordRef::park(scope, id, at, (seq, parked), &ev.payload)
            }
            EventState::Held { missing, since } => {
                RecordRef::hold(scope, id, at, (seq, missing, since), &ev.payload)
            }
        };
        self.place(batch, None, &mut rec).0
    }

    /// Moves every parked event of `e` to the holding area if its gap has
    /// been open longer than `max_hold`. Returns how many moved.
    fn hold_overdue(&self, batch: &mut Batch, e: &mut Entity, now: u64) -> usize {
        if e.parked.is_empty()
            || e.gap_since == 0
            || now.saturating_sub(e.gap_since) <= self.cfg.max_hold_ms
        {
            return 0;
        }
        let missing = e.expected();
        let since = e.gap_since;
        let key = e.key.clone();
        let parked = std::mem::take(&mut e.parked);
        let n = parked.len();
        for (seq, mut ev) in parked {
            ev.state = EventState::Held { missing, since };
            ev.bucket = self.log_event(batch, &key, seq, &ev, now);
            tracing::warn!(key = %key, seq, missing, "dedupkv: event held, its predecessor is missing");
            e.held.insert(seq, ev);
        }
        n
    }
}

impl Engine {
    fn entity_hash(&self, entity: &Key<'_>) -> Result<KeyHash> {
        self.check_key(entity)?;
        Ok(self.hasher.hash_entity(entity.scope(), entity.id()))
    }

    fn entity_write_start(&self, entity: &Key<'_>) -> Result<(KeyHash, u64, u64)> {
        let h = self.entity_hash(entity)?;
        self.log.check()?;
        let (now, nb) = self.time()?;
        Ok((h, now, nb))
    }

    pub(crate) fn advance(&self, entity: &Key<'_>, version: u64) -> Result<Pending<Advance>> {
        check_version(version)?;
        let (h, now, nb) = self.entity_write_start(entity)?;
        let mut shard = self.index.lock(h);
        let e = shard.entity_mut(h, nb, entity);
        let answer = match e.version {
            Some(cur) if version < cur => Advance::Stale { current: cur },
            Some(cur) if version == cur => Advance::Duplicate,
            previous => Advance::Applied { previous },
        };
        let row = if let Advance::Applied { .. } = answer {
            e.version = Some(version);
            let mut batch = self.log.batch()?;
            let row = self.log_core(&mut batch, e, now);
            drop(batch);
            shard.counters.versions_applied += 1;
            Some(row)
        } else {
            let row = e.row;
            shard.counters.versions_stale += u64::from(matches!(answer, Advance::Stale { .. }));
            drop(shard);
            return Ok(Pending::new(answer, Basis::read(row)));
        };
        drop(shard);
        Ok(Pending::new(answer, Basis::written(row.unwrap_or(0))))
    }

    pub(crate) fn apply_event(
        &self,
        event: &Key<'_>,
        entity: &Key<'_>,
        version: u64,
    ) -> Result<Pending<Update>> {
        check_version(version)?;
        self.check_key(event)?;
        let he = self.hasher.hash(event.scope(), event.id());
        let hn = self.entity_hash(entity)?;
        self.log.check()?;
        let (now, nb) = self.time()?;
        let (sa, sb) = (self.index.shard_of(he), self.index.shard_of(hn));
        let (answer, row) = if sa == sb {
            let mut shard = self.index.lock_shard(sa);
            decide_event(
                self, &mut shard, None, event, he, entity, hn, version, now, nb,
            )?
        } else {
            // Lock in shard order so two such calls never deadlock.
            let (mut ev, mut en) = if sa < sb {
                let ev = self.index.lock_shard(sa);
                (ev, self.index.lock_shard(sb))
            } else {
                let en = self.index.lock_shard(sb);
                (self.index.lock_shard(sa), en)
            };
            decide_event(
                self,
                &mut ev,
                Some(&mut en),
                event,
                he,
                entity,
                hn,
                version,
                now,
                nb,
            )?
        };
        let basis = if matches!(answer, Update::DuplicateEvent) {
            Basis::read(row)
        } else {
            Basis::written(row)
        };
        Ok(Pending::new(answer, basis))
    }

    /// A hand-back lease in ms: the call's own or the store's.
    fn handback_lease(&self, lease: Option<std::time::Duration>) -> Result<u64> {
        let Some(d) = lease else {
            return Ok(self.cfg.handback_lease_ms);
        };
        match crate::clock::millis(d) {
            0 => Err(Error::InvalidArgument {
                what: "lease",
                reason: "is 0; a hand-back's lease must be at least 1 ms".into(),
            }),
            ms => Ok(ms),
        }
    }

    pub(crate) fn sequence(
        &self,
        entity: &Key<'_>,
        seq: u64,
        payload: &[u8],
        options: &SequenceOptions,
    ) -> Result<Pending<Sequenced>> {
        check_seq(seq)?;
        self.check_payload(payload)?;
        let lease_ms = self.handback_lease(options.lease)?;
        let (h, now, nb) = self.entity_write_start(entity)?;
        let until = now.saturating_add(lease_ms);
        let mut shard = self.index.lock(h);
        let e = shard.entity_mut(h, nb, entity);
        let mut batch = self.log.batch()?;
        if e.fresh {
            // Its events are written before its core record below: mark
            // the incarnation first, so replay drops only what came before.
            self.log_core(&mut batch, e, now);
        }
        let moved = self.hold_overdue(&mut batch, e, now);
        let next = e.expected();
        // A redelivery of an event handed back and not acknowledged writes
        // nothing: hand-backs live in memory.
        let mut again = false;
        let answer = if e.unacked.contains_key(&seq) {
            again = true;
            redeliver(e, seq, payload, now, until)
        } else if seq < next || e.parked.contains_key(&seq) || e.held.contains_key(&seq) {
            Sequenced::Duplicate
        } else if seq == next {
            self.deliver_from(&mut batch, e, (seq, payload), now, until)
        } else {
            self.park(&mut batch, e, (seq, payload), now)
        };
        let row = if (again || matches!(answer, Sequenced::Duplicate)) && moved == 0 {
            let row = e.row;
            drop(batch);
            match &answer {
                Sequenced::Delivered(v) => shard.counters.seq_delivered += v.len() as u64,
                Sequenced::Duplicate => shard.counters.seq_duplicates += 1,
                _ => {}
            }
            drop(shard);
            return Ok(Pending::new(answer, Basis::read(row)));
        } else {
            self.log_core(&mut batch, e, now)
        };
        drop(batch);
        match &answer {
            Sequenced::Delivered(v) => shard.counters.seq_delivered += v.len() as u64,
            Sequenced::Parked => shard.counters.seq_parked += 1,
            Sequenced::Duplicate => shard.counters.seq_duplicates += 1,
            Sequenced::Handling(_) => {}
        }
        shard.counters.seq_held += moved as u64;
        drop(shard);
        Ok(Pending::new(answer, Basis::written(row)))
    }

    /// Delivers event `seq`, the one its entity expects next, with every
    /// parked or held event that follows it without a gap; each is stored
    /// until it is acknowledged.
    fn deliver_from(
        &self,
        batch: &mut Batch,
        e: &mut Entity,
        (seq, payload): (u64, &[u8]),
        now: u64,
        until: u64,
    ) -> Sequenced {
        let mut ev = Stored {
            state: EventState::Parked { at: now },
            payload: payload.to_vec(),
            bucket: 0,
            handed_until: 0,
        };
        let key = e.key.clone();
        ev.bucket = self.log_event(batch, &key, seq, &ev, now);
        let mut out = vec![Delivered {
            seq,
            payload: payload.to_vec(),
        }];
        e.deliver(seq, ev, until);
        let mut n = seq + 1;
        while let Some(ev) = e.parked.remove(&n).or_else(|| e.held.remove(&n)) {
            out.push(Delivered {
                seq: n,
                payload: ev.payload.clone(),
            });
            e.deliver(n, ev, until);
            n += 1;
        }
        e.next = n;
        e.gap_since = if e.parked.is_empty() { 0 } else { now };
        Sequenced::Delivered(out)
    }

    /// Parks event `seq`, which arrived before its predecessor: stored,
    /// never dropped, until the gap closes or it is held.
    fn park(
        &self,
        batch: &mut Batch,
        e: &mut Entity,
        (seq, payload): (u64, &[u8]),
        now: u64,
    ) -> Sequenced {
        if e.gap_since == 0 {
            e.gap_since = now;
        }
        let ev = Stored {
            state: EventState::Parked { at: now },
            payload: payload.to_vec(),
            bucket: 0,
            handed_until: 0,
        };
        let key = e.key.clone();
        let bucket = self.log_event(batch, &key, seq, &ev, now);
        e.parked.insert(seq, Stored { bucket, ..ev });
        if e.next == 0 {
            e.next = 1;
        }
        Sequenced::Parked
    }

    pub(crate) fn held(&self, entity: &Key<'_>) -> Result<Vec<Held>> {
        self.check_readable()?;
        self.stored_events(
            entity,
            |e| &e.held,
            |seq, ev, _| {
                let (missing, since) = match ev.state {
                    EventState::Held { missing, since } => (missing, since),
                    // Never in the holding area; shown as waiting since parked.
                    EventState::Parked { at } => (seq, at),
                };
                Held {
                    entity: entity.clone().into_owned(),
                    seq,
                    payload: ev.payload.clone(),
                    missing,
                    since: to_system_time(since),
                    reason: held_reason(missing, since),
                }
            },
        )
    }

    fn stored_events<T>(
        &self,
        entity: &Key<'_>,
        set: impl Fn(&Entity) -> &BTreeMap<u64, Stored>,
        show: impl Fn(u64, &Stored, u64) -> T,
    ) -> Result<Vec<T>> {
        let h = self.entity_hash(entity)?;
        let (now, nb) = self.time()?;
        let shard = self.index.lock(h);
        Ok(shard.entity(h, nb).map_or_else(Vec::new, |e| {
            set(e).iter().map(|(seq, ev)| show(*seq, ev, now)).collect()
        }))
    }

    pub(crate) fn release_held(&self, entity: &Key<'_>) -> Result<Pending<Vec<Delivered>>> {
        let (h, now, nb) = self.entity_write_start(entity)?;
        let until = now.saturating_add(self.cfg.handback_lease_ms);
        let mut shard = self.index.lock(h);
        let e = shard.entity_mut(h, nb, entity);
        if e.held.is_empty() {
            return Ok(Pending::settled(Vec::new()));
        }
        let mut all = std::mem::take(&mut e.held);
        all.append(&mut e.parked);
        let mut out = Vec::with_capacity(all.len());
        for (seq, ev) in all {
            out.push(Delivered {
                seq,
                payload: ev.payload.clone(),
            });
            e.deliver(seq, ev, until);
        }
        e.next = out.last().map_or(e.expected(), |d| d.seq + 1);
        e.gap_since = 0;
        let row = {
            let mut batch = self.log.batch()?;
            self.log_core(&mut batch, e, now)
        };
        shard.counters.seq_delivered += out.len() as u64;
        drop(shard);
        Ok(Pending::new(out, Basis::written(row)))
    }

    pub(crate) fn ack(&self, entity: &Key<'_>, upto: u64) -> Result<Pending<usize>> {
        let (h, now, nb) = self.entity_write_start(entity)?;
        let mut shard = self.index.lock(h);
        let Some(e) = shard.entity_live_mut(h, nb) else {
            return Ok(Pending::settled(0));
        };
        let mark = upto.saturating_add(1).min(e.expected());
        let still = e.unacked.split_off(&mark);
        let acked = std::mem::replace(&mut e.unacked, still).len();
        if acked == 0 {
            let row = e.row;
            drop(shard);
            return Ok(Pending::new(0, Basis::read(row)));
        }
        e.acked = e.acked.max(mark);
        let row = {
            let mut batch = self.log.batch()?;
            self.log_core(&mut batch, e, now)
        };
        drop(shard);
        Ok(Pending::new(acked, Basis::written(row)))
    }

    pub(crate) fn unacked(&self, entity: &Key<'_>) -> Result<Vec<Unacked>> {
        self.check_readable()?;
        self.stored_events(
            entity,
            |e| &e.unacked,
            |seq, ev, now| Unacked {
                seq,
                payload: ev.payload.clone(),
                handling: (ev.handed_until > now).then_some(Handling {
                    lease_until: ev.handed_until,
                }),
            },
        )
    }
}

impl Engine {
    /// Re-logs the records of entity `e` that sit in a bucket before
    /// `before` (its core record and those of its stored events) into
    /// `batch`, so they outlive that bucket's table.
    pub(crate) fn carry_forward(&self, batch: &mut Batch, e: &mut Entity, before: u64, now: u64) {
        if e.bucket < before {
            self.log_core(batch, e, now);
        }
        let key = e.key.clone();
        for (seq, ev) in e.events_mut() {
            if ev.bucket < before {
                ev.bucket = self.log_event(batch, &key, *seq, ev, now);
            }
        }
    }

    /// At open: carries every entity with events out of the tables of
    /// buckets before `now_bucket`, which the caller deletes next (in the
    /// same commit or a later one).
    pub(crate) fn carry_expired(&self, now_bucket: u64) -> Result<()> {
        let now = self.now();
        for i in 0..self.cfg.shards {
            let mut shard = self.index.lock_shard(i);
            let mut batch = self.log.batch()?;
            for e in shard.entities_with_events() {
                self.carry_forward(&mut batch, e, now_bucket, now);
            }
        }
        Ok(())
    }

    pub(crate) fn sweep_parked(&self) -> Result<usize> {
        self.log.check()?;
        let now = self.now();
        let mut moved = 0;
        let mut last_row = 0;
        for i in 0..self.cfg.shards {
            let mut shard = self.index.lock_shard(i);
            let mut batch = self.log.batch()?;
            let mut here = 0;
            for e in shard.entities_with_events() {
                let n = self.hold_overdue(&mut batch, e, now);
                if n > 0 {
                    last_row = last_row.max(self.log_core(&mut batch, e, now));
                    here += n;
                }
            }
            drop(batch);
            shard.counters.seq_held += here as u64;
            moved += here;
        }
        if last_row > 0 {
            self.log.settle(last_row)?;
        }
        Ok(moved)
    }
}

/// The answer to a redelivery of `seq`, handed back and not acknowledged:
/// `Handling` while its lease is live; else it (with this call's payload)
/// and what follows it up to the first event another live hand-back
/// holds, all held until `until` now.
fn redeliver(e: &mut Entity, seq: u64, payload: &[u8], now: u64, until: u64) -> Sequenced {
    let mut out = Vec::new();
    for (s, ev) in e.unacked.range_mut(seq..) {
        if ev.handed_until > now {
            if *s == seq {
                return Sequenced::Handling(Handling {
                    lease_until: ev.handed_until,
                });
            }
            break;
        }
        ev.handed_until = until;
        out.push(Delivered {
            seq: *s,
            payload: if *s == seq {
                payload.to_vec()
            } else {
                ev.payload.clone()
            },
        });
    }
    Sequenced::Delivered(out)
}

/// Applies a replayed entity record (recovery, in log order).
pub(crate) fn apply_entity_record(
    shard: &mut Shard,
    h: KeyHash,
    bucket: u64,
    row: u64,
    rec: &RecordRef<'_>,
) -> Result<()> {
    let key = Key::new(rec.scope, rec.id);
    let e = shard.entity_mut(h, 0, &key);
    // Whatever it was, it is an entity of the log now, not a new one.
    e.fresh = false;
    let stored = |state| Stored {
        state,
        payload: rec.event_payload().to_vec(),
        bucket,
        // Whoever held it is gone: handed back at once.
        handed_until: 0,
    };
    match rec.kind {
        Kind::Entity => {
            let (acked, flags) = match *rec.ack_mark() {
                [] => (rec.next_seq(), 0),
                [a0, a1, a2, a3, a4, a5, a6, a7] => {
                    (u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]), 0)
                }
                [a0, a1, a2, a3, a4, a5, a6, a7, f] if f & !FRESH == 0 => {
                    (u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]), f)
                }
                _ => {
                    return Err(Error::Corrupt(format!(
                        "the Entity record of {} in log row {row} has a malformed \
                         {}-byte payload",
                        crate::error::show_key(rec.scope, rec.id),
                        rec.ack_mark().len()
                    )));
                }
            };
            if flags & FRESH != 0 {
                // A new incarnation: what an expired one left is not its.
                *e = Entity::new(h, &key);
                e.fresh = false;
            }
            e.version = rec.entity_version();
            e.next = rec.next_seq();
            e.gap_since = rec.gap_since();
            e.acked = acked;
            e.bucket = bucket;
            e.row = row;
        }
        Kind::Park => {
            e.held.remove(&rec.event_seq());
            e.parked.insert(
                rec.event_seq(),
                stored(EventState::Parked {
                    at: rec.parked_at(),
                }),
            );
        }
        Kind::Hold => {
            e.parked.remove(&rec.event_seq());
            e.held.insert(
                rec.event_seq(),
                stored(EventState::Held {
                    missing: rec.held_missing(),
                    since: rec.held_since(),
                }),
            );
        }
        _ => {}
    }
    Ok(())
}

/// Decides an update event under its shard lock(s): `en` is the entity's
/// shard when it differs from the event's.
#[allow(clippy::too_many_arguments)]
fn decide_event(
    engine: &Engine,
    ev: &mut Shard,
    en: Option<&mut Shard>,
    event: &Key<'_>,
    he: KeyHash,
    entity: &Key<'_>,
    hn: KeyHash,
    version: u64,
    now: u64,
    nb: u64,
) -> Result<(Update, u64)> {
    let w = Write::new(ev, he, nb);
    if let Some(slot) = w.live() {
        ev.counters.duplicates += 1;
        return Ok((Update::DuplicateEvent, slot.row(engine.log.open_row())));
    }
    let mut batch = engine.log.batch()?;
    let mut rec = super::dedup::insert_record(event, now, engine.cfg.retention_ms);
    let mut row = w.append(engine, &mut batch, Next::Inserted, &mut rec);
    ev.counters.new_keys += 1;
    let en: &mut Shard = match en {
        Some(s) => s,
        None => ev,
    };
    let e = en.entity_mut(hn, nb, entity);
    let answer = match e.version {
        Some(cur) if version < cur => Update::Stale { current: cur },
        Some(cur) if version == cur => Update::SameVersion,
        previous => Update::Applied { previous },
    };
    if let Update::Applied { .. } = answer {
        e.version = Some(version);
        row = row.max(engine.log_core(&mut batch, e, now));
        en.counters.versions_applied += 1;
    } else {
        en.counters.versions_stale += u64::from(matches!(answer, Update::Stale { .. }));
    }
    Ok((answer, row))
}
