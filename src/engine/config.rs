//! The engine's settings: their defaults, and the checks the builder's
//! settings must pass before a store opens (the face only collects them).

use crate::index::MAX_BUCKET_SPAN;
use crate::{Durability, Error, KeyHashing, Result};

use super::{ROW_SPLIT_BYTES, Ship};
pub(crate) use crate::records::{FORMAT_MAX_KEY_PART, FORMAT_MAX_OUTCOME};

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
    /// The replica the log hands its commits to (feature "replica").
    pub ship: Option<Ship>,
    /// The lowest fencing token this run may issue (a replica's epoch
    /// sets it, so a new owner's tokens exceed every earlier owner's).
    pub token_base: u64,
    /// Upgrade an older file to the newest format at open.
    pub upgrade: bool,
    /// Check every page of the file at open (redb's integrity check).
    pub verify_pages: bool,
    /// What the store's time does while the clock reads behind it.
    pub clock_behind: crate::clock::ClockBehind,
    /// The journal in front of the file (off: `None`; by default on for
    /// new stores at a path and stores that have one).
    pub journal: Option<super::JournalSetting>,
    /// The one key (scope, id) a read-only open loads into its index
    /// (`StoreBuilder::open_read_only_key`); `None`: every key.
    pub only_key: Option<(Vec<u8>, Vec<u8>)>,
}

/// The metrics bridge's `store` label unless the builder names one.
pub(crate) const DEFAULT_METRICS_LABEL: &str = "default";

impl Default for Config {
    /// The defaults each builder setting documents.
    fn default() -> Self {
        Config {
            shards: 64,
            durability: Durability::Immediate,
            lease_ms: 30_000,
            retention_ms: 24 * 3_600_000,
            granularity_ms: 60_000,
            cache_bytes: 64 << 20,
            quick_repair: false,
            key_hashing: KeyHashing::SipHash13,
            hashing_set: false,
            granularity_set: false,
            max_scope: 256,
            max_id: 1024,
            max_outcome: 1 << 20,
            expected_keys: 0,
            background_eviction: true,
            max_keys: None,
            max_retry_window_ms: None,
            entity_retention_ms: 7 * 24 * 3_600_000,
            max_hold_ms: 5 * 60_000,
            handback_lease_ms: 30_000,
            compact_when_free: Some(0.5),
            evict_slice_bytes: 1 << 20,
            max_batch_bytes: 256 << 20,
            tally_window_ms: 3_600_000,
            tally_retention_ms: 7 * 86_400_000,
            tally_keys: Vec::new(),
            row_split_bytes: ROW_SPLIT_BYTES,
            metrics_label: DEFAULT_METRICS_LABEL.into(),
            upgrade: false,
            verify_pages: true,
            clock_behind: crate::clock::ClockBehind::StandStill,
            journal: Some(super::JournalSetting::default_on()),
            only_key: None,
            ship: None,
            token_base: 0,
        }
    }
}

impl Config {
    /// Checks the settings against each other and against what the
    /// format and the index can represent.
    pub(crate) fn validate(&self) -> Result<()> {
        self.validate_times()?;
        self.validate_sizes()
    }

    /// The lease, retention and reconcile times, against each other and
    /// against the buckets a slot can name.
    fn validate_times(&self) -> Result<()> {
        let c = self;
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if c.lease_ms == 0 {
            return bad("the lease must be at least 1 ms".into());
        }
        if c.handback_lease_ms == 0 {
            return bad("the hand-back lease must be at least 1 ms".into());
        }
        if c.tally_window_ms == 0 || c.tally_window_ms > c.tally_retention_ms {
            return bad(format!(
                "the reconcile window ({} ms) must be at least 1 ms and at most the \
                 reconcile retention ({} ms)",
                c.tally_window_ms, c.tally_retention_ms
            ));
        }
        if c.tally_retention_ms / c.granularity_ms.max(1) >= MAX_BUCKET_SPAN {
            return bad(format!(
                "the reconcile retention ({} ms) spans 2^22 buckets or more",
                c.tally_retention_ms
            ));
        }
        if c.granularity_ms < 1_000 {
            return bad(format!(
                "the bucket granularity must be at least 1 s, not {} ms: slots keep 24 bits of \
                 their bucket, so eviction must run at least every 2^22 buckets",
                c.granularity_ms
            ));
        }
        if c.retention_ms < c.lease_ms {
            return bad(format!(
                "retention ({} ms) is shorter than the lease ({} ms): a claim could be forgotten while held",
                c.retention_ms, c.lease_ms
            ));
        }
        if let Some(w) = c.max_retry_window_ms
            && c.retention_ms < w
        {
            return bad(format!(
                "retention ({} ms) is shorter than the upstream's max retry window ({w} ms): \
                 a redelivery after the retention would be handled twice",
                c.retention_ms
            ));
        }
        if c.entity_retention_ms == 0 {
            return bad(
                "entity_retention must be at least 1 ms: an entity's version and sequencer \
                 state would be forgotten as it is written"
                    .into(),
            );
        }
        if c.entity_retention_ms / c.granularity_ms >= MAX_BUCKET_SPAN {
            return bad(format!(
                "entity retention spans {} buckets; at most {} are supported",
                c.entity_retention_ms / c.granularity_ms,
                MAX_BUCKET_SPAN - 1
            ));
        }
        if c.retention_ms / c.granularity_ms >= MAX_BUCKET_SPAN {
            return bad(format!(
                "retention spans {} buckets; at most {} are supported (raise the granularity)",
                c.retention_ms / c.granularity_ms,
                MAX_BUCKET_SPAN - 1
            ));
        }
        Ok(())
    }

    /// Sizes and counts: shards, batches, key parts and outcomes within
    /// what the format and the index can represent.
    fn validate_sizes(&self) -> Result<()> {
        let c = self;
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if !c.shards.is_power_of_two() || c.shards > 65_536 {
            return bad(format!(
                "shards must be a power of two from 1 to 65536, not {}",
                c.shards
            ));
        }
        if let Some(f) = c.compact_when_free
            && !(0.0..1.0).contains(&f)
        {
            return bad(format!("compact_when_free must be in 0.0..1.0, not {f}"));
        }
        if c.max_batch_bytes == 0 {
            return bad("max_batch_bytes must be at least 1".into());
        }
        if c.evict_slice_bytes == 0 {
            return bad("evict_slice_bytes must be at least 1".into());
        }
        for (what, v, max) in [
            ("max_scope_len", c.max_scope, FORMAT_MAX_KEY_PART),
            ("max_id_len", c.max_id, FORMAT_MAX_KEY_PART),
            ("max_outcome_len", c.max_outcome, FORMAT_MAX_OUTCOME),
        ] {
            if v > max {
                return bad(format!("{what} is {v}; the format allows at most {max}"));
            }
        }
        if let Durability::Deferred { max_delay } = c.durability
            && max_delay.is_zero()
        {
            return bad("Deferred max_delay must be above zero".into());
        }
        Ok(())
    }
}
