//! The answers of the ordering calls: [`Advance`], [`Update`],
//! [`Sequenced`], [`Delivered`] and [`Held`].

#[cfg(doc)]
use crate::Store;
use std::time::SystemTime;

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
