//! # dedupkv
//!
//! An embedded deduplication and idempotency engine. A consumer records an
//! operation key durably *before* any side effect, with an atomic
//! insert-if-absent; every repeat of the key — from another thread, another
//! attempt, or after a crash — is recognised, and gets the first attempt's
//! outcome back.
//!
//! ```
//! use dedupkv::{Begin, Fingerprint, Key, Store};
//! # let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path().join("dedup.redb"))?;
//!
//! // Plain "processed events" dedup.
//! if store.insert_if_absent(&Key::new("shop-42", "evt_1"))? {
//!     // handle the event
//! }
//!
//! // An idempotent operation with a stored outcome.
//! let key = Key::new("shop-42", "charge-7");
//! match store.begin(&key, Fingerprint::of("100 EUR to card 4242"))? {
//!     Begin::Started(claim) => store.complete(&claim, b"charge ch_1")?,
//!     Begin::Completed(record) => assert_eq!(record.outcome(), Some(&b"charge ch_1"[..])),
//!     Begin::InProgress(info) => println!("retry after {:?}", info.lease_expires_at()),
//!     Begin::DeadLettered(dl) => println!("retries exhausted: {}", dl.reason()),
//! }
//! # Ok::<(), dedupkv::Error>(())
//! ```
//!
//! See `docs/guarantees.md` for the guarantees per [`Durability`] mode (the
//! README has them in short), `docs/features.md` for the feature flags and
//! `docs/design.md` for the file format and invariants.

#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
mod api;
mod canon;
mod civil;
mod clock;
mod codec;
pub mod contract;
mod durability;
mod effects;
mod engine;
mod error;
mod index;
mod key;
mod log;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "replica")]
#[cfg_attr(docsrs, doc(cfg(feature = "replica")))]
pub mod partitions;
mod records;
#[cfg(feature = "replica")]
#[cfg_attr(docsrs, doc(cfg(feature = "replica")))]
pub mod replica;
mod sync;
mod types;

#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use api::AsyncStore;
pub use api::{Begin, Claim, Store, StoreBuilder};
pub use clock::{Clock, ClockBehind, ManualClock, SystemClock};
pub use durability::Durability;
pub use effects::{
    Decision, Effect, ErrorClass, GiveUpReason, Jitter, RetryPolicy, RetryPolicyBuilder, Run,
};
pub use error::{Error, Result, StorageError};
pub use key::{Fingerprint, Key, KeyHashing};
pub use log::PageBackend;
pub use types::{
    Advance, Answer, Began, BeginOptions, Cursor, DeadLetter, Delivered, Duplicate, Eviction,
    Failure, Forget, Handling, Held, InProgress, Intent, IntentEntry, KeyKind, KeyReconciliation,
    KeyWindowDiff, Listing, Page, Reconciliation, Record, Resolution, SequenceOptions, Sequenced,
    State, Stats, Tally, Unacked, Update, WindowDiff, WindowKeys,
};

/// The README's code, compiled and run as doc tests so it cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}

/// The code of `docs/guarantees.md`, run as doc tests like the README's.
#[cfg(doctest)]
#[doc = include_str!("../docs/guarantees.md")]
mod guarantees_md {}

/// The consumer-group recipe in `docs/consumer-groups.md`, run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../docs/consumer-groups.md")]
mod consumer_groups_md {}

/// `docs/features.md`: any code it shows is run as a doc test too.
#[cfg(doctest)]
#[doc = include_str!("../docs/features.md")]
mod features_md {}

/// Entry points for the fuzz targets in `fuzz/`. Not part of the API: no
/// stability promise.
#[doc(hidden)]
pub mod __fuzz {
    /// Decodes a log row the way recovery does; returns the number of
    /// records, or the error. Must never panic on any input.
    ///
    /// # Errors
    /// Whatever the decoder reports for malformed input.
    pub fn decode_row(bytes: &[u8]) -> crate::Result<usize> {
        let mut n = 0;
        for rec in crate::records::read_row(bytes)? {
            rec?;
            n += 1;
        }
        Ok(n)
    }

    /// Replays a journal segment (header included) the way an open does,
    /// and decodes every row it replays; returns the records. Must never
    /// panic on any input.
    ///
    /// # Errors
    /// What an open reports for the same bytes.
    pub fn decode_journal(segment: &[u8]) -> crate::Result<usize> {
        crate::log::fuzz_journal(segment)
    }

    /// A journal segment holding one valid record around `payload`, so the
    /// fuzzer reaches the payload's decoder behind the checksum.
    #[must_use]
    pub fn journal_of(payload: &[u8]) -> Vec<u8> {
        crate::log::journal_of_payload(payload)
    }
}
