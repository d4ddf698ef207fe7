//! The checks every call makes on what it is given, before anything is
//! recorded: one caller's invalid request fails that caller alone.

use super::Engine;
use crate::{Error, Key, Result};

/// What a claim's record adds to a batch call's log, besides its key.
pub(crate) const CLAIM_BYTES: usize = 48;

impl Engine {
    /// Fails for an empty scope or id (an empty id is a missing key: taken
    /// as one, every event without an id would be a duplicate of the first)
    /// and for parts over the limits.
    #[inline]
    pub(crate) fn check_key(&self, key: &Key<'_>) -> Result<()> {
        for (what, part) in [("scope", key.scope()), ("id", key.id())] {
            if part.is_empty() {
                return Err(Error::InvalidArgument {
                    what,
                    reason: "is empty; a key needs a non-empty scope and id".into(),
                });
            }
        }
        check_len("scope", key.scope().len(), self.cfg.max_scope)?;
        check_len("id", key.id().len(), self.cfg.max_id)
    }

    /// Checks every item of a batch call (each gives its log bytes, or its
    /// error) and fails for a call over `max_batch_bytes`, before anything
    /// is recorded.
    #[inline]
    pub(crate) fn check_batch(&self, items: impl Iterator<Item = Result<usize>>) -> Result<()> {
        let mut total = 0usize;
        for bytes in items {
            total = total.saturating_add(bytes?);
        }
        check_len("batch", total, self.cfg.max_batch_bytes)
    }

    /// Fails for a payload over `max_outcome_len`.
    pub(crate) fn check_payload(&self, payload: &[u8]) -> Result<()> {
        check_len("payload", payload.len(), self.cfg.max_outcome)
    }

    /// Fails for an intent's target and request (or reference) over
    /// `max_outcome_len` together.
    pub(crate) fn check_intent_len(&self, target: &str, data: &[u8]) -> Result<()> {
        check_len(
            "intent",
            target.len().saturating_add(data.len()),
            self.cfg.max_outcome,
        )
    }

    /// Fails for a dead letter's reason and payload over `max_outcome_len`
    /// together.
    pub(crate) fn check_dead_letter(&self, reason: &str, payload: Option<&[u8]>) -> Result<()> {
        let len = reason.len().saturating_add(payload.map_or(0, <[u8]>::len));
        check_len("dead letter", len, self.cfg.max_outcome)
    }

    /// Fails for an outcome over `max_outcome_len`.
    pub(crate) fn check_outcome(&self, outcome: &[u8]) -> Result<()> {
        check_len("outcome", outcome.len(), self.cfg.max_outcome)
    }
}

/// What a key costs a batch call's log, as `max_batch_bytes` counts it.
#[inline]
pub(crate) fn key_bytes(key: &Key<'_>) -> usize {
    key.scope().len() + key.id().len() + 32
}

fn check_len(what: &'static str, len: usize, limit: usize) -> Result<()> {
    if len > limit {
        return Err(Error::InvalidInput { what, len, limit });
    }
    Ok(())
}
