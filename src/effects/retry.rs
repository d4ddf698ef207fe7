//! Retries: a backoff policy with jitter ([`RetryPolicy`]), and a runner
//! that performs one attempt of an operation under a claim.
//!
//! Invariants:
//! - The attempt number, the interruptions and the time the round began
//!   come from the store (`Claim::round_attempt`, `Claim::interruptions`,
//!   `Claim::round_started_at`), so they survive restarts; the policy
//!   itself keeps no per-operation state.
//! - A limit holds before the act it limits: the runners check
//!   `max_attempts` and `max_elapsed` after the claim is taken and before
//!   the work (or the provider) is called, takeovers of interrupted
//!   attempts included.
//! - A delay is never above the cap (decorrelated: never below the base),
//!   and no input overflows: arithmetic is on `u128` nanoseconds and
//!   saturates at the cap.
//! - The runner never sleeps; it says how long the caller should wait.
//! - The runner records before it answers: `Done` only after `complete`,
//!   `RetryAfter` only after `fail(Retryable)`, `GaveUp` and `Exhausted`
//!   only after `fail(Permanent)` or `fail(Exhausted)` returned.

use std::fmt;
use std::time::Duration;

use crate::{BeginOptions, Clock, Error, Result, SystemClock};
#[cfg(doc)]
use crate::{Claim, Run, Store};
use std::sync::Arc;

use super::rng::{SplitMix64, random_seed};

const DEFAULT_BASE: Duration = Duration::from_millis(100);
const DEFAULT_CAP: Duration = Duration::from_secs(30);
const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// The longest failure text the runner stores with a permanent failure, in
/// bytes (cut at a character boundary), and never more than the store's
/// `max_outcome_len`, so a long error message cannot make `fail` refuse it.
pub(super) const MAX_FAILURE_TEXT: usize = 1024;

/// How the random part of a delay is drawn.
///
/// # Examples
/// ```
/// use dedupkv::{Jitter, RetryPolicy};
/// let policy = RetryPolicy::builder().jitter(Jitter::Decorrelated).build()?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Jitter {
    /// Uniform in `[0, min(cap, base · 2^(attempt-1))]`: the spread that
    /// de-synchronises competing clients best for the least total wait.
    #[default]
    Full,
    /// `min(cap, uniform in [base, 3 · previous delay])`: each delay
    /// depends on the one before, not on the attempt number. Never below
    /// the base.
    Decorrelated,
}

/// How a failed attempt's error is treated by [`RetryPolicy::run`] and
/// [`RetryPolicy::call`].
///
/// # Examples
/// ```
/// use dedupkv::ErrorClass;
/// fn classify(status: &u16) -> ErrorClass {
///     if *status == 429 || *status >= 500 { ErrorClass::Retryable } else { ErrorClass::Permanent }
/// }
/// assert_eq!(classify(&503), ErrorClass::Retryable);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Another attempt of the same request may succeed (a timeout, a 503):
    /// retried while the policy permits.
    Retryable,
    /// No attempt of this request will succeed (a declined card, a 400):
    /// recorded as a permanent failure at once.
    Permanent,
    /// No answer came: the call may or may not have taken effect (a
    /// timeout, a connection reset after the request went out). Retried
    /// while the policy permits, like [`Retryable`](Self::Retryable);
    /// [`RetryPolicy::call`] leaves the intent unanswered, so the next
    /// attempt asks the provider before calling again. (`run` has no
    /// provider to ask: there it is `Retryable`.)
    Unanswered,
}

/// Why a retry policy stopped.
///
/// # Examples
/// ```
/// use dedupkv::{Decision, GiveUpReason, RetryPolicy};
/// use std::time::Duration;
/// let policy = RetryPolicy::builder().max_attempts(3).build()?;
/// assert_eq!(
///     policy.decide(3, Duration::ZERO, None),
///     Decision::GiveUp(GiveUpReason::MaxAttempts { max: 3 })
/// );
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUpReason {
    /// The error was classified [`ErrorClass::Permanent`].
    Permanent,
    /// The failed attempt was the last one `max_attempts` allows (or,
    /// found before an attempt started, the round's attempts were used up).
    MaxAttempts {
        /// The policy's `max_attempts`.
        max: u32,
    },
    /// Found before an attempt started: the round's `max_attempts`
    /// attempts were made, and `interrupted` of them ended without an
    /// answer (their worker died, or their lease lapsed): a crash loop
    /// such as a poison message. The work is not called again.
    Interrupted {
        /// Attempts made in the round.
        attempts: u32,
        /// How many of them never answered (at least 1).
        interrupted: u32,
    },
    /// The next attempt would start later than `max_elapsed` after the
    /// round's first attempt (or, found before an attempt started, it
    /// would start later already).
    MaxElapsed {
        /// Time from the round's first attempt to the decision.
        elapsed: Duration,
        /// The policy's `max_elapsed`.
        max: Duration,
    },
}

