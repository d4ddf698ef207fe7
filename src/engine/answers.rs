//! What the provider answered an operation's calls, and when the
//! operation is a candidate for a duplicate external effect.
//!
//! An operation's `Intent` record keeps a summary of its calls
//! ([`Calls`]): the latest call's answer, whether an earlier call's fate
//! is still open, a hash of the first reference the provider gave, and the
//! doubt, if any. Each attempt that records its intent may call; each
//! answer moves the summary on (`Engine::mark_answered`).
//!
//! Invariants:
//! - a call's fate is open when no answer was recorded for it before the
//!   next attempt recorded its intent (its worker died, its lease lapsed,
//!   it was released), or its answer was "unknown"; asking the provider
//!   (found, not found) settles every open call;
//! - an operation is a candidate (a doubt) only when more than one call
//!   may have reached the provider and it did not confirm one effect: two
//!   calls accepted with different references, or a call accepted or
//!   unanswered after one whose fate was open. A refused call, a lookup,
//!   or an acceptance with the reference already known never adds one, so
//!   503s, takeovers and timeouts settled by asking first leave none;
//! - a doubt, once recorded, stays with the operation until its intent's
//!   record expires (or the key is forgotten).

use crate::records::reference_hash;
use crate::types::Answer;
use crate::types::intent::{Answered, Calls, Doubt};

impl Calls {
    /// The calls after a new attempt recorded its intent: the previous
    /// call's fate is open unless it was answered. `new_operation`: the
    /// attempt is the first of an operation, whose history starts afresh
    /// (an unanswered call of an earlier operation on the key stays open).
    pub(crate) fn next_attempt(self, new_operation: bool) -> Calls {
        let open = self.unanswered();
        if new_operation {
            return Calls {
                open,
                ..Calls::FIRST
            };
        }
        Calls {
            answer: Answered::None,
            open,
            ..self
        }
    }

    /// The calls after the provider answered `answer`.
    pub(crate) fn answered(self, answer: &Answer<'_>) -> Calls {
        // The latest call's fate is unknown (its answer was), or an
        // earlier one's is.
        let unknown_before = self.open || self.answer == Answered::Unknown;
        match *answer {
            Answer::Accepted(reference) | Answer::Found(reference) => {
                let hash = reference_hash(reference);
                let asked = matches!(answer, Answer::Found(_));
                let doubt = match self.reference {
                    Some(known) if known != hash => Doubt::TwoReferences,
                    // The same reference again: one effect, confirmed.
                    None if unknown_before && !asked => Doubt::AfterUnknown,
                    Some(_) | None => Doubt::None,
                };
                Calls {
                    answer: Answered::Accepted,
                    open: false,
                    reference: self.reference.or(Some(hash)),
                    doubt: self.doubt.max(doubt),
                }
            }
            Answer::Refused(_) => Calls {
                answer: Answered::Refused,
                open: unknown_before,
                ..self
            },
            Answer::Unknown => Calls {
                answer: Answered::Unknown,
                open: unknown_before,
                doubt: if unknown_before {
                    self.doubt.max(Doubt::AfterUnknown)
                } else {
                    self.doubt
                },
                ..self
            },
            Answer::NotFound => Calls {
                answer: match self.answer {
                    Answered::Accepted | Answered::Refused => self.answer,
                    Answered::None | Answered::Unknown | Answered::Absent => Answered::Absent,
                },
                open: false,
                ..self
            },
        }
    }

    /// Whether a call may or may not have happened: none of the latest
    /// call's answer came yet (or it was "unknown"; or, asked, the
    /// provider had none, and the attempt may have called since), or an
    /// earlier call's fate is open.
    pub(crate) fn unanswered(self) -> bool {
        self.open
            || matches!(
                self.answer,
                Answered::None | Answered::Unknown | Answered::Absent
            )
    }

    /// Whether the attempt that wrote these calls asked the provider,
    /// which had none, and answered no call of its own since: when that
    /// attempt gives up (a dead letter), nothing happened.
    pub(crate) fn only_asked(self) -> bool {
        self.answer == Answered::Absent && !self.open
    }

    /// Whether the operation may have had its effect twice.
    pub(crate) fn doubted(self) -> bool {
        self.doubt != Doubt::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls after each step: `I` an attempt records its intent,
    /// `a`/`b` accepted with that reference, `A`/`B` found by asking, `r`
    /// refused, `u` unknown, `n` not found.
    fn run(steps: &str) -> Calls {
        let mut c = Calls::FIRST;
        for (i, s) in steps.chars().enumerate() {
            c = match s {
                // The operation's first intent has no earlier calls.
                'I' if i == 0 => Calls::FIRST,
                'I' => c.next_attempt(false),
                'a' => c.answered(&Answer::Accepted(b"a")),
                'b' => c.answered(&Answer::Accepted(b"b")),
                'A' => c.answered(&Answer::Found(b"a")),
                'B' => c.answered(&Answer::Found(b"b")),
                'r' => c.answered(&Answer::Refused("503")),
                'u' => c.answered(&Answer::Unknown),
                'n' => c.answered(&Answer::NotFound),
                other => panic!("step {other}"),
            };
        }
        c
    }

    #[test]
    fn only_calls_that_may_both_have_reached_the_provider_are_doubted() {
        for (steps, doubt, unanswered) in [
            ("Ia", Doubt::None, false),
            // 503s, then accepted.
            ("IrIrIa", Doubt::None, false),
            // A takeover (no answer), asked first: found, or not and sent.
            ("IIA", Doubt::None, false),
            ("IIna", Doubt::None, false),
            // A timeout, asked first the same ways.
            ("IuIA", Doubt::None, false),
            ("IuIna", Doubt::None, false),
            // A carrier that deduplicates: the same reference again.
            ("IaIa", Doubt::None, false),
            // Not asked after a takeover or a timeout: both may have
            // reached it.
            ("IIa", Doubt::AfterUnknown, false),
            ("IuIa", Doubt::AfterUnknown, false),
            ("IuIu", Doubt::AfterUnknown, true),
            ("Iuu", Doubt::AfterUnknown, true),
            ("IIra", Doubt::AfterUnknown, false),
            // Two references: it did not deduplicate.
            ("IaIb", Doubt::TwoReferences, false),
            ("IaIB", Doubt::TwoReferences, false),
            ("IIaIb", Doubt::TwoReferences, false),
            // Open states.
            ("I", Doubt::None, true),
            ("II", Doubt::None, true),
            ("IIr", Doubt::None, true),
            ("IIn", Doubt::None, true),
            ("IInI", Doubt::None, true),
            ("Iu", Doubt::None, true),
            ("Iun", Doubt::None, true),
            ("Iunr", Doubt::None, false),
            ("Iunu", Doubt::None, true),
            // Asked, then called without an answer recorded: the next
            // attempt's call after it is one after an open call.
            ("IInIa", Doubt::AfterUnknown, false),
        ] {
            let c = run(steps);
            assert_eq!(c.doubt, doubt, "{steps}: {c:?}");
            assert_eq!(c.unanswered(), unanswered, "{steps}: {c:?}");
        }
    }

    #[test]
    fn a_doubt_stays_and_a_first_attempt_starts_afresh() {
        assert_eq!(run("IIaIa").doubt, Doubt::AfterUnknown);
        assert_eq!(run("IIaIAIn").doubt, Doubt::AfterUnknown);
        let c = run("IaIb");
        assert_eq!(
            c.next_attempt(true),
            Calls::FIRST,
            "answered: a clean start"
        );
        let c = run("IaI");
        assert!(c.next_attempt(true).open, "an unanswered call stays open");
    }
}
