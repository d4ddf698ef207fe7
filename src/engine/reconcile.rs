//! Reconciliation: per scope and window, the count and amount sum of the
//! operations completed (and, for a scope that keeps them, their keys),
//! compared with what the system of record counted.
//!
//! A completion's window is the store's time when it completed. It is
//! counted in memory, in its shard's windows (`index::tally`), under the
//! shard lock it holds anyway: a plain `complete` writes its `Complete`
//! record and nothing else; `complete_with_amount` adds an `Amount`
//! record. Windows are folded into the store-wide map by the eviction
//! pass once they end.
//!
//! Invariants:
//! - a window's totals are the latest `Tally` record of it in log order,
//!   plus the `Complete` and `Amount` records of the window after that
//!   one (recovery replays exactly this); its keys are the union of its
//!   `Keys` records and the ids of its `Complete` records;
//! - a `Tally` record is appended with every shard locked, so it counts
//!   exactly the completions appended before it;
//! - before a bucket holding a `Complete`, `Amount`, `Tally` or `Keys`
//!   record of a window still kept leaves the log (eviction, or an open
//!   past it), the window's totals (a `Tally` record) and the keys that
//!   bucket holds (`Keys` records) are appended, so they are committed no
//!   later than the deletion;
//! - a window is kept until `reconcile_retention` after its end, bucket
//!   by bucket like a record expiring then, in memory and in the log.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::write::Batch;
use super::{Config, Engine};
use crate::clock::to_system_time;
use crate::index::Shard;
use crate::index::tally::{Keys, Tallies, Totals, Window};
use crate::records::{KeysBody, Kind, RecordRef};
use crate::types::{Reconciliation, Tally};
use crate::{Error, Result};

/// Keys per `Keys` record, so no record nears the format's limit.
const KEYS_PER_RECORD: usize = 4096;

/// How the open file counts completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counting {
    /// In the shards, recovered from the `Complete` records (format 4).
    InShards,
    /// A `Tally` record with the window's running totals in every
    /// completion's commit, in one store-wide map: what builds that read
    /// format 3 take a window's totals from. Keys are not kept.
    Legacy,
}

/// One completion, as the reconciliation counts it.
pub(crate) struct Completion<'a> {
    pub scope: &'a [u8],
    pub id: &'a [u8],
    pub provider_key: u128,
    /// When it completed, and when its `Complete` record expires.
    pub at: (u64, u64),
    pub amount: i64,
}

impl Engine {
    /// How completions are counted in the open file, as its format says.
    ///
    /// A build that reads format 3 takes a window's latest `Tally` record
    /// as its totals and knows no `Keys` or `Amount` record, so only a
    /// format-4 file is counted `InShards`; a file that stays at format 3
    /// (once upgrades are explicit) keeps getting a `Tally` record per
    /// completion (`Legacy`) until it is upgraded. The file's format is
    /// asked in one place, [`has_format_4_bodies`](Self::has_format_4_bodies).
    #[inline]
    pub(crate) fn counting(&self) -> Counting {
        if self.has_format_4_bodies() {
            Counting::InShards
        } else {
            Counting::Legacy
        }
    }

    /// Counts a completion whose `Complete` record was just appended; the
    /// caller holds the shard lock and the batch lock. Returns the row of
    /// the records it appended (0: none).
    #[inline]
    pub(crate) fn count_completion(
        &self,
        shard: &mut Shard,
        batch: &mut Batch,
        done: &Completion<'_>,
    ) -> u64 {
        let window_ms = self.cfg.tally_window_ms;
        let now = done.at.0;
        let start = now - now % window_ms;
        if self.counting() == Counting::Legacy {
            return self.count_legacy(batch, done, start);
        }
        let w = shard
            .tallies
            .window(done.scope, start, window_ms, || self.keeps_keys(done.scope));
        w.totals.add(Totals {
            count: 1,
            sum: i128::from(done.amount),
        });
        if let Some(keys) = &mut w.keys {
            keys.push(done.id, done.provider_key, now);
        }
        if done.amount == 0 {
            return 0;
        }
        let mut rec = RecordRef::amount(done.scope, done.id, done.at, done.amount);
        self.place_as(batch, None, &mut rec, true).1
    }

