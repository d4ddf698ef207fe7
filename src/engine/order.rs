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
//! - an entity's core records never move to an earlier bucket, and eviction
//!   re-logs (carries forward) the records of parked, held and
//!   unacknowledged events and of entities that still have some, in the
//!   commit that deletes the bucket
//!   or before it — so a parked or held event is never dropped. A store
//!   closed past a bucket's expiry does the same at open: recovery applies
//!   the entity records of expired tables, drops the entities left without
//!   events, and carries the others before the tables are deleted.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::civil::rfc3339;
use crate::clock::to_system_time;
use crate::codec::TAG_RAW;
use crate::index::Shard;
use crate::key::KeyHash;
use crate::log::commit::Batch;
use crate::log::format::{Kind, RecordRef};
use crate::store::Inner;
use crate::{Error, Key, Result, Store};

/// The answer of [`Store::advance`].
///
/// # Examples
/// ```
/// # use dedupkv::{Advance, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let order = Key::new("shop-42", "order-7");
/// assert_eq!(store.advance(&order, 3)?, Advance::Applied { previous: None });
/// assert_eq!(store.advance(&order, 5)?, Advance::Applied { previous: Some(3) });
/// assert_eq!(store.advance(&order, 4)?, Advance::Stale { current: 5 });
/// assert_eq!(store.advance(&order, 5)?, Advance::Duplicate);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Advance {
    /// The version was newer (or the entity had none): it is now current.
    Applied {
        /// The version it replaced.
        previous: Option<u64>,
    },
    /// The version is older than the current one: do not apply the update.
    Stale {
        /// The entity's current version.
        current: u64,
    },
    /// The version equals the current one.
    Duplicate,
}

/// The answer of [`Store::apply_event`]: the event key and the entity
/// version, decided together.
///
/// # Examples
/// ```
/// # use dedupkv::{Key, Store, Update};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let order = Key::new("shop-42", "order-7");
/// let e1 = Key::new("shop-42", "evt-1");
/// let e0 = Key::new("shop-42", "evt-0");
/// assert_eq!(store.apply_event(&e1, &order, 2)?, Update::Applied { previous: None });
/// assert_eq!(store.apply_event(&e0, &order, 1)?, Update::Stale { current: 2 }); // late, older
/// assert_eq!(store.apply_event(&e0, &order, 1)?, Update::DuplicateEvent);         // its redelivery
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Update {
    /// New event, newer version: apply the update.
    Applied {
        /// The version it replaced.
        previous: Option<u64>,
    },
    /// New event, older version: recorded as handled; do not apply it.
    Stale {
        /// The entity's current version.
        current: u64,
    },
    /// New event, same version as the current one: recorded as handled.
    SameVersion,
    /// The event key was seen before: nothing changed.
    DuplicateEvent,
}

/// One event handed back by the sequencer, in order.
///
/// # Examples
/// See [`Sequenced`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// Its sequence number.
    pub seq: u64,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// The answer of [`Store::sequence`].
///
/// # Examples
/// ```
/// # use dedupkv::{Key, Sequenced, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let acct = Key::new("bank", "acct-1");
/// assert_eq!(store.sequence(&acct, 2, b"second")?, Sequenced::Parked);
/// let Sequenced::Delivered(events) = store.sequence(&acct, 1, b"first")? else { unreachable!() };
/// let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
/// assert_eq!(seqs, [1, 2]);
/// // Not acknowledged yet: a redelivery hands both back again.
/// assert_eq!(store.sequence(&acct, 1, b"first")?, Sequenced::Delivered(events));
/// store.ack(&acct, 2)?;
/// assert_eq!(store.sequence(&acct, 1, b"first")?, Sequenced::Duplicate);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sequenced {
    /// This event and the successors it unblocked, in order (or, for a
    /// redelivery of an event not acknowledged yet, it and every
    /// unacknowledged event after it, handed back again). Handle them all,
    /// [`ack`](Store::ack) them, then acknowledge this event upstream: the
    /// parked ones were acknowledged upstream when they were parked, and
    /// the store keeps them until `ack`.
    Delivered(Vec<Delivered>),
    /// Early: parked durably until its predecessor lands.
    Parked,
    /// Already acknowledged, or parked or held.
    Duplicate,
}

