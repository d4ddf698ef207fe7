//! Waiting for an in-flight result, blocking: `begin`, and while another
//! attempt holds the key, wait for it to finish or lapse, then `begin`
//! again. The async twin is `AsyncStore::begin_or_wait`.

use std::time::{Duration, Instant};

use super::store::Backend;
use crate::engine::waiters::KeyWaiter;
use crate::types::BeginOptions;
use crate::{Begin, Fingerprint, Key, Result, Store};
#[cfg(doc)]
use crate::{Claim, Failure};

impl Store {
    /// [`begin`](Self::begin), but while another attempt holds the key
    /// (`InProgress`), waits — at most `timeout` — for that attempt's
    /// outcome instead of answering at once, then answers as `begin` does:
    ///
    /// - the attempt completed, or failed permanently: [`Begin::Completed`]
    ///   with its record (the first attempt's outcome);
    /// - it was released ([`Failure::Retryable`], or its [`Claim`]
    ///   dropped): [`Begin::Started`], this caller's attempt;
    /// - its lease lapsed: [`Begin::Started`], a takeover
    ///   ([`Claim::interrupted`]);
    /// - it was dead-lettered: [`Begin::DeadLettered`];
    /// - `timeout` passed first: [`Begin::InProgress`], as `begin` said.
    ///
    /// The wait is woken by the claim's finish, never by polling: many
    /// callers waiting on one key cost one wake-up each per finish. A
    /// lease lapses by the store's time: the wait ends at the lease end it
    /// was told (a renewed lease is waited for again); a store driven by a
    /// [`ManualClock`](crate::ManualClock) wakes its waiters in
    /// [`evict_expired`](Self::evict_expired), called after moving the
    /// clock. A key nobody waits on costs nothing. A store that is
    /// poisoned meanwhile (a failed commit, or its replica fenced by
    /// another owner) wakes every waiter at once, which answers the
    /// error ([`Error::Fenced`](crate::Error::Fenced), [`Error::Poisoned`](crate::Error::Poisoned)).
    ///
    /// # Concurrent calls on the same key
    /// As `begin`: of the waiters woken by a release or a lapse, exactly
    /// one gets `Started`; the others see its claim and wait again.
    ///
    /// # Errors
    /// As [`begin`](Self::begin), also when the store is poisoned or
    /// fenced while this call waits.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Begin, Fingerprint, Key, Store};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("shop-42", "charge-7");
    /// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// let waiter = {
    ///     let store = store.clone();
    ///     std::thread::spawn(move || {
    ///         let key = Key::new("shop-42", "charge-7");
    ///         store.begin_or_wait(&key, Fingerprint::NONE, Duration::from_secs(60))
    ///     })
    /// };
    /// store.complete(&claim, b"ch_1")?;
    /// let Begin::Completed(rec) = waiter.join().unwrap()? else { unreachable!() };
    /// assert_eq!(rec.outcome(), Some(&b"ch_1"[..]));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Begin> {
        self.begin_or_wait_with(key, fingerprint, &BeginOptions::new(), timeout)
    }

    /// [`begin_or_wait`](Self::begin_or_wait) with this operation's own
    /// lease and retention (see [`BeginOptions`]).
    ///
    /// # Errors
    /// As [`begin_with`](Self::begin_with).
    ///
    /// # Examples
    /// See [`begin_or_wait`](Self::begin_or_wait).
    pub fn begin_or_wait_with(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Begin> {
        let deadline = Instant::now().checked_add(timeout);
        let first = self.begin_with(key, fingerprint, options)?;
        if !matches!(first, Begin::InProgress(_)) {
            return Ok(first);
        }
        let engine = match self.backend() {
            Backend::Engine(engine) => engine,
            // The backend's own wait (woken across instances).
            Backend::Shared(b) => {
                let left =
                    deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
                return Ok(b
                    .begin_or_wait(key, fingerprint, options, left)?
                    .map_claim(crate::Claim::of_shared));
            }
        };
        let waiter = engine.wait_on(key)?;
        loop {
            let seen = waiter.generation();
            let answer = self.begin_with(key, fingerprint, options)?;
            match wait_after(&answer, &waiter, deadline) {
                None => return Ok(answer),
                Some(at_most) => waiter.wait(seen, at_most),
            }
        }
    }
}

/// What `begin_or_wait` (blocking, and its async twin) does with
/// `answer`: `None`, tell it (not in progress, or `deadline` passed);
/// else wait at most this long for the key to change (until the
/// deadline, or the lease's lapse if sooner).
pub(crate) fn wait_after(
    answer: &Begin,
    waiter: &KeyWaiter<'_>,
    deadline: Option<Instant>,
) -> Option<Duration> {
    let Begin::InProgress(info) = answer else {
        return None;
    };
    let left = match deadline {
        Some(d) => d.saturating_duration_since(Instant::now()),
        None => Duration::MAX,
    };
    if left.is_zero() {
        return None;
    }
    Some(left.min(waiter.until_lapse(info.lease_until)))
}

impl crate::contract::Waits for Store {
    fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Begin> {
        self.begin_or_wait_with(key, fingerprint, options, timeout)
    }
}
