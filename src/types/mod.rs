//! The contract's vocabulary: the plain data the engine answers with and
//! the face hands out (records, attempt details, ordering answers,
//! eviction reports, statistics, per-call options). No locks, no log, no
//! engine: every room may use these.

pub(crate) mod attempt;
pub(crate) mod dead_letter;
pub(crate) mod eviction;
pub(crate) mod intent;
pub(crate) mod options;
pub(crate) mod order;
pub(crate) mod pending;
pub(crate) mod reconcile;
pub(crate) mod record;
pub(crate) mod stats;

pub use attempt::{Began, Failure, Forget, InProgress};
pub use dead_letter::{Cursor, DeadLetter, Listing, Page, Resolution};
pub use eviction::Eviction;
pub use intent::{Answer, Duplicate, Intent, IntentEntry};
pub use options::BeginOptions;
pub use order::{Advance, Delivered, Handling, Held, SequenceOptions, Sequenced, Unacked, Update};
pub use pending::{Basis, Pending};
pub use reconcile::{
    KeyKind, KeyReconciliation, KeyWindowDiff, Reconciliation, Tally, WindowDiff, WindowKeys,
};
pub use record::{Record, State};
pub use stats::Stats;