/// An event in the holding area: its gap stayed open longer than
/// `max_hold`.
///
/// # Examples
/// ```
/// # use dedupkv::{Key, ManualClock, Store};
/// # use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// let clock = ManualClock::new(1_700_000_000_000);
/// let store = Store::builder().clock(clock.clone()).max_hold(Duration::from_secs(60)).open(dir.path().join("s.redb"))?;
/// let acct = Key::new("bank", "acct-1");
/// store.sequence(&acct, 3, b"third")?;
/// clock.advance(Duration::from_secs(61));
/// store.sweep_parked()?;
/// let held = store.held(&acct)?;
/// assert_eq!(held[0].seq, 3);
/// assert_eq!(held[0].reason, "predecessor 1 missing since 2023-11-14T22:13:20Z");
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Held {
    /// Its sequence number.
    pub seq: u64,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The sequence number that never came.
    pub missing: u64,
    /// Since when it has been missing.
    pub since: SystemTime,
    /// "predecessor N missing since T", for people.
    pub reason: String,
}

/// An entity's state in the index: its core state (written whole in each
/// Entity record) and its stored events.
#[derive(Debug, Clone)]
pub(crate) struct Entity {
    pub hash: KeyHash,
    pub key: Key<'static>,
    /// Bucket and row of the latest core record.
    pub bucket: u64,
    pub row: u64,
    pub version: Option<u64>,
    /// Next expected sequence number; 0 means "no sequencer state" (1 is
    /// expected).
    pub next: u64,
    /// When the current gap opened (0: none).
    pub gap_since: u64,
    /// Every delivered event below it is acknowledged (meaningful while
    /// `unacked` is not empty).
    pub acked: u64,
    /// Events at or past `next`, waiting for their predecessor.
    pub parked: BTreeMap<u64, Stored>,
    pub held: BTreeMap<u64, Stored>,
    /// No core record of this incarnation is written yet: the first one
    /// says so (see [`Entity::core_payload`]), so replay forgets whatever an
    /// earlier incarnation (one that expired) left in the log.
    pub fresh: bool,
    /// Events delivered and not yet acknowledged (`acked <= seq < next`).
    pub unacked: BTreeMap<u64, Stored>,
}

/// A parked or held event: the kind of its latest record, its payload,
/// when it was parked (or, held, the missing predecessor and since when),
/// and the bucket of its record.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub kind: Kind,
    pub payload: Vec<u8>,
    pub aux: u64,
    pub aux2: u64,
    pub bucket: u64,
}

impl Entity {
    pub(crate) fn new(hash: KeyHash, key: &Key<'_>) -> Entity {
        Entity {
            hash,
            key: key.clone().into_owned(),
            bucket: 0,
            row: 0,
            version: None,
            next: 0,
            gap_since: 0,
            acked: 0,
            parked: BTreeMap::new(),
            held: BTreeMap::new(),
            unacked: BTreeMap::new(),
            fresh: true,
        }
    }

    fn expected(&self) -> u64 {
        self.next.max(1)
    }

    /// After replay, where every stored event sits in `parked` or `held`:
    /// drops those below the ack mark (consumed), and moves those from it
    /// to `next` (delivered) to `unacked`.
    pub(crate) fn trim(&mut self) {
        let next = self.expected();
        let acked = self.acked.min(next);
        for map in [&mut self.parked, &mut self.held] {
            let waiting = map.split_off(&next);
            let mut delivered = std::mem::replace(map, waiting);
            self.unacked.append(&mut delivered.split_off(&acked));
        }
    }

