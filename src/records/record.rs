//! What a record says: its [`Kind`], the [`RecordRef`] that carries it,
//! a constructor per kind and named accessors for the fields a kind
//! reuses. The bytes are [`format`](super::format)'s.

use super::body::{DeadLetterBody, IntentBody, KeysBody, RoundBody};
use crate::codec::TAG_RAW;

/// Hard caps imposed by the record format.
pub(crate) const FORMAT_MAX_KEY_PART: usize = u16::MAX as usize;
pub(crate) const FORMAT_MAX_OUTCOME: usize = 64 << 20;
/// The largest one record can encode to: both key parts and an outcome at
/// the format's limits, plus its fixed fields.
pub(crate) const FORMAT_MAX_RECORD: usize = 2 * FORMAT_MAX_KEY_PART + FORMAT_MAX_OUTCOME + 128;

/// What a record says happened to its key. The latest record of a key is
/// its whole state: every record is self-contained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A plain `insert_if_absent` key.
    Insert = 1,
    /// A claim began, was taken over, or was renewed. The outcome is
    /// empty, or a [`RoundBody`]: the claim's round of attempts, when it is
    /// not an operation's first round without interruptions.
    Claim = 2,
    /// The claim completed with an outcome.
    Complete = 3,
    /// The claim failed permanently; the outcome is the error payload.
    Fail = 4,
    /// The claim was released for a retry (retryable failure, drop, or
    /// `requeue`). The outcome, as a `Claim` record's: empty or a
    /// [`RoundBody`].
    Release = 5,
    /// An entity's whole core state: `value` = version + 1 (0: none),
    /// `aux` = next expected sequence number (0: no sequencer state),
    /// `aux2` = when the current sequence gap opened (0: no gap), payload =
    /// the ack mark (empty: `aux`; else 8 bytes little-endian). Parked and
    /// held events below the ack mark are consumed; those from it to `aux`
    /// were handed back and are not acknowledged yet.
    Entity = 6,
    /// An early event was parked, or the next expected one delivered
    /// (`value` = seq, `aux` = when, payload).
    Park = 7,
    /// A parked event went to the holding area (`value` = seq, `aux` = the
    /// missing predecessor, `aux2` = since when, payload).
    Hold = 8,
    /// The key was forgotten on purpose (`Store::forget`): absent from
    /// now on, the record kept for audit until it expires. Its claim
    /// fields are those of the record it replaced. (Tag 9 is a run.)
    Forget = 10,
    /// The operation exhausted its retries and went to the dead-letter
    /// area (format 3): claim fields of the last attempt (lease 0), the
    /// body a [`DeadLetterBody`] (when, why, and an optional payload).
    /// Eviction and recovery carry it forward: it leaves only by
    /// `requeue`, `resolve` or `forget`.
    DeadLetter = 11,
    /// An intent to call an external system for the operation (format
    /// 3), recorded in the claim's commit: claim fields of the attempt
    /// that last wrote it, `outcome_tag` [`INTENT_PENDING`],
    /// [`INTENT_SETTLED`] or [`INTENT_CLOSED`], the body an [`IntentBody`]
    /// (format 4: with what the provider answered). It is the key's record
    /// beside its state, never its state: an unanswered one is carried
    /// forward past expiry like a dead letter.
    Intent = 12,
    /// The totals of one reconciliation window of one scope as of its
    /// place in the log (format 3): `scope` is the operation scope, `id`
    /// the window's start (ms, 8 bytes big-endian); `value` = completed
    /// operations, `aux` = the window's length in ms; payload = the sum of
    /// their amounts (i128, 16 bytes little-endian). Replay sets the
    /// window's totals to it and adds the `Complete` and `Amount` records
    /// of the window that follow it. It lives in its own namespace
    /// (neither an event key nor an entity).
    Tally = 13,
    /// Keys of operations completed in one reconciliation window, for a
    /// scope that keeps them (format 4): `scope` and `id` as a `Tally`'s;
    /// `value` = how many keys, `aux` = the window's length in ms; payload
    /// a [`KeysBody`]. Written when the `Complete` records they come from
    /// leave the log; a window's keys are the union of its `Keys` records
    /// and its `Complete` records.
    Keys = 14,
    /// The amount of one completion (`complete_with_amount`, format 4):
    /// the operation's scope and id, `at` = the completion's time (its
    /// window's), `value` = the amount, zigzag-encoded. Written in the
    /// `Complete` record's commit, after it; replay adds it to the
    /// window's sum.
    Amount = 15,
}

