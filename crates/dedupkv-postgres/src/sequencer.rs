//! The sequencer on PostgreSQL ([`Order::sequence`], [`Order::release_held`],
//! [`Order::ack`]): early events held until their predecessor lands,
//! never dropped.
//!
//! Each call is one transaction under the entity's row lock: the row is
//! made if absent and locked (`sql::Q::SeqLock`, an `INSERT … ON CONFLICT
//! DO UPDATE`, or `Q::SeqFind`'s `SELECT … FOR UPDATE` for the calls that
//! make no entity), its stored events are read (`dedupkv_events`, one row
//! per event), the decision is made on them as the engine makes it
//! (`Entity` below mirrors `engine/order.rs`), and what changed is written
//! back before the commit. A racer of the same entity, on any instance,
//! waits for the lock and decides on what this one wrote: nothing is read
//! and then written without it.
//!
//! Invariants:
//! - an event is stored from the call that parks or delivers it until it
//!   is acknowledged (`ack` deletes it): parked (waiting), held (its gap
//!   stayed open longer than `max_hold`), or delivered (handed back, not
//!   acknowledged);
//! - a delivered event carries the end of its hand-back's lease in the
//!   database (`handed_until`), so one live handler at a time holds it
//!   across every instance (the engine keeps this in memory);
//! - an entity that stores events never expires (`expires_at` 0); one
//!   that stores none expires `Entities::retention` after its last change.
//!
//! Time is the database's (or the store's test clock), read by the
//! locking statement. Every stored event of the entity is read by each
//! call: an entity with very many parked events pays for them.

use std::collections::BTreeMap;

#[cfg(doc)]
use dedupkv::contract::Order;
use dedupkv::{Delivered, Error, Handling, Key, Result, Sequenced};

use crate::order::{stored, version_of};
use crate::{PgStore, Q, check_key, ms, storage};

// Event states, as stored (`smallint`).
pub(crate) const PARKED: i16 = 0;
pub(crate) const HELD: i16 = 1;
const DELIVERED: i16 = 2;

/// One stored event.
#[derive(Debug, Clone, PartialEq)]
struct Ev {
    state: i16,
    payload: Vec<u8>,
    /// When it was parked.
    at: i64,
    /// Held: the number that never came, and since when.
    missing: u64,
    since: i64,
    /// Delivered: the end of its hand-back's lease (ms).
    handed_until: i64,
}

/// An entity's sequencer state, as read under its row lock, and what a
/// call changed in it.
#[derive(Debug, Default)]
pub(crate) struct Entity {
    /// The next expected number; 0: no sequencer state yet (1 expected).
    next: u64,
    gap_since: i64,
    events: BTreeMap<u64, Ev>,
    /// Events written or changed by this call.
    dirty: Vec<u64>,
    /// Events acknowledged by this call (deleted).
    removed: Vec<u64>,
    /// `next` or `gap_since` changed.
    moved: bool,
}

impl Entity {
    fn expected(&self) -> u64 {
        self.next.max(1)
    }

    fn set(&mut self, seq: u64, ev: Ev) {
        self.events.insert(seq, ev);
        self.dirty.push(seq);
    }

    fn has(&self, seq: u64, state: i16) -> bool {
        self.events.get(&seq).is_some_and(|e| e.state == state)
    }

    /// Moves every parked event to the holding area if its gap has been
    /// open longer than `max_hold`.
    pub(crate) fn hold_overdue(&mut self, now: i64, max_hold: i64) {
        if self.gap_since == 0 || now.saturating_sub(self.gap_since) <= max_hold {
            return;
        }
        let (missing, since) = (self.expected(), self.gap_since);
        let parked: Vec<u64> = self
            .events
            .iter()
            .filter(|(_, e)| e.state == PARKED)
            .map(|(s, _)| *s)
            .collect();
        for seq in parked {
            if let Some(e) = self.events.get_mut(&seq) {
                e.state = HELD;
                e.missing = missing;
                e.since = since;
            }
            self.dirty.push(seq);
        }
    }

    /// Hands `seq` back, held until `until`.
    fn deliver(&mut self, seq: u64, until: i64, out: &mut Vec<Delivered>) {
        if let Some(e) = self.events.get_mut(&seq) {
            e.state = DELIVERED;
            e.handed_until = until;
            out.push(Delivered {
                seq,
                payload: e.payload.clone(),
            });
            self.dirty.push(seq);
        }
    }

