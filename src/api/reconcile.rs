//! The reconciliation calls: completions counted (and summed, and for a
//! scope that keeps them, their keys kept) per window, compared with the
//! system of record's counts or keys (the engine's `reconcile` rooms do
//! the work).

use crate::api::store::Backend;
use crate::contract::{Settle, Tallies, Write};
use crate::{Claim, KeyReconciliation, Reconciliation, Result, Store, Tally, WindowKeys};
#[cfg(doc)]
use crate::{Error, StoreBuilder};

impl Store {
    /// [`complete`](Self::complete), counting `amount` (a charge in cents,
    /// items shipped) in the scope's reconciliation window: see
    /// [`tallies`](Self::tallies) and [`reconcile`](Self::reconcile).
    /// Every completion is counted; a plain `complete` counts 0. An amount
    /// other than 0 adds one small record to the completion's commit.
    ///
    /// One operation's amount is an `i64`; a window's sum
    /// ([`Tally::amount`]) is an `i128`, so no number of `i64::MAX`
    /// amounts in one window can overflow it.
    ///
    /// # Errors
    /// As `complete`.
    ///
    /// # Examples
    /// See [`Tally`].
    pub fn complete_with_amount(&self, claim: &Claim, outcome: &[u8], amount: i64) -> Result<()> {
        let outcome = crate::contract::Outcome::raw(outcome).amount(amount);
        self.tell(Write::complete(self, claim, outcome)?)
    }

    /// The scope's reconciliation windows: per window, how many operations
    /// completed and the sum of their amounts, oldest first. A completion
    /// counts in the window of the store's time when it completed. Durable
    /// (rebuilt at open from the completions' own records, and from a
    /// window's totals that eviction writes before those records leave)
    /// and kept `reconcile_retention` after a window's end.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty scope or one longer than
    /// `max_scope_len`.
    ///
    /// # Examples
    /// See [`Tally`].
    pub fn tallies(&self, scope: impl AsRef<[u8]>) -> Result<Vec<Tally>> {
        Tallies::tallies(self, scope.as_ref())
    }

