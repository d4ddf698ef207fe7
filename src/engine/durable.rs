//! The engine's side of the async front: a call run with its durability
//! waits deferred (see `log/durable.rs`), and the wait for a row, as a
//! poll. The call itself is the one synchronous operation, unchanged.
//! Without the `async` feature only `blocking` is used.
#![cfg_attr(not(feature = "async"), allow(dead_code, unused_imports))]

use std::task::{Context, Poll};

use super::Engine;
use crate::Result;
use crate::sync::Arc;
use crate::types::Basis;

/// `deferring(scope, f)` runs `f` (one or more of the engine's calls) on
/// this thread with the waits its answers need deferred, and returns its
/// result and the rows to await; `blocking(f)` runs `f` with no deferring
/// scope, even inside one (work whose waits must happen in order, such as
/// eviction).
pub(crate) use super::{Scope, Waiting, blocking, deferring};

impl Engine {
    /// Waits until an answer resting on `basis` may be told: its own rows
    /// made durable as the durability mode requires, the rows it was read
    /// from durable in `Immediate` mode. Inside a deferring scope (the
    /// async front's `call`), the waits are noted instead.
    #[inline]
    pub(crate) fn wait_basis(&self, basis: Basis) -> Result<()> {
        if basis.written_at() > 0 {
            self.log.settle(basis.written_at())?;
        }
        if basis.read_at() > 0 {
            self.settle_seen(basis.read_at())?;
        }
        Ok(())
    }

    /// [`wait_basis`](Self::wait_basis) as a poll: `Ready` once the answer
    /// may be told, else the task's waker registered in `slot` (see
    /// `Log::poll_durable`). Without the `async` feature it blocks.
    pub(crate) fn poll_basis(
        &self,
        basis: Basis,
        slot: &mut Option<Arc<Waiting>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        #[cfg(feature = "async")]
        if self.cfg.durability == crate::Durability::Immediate {
            let row = basis.written_at().max(basis.read_at());
            if row == 0 {
                return Poll::Ready(Ok(()));
            }
            return self.poll_durable(row, slot, cx);
        }
        let _ = (slot, cx);
        Poll::Ready(self.wait_basis(basis))
    }

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
