//! Rounds of attempts: an operation's first attempt starts a round, and
//! each `requeue` starts another; a round counts its attempts that ended
//! without an answer (interruptions). Retry limits count within a round,
//! so a requeue grants a fresh one while the attempt numbers, the
//! first-attempt time and the provider key go on.
//!
//! Invariants:
//! - a round is kept in the key's pending details and written with every
//!   `Claim` and `Release` record of the key (a [`RoundBody`] in the
//!   outcome), so a restart, a takeover or an eviction carry keeps it; a
//!   record without one is an operation's first round, uninterrupted, so
//!   the common path writes no extra byte and older files read as before;
//! - the takeover of an attempt that never answered counts one
//!   interruption in the round, before the new attempt is told `Started`;
//! - a round keeps when its first failure came (format 4): the release of
//!   a retryable failure or a dropped claim, or the takeover of a stranded
//!   attempt (from when it became stranded); a dead letter reports it
//!   beside its last failure.

use crate::Result;
use crate::index::{Pending, Round};
use crate::records::{Kind, ROUND_BODY_LEN, RecordRef, RoundBody};

impl Round {
    /// The round of the attempt after one of this round; `interrupted`:
    /// that attempt ended without an answer.
    pub(crate) fn next(self, interrupted: bool) -> Round {
        Round {
            interrupted: self.interrupted.saturating_add(u32::from(interrupted)),
            ..self
        }
    }

    /// The round a requeue at `now` starts, after `attempts` attempts.
    pub(crate) fn requeued(attempts: u32, now: u64) -> Round {
        Round {
            before: attempts,
            since: now,
            interrupted: 0,
            first_failed_at: 0,
        }
    }

    /// This round after an attempt of it failed at `at`: its first
    /// failure, if it had none.
    pub(crate) fn failed(self, at: u64) -> Round {
        Round {
            first_failed_at: if self.first_failed_at == 0 {
                at.max(1)
            } else {
                self.first_failed_at
            },
            ..self
        }
    }

    /// The round a replayed record's claim belongs to (first attempt at
    /// `first_at`).
    pub(crate) fn of_record(rec: &RecordRef<'_>, first_at: u64) -> Result<Round> {
        if !matches!(rec.kind, Kind::Claim | Kind::Release) {
            return Ok(Round::first(first_at));
        }
        Ok(rec.round()?.map_or(Round::first(first_at), |b| Round {
            before: b.before,
            since: b.since,
            interrupted: b.interrupted,
            first_failed_at: b.first_failed_at,
        }))
    }
}

/// A claim's round as its `Claim` or `Release` record carries it (no bytes
/// for a first round, uninterrupted).
pub(crate) struct RoundBytes {
    body: [u8; ROUND_BODY_LEN],
    len: usize,
}

impl RoundBytes {
    /// The round of claim `p`; `v2`: as format 4 writes it, with its first
    /// failure time (else as format 3, without).
    pub(crate) fn of(p: &Pending, v2: bool) -> RoundBytes {
        let mut r = p.round;
        if !v2 {
            r.first_failed_at = 0;
        }
        if r == Round::first(p.first_at) {
            return RoundBytes {
                body: [0; ROUND_BODY_LEN],
                len: 0,
            };
        }
        let body = RoundBody {
            before: r.before,
            since: r.since,
            interrupted: r.interrupted,
            first_failed_at: r.first_failed_at,
        };
        let (body, len) = if v2 { body.encode() } else { body.encode_v1() };
        RoundBytes { body, len }
    }

    /// The bytes for [`RecordRef::with_round`].
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.body[..self.len]
    }
}

impl crate::engine::Engine {
    /// The round of claim `p` as its `Claim` or `Release` record carries
    /// it in the open file's format.
    pub(crate) fn round_bytes(&self, p: &Pending) -> RoundBytes {
        RoundBytes::of(p, self.has_format_4_bodies())
    }
}
