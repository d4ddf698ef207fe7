//! Key-level reconciliation: the keys a scope's windows kept, matched with
//! the keys the system of record lists per window.
//!
//! How a boundary is judged: an operation's window is the store's time
//! when it completed; the system of record buckets by its own clock (when
//! it accepted the call, usually a little earlier). A key it lists in one
//! window that the store completed in the next (or the one before) is
//! matched there, once, when the store's completion lies within the
//! settle margin of the boundary between them: reported as `straddled`,
//! never as missing in one window and extra in the other. Same-window
//! matches are made first, so a straddle never takes a key a window
//! matches itself. A key the store completed within the margin of a
//! boundary whose other window the call did not give cannot be judged:
//! `unsettled`.

use std::time::Duration;

use super::Engine;
use super::reconcile::Counting;
use crate::clock::to_system_time;
use crate::contract::Completion;
use crate::types::{KeyReconciliation, WindowKeys};
use crate::{Error, Result};

impl Engine {
    /// Compares the keys `scope` kept with `theirs`, window by window,
    /// matching across a boundary within `settle`.
    pub(crate) fn reconcile_keys(
        &self,
        scope: &[u8],
        theirs: &[WindowKeys],
        settle: Duration,
    ) -> Result<KeyReconciliation> {
        self.check_keys_scope(scope)?;
        crate::contract::reconcile_keys(
            Duration::from_millis(self.config().tally_window_ms),
            settle,
            theirs,
            |span| Ok(self.completions(scope, span)),
        )
    }

    /// The completions `scope` kept in the windows starting in `starts`
    /// (the scope must keep keys).
    pub(crate) fn completions(
        &self,
        scope: &[u8],
        starts: std::ops::RangeInclusive<u64>,
    ) -> Vec<Completion> {
        self.keys_of(scope, starts)
            .into_iter()
            .map(|(start, id, provider_key, at)| {
                Completion::new(to_system_time(start), id, provider_key, to_system_time(at))
            })
            .collect()
    }

    /// Fails unless `scope` keeps keys.
    pub(crate) fn check_keys_scope(&self, scope: &[u8]) -> Result<()> {
        self.check_tally_scope(scope)?;
        if self.counting() == Counting::Legacy {
            self.require_format(
                "reconciling keys (kept keys; an upgrade of the open store takes effect at \
                 its next open)",
                crate::records::BODIES_FORMAT,
                true,
            )?;
        }
        if !self.keeps_keys(scope) {
            return Err(Error::InvalidArgument {
                what: "scope",
                reason: format!(
                    "{:?} keeps no keys: name it with StoreBuilder::reconcile_keys_of",
                    String::from_utf8_lossy(scope)
                ),
            });
        }
        Ok(())
    }
}
