//! The ordering calls of the face: per-entity versions and the sequencer
//! (the engine's `order` room does the work).

#[cfg(doc)]
use crate::Error;
use crate::contract::{Order, Settle};
use crate::types::{Advance, Delivered, Held, SequenceOptions, Sequenced, Unacked, Update};
use crate::{Key, Result, Store};

impl Store {
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
        self.tell(Order::advance(self, entity, version)?)
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
        self.tell(Order::apply_event(self, event, entity, version)?)
    }

    /// Feeds one event of a gapless per-entity sequence (1, 2, 3, …) and
    /// returns what is now deliverable in order.
    ///
    /// - The next expected event: [`Sequenced::Delivered`] with it and every
    ///   parked (or held) successor it unblocks; the entity moves on. They
    ///   stay stored until [`ack`](Self::ack)ed, and are held for this
    ///   caller for the hand-back lease (`handback_lease`, default 30 s).
    /// - An event handed back and not acknowledged yet, while its
    ///   hand-back's lease is live: [`Sequenced::Handling`], with the
    ///   lease. Another consumer is handling it; this one must not.
    /// - An event handed back and not acknowledged yet, after its lease
    ///   lapsed or a restart of the store (its handler is gone): delivered
    ///   again, with this call's payload, followed by the unacknowledged
    ///   events after it up to the first one another live hand-back holds,
    ///   all held for this caller now (at-least-once, for crashes and
    ///   lapses only).
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
    /// # Concurrent calls on the same entity
    /// They are linearized under the entity's shard lock: of two consumers
    /// redelivering one event at once, one is handed it and the other is
    /// told [`Sequenced::Handling`] until the first acknowledges it
    /// ([`Sequenced::Duplicate`] from then on) or its lease lapses.
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
        self.sequence_with(entity, seq, payload, &SequenceOptions::new())
    }

    /// [`sequence`](Self::sequence) with this call's own settings (see
    /// [`SequenceOptions`]): what it hands back is held for this call's
    /// lease instead of the store's `handback_lease`.
    ///
    /// # Errors
    /// As `sequence`, and [`Error::InvalidArgument`] for a lease of 0.
    ///
    /// # Examples
    /// See [`SequenceOptions`].
    pub fn sequence_with(
        &self,
        entity: &Key<'_>,
        seq: u64,
        payload: &[u8],
        options: &SequenceOptions,
    ) -> Result<Sequenced> {
        self.tell(Order::sequence(self, entity, seq, payload, options)?)
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
        self.engine_for("held")?.held(entity)
    }

    /// Gives up waiting for missing predecessors: delivers every held and
    /// parked event of the entity in sequence order (gaps and all), and
    /// moves the entity past the last one. Like those `sequence` hands
    /// back, they stay stored until [`ack`](Self::ack)ed and are held for
    /// this caller for the store's `handback_lease`: a redelivery of one
    /// of them meanwhile answers [`Sequenced::Handling`].
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
        self.tell(Order::release_held(self, entity)?)
    }

    /// Acknowledges every event of the entity handed back with a sequence
    /// number up to `upto` (inclusive): the store forgets their payloads,
    /// their hand-backs end, and their redeliveries answer
    /// [`Sequenced::Duplicate`]. Returns how many it acknowledged (0 if
    /// they all were already, or none was handed back); events not handed
    /// back yet are not affected.
    ///
    /// The consumer's loop: handle every event [`sequence`](Self::sequence)
    /// (or [`release_held`](Self::release_held)) hands back, `ack` them,
    /// then acknowledge the triggering message upstream. A crash anywhere
    /// in between loses nothing: the upstream redelivers the trigger, and
    /// its redelivery (once the lease lapsed, or at once after a restart)
    /// hands back again everything not acknowledged from it on;
    /// [`unacked`](Self::unacked) lists them too.
    ///
    /// # Concurrent calls on the same entity
    /// An `ack` is accepted whoever sends it: it says the events were
    /// handled. A handler whose lease lapsed, and whose events were handed
    /// to another meanwhile, acknowledges them when it is done; the second
    /// hand-back ends with it, and the second handler's own `ack` answers
    /// 0. Refusing the late `ack` would not undo the second handling
    /// (already under way), and accepting it loses nothing (the events
    /// were handled): choose a lease longer than a handler's worst time.
    /// `upto` covers every handed-back event below it too, whichever
    /// consumer holds it: with several consumers of one entity, the
    /// sequencer's order is the order of hand-backs, not of handling.
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
        self.tell(Order::ack(self, entity, upto)?)
    }

    /// The entity's events that were handed back and not acknowledged yet
    /// ([`ack`](Self::ack)), in sequence order, with their payloads and
    /// the live hand-back that holds each, if any
    /// ([`Unacked::handling`]): those without one are what a consumer
    /// restarting after a crash must handle again.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a key over the limits.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("s.redb");
    /// let acct = Key::new("bank", "acct-1");
    /// {
    ///     let store = Store::open(&path)?;
    ///     store.sequence(&acct, 1, b"first")?; // handed back, then a crash
    /// }
    /// let store = Store::open(&path)?;
    /// let again = store.unacked(&acct)?;
    /// assert_eq!((again[0].seq, &again[0].payload[..]), (1, &b"first"[..]));
    /// assert!(again[0].handling.is_none()); // its handler is gone
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn unacked(&self, entity: &Key<'_>) -> Result<Vec<Unacked>> {
        self.engine_for("unacked")?.unacked(entity)
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
        self.engine_for("sweep_parked")?.sweep_parked()
    }
}
