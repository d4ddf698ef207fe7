//! A retry policy's limits applied to one claim, shared by the runners
//! (`run`, `call`): checked before an attempt starts and after it failed,
//! and recorded before the runner answers.
//!
//! Invariants:
//! - a limit holds before the act it limits: `limit_reached` is asked
//!   after the claim is taken and before the work or the provider is
//!   called, takeovers of interrupted attempts included;
//! - attempts and elapsed time count within the claim's round (from the
//!   operation's first attempt, or its latest requeue), as the store
//!   recorded it, so they survive restarts;
//! - a dead letter's text fits the store's `max_outcome_len` (the payload
//!   is left out when both do not fit), so recording it is never refused
//!   for its size.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::retry::{Decision, ErrorClass, GiveUpReason, MAX_FAILURE_TEXT, RetryPolicy};
use super::run::Run;
use crate::contract::{Pending, Write};
use crate::{Claim, Failure, Result, Store};

impl RetryPolicy {
    /// The limit the attempt of `claim` would pass, if any.
    pub(super) fn limit_reached(&self, claim: &Claim) -> Option<GiveUpReason> {
        let attempt = claim.round_attempt();
        if attempt > self.max_attempts {
            let attempts = attempt - 1;
            let interrupted = claim.interruptions().min(attempts);
            return Some(if interrupted > 0 {
                GiveUpReason::Interrupted {
                    attempts,
                    interrupted,
                }
            } else {
                GiveUpReason::MaxAttempts {
                    max: self.max_attempts,
                }
            });
        }
        let max = self.max_elapsed?;
        let elapsed = self.elapsed(claim);
        (elapsed > max).then_some(GiveUpReason::MaxElapsed { elapsed, max })
    }

    /// Records the failed attempt of `claim` as the policy decides: a
    /// release for a retry, a permanent failure, or a dead letter (with
    /// `payload`, if both fit).
    pub(super) fn failed<T, E: fmt::Display>(
        &self,
        store: &Store,
        claim: &Claim,
        class: ErrorClass,
        error: E,
        payload: Option<&[u8]>,
    ) -> Result<Pending<Run<T, E>>> {
        let attempt = claim.attempt();
        let reason = match class {
            ErrorClass::Permanent => GiveUpReason::Permanent,
            ErrorClass::Retryable | ErrorClass::Unanswered => {
                let elapsed = match self.max_elapsed {
                    Some(_) => self.elapsed(claim),
                    None => Duration::ZERO,
                };
                match self.decide(claim.round_attempt(), elapsed, None) {
                    Decision::Retry { after } => {
                        let failed = Write::fail(store, claim, Failure::Retryable)?;
                        return Ok(failed.map(|()| Run::RetryAfter {
                            after,
                            attempt,
                            error,
                        }));
                    }
                    Decision::GiveUp(reason) => reason,
                }
            }
        };
        let dead_lettered = reason != GiveUpReason::Permanent;
        let limit = store.max_outcome_len();
        let text = failure_text(&reason, &error, limit);
        let failure = if dead_lettered {
            exhausted(&text, payload, limit)
        } else {
            Failure::Permanent(text.as_bytes())
        };
        let failed = Write::fail(store, claim, failure)?;
        Ok(failed.map(|()| Run::GaveUp {
            attempts: attempt,
            reason,
            dead_lettered,
            error,
        }))
    }

    /// Time since the round of `claim` began, as the store recorded it
    /// (the same on every attempt, after restarts too).
    fn elapsed(&self, claim: &Claim) -> Duration {
        self.now()
            .duration_since(claim.round_started_at())
            .unwrap_or(Duration::ZERO)
    }

    pub(super) fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.clock.now_millis())
    }
}

/// Dead-letters `claim`, whose attempt would pass `reason`'s limit,
/// without calling the work; keeps `payload` with it if both fit.
/// `unanswered`: an earlier call's answer is still unknown (the reason
/// says so).
pub(super) fn dead_letter_before<T, E>(
    store: &Store,
    claim: &Claim,
    reason: GiveUpReason,
    payload: Option<&[u8]>,
    unanswered: bool,
) -> Result<Pending<Run<T, E>>> {
    let mut text = format!("{reason}; attempt {} not started", claim.attempt());
    if unanswered {
        text.push_str("; an earlier call is unanswered (see pending_intents)");
    }
    let text = cut(text, store.max_outcome_len());
    let failed = Write::fail(
        store,
        claim,
        exhausted(&text, payload, store.max_outcome_len()),
    )?;
    Ok(failed.map(|()| Run::Exhausted {
        attempt: claim.attempt(),
        reason,
    }))
}

/// `Failure::Exhausted` with `reason`, and `payload` if both fit `limit`.
fn exhausted<'a>(reason: &'a str, payload: Option<&'a [u8]>, limit: usize) -> Failure<'a> {
    Failure::Exhausted {
        reason,
        payload: payload.filter(|p| reason.len().saturating_add(p.len()) <= limit),
    }
}

/// `"<reason>: <error>"`, cut to [`MAX_FAILURE_TEXT`] bytes (or `limit`, the
/// store's `max_outcome_len`, if lower) at a character boundary.
pub(super) fn failure_text(
    reason: &GiveUpReason,
    error: &dyn fmt::Display,
    limit: usize,
) -> String {
    cut(format!("{reason}: {error}"), limit)
}

/// `text` cut to [`MAX_FAILURE_TEXT`] bytes (or `limit`, if lower) at a
/// character boundary.
pub(super) fn cut(mut text: String, limit: usize) -> String {
    let limit = limit.min(MAX_FAILURE_TEXT);
    if text.len() > limit {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_text_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_FAILURE_TEXT);
        let text = failure_text(&GiveUpReason::Permanent, &long, usize::MAX);
        assert!(text.len() <= MAX_FAILURE_TEXT);
        assert!(text.len() >= MAX_FAILURE_TEXT - 1);
        assert!(text.starts_with("permanent error: é"));
    }

    #[test]
    fn failure_text_fits_the_stores_outcome_limit() {
        let long = "x".repeat(300);
        for limit in [0, 1, 17, 64] {
            let text = failure_text(&GiveUpReason::Permanent, &long, limit);
            assert!(text.len() <= limit, "{limit}: {}", text.len());
        }
    }

    #[test]
    fn a_payload_is_kept_only_if_it_fits_with_the_reason() {
        let keeps = |limit| match exhausted("abc", Some(b"12345"), limit) {
            Failure::Exhausted { payload, .. } => payload.is_some(),
            _ => unreachable!(),
        };
        assert!(keeps(8));
        assert!(!keeps(7));
    }
}