/// The `outcome_tag` of an `Intent` record not answered yet: a call of the
/// operation may or may not have happened.
pub(crate) const INTENT_PENDING: u8 = 0;
/// The `outcome_tag` of an `Intent` record that is settled: the provider
/// answered (format 3: "sent", the body holding its reference), or the
/// operation finished while it is a candidate for a duplicate effect
/// (format 4). Kept until the record expires.
pub(crate) const INTENT_SETTLED: u8 = 1;
/// The `outcome_tag` of an `Intent` record closed without an answer: its
/// operation finished (completed, failed for good, resolved, forgotten).
pub(crate) const INTENT_CLOSED: u8 = 2;

/// The `outcome_tag` of a `Release` record that frees the key for any
/// request (`Failure::RetryableAnyRequest`); 0 keeps the fingerprint.
/// Release records carry no outcome, so the tag is free for this.
pub(crate) const RELEASE_ANY_REQUEST: u8 = 1;
/// The `outcome_tag` of a `Release` record written for a claim dropped
/// without an answer (a handler that panicked or returned early): the next
/// attempt is told it interrupted one, as after a takeover.
pub(crate) const RELEASE_ABANDONED: u8 = 2;

/// The shape of a record's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    Empty,
    Claim,
    Entity,
}

impl Kind {
    #[inline]
    pub(super) fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Insert,
            2 => Kind::Claim,
            3 => Kind::Complete,
            4 => Kind::Fail,
            5 => Kind::Release,
            6 => Kind::Entity,
            7 => Kind::Park,
            8 => Kind::Hold,
            10 => Kind::Forget,
            11 => Kind::DeadLetter,
            12 => Kind::Intent,
            13 => Kind::Tally,
            14 => Kind::Keys,
            15 => Kind::Amount,
            _ => return None,
        })
    }

    #[inline]
    pub(crate) fn body(self) -> Body {
        match self {
            Kind::Insert => Body::Empty,
            Kind::Claim
            | Kind::Complete
            | Kind::Fail
            | Kind::Release
            | Kind::Forget
            | Kind::DeadLetter
            | Kind::Intent => Body::Claim,
            Kind::Entity | Kind::Park | Kind::Hold | Kind::Tally | Kind::Keys | Kind::Amount => {
                Body::Entity
            }
        }
    }

    /// Records that say what state their key is in (every event-key kind
    /// but `Intent`, which is kept beside the state, and the
    /// reconciliation kinds).
    #[inline]
    pub(crate) fn is_key_state(self) -> bool {
        !self.is_entity() && !matches!(self, Kind::Intent) && !self.is_tally()
    }

    /// Records of reconciliation windows: `Tally`, `Keys`, `Amount`.
    #[inline]
    pub(crate) fn is_tally(self) -> bool {
        matches!(self, Kind::Tally | Kind::Keys | Kind::Amount)
    }

    /// Records with claim fields (every event-key kind but `Insert`).
    #[inline]
    pub(crate) fn is_claim_body(self) -> bool {
        self.body() == Body::Claim
    }

    /// Entity records live in the entity namespace of the index.
    #[inline]
    pub(crate) fn is_entity(self) -> bool {
        matches!(self, Kind::Entity | Kind::Park | Kind::Hold)
    }
}

/// One record, borrowing its byte fields.
///
/// Entity, Park and Hold records keep their numbers in the claim fields
/// (`token`, `first_at`, `lease_until`) and their payload in `outcome`:
/// build records with the constructors below and read them with the
/// named accessors, so that reuse stays in this file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordRef<'a> {
    pub kind: Kind,
    pub idx: u32,
    pub at: u64,
    pub expires: u64,
    pub scope: &'a [u8],
    pub id: &'a [u8],
    // The fields each kind reuses are read and written through the
    // constructors and accessors of this module only (`claim_fields`,
    // `entity_version`, `event_seq`, ...).
    pub(in crate::records) attempt: u32,
    pub(in crate::records) token: u64,
    pub(in crate::records) first_at: u64,
    pub(in crate::records) lease_until: u64,
    pub(in crate::records) params: u128,
    pub outcome_tag: u8,
    pub outcome: &'a [u8],
}

