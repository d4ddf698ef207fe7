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
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(dedupkv_loom))]
pub(crate) use std::thread::{JoinHandle, Thread, current, park};

#[cfg(dedupkv_loom)]
pub(crate) use model::{
    AtomicBool, AtomicU64, Condvar, JoinHandle, MappedRwLockReadGuard, Mutex, MutexGuard, Ordering,
    Receiver, RwLock, RwLockReadGuard, Sender, Thread, bounded, current, park, spawn,
};

// std's in both builds: loom's `Arc` has no `Weak` and cannot be unsized
// into the `Arc<dyn Clock>` that `builder.rs` makes with std's `Arc`.
// Reference counts are not what the models check.
pub(crate) use std::sync::{Arc, Weak};

/// Spawns a named thread of the store's own (the committer).
#[cfg(not(dedupkv_loom))]
pub(crate) fn spawn<F>(name: &str, f: F) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    std::thread::Builder::new().name(name.into()).spawn(f)
}
