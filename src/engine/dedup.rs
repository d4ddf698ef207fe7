//! Plain deduplication: insert-if-absent, one key or a batch, and forget.

use super::Engine;
use super::input::key_bytes;
use super::write::{Next, Write};
use crate::index::{Pending, Round, Shard, SlotState};
use crate::key::KeyHash;
use crate::records::{ClaimFields, RecordRef};
use crate::types::{self as contract, Basis};
use crate::types::{Forget, InProgress};
use crate::{Key, Result};

impl Engine {
    /// Records `key` if absent, kept for `retention_ms` (the store's if
    /// `None`); `true` if it was new.
    pub(crate) fn insert(
        &self,
        key: &Key<'_>,
        retention_ms: Option<u64>,
    ) -> Result<contract::Pending<bool>> {
        let retention_ms = retention_ms.unwrap_or(self.cfg.retention_ms);
        let (h, now, nb) = self.write_start(key)?;
        let mut shard = self.index.lock(h);
        let w = Write::new(&mut shard, h, nb);
        if let Some(s) = w.live() {
            let row = s.row(self.log.open_row());
            shard.counters.duplicates += 1;
            drop(shard);
            return Ok(contract::Pending::new(false, Basis::read(row)));
        }
        let row = {
            let mut batch = self.log.batch()?;
            let mut rec = insert_record(key, now, retention_ms);
            w.append(self, &mut batch, Next::Inserted, &mut rec)
        };
        shard.counters.new_keys += 1;
        drop(shard);
        Ok(contract::Pending::new(true, Basis::written(row)))
    }