impl fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GiveUpReason::Permanent => f.write_str("permanent error"),
            GiveUpReason::MaxAttempts { max } => {
                write!(f, "gave up after {max} attempts (max_attempts)")
            }
            GiveUpReason::Interrupted {
                attempts,
                interrupted,
            } if attempts == interrupted => {
                write!(f, "interrupted {attempts} times (max_attempts)")
            }
            GiveUpReason::Interrupted {
                attempts,
                interrupted,
            } => write!(
                f,
                "gave up after {attempts} attempts, {interrupted} interrupted (max_attempts)"
            ),
            GiveUpReason::MaxElapsed { elapsed, max } => write!(
                f,
                "max_elapsed {max:?} passed ({elapsed:?} since the round's first attempt)"
            ),
        }
    }
}

/// What a [`RetryPolicy`] says after a retryable failure.
///
/// # Examples
/// ```
/// use dedupkv::{Decision, RetryPolicy};
/// use std::time::Duration;
/// let policy = RetryPolicy::builder().seed(7).build()?;
/// match policy.decide(1, Duration::ZERO, None) {
///     Decision::Retry { after } => assert!(after <= Duration::from_millis(100)),
///     Decision::GiveUp(reason) => panic!("{reason}"),
///     _ => unreachable!(),
/// }
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Try again after this wait.
    Retry {
        /// How long to wait before the next attempt.
        after: Duration,
    },
    /// Do not try again.
    GiveUp(GiveUpReason),
}

/// Settings of a [`RetryPolicy`]; [`build`](Self::build) checks them.
///
/// # Examples
/// ```
/// use dedupkv::{Jitter, RetryPolicy};
/// use std::time::Duration;
/// let policy = RetryPolicy::builder()
///     .base(Duration::from_millis(200))
///     .cap(Duration::from_secs(60))
///     .max_attempts(8)
///     .max_elapsed(Duration::from_secs(600))
///     .jitter(Jitter::Full)
///     .build()?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RetryPolicyBuilder {
    base: Duration,
    cap: Duration,
    max_attempts: u32,
    max_elapsed: Option<Duration>,
    jitter: Jitter,
    seed: Option<u64>,
    clock: Arc<dyn Clock>,
    begin: BeginOptions,
}

impl Default for RetryPolicyBuilder {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            cap: DEFAULT_CAP,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_elapsed: None,
            jitter: Jitter::Full,
            seed: None,
            clock: Arc::new(SystemClock),
            begin: BeginOptions::new(),
        }
    }
}

impl RetryPolicyBuilder {
    /// The first retry's delay ceiling; each later one doubles it, up to
    /// [`cap`](Self::cap). Default: 100 ms. Must be above zero and at most
    /// the cap.
    ///
    /// # Examples
    /// See [`RetryPolicyBuilder`].
    pub fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The longest delay. Default: 30 s. Must be at least the base.
    ///
    /// # Examples
    /// See [`RetryPolicyBuilder`].
    pub fn cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// The most attempts of one operation, the first one included, counted
    /// by the store across restarts ([`Claim::round_attempt`]); a
    /// [`Store::requeue`] grants another round of as many. Default: 5.
    /// Must be at least 1.
    ///
    /// When it is checked, by [`RetryPolicy::run`] and
    /// [`RetryPolicy::call`]:
    /// - **before an attempt starts**: after the claim is taken and before
    ///   the work (or the provider) is called. A claim numbered past the
    ///   limit — the attempts before it were taken over after their
    ///   workers died, or failed under another policy — is dead-lettered
    ///   at once, without calling the work ([`Run::Exhausted`], reason
    ///   [`GiveUpReason::Interrupted`] when any of them never answered,
    ///   e.g. `"interrupted 3 times (max_attempts)"`). So a worker that is
    ///   killed inside the work every time is called exactly this many
    ///   times.
    /// - **after an attempt failed** with a retryable error: the attempt
    ///   numbered `max_attempts` is dead-lettered instead of released
    ///   ([`Run::GaveUp`], [`GiveUpReason::MaxAttempts`]).
    ///
    /// # Examples
    /// See [`RetryPolicyBuilder`].
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Give up when the next attempt would start later than this after the
    /// operation's first attempt (as the store recorded it, so the budget
    /// survives restarts; after a [`Store::requeue`], after the requeue:
    /// [`Claim::round_started_at`]). Default: no limit.
    ///
    /// When it is checked, by [`RetryPolicy::run`] and
    /// [`RetryPolicy::call`], on the policy's [`clock`](Self::clock):
    /// - **before an attempt starts**: after the claim is taken and before
    ///   the work (or the provider) is called. An attempt that would
    ///   start more than `max_elapsed` after the round's first attempt
    ///   (a process restarted late, a redelivery after hours) is
    ///   dead-lettered at once, without calling the work
    ///   ([`Run::Exhausted`], [`GiveUpReason::MaxElapsed`]).
    /// - **after an attempt failed** with a retryable error: if waiting
    ///   the drawn delay would start the next attempt past the limit, the
    ///   operation is dead-lettered instead of released ([`Run::GaveUp`]).
    ///
    /// Keep the store's retention (or the claim's, see
    /// [`begin_options`](Self::begin_options)) longer than this: a key
    /// that expires between attempts starts over as a new operation.
    ///
    /// # Examples
    /// See [`RetryPolicyBuilder`].
    pub fn max_elapsed(mut self, max: Duration) -> Self {
        self.max_elapsed = Some(max);
        self
    }

