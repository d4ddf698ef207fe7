//! The engine's settings, as the builder validated them.

use crate::{Durability, KeyHashing};

pub(crate) use crate::log::record::{FORMAT_MAX_KEY_PART, FORMAT_MAX_OUTCOME};

/// Settings the store reads on every call.
#[derive(Debug, Clone)]
#[allow(clippy::struct_excessive_bools)] // independent switches, not a state machine
pub(crate) struct Config {
    pub shards: usize,
    pub durability: Durability,
    pub lease_ms: u64,
    pub retention_ms: u64,
    pub granularity_ms: u64,
    pub cache_bytes: usize,
    pub quick_repair: bool,
    pub key_hashing: KeyHashing,
    pub hashing_set: bool,
    pub granularity_set: bool,
    pub max_scope: usize,
    pub max_id: usize,
    pub max_outcome: usize,
    pub expected_keys: usize,
    pub background_eviction: bool,
    pub max_keys: Option<u64>,
    pub max_retry_window_ms: Option<u64>,
    pub entity_retention_ms: u64,
    pub max_hold_ms: u64,
    /// How long a hand-back of the sequencer is held for its handler.
    pub handback_lease_ms: u64,
    pub compact_when_free: Option<f64>,
    pub evict_slice_bytes: usize,
    pub max_batch_bytes: usize,
    /// The length of a reconciliation window, in ms.
    pub tally_window_ms: u64,
    /// How long a window's totals are kept after its end.
    pub tally_retention_ms: u64,
    /// The scopes whose windows keep their completed operations' keys.
    pub tally_keys: Vec<Vec<u8>>,
    /// Where the log closes a row and opens the next (tests lower it).
    pub row_split_bytes: usize,
    /// The `store` label of the metrics bridge's series.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub metrics_label: String,
}