impl<'a> RecordRef<'a> {
    /// A record with its header fields only, its body empty (what a plain
    /// insert decodes to; the decoder fills in any other body).
    #[inline]
    pub(super) fn bare(
        kind: Kind,
        idx: u32,
        (at, expires): (u64, u64),
        scope: &'a [u8],
        id: &'a [u8],
    ) -> Self {
        RecordRef {
            kind,
            idx,
            at,
            expires,
            scope,
            id,
            attempt: 0,
            token: 0,
            first_at: at,
            lease_until: 0,
            params: 0,
            outcome_tag: 0,
            outcome: &[],
        }
    }
}

/// The claim a record carries: attempt, fencing token, first-attempt time,
/// lease end and request fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ClaimFields {
    pub attempt: u32,
    pub token: u64,
    pub first_at: u64,
    pub lease_until: u64,
    pub params: u128,
}

/// Constructors: `idx` is 0 until [`Batch::push`](crate::log::Batch::push)
/// assigns it.
impl<'a> RecordRef<'a> {
    /// A record of `kind` whose claim fields are `c`.
    #[inline]
    fn with_claim(
        kind: Kind,
        (scope, id): (&'a [u8], &'a [u8]),
        (at, expires): (u64, u64),
        c: ClaimFields,
        outcome_tag: u8,
        outcome: &'a [u8],
    ) -> Self {
        RecordRef {
            kind,
            idx: 0,
            at,
            expires,
            scope,
            id,
            attempt: c.attempt,
            token: c.token,
            first_at: c.first_at,
            lease_until: c.lease_until,
            params: c.params,
            outcome_tag,
            outcome,
        }
    }

    /// An entity-namespace record: `value`, `aux` and `aux2` of the format
    /// (see [`Kind::Entity`]) and a payload.
    #[inline]
    fn with_entity(
        kind: Kind,
        (scope, id): (&'a [u8], &'a [u8]),
        (at, expires): (u64, u64),
        [value, aux, aux2]: [u64; 3],
        payload: &'a [u8],
    ) -> Self {
        RecordRef {
            kind,
            idx: 0,
            at,
            expires,
            scope,
            id,
            attempt: 0,
            token: value,
            first_at: aux,
            lease_until: aux2,
            params: 0,
            outcome_tag: TAG_RAW,
            outcome: payload,
        }
    }

    /// A plain `insert_if_absent` key, recorded at `at`.
    #[inline]
    pub(crate) fn insert(scope: &'a [u8], id: &'a [u8], at: u64, expires: u64) -> Self {
        RecordRef {
            outcome_tag: TAG_RAW,
            ..RecordRef::bare(Kind::Insert, 0, (at, expires), scope, id)
        }
    }

    /// A claim began, was taken over or renewed.
    #[inline]
    pub(crate) fn claim(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        c: ClaimFields,
    ) -> Self {
        Self::with_claim(Kind::Claim, (scope, id), (at, expires), c, TAG_RAW, &[])
    }

