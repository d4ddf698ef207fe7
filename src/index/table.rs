//! The slot table: Robin Hood linear probing over inline 24-byte slots.
//!
//! Why not `hashbrown`: its control bytes live apart from the slots, so a
//! lookup misses the cache twice (control group, then slot); and deletions
//! leave tombstones, so a table under steady churn grows to twice the size
//! it needs. Here a lookup reads one slot run that usually fits one or two
//! adjacent cache lines, deletion shifts the run back (no tombstones), and
//! the capacity is any number of slots, grown to 3/4 full, so the table
//! stays 75–90 % full (26.7–32 bytes per key): grown in the background
//! from 88 % (see `grow.rs`), by the inserting caller at 90 %.
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
/// Ask for background growth once an insert makes the table 22/25 (88 %)
/// full.
const PRE_GROW_NUM: usize = 22;
const PRE_GROW_DEN: usize = 25;
/// Growth leaves the table 3/4 full: 32 bytes per key at most, 26.7 at
/// the 90 % limit.
const GROWN_LOAD_NUM: usize = 3;
const GROWN_LOAD_DEN: usize = 4;

/// The answer of a lookup: the key's slot, or the place for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The key's slot is at `pos`.
    Found(usize),
    /// The key is absent; Robin Hood placement would start at `pos`, `dist`
    /// slots from its home.
    Vacant { pos: usize, dist: usize },
}

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

    /// Where the key's slot is, or where a slot for it would go.
    pub(crate) fn probe(&self, h: KeyHash) -> Probe {
        if self.slots.is_empty() {
            // Any insert grows the table first, then places from home.
            return Probe::Vacant { pos: 0, dist: 0 };
        }
        let mut pos = self.home(h.lo);
        let mut d = 0;
        loop {
            let s = &self.slots[pos];
            if s.is_empty() {
                return Probe::Vacant { pos, dist: d };
            }
            // The key itself first: a hit at home needs no distance.
            if s.is(h) {
                return Probe::Found(pos);
            }
            if self.dist(pos, s.lo) < d {
                return Probe::Vacant { pos, dist: d };
            }
            pos = self.next(pos);
            d += 1;
        }
    }

    /// Position of the key's slot, if present.
    fn find(&self, h: KeyHash) -> Option<usize> {
        match self.probe(h) {
            Probe::Found(pos) => Some(pos),
            Probe::Vacant { .. } => None,
        }
    }

    /// The slot a [`Probe::Found`] points at.
    pub(crate) fn at(&self, pos: usize) -> &Slot {
        &self.slots[pos]
    }

    /// The slot a [`Probe::Found`] points at.
    pub(crate) fn at_mut(&mut self, pos: usize) -> &mut Slot {
        &mut self.slots[pos]
    }

    pub(crate) fn get(&self, h: KeyHash) -> Option<&Slot> {
        self.find(h).map(|p| &self.slots[p])
    }

    /// Every occupied slot, in table order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|s| !s.is_empty())
    }

    /// Reads the key's home slot and the two cache lines after it: the
    /// slots an insert walks and shifts (a run at 75–90 % full reaches
    /// about 15 slots, six lines, past a new key's home). Independent
    /// reads for many keys let the processor overlap their cache misses,
    /// so a batch touches all its keys first and then works on warm lines
    /// (measured against reading the home slot alone: `docs/performance.md`).
    pub(crate) fn touch(&self, h: KeyHash) -> u64 {
        let Some(last) = self.slots.len().checked_sub(1) else {
            return 0;
        };
        let home = self.home(h.lo);
        // 24-byte slots: three and six slots on are the next two lines for
        // most places a slot can start within its line (not all: a slot
        // starting 48 or 56 bytes in skips one).
        [0, 3, 6]
            .iter()
            .fold(0, |acc, d| acc ^ self.slots[(home + d).min(last)].lo)
    }

    #[cfg(test)]
    pub(crate) fn get_mut(&mut self, h: KeyHash) -> Option<&mut Slot> {
        self.find(h).map(|p| &mut self.slots[p])
    }

    /// Inserts a slot whose key is not in the table.
    #[cfg(test)]
    pub(crate) fn insert_new(&mut self, slot: Slot) {
        let probe = self.probe(KeyHash {
            hi: slot.hi,
            lo: slot.lo,
        });
        self.insert_vacant(probe, slot);
    }

    /// Inserts a slot where `probe`, made for its key with no change to the
    /// table since, found its place; the lookup is not walked again unless
    /// the table has to grow first.
    pub(crate) fn insert_vacant(&mut self, probe: Probe, slot: Slot) {
        let Probe::Vacant { pos, dist } = probe else {
            debug_assert!(false, "insert_vacant on a key that is present");
            return;
        };
        if self.reserve(1) {
            self.place(slot);
        } else {
            self.shift_in(pos, dist, slot);
        }
        self.len += 1;
    }

    /// Puts `carry` at `pos` (its Robin Hood place, `d` from its home) and
    /// moves the rest of the run one slot on, up to the next empty slot:
    /// the same result as swapping along the run, as one memory move.
    /// Every moved slot stays in home order and one further from home.
    fn shift_in(&mut self, pos: usize, d: usize, carry: Slot) {
        let run = self.slots[pos..].iter().position(Slot::is_empty);
        match run {
            Some(n) => {
                self.slots.copy_within(pos..pos + n, pos + 1);
                self.slots[pos] = carry;
            }
            // The run wraps past the end of the table (rare): step along it.
            None => self.place_from(pos, d, carry),
        }
    }

    /// Robin Hood placement; the table has room.
    fn place(&mut self, carry: Slot) {
        self.place_from(self.home(carry.lo), 0, carry);
    }

    /// Robin Hood placement from `pos`, `d` slots from `carry`'s home.
    fn place_from(&mut self, mut pos: usize, mut d: usize, mut carry: Slot) {
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
    /// to 3/4 full. Returns whether it grew (moving every slot).
    pub(crate) fn reserve(&mut self, additional: usize) -> bool {
        let need = self.len + additional;
        if need * MAX_LOAD_DEN <= self.cap() * MAX_LOAD_NUM {
            return false;
        }
        self.grow_to(Self::grown_cap(need).max(self.cap() + 1));
        true
    }

    /// The capacity that holds `keys` 3/4 full.
    fn grown_cap(keys: usize) -> usize {
        (keys * GROWN_LOAD_DEN).div_ceil(GROWN_LOAD_NUM)
    }

    /// Whether the table is full enough to be grown in the background.
    pub(crate) fn wants_growth(&self) -> bool {
        self.len * PRE_GROW_DEN >= self.cap() * PRE_GROW_NUM
    }

    /// The capacity a background growth of this table would allocate, if
    /// it still [wants growth](Self::wants_growth): 3/4 full now.
    pub(crate) fn early_growth_cap(&self) -> Option<usize> {
        self.wants_growth().then(|| Self::grown_cap(self.len))
    }

    /// Empty slots for a table of `cap`, written through so that its pages
    /// are in memory: the grower allocates them before it takes the shard
    /// lock (see [`grow_early`](Self::grow_early)).
    pub(crate) fn blank(cap: usize) -> Vec<Slot> {
        vec![Slot::EMPTY; cap.max(MIN_CAPACITY)]
    }

    /// Grows into `blank` (empty slots from [`blank`](Self::blank)) if the
    /// table still [wants growth](Self::wants_growth); into a fresh
    /// allocation instead if `blank` would leave it more than 3/4 full.
    /// Returns the allocation no longer used, for the caller to free
    /// after it let go of the shard lock.
    pub(crate) fn grow_early(&mut self, blank: Vec<Slot>) -> Vec<Slot> {
        if !self.wants_growth() {
            return blank;
        }
        let cap = Self::grown_cap(self.len);
        // Inserts while the grower allocated may have outgrown `blank`.
        let blank = if blank.len() >= cap {
            blank
        } else {
            Self::blank(cap)
        };
        debug_assert!(blank.iter().all(Slot::is_empty));
        self.move_into(blank)
    }

    /// Moves every slot into `blank` (all empty, large enough) and returns
    /// the old allocation. (Placing each slot right after the one before,
    /// as home order allows, was faster on its own and changed no
    /// end-to-end figure: the move is bound by memory traffic, so it stays
    /// simple.)
    fn move_into(&mut self, blank: Vec<Slot>) -> Vec<Slot> {
        let old = std::mem::replace(&mut self.slots, blank);
        for s in old.iter().filter(|s| !s.is_empty()) {
            self.place(*s);
        }
        old
    }

    fn grow_to(&mut self, new_cap: usize) {
        self.move_into(Self::blank(new_cap));
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
            assert_robin_hood(&t);
        }

        #[test]
        fn growth_keeps_the_order_and_every_key(
            los in proptest::collection::vec(any::<u64>(), 1..400),
            extra in 1usize..400,
        ) {
            // Keys bunched into few homes, some at the very end (their runs
            // wrap), in random order: growth must keep the Robin Hood order
            // through shared homes and wrapped runs.
            let mut t = SlotTable::default();
            let hashes: Vec<KeyHash> = los
                .iter()
                .enumerate()
                .map(|(i, &lo)| KeyHash {
                    hi: i as u64,
                    lo: if lo % 3 == 0 { u64::MAX - (lo >> 56) } else { lo & !((1 << 58) - 1) | lo >> 60 },
                })
                .collect();
            for h in &hashes {
                if t.get(*h).is_none() {
                    t.insert_new(Slot::new(*h, SlotState::Inserted, 0, 1));
                }
            }
            let len = t.len();
            t.grow_to(t.cap() + extra);
            assert_robin_hood(&t);
            prop_assert_eq!(t.len(), len);
            for h in &hashes {
                prop_assert!(t.get(*h).is_some());
            }
        }
    }

    /// The Robin Hood order of the module docs (a slot away from its home
    /// follows an occupied slot at most one closer to its own home), and
    /// every key found where it is.
    fn assert_robin_hood(t: &SlotTable) {
        let cap = t.cap();
        let occupied = t.slots.iter().filter(|s| !s.is_empty()).count();
        assert_eq!(occupied, t.len(), "occupied slots against the count");
        for p in 0..cap {
            let s = t.slots[p];
            if s.is_empty() {
                continue;
            }
            let d = t.dist(p, s.lo);
            if d > 0 {
                let q = (p + cap - 1) % cap;
                let prev = t.slots[q];
                assert!(
                    !prev.is_empty(),
                    "slot {p}, {d} from home, follows an empty slot"
                );
                assert!(
                    t.dist(q, prev.lo) + 1 >= d,
                    "slot {p} breaks the Robin Hood order"
                );
            }
            assert_eq!(t.find(KeyHash { hi: s.hi, lo: s.lo }), Some(p));
        }
    }

    #[test]
    fn touch_reads_only_inside_the_table() {
        assert_eq!(SlotTable::default().touch(key(1)), 0, "no slots yet");
        let mut t = SlotTable::default();
        t.reserve(1);
        let at_end = KeyHash {
            hi: 1,
            lo: u64::MAX,
        };
        assert_eq!(t.home(at_end.lo), t.cap() - 1);
        t.insert_new(Slot::new(at_end, SlotState::Inserted, 0, 7));
        // The home slot is the last one: the lines after it are not there.
        assert_eq!(t.touch(at_end), u64::MAX);
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
    fn runs_that_wrap_past_the_end_keep_every_key() {
        let mut t = SlotTable::default();
        t.reserve(64);
        let cap = t.cap() as u64;
        // Half the keys live at the last slot, so their run wraps to the
        // front; the other half at the slot before, so each of their
        // inserts shifts a run that wraps.
        let last = |i: u64| KeyHash {
            hi: i,
            lo: u64::MAX - i,
        };
        let before = |i: u64| KeyHash {
            hi: 1 << 40 | i,
            lo: (u128::from(cap - 2) << 64).div_ceil(u128::from(cap)) as u64 + i,
        };
        let n = cap * 4 / 10;
        for i in 0..n {
            t.insert_new(Slot::new(last(i), SlotState::Inserted, 0, i));
        }
        for i in 0..n {
            t.insert_new(Slot::new(before(i), SlotState::Inserted, 0, n + i));
        }
        assert_eq!(t.cap() as u64, cap, "no growth: the runs really wrap");
        assert_eq!(t.home(before(n - 1).lo) as u64, cap - 2);
        for i in 0..n {
            assert_eq!(t.get(last(i)).map(|s| s.row(1 << 20)), Some(i));
            assert_eq!(t.get(before(i)).map(|s| s.row(1 << 20)), Some(n + i));
        }
        for i in (0..n).step_by(2) {
            assert!(t.remove(last(i)) && t.remove(before(i)));
        }
        for i in 0..n {
            assert_eq!(t.get(last(i)).is_some(), i % 2 == 1, "key {i}");
            assert_eq!(t.get(before(i)).is_some(), i % 2 == 1, "key {i}");
        }
    }

    /// A table of 1,000 keys or more that just started to want growth, and
    /// the number of keys in it (`key(0)` up).
    fn filled_to_early_growth() -> (SlotTable, u64) {
        let mut t = SlotTable::default();
        let mut i = 0;
        while t.len() < 1_000 || !t.wants_growth() {
            t.insert_new(Slot::new(key(i), SlotState::Inserted, 0, i));
            i += 1;
        }
        (t, i)
    }

    #[test]
    fn early_growth_starts_at_88_percent_and_keeps_every_key() {
        let (mut t, i) = filled_to_early_growth();
        let (cap, len) = (t.cap(), t.len());
        assert!(len * 25 >= cap * 22 && (len - 1) * 25 < cap * 22);
        let blank = SlotTable::blank(t.early_growth_cap().unwrap());
        let old = t.grow_early(blank);
        assert_eq!(old.len(), cap, "the old slots come back to be freed");
        let grown = t.cap();
        assert_eq!(grown, (len * 4).div_ceil(3), "3/4 full after growing");
        assert!(!t.wants_growth());
        assert_eq!(t.early_growth_cap(), None);
        let unused = t.grow_early(SlotTable::blank(grown * 2));
        assert_eq!(
            unused.len(),
            grown * 2,
            "a table that no longer wants growth hands the blank back"
        );
        assert_eq!(t.cap(), grown, "grows only while it wants to");
        for k in 0..i {
            assert_eq!(t.get(key(k)).map(|s| s.row(1 << 20)), Some(k));
        }
    }

    #[test]
    fn early_growth_allocates_anew_when_inserts_outgrew_the_blank() {
        let (mut t, mut i) = filled_to_early_growth();
        // The grower sized its blank, then more keys came in before it
        // took the lock again.
        let blank = SlotTable::blank(t.early_growth_cap().unwrap());
        let (sized_for, cap_before) = (blank.len(), t.cap());
        for _ in 0..20 {
            t.insert_new(Slot::new(key(i), SlotState::Inserted, 0, i));
            i += 1;
        }
        let handed_back = t.grow_early(blank);
        assert_eq!(t.cap(), (t.len() * 4).div_ceil(3), "3/4 full after growing");
        assert!(t.cap() > sized_for);
        assert_eq!(handed_back.len(), cap_before, "the old slots come back");
        for k in 0..i {
            assert_eq!(t.get(key(k)).map(|s| s.row(1 << 20)), Some(k));
        }
    }

    #[test]
    fn stays_between_75_and_90_percent_full_while_growing() {
        // Grown by the inserting caller only, and with the grower keeping up.
        for background in [false, true] {
            let mut t = SlotTable::default();
            for i in 0..100_000 {
                t.insert_new(Slot::new(key(i), SlotState::Inserted, 0, i));
                if background && let Some(cap) = t.early_growth_cap() {
                    t.grow_early(SlotTable::blank(cap));
                }
                if i > 1_000 {
                    let load = (t.len() * 1000 / t.cap()) as u32;
                    let max = if background { 880 } else { 900 };
                    assert!((749..=max).contains(&load), "load {load}/1000 at {i}");
                }
            }
        }
    }
}