    /// Whether any event is stored: such an entity never expires.
    pub(crate) fn has_events(&self) -> bool {
        !self.parked.is_empty() || !self.held.is_empty() || !self.unacked.is_empty()
    }

    /// Every stored event, by sequence number within each kind.
    fn events_mut(&mut self) -> impl Iterator<Item = (&u64, &mut Stored)> {
        self.parked
            .iter_mut()
            .chain(self.held.iter_mut())
            .chain(self.unacked.iter_mut())
    }

    /// The stored event `seq`, wherever it is.
    pub(crate) fn event_mut(&mut self, seq: u64) -> Option<&mut Stored> {
        self.parked
            .get_mut(&seq)
            .or(self.held.get_mut(&seq))
            .or(self.unacked.get_mut(&seq))
    }

    /// Records that `ev` (sequence number `seq`) was handed back.
    fn deliver(&mut self, seq: u64, ev: Stored) {
        if self.unacked.is_empty() {
            self.acked = seq;
        }
        self.unacked.insert(seq, ev);
    }

    /// The core record's payload: empty ("everything delivered is
    /// acknowledged") or the ack mark (8 bytes) while something is
    /// unacknowledged; the first core record of an incarnation adds a
    /// flags byte (`FRESH`) after the mark (the mark then always there).
    fn core_payload(&self) -> Vec<u8> {
        let acked = if self.unacked.is_empty() {
            self.next
        } else {
            self.acked
        };
        match (self.fresh, self.unacked.is_empty()) {
            (false, true) => Vec::new(),
            (false, false) => acked.to_le_bytes().to_vec(),
            (true, _) => {
                let mut v = acked.to_le_bytes().to_vec();
                v.push(FRESH);
                v
            }
        }
    }
}

/// The flag of an incarnation's first core record (see
/// [`Entity::core_payload`]).
const FRESH: u8 = 1;

fn record<'a>(kind: Kind, key: &'a Key<'_>, at: u64, expires: u64) -> RecordRef<'a> {
    RecordRef {
        kind,
        idx: 0,
        at,
        expires,
        scope: key.scope(),
        id: key.id(),
        attempt: 0,
        token: 0,
        first_at: 0,
        lease_until: 0,
        params: 0,
        outcome_tag: TAG_RAW,
        outcome: &[],
    }
}

impl Inner {
    fn entity_expiry(&self, now: u64) -> u64 {
        now.saturating_add(self.cfg.entity_retention_ms)
    }

    /// Appends the entity's core record; the bucket never moves earlier.
    pub(crate) fn log_core(&self, batch: &mut Batch, e: &mut Entity, now: u64) -> u64 {
        let g = self.cfg.granularity_ms;
        let key = e.key.clone();
        let mut rec = record(Kind::Entity, &key, now, self.entity_expiry(now));
        rec.token = e.version.map_or(0, |v| v.saturating_add(1));
        rec.first_at = e.next;
        rec.lease_until = e.gap_since;
        let mark = e.core_payload();
        e.fresh = false;
        rec.outcome = &mark;
        let bucket = (rec.expires / g).max(e.bucket);
        rec.expires = rec.expires.max(bucket.saturating_mul(g));
        let bucket = self.writable_bucket(bucket, &mut rec);
        let row = batch.push(bucket, &mut rec);
        e.bucket = bucket;
        e.row = row;
        row
    }

