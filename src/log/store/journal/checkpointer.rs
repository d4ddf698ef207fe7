//! The journal's background checkpointer: a thread owned by the journal
//! store that writes the run of records the writer just left into the
//! store of record, while the writer appends to the other half.
//!
//! The writer hands over a run with [`Handoff::give`] when it switches
//! halves (once the run it leaves passed its high-water mark, or when the
//! next record would not fit); the thread commits the run's overlay with
//! the mark, makes it durable, then frees the half ([`Handoff::done`]).
//! A writer waits ([`Handoff::idle`]) only when its half is full and the
//! other one is still being checkpointed, or before a read that needs the
//! store whole.

use super::Inner;
use crate::log::error::LogError;
use crate::sync::{Arc, Condvar, JoinHandle, Mutex};

/// What the writer and the checkpointer share.
#[derive(Default)]
pub(super) struct Handoff {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The mark to write with the run being checkpointed: the last
    /// sequence of the run and the epoch after it.
    job: Option<(u64, u64)>,
    /// Why a checkpoint failed (the store's sticky failure).
    failed: Option<String>,
    /// Set when the store is dropped: the thread finishes its job and ends.
    stop: bool,
}

impl Handoff {
    /// Gives the checkpointer a run to write, with its `mark`. The caller
    /// made sure the last one is done ([`Handoff::idle`] is true).
    pub(super) fn give(&self, mark: (u64, u64)) {
        let mut s = self.state.lock();
        s.job = Some(mark);
        self.changed.notify_all();
    }

    /// Without waiting: `None` while a run is being checkpointed, else
    /// whether the checkpoints so far succeeded (a failed one's half is
    /// not free: its run is in no store but the journal).
    pub(super) fn try_idle(&self) -> Option<Result<(), String>> {
        let s = self.state.lock();
        if s.job.is_some() {
            return None;
        }
        Some(s.failed.clone().map_or(Ok(()), Err))
    }

    /// Waits until no run is being checkpointed; the failure, if one did.
    pub(super) fn idle(&self) -> Result<(), String> {
        let mut s = self.state.lock();
        while s.job.is_some() {
            self.changed.wait(&mut s);
        }
        s.failed.clone().map_or(Ok(()), Err)
    }

    /// Why a checkpoint failed, if one did.
    pub(super) fn failed(&self) -> Option<String> {
        self.state.lock().failed.clone()
    }

    fn done(&self, failed: Option<String>) {
        let mut s = self.state.lock();
        s.job = None;
        if failed.is_some() {
            s.failed = failed;
        }
        self.changed.notify_all();
    }

    /// The next job, or `None` once stopped with nothing left.
    fn next(&self) -> Option<(u64, u64)> {
        let mut s = self.state.lock();
        loop {
            if let Some(j) = s.job {
                return Some(j);
            }
            if s.stop {
                return None;
            }
            self.changed.wait(&mut s);
        }
    }

    /// Asks the thread to end once its job is done.
    pub(super) fn stop(&self) {
        self.state.lock().stop = true;
        self.changed.notify_all();
    }

    /// Lets a stopped checkpointer be started again.
    pub(super) fn restart(&self) {
        self.state.lock().stop = false;
    }

    /// No checkpointer runs again (it could not be restarted): every
    /// writer that needs one is refused with `why`, never left waiting.
    pub(super) fn fail(&self, why: String) {
        let mut s = self.state.lock();
        s.stop = true;
        s.failed = Some(why);
        s.job = None;
        self.changed.notify_all();
    }
}

/// Starts the checkpointer of `inner` (which has a journal).
pub(super) fn start(inner: &Arc<Inner>) -> Result<JoinHandle<()>, LogError> {
    let inner = Arc::clone(inner);
    crate::sync::spawn("dedupkv-checkpoint", move || run(&inner))
        .map_err(|e| LogError::Storage(e.into()))
}

fn run(inner: &Inner) {
    let Some(j) = &inner.journal else { return };
    while let Some(mark) = j.handoff.next() {
        // A panic of the storage engine (a damaged file) is a failed
        // checkpoint like any other: `done` always runs, or every writer
        // and the drop would wait for this job forever.
        let ran =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.checkpoint_old(mark)));
        let failed = match ran {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("a checkpoint failed: {e}")),
            Err(_) => Some("a checkpoint failed: the storage engine panicked".to_string()),
        };
        j.handoff.done(failed);
    }
}
