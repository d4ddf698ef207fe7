//! Intents as index data: for each operation that recorded an intent to
//! call an external system, where its latest `Intent` record is, whether
//! it is answered, and whether it is a candidate for a duplicate effect.
//! Kept beside the key's slot (same shard, same hash), so the claim and
//! its intent are decided under one lock.

use crate::key::KeyHash;
use crate::types::intent::Calls;

/// Whether an intent is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntentState {
    /// Unanswered: a call of the operation may or may not have happened
    /// (none answered yet, one answered "unknown", or an earlier one's
    /// fate still open).
    Pending,
    /// Settled: the provider answered (accepted or refused, nothing
    /// open), or the operation finished while the intent is a duplicate
    /// candidate. Kept until its record expires. (An intent closed
    /// without an answer, by its operation finishing, leaves the index.)
    Settled,
}

/// An operation's intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IntentSlot {
    pub hash: KeyHash,
    /// Bucket and row of its latest `Intent` record.
    pub bucket: u64,
    pub row: u64,
    /// When it was first recorded.
    pub recorded_at: u64,
    /// The attempt that last wrote it.
    pub attempt: u32,
    pub state: IntentState,
    /// What the provider answered the operation's calls (as its record
    /// says): kept here so `begin_with_intent` decides the next record's
    /// under the shard lock, with no row read.
    pub calls: Calls,
}