    /// Compares the scope's windows with the system of record's counts
    /// (`theirs`, one [`Tally::new`] per window; several for one window add
    /// up): per window, operations completed here that it lacks
    /// (`missing`: effects lost) and operations it has beyond those
    /// (`extra`: duplicate effects, or work done outside the store). A
    /// count cannot say which operation, nor tell an operation the system
    /// of record bucketed one window earlier (a call accepted just before
    /// a boundary, completed just after): for those, keep the scope's keys
    /// and use [`reconcile_keys`](Self::reconcile_keys).
    ///
    /// # Errors
    /// As [`tallies`](Self::tallies); [`Error::InvalidArgument`] for a
    /// tally whose `window_start` is not a boundary of `reconcile_window`
    /// (the error names both).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Begin, Fingerprint, Key, ManualClock, Store, Tally};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_002_800_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// for order in ["o1", "o2", "o3"] {
    ///     let Begin::Started(c) = store.begin(&Key::new("shipments", order), Fingerprint::NONE)? else { unreachable!() };
    ///     store.complete(&c, b"label")?;
    /// }
    /// let window = store.tallies("shipments")?[0].window_start;
    /// // The carrier's invoice lists four labels for that hour: one too many.
    /// let report = store.reconcile("shipments", &[Tally::new(window, 4, 0)])?;
    /// assert!(!report.is_clean());
    /// assert_eq!(report.windows[0].extra, 1);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn reconcile(&self, scope: impl AsRef<[u8]>, theirs: &[Tally]) -> Result<Reconciliation> {
        Tallies::reconcile(self, scope.as_ref(), theirs)
    }

    /// Compares the keys the scope kept (see
    /// [`StoreBuilder::reconcile_keys_of`]) with the keys the system of
    /// record lists per window (`theirs`: ids or provider keys, one kind
    /// per call), and names every key that differs: per window, the
    /// operations completed here that it lacks (`missing`), the keys it
    /// lists beyond those (`extra`; a key listed twice is extra once), and
    /// the keys it could not judge (`unsettled`, below).
    ///
    /// A completion's window is the store's time when it completed; the
    /// system of record buckets by its own clock, usually a little
    /// earlier. A key it lists in one window that the store completed in
    /// the next one (or the one before), within `settle` of the boundary
    /// between them, is matched once and listed as `straddled` (not as
    /// missing in one window and extra in the other). Give consecutive
    /// windows in one call: an operation completed within `settle` of a
    /// boundary whose other window the call does not give may be listed
    /// there, and is reported `unsettled` instead of missing. Reported:
    /// every window `theirs` gives, and every window between the first
    /// and the last that kept keys.
    ///
    /// # Errors
    /// As [`reconcile`](Self::reconcile) (for each `window_start`), and
    /// [`Error::InvalidArgument`] for a scope that keeps no keys, a call
    /// that mixes ids and provider keys, or a `settle` longer than the
    /// window.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Begin, Fingerprint, Key, ManualClock, Store, WindowKeys};
    /// use std::time::{Duration, UNIX_EPOCH};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let minute = Duration::from_secs(60);
    /// let clock = ManualClock::new(1_700_000_040_000); // a minute boundary
    /// let store = Store::builder()
    ///     .clock(clock.clone())
    ///     .reconcile_window(minute)
    ///     .reconcile_keys_of("shipments")
    ///     .open(dir.path().join("s.redb"))?;
    /// let ship = |order: &str| -> dedupkv::Result<()> {
    ///     let Begin::Started(c) = store.begin(&Key::new("shipments", order), Fingerprint::NONE)? else { unreachable!() };
    ///     store.complete(&c, b"label")
    /// };
    /// ship("o1")?;
    /// clock.advance(Duration::from_secs(59));
    /// ship("o2")?;
    /// clock.advance(Duration::from_secs(2)); // the next minute
    /// ship("o3")?; // the carrier accepted it a second before the boundary
    /// let w0 = UNIX_EPOCH + Duration::from_millis(1_700_000_040_000);
    /// let invoice = [
    ///     WindowKeys::ids(w0, ["o1", "o3", "o9"]),
    ///     WindowKeys::ids(w0 + minute, Vec::<&str>::new()),
    /// ];
    /// let report = store.reconcile_keys("shipments", &invoice, Duration::from_secs(5))?;
    /// let first = &report.windows[0];
    /// assert_eq!(first.missing, vec![b"o2".to_vec()]); // the carrier never shipped it
    /// assert_eq!(first.extra, vec![b"o9".to_vec()]); // nor did we ask for this one
    /// assert_eq!(first.straddled, vec![b"o3".to_vec()]); // matched once, across the boundary
    /// assert!(report.windows[1].is_clean());
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn reconcile_keys(
        &self,
        scope: impl AsRef<[u8]>,
        theirs: &[WindowKeys],
        settle: std::time::Duration,
    ) -> Result<KeyReconciliation> {
        Tallies::reconcile_keys(self, scope.as_ref(), theirs, settle)
    }
}

impl Tallies for Store {
    fn tally_window(&self) -> std::time::Duration {
        match self.backend() {
            Backend::Engine(engine) => {
                std::time::Duration::from_millis(engine.config().tally_window_ms)
            }
            Backend::Shared(b) => b.tally_window(),
        }
    }

    fn tallies(&self, scope: &[u8]) -> Result<Vec<Tally>> {
        match self.backend() {
            Backend::Engine(engine) => engine.tallies(scope),
            Backend::Shared(b) => b.tallies(scope),
        }
    }

    fn reconcile(&self, scope: &[u8], theirs: &[Tally]) -> Result<Reconciliation> {
        match self.backend() {
            Backend::Engine(engine) => engine.reconcile(scope, theirs),
            Backend::Shared(b) => {
                crate::contract::reconcile_tallies(b.tally_window(), &b.tallies(scope)?, theirs)
            }
        }
    }

    fn completions(
        &self,
        scope: &[u8],
        starts: std::ops::RangeInclusive<u64>,
    ) -> Result<Vec<crate::contract::Completion>> {
        match self.backend() {
            Backend::Engine(engine) => {
                engine.check_keys_scope(scope)?;
                Ok(engine.completions(scope, starts))
            }
            Backend::Shared(b) => b.completions(scope, starts),
        }
    }

    fn reconcile_keys(
        &self,
        scope: &[u8],
        theirs: &[WindowKeys],
        settle: std::time::Duration,
    ) -> Result<KeyReconciliation> {
        match self.backend() {
            Backend::Engine(engine) => engine.reconcile_keys(scope, theirs, settle),
            Backend::Shared(b) => {
                crate::contract::reconcile_keys(b.tally_window(), settle, theirs, |span| {
                    b.completions(scope, span)
                })
            }
        }
    }
}
