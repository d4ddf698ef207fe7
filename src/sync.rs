//! The one place locks, atomics, channels and threads are imported from, so
//! a model checker can swap them in under `cfg(dedupkv_loom)`.
//!
//! The normal build re-exports `parking_lot`, `crossbeam-channel` and `std`
//! unchanged. Built with `RUSTFLAGS="--cfg dedupkv_loom"` (see
//! `scripts/loom.sh`), the same names come from `sync/model.rs`: thin shims
//! that give loom's primitives the `parking_lot`-style API the crate uses.
//! Only `tests/loom.rs` can run in that build: loom's primitives panic
//! outside a `loom::model`.

#[cfg(dedupkv_loom)]
mod model;

#[cfg(not(dedupkv_loom))]
pub(crate) use crossbeam_channel::{Receiver, Sender, bounded};
#[cfg(not(dedupkv_loom))]
pub(crate) use parking_lot::{
    Condvar, MappedRwLockReadGuard, Mutex, MutexGuard, RwLock, RwLockReadGuard,
};
#[cfg(not(dedupkv_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(not(dedupkv_loom))]
pub(crate) use std::thread::JoinHandle;

#[cfg(dedupkv_loom)]
pub(crate) use model::{
    AtomicBool, AtomicU32, AtomicU64, Condvar, Futex, JoinHandle, MappedRwLockReadGuard, Mutex,
    MutexGuard, Ordering, Receiver, RwLock, RwLockReadGuard, Sender, bounded, spawn,
};

// std's in both builds: loom's `Arc` has no `Weak` and cannot be unsized
// into the `Arc<dyn Clock>` that `builder.rs` makes with std's `Arc`.
// Reference counts are not what the models check.
pub(crate) use std::sync::{Arc, Weak};

/// A word to sleep on until it changes (a futex on Linux, through
/// `atomic-wait`). [`Futex::wake_all`] wakes every sleeper with one system
/// call, where unparking threads one by one costs a call each.
#[cfg(not(dedupkv_loom))]
#[derive(Default)]
pub(crate) struct Futex(AtomicU32);

#[cfg(not(dedupkv_loom))]
impl Futex {
    /// The current value: read it, then check the condition it guards,
    /// then pass it to [`Futex::wait`].
    pub(crate) fn load(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }

    /// Sleeps unless the word has changed from `seen`; may return
    /// spuriously, so callers loop on their condition.
    pub(crate) fn wait(&self, seen: u32) {
        atomic_wait::wait(&self.0, seen);
    }

    /// Changes the word and wakes every sleeper. What the caller stored
    /// before is visible to anyone who then loads the new value.
    pub(crate) fn wake_all(&self) {
        self.0.fetch_add(1, Ordering::Release);
        atomic_wait::wake_all(std::ptr::from_ref(&self.0));
    }
}

/// Spawns a named thread of the store's own (the committer, the evictor, the grower).
#[cfg(not(dedupkv_loom))]
pub(crate) fn spawn<F>(name: &str, f: F) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    std::thread::Builder::new().name(name.into()).spawn(f)
}