    /// The engine's `Engine::sequence` decision.
    pub(crate) fn sequence(&mut self, seq: u64, payload: &[u8], now: i64, until: i64) -> Sequenced {
        let next = self.expected();
        if self.has(seq, DELIVERED) {
            return self.redeliver(seq, payload, now, until);
        }
        if seq < next || self.events.contains_key(&seq) {
            return Sequenced::Duplicate;
        }
        let ev = Ev {
            state: PARKED,
            payload: payload.to_vec(),
            at: now,
            missing: 0,
            since: 0,
            handed_until: 0,
        };
        self.moved = true;
        if seq > next {
            if self.gap_since == 0 {
                self.gap_since = now;
            }
            self.set(seq, ev);
            self.next = next;
            return Sequenced::Parked;
        }
        self.set(seq, ev);
        let mut out = Vec::new();
        let mut n = seq;
        while self.has(n, PARKED) || self.has(n, HELD) {
            self.deliver(n, until, &mut out);
            n += 1;
        }
        self.next = n;
        self.gap_since = if self.events.values().any(|e| e.state == PARKED) {
            now
        } else {
            0
        };
        Sequenced::Delivered(out)
    }

    /// A redelivery of `seq`, handed back and not acknowledged: `Handling`
    /// while its lease is live; else it (with this call's payload) and the
    /// delivered events after it, up to the first another live hand-back
    /// holds, all held until `until` now.
    fn redeliver(&mut self, seq: u64, payload: &[u8], now: i64, until: i64) -> Sequenced {
        let mut out = Vec::new();
        for (s, e) in self.events.range_mut(seq..) {
            if e.state != DELIVERED {
                continue;
            }
            if e.handed_until > now {
                if *s == seq {
                    return Sequenced::Handling(Handling::until_millis(
                        u64::try_from(e.handed_until).unwrap_or(0),
                    ));
                }
                break;
            }
            e.handed_until = until;
            self.dirty.push(*s);
            out.push(Delivered {
                seq: *s,
                payload: if *s == seq {
                    payload.to_vec()
                } else {
                    e.payload.clone()
                },
            });
        }
        Sequenced::Delivered(out)
    }

    /// The engine's `Engine::release_held`: every held and parked event,
    /// in order, when any is held.
    pub(crate) fn release_held(&mut self, until: i64) -> Vec<Delivered> {
        if !self.events.values().any(|e| e.state == HELD) {
            return Vec::new();
        }
        let waiting: Vec<u64> = self
            .events
            .iter()
            .filter(|(_, e)| e.state != DELIVERED)
            .map(|(s, _)| *s)
            .collect();
        let mut out = Vec::with_capacity(waiting.len());
        for seq in waiting {
            self.deliver(seq, until, &mut out);
        }
        self.next = out.last().map_or(self.expected(), |d| d.seq + 1);
        self.gap_since = 0;
        self.moved = true;
        out
    }

    /// The engine's `Engine::ack`: the delivered events up to `upto`.
    pub(crate) fn ack(&mut self, upto: u64) -> usize {
        let mark = upto.saturating_add(1).min(self.expected());
        self.removed = self
            .events
            .range(..mark)
            .filter(|(_, e)| e.state == DELIVERED)
            .map(|(s, _)| *s)
            .collect();
        for s in &self.removed {
            self.events.remove(s);
        }
        self.removed.len()
    }
}

impl PgStore {
    /// Moves the parked events of every entity whose gap has stayed open
    /// longer than [`Entities::max_hold`](crate::Entities::max_hold) to
    /// the holding area, as [`Store::sweep_parked`](dedupkv::Store::sweep_parked)
    /// does; the value is how many moved. `sequence` does the same for its
    /// own entity, so this is for entities no later event arrives for: run
    /// it from one instance on a timer, then [`Order::release_held`] what
    /// an operator decides to give up on. One statement; an entity a
    /// concurrent call holds is left to the next sweep.
    ///
    /// # Errors
    /// Storage errors.
    ///
    /// # Examples
    /// ```no_run
    /// let store = dedupkv_postgres::PgStore::connect("host=127.0.0.1 user=postgres")?;
    /// let moved = store.sweep_parked()?;
    /// # let _ = moved;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn sweep_parked(&self) -> Result<u64> {
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let st = c.stmt(&sh.sql, Q::SweepParked)?;
        c.client
            .execute(&st, &[&sh.now(), &ms(sh.entities.max_hold)])
            .map_err(storage)
    }
}

/// What a call does on the locked entity: its answer.
pub(crate) type Decide<'a, T> = &'a mut dyn FnMut(&mut Entity, i64) -> T;

