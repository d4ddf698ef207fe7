//! The store's time: the clock's reading, never earlier than a time the
//! store has used or recorded (persisted as the manifest's time floor),
//! never past [`MAX_TIME`].
//!
//! Invariant: time as the store sees it never goes backwards. While the
//! clock reads behind it, `Stats::clock_behind` counts, a warning is
//! logged, and the store's time stands still (no lease lapses, no key
//! expires) or, with `ClockBehind::Advance`, runs on from the latest time
//! it reached at the monotonic clock's rate: never faster than real time,
//! so no lease lapses sooner than its length.

use std::time::Duration;

use super::Engine;
use crate::clock::ClockBehind;
use crate::sync::{AtomicBool, AtomicU64, Ordering};
use crate::types::{BeginOptions, Intent};
use crate::{Error, Result};

/// The latest time the store uses: 9999-12-31T23:59:59.999Z. A clock
/// reading past it (a broken clock, a test's `u64::MAX`) is held there, so
/// a lease or retention added to it never saturates into "forever ago".
pub(crate) const MAX_TIME: u64 = 253_402_300_799_999;

/// How far the clock may read behind the store's time before it counts
/// as behind (callers racing across a millisecond always differ a little).
const CLOCK_SLACK_MS: u64 = 1_000;

/// How far the current bucket may move past the last eviction before a
/// call evicts first. Slots widen their bucket exactly within 2^23 of the
/// bucket they are compared with, and live slots reach up to
/// [`MAX_BUCKET_SPAN`](crate::index::MAX_BUCKET_SPAN) (2^22) ahead: 2^21
/// behind keeps every comparison inside that.
const FORCE_EVICT_SPAN: u64 = crate::index::MAX_BUCKET_SPAN / 2;

/// The lease and retention of one operation, in ms, and the intent its
/// claim records.
#[derive(Clone, Copy)]
pub(crate) struct Op<'a> {
    pub lease_ms: u64,
    pub retention_ms: u64,
    pub intent: Option<Intent<'a>>,
}

/// The store's time, and what it needs to run on while the clock is behind.
pub(crate) struct StoreTime {
    /// The highest time the store has used (at open, at least the latest
    /// time it recorded). Only grows.
    at: AtomicU64,
    /// The clock was last seen behind `at` (by more than the slack).
    behind: AtomicBool,
    /// With [`ClockBehind::Advance`]: the highest `time - since` seen (a
    /// time the store reached, less the monotonic time since the open
    /// then), so `since + ahead` is the latest time reached plus the real
    /// time that passed since. Only grows.
    ahead: AtomicU64,
    /// The monotonic clock's reading at the open: only its differences
    /// count, whatever it started from.
    opened: u64,
    /// The store's time when this run opened it: claims of earlier
    /// processes are stranded from then at the latest.
    opened_at: u64,
}

impl StoreTime {
    /// The time of a store that opened at `time`, with the monotonic clock
    /// reading `elapsed`.
    pub(crate) fn starting_at(time: u64, elapsed: u64) -> Self {
        Self {
            at: AtomicU64::new(time),
            behind: AtomicBool::new(false),
            ahead: AtomicU64::new(time),
            opened: elapsed,
            opened_at: time,
        }
    }

    /// The store's time when this run opened it.
    pub(crate) fn opened_at(&self) -> u64 {
        self.opened_at
    }

    /// The monotonic time since the open, in ms, given its reading now (0
    /// for a reading below the open's: it never goes back).
    fn since_open(&self, elapsed: u64) -> u64 {
        elapsed.saturating_sub(self.opened)
    }
}

