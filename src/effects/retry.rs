//! Retries: a backoff policy with jitter ([`RetryPolicy`]), and a runner
//! that performs one attempt of an operation under a claim.
//!
//! Invariants:
//! - The attempt number and the first-attempt time come from the store
//!   (`Claim::attempt`, `Record::first_seen_at`), so they survive restarts;
//!   the policy itself keeps no per-operation state.
//! - A delay is never above the cap (decorrelated: never below the base),
//!   and no input overflows: arithmetic is on `u128` nanoseconds and
//!   saturates at the cap.
//! - The runner never sleeps; it says how long the caller should wait.
//! - The runner records before it answers: `Done` only after `complete`,
//!   `RetryAfter` only after `fail(Retryable)`, `GaveUp` only after
//!   `fail(Permanent)` returned.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{
    Begin, BeginOptions, Claim, Clock, Error, Failure, Fingerprint, Key, Record, Result, State,
    Store, SystemClock,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const DEFAULT_BASE: Duration = Duration::from_millis(100);
const DEFAULT_CAP: Duration = Duration::from_secs(30);
const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// The longest failure text the runner stores with a permanent failure, in
/// bytes (cut at a character boundary): below the store's default
/// `max_outcome_len`, so a long error message cannot make `fail` refuse it.
const MAX_FAILURE_TEXT: usize = 1024;

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

