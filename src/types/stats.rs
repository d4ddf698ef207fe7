//! Counters and gauges: [`Stats`].

/// A snapshot of a store's counters and sizes, taken shard by shard.
///
/// Counters start at zero when the store is opened; the gauges (`keys`,
/// `dead_letters_now`, `intents_pending`, `stranded_claims`, the
/// sequencer's `_now` counts) are rebuilt from the log at open, so they
/// read the same across a restart.
///
/// # Examples
/// ```
/// # use dedupkv::{Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// store.insert_if_absent(&Key::new("t", "a"))?;
/// store.insert_if_absent(&Key::new("t", "a"))?;
/// let s = store.stats();
/// assert_eq!((s.keys, s.new_keys, s.duplicates), (1, 1, 1));
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// The store format of the open file (see
    /// [`Store::format`](crate::Store::format)).
    pub format: u32,
    /// Keys in the index.
    pub keys: u64,
    /// Heap bytes held by the index tables.
    pub index_bytes: u64,
    /// Durable commits since open.
    pub commits: u64,
    /// Time spent in durable commits since open (divided by `commits`:
    /// the mean commit latency).
    pub commit_time: std::time::Duration,
    /// Callers' records made durable since open (divided by `commits`:
    /// the mean records per commit).
    pub records_committed: u64,
    /// Batch calls (`insert_batch`, `begin_batch`, `complete_batch`) since
    /// open.
    pub batch_calls: u64,
    /// Items in those calls (divided by `batch_calls`: the mean batch size).
    pub batch_items: u64,
    /// Keys recorded as new (`insert_if_absent`, `insert_batch`).
    pub new_keys: u64,
    /// Inserts answered "already seen".
    pub duplicates: u64,
    /// Claims started by `begin` (first attempts, retries and takeovers).
    pub started: u64,
    /// Of those, takeovers of a claim that never answered: its lease had
    /// lapsed, or its process was gone.
    pub takeovers: u64,
    /// Claims started [`interrupted`](crate::Claim::interrupted): the
    /// takeovers, and the retries of a claim dropped without an answer.
    pub interrupted: u64,
    /// `begin` calls answered `InProgress`.
    pub in_progress: u64,
    /// `begin` calls answered `Completed` (replays), counted when the
    /// answer is decided: under `Immediate`, a replay of an outcome whose
    /// commit then fails (the store is poisoned) is counted too.
    pub replays: u64,
    /// Claims completed.
    pub completed: u64,
    /// Claims failed permanently.
    pub failed: u64,
    /// Claims released for a retry (retryable failure or dropped claim).
    pub released: u64,
    /// `begin` calls rejected for a fingerprint mismatch.
    pub conflicts: u64,
    /// `complete`, `fail` or `renew` calls rejected because the claim was lost.
    pub fenced: u64,
    /// Keys removed by eviction since open.
    pub evicted_keys: u64,
    /// Buckets evicted before they expired, to stay under `max_keys`. Each
    /// one shrinks the dedup window: page on it.
    pub early_evicted_buckets: u64,
    /// Clock readings more than a second behind the store's time (the
    /// highest time it has recorded, kept across reopen). While the clock
    /// is behind, the store's time stands still at that mark: leases do
    /// not lapse and keys do not expire until the clock catches up. A
    /// `tracing` warning says when it starts and ends.
    pub clock_behind: u64,
    /// Keys forgotten on purpose with [`forget`](crate::Store::forget).
    pub forgotten: u64,
    /// Entity versions applied by `advance` / `apply_event`.
    pub versions_applied: u64,
    /// Updates answered stale.
    pub versions_stale: u64,
    /// Events handed back in order by the sequencer (redeliveries of
    /// unacknowledged ones included).
    pub seq_delivered: u64,
    /// Early events parked by the sequencer.
    pub seq_parked: u64,
    /// Old or repeated events the sequencer answered `Duplicate`.
    pub seq_duplicates: u64,
    /// Parked events moved to the holding area after `max_hold`.
    pub seq_held: u64,
    /// Entities with state in the index.
    pub entities: u64,
    /// Events parked now.
    pub parked_now: u64,
    /// Events in the holding area now.
    pub held_now: u64,
    /// Events the sequencer handed back that are not acknowledged yet
    /// ([`Store::ack`](crate::Store::ack)): they stay stored until then.
    pub unacked_now: u64,
    /// Operations moved to the dead-letter area since open.
    pub dead_lettered: u64,
    /// Operations in the dead-letter area now.
    pub dead_letters_now: u64,
    /// How long the oldest dead letter has waited (`None`: the area is
    /// empty). A dead-letter area is worked, not accumulated: alert on it.
    pub oldest_dead_letter: Option<std::time::Duration>,
    /// Intents recorded before an external call that nobody marked
    /// answered: calls that may or may not have happened.
    pub intents_pending: u64,
    /// Claims whose lease lapsed (or whose process is gone) with nobody
    /// back to finish them: [`Store::stranded_claims`](crate::Store::stranded_claims)
    /// lists them.
    pub stranded_claims: u64,
    /// Callers asleep now in
    /// [`Store::begin_or_wait`](crate::Store::begin_or_wait) (or its async
    /// twin), waiting for an in-flight attempt's finish or lapse.
    pub waiting: u64,
    /// Keys of completed operations the reconciliation windows hold in
    /// memory (scopes named by `StoreBuilder::reconcile_keys_of`).
    pub reconcile_keys: u64,
    /// Heap bytes the reconciliation windows hold (their keys included).
    pub reconcile_bytes: u64,
    /// The configured retention.
    pub retention: std::time::Duration,
    /// How far back the store actually remembers: the age of the oldest
    /// retained bucket's keys. Below `retention` while the store is young,
    /// or after early evictions.
    pub effective_window: std::time::Duration,
}