    /// How the random part of each delay is drawn. Default: [`Jitter::Full`].
    ///
    /// # Examples
    /// See [`Jitter`].
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Seeds the jitter's random numbers: the same seed gives the same
    /// delays for the same calls in the same order (tests, simulations).
    /// Default: a seed from the operating system's random source.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::RetryPolicy;
    /// let a = RetryPolicy::builder().seed(42).build()?;
    /// let b = RetryPolicy::builder().seed(42).build()?;
    /// assert_eq!(a.delay(3, None), b.delay(3, None));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The clock the runner reads "now" from, for the elapsed time and the
    /// wait on a claim held elsewhere. Give it the store's clock. Default:
    /// [`SystemClock`], the store's default. The runner never uses a time
    /// earlier than the store's latest record of the operation.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{ManualClock, RetryPolicy, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// let policy = RetryPolicy::builder().clock(clock).build()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The lease and retention of the runner's claims (see
    /// [`Store::begin_with`]). Default: the store's.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{BeginOptions, RetryPolicy};
    /// use std::time::Duration;
    /// let policy = RetryPolicy::builder()
    ///     .begin_options(BeginOptions::new().lease(Duration::from_secs(5)))
    ///     .build()?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn begin_options(mut self, options: BeginOptions) -> Self {
        self.begin = options;
        self
    }

    /// The policy with these settings.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`], naming the setting, for `max_attempts` 0,
    /// a zero `base`, or a `base` longer than the `cap`.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Error, RetryPolicy};
    /// let err = RetryPolicy::builder().max_attempts(0).build().unwrap_err();
    /// assert!(matches!(&err, Error::InvalidConfig(msg) if msg.contains("max_attempts")));
    /// ```
    pub fn build(self) -> Result<RetryPolicy> {
        if self.max_attempts == 0 {
            return Err(Error::InvalidConfig(
                "retry max_attempts is 0; it must be at least 1 (the first attempt)".into(),
            ));
        }
        if self.base.is_zero() {
            return Err(Error::InvalidConfig(
                "retry base is 0; it must be above zero".into(),
            ));
        }
        if self.base > self.cap {
            return Err(Error::InvalidConfig(format!(
                "retry base ({:?}) is longer than cap ({:?}); base must be at most cap",
                self.base, self.cap
            )));
        }
        Ok(self.finish())
    }

    fn finish(self) -> RetryPolicy {
        RetryPolicy {
            base: self.base,
            cap: self.cap,
            max_attempts: self.max_attempts,
            max_elapsed: self.max_elapsed,
            jitter: self.jitter,
            rng: SplitMix64::new(self.seed.unwrap_or_else(random_seed)),
            clock: self.clock,
            begin: self.begin,
        }
    }
}

/// When and whether to retry a failed operation: exponential backoff
/// (factor 2) with jitter, a maximum number of attempts and an optional
/// maximum elapsed time; [`run`](Self::run), which performs one attempt
/// under a claim in the safe order (record first, limits, effect, outcome
/// last); and [`call`](Self::call), the same for an external call to a
/// provider that can be asked (intent, ask first, answer recorded).
///
/// Share one policy between threads by reference (it is `Sync`); its
/// random numbers come from one seeded generator, so with a fixed
/// [`seed`](RetryPolicyBuilder::seed) a single-threaded sequence of calls
/// gets the same delays every time.
///
/// # Examples
/// ```
/// use dedupkv::{Decision, RetryPolicy};
/// use std::time::Duration;
/// let policy = RetryPolicy::new(); // 100 ms base, 30 s cap, 5 attempts, full jitter
/// assert!(policy.delay(1, None) <= Duration::from_millis(100));
/// assert!(policy.delay(3, None) <= Duration::from_millis(400));
/// assert!(matches!(policy.decide(5, Duration::ZERO, None), Decision::GiveUp(_)));
/// ```
#[derive(Debug)]
pub struct RetryPolicy {
    pub(super) base: Duration,
    pub(super) cap: Duration,
    pub(super) max_attempts: u32,
    pub(super) max_elapsed: Option<Duration>,
    pub(super) jitter: Jitter,
    pub(super) rng: SplitMix64,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) begin: BeginOptions,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicyBuilder::default().finish()
    }
}

