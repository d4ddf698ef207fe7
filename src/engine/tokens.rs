//! Fencing tokens: every claim gets one, higher than every token before
//! it, in this run or any earlier one.
//!
//! Invariants:
//! - tokens never repeat, even once the records that held them expired:
//!   they continue above the persisted floor (the manifest's token floor),
//!   which is raised a block at a time in the commit that hands out the
//!   first token past the previous block — so no token is durable before
//!   its reservation is;
//! - a claim whose token is below this run's first token was made by an
//!   earlier process, which is gone (a store file is held by one process
//!   at a time): nobody will finish it, so it is taken over at once.

use super::Engine;
use super::write::Batch;
use crate::sync::{AtomicU64, Ordering};

/// Bits of a fencing token below its owner's replica epoch: a replica
/// owner of epoch `e` issues tokens from `e << EPOCH_SHIFT` (fewer than
/// 2^40 each), so `token >> EPOCH_SHIFT` is the epoch that issued it (0
/// without a replica).
#[cfg_attr(not(any(feature = "replica", feature = "admin")), allow(dead_code))]
pub(crate) const EPOCH_SHIFT: u32 = 40;

/// Fencing tokens reserved per persisted floor.
pub(crate) const TOKEN_BLOCK: u64 = 1 << 20;

/// The token counter and its reservation.
pub(crate) struct Tokens {
    next: AtomicU64,
    /// The first token of this run.
    run_first: u64,
    /// Tokens below this are reserved by the persisted floor.
    limit: AtomicU64,
}

impl Tokens {
    /// Tokens from `first`, with the block up to `first + TOKEN_BLOCK`
    /// reserved (the open's first commit persists that floor).
    pub(crate) fn starting_at(first: u64) -> Tokens {
        Tokens {
            next: AtomicU64::new(first),
            run_first: first,
            limit: AtomicU64::new(first + TOKEN_BLOCK),
        }
    }
}

impl Engine {
    /// The next fencing token, its reservation added to `batch` if it
    /// needs one. The caller holds the batch lock.
    #[inline]
    pub(crate) fn next_token(&self, batch: &mut Batch) -> u64 {
        let t = &self.tokens;
        let token = t.next.fetch_add(1, Ordering::Relaxed);
        if token >= t.limit.load(Ordering::Acquire) {
            let limit = token + TOKEN_BLOCK;
            t.limit.fetch_max(limit, Ordering::AcqRel);
            batch.raise_token_floor(limit);
        }
        token
    }

    /// Whether a claim with `token` was made by an earlier process.
    #[inline]
    pub(crate) fn orphaned(&self, token: u64) -> bool {
        token < self.tokens.run_first
    }
}