    /// [`count_completion`](Self::count_completion) of a `Legacy` file.
    fn count_legacy(&self, batch: &mut Batch, done: &Completion<'_>, start: u64) -> u64 {
        let window_ms = self.cfg.tally_window_ms;
        let mut tallies = self.index.tallies();
        if !tallies.contains_key(done.scope) {
            tallies.insert(done.scope.to_vec(), BTreeMap::new());
        }
        let w = tallies
            .get_mut(done.scope)
            .expect("inserted above")
            .entry(start)
            .or_insert_with(|| Window::new(window_ms, false));
        w.totals.add(Totals {
            count: 1,
            sum: i128::from(done.amount),
        });
        let (id, sum) = (start.to_be_bytes(), w.totals.sum.to_le_bytes());
        let mut rec = RecordRef::tally(
            done.scope,
            &id,
            (done.at.0, self.window_expiry(start, w.length_ms)),
            (w.totals.count, w.length_ms),
            &sum,
        );
        self.place_as(batch, None, &mut rec, true).1
    }

    /// Whether `scope` keeps its completed operations' keys.
    pub(crate) fn keeps_keys(&self, scope: &[u8]) -> bool {
        keeps_keys(&self.cfg, scope)
    }

    /// When a window's records expire: `reconcile_retention` after its end.
    fn window_expiry(&self, start: u64, window_ms: u64) -> u64 {
        window_expiry(&self.cfg, start, window_ms)
    }

    /// Fails for a poisoned store, an empty scope or one over
    /// `max_scope_len`.
    pub(crate) fn check_tally_scope(&self, scope: &[u8]) -> Result<()> {
        self.check_readable()?;
        if scope.is_empty() {
            return Err(Error::InvalidArgument {
                what: "scope",
                reason: "is empty; every operation has a non-empty scope".into(),
            });
        }
        if scope.len() > self.cfg.max_scope {
            return Err(Error::InvalidArgument {
                what: "scope",
                reason: format!(
                    "is {} bytes, longer than max_scope_len ({}): no operation has it",
                    scope.len(),
                    self.cfg.max_scope
                ),
            });
        }
        Ok(())
    }

    /// The keys the windows of `scope` starting in `starts` kept: (window
    /// start, id, provider key, completion time), each once, in order.
    pub(crate) fn keys_of(
        &self,
        scope: &[u8],
        starts: std::ops::RangeInclusive<u64>,
    ) -> Vec<(u64, Vec<u8>, u128, u64)> {
        let _fold = self.index.tally_fold();
        let mut out = Vec::new();
        let mut add = |start: u64, w: &Window| {
            for k in w.keys.iter().flat_map(Keys::iter) {
                out.push((start, k.id.to_vec(), k.provider_key, k.at));
            }
        };
        for i in 0..self.index.shard_count() {
            let shard = self.index.lock_shard(i);
            for (start, w) in shard.tallies.of(scope) {
                if starts.contains(&start) {
                    add(start, w);
                }
            }
        }
        if let Some(windows) = self.index.tallies().get(scope) {
            for (start, w) in windows.range(starts.clone()) {
                add(*start, w);
            }
        }
        // A key can be both in a `Keys` record and in the `Complete`
        // record it came from (a crash between the two commits).
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Every window's totals of `scope` (length and totals, by start):
    /// the store-wide map and the shards' windows added up.
    fn totals_of(&self, scope: &[u8]) -> BTreeMap<u64, (u64, Totals)> {
        let _fold = self.index.tally_fold();
        let mut out: BTreeMap<u64, (u64, Totals)> = BTreeMap::new();
        let mut add = |start: u64, w: &Window| {
            let e = out.entry(start).or_insert((w.length_ms, Totals::default()));
            e.1.add(w.totals);
        };
        for i in 0..self.index.shard_count() {
            let shard = self.index.lock_shard(i);
            for (start, w) in shard.tallies.of(scope) {
                add(start, w);
            }
        }
        if let Some(windows) = self.index.tallies().get(scope) {
            for (start, w) in windows {
                add(*start, w);
            }
        }
        out
    }

    /// Every window's totals of `scope`, oldest first.
    pub(crate) fn tallies(&self, scope: &[u8]) -> Result<Vec<Tally>> {
        self.check_tally_scope(scope)?;
        Ok(self
            .totals_of(scope)
            .into_iter()
            .map(|(start, (window_ms, t))| Tally {
                window_start: to_system_time(start),
                window: Duration::from_millis(window_ms),
                count: t.count,
                amount: t.sum,
            })
            .collect())
    }

    /// Compares `scope`'s totals with `theirs`, window by window: every
    /// window either side counted, oldest first.
    pub(crate) fn reconcile(&self, scope: &[u8], theirs: &[Tally]) -> Result<Reconciliation> {
        crate::contract::reconcile_tallies(
            Duration::from_millis(self.cfg.tally_window_ms),
            &self.tallies(scope)?,
            theirs,
        )
    }
}

/// The windows an eviction pass (or an open) must write again before the
/// buckets holding their records leave the log: the windows to write a
/// `Tally` record for, and the keys to write `Keys` records of.
#[derive(Debug, Default)]
pub(crate) struct TallyCarry {
    windows: BTreeMap<Vec<u8>, BTreeSet<u64>>,
    keys: BTreeMap<Vec<u8>, BTreeMap<u64, (u64, Keys)>>,
}

impl TallyCarry {
    fn window(&mut self, scope: &[u8], start: u64) {
        if let Some(s) = self.windows.get_mut(scope) {
            s.insert(start);
        } else {
            self.windows.insert(scope.to_vec(), BTreeSet::from([start]));
        }
    }