impl RetryPolicy {
    /// The policy with every default (see [`RetryPolicyBuilder`]).
    ///
    /// # Examples
    /// See [`RetryPolicy`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder for a policy with other settings.
    ///
    /// # Examples
    /// See [`RetryPolicyBuilder`].
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder::default()
    }

    /// The wait after failed attempt number `attempt` (1 for the first; 0
    /// counts as 1).
    ///
    /// - [`Jitter::Full`]: uniform in `[0, min(cap, base · 2^(attempt-1))]`;
    ///   `prev` is not used.
    /// - [`Jitter::Decorrelated`]: `min(cap, uniform in [base, 3 · prev])`
    ///   (`base` if `3 · prev` is below it). Without a `prev`, the ceiling
    ///   of the attempt before stands in for it (`base` after the first
    ///   attempt), as [`run`](Self::run) does: it keeps no state between
    ///   calls, since a restarted process would have none.
    ///
    /// Never panics: huge attempt numbers and durations saturate at the cap.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Jitter, RetryPolicy};
    /// use std::time::Duration;
    /// let policy = RetryPolicy::builder()
    ///     .jitter(Jitter::Decorrelated)
    ///     .base(Duration::from_secs(1))
    ///     .cap(Duration::from_secs(20))
    ///     .build()?;
    /// let mut prev = None;
    /// for attempt in 1..=10 {
    ///     let d = policy.delay(attempt, prev);
    ///     assert!(d >= Duration::from_secs(1) && d <= Duration::from_secs(20));
    ///     prev = Some(d);
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn delay(&self, attempt: u32, prev: Option<Duration>) -> Duration {
        let cap = self.cap.as_nanos();
        let nanos = match self.jitter {
            Jitter::Full => self.rng.up_to(self.ceiling(attempt)),
            Jitter::Decorrelated => {
                let base = self.base.as_nanos();
                let prev =
                    prev.map_or_else(|| self.ceiling(attempt.saturating_sub(1)), |p| p.as_nanos());
                let hi = prev.saturating_mul(3).max(base);
                base.saturating_add(self.rng.up_to(hi - base)).min(cap)
            }
        };
        from_nanos(nanos)
    }

    /// What to do after failed attempt number `attempt` (1 for the first;
    /// the runners pass [`Claim::round_attempt`]), `elapsed` after the
    /// round's first attempt; `prev` is the wait before this attempt, if
    /// known (see [`delay`](Self::delay)).
    ///
    /// Gives up if `attempt` reached `max_attempts`, or if waiting the drawn
    /// delay would start the next attempt past `max_elapsed`; otherwise
    /// retries after that delay.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Decision, GiveUpReason, RetryPolicy};
    /// use std::time::Duration;
    /// let policy = RetryPolicy::builder().max_elapsed(Duration::from_secs(60)).build()?;
    /// assert!(matches!(policy.decide(1, Duration::from_secs(1), None), Decision::Retry { .. }));
    /// assert!(matches!(
    ///     policy.decide(2, Duration::from_secs(61), None),
    ///     Decision::GiveUp(GiveUpReason::MaxElapsed { .. })
    /// ));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn decide(&self, attempt: u32, elapsed: Duration, prev: Option<Duration>) -> Decision {
        if attempt >= self.max_attempts {
            return Decision::GiveUp(GiveUpReason::MaxAttempts {
                max: self.max_attempts,
            });
        }
        let after = self.delay(attempt, prev);
        if let Some(max) = self.max_elapsed
            && elapsed.saturating_add(after) > max
        {
            return Decision::GiveUp(GiveUpReason::MaxElapsed { elapsed, max });
        }
        Decision::Retry { after }
    }

    /// The full-jitter ceiling of `attempt`: `min(cap, base · 2^(attempt-1))`
    /// in nanoseconds.
    fn ceiling(&self, attempt: u32) -> u128 {
        let factor = 1u128
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u128::MAX);
        self.base
            .as_nanos()
            .saturating_mul(factor)
            .min(self.cap.as_nanos())
    }
}

/// A duration of `nanos` nanoseconds, saturating at `Duration::MAX`.
fn from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    match u64::try_from(nanos / NANOS_PER_SEC) {
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_nanos_round_trips_and_saturates() {
        for d in [
            Duration::ZERO,
            Duration::new(1, 5),
            Duration::from_secs(u64::MAX / 3),
            Duration::MAX,
        ] {
            assert_eq!(from_nanos(d.as_nanos()), d);
        }
        assert_eq!(from_nanos(u128::MAX), Duration::MAX);
    }
}
