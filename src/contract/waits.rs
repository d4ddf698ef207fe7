//! Waiting for an attempt another caller holds: `begin`, and while the
//! key is in progress, wait for it to finish or lapse, then `begin`
//! again — woken by the backend, not by a poll.

use std::time::Duration;

use super::Write;
use crate::types::{Began, BeginOptions};
use crate::{Fingerprint, Key, Result};

/// `begin_or_wait`: a backend's own way to wait for a key another
/// attempt holds (the engine's waiters; `PostgreSQL`'s `LISTEN`/`NOTIFY`
/// across instances).
///
/// # Contract
/// Answers as [`Write::begin`] would, once its answer is not
/// `InProgress` or `timeout` passed (then `InProgress`); waits at most
/// until the holder's lease lapses before asking again, and is woken when
/// the holder finishes on any instance. The answer is settled (committed)
/// when it is told.
///
/// # Examples
/// ```
/// use dedupkv::contract::Waits;
///
/// // Any backend with its own wait: a function over all of them.
/// fn first_or_replay<B: Waits>(b: &B, key: &dedupkv::Key<'_>) -> dedupkv::Result<bool> {
///     let began = b.begin_or_wait(key, dedupkv::Fingerprint::NONE, &dedupkv::BeginOptions::new(),
///         std::time::Duration::from_secs(5))?;
///     Ok(matches!(began, dedupkv::Began::Started(_)))
/// }
/// # let _ = first_or_replay::<dedupkv::Store>;
/// ```
pub trait Waits: Write {
    /// `begin`, waiting up to `timeout` while another attempt holds the
    /// key.
    ///
    /// # Errors
    /// As [`Write::begin`].
    fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Began<Self::Claim>>;
}