    /// Appends the record of stored event `seq` (Park or Hold, as
    /// `ev.kind`); returns its bucket.
    pub(crate) fn log_event(
        &self,
        batch: &mut Batch,
        key: &Key<'_>,
        seq: u64,
        ev: &Stored,
        now: u64,
    ) -> u64 {
        let g = self.cfg.granularity_ms;
        let mut rec = record(ev.kind, key, now, self.entity_expiry(now));
        rec.token = seq;
        rec.first_at = ev.aux;
        rec.lease_until = ev.aux2;
        rec.outcome = &ev.payload;
        let bucket = self.writable_bucket(rec.expires / g, &mut rec);
        batch.push(bucket, &mut rec);
        bucket
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
            ev.kind = Kind::Hold;
            ev.aux = missing;
            ev.aux2 = since;
            ev.bucket = self.log_event(batch, &key, seq, &ev, now);
            tracing::warn!(key = %key, seq, missing, "dedupkv: event held, its predecessor is missing");
            e.held.insert(seq, ev);
        }
        n
    }
}

/// Refuses `u64::MAX` as a version: the Entity record stores version + 1.
fn check_version(version: u64) -> Result<()> {
    if version == u64::MAX {
        return Err(Error::InvalidArgument {
            what: "version",
            reason: "u64::MAX is reserved; versions run from 0 to u64::MAX - 1".into(),
        });
    }
    Ok(())
}

/// Refuses sequence numbers outside `1..u64::MAX`: the sequencer starts at
/// 1, and the number after the last one must be representable.
fn check_seq(seq: u64) -> Result<()> {
    if seq == 0 || seq == u64::MAX {
        return Err(Error::InvalidArgument {
            what: "seq",
            reason: format!("{seq} is outside 1..=u64::MAX - 1 (sequences start at 1)"),
        });
    }
    Ok(())
}

impl Store {
    fn entity_hash(&self, entity: &Key<'_>) -> Result<KeyHash> {
        self.inner.check_key(entity)?;
        Ok(self.inner.hasher.hash_entity(entity.scope(), entity.id()))
    }

    /// What every write on an entity starts with: validate, refuse if
    /// poisoned, hash, read the clock. Returns the hash, now and the bucket.
    fn entity_write_start(&self, entity: &Key<'_>) -> Result<(KeyHash, u64, u64)> {
        let h = self.entity_hash(entity)?;
        self.inner.log.check()?;
        let (now, nb) = self.inner.time()?;
        Ok((h, now, nb))
    }

    /// Compares `version` with the entity's recorded version and advances
    /// it if newer — atomically (under the entity's shard lock) and durably
    /// (one commit) before answering.
    ///
    /// Versions are any `u64` below `u64::MAX` that grows with each change
    /// of the entity: a
    /// per-entity sequence or revision counter, an upstream `updated_at` in
    /// microseconds (ties between two updates in the same microsecond are
    /// then answered `Duplicate`), or a logical clock such as a Lamport
    /// timestamp shifted left with a writer id in the low bits so no two
    /// writers produce the same value. An entity whose state expired
    /// (after `entity_retention`) accepts its next version as the first.
    ///
    /// # Concurrent calls on the same entity
    /// They are linearized: each sees the version left by the previous one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty scope or id or the version
    /// `u64::MAX` (reserved); [`Error::InvalidInput`] for a key over the
    /// limits; [`Error::Poisoned`] after a failed commit.
    ///
    /// # Examples
    /// See [`Advance`].
    pub fn advance(&self, entity: &Key<'_>, version: u64) -> Result<Advance> {
        check_version(version)?;
        let inner = &*self.inner;
        let (h, now, nb) = self.entity_write_start(entity)?;
        let mut shard = inner.index.lock(h);
        let e = shard.entity_mut(h, nb, entity);
        let answer = match e.version {
            Some(cur) if version < cur => Advance::Stale { current: cur },
            Some(cur) if version == cur => Advance::Duplicate,
            previous => Advance::Applied { previous },
        };
        let row = if let Advance::Applied { .. } = answer {
            e.version = Some(version);
            let mut batch = inner.log.batch()?;
            let row = inner.log_core(&mut batch, e, now);
            drop(batch);
            shard.counters.versions_applied += 1;
            Some(row)
        } else {
            let row = e.row;
            shard.counters.versions_stale += u64::from(matches!(answer, Advance::Stale { .. }));
            drop(shard);
            inner.settle_seen(row)?;
            return Ok(answer);
        };
        drop(shard);
        if let Some(row) = row {
            inner.log.settle(row)?;
        }
        Ok(answer)
    }