    /// Records many keys in one durable commit; the flag at index `i` says
    /// whether `keys[i]` was new.
    pub(crate) fn insert_batch(&self, keys: &[Key<'_>]) -> Result<contract::Pending<Vec<bool>>> {
        self.check_batch(
            keys.iter()
                .map(|k| self.check_key(k).map(|()| key_bytes(k))),
        )?;
        self.log.check()?;
        let (now, nb) = self.time()?;
        let order = self.by_shard(keys);
        let mut out = vec![false; keys.len()];
        let mut wait_new = 0;
        let mut wait_seen = 0;
        let mut one_shard = |shard: &mut Shard, group: &[(u32, u32, KeyHash)]| -> Result<()> {
            let warm = group.iter().fold(0, |acc, &(_, _, h)| acc ^ shard.touch(h));
            std::hint::black_box(warm);
            let mut batch = self.log.batch()?;
            for &(_, i, h) in group {
                let w = Write::new(shard, h, nb);
                if let Some(s) = w.live() {
                    wait_seen = wait_seen.max(s.row(self.log.open_row()));
                    shard.counters.duplicates += 1;
                    continue;
                }
                let mut rec = insert_record(&keys[i as usize], now, self.cfg.retention_ms);
                let row = w.append(self, &mut batch, Next::Inserted, &mut rec);
                wait_new = wait_new.max(row);
                shard.counters.new_keys += 1;
                out[i as usize] = true;
            }
            Ok(())
        };
        // A shard that is busy (the grower may be rehashing it) is left for
        // last, so the batch does not follow the grower from shard to shard.
        let mut busy = Vec::new();
        for group in order.chunk_by(|a, b| a.0 == b.0) {
            match self.index.try_lock_shard(group[0].0 as usize) {
                Some(mut shard) => one_shard(&mut shard, group)?,
                None => busy.push(group),
            }
        }
        for group in busy {
            one_shard(&mut self.index.lock_shard(group[0].0 as usize), group)?;
        }
        let basis = Basis::written(wait_new).and(Basis::read(wait_seen));
        Ok(contract::Pending::new(out, basis))
    }

    /// Each key's (shard, position in `keys`, hash), grouped by shard and
    /// in input order within a shard: a counting sort, a pass to count and
    /// one to place.
    fn by_shard(&self, keys: &[Key<'_>]) -> Vec<(u32, u32, KeyHash)> {
        let hashed: Vec<(u32, KeyHash)> = keys
            .iter()
            .map(|k| {
                let h = self.hash(k);
                (self.index.shard_of(h) as u32, h)
            })
            .collect();
        // starts[s] = where shard s's keys begin.
        let mut starts = vec![0usize; self.index.shard_count() + 1];
        for &(s, _) in &hashed {
            starts[s as usize + 1] += 1;
        }
        for s in 1..starts.len() {
            starts[s] += starts[s - 1];
        }
        let mut order = vec![(0, 0, KeyHash::default()); keys.len()];
        for (i, &(s, h)) in hashed.iter().enumerate() {
            order[starts[s as usize]] = (s, i as u32, h);
            starts[s as usize] += 1;
        }
        order
    }

    /// Forgets a key on purpose (see `Store::forget`).
    ///
    /// The record forgotten is read outside the shard lock (from its row,
    /// which the read closes if it is still open), and the decision — refuse over a live
    /// claim, or append the Forget record — is made again under the lock
    /// that appends, against the key's state at that moment: several
    /// records of a key can share a row, so a slot still pointing at the
    /// same row does not mean its state is the one first seen.
    pub(crate) fn forget(&self, key: &Key<'_>) -> Result<contract::Pending<Forget>> {
        loop {
            let (h, now, nb) = self.write_start(key)?;
            let mut shard = self.index.lock(h);
            let w = Write::new(&mut shard, h, nb);
            let (bucket, row) = match self.forget_decision(&w, now) {
                Decision::Absent => return Ok(contract::Pending::settled(Forget::NotFound)),
                Decision::Held(row, busy) => {
                    drop(shard);
                    return Ok(held(row, busy));
                }
                Decision::At(bucket, row) => (bucket, row),
            };
            drop(shard);
            // What is forgotten, for the caller's audit. `load` closes the
            // row it reads, so no record can join it afterwards.
            let Some(old) = self.load_closed(key, bucket, row)? else {
                continue; // evicted meanwhile: look again
            };
            let (_, now, nb) = self.write_start(key)?;
            let mut shard = self.index.lock(h);
            let w = Write::new(&mut shard, h, nb);
            match self.forget_decision(&w, now) {
                // Still the closed row that was read: `old` is the key's
                // latest record, and no live claim holds the key.
                Decision::At(b, r) if b == bucket && r == row => {}
                Decision::Held(row, busy) => {
                    drop(shard);
                    return Ok(held(row, busy));
                }
                _ => continue, // written or evicted meanwhile: decide again
            }
            // The forgotten operation's claim fields, for audit.
            let c = ClaimFields {
                attempt: old.attempts,
                token: old.token,
                first_at: old.first_seen,
                lease_until: 0,
                params: old.fingerprint.map_or(0, |f| f.0),
            };
            let at = (now, now.saturating_add(self.cfg.retention_ms));
            let mut rec = RecordRef::forget(key.scope(), key.id(), at, c);
            let kept = Pending {
                hash: h,
                attempt: 0,
                token: 0,
                first_at: old.first_seen,
                lease_until: 0,
                params: 0,
                lease_ms: 0,
                retention_ms: 0,
                any_request: false,
                abandoned: false,
                failed_at: 0,
                round: Round::first(old.first_seen),
            };
            let row = {
                let mut batch = self.log.batch()?;
                let row = w.append(self, &mut batch, Next::Forgotten(kept), &mut rec);
                let key = (h, key.scope(), key.id());
                row.max(self.close_intent(&mut shard, &mut batch, (key, true), c, at))
            };
            shard.counters.forgotten += 1;
            drop(shard);
            return Ok(contract::Pending::new(
                Forget::Forgotten(old),
                Basis::written(row),
            ));
        }
    }

    /// What `forget` may do with the key `w` writes, at `now`: nothing (not
    /// present), refuse (a live attempt holds it; its row and lease), or
    /// forget the record at (bucket, row).
    fn forget_decision(&self, w: &Write<'_>, now: u64) -> Decision {
        let Some(s) = w.live() else {
            return Decision::Absent;
        };
        let open_row = self.log.open_row();
        if s.state() == SlotState::Claimed
            && let Some(p) = w.pending()
            && now < p.lease_until
            && !self.orphaned(p.token)
        {
            let busy = InProgress {
                attempt: p.attempt,
                lease_until: p.lease_until,
                first_at: p.first_at,
            };
            return Decision::Held(s.row(open_row), busy);
        }
        Decision::At(s.bucket(w.now_bucket()), s.row(open_row))
    }
}

/// `forget`'s refusal, answered from the record at `row`.
fn held(row: u64, busy: InProgress) -> contract::Pending<Forget> {
    contract::Pending::new(Forget::InProgress(busy), Basis::read(row))
}

/// [`Engine::forget_decision`]'s answer.
enum Decision {
    Absent,
    Held(u64, InProgress),
    At(u64, u64),
}

/// The Insert record of `key`, written at `now`.
#[inline]
pub(crate) fn insert_record<'k>(key: &'k Key<'_>, now: u64, retention_ms: u64) -> RecordRef<'k> {
    RecordRef::insert(key.scope(), key.id(), now, now.saturating_add(retention_ms))
}