impl Engine {
    /// The store's time now.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        let reading = self.clock.now_millis().min(MAX_TIME);
        let time = self.time.at.load(Ordering::Relaxed);
        if reading > time {
            // Another caller may have moved it further meanwhile.
            let time = self
                .time
                .at
                .fetch_max(reading, Ordering::Relaxed)
                .max(reading);
            if self.cfg.clock_behind == ClockBehind::Advance {
                self.anchor(reading);
            }
            if self.time.behind.load(Ordering::Relaxed) {
                self.clock_caught_up();
            }
            return time;
        }
        if time - reading > CLOCK_SLACK_MS {
            return self.clock_is_behind(reading, time);
        }
        time
    }

    /// Notes that the store's time reached `time` now, on the monotonic
    /// clock: it runs on from there while the clock is behind.
    fn anchor(&self, time: u64) {
        let since = self.time.since_open(self.clock.elapsed_millis());
        self.time
            .ahead
            .fetch_max(time.saturating_sub(since), Ordering::Relaxed);
    }

    /// The store's time while the clock reads `reading`, behind `time`.
    #[cold]
    fn clock_is_behind(&self, reading: u64, time: u64) -> u64 {
        self.counters.clock_behind.fetch_add(1, Ordering::Relaxed);
        if !self.time.behind.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                clock_ms = reading,
                store_ms = time,
                behind_ms = time - reading,
                advance = self.cfg.clock_behind == ClockBehind::Advance,
                "dedupkv: the clock reads earlier than the store's time; the store's time \
                 stands still (no lease lapses, no key expires) until the clock catches up, \
                 or with ClockBehind::Advance runs on at the monotonic clock's rate"
            );
        }
        if self.cfg.clock_behind != ClockBehind::Advance {
            return time;
        }
        // The latest time reached plus the real time passed since: never
        // sooner than a lease's length in real time.
        let ran_on = self
            .time
            .since_open(self.clock.elapsed_millis())
            .saturating_add(self.time.ahead.load(Ordering::Relaxed))
            .min(MAX_TIME);
        if ran_on <= time {
            return time;
        }
        self.time
            .at
            .fetch_max(ran_on, Ordering::Relaxed)
            .max(ran_on)
    }

    #[cold]
    fn clock_caught_up(&self) {
        if self.time.behind.swap(false, Ordering::Relaxed) {
            tracing::warn!("dedupkv: the clock caught up with the store's time");
        }
    }

    /// The store's time and its bucket, for a call about to read or write
    /// slots. If the time has moved so far past the last eviction that a
    /// slot's 24 bucket bits could wrap, evicts first (under no lock).
    #[inline]
    pub(crate) fn time(&self) -> Result<(u64, u64)> {
        let now = self.now();
        let nb = self.bucket_of(now);
        if nb
            >= self
                .buckets
                .evicted_through
                .load(Ordering::Relaxed)
                .saturating_add(FORCE_EVICT_SPAN)
        {
            // Far behind: this caller evicts first, and waits for it.
            self.evict()?;
        }
        Ok((now, nb))
    }

    /// A per-call retention in ms: at least 1 ms, within the buckets a slot
    /// can represent, and no shorter than the store's `max_retry_window`.
    pub(crate) fn check_retention(&self, retention: Duration) -> Result<u64> {
        let ms = crate::clock::millis(retention);
        if ms == 0 {
            return Err(Error::InvalidArgument {
                what: "retention",
                reason: "is 0: a key kept for no time deduplicates nothing".into(),
            });
        }
        if ms / self.cfg.granularity_ms >= crate::index::MAX_BUCKET_SPAN {
            return Err(Error::InvalidConfig(format!(
                "a retention of {ms} ms spans more than {} buckets of {} ms",
                crate::index::MAX_BUCKET_SPAN - 1,
                self.cfg.granularity_ms
            )));
        }
        if let Some(window) = self.cfg.max_retry_window_ms
            && ms < window
        {
            return Err(Error::InvalidArgument {
                what: "retention",
                reason: format!(
                    "of {ms} ms is shorter than the store's max retry window ({window} ms): \
                     a redelivery after it would be handled twice"
                ),
            });
        }
        Ok(ms)
    }

    /// A per-call lease in ms: at least 1 ms, and short enough that a
    /// claim's record stays within the buckets a slot can represent.
    pub(crate) fn check_lease(&self, lease: Duration) -> Result<u64> {
        let ms = crate::clock::millis(lease);
        if ms == 0 {
            return Err(Error::InvalidArgument {
                what: "lease",
                reason: "is 0; a claim's lease must be at least 1 ms".into(),
            });
        }
        if ms / self.cfg.granularity_ms >= crate::index::MAX_BUCKET_SPAN {
            return Err(Error::InvalidArgument {
                what: "lease",
                reason: format!(
                    "of {ms} ms spans more than {} buckets of {} ms",
                    crate::index::MAX_BUCKET_SPAN - 1,
                    self.cfg.granularity_ms
                ),
            });
        }
        Ok(ms)
    }

    /// The lease and retention of an operation begun with `options`.
    pub(crate) fn op(&self, options: &BeginOptions) -> Result<Op<'static>> {
        Ok(Op {
            lease_ms: match options.lease {
                Some(d) => self.check_lease(d)?,
                None => self.cfg.lease_ms,
            },
            retention_ms: match options.retention {
                Some(d) => self.check_retention(d)?,
                None => self.cfg.retention_ms,
            },
            intent: None,
        })
    }
}