    /// Records an update event as handled and checks/advances its entity's
    /// version, in one step: both decisions are made under both shard locks
    /// and written in one commit, so an event is never recorded as processed
    /// while its version is lost, or the reverse. A stale event is recorded
    /// as handled (its redeliveries are cheap duplicates) and reported stale.
    ///
    /// # Errors
    /// As [`advance`](Self::advance).
    ///
    /// # Examples
    /// See [`Update`].
    pub fn apply_event(&self, event: &Key<'_>, entity: &Key<'_>, version: u64) -> Result<Update> {
        check_version(version)?;
        let inner = &*self.inner;
        inner.check_key(event)?;
        let he = inner.hasher.hash(event.scope(), event.id());
        let hn = self.entity_hash(entity)?;
        inner.log.check()?;
        let (now, nb) = inner.time()?;
        let (sa, sb) = (inner.index.shard_of(he), inner.index.shard_of(hn));
        let (answer, row) = if sa == sb {
            let mut shard = inner.index.lock_shard(sa);
            decide_event(
                inner, &mut shard, None, event, he, entity, hn, version, now, nb,
            )?
        } else {
            // Lock in shard order so two such calls never deadlock.
            let (mut ev, mut en) = if sa < sb {
                let ev = inner.index.lock_shard(sa);
                (ev, inner.index.lock_shard(sb))
            } else {
                let en = inner.index.lock_shard(sb);
                (inner.index.lock_shard(sa), en)
            };
            decide_event(
                inner,
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
        if matches!(answer, Update::DuplicateEvent) {
            inner.settle_seen(row)?;
        } else {
            inner.log.settle(row)?;
        }
        Ok(answer)
    }

    /// Feeds one event of a gapless per-entity sequence (1, 2, 3, …) and
    /// returns what is now deliverable in order.
    ///
    /// - The next expected event: [`Sequenced::Delivered`] with it and every
    ///   parked (or held) successor it unblocks; the entity moves on. They
    ///   stay stored until [`ack`](Self::ack)ed.
    /// - An event handed back and not acknowledged yet: delivered again,
    ///   with this call's payload, followed by every unacknowledged event
    ///   after it (at-least-once hand-back).
    /// - An early event: parked durably ([`Sequenced::Parked`]) until its
    ///   predecessor lands. If the gap stays open longer than `max_hold`,
    ///   the parked events move to the holding area ([`Store::held`]) with
    ///   the reason "predecessor N missing since T"; they are never dropped.
    /// - An acknowledged, skipped, parked or held event:
    ///   [`Sequenced::Duplicate`].
    ///
    /// Sequence numbers run from 1 to `u64::MAX - 1`. A new entity expects 1.
    /// If an entity's state expired (no event for
    /// `entity_retention`), it starts again at 1: a later number waits, is
    /// held after `max_hold`, and [`release_held`](Self::release_held)
    /// accepts it as the new start.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for the sequence numbers 0 and
    /// `u64::MAX` (they run from 1 to `u64::MAX - 1`);
    /// [`Error::InvalidInput`] for a key over the limits or a payload over
    /// `max_outcome_len`; [`Error::Poisoned`] after a failed commit.
    ///
    /// # Examples
    /// See [`Sequenced`].
    pub fn sequence(&self, entity: &Key<'_>, seq: u64, payload: &[u8]) -> Result<Sequenced> {
        check_seq(seq)?;
        let inner = &*self.inner;
        inner.check_payload(payload)?;
        let (h, now, nb) = self.entity_write_start(entity)?;
        let mut shard = inner.index.lock(h);
        let e = shard.entity_mut(h, nb, entity);
        let mut batch = inner.log.batch()?;
        if e.fresh {
            // Its events are written before its core record below: mark
            // the incarnation first, so replay drops only what came before.
            inner.log_core(&mut batch, e, now);
        }
        let moved = inner.hold_overdue(&mut batch, e, now);
        let next = e.expected();
        let mut again = false;
        let answer = if e.unacked.contains_key(&seq) {
            // A redelivery of an event handed back but not acknowledged:
            // hand it back again, with what followed it.
            again = true;
            let mut out = vec![Delivered {
                seq,
                payload: payload.to_vec(),
            }];
            out.extend(e.unacked.range(seq + 1..).map(|(s, ev)| Delivered {
                seq: *s,
                payload: ev.payload.clone(),
            }));
            Sequenced::Delivered(out)
        } else if seq < next || e.parked.contains_key(&seq) || e.held.contains_key(&seq) {
            Sequenced::Duplicate
        } else if seq == next {
            // Stored like a parked event until it is acknowledged.
            let mut ev = Stored {
                kind: Kind::Park,
                payload: payload.to_vec(),
                aux: now,
                aux2: 0,
                bucket: 0,
            };
            let key = e.key.clone();
            ev.bucket = inner.log_event(&mut batch, &key, seq, &ev, now);
            let mut out = vec![Delivered {
                seq,
                payload: payload.to_vec(),
            }];
            e.deliver(seq, ev);
            let mut n = seq + 1;
            while let Some(ev) = e.parked.remove(&n).or_else(|| e.held.remove(&n)) {
                out.push(Delivered {
                    seq: n,
                    payload: ev.payload.clone(),
                });
                e.deliver(n, ev);
                n += 1;
            }
            e.next = n;
            e.gap_since = if e.parked.is_empty() { 0 } else { now };
            Sequenced::Delivered(out)
        } else {
            if e.gap_since == 0 {
                e.gap_since = now;
            }
            let ev = Stored {
                kind: Kind::Park,
                payload: payload.to_vec(),
                aux: now,
                aux2: 0,
                bucket: 0,
            };
            let key = e.key.clone();
            let bucket = inner.log_event(&mut batch, &key, seq, &ev, now);
            e.parked.insert(seq, Stored { bucket, ..ev });
            if e.next == 0 {
                e.next = 1;
            }
            Sequenced::Parked
        };
        let row = if (again || matches!(answer, Sequenced::Duplicate)) && moved == 0 {
            let row = e.row;
            drop(batch);
            match &answer {
                Sequenced::Delivered(v) => shard.counters.seq_delivered += v.len() as u64,
                _ => shard.counters.seq_duplicates += 1,
            }
            drop(shard);
            inner.settle_seen(row)?;
            return Ok(answer);
        } else {
            inner.log_core(&mut batch, e, now)
        };
        drop(batch);
        match &answer {
            Sequenced::Delivered(v) => shard.counters.seq_delivered += v.len() as u64,
            Sequenced::Parked => shard.counters.seq_parked += 1,
            Sequenced::Duplicate => shard.counters.seq_duplicates += 1,
        }
        shard.counters.seq_held += moved as u64;
        drop(shard);
        inner.log.settle(row)?;
        Ok(answer)
    }

    /// The entity's events in the holding area, in sequence order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty scope or id,
    /// [`Error::InvalidInput`] for a key over the limits.
    ///
    /// # Examples
    /// See [`Held`].
    pub fn held(&self, entity: &Key<'_>) -> Result<Vec<Held>> {
        self.stored_events(
            entity,
            |e| &e.held,
            |seq, ev| Held {
                seq,
                payload: ev.payload.clone(),
                missing: ev.aux,
                since: to_system_time(ev.aux2),
                reason: format!("predecessor {} missing since {}", ev.aux, rfc3339(ev.aux2)),
            },
        )
    }

    /// The events of one of an entity's stored sets, in sequence order.
    fn stored_events<T>(
        &self,
        entity: &Key<'_>,
        set: impl Fn(&Entity) -> &BTreeMap<u64, Stored>,
        show: impl Fn(u64, &Stored) -> T,
    ) -> Result<Vec<T>> {
        let inner = &*self.inner;
        let h = self.entity_hash(entity)?;
        let (_, nb) = inner.time()?;
        let shard = inner.index.lock(h);
        Ok(shard.entity(h, nb).map_or_else(Vec::new, |e| {
            set(e).iter().map(|(seq, ev)| show(*seq, ev)).collect()
        }))
    }

    /// Gives up waiting for missing predecessors: delivers every held and
    /// parked event of the entity in sequence order (gaps and all), and
    /// moves the entity past the last one. Like those `sequence` hands
    /// back, they stay stored until [`ack`](Self::ack)ed.
    ///
    /// # Errors
    /// As [`advance`](Self::advance).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, ManualClock, Store};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).max_hold(Duration::from_secs(60)).open(dir.path().join("s.redb"))?;
    /// let acct = Key::new("bank", "acct-1");
    /// store.sequence(&acct, 7, b"seventh")?; // 1..=6 never come
    /// clock.advance(Duration::from_secs(61));
    /// store.sweep_parked()?;
    /// let out = store.release_held(&acct)?;
    /// assert_eq!(out[0].seq, 7);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn release_held(&self, entity: &Key<'_>) -> Result<Vec<Delivered>> {
        let inner = &*self.inner;
        let (h, now, nb) = self.entity_write_start(entity)?;
        let mut shard = inner.index.lock(h);
        let e = shard.entity_mut(h, nb, entity);
        if e.held.is_empty() {
            return Ok(Vec::new());
        }
        let mut all = std::mem::take(&mut e.held);
        all.append(&mut e.parked);
        let mut out = Vec::with_capacity(all.len());
        for (seq, ev) in all {
            out.push(Delivered {
                seq,
                payload: ev.payload.clone(),
            });
            e.deliver(seq, ev);
        }
        e.next = out.last().map_or(e.expected(), |d| d.seq + 1);
        e.gap_since = 0;
        let row = {
            let mut batch = inner.log.batch()?;
            inner.log_core(&mut batch, e, now)
        };
        shard.counters.seq_delivered += out.len() as u64;
        drop(shard);
        inner.log.settle(row)?;
        Ok(out)
    }

    /// Acknowledges every event of the entity handed back with a sequence
    /// number up to `upto` (inclusive): the store forgets their payloads,
    /// and their redeliveries answer [`Sequenced::Duplicate`]. Returns how
    /// many it acknowledged (0 if they all were already, or none was
    /// handed back); events not handed back yet are not affected.
    ///
    /// The consumer's loop: handle every event [`sequence`](Self::sequence)
    /// (or [`release_held`](Self::release_held)) hands back, `ack` them,
    /// then acknowledge the triggering message upstream. A crash anywhere
    /// in between loses nothing: the upstream redelivers the trigger, and
    /// its redelivery hands back again everything not acknowledged from it
    /// on; [`unacked`](Self::unacked) lists them too.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a key over the limits;
    /// [`Error::Poisoned`] after a failed commit.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, Sequenced, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let acct = Key::new("bank", "acct-1");
    /// store.sequence(&acct, 2, b"second")?; // parked
    /// let Sequenced::Delivered(events) = store.sequence(&acct, 1, b"first")? else { unreachable!() };
    /// for event in &events {
    ///     // handle it (idempotently: a crash before `ack` hands it back again)
    /// }
    /// assert_eq!(store.ack(&acct, events.last().unwrap().seq)?, 2);
    /// assert_eq!(store.sequence(&acct, 1, b"first")?, Sequenced::Duplicate);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn ack(&self, entity: &Key<'_>, upto: u64) -> Result<usize> {
        let inner = &*self.inner;
        let (h, now, nb) = self.entity_write_start(entity)?;
        let mut shard = inner.index.lock(h);
        let Some(e) = shard.entity_live_mut(h, nb) else {
            return Ok(0);
        };
        let mark = upto.saturating_add(1).min(e.expected());
        let still = e.unacked.split_off(&mark);
        let acked = std::mem::replace(&mut e.unacked, still).len();
        if acked == 0 {
            let row = e.row;
            drop(shard);
            inner.settle_seen(row)?;
            return Ok(0);
        }
        e.acked = e.acked.max(mark);
        let row = {
            let mut batch = inner.log.batch()?;
            inner.log_core(&mut batch, e, now)
        };
        drop(shard);
        inner.log.settle(row)?;
        Ok(acked)
    }

