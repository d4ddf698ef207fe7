//! Intents as index data: for each operation that recorded an intent to
//! call an external system, where its latest `Intent` record is and
//! whether it was answered. Kept beside the key's slot (same shard, same
//! hash), so the claim and its intent are decided under one lock.

use crate::key::KeyHash;

/// Whether an intent was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntentState {
    /// Recorded, not answered: the call may or may not have happened.
    Pending,
    /// The provider answered (`mark_sent`). (An intent closed without an
    /// answer, by its operation finishing, leaves the index.)
    Sent,
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
    /// The attempt that recorded (or, sent, answered) it.
    pub attempt: u32,
    pub state: IntentState,
}
