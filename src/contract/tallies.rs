//! Reconciliation counts: per scope and window, how many operations
//! completed and the sum of their amounts, compared with the system of
//! record's. One comparison serves every backend ([`reconcile_tallies`]);
//! a backend keeps the counts ([`Tallies::tallies`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use std::ops::RangeInclusive;

use super::Completion;
use crate::clock::{to_ms, to_system_time};
use crate::types::{KeyReconciliation, WindowDiff, WindowKeys};
use crate::{Error, Reconciliation, Result, Tally};

/// A backend's completion counts, per scope and reconciliation window.
///
/// # Contract
/// Every completion (`complete`, `complete_batch`, a dead letter resolved
/// as completed) counts once, with its amount, in the window of the
/// backend's time when it completed, in the same commit as the completion
/// (a crash keeps both or neither). A window's counts are kept at least
/// the backend's retention of counts after the window's end; windows
/// start at multiples of [`tally_window`](Self::tally_window) since the
/// epoch. [`reconcile`](Self::reconcile) compares them with the system of
/// record's ([`reconcile_tallies`]).
///
/// # Examples
/// ```
/// use dedupkv::contract::Tallies;
/// use dedupkv::{Begin, Fingerprint, Key, Store, Tally};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let Begin::Started(c) = store.begin(&Key::new("shipments", "o1"), Fingerprint::NONE)? else { unreachable!() };
/// store.complete_with_amount(&c, b"label", 700)?;
/// let ours = Tallies::tallies(&store, b"shipments")?;
/// assert_eq!((ours[0].count, ours[0].amount), (1, 700));
/// let theirs = [Tally::new(ours[0].window_start, 1, 700)];
/// assert!(Tallies::reconcile(&store, b"shipments", &theirs)?.is_clean());
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub trait Tallies {
    /// The length of a reconciliation window.
    fn tally_window(&self) -> Duration;

    /// The scope's windows, oldest first, each with its count and sum.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty scope or one over the
    /// backend's limit; the backend's read errors.
    fn tallies(&self, scope: &[u8]) -> Result<Vec<Tally>>;

    /// Compares the scope's windows with `theirs` (several for one window
    /// add up): every window either side counted, oldest first.
    ///
    /// # Errors
    /// As [`tallies`](Self::tallies), and those of [`reconcile_tallies`].
    fn reconcile(&self, scope: &[u8], theirs: &[Tally]) -> Result<Reconciliation> {
        reconcile_tallies(self.tally_window(), &self.tallies(scope)?, theirs)
    }

    /// The scope's completions, each once, in the windows starting in
    /// `starts` (ms since the epoch).
    ///
    /// # Errors
    /// As [`tallies`](Self::tallies), and
    /// [`Error::InvalidArgument`] for a scope whose keys the backend does
    /// not keep (the engine keeps those `StoreBuilder::reconcile_keys_of`
    /// names).
    fn completions(&self, scope: &[u8], starts: RangeInclusive<u64>) -> Result<Vec<Completion>>;

    /// Matches the scope's completions with the system of record's keys
    /// per window ([`reconcile_keys`](super::reconcile_keys())).
    ///
    /// # Errors
    /// As [`completions`](Self::completions), and those of
    /// [`reconcile_keys`](super::reconcile_keys()).
    fn reconcile_keys(
        &self,
        scope: &[u8],
        theirs: &[WindowKeys],
        settle: Duration,
    ) -> Result<KeyReconciliation> {
        super::reconcile_keys(self.tally_window(), settle, theirs, |span| {
            self.completions(scope, span)
        })
    }
}

/// `start` in ms since the epoch, if it is a boundary of windows of
/// `window`; else [`Error::InvalidArgument`] naming `what`, the time and
/// the window.
///
/// # Errors
/// As above.
///
/// # Examples
/// ```
/// use dedupkv::contract::window_start;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let hour = Duration::from_secs(3600);
/// assert_eq!(window_start(hour, "tally", UNIX_EPOCH + 2 * hour)?, 7_200_000);
/// assert!(window_start(hour, "tally", UNIX_EPOCH + Duration::from_secs(1)).is_err());
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn window_start(window: Duration, what: &'static str, start: SystemTime) -> Result<u64> {
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    let ms = start
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .filter(|d| d.subsec_nanos() % 1_000_000 == 0)
        .and_then(|d| u64::try_from(d.as_millis()).ok());
    match ms {
        Some(ms) if ms % window_ms == 0 => Ok(ms),
        _ => {
            let at = start
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or_else(|_| "before the epoch".into(), |d| format!("{d:?}"));
            Err(Error::InvalidArgument {
                what,
                reason: format!(
                    "starts at {at} after the epoch, not at a boundary of the \
                     {window_ms} ms reconcile window (windows start at multiples of it)"
                ),
            })
        }
    }
}

/// Compares `ours` with `theirs`, window by window (tallies of one window
/// add up on either side): per window the counts and sums of both,
/// `missing` (counted here, not there) and `extra` (there, not here),
/// oldest first. Their window starts must be boundaries of `window`.
///
/// # Errors
/// [`Error::InvalidArgument`] for a tally of `theirs` that does not start
/// at a boundary (see [`window_start`]).
///
/// # Examples
/// ```
/// use dedupkv::contract::reconcile_tallies;
/// use dedupkv::Tally;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let hour = Duration::from_secs(3600);
/// let ours = [Tally::new(UNIX_EPOCH + hour, 3, 0)];
/// let report = reconcile_tallies(hour, &ours, &[Tally::new(UNIX_EPOCH + hour, 4, 0)])?;
/// assert_eq!(report.windows[0].extra, 1);
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn reconcile_tallies(
    window: Duration,
    ours: &[Tally],
    theirs: &[Tally],
) -> Result<Reconciliation> {
    type Pair = (u64, i128);
    let add = |p: &mut Pair, t: &Tally| {
        p.0 = p.0.saturating_add(t.count);
        p.1 = p.1.saturating_add(t.amount);
    };
    let mut by_start: BTreeMap<u64, (Pair, Pair)> = BTreeMap::new();
    for t in theirs {
        let start = window_start(window, "tally", t.window_start)?;
        add(&mut by_start.entry(start).or_default().1, t);
    }
    for t in ours {
        add(&mut by_start.entry(to_ms(t.window_start)).or_default().0, t);
    }
    Ok(Reconciliation {
        windows: by_start
            .into_iter()
            .map(|(start, (ours, theirs))| WindowDiff {
                window_start: to_system_time(start),
                ours,
                theirs,
                missing: ours.0.saturating_sub(theirs.0),
                extra: theirs.0.saturating_sub(ours.0),
            })
            .collect(),
    })
}