    fn keys(&mut self, scope: &[u8], start: u64, window_ms: u64) -> &mut Keys {
        if !self.keys.contains_key(scope) {
            self.keys.insert(scope.to_vec(), BTreeMap::new());
        }
        &mut self
            .keys
            .get_mut(scope)
            .expect("inserted above")
            .entry(start)
            .or_insert_with(|| (window_ms, Keys::default()))
            .1
    }

    fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.keys.is_empty()
    }
}

/// Notes what a record of a bucket leaving the log takes with it: the
/// window it counts in (if still kept at bucket `nb`), and the keys it
/// holds (for a scope that keeps them). Other kinds are no business of
/// reconciliation.
pub(crate) fn note_leaving(
    cfg: &Config,
    secret: &[u8; 16],
    carry: &mut TallyCarry,
    rec: &RecordRef<'_>,
    nb: u64,
) -> Result<()> {
    let window_ms = cfg.tally_window_ms;
    match rec.kind {
        Kind::Complete | Kind::Amount => {
            let start = rec.at - rec.at % window_ms;
            if !kept(cfg, start, window_ms, nb) {
                return Ok(());
            }
            carry.window(rec.scope, start);
            if rec.kind == Kind::Complete && keeps_keys(cfg, rec.scope) {
                let pk = provider_key_of(secret, rec);
                carry
                    .keys(rec.scope, start, window_ms)
                    .push(rec.id, pk, rec.at);
            }
        }
        Kind::Tally => {
            let (start, window_ms, ..) = rec.tally_totals()?;
            if kept(cfg, start, window_ms, nb) {
                carry.window(rec.scope, start);
            }
        }
        Kind::Keys => {
            let (start, window_ms, body) = rec.window_keys()?;
            if kept(cfg, start, window_ms, nb) && keeps_keys(cfg, rec.scope) {
                let keys = carry.keys(rec.scope, start, window_ms);
                for (id, pk, offset) in body.iter() {
                    keys.push(id, pk, start.saturating_add(offset));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

impl Engine {
    /// Writes what `carry` noted into the open batch: a `Tally` record
    /// per window (with every shard locked, so it counts exactly what was
    /// appended before it) and `Keys` records. The caller commits them
    /// before it deletes the buckets they come from.
    pub(crate) fn carry_tallies(&self, carry: &TallyCarry, now: u64) -> Result<()> {
        if carry.is_empty() {
            return Ok(());
        }
        let _fold = self.index.tally_fold();
        let shards = self.index.lock_all();
        let mut batch = self.log.batch()?;
        let tallies = self.index.tallies();
        for (scope, starts) in &carry.windows {
            for &start in starts {
                let mut w: Option<Window> =
                    tallies
                        .get(scope)
                        .and_then(|m| m.get(&start))
                        .map(|w| Window {
                            keys: None,
                            ..w.clone()
                        });
                for s in &shards {
                    if let Some(x) = s.tallies.get(scope, start) {
                        let w = w.get_or_insert_with(|| Window::new(x.length_ms, false));
                        w.totals.add(x.totals);
                    }
                }
                // Gone from memory: expired.
                let Some(w) = w else { continue };
                let (id, sum) = (start.to_be_bytes(), w.totals.sum.to_le_bytes());
                let mut rec = RecordRef::tally(
                    scope,
                    &id,
                    (now, self.window_expiry(start, w.length_ms)),
                    (w.totals.count, w.length_ms),
                    &sum,
                );
                self.place_as(&mut batch, None, &mut rec, true);
            }
        }
        drop(tallies);
        drop(shards);
        for (scope, windows) in &carry.keys {
            for (&start, (window_ms, keys)) in windows {
                self.log_keys(&mut batch, scope, (start, *window_ms), keys, now);
            }
        }
        Ok(())
    }

    /// Appends `keys` of the window at `start` as `Keys` records.
    fn log_keys(
        &self,
        batch: &mut Batch,
        scope: &[u8],
        (start, window_ms): (u64, u64),
        keys: &Keys,
        now: u64,
    ) {
        let id = start.to_be_bytes();
        let expires = self.window_expiry(start, window_ms);
        let all: Vec<_> = keys.iter().collect();
        for chunk in all.chunks(KEYS_PER_RECORD) {
            let mut body = KeysBody::start();
            for k in chunk {
                KeysBody::push(
                    &mut body,
                    (k.id, k.provider_key, k.at.saturating_sub(start)),
                );
            }
            let mut rec = RecordRef::keys(
                scope,
                &id,
                (now, expires),
                (chunk.len() as u64, window_ms),
                &body,
            );
            self.place_as(batch, None, &mut rec, true);
        }
    }

    /// Moves every window that ended by `now` out of the shards into the
    /// store-wide map, and drops the windows whose retention ended before
    /// bucket `nb`. Run by the eviction pass.
    pub(crate) fn fold_tallies(&self, now: u64, nb: u64) {
        let current = now - now % self.cfg.tally_window_ms;
        let _fold = self.index.tally_fold();
        let mut moved = Vec::new();
        for i in 0..self.index.shard_count() {
            self.index
                .lock_shard(i)
                .tallies
                .take_before(current, &mut moved);
        }
        let mut tallies = self.index.tallies();
        for (scope, start, w) in moved {
            tallies
                .entry(scope)
                .or_default()
                .entry(start)
                .or_insert_with(|| Window::new(w.length_ms, false))
                .merge(w);
        }
        tallies.retain(|_, windows| {
            windows.retain(|start, w| kept(&self.cfg, *start, w.length_ms, nb));
            !windows.is_empty()
        });
    }

    /// Keys of operations and heap bytes the reconciliation windows hold.
    pub(crate) fn tally_usage(&self) -> (usize, usize) {
        let _fold = self.index.tally_fold();
        let mut total = crate::index::tally::usage(&self.index.tallies());
        for i in 0..self.index.shard_count() {
            let (k, b) = self.index.lock_shard(i).tallies.usage();
            total = (total.0 + k, total.1 + b);
        }
        total
    }
}

/// What recovery rebuilds: every kept window, and what the open must
/// write again before it deletes the expired tables.
pub(crate) struct Recovered<'a> {
    cfg: &'a Config,
    secret: [u8; 16],
    nb: u64,
    windows: Tallies,
    carry: TallyCarry,
}

impl<'a> Recovered<'a> {
    /// Nothing recovered yet, at bucket `nb`.
    pub(crate) fn new(cfg: &'a Config, secret: [u8; 16], nb: u64) -> Self {
        Recovered {
            cfg,
            secret,
            nb,
            windows: Tallies::new(),
            carry: TallyCarry::default(),
        }
    }

    /// Applies a replayed record, in log order (from an expired table if
    /// `expired`): a `Tally` sets its window's totals, a `Complete` counts
    /// one, an `Amount` adds to the sum, a `Keys` adds its keys. What an
    /// expired table holds of a kept window is noted for carrying.
    pub(crate) fn apply(&mut self, rec: &RecordRef<'_>, expired: bool) -> Result<()> {
        let cfg = self.cfg;
        match rec.kind {
            Kind::Complete | Kind::Amount => {
                let window_ms = cfg.tally_window_ms;
                let start = rec.at - rec.at % window_ms;
                if !kept(cfg, start, window_ms, self.nb) {
                    return Ok(());
                }
                let keeps = keeps_keys(cfg, rec.scope);
                let secret = self.secret;
                let w = self.window(rec.scope, start, window_ms, keeps);
                if rec.kind == Kind::Amount {
                    w.totals.sum = w.totals.sum.saturating_add(i128::from(rec.amount_value()));
                } else {
                    w.totals.count = w.totals.count.saturating_add(1);
                    if let Some(keys) = &mut w.keys {
                        keys.push(rec.id, provider_key_of(&secret, rec), rec.at);
                    }
                }
            }
            Kind::Tally => {
                let (start, window_ms, count, sum) = rec.tally_totals()?;
                if !kept(cfg, start, window_ms, self.nb) {
                    return Ok(());
                }
                let keeps = keeps_keys(cfg, rec.scope);
                let w = self.window(rec.scope, start, window_ms, keeps);
                w.length_ms = window_ms;
                w.totals = Totals { count, sum };
            }
            Kind::Keys => {
                let (start, window_ms, body) = rec.window_keys()?;
                if !kept(cfg, start, window_ms, self.nb) || !keeps_keys(cfg, rec.scope) {
                    return Ok(());
                }
                let w = self.window(rec.scope, start, window_ms, true);
                if let Some(keys) = &mut w.keys {
                    for (id, pk, offset) in body.iter() {
                        keys.push(id, pk, start.saturating_add(offset));
                    }
                }
            }
            _ => return Ok(()),
        }
        if expired {
            note_leaving(cfg, &self.secret, &mut self.carry, rec, self.nb)?;
        }
        Ok(())
    }

    /// Puts the windows into `index`; returns what the open must carry.
    pub(crate) fn into_index(self, index: &crate::index::ShardedIndex) -> TallyCarry {
        *index.tallies() = self.windows;
        self.carry
    }

    fn window(&mut self, scope: &[u8], start: u64, window_ms: u64, keeps: bool) -> &mut Window {
        if !self.windows.contains_key(scope) {
            self.windows.insert(scope.to_vec(), BTreeMap::new());
        }
        self.windows
            .get_mut(scope)
            .expect("inserted above")
            .entry(start)
            .or_insert_with(|| Window::new(window_ms, keeps))
    }
}

fn keeps_keys(cfg: &Config, scope: &[u8]) -> bool {
    cfg.tally_keys.iter().any(|s| s.as_slice() == scope)
}

fn window_expiry(cfg: &Config, start: u64, window_ms: u64) -> u64 {
    start
        .saturating_add(window_ms)
        .saturating_add(cfg.tally_retention_ms)
}

/// Whether the window at `start` is still kept at bucket `nb`.
fn kept(cfg: &Config, start: u64, window_ms: u64, nb: u64) -> bool {
    window_expiry(cfg, start, window_ms) / cfg.granularity_ms >= nb
}

/// The provider key of the operation a `Complete` record completed.
fn provider_key_of(secret: &[u8; 16], rec: &RecordRef<'_>) -> u128 {
    let c = rec.claim_fields();
    crate::key::provider_key(secret, rec.scope, rec.id, c.first_at, c.params)
}

#[cfg(test)]
mod tests {
    use crate::records::Kind;
    use crate::{Begin, Fingerprint, Key, ManualClock, Result, Store};

    /// The kinds of every record in the store's log, oldest first.
    fn kinds(store: &Store) -> Result<Vec<Kind>> {
        store.flush()?;
        let log = &store.engine_for("kinds")?.log;
        let mut rows = Vec::new();
        for b in log.buckets() {
            log.scan_bucket(b, |n, _, recs| {
                for r in recs {
                    let r = r?;
                    rows.push(((n, r.idx), r.kind));
                }
                Ok(())
            })?;
        }
        rows.sort_by_key(|(at, _)| *at);
        Ok(rows.into_iter().map(|(_, k)| k).collect())
    }

    #[test]
    fn a_plain_complete_writes_its_complete_record_and_nothing_else() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::Error::Io {
            what: "a temporary directory",
            source: e,
        })?;
        let store = Store::builder()
            .clock(ManualClock::new(1_700_000_000_000))
            .open(dir.path().join("s.redb"))?;
        let claim = |id: &str| match store.begin(&Key::new("s", id), Fingerprint::NONE) {
            Ok(Begin::Started(c)) => Ok(c),
            Ok(_) => Err(crate::Error::Corrupt("a fresh key was not started".into())),
            Err(e) => Err(e),
        };
        let c = claim("a")?;
        let before = kinds(&store)?.len();
        store.complete(&c, b"done")?;
        assert_eq!(kinds(&store)?[before..], [Kind::Complete]);
        let c = claim("b")?;
        let before = kinds(&store)?.len();
        store.complete_with_amount(&c, b"done", 250)?;
        assert_eq!(kinds(&store)?[before..], [Kind::Complete, Kind::Amount]);
        let c = claim("c")?;
        let before = kinds(&store)?.len();
        store.complete_with_amount(&c, b"done", 0)?;
        assert_eq!(
            kinds(&store)?[before..],
            [Kind::Complete],
            "an amount of 0 adds nothing"
        );
        let t = store.tallies("s")?;
        assert_eq!((t[0].count, t[0].amount), (3, 250));
        Ok(())
    }
}
