//! The engine's side of the two faces: what an answer rests on, waited
//! for (the blocking face) or polled (the async face, see
//! `log/durable.rs`). The call itself is the same for both: it decides,
//! appends and returns its basis without waiting.
#![cfg_attr(not(feature = "async"), allow(dead_code, unused_imports))]

use std::task::{Context, Poll};

use super::Engine;
use crate::Result;
use crate::sync::Arc;
use crate::types::Basis;

pub(crate) use super::Waiting;

impl Engine {
    /// Waits until an answer resting on `basis` may be told: its own rows
    /// made durable as the durability mode requires, the rows it was read
    /// from durable in `Immediate` mode.
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