impl PgStore {
    /// One sequencer call on `entity` in one transaction: lock (making the
    /// entity if `make`), read its events, `decide` (given the time),
    /// write what changed, commit. `None` when the entity does not exist
    /// and `make` is false.
    pub(crate) fn on_entity<T>(
        &self,
        entity: &Key<'_>,
        make: bool,
        decide: Decide<'_, T>,
    ) -> Result<Option<T>> {
        check_key(entity)?;
        let sh = &*self.shared;
        let mut pooled = sh.pooled()?;
        let c = pooled.conn();
        let lock = c.stmt(&sh.sql, if make { Q::SeqLock } else { Q::SeqFind })?;
        let (read, put, del, set) = (
            c.stmt(&sh.sql, Q::Events)?,
            c.stmt(&sh.sql, Q::EventsPut)?,
            c.stmt(&sh.sql, Q::EventsDel)?,
            c.stmt(&sh.sql, Q::SeqSet)?,
        );
        let (scope, id) = (entity.scope(), entity.id());
        let mut tx = c.client.transaction().map_err(storage)?;
        let Some(row) = tx
            .query_opt(&lock, &[&sh.now(), &scope, &id])
            .map_err(storage)?
        else {
            return Ok(None);
        };
        let (next, gap_since, now): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        let mut e = Entity {
            next: version_of(next),
            gap_since,
            ..Entity::default()
        };
        let corrupt = |e: postgres::Error| {
            Error::Corrupt(format!("a dedupkv_events row: {}", crate::describe(&e)))
        };
        for r in tx.query(&read, &[&scope, &id]).map_err(storage)? {
            let seq: i64 = r.try_get(0).map_err(corrupt)?;
            let missing: i64 = r.try_get(4).map_err(corrupt)?;
            e.events.insert(
                version_of(seq),
                Ev {
                    state: r.try_get(1).map_err(corrupt)?,
                    payload: r.try_get(2).map_err(corrupt)?,
                    at: r.try_get(3).map_err(corrupt)?,
                    missing: version_of(missing),
                    since: r.try_get(5).map_err(corrupt)?,
                    handed_until: r.try_get(6).map_err(corrupt)?,
                },
            );
        }
        let answer = decide(&mut e, now);
        e.dirty.sort_unstable();
        e.dirty.dedup();
        if !e.dirty.is_empty() {
            let evs: Vec<&Ev> = e.dirty.iter().filter_map(|s| e.events.get(s)).collect();
            let seqs: Vec<i64> = e.dirty.iter().map(|s| stored(*s)).collect();
            tx.execute(
                &put,
                &[
                    &scope,
                    &id,
                    &seqs,
                    &evs.iter().map(|v| v.state).collect::<Vec<_>>(),
                    &evs.iter().map(|v| v.payload.as_slice()).collect::<Vec<_>>(),
                    &evs.iter().map(|v| v.at).collect::<Vec<_>>(),
                    &evs.iter().map(|v| stored(v.missing)).collect::<Vec<_>>(),
                    &evs.iter().map(|v| v.since).collect::<Vec<_>>(),
                    &evs.iter().map(|v| v.handed_until).collect::<Vec<_>>(),
                ],
            )
            .map_err(storage)?;
        }
        if !e.removed.is_empty() {
            let seqs: Vec<i64> = e.removed.iter().map(|s| stored(*s)).collect();
            tx.execute(&del, &[&scope, &id, &seqs]).map_err(storage)?;
        }
        if e.moved || !e.removed.is_empty() || (make && next == stored(0)) {
            let expires = if e.events.is_empty() {
                now.saturating_add(ms(sh.entities.retention))
            } else {
                0
            };
            tx.execute(
                &set,
                &[&scope, &id, &stored(e.next), &e.gap_since, &expires],
            )
            .map_err(storage)?;
        }
        tx.commit().map_err(storage)?;
        Ok(Some(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(s: &Sequenced) -> Vec<u64> {
        match s {
            Sequenced::Delivered(v) => v.iter().map(|d| d.seq).collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn early_events_wait_for_their_predecessor_and_are_acked_once() {
        let mut e = Entity::default();
        assert_eq!(e.sequence(3, b"c", 10, 40), Sequenced::Parked);
        assert_eq!(e.sequence(2, b"b", 11, 41), Sequenced::Parked);
        assert_eq!(e.sequence(2, b"b", 12, 42), Sequenced::Duplicate);
        assert_eq!(seqs(&e.sequence(1, b"a", 13, 43)), [1, 2, 3]);
        assert_eq!(e.gap_since, 0);
        assert!(matches!(
            e.sequence(2, b"b", 14, 44),
            Sequenced::Handling(_)
        ));
        assert_eq!(seqs(&e.sequence(2, b"b", 50, 80)), [2, 3]);
        assert_eq!(e.ack(3), 3);
        assert_eq!(e.sequence(1, b"a", 51, 81), Sequenced::Duplicate);
        assert!(e.events.is_empty());
    }

    #[test]
    fn an_overdue_gap_holds_its_events_and_release_hands_them_back() {
        let mut e = Entity::default();
        assert_eq!(e.sequence(5, b"e", 10, 40), Sequenced::Parked);
        e.hold_overdue(100, 60);
        assert!(e.has(5, HELD));
        assert_eq!(e.sequence(7, b"g", 100, 130), Sequenced::Parked);
        let out: Vec<u64> = e.release_held(160).iter().map(|d| d.seq).collect();
        assert_eq!(out, [5, 7]);
        assert_eq!(e.next, 8);
    }
}