/// How a failed attempt's error is treated by [`RetryPolicy::run`].
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
    /// The failed attempt was the last one `max_attempts` allows.
    MaxAttempts {
        /// The policy's `max_attempts`.
        max: u32,
    },
    /// The next attempt would start later than `max_elapsed` after the
    /// operation's first attempt.
    MaxElapsed {
        /// Time from the first attempt to the decision.
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
            GiveUpReason::MaxElapsed { elapsed, max } => write!(
                f,
                "gave up: {elapsed:?} since the first attempt, max_elapsed is {max:?}"
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

/// What [`RetryPolicy::run`] did.
///
/// Exhausted operations are recorded as permanent failures today; a later
/// change will also move them into a durable dead-letter area, and
/// `GaveUp` will then carry that entry's id (the enum and its variants are
/// `#[non_exhaustive]` so fields can be added).
///
/// # Examples
/// See [`RetryPolicy::run`].
#[derive(Debug)]
#[non_exhaustive]
#[must_use = "a Run says whether to wait and call again"]
pub enum Run<T, E> {
    /// This call claimed the key, ran the closure and recorded its outcome.
    Done(T),
    /// The operation completed before: its stored outcome. The closure did
    /// not run.
    Replayed(T),
    /// The operation failed permanently before (a permanent error, or a
    /// policy that gave up): its record, whose
    /// [`outcome`](Record::outcome) is the failure text. The closure did
    /// not run.
    Failed(Record),
    /// The closure failed with a retryable error; the key is released for
    /// the next attempt. Call `run` again after `after`.
    #[non_exhaustive]
    RetryAfter {
        /// How long to wait before the next attempt.
        after: Duration,
        /// The number of the attempt that failed (1 for the first).
        attempt: u32,
        /// The closure's error.
        error: E,
    },
    /// The closure failed and the policy gave up; the operation is recorded
    /// as a permanent failure (`"<reason>: <error>"`, cut to 1 KiB), which
    /// every later `begin` replays.
    #[non_exhaustive]
    GaveUp {
        /// Attempts made, this one included.
        attempts: u32,
        /// Why the policy stopped.
        reason: GiveUpReason,
        /// The closure's error.
        error: E,
    },
    /// Another attempt holds a live lease; the closure did not run. Call
    /// again after `retry_after`: the key is then finished, or free to take
    /// over.
    #[non_exhaustive]
    InProgress {
        /// Time until the running attempt's lease lapses, by the policy's
        /// clock (zero if it has lapsed already).
        retry_after: Duration,
        /// When the running attempt's lease lapses.
        lease_expires_at: SystemTime,
        /// The running attempt's number.
        attempt: u32,
    },
}

impl<T, E> Run<T, E> {
    /// How long to wait before calling `run` again: `Some` for
    /// [`RetryAfter`](Run::RetryAfter) and [`InProgress`](Run::InProgress),
    /// `None` when the operation is settled.
    ///
    /// # Examples
    /// See [`RetryPolicy::run`].
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Run::RetryAfter { after, .. } => Some(*after),
            Run::InProgress { retry_after, .. } => Some(*retry_after),
            Run::Done(_) | Run::Replayed(_) | Run::Failed(_) | Run::GaveUp { .. } => None,
        }
    }
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
    /// by the store across restarts. Default: 5. Must be at least 1.
    ///
    /// # Examples
    /// See [`RetryPolicyBuilder`].
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Give up when the next attempt would start later than this after the
    /// operation's first attempt (as the store recorded it, so the budget
    /// survives restarts). Default: no limit.
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
/// maximum elapsed time; and [`run`](Self::run), which performs one attempt
/// under a claim in the safe order (record first, effect second, outcome
/// third).
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
    base: Duration,
    cap: Duration,
    max_attempts: u32,
    max_elapsed: Option<Duration>,
    jitter: Jitter,
    rng: SplitMix64,
    clock: Arc<dyn Clock>,
    begin: BeginOptions,
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

    /// What to do after failed attempt number `attempt` (1 for the first),
    /// `elapsed` after the operation's first attempt; `prev` is the wait
    /// before this attempt, if known (see [`delay`](Self::delay)).
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

    /// Performs one attempt of the operation on `key` under a claim, and
    /// records what came of it; the outcome is bytes (see
    /// [`run_value`](Self::run_value) for a typed one).
    ///
    /// By what [`Store::begin`] answers:
    /// - `Started`: runs `work` with the claim. `Ok(outcome)` is recorded
    ///   with [`Store::complete`]: [`Run::Done`]. An error `classify` calls
    ///   [`Retryable`](ErrorClass::Retryable), while the policy permits
    ///   (the attempt number from the claim, the elapsed time from the
    ///   store's record of the first attempt), releases the key with
    ///   [`Failure::Retryable`]: [`Run::RetryAfter`]. A permanent error, or
    ///   a retryable one the policy gives up on, is recorded with
    ///   [`Failure::Permanent`] and the text `"<reason>: <error>"`:
    ///   [`Run::GaveUp`]. (Exhausted operations will also land in a
    ///   dead-letter area in a later change.)
    /// - `Completed`: the closure does not run. [`Run::Replayed`] with the
    ///   stored outcome, or [`Run::Failed`] with a permanent failure's record.
    /// - `InProgress`: the closure does not run. [`Run::InProgress`] with the
    ///   time until that attempt's lease lapses.
    ///
    /// It never sleeps: the caller waits [`Run::retry_after`] and calls
    /// again (below), or hands the key to a queue with that delay.
    ///
    /// A claim taken over from an attempt that never answered is
    /// [`interrupted`](Claim::interrupted): `work` should then ask the
    /// system it calls whether the first call went through (by
    /// [`provider_key`](Claim::provider_key)) before calling again.
    ///
    /// # Concurrent calls on the same key
    /// One caller runs `work`; the others get `InProgress` (or `Replayed`
    /// once it finished), as with `begin`.
    ///
    /// # Errors
    /// What `begin`, `complete` or `fail` return: [`Error::ClaimLost`] if
    /// the lease lapsed during `work` and another attempt took the key over
    /// (its result must not be published); [`Error::InvalidInput`] for an
    /// outcome over the store's limit (the key is then released as a
    /// retryable failure when the claim drops); [`Error::InvalidArgument`]
    /// for a key recorded by `insert_if_absent`, which has no outcome to
    /// replay. The work's own errors are not errors of `run`: they come
    /// back in `RetryAfter` and `GaveUp`.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{ErrorClass, Fingerprint, Key, RetryPolicy, Run, Store};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let policy = RetryPolicy::builder()
    ///     .base(Duration::from_millis(1))
    ///     .cap(Duration::from_millis(10))
    ///     .build()?;
    /// let key = Key::new("shop-42", "ship-order-7");
    /// let transient = |_: &String| ErrorClass::Retryable; // every error here is worth a retry
    /// let mut calls = 0;
    /// let label = loop {
    ///     let run = policy.run(&store, &key, Fingerprint::of("order 7"), transient, |claim| {
    ///         calls += 1; // the provider times out once, then answers
    ///         if calls == 1 {
    ///             return Err("timeout".to_string());
    ///         }
    ///         Ok(format!("label for {}", claim.provider_key()).into_bytes())
    ///     })?;
    ///     match run {
    ///         Run::Done(label) | Run::Replayed(label) => break label,
    ///         Run::GaveUp { reason, error, .. } => panic!("{reason}: {error}"),
    ///         Run::Failed(record) => panic!("failed before: {:?}", record.outcome()),
    ///         other => std::thread::sleep(other.retry_after().unwrap_or_default()),
    ///     }
    /// };
    /// assert!(label.starts_with(b"label for "));
    /// assert_eq!(calls, 2);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn run<E, C, F>(
        &self,
        store: &Store,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        classify: C,
        work: F,
    ) -> Result<Run<Vec<u8>, E>>
    where
        E: fmt::Display,
        C: FnOnce(&E) -> ErrorClass,
        F: FnOnce(&Claim) -> std::result::Result<Vec<u8>, E>,
    {
        self.run_as::<Raw, _, _, _, _>(store, key, fingerprint, classify, work)
    }

    /// [`run`](Self::run) with a typed outcome: recorded with
    /// [`Store::complete_value`] and replayed with
    /// [`Record::outcome_as`].
    ///
    /// # Errors
    /// As `run`, and [`Error::Codec`] if the outcome cannot be stored as
    /// JSON, or a stored one does not decode as `T`.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{ErrorClass, Fingerprint, Key, RetryPolicy, Run, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// let policy = RetryPolicy::new();
    /// let key = Key::new("shop-42", "refund-3");
    /// let transient = |_: &String| ErrorClass::Retryable;
    /// let first = policy.run_value(&store, &key, Fingerprint::NONE, transient, |_claim| {
    ///     Ok((201u16, "re_1".to_string())) // (status, refund id)
    /// })?;
    /// assert!(matches!(first, Run::Done((201, _))));
    /// let again: Run<(u16, String), String> =
    ///     policy.run_value(&store, &key, Fingerprint::NONE, transient, |_claim| {
    ///         unreachable!("replayed, not run")
    ///     })?;
    /// assert!(matches!(again, Run::Replayed((201, ref id)) if id == "re_1"));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn run_value<T, E, C, F>(
        &self,
        store: &Store,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        classify: C,
        work: F,
    ) -> Result<Run<T, E>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: fmt::Display,
        C: FnOnce(&E) -> ErrorClass,
        F: FnOnce(&Claim) -> std::result::Result<T, E>,
    {
        self.run_as::<Json, _, _, _, _>(store, key, fingerprint, classify, work)
    }

    fn run_as<K, T, E, C, F>(
        &self,
        store: &Store,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        classify: C,
        work: F,
    ) -> Result<Run<T, E>>
    where
        K: Outcome<T>,
        E: fmt::Display,
        C: FnOnce(&E) -> ErrorClass,
        F: FnOnce(&Claim) -> std::result::Result<T, E>,
    {
        match store.begin_with(key, fingerprint, &self.begin)? {
            Begin::Started(claim) => match work(&claim) {
                Ok(outcome) => {
                    K::record(store, &claim, &outcome)?;
                    Ok(Run::Done(outcome))
                }
                Err(error) => {
                    let class = classify(&error);
                    self.failed(store, &claim, class, error)
                }
            },
            Begin::Completed(record) => match record.state() {
                State::Completed => Ok(Run::Replayed(K::replay(&record)?)),
                State::Failed => Ok(Run::Failed(record)),
                _ => Err(Error::InvalidArgument {
                    what: "key",
                    reason: format!(
                        "{key} was recorded by insert_if_absent: it has no outcome to replay"
                    ),
                }),
            },
            Begin::InProgress(p) => {
                let lease_expires_at = p.lease_expires_at();
                Ok(Run::InProgress {
                    retry_after: lease_expires_at
                        .duration_since(self.now())
                        .unwrap_or(Duration::ZERO),
                    lease_expires_at,
                    attempt: p.attempt(),
                })
            }
        }
    }

    /// Records the failed attempt of `claim` as the policy decides.
    fn failed<T, E: fmt::Display>(
        &self,
        store: &Store,
        claim: &Claim,
        class: ErrorClass,
        error: E,
    ) -> Result<Run<T, E>> {
        let attempt = claim.attempt();
        let reason = match class {
            ErrorClass::Permanent => GiveUpReason::Permanent,
            ErrorClass::Retryable => {
                let elapsed = match self.max_elapsed {
                    Some(_) => self.elapsed(store, claim)?,
                    None => Duration::ZERO,
                };
                match self.decide(attempt, elapsed, None) {
                    Decision::Retry { after } => {
                        store.fail(claim, Failure::Retryable)?;
                        return Ok(Run::RetryAfter {
                            after,
                            attempt,
                            error,
                        });
                    }
                    Decision::GiveUp(reason) => reason,
                }
            }
        };
        let text = failure_text(&reason, &error);
        store.fail(claim, Failure::Permanent(text.as_bytes()))?;
        Ok(Run::GaveUp {
            attempts: attempt,
            reason,
            error,
        })
    }

    /// Time since the operation's first attempt, by the store's record of
    /// it; "now" is never earlier than that record's time.
    fn elapsed(&self, store: &Store, claim: &Claim) -> Result<Duration> {
        let Some(record) = store.get(claim.key())? else {
            // Unreachable while the claim is live: its record is kept.
            return Ok(Duration::ZERO);
        };
        let now = self.now().max(record.updated_at());
        Ok(now
            .duration_since(record.first_seen_at())
            .unwrap_or(Duration::ZERO))
    }

    fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.clock.now_millis())
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

