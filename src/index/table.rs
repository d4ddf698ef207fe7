//! The slot table: Robin Hood linear probing over inline 24-byte slots.
//!
//! Why not `hashbrown`: its control bytes live apart from the slots, so a
//! lookup misses the cache twice (control group, then slot); and deletions
//! leave tombstones, so a table under steady churn grows to twice the size
//! it needs. Here a lookup reads one slot run that usually fits one or two
//! adjacent cache lines, deletion shifts the run back (no tombstones), and
//! the capacity is any number of slots, grown by a quarter, so the table
//! stays 72–90 % full (about 27–33 bytes per key).
//!
//! Invariants:
//! - an empty slot has `meta == 0` (every occupied slot has a non-zero state);
//! - Robin Hood order: along a run, an entry's distance from its home slot
//!   is at most one more than the previous entry's, so a lookup can stop at
//!   the first entry closer to home than itself;
//! - `home(lo)` maps `lo` onto `0..cap` by a multiply-shift (order
//!   preserving), and the probe sequence wraps at `cap`.

use super::slot::Slot;
use crate::key::KeyHash;

/// Grow when an insert would make the table fuller than 9/10.
const MAX_LOAD_NUM: usize = 9;
const MAX_LOAD_DEN: usize = 10;
const MIN_CAPACITY: usize = 16;

#[derive(Default)]
pub(crate) struct SlotTable {
    slots: Vec<Slot>,
    len: usize,
}

impl SlotTable {
    fn cap(&self) -> usize {
        self.slots.len()
    }

    fn home(&self, lo: u64) -> usize {
        ((u128::from(lo) * self.cap() as u128) >> 64) as usize
    }

    fn dist(&self, pos: usize, lo: u64) -> usize {
        let home = self.home(lo);
        if pos >= home {
            pos - home
        } else {
            pos + self.cap() - home
        }
    }

    fn next(&self, pos: usize) -> usize {
        if pos + 1 == self.cap() { 0 } else { pos + 1 }
    }

    /// Position of the key's slot, if present.
    fn find(&self, h: KeyHash) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mut pos = self.home(h.lo);
        let mut d = 0;
        loop {
            let s = &self.slots[pos];
            if s.is_empty() {
                return None;
            }
            if s.is(h) {
                return Some(pos);
            }
            if self.dist(pos, s.lo) < d {
                return None;
            }
            pos = self.next(pos);
            d += 1;
        }
    }

    pub(crate) fn get(&self, h: KeyHash) -> Option<&Slot> {
        self.find(h).map(|p| &self.slots[p])
    }

    /// Reads the key's home slot and nothing else: independent reads for
    /// many keys let the processor overlap their cache misses, so a batch
    /// touches all its homes first and then works on warm lines.
    pub(crate) fn touch(&self, h: KeyHash) -> u64 {
        if self.slots.is_empty() {
            return 0;
        }
        self.slots[self.home(h.lo)].lo
    }

    pub(crate) fn get_mut(&mut self, h: KeyHash) -> Option<&mut Slot> {
        self.find(h).map(|p| &mut self.slots[p])
    }

    /// Inserts a slot whose key is not in the table.
    pub(crate) fn insert_new(&mut self, slot: Slot) {
        debug_assert!(
            self.find(KeyHash {
                hi: slot.hi,
                lo: slot.lo
            })
            .is_none()
        );
        self.reserve(1);
        self.place(slot);
        self.len += 1;
    }

    /// Robin Hood placement; the table has room.
    fn place(&mut self, mut carry: Slot) {
        let mut pos = self.home(carry.lo);
        let mut d = 0;
        loop {
            let here = self.slots[pos];
            if here.is_empty() {
                self.slots[pos] = carry;
                return;
            }
            let hd = self.dist(pos, here.lo);
            if hd < d {
                self.slots[pos] = carry;
                carry = here;
                d = hd;
            }
            pos = self.next(pos);
            d += 1;
        }
    }

    /// Removes the key's slot, if present, shifting its run back.
    pub(crate) fn remove(&mut self, h: KeyHash) -> bool {
        let Some(mut pos) = self.find(h) else {
            return false;
        };
        loop {
            let next = self.next(pos);
            let s = self.slots[next];
            if s.is_empty() || self.dist(next, s.lo) == 0 {
                break;
            }
            self.slots[pos] = s;
            pos = next;
        }
        self.slots[pos] = Slot::EMPTY;
        self.len -= 1;
        true
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn allocation_size(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    /// Makes room for `additional` more keys within the load limit, growing
    /// by at least a quarter.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let need = self.len + additional;
        if need * MAX_LOAD_DEN <= self.cap() * MAX_LOAD_NUM {
            return;
        }
        let by_load = (need * MAX_LOAD_DEN).div_ceil(MAX_LOAD_NUM);
        let new_cap = by_load.max(self.cap() + self.cap() / 4).max(MIN_CAPACITY);
        let old = std::mem::replace(&mut self.slots, vec![Slot::EMPTY; new_cap]);
        for s in old.into_iter().filter(|s| !s.is_empty()) {
            self.place(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::SlotState;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn key(i: u64) -> KeyHash {
        // Spread, with some keys sharing a home slot.
        KeyHash {
            hi: i,
            lo: i.wrapping_mul(0x9E37_79B9_7F4A_7C15) & !0xff,
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(u64, u64),
        Remove(u64),
    }

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec(
            prop_oneof![
                (0u64..300, 0u64..1000).prop_map(|(k, v)| Op::Put(k, v)),
                (0u64..300).prop_map(Op::Remove),
            ],
            1..2000,
        )) {
            let mut t = SlotTable::default();
            let mut model: HashMap<u64, u64> = HashMap::new();
            for op in ops {
                match op {
                    Op::Put(k, v) => {
                        let h = key(k);
                        match t.get_mut(h) {
                            Some(s) => s.set(SlotState::Inserted, 0, v),
                            None => t.insert_new(Slot::new(h, SlotState::Inserted, 0, v)),
                        }
                        model.insert(k, v);
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(t.remove(key(k)), model.remove(&k).is_some());
                    }
                }
                prop_assert_eq!(t.len(), model.len());
            }
            for k in 0..300 {
                let got = t.get(key(k)).map(|s| s.row(1_000));
                prop_assert_eq!(got, model.get(&k).copied());
            }
            prop_assert!(t.len() * MAX_LOAD_DEN <= t.cap() * MAX_LOAD_NUM);
        }
    }

    #[test]
    fn churn_does_not_grow_the_table() {
        let mut t = SlotTable::default();
        for i in 0..10_000 {
            t.insert_new(Slot::new(key(i), SlotState::Inserted, 0, i));
        }
        let cap = t.cap();
        for i in 10_000..200_000 {
            assert!(t.remove(key(i - 10_000)));
            t.insert_new(Slot::new(key(i), SlotState::Inserted, 0, i));
        }
        assert_eq!(t.cap(), cap);
        assert_eq!(t.len(), 10_000);
        assert!(t.get(key(199_999)).is_some() && t.get(key(189_999)).is_none());
    }

    #[test]
    fn stays_between_72_and_90_percent_full_while_growing() {
        let mut t = SlotTable::default();
        for i in 0..100_000 {
            t.insert_new(Slot::new(key(i), SlotState::Inserted, 0, i));
            if i > 1_000 {
                let load = (t.len() * 1000 / t.cap()) as u32;
                assert!((710..=900).contains(&load), "load {load}/1000 at {i}");
            }
        }
    }
}
