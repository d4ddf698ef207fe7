//! When a write is acknowledged relative to its commit.

use std::time::Duration;

/// When a write call returns relative to the durable commit of its record.
///
/// | mode | a call returns | a crash (power cut, `SIGKILL`) can lose |
/// |---|---|---|
/// | `Immediate` | after its record's commit has been synced (`fdatasync`) | nothing that was acknowledged |
/// | `Deferred { max_delay }` | at once, before any commit | the acknowledged writes of the last `max_delay` (plus the commit in flight) |
///
/// In both modes concurrent callers share commits (group commit), and a
/// failed commit poisons the store.
///
/// # Examples
/// ```
/// use dedupkv::{Durability, Store};
/// use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// let relaxed = Store::builder()
///     .durability(Durability::Deferred { max_delay: Duration::from_millis(10) })
///     .open(dir.path().join("s.redb"))?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Acknowledge only what is on stable storage. The default.
    #[default]
    Immediate,
    /// Acknowledge at once; commit at least every `max_delay` (and sooner
    /// when 4 MiB of records are buffered). Reads that need a record's bytes
    /// from disk (`get`, a completed replay) still wait for its commit.
    Deferred {
        /// The longest an acknowledged record waits for its commit.
        max_delay: Duration,
    },
}
