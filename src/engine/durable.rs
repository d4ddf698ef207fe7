//! The engine's side of the async front: a call run with its durability
//! waits deferred (see `log/durable.rs`), and the wait for a row, as a
//! poll. The call itself is the one synchronous operation, unchanged.
//! Without the `async` feature only `blocking` is used.
#![cfg_attr(not(feature = "async"), allow(dead_code, unused_imports))]

use std::task::{Context, Poll};

use super::Engine;
use crate::Result;
use crate::sync::Arc;

/// `deferring(scope, f)` runs `f` (one or more of the engine's calls) on
/// this thread with the waits its answers need deferred, and returns its
/// result and the rows to await; `blocking(f)` runs `f` with no deferring
/// scope, even inside one (work whose waits must happen in order, such as
/// eviction).
pub(crate) use crate::log::{Scope, Waiting, blocking, deferring};

impl Engine {
    /// The row holding the newest record appended so far (a flush awaits it).
    pub(crate) fn last_row(&self) -> u64 {
        self.log.last_row()
    }

    #[cfg(feature = "async")]
    /// Polls for `row` to be durable (see `Log::poll_durable`).
    pub(crate) fn poll_durable(
        &self,
        row: u64,
        slot: &mut Option<Arc<Waiting>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        self.log.poll_durable(row, slot, cx)
    }

    /// Forgets the waker of a future that stopped waiting for a row.
    #[cfg(feature = "async")]
    pub(crate) fn stop_waiting(&self, slot: &Arc<Waiting>) {
        self.log.stop_waiting(slot);
    }

    #[cfg(feature = "async")]
    /// Polls for `row` to be kept for the store's next owner (see
    /// `Log::poll_kept`).
    pub(crate) fn poll_kept(
        &self,
        row: u64,
        slot: &mut Option<Arc<Waiting>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        self.log.poll_kept(row, slot, cx)
    }

    /// Forgets the waker of a `poll_kept` future that stopped waiting.
    #[cfg(feature = "async")]
    pub(crate) fn stop_waiting_kept(&self, slot: &Arc<Waiting>) {
        self.log.stop_waiting_kept(slot);
    }
}
