//! The one place locks, atomics and channels are imported from, so a model
//! checker can swap them in under `cfg(dedupkv_loom)`.

pub(crate) use crossbeam_channel::{Receiver, Sender, bounded};
pub(crate) use parking_lot::{
    Condvar, MappedRwLockReadGuard, Mutex, MutexGuard, RwLock, RwLockReadGuard,
};
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
pub(crate) use std::sync::{Arc, Weak};
pub(crate) use std::thread::{Thread, current, park};
