//! Entity state as index data: an entity's version, its sequencer
//! position and gap, its ack mark, and the events it stores (parked, held,
//! delivered but not acknowledged, each delivered one with the lease of its
//! live hand-back). Plain data with named fields; the engine decides, and
//! writes the records (see `engine/order.rs`).

use std::collections::BTreeMap;

use crate::key::{Key, KeyHash};

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

/// A stored event: where it waits, its payload, the bucket of its latest
/// record and, once handed back, when its hand-back's lease ends.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub state: EventState,
    pub payload: Vec<u8>,
    pub bucket: u64,
    /// The end (ms) of the lease of the hand-back that holds it; 0 if none
    /// was given in this run (parked, held, or handed back by an earlier
    /// process). Memory only: it is never written.
    pub handed_until: u64,
}

/// Where a stored event waits (delivered events keep the state they were
/// stored with until they are acknowledged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventState {
    /// Parked at `at`, waiting for its predecessor (or delivered).
    Parked { at: u64 },
    /// Moved to the holding area: its predecessor `missing` had not come
    /// since `since`.
    Held { missing: u64, since: u64 },
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

    pub(crate) fn expected(&self) -> u64 {
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
    pub(crate) fn events_mut(&mut self) -> impl Iterator<Item = (&u64, &mut Stored)> {
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

    /// Records that `ev` (sequence number `seq`) was handed back, held
    /// until `until` (ms).
    pub(crate) fn deliver(&mut self, seq: u64, mut ev: Stored, until: u64) {
        if self.unacked.is_empty() {
            self.acked = seq;
        }
        ev.handed_until = until;
        self.unacked.insert(seq, ev);
    }

    /// The core record's payload: empty ("everything delivered is
    /// acknowledged") or the ack mark (8 bytes) while something is
    /// unacknowledged; the first core record of an incarnation adds a
    /// flags byte (`FRESH`) after the mark (the mark then always there).
    pub(crate) fn core_payload(&self) -> Vec<u8> {
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
pub(crate) const FRESH: u8 = 1;