    /// The claim completed with `outcome` (encoded under codec tag `tag`).
    #[inline]
    pub(crate) fn complete(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        c: ClaimFields,
        (tag, outcome): (u8, &'a [u8]),
    ) -> Self {
        Self::with_claim(Kind::Complete, (scope, id), (at, expires), c, tag, outcome)
    }

    /// The claim failed for good; `outcome` is the error payload.
    #[inline]
    pub(crate) fn fail(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        c: ClaimFields,
        (tag, outcome): (u8, &'a [u8]),
    ) -> Self {
        Self::with_claim(Kind::Fail, (scope, id), (at, expires), c, tag, outcome)
    }

    /// The claim was released for a retry; `tag` is 0,
    /// [`RELEASE_ANY_REQUEST`] or [`RELEASE_ABANDONED`].
    #[inline]
    pub(crate) fn release(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        c: ClaimFields,
        tag: u8,
    ) -> Self {
        Self::with_claim(Kind::Release, (scope, id), (at, expires), c, tag, &[])
    }

    /// This `Claim` or `Release` record carrying `round` (an encoded
    /// [`RoundBody`]; empty: an operation's first round, uninterrupted).
    #[inline]
    pub(crate) fn with_round(self, round: &'a [u8]) -> Self {
        debug_assert!(matches!(self.kind, Kind::Claim | Kind::Release));
        RecordRef {
            outcome: round,
            ..self
        }
    }

    /// The key was forgotten; `c` is the claim of the record it replaces
    /// (its lease is not kept).
    #[inline]
    pub(crate) fn forget(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        c: ClaimFields,
    ) -> Self {
        let c = ClaimFields {
            lease_until: 0,
            ..c
        };
        Self::with_claim(Kind::Forget, (scope, id), (at, expires), c, TAG_RAW, &[])
    }

    /// The operation went to the dead-letter area; `body` is an encoded
    /// [`DeadLetterBody`].
    #[inline]
    pub(crate) fn dead_letter(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        c: ClaimFields,
        body: &'a [u8],
    ) -> Self {
        let c = ClaimFields {
            lease_until: 0,
            ..c
        };
        Self::with_claim(
            Kind::DeadLetter,
            (scope, id),
            (at, expires),
            c,
            TAG_RAW,
            body,
        )
    }

    /// An intent of the operation (`tag` [`INTENT_PENDING`],
    /// [`INTENT_SETTLED`] or [`INTENT_CLOSED`]); `body` is an encoded
    /// [`IntentBody`].
    #[inline]
    pub(crate) fn intent(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        c: ClaimFields,
        (tag, body): (u8, &'a [u8]),
    ) -> Self {
        let c = ClaimFields {
            lease_until: 0,
            ..c
        };
        Self::with_claim(Kind::Intent, (scope, id), (at, expires), c, tag, body)
    }

    /// The totals of a reconciliation window: `window_id` is the window's
    /// start as 8 big-endian bytes; `sum` the amounts' sum, 16 bytes LE.
    #[inline]
    pub(crate) fn tally(
        scope: &'a [u8],
        window_id: &'a [u8],
        (at, expires): (u64, u64),
        (count, window_ms): (u64, u64),
        sum: &'a [u8],
    ) -> Self {
        Self::with_entity(
            Kind::Tally,
            (scope, window_id),
            (at, expires),
            [count, window_ms, 0],
            sum,
        )
    }

    /// Keys of a reconciliation window: `window_id` as a Tally's, `count`
    /// keys encoded in `body` (a [`KeysBody`]).
    #[inline]
    pub(crate) fn keys(
        scope: &'a [u8],
        window_id: &'a [u8],
        (at, expires): (u64, u64),
        (count, window_ms): (u64, u64),
        body: &'a [u8],
    ) -> Self {
        Self::with_entity(
            Kind::Keys,
            (scope, window_id),
            (at, expires),
            [count, window_ms, 0],
            body,
        )
    }

    /// The amount of the completion of (`scope`, `id`) at `at`.
    #[inline]
    pub(crate) fn amount(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        amount: i64,
    ) -> Self {
        let zigzag = ((amount << 1) ^ (amount >> 63)).cast_unsigned();
        Self::with_entity(
            Kind::Amount,
            (scope, id),
            (at, expires),
            [zigzag, 0, 0],
            &[],
        )
    }

    /// An entity's core state: its version (`None` before the first),
    /// the next expected sequence number (0: no sequencer state), when
    /// the current gap opened (0: none) and the ack mark payload.
    #[inline]
    pub(crate) fn entity_core(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        (version, next_seq, gap_since): (Option<u64>, u64, u64),
        ack_mark: &'a [u8],
    ) -> Self {
        let value = version.map_or(0, |v| v.saturating_add(1));
        Self::with_entity(
            Kind::Entity,
            (scope, id),
            (at, expires),
            [value, next_seq, gap_since],
            ack_mark,
        )
    }

    /// Event `seq` was parked at `parked_at` (or, the next expected one,
    /// delivered).
    #[inline]
    pub(crate) fn park(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        (seq, parked_at): (u64, u64),
        payload: &'a [u8],
    ) -> Self {
        Self::with_entity(
            Kind::Park,
            (scope, id),
            (at, expires),
            [seq, parked_at, 0],
            payload,
        )
    }

    /// Event `seq` went to the holding area: predecessor `missing` has
    /// been missing since `since`.
    #[inline]
    pub(crate) fn hold(
        scope: &'a [u8],
        id: &'a [u8],
        (at, expires): (u64, u64),
        (seq, missing, since): (u64, u64, u64),
        payload: &'a [u8],
    ) -> Self {
        Self::with_entity(
            Kind::Hold,
            (scope, id),
            (at, expires),
            [seq, missing, since],
            payload,
        )
    }
}

/// Accessors for the fields a kind reuses.
impl<'a> RecordRef<'a> {
    /// The claim a claim-body record carries.
    #[inline]
    pub(crate) fn claim_fields(&self) -> ClaimFields {
        debug_assert_eq!(self.kind.body(), Body::Claim);
        ClaimFields {
            attempt: self.attempt,
            token: self.token,
            first_at: self.first_at,
            lease_until: self.lease_until,
            params: self.params,
        }
    }

    /// An `Entity` record's version (`None`: no version yet).
    #[inline]
    pub(crate) fn entity_version(&self) -> Option<u64> {
        debug_assert_eq!(self.kind, Kind::Entity);
        self.token.checked_sub(1)
    }

    /// An `Entity` record's next expected sequence number (0: none).
    #[inline]
    pub(crate) fn next_seq(&self) -> u64 {
        debug_assert_eq!(self.kind, Kind::Entity);
        self.first_at
    }

    /// When an `Entity` record's current sequence gap opened (0: no gap).
    #[inline]
    pub(crate) fn gap_since(&self) -> u64 {
        debug_assert_eq!(self.kind, Kind::Entity);
        self.lease_until
    }

    /// An `Entity` record's ack mark payload (see [`Kind::Entity`]).
    #[inline]
    pub(crate) fn ack_mark(&self) -> &'a [u8] {
        debug_assert_eq!(self.kind, Kind::Entity);
        self.outcome
    }

    /// The sequence number of a `Park` or `Hold` record's event.
    #[inline]
    pub(crate) fn event_seq(&self) -> u64 {
        debug_assert!(matches!(self.kind, Kind::Park | Kind::Hold));
        self.token
    }

    /// When a `Park` record's event was parked.
    #[inline]
    pub(crate) fn parked_at(&self) -> u64 {
        debug_assert_eq!(self.kind, Kind::Park);
        self.first_at
    }

    /// The predecessor a `Hold` record's event waits for.
    #[inline]
    pub(crate) fn held_missing(&self) -> u64 {
        debug_assert_eq!(self.kind, Kind::Hold);
        self.first_at
    }

    /// Since when a `Hold` record's predecessor has been missing.
    #[inline]
    pub(crate) fn held_since(&self) -> u64 {
        debug_assert_eq!(self.kind, Kind::Hold);
        self.lease_until
    }

    /// A `Park` or `Hold` record's event payload.
    #[inline]
    pub(crate) fn event_payload(&self) -> &'a [u8] {
        debug_assert!(matches!(self.kind, Kind::Park | Kind::Hold));
        self.outcome
    }

    /// A `Tally` record's window (start, length in ms), count and sum;
    /// `Corrupt` if malformed.
    pub(crate) fn tally_totals(&self) -> crate::Result<(u64, u64, u64, i128)> {
        debug_assert_eq!(self.kind, Kind::Tally);
        let bad = || {
            crate::Error::Corrupt(format!(
                "the Tally record of scope {:?} is malformed",
                String::from_utf8_lossy(self.scope)
            ))
        };
        let start = u64::from_be_bytes(self.id.try_into().map_err(|_| bad())?);
        let sum = i128::from_le_bytes(self.outcome.try_into().map_err(|_| bad())?);
        if self.first_at == 0 {
            return Err(bad());
        }
        Ok((start, self.first_at, self.token, sum))
    }

    /// A `Keys` record's window (start, length in ms) and keys; `Corrupt`
    /// if malformed.
    pub(crate) fn window_keys(&self) -> crate::Result<(u64, u64, KeysBody<'a>)> {
        debug_assert_eq!(self.kind, Kind::Keys);
        let bad = || {
            crate::Error::Corrupt(format!(
                "the Keys record of scope {:?} is malformed",
                String::from_utf8_lossy(self.scope)
            ))
        };
        let start = u64::from_be_bytes(self.id.try_into().map_err(|_| bad())?);
        if self.first_at == 0 {
            return Err(bad());
        }
        let body = KeysBody::decode(self.outcome, self.token).ok_or_else(bad)?;
        Ok((start, self.first_at, body))
    }

    /// An `Amount` record's amount.
    pub(crate) fn amount_value(&self) -> i64 {
        debug_assert_eq!(self.kind, Kind::Amount);
        let z = self.token;
        (z >> 1).cast_signed() ^ -(z & 1).cast_signed()
    }

    /// The body of an `Intent` record; `Corrupt` if it is malformed.
    pub(crate) fn intent_body(&self) -> crate::Result<IntentBody<'a>> {
        debug_assert_eq!(self.kind, Kind::Intent);
        IntentBody::decode(
            self.outcome,
            self.outcome_tag == INTENT_SETTLED,
            self.attempt,
        )
        .ok_or_else(|| {
            crate::Error::Corrupt(format!(
                "the Intent record of {} has a malformed {}-byte body",
                crate::error::show_key(self.scope, self.id),
                self.outcome.len()
            ))
        })
    }

