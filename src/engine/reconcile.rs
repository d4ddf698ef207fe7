//! Reconciliation: per scope and time window, durable counts of completed
//! operations and sums of a caller's amount, compared with what the system
//! of record counted.
//!
//! Invariants:
//! - a completion's count is in the same commit as its Complete record (a
//!   `Tally` record with the window's new totals, appended under the batch
//!   lock), so the counts never disagree with the outcomes after a crash;
//! - the latest `Tally` record of a window wins at recovery; its bucket
//!   never moves earlier, and a window's totals leave memory when their
//!   latest record expires (`reconcile_retention` after the last
//!   completion in it).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::Engine;
use crate::clock::to_system_time;
use crate::index::tally::TallySlot;
use crate::log::commit::Batch;
use crate::log::record::RecordRef;
use crate::types::{Reconciliation, Tally, WindowDiff};
use crate::{Error, Result};

/// A count and an amount sum.
type Totals = (u64, i128);

impl Engine {
    /// Counts one completion of an operation in `scope` at `now` with
    /// `amount`, appending the window's new totals. The caller holds the
    /// batch lock.
    pub(crate) fn count_completion(
        &self,
        batch: &mut Batch,
        scope: &[u8],
        now: u64,
        amount: i64,
    ) -> u64 {
        let window_ms = self.cfg.tally_window_ms;
        let start = now - now % window_ms;
        let mut tallies = self.index.tallies();
        if !tallies.contains_key(scope) {
            tallies.insert(scope.to_vec(), BTreeMap::new());
        }
        let windows = tallies.get_mut(scope).expect("inserted above");
        let slot = windows.entry(start).or_insert(TallySlot {
            window_ms,
            ..TallySlot::default()
        });
        slot.count = slot.count.saturating_add(1);
        slot.sum = slot.sum.saturating_add(i128::from(amount));
        let id = start.to_be_bytes();
        let sum = slot.sum.to_le_bytes();
        let mut rec = RecordRef::tally(
            scope,
            &id,
            (now, now.saturating_add(self.cfg.tally_retention_ms)),
            (slot.count, slot.window_ms),
            &sum,
        );
        let floor = (slot.row > 0).then_some(slot.bucket);
        let (bucket, row) = self.place_as(batch, floor, &mut rec, true);
        slot.bucket = bucket;
        slot.row = row;
        row
    }

    /// Every window's totals of `scope`, oldest first.
    pub(crate) fn tallies(&self, scope: &[u8]) -> Result<Vec<Tally>> {
        self.check_readable()?;
        if scope.is_empty() {
            return Err(Error::InvalidArgument {
                what: "scope",
                reason: "is empty; every operation has a non-empty scope".into(),
            });
        }
        let tallies = self.index.tallies();
        Ok(tallies
            .get(scope)
            .into_iter()
            .flatten()
            .map(|(start, t)| Tally {
                window_start: to_system_time(*start),
                window: Duration::from_millis(t.window_ms),
                count: t.count,
                amount: t.sum,
            })
            .collect())
    }

    /// Compares `scope`'s totals with `theirs`, window by window: every
    /// window either side counted, oldest first.
    pub(crate) fn reconcile(&self, scope: &[u8], theirs: &[Tally]) -> Result<Reconciliation> {
        let ours = self.tallies(scope)?;
        let mut by_start: BTreeMap<SystemTime, (Totals, Totals)> = BTreeMap::new();
        for t in &ours {
            by_start.entry(t.window_start).or_default().0 = (t.count, t.amount);
        }
        for t in theirs {
            let e = &mut by_start.entry(t.window_start).or_default().1;
            e.0 = e.0.saturating_add(t.count);
            e.1 = e.1.saturating_add(t.amount);
        }
        Ok(Reconciliation {
            windows: by_start
                .into_iter()
                .map(|(window_start, (ours, theirs))| WindowDiff {
                    window_start,
                    ours,
                    theirs,
                    missing: ours.0.saturating_sub(theirs.0),
                    extra: theirs.0.saturating_sub(ours.0),
                })
                .collect(),
        })
    }

    /// Applies a replayed `Tally` record (live tables only: an expired one
    /// is gone).
    pub(crate) fn apply_tally(
        tallies: &mut crate::index::tally::Tallies,
        (bucket, row): (u64, u64),
        rec: &RecordRef<'_>,
    ) -> Result<()> {
        let (start, window_ms, count, sum) = rec.tally_totals()?;
        tallies.entry(rec.scope.to_vec()).or_default().insert(
            start,
            TallySlot {
                window_ms,
                count,
                sum,
                bucket,
                row,
            },
        );
        Ok(())
    }

    /// Forgets a window whose latest record is `(b, n)`, being evicted.
    pub(crate) fn evict_tally(&self, (b, n): (u64, u64), rec: &RecordRef<'_>) -> Result<()> {
        let (start, ..) = rec.tally_totals()?;
        let mut tallies = self.index.tallies();
        if let Some(windows) = tallies.get_mut(rec.scope) {
            if windows
                .get(&start)
                .is_some_and(|t| t.bucket == b && t.row == n)
            {
                windows.remove(&start);
            }
            if windows.is_empty() {
                tallies.remove(rec.scope);
            }
        }
        Ok(())
    }
}
