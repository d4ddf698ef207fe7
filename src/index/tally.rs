//! Reconciliation tallies as index data: per (scope, window start) the
//! count and amount sum of completed operations, and where the window's
//! latest `Tally` record is. A few per scope and window, so one map under
//! one lock, taken inside the log's batch lock (never the other way).

use std::collections::BTreeMap;

/// One window's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TallySlot {
    /// The window's length in ms.
    pub window_ms: u64,
    pub count: u64,
    pub sum: i128,
    /// Bucket and row of its latest `Tally` record.
    pub bucket: u64,
    pub row: u64,
}

/// Every window's totals, by scope, then window start (a completion finds
/// its scope by borrow: the scope is copied only the first time).
pub(crate) type Tallies = BTreeMap<Vec<u8>, BTreeMap<u64, TallySlot>>;