    /// The round a `Claim` or `Release` record's claim belongs to (`None`:
    /// its operation's first round, uninterrupted); `Corrupt` if it is
    /// malformed.
    pub(crate) fn round(&self) -> crate::Result<Option<RoundBody>> {
        debug_assert!(matches!(self.kind, Kind::Claim | Kind::Release));
        if self.outcome.is_empty() {
            return Ok(None);
        }
        RoundBody::decode(self.outcome).map(Some).ok_or_else(|| {
            crate::Error::Corrupt(format!(
                "the {:?} record of {} has a malformed {}-byte round",
                self.kind,
                crate::error::show_key(self.scope, self.id),
                self.outcome.len()
            ))
        })
    }

    /// The body of a `DeadLetter` record; `Corrupt` if it is malformed.
    pub(crate) fn dead_letter_body(&self) -> crate::Result<DeadLetterBody<'a>> {
        debug_assert_eq!(self.kind, Kind::DeadLetter);
        DeadLetterBody::decode(self.outcome).ok_or_else(|| {
            crate::Error::Corrupt(format!(
                "the DeadLetter record of {} has a malformed {}-byte body",
                crate::error::show_key(self.scope, self.id),
                self.outcome.len()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::decode::read_row;
    use crate::records::format::RowWriter;

    const KEY: (&[u8], &[u8]) = (b"tenant", b"evt");
    const TIMES: (u64, u64) = (1_700_000_000_000, 1_700_086_400_000);
    const CLAIM: ClaimFields = ClaimFields {
        attempt: 3,
        token: 77,
        first_at: 1_699_999_000_000,
        lease_until: 1_700_000_030_000,
        params: 0xfeed,
    };

    /// A record as the engine built it by hand before the constructors.
    fn by_hand(
        kind: Kind,
        nums: [u64; 3],
        c: (u32, u128, u8),
        outcome: &'static [u8],
    ) -> RecordRef<'static> {
        RecordRef {
            kind,
            idx: 0,
            at: TIMES.0,
            expires: TIMES.1,
            scope: KEY.0,
            id: KEY.1,
            attempt: c.0,
            token: nums[0],
            first_at: nums[1],
            lease_until: nums[2],
            params: c.1,
            outcome_tag: c.2,
            outcome,
        }
    }

    #[test]
    fn constructors_fill_the_fields_the_engine_filled_by_hand() {
        let (s, i) = KEY;
        let claim = [CLAIM.token, CLAIM.first_at, CLAIM.lease_until];
        let c = (CLAIM.attempt, CLAIM.params, TAG_RAW);
        assert_eq!(
            RecordRef::insert(s, i, TIMES.0, TIMES.1),
            by_hand(Kind::Insert, [0, TIMES.0, 0], (0, 0, TAG_RAW), b"")
        );
        assert_eq!(
            RecordRef::claim(s, i, TIMES, CLAIM),
            by_hand(Kind::Claim, claim, c, b"")
        );
        assert_eq!(
            RecordRef::complete(s, i, TIMES, CLAIM, (4, b"ok")),
            by_hand(Kind::Complete, claim, (c.0, c.1, 4), b"ok")
        );
        assert_eq!(
            RecordRef::fail(s, i, TIMES, CLAIM, (5, b"no")),
            by_hand(Kind::Fail, claim, (c.0, c.1, 5), b"no")
        );
        assert_eq!(
            RecordRef::release(s, i, TIMES, CLAIM, RELEASE_ABANDONED),
            by_hand(Kind::Release, claim, (c.0, c.1, RELEASE_ABANDONED), b"")
        );
        assert_eq!(
            RecordRef::forget(s, i, TIMES, CLAIM),
            by_hand(Kind::Forget, [CLAIM.token, CLAIM.first_at, 0], c, b"")
        );
        let none = (0, 0, TAG_RAW);
        assert_eq!(
            RecordRef::entity_core(s, i, TIMES, (Some(6), 12, 99), b"mark"),
            by_hand(Kind::Entity, [7, 12, 99], none, b"mark")
        );
        assert_eq!(
            RecordRef::entity_core(s, i, TIMES, (None, 0, 0), b""),
            by_hand(Kind::Entity, [0, 0, 0], none, b"")
        );
        assert_eq!(
            RecordRef::entity_core(s, i, TIMES, (Some(u64::MAX), 0, 0), b"").token,
            u64::MAX,
            "the version saturates as it did"
        );
        assert_eq!(
            RecordRef::park(s, i, TIMES, (9, 55), b"p"),
            by_hand(Kind::Park, [9, 55, 0], none, b"p")
        );
        assert_eq!(
            RecordRef::hold(s, i, TIMES, (9, 8, 44), b"h"),
            by_hand(Kind::Hold, [9, 8, 44], none, b"h")
        );
    }

    #[test]
    fn accessors_read_back_what_the_constructors_took_through_a_row() -> crate::Result<()> {
        let (s, i) = KEY;
        let mut recs = [
            RecordRef::claim(s, i, TIMES, CLAIM),
            RecordRef::entity_core(s, i, TIMES, (Some(6), 12, 99), b"mark"),
            RecordRef::entity_core(s, i, TIMES, (None, 3, 0), b""),
            RecordRef::park(s, i, TIMES, (9, 55), b"p"),
            RecordRef::hold(s, i, TIMES, (10, 8, 44), b"h"),
        ];
        let mut w = RowWriter::new();
        for (n, r) in recs.iter_mut().enumerate() {
            r.idx = n as u32;
            w.push(r);
        }
        let row = w.finish();
        let back: Vec<_> = read_row(&row)?.collect::<crate::Result<_>>()?;
        assert_eq!(back[0].claim_fields(), CLAIM);
        let core = &back[1];
        assert_eq!(
            (
                core.entity_version(),
                core.next_seq(),
                core.gap_since(),
                core.ack_mark()
            ),
            (Some(6), 12, 99, &b"mark"[..])
        );
        assert_eq!(back[2].entity_version(), None);
        assert_eq!(back[2].next_seq(), 3);
        let park = &back[3];
        assert_eq!(
            (park.event_seq(), park.parked_at(), park.event_payload()),
            (9, 55, &b"p"[..])
        );
        let hold = &back[4];
        assert_eq!(
            (
                hold.event_seq(),
                hold.held_missing(),
                hold.held_since(),
                hold.event_payload()
            ),
            (10, 8, 44, &b"h"[..])
        );
        Ok(())
    }

    #[test]
    fn a_claims_round_reads_back_through_a_row_and_damage_is_corrupt() -> crate::Result<()> {
        let (s, i) = KEY;
        let (round, _) = RoundBody {
            before: 3,
            since: TIMES.0 - 5,
            interrupted: 2,
            first_failed_at: TIMES.0 - 4,
        }
        .encode();
        let mut recs = [
            RecordRef::claim(s, i, TIMES, CLAIM),
            RecordRef::claim(s, i, TIMES, CLAIM).with_round(&round),
            RecordRef::release(s, i, TIMES, CLAIM, RELEASE_ABANDONED).with_round(&round),
            RecordRef::claim(s, i, TIMES, CLAIM).with_round(&round[..5]),
        ];
        let mut w = RowWriter::new();
        for (n, r) in recs.iter_mut().enumerate() {
            r.idx = n as u32;
            w.push(r);
        }
        let row = w.finish();
        let back: Vec<_> = read_row(&row)?.collect::<crate::Result<_>>()?;
        assert_eq!(back[0].round()?, None);
        assert_eq!(back[1].round()?, RoundBody::decode(&round));
        assert_eq!(back[1].claim_fields(), CLAIM);
        assert_eq!(back[2].round()?, RoundBody::decode(&round));
        assert_eq!(back[2].outcome_tag, RELEASE_ABANDONED);
        assert!(matches!(back[3].round(), Err(crate::Error::Corrupt(m)) if m.contains("round")));
        Ok(())
    }
}
