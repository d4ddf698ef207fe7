//! The record vocabulary: what a log record says, and the bytes of a row
//! of records. A leaf room: it knows keys, codecs and the typed outcomes
//! of `types/`, and nothing of storage, commits or the index. The log
//! writes and reads rows in these terms; the engine decides in them.
//!
//! - [`record`]: what a record says ([`Kind`], [`RecordRef`]), with a
//!   constructor per kind and named accessors;
//! - [`body`]: the structured bodies some kinds carry (an intent, a dead
//!   letter, a round, a window's keys);
//! - [`format`](mod@format) and [`decode`]: a row's bytes, written and
//!   read;
//! - here: the store format's versions, which say what a file's records
//!   may hold.
//!
//! This file is the room's one door: the files behind it are private.
//!
//! Invariants: decoding arbitrary bytes returns an error, never panics and
//! never allocates more than its input; every record is self-contained (a
//! key's latest record is its whole state); a format number, once
//! released, always means the same bytes.

mod body;
mod decode;
mod format;
mod record;

pub(crate) use body::{
    DeadLetterBody, IntentBody, KeysBody, ROUND_BODY_LEN, RoundBody, reference_hash,
};
pub(crate) use decode::{RowReader, read_row};
pub(crate) use format::RowWriter;
#[cfg(test)]
pub(crate) use format::tests::sample;
pub(crate) use record::{
    ClaimFields, FORMAT_MAX_KEY_PART, FORMAT_MAX_OUTCOME, FORMAT_MAX_RECORD, INTENT_CLOSED,
    INTENT_PENDING, INTENT_SETTLED, Kind, RELEASE_ABANDONED, RELEASE_ANY_REQUEST, RecordRef,
};

/// The newest store format this build understands (and the one a new file
/// gets, or an older one on an explicit upgrade).
pub(crate) const FORMAT_VERSION: u32 = 5;
/// The oldest format this build writes as it is: older files (1, 2) are
/// rewritten as this one by their first commit.
pub(crate) const OLDEST_KEPT_FORMAT: u32 = 3;
/// The first format with version-2 `Intent`, `DeadLetter` and round
/// bodies and the kinds `Keys` and `Amount`.
pub(crate) const BODIES_FORMAT: u32 = 4;
/// The first format whose bucket tables hold summaries.
pub(crate) const SUMMARIES_FORMAT: u32 = 5;