/// How the runner records an outcome and replays a stored one.
trait Outcome<T> {
    fn record(store: &Store, claim: &Claim, outcome: &T) -> Result<()>;
    fn replay(record: &Record) -> Result<T>;
}

/// Raw bytes: `complete` and `Record::outcome`.
struct Raw;

impl Outcome<Vec<u8>> for Raw {
    fn record(store: &Store, claim: &Claim, outcome: &Vec<u8>) -> Result<()> {
        store.complete(claim, outcome)
    }

    fn replay(record: &Record) -> Result<Vec<u8>> {
        Ok(record.outcome().unwrap_or_default().to_vec())
    }
}

/// Typed values: `complete_value` and `Record::outcome_as`.
struct Json;

impl<T: serde::Serialize + serde::de::DeserializeOwned> Outcome<T> for Json {
    fn record(store: &Store, claim: &Claim, outcome: &T) -> Result<()> {
        store.complete_value(claim, outcome)
    }

    fn replay(record: &Record) -> Result<T> {
        record.outcome_as()
    }
}

/// `"<reason>: <error>"`, cut to [`MAX_FAILURE_TEXT`] bytes at a character
/// boundary.
fn failure_text(reason: &GiveUpReason, error: &dyn fmt::Display) -> String {
    let mut text = format!("{reason}: {error}");
    if text.len() > MAX_FAILURE_TEXT {
        let mut end = MAX_FAILURE_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A duration of `nanos` nanoseconds, saturating at `Duration::MAX`.
fn from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    match u64::try_from(nanos / NANOS_PER_SEC) {
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}

/// A seed from the operating system; if it has none to give, one from the
/// time and a per-process counter (jitter needs spread, not secrecy).
fn random_seed() -> u64 {
    static FALLBACK: AtomicU64 = AtomicU64::new(0);
    getrandom::u64().unwrap_or_else(|_| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos
            ^ FALLBACK
                .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
                .rotate_left(32)
    })
}

/// `SplitMix64` (Steele, Lea and Flood, 2014): one 64-bit state advanced by a
/// fixed odd step, so an atomic add makes it shareable between threads
/// without a lock. Small and fast, statistically strong for jitter; not
/// cryptographic.
#[derive(Debug)]
struct SplitMix64(AtomicU64);

impl SplitMix64 {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    fn new(seed: u64) -> Self {
        Self(AtomicU64::new(seed))
    }

    fn next_u64(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(Self::GAMMA, Ordering::Relaxed)
            .wrapping_add(Self::GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n]`. From 128 random bits modulo `n + 1`: the bias is
    /// below `(n + 1) / 2^128`, under 2^-34 for any `Duration` in nanoseconds.
    fn up_to(&self, n: u128) -> u128 {
        let r = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
        match n.checked_add(1) {
            Some(m) => r % m,
            None => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The first outputs of the reference implementation seeded with 0.
        let rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn up_to_stays_in_range_at_the_edges() {
        let rng = SplitMix64::new(9);
        for _ in 0..1000 {
            assert_eq!(rng.up_to(0), 0);
            assert!(rng.up_to(1) <= 1);
            assert!(rng.up_to(Duration::MAX.as_nanos()) <= Duration::MAX.as_nanos());
        }
        // n + 1 would overflow: every value is in range, and nothing panics.
        let _ = rng.up_to(u128::MAX);
    }

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

    #[test]
    fn failure_text_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_FAILURE_TEXT);
        let text = failure_text(&GiveUpReason::Permanent, &long);
        assert!(text.len() <= MAX_FAILURE_TEXT);
        assert!(text.len() >= MAX_FAILURE_TEXT - 1);
        assert!(text.starts_with("permanent error: é"));
    }
}
