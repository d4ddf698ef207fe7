//! The optional local cache of finished records
//! ([`PgStoreBuilder::cache`](crate::PgStoreBuilder::cache)): a repeat
//! `begin` or `get` of a key whose operation completed (or failed for
//! good) is answered from this instance's memory, with no round trip.
//!
//! Invariants:
//! - only a record in a final state (`Completed`, `Failed`) read from the
//!   database is kept: such a row changes only when it expires or is
//!   forgotten. Nothing absent, inserted, in progress, retryable or dead
//!   lettered is ever kept, so the cache never answers those;
//! - an entry is answered only before its deadline: the row's expiry
//!   measured from the database's time of the read on this instance's
//!   monotonic clock, started before the read was sent (so never later
//!   than the expiry), and at most `max_age` after the read; with a test
//!   clock, the clock's time against the row's expiry;
//! - a `forget` on this instance removes the key once its commit is done,
//!   and no read that began before that removal may fill it again (the
//!   epoch below). A `forget` on another instance is not seen here: the
//!   entry answers until `max_age` after it was read, at most.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use dedupkv::{Key, Record};
use parking_lot::Mutex;

/// When an entry stops answering.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Deadline {
    /// On this instance's monotonic clock.
    At(Instant),
    /// On the store's test clock (ms).
    ClockMs(i64),
}

struct Entry {
    record: Record,
    deadline: Deadline,
    /// Never answered after this (the `max_age` bound).
    cap: Instant,
    /// Its place in `order` (older places are stale).
    stamp: u64,
}

type Id = (Vec<u8>, Vec<u8>);

struct Inner {
    map: HashMap<Id, Entry>,
    /// Insertion order, for eviction of the oldest when full.
    order: VecDeque<(Id, u64)>,
    stamp: u64,
    /// Bumped by every `forget` of this instance: a fill whose read began
    /// under an older epoch is dropped.
    epoch: u64,
}

/// The cache: at most `entries` records.
pub(crate) struct Cache {
    entries: usize,
    max_age: Duration,
    inner: Mutex<Inner>,
}

/// What a read must note before it is sent, to fill the cache after.
#[derive(Clone, Copy)]
pub(crate) struct Ticket {
    sent: Instant,
    epoch: u64,
}

impl Cache {
    pub(crate) fn new(entries: usize, max_age: Duration) -> Cache {
        Cache {
            entries,
            max_age,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                order: VecDeque::new(),
                stamp: 0,
                epoch: 0,
            }),
        }
    }

    /// The record of `key` if it is kept and still answers (`now_ms`: the
    /// test clock's time, if the store has one).
    pub(crate) fn get(&self, key: &Key<'_>, now_ms: Option<i64>) -> Option<Record> {
        let id = (key.scope().to_vec(), key.id().to_vec());
        let mut inner = self.inner.lock();
        let e = inner.map.get(&id)?;
        let now = Instant::now();
        let live = now < e.cap
            && match (e.deadline, now_ms) {
                (Deadline::At(t), _) => now < t,
                (Deadline::ClockMs(t), Some(n)) => n < t,
                (Deadline::ClockMs(_), None) => false,
            };
        if live {
            return Some(e.record.clone());
        }
        inner.map.remove(&id);
        None
    }

    /// Taken before a read is sent.
    pub(crate) fn ticket(&self) -> Ticket {
        Ticket {
            sent: Instant::now(),
            epoch: self.inner.lock().epoch,
        }
    }

    /// Keeps `record` (final, read by the read `ticket` was taken for;
    /// the row expires at `expires_at`, the database's time of the read
    /// was `db_now`, both ms; `clock`: the store's test clock is in use).
    pub(crate) fn put(
        &self,
        ticket: Ticket,
        record: Record,
        (expires_at, db_now): (i64, i64),
        clock: bool,
    ) {
        if self.entries == 0 || expires_at <= db_now {
            return;
        }
        let deadline = if clock {
            Deadline::ClockMs(expires_at)
        } else {
            let left = u64::try_from(expires_at.saturating_sub(db_now)).unwrap_or(0);
            match ticket.sent.checked_add(Duration::from_millis(left)) {
                Some(t) => Deadline::At(t),
                None => return,
            }
        };
        let Some(cap) = ticket.sent.checked_add(self.max_age) else {
            return;
        };
        let id = (record.key().scope().to_vec(), record.key().id().to_vec());
        let mut inner = self.inner.lock();
        if inner.epoch != ticket.epoch {
            return;
        }
        inner.stamp += 1;
        let stamp = inner.stamp;
        inner.order.push_back((id.clone(), stamp));
        inner.map.insert(
            id,
            Entry {
                record,
                deadline,
                cap,
                stamp,
            },
        );
        while inner.map.len() > self.entries {
            let Some((old, g)) = inner.order.pop_front() else {
                break;
            };
            if inner.map.get(&old).is_some_and(|e| e.stamp == g) {
                inner.map.remove(&old);
            }
        }
        // Stale places (replaced or removed entries) are dropped when
        // they outnumber the entries.
        if inner.order.len() > 2 * self.entries.max(1) {
            let Inner { map, order, .. } = &mut *inner;
            order.retain(|(id, g)| map.get(id).is_some_and(|e| e.stamp == *g));
        }
    }

    /// `key` was forgotten by this instance (its commit is done): removes
    /// it, and refuses fills by reads that began before.
    pub(crate) fn forgot(&self, key: &Key<'_>) {
        let mut inner = self.inner.lock();
        inner.epoch += 1;
        inner.map.remove(&(key.scope().to_vec(), key.id().to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dedupkv::State;

    fn rec(id: &str) -> Record {
        Record::new(Key::new("t", id).into_owned(), State::Completed)
    }

    #[test]
    fn holds_at_most_its_entries_and_stops_at_the_deadline() {
        let c = Cache::new(2, Duration::from_secs(60));
        for id in ["a", "b", "c"] {
            c.put(c.ticket(), rec(id), (2_000, 1_000), true);
        }
        assert!(c.get(&Key::new("t", "a"), Some(1_500)).is_none(), "evicted");
        assert!(c.get(&Key::new("t", "c"), Some(1_999)).is_some());
        assert!(c.get(&Key::new("t", "c"), Some(2_000)).is_none(), "expired");
    }

    #[test]
    fn a_read_begun_before_a_forget_does_not_fill() {
        let c = Cache::new(8, Duration::from_secs(60));
        let t = c.ticket();
        c.forgot(&Key::new("t", "a"));
        c.put(t, rec("a"), (2_000, 1_000), true);
        assert!(c.get(&Key::new("t", "a"), Some(1_500)).is_none());
    }
}
