//! The answers of the ordering calls: [`Advance`], [`Update`],
//! [`Sequenced`], [`Delivered`], [`Handling`], [`Unacked`] and [`Held`];
//! and the per-call settings of the sequencer, [`SequenceOptions`].

use std::time::{Duration, SystemTime};

#[cfg(doc)]
use crate::Store;
use crate::clock::to_system_time;
use crate::key::Key;

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
/// # use dedupkv::{Key, ManualClock, Sequenced, Store};
/// # use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// let clock = ManualClock::new(1_700_000_000_000);
/// let store = Store::builder().clock(clock.clone()).handback_lease(Duration::from_secs(30)).open(dir.path().join("s.redb"))?;
/// let acct = Key::new("bank", "acct-1");
/// assert_eq!(store.sequence(&acct, 2, b"second")?, Sequenced::Parked);
/// let Sequenced::Delivered(events) = store.sequence(&acct, 1, b"first")? else { unreachable!() };
/// let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
/// assert_eq!(seqs, [1, 2]);
/// // Being handled: a redelivery meanwhile is told so, with the lease.
/// let Sequenced::Handling(live) = store.sequence(&acct, 1, b"first")? else { unreachable!() };
/// assert_eq!(live.lease_expires_at(), std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_030_000));
/// // Not acknowledged when the lease lapsed: a redelivery hands both back again.
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(store.sequence(&acct, 1, b"first")?, Sequenced::Delivered(events));
/// store.ack(&acct, 2)?;
/// assert_eq!(store.sequence(&acct, 1, b"first")?, Sequenced::Duplicate);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sequenced {
    /// This event and the successors it unblocked, in order (or, for a
    /// redelivery of an event not acknowledged yet and not being handled,
    /// it and the unacknowledged events after it, handed back again).
    /// They are held for this caller for the hand-back lease: handle them
    /// all, [`ack`](Store::ack) them, then acknowledge this event upstream.
    /// The parked ones were acknowledged upstream when they were parked,
    /// and the store keeps them until `ack`.
    Delivered(Vec<Delivered>),
    /// Early: parked durably until its predecessor lands.
    Parked,
    /// Already acknowledged, or parked or held.
    Duplicate,
    /// Handed back and not acknowledged, and its hand-back's lease is
    /// live: another consumer is handling it. Do not handle it; leave this
    /// event unacknowledged upstream (or redeliver it after the lease), so
    /// that it is handed back again if that consumer never acknowledges it.
    Handling(Handling),
}

/// A live hand-back: an event handed back by [`Store::sequence`] or
/// [`Store::release_held`] and not acknowledged yet, held for its handler
/// until the lease lapses. Leases live in memory: after a restart (the
/// handler's process is gone) every unacknowledged event is handed back
/// at once.
///
/// # Examples
/// See [`Sequenced`] and [`Unacked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handling {
    pub(crate) lease_until: u64,
}

impl Handling {
    /// When the hand-back's lease lapses; from then on a redelivery hands
    /// the event back again.
    ///
    /// # Examples
    /// See [`Sequenced`].
    pub fn lease_expires_at(&self) -> SystemTime {
        to_system_time(self.lease_until)
    }

    /// A live hand-back whose lease lapses at `lease_until` (ms since the
    /// Unix epoch), for a backend outside this crate to answer
    /// [`Sequenced::Handling`] with.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::Handling;
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// let h = Handling::until_millis(1_700_000_030_000);
    /// assert_eq!(h.lease_expires_at(), UNIX_EPOCH + Duration::from_millis(1_700_000_030_000));
    /// ```
    #[must_use]
    pub const fn until_millis(lease_until: u64) -> Handling {
        Handling { lease_until }
    }
}

/// An event handed back and not acknowledged yet, as [`Store::unacked`]
/// lists it.
///
/// # Examples
/// ```
/// # use dedupkv::{Key, ManualClock, Store};
/// # use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// let clock = ManualClock::new(1_700_000_000_000);
/// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
/// let acct = Key::new("bank", "acct-1");
/// store.sequence(&acct, 1, b"first")?;
/// let listed = store.unacked(&acct)?;
/// assert_eq!((listed[0].seq, &listed[0].payload[..]), (1, &b"first"[..]));
/// assert!(listed[0].handling.is_some()); // its handler's lease is live
/// clock.advance(Duration::from_secs(30)); // the default hand-back lease
/// assert!(store.unacked(&acct)?[0].handling.is_none()); // a redelivery hands it back
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unacked {
    /// Its sequence number.
    pub seq: u64,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The live hand-back that holds it, if any; `None`: its lease lapsed
    /// (or its handler's process is gone), and its redelivery hands it
    /// back.
    pub handling: Option<Handling>,
}

/// Settings of one [`Store::sequence_with`] call, instead of the store's.
///
/// # Examples
/// ```
/// use dedupkv::{Key, SequenceOptions, Sequenced, Store};
/// use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let opts = SequenceOptions::new().lease(Duration::from_secs(120)); // a slow handler
/// let acct = Key::new("bank", "acct-1");
/// let Sequenced::Delivered(events) = store.sequence_with(&acct, 1, b"first", &opts)? else {
///     unreachable!()
/// };
/// assert_eq!(store.ack(&acct, events[0].seq)?, 1);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use]
pub struct SequenceOptions {
    pub(crate) lease: Option<Duration>,
}

impl SequenceOptions {
    /// The store's settings for everything.
    ///
    /// # Examples
    /// See [`SequenceOptions`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease of what this call hands back: how long a redelivery of
    /// those events answers [`Sequenced::Handling`] before it hands them
    /// back again. Default: the store's `handback_lease`. Must be at least
    /// 1 ms.
    ///
    /// # Examples
    /// See [`SequenceOptions`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The lease [`lease`](Self::lease) asked for (`None`: the store's
    /// `handback_lease`), for a backend outside this crate to honour.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::SequenceOptions;
    /// use std::time::Duration;
    ///
    /// let o = SequenceOptions::new().lease(Duration::from_secs(120));
    /// assert_eq!(o.requested_lease(), Some(Duration::from_secs(120)));
    /// assert_eq!(SequenceOptions::new().requested_lease(), None);
    /// ```
    #[must_use]
    pub const fn requested_lease(&self) -> Option<Duration> {
        self.lease
    }
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
    /// The entity it belongs to.
    pub entity: Key<'static>,
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