    /// The entity's events that were handed back and not acknowledged yet
    /// ([`ack`](Self::ack)), in sequence order, with their payloads: what a
    /// consumer restarting after a crash must handle again.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a key over the limits.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let acct = Key::new("bank", "acct-1");
    /// store.sequence(&acct, 1, b"first")?; // handed back, then a crash
    /// let again = store.unacked(&acct)?;
    /// assert_eq!((again[0].seq, &again[0].payload[..]), (1, &b"first"[..]));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn unacked(&self, entity: &Key<'_>) -> Result<Vec<Delivered>> {
        self.stored_events(
            entity,
            |e| &e.unacked,
            |seq, ev| Delivered {
                seq,
                payload: ev.payload.clone(),
            },
        )
    }

    /// Moves parked events whose gap has been open longer than `max_hold`
    /// to the holding area, for every entity; returns how many moved. The
    /// background evictor runs it on every tick; `sequence` does it for its
    /// own entity.
    ///
    /// # Errors
    /// [`Error::Poisoned`] after a failed commit.
    ///
    /// # Examples
    /// See [`Held`].
    pub fn sweep_parked(&self) -> Result<usize> {
        self.inner.sweep_parked()
    }
}

impl Inner {
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
    let stored = |aux2| Stored {
        kind: rec.kind,
        payload: rec.outcome.to_vec(),
        aux: rec.first_at,
        aux2,
        bucket,
    };
    match rec.kind {
        Kind::Entity => {
            let (acked, flags) = match *rec.outcome {
                [] => (rec.first_at, 0),
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
                        rec.outcome.len()
                    )));
                }
            };
            if flags & FRESH != 0 {
                // A new incarnation: what an expired one left is not its.
                *e = Entity::new(h, &key);
                e.fresh = false;
            }
            e.version = rec.token.checked_sub(1);
            e.next = rec.first_at;
            e.gap_since = rec.lease_until;
            e.acked = acked;
            e.bucket = bucket;
            e.row = row;
        }
        Kind::Park => {
            e.held.remove(&rec.token);
            e.parked.insert(rec.token, stored(0));
        }
        Kind::Hold => {
            e.parked.remove(&rec.token);
            e.held.insert(rec.token, stored(rec.lease_until));
        }
        _ => {}
    }
    Ok(())
}

/// Decides an update event under its shard lock(s): `en` is the entity's
/// shard when it differs from the event's.
#[allow(clippy::too_many_arguments)]
fn decide_event(
    inner: &Inner,
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
    if let Some(slot) = Inner::live(ev, he, nb) {
        ev.counters.duplicates += 1;
        return Ok((Update::DuplicateEvent, slot.row(inner.log.open_row())));
    }
    let mut batch = inner.log.batch()?;
    let mut row = inner.append_insert(ev, &mut batch, he, event, now);
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
        row = row.max(inner.log_core(&mut batch, e, now));
        en.counters.versions_applied += 1;
    } else {
        en.counters.versions_stale += u64::from(matches!(answer, Update::Stale { .. }));
    }
    Ok((answer, row))
}
