//! The model of the store's semantics that `tests/model.rs` (proptest) and
//! `fuzz/fuzz_targets/ops.rs` (libFuzzer) both drive: operation sequences run
//! against the store and against a plain `HashMap` of what every key should
//! answer, across clean reopens and crashes. Any disagreement is an error.
//!
//! Time moves only through a `ManualClock`. Crashes reopen the bytes a power
//! cut would leave (`FaultBackend::crash_image`): under
//! `Durability::Immediate` every acknowledged write survives; claims held at
//! the crash (or a reopen) are taken over by the next `begin` at once, and
//! their handles are dead. The one write that is not acknowledged is the release of a dropped
//! claim: until a later write is acknowledged, a crash may keep or lose it,
//! and the model accepts either.
//!
//! Eviction runs only when an operation asks for it (`Evict`, and after
//! every multi-day clock step, as the store requires a pass at least every
//! 2^22 buckets); it must change no answer.
//!
//! Operations carry their own lease and retention (`begin_with`), renew
//! by the claim's lease or by a given one (`renew_for`), and finish for the
//! operation's retention. `begin_batch` and `complete_batch` answer each
//! item as `begin` and `complete` would, in order. After
//! `RetryableAnyRequest` the next attempt may bring another fingerprint.
//! `forget` makes a present key absent unless a live attempt of this run
//! holds it; `get` shows the forget record until it expires, and the key's
//! next record goes into no earlier bucket. Every attempt of one operation
//! has one provider key, and no two operations share one.
//!
//! A few entities run through the sequencer (`Sequence`, `Ack`): parked
//! events and events handed back but not acknowledged survive every
//! eviction, reopen, crash and downtime; an entity with neither expires
//! `ENTITY_RETENTION` after its last write. A hand-back is held for the
//! store's hand-back lease (the claim lease of the case): a redelivery
//! meanwhile answers `Handling` with its end, one after it hands back the
//! event and the lapsed ones after it, up to the first live one; a reopen
//! or crash ends every hand-back. `max_hold` is longer than any case, so
//! nothing moves to the holding area.
//!
//! The dead-letter area (`FailExhausted`, `Requeue`, `ResolveCompleted`,
//! `ResolveAbandoned`, `ListDeadLetters`): a dead letter never expires.
//! Retention, eviction, reopen, downtime and crashes keep it; eviction of
//! its bucket (and an open past its expiry) re-logs it with a fresh
//! expiry, which `get` shows. It leaves only by `requeue` (the next
//! `begin` is attempt n + 1 of the same operation), `resolve` (a replayed
//! Completed or Failed record) or `forget`; `insert_if_absent` on it is a
//! duplicate, and `begin` answers `Begin::DeadLettered`. Every check of
//! the whole pool also checks the listing, its paging and the stats.
//!
//! Intents (`BeginWithIntent`, `MarkSent`, `ListPendingIntents`,
//! `ListDuplicateCandidates`): one per key, recorded with a `Started`
//! claim (keeping an earlier pending one's first-recorded time), marked
//! sent by the key's active claim (with its attempt and provider key). A
//! complete, permanent failure or resolution closes a pending one (a sent
//! one stays); `forget` closes either; a retryable failure, a drop and a
//! dead letter keep it. A pending intent never expires: eviction of its
//! bucket (and an open past it) re-logs it for the store's retention. A
//! sent one goes when eviction or an open finds its bucket expired.
//! `Claim::unanswered_intent` says whether a pending one was there.
//!
//! Tallies (`CompleteWithAmount`, `Tallies`): every completion (complete,
//! `complete_batch`, resolve Completed) counts in its scope's window
//! (`RECONCILE_WINDOW`), the record kept `RECONCILE_RETENTION` after the
//! window's last one, in no earlier bucket; eviction or an open past its
//! bucket drops the window.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::{
    Begin, BeginOptions, Claim, DeadLetter, Error, Failure, Fingerprint, Forget, Intent,
    IntentEntry, Key, Listing, ManualClock, Record, Resolution, Sequenced, State, Store, Tally,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::FaultBackend;

/// The manual clock's start, in ms since the epoch.
pub const T0: u64 = 1_700_000_000_000;
const SCOPES: usize = 2;
/// Ids per scope: key `k < SCOPES * IDS` is id `k % IDS` in scope `k / IDS`.
pub const IDS: usize = 8;
/// Keys whose scope/id splits collide if the key hash did not keep the
/// two parts apart, NUL and quote bytes, and bytes that are not UTF-8.
/// (Empty parts are refused; `tests/bad_input.rs` checks every call.)
const ODD_KEYS: [(&[u8], &[u8]); 8] = [
    (b"a", b"bc"),
    (b"ab", b"c"),
    (b"a", b"b"),
    (b"b", b"a"),
    (b"\x00", b"ab"),
    (b"ab", b"\x00"),
    (b"x", b"\xff\x00"),
    (b"x", b"\"/\\"),
];
/// The key pool: keys are numbered `0..KEYS`.
pub const KEYS: usize = SCOPES * IDS + ODD_KEYS.len();
/// Request fingerprints are numbered `0..FINGERPRINTS` (see [`fingerprint`]).
pub const FINGERPRINTS: usize = 3;
/// (lease, retention, bucket granularity) in ms; the third has
/// retention == lease: a claim expires exactly at its lease end.
pub const PRESETS: [(u64, u64, u64); 4] = [
    (30_000, 3_600_000, 60_000),
    (30_000, 120_000, 60_000),
    (30_000, 30_000, 10_000),
    (5_000, 20_000, 1_000),
];

/// Per-call settings of `begin_with`, (lease, retention) in ms, `None` for
/// the store's: shorter and longer than every preset's, a lease that
/// outlasts the retention, and the 1 ms minimum of both.
pub const PER_CALL: [(Option<u64>, Option<u64>); 6] = [
    (Some(1_000), None),
    (Some(120_000), None),
    (None, Some(10_000)),
    (None, Some(7_200_000)),
    (Some(5_000), Some(60_000)),
    (Some(1), Some(1)),
];
/// What `renew_for` extends a lease by, in ms.
pub const RENEW_FOR: [u64; 4] = [1, 1_000, 45_000, 600_000];

/// Entities of the sequencer ops are numbered `0..ENTITIES`.
pub const ENTITIES: usize = 2;
/// Sequence numbers of the sequencer ops run from 1 to `MAX_SEQ`.
pub const MAX_SEQ: u64 = 6;
const ENTITY_RETENTION: u64 = 7 * 86_400_000;
/// The store's default `reconcile_window`, in ms.
pub const RECONCILE_WINDOW: u64 = 3_600_000;
/// The store's default `reconcile_retention`, in ms.
pub const RECONCILE_RETENTION: u64 = 7 * 86_400_000;

/// The scopes of the key pool, each once, in key order.
pub fn scopes() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for k in 0..KEYS {
        let s = key(k).scope().to_vec();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// A case's result: a disagreement with the model fails the case.
pub type TestResult<T = ()> = Result<T, TestCaseError>;

/// Entity `e` of the sequencer ops.
pub fn entity(e: usize) -> Key<'static> {
    Key::owned(b"ent".to_vec(), format!("e{e}").into_bytes())
}

/// Key `k` of the pool: `k < SCOPES * IDS` is id `k % IDS` in scope
/// `k / IDS`, the rest are the odd keys.
pub fn key(k: usize) -> Key<'static> {
    match k.checked_sub(SCOPES * IDS) {
        None => Key::owned(
            format!("s{}", k / IDS).into_bytes(),
            format!("k{}", k % IDS).into_bytes(),
        ),
        Some(odd) => {
            let (scope, id) = ODD_KEYS[odd];
            Key::new(scope, id)
        }
    }
}

/// Fingerprint `f`: none, an ordinary one, and the largest value.
pub fn fingerprint(f: usize) -> Fingerprint {
    match f % FINGERPRINTS {
        0 => Fingerprint::NONE,
        1 => Fingerprint::of("params-1"),
        _ => Fingerprint(u128::MAX),
    }
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// `r`'s value, or a failed case naming `what` and the error.
pub fn check<T>(r: dedupkv::Result<T>, what: &str) -> TestResult<T> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: unexpected error: {e}")))
}

// ---------------------------------------------------------------- settings

/// Store settings for one case, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The store's lease.
    pub lease: u64,
    /// The store's retention.
    pub retention: u64,
    /// The store's bucket granularity.
    pub granularity: u64,
    /// A real file (a crash then becomes a clean reopen) or a `FaultBackend`.
    pub file: bool,
}

impl Settings {
    /// Preset `i` of [`PRESETS`] (modulo their number), on a real file or
    /// on a `FaultBackend`.
    pub fn preset(i: usize, file: bool) -> Settings {
        let (lease, retention, granularity) = PRESETS[i % PRESETS.len()];
        Settings {
            lease,
            retention,
            granularity,
            file,
        }
    }
}

// --------------------------------------------------------------------- ops

/// How far to move the clock.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// Forward by this many ms.
    Millis(u64),
    /// Whole days (up to 40: eviction must run at least every 2^22
    /// buckets, 48 days at 1 s buckets), then an eviction pass, as the
    /// background evictor would run.
    Days(u64),
    /// The lease plus this many ms (straddles the lease end).
    NearLease(i64),
    /// The retention plus this many ms.
    NearRetention(i64),
    /// To this many buckets ahead, plus this many ms around the boundary.
    BucketEdge(u64, i64),
}

/// One operation, on keys, fingerprints and held claims by number.
#[derive(Debug, Clone)]
pub enum Op {
    /// `insert_if_absent` of a key.
    Insert(usize),
    /// `insert_batch` of keys.
    InsertBatch(Vec<usize>),
    /// `begin` of (key, fingerprint).
    Begin(usize, usize),
    /// `begin_with` the per-call settings `PER_CALL[o]` (modulo their number).
    BeginWith(usize, usize, usize),
    /// `begin_batch` of (key, fingerprint) items.
    BeginBatch(Vec<(usize, usize)>),
    /// Claim operations pick the held claim `n` places from the newest.
    Complete(usize, u8),
    /// `complete_batch` of (held claim, outcome) items.
    CompleteBatch(Vec<(usize, u8)>),
    /// `fail` a held claim with `Failure::Retryable`.
    FailRetryable(usize),
    /// `fail` with `Failure::RetryableAnyRequest`.
    FailAnyRequest(usize),
    /// `fail` a held claim with `Failure::Permanent` and an outcome.
    FailPermanent(usize, u8),
    /// `fail` a held claim with `Failure::Exhausted`: reason number, and
    /// whether a payload goes with it.
    FailExhausted(usize, u8, bool),
    /// `requeue` of a key.
    Requeue(usize),
    /// `resolve` of a key with `Resolution::Completed` and an outcome.
    ResolveCompleted(usize, u8),
    /// `resolve` of a key with `Resolution::Abandoned` and a note.
    ResolveAbandoned(usize, u8),
    /// `dead_letters`, whole and paged, against the model.
    ListDeadLetters,
    /// `renew` a held claim by its own lease.
    Renew(usize),
    /// `renew_for` by `RENEW_FOR[r]` (modulo their number).
    RenewFor(usize, usize),
    /// Drop a held claim (it is released).
    DropClaim(usize),
    /// `get` of a key.
    Get(usize),
    /// `forget` of a key.
    Forget(usize),
    /// `Store::sequence(entity, seq, payload)`.
    Sequence(usize, u64, u8),
    /// `Store::ack(entity, upto)`.
    Ack(usize, u64),
    /// Move the clock.
    Advance(Step),
    /// `Store::evict_expired`: must change no answer.
    Evict,
    /// `flush`.
    Flush,
    /// `begin_with_intent` of (key, fingerprint) with the store's settings,
    /// the intent's target and request by number.
    BeginWithIntent(usize, usize, u8, u8),
    /// `mark_sent` of a held claim, the reference by number.
    MarkSent(usize, u8),
    /// `complete_with_amount` of a held claim: outcome and amount by number.
    CompleteWithAmount(usize, u8, u8),
    /// `intent` of every key, `pending_intents` whole and paged, against
    /// the model.
    ListPendingIntents,
    /// `duplicate_candidates` whole and paged, against the model.
    ListDuplicateCandidates,
    /// `tallies` and `reconcile` of scope number `s` (modulo [`scopes`]).
    Tallies(usize),
    /// Close the store and reopen it.
    Reopen,
    /// Close the store, move the clock this many days (1 to 40) with the
    /// store closed, and reopen it: nothing evicts in between.
    Downtime(u64),
    /// Reopen the bytes a power cut would leave (a clean reopen on a real
    /// file).
    Crash,
}

fn outcome(o: u8) -> Vec<u8> {
    vec![b'o'; usize::from(o)]
}

fn payload(o: u8) -> Vec<u8> {
    vec![b'f'; usize::from(o) + 1]
}

/// The reason of `Failure::Exhausted` number `r`.
fn reason(r: u8) -> String {
    format!("gave up {r}")
}

/// The payload kept with a dead letter, by reason number.
fn dead_payload(r: u8) -> Vec<u8> {
    vec![b'd'; usize::from(r % 4) + 1]
}

/// The note of `Resolution::Abandoned` number `o`.
fn note(o: u8) -> String {
    "n".repeat(usize::from(o))
}

/// An intent's target by number.
fn target(t: u8) -> String {
    format!("t{}", t % 3)
}

/// An intent's request by number (the first is empty).
fn request(r: u8) -> Vec<u8> {
    vec![b'q'; usize::from(r % 4)]
}

/// A provider's reference by number.
fn reference(r: u8) -> Vec<u8> {
    vec![b'x'; usize::from(r % 4) + 1]
}

/// The amount of `complete_with_amount` by number: negative, zero and
/// positive.
fn amount(a: u8) -> i64 {
    (i64::from(a) - 128) * 1_000
}

// ------------------------------------------------------------------- model

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inserted,
    Claimed,
    Released,
    Completed,
    Failed,
    Forgotten,
    DeadLettered,
}

/// The latest record of a key, as the model expects `get` to report it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MRec {
    kind: Kind,
    fp: Fingerprint,
    attempt: u32,
    token: u64,
    first_at: u64,
    at: u64,
    expires: u64,
    bucket: u64,
    lease_until: u64,
    outcome: Vec<u8>,
    /// Released by a dropped claim: the next attempt is interrupted.
    abandoned: bool,
    /// Released by `Failure::RetryableAnyRequest`: the next attempt may
    /// bring another fingerprint.
    any: bool,
    /// The claim's lease (what `renew` extends by) and the operation's
    /// retention, for a claimed or released key. For a dead letter, the
    /// retention its requeue or resolution is written for: the
    /// operation's, and after a reopen its record's (`expires - at`).
    lease_ms: u64,
    retention_ms: u64,
    /// A dead letter's last failure time and payload (its reason is
    /// `outcome`).
    failed_at: u64,
    payload: Option<Vec<u8>>,
}

impl MRec {
    fn inserted(now: u64) -> MRec {
        MRec {
            kind: Kind::Inserted,
            fp: Fingerprint::NONE,
            attempt: 0,
            token: 0,
            first_at: now,
            at: now,
            expires: 0,
            bucket: 0,
            lease_until: 0,
            outcome: Vec::new(),
            abandoned: false,
            any: false,
            lease_ms: 0,
            retention_ms: 0,
            failed_at: 0,
            payload: None,
        }
    }

    /// A key recorded by `insert_if_absent`, or forgotten after it, is no
    /// operation: it has no fingerprint and no provider key.
    fn is_operation(&self) -> bool {
        match self.kind {
            Kind::Inserted => false,
            Kind::Forgotten => self.attempt > 0,
            _ => true,
        }
    }
}

/// An entity's sequencer state, as the model expects the store to keep it.
#[derive(Debug, Clone, Default)]
struct MEntity {
    /// The next expected sequence number.
    next: u64,
    /// Parked events (at or past `next`).
    parked: BTreeMap<u64, Vec<u8>>,
    /// Handed back, not acknowledged.
    unacked: BTreeMap<u64, Vec<u8>>,
    /// The lease end of the hand-back holding each unacknowledged event,
    /// given in this run (memory only).
    handed: BTreeMap<u64, u64>,
    /// The bucket of its latest core record.
    bucket: u64,
}

impl MEntity {
    fn fresh() -> MEntity {
        MEntity {
            next: 1,
            ..MEntity::default()
        }
    }
}

/// A key's intent, as the model expects `intent` to report it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MIntent {
    /// Settled: the provider's answer (here always an acceptance,
    /// `mark_sent`) is recorded and no earlier call's fate is open.
    sent: bool,
    /// An earlier attempt's call got no recorded answer.
    open: bool,
    /// The first reference the provider gave the operation.
    reference: Option<Vec<u8>>,
    /// A duplicate candidate: a second reference, or an acceptance after
    /// a call of open fate.
    doubt: bool,
    target: String,
    /// The request while pending, the reference once sent.
    data: Vec<u8>,
    /// The provider key and attempt of the claim that last wrote it.
    provider: String,
    attempt: u32,
    recorded_at: u64,
    /// The bucket of its latest record.
    bucket: u64,
}

/// A window's totals, and the bucket of its latest record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MTally {
    count: u64,
    sum: i128,
    bucket: u64,
}

#[derive(Debug)]
struct Model {
    s: Settings,
    keys: HashMap<usize, MRec>,
    entities: HashMap<usize, MEntity>,
    intents: HashMap<usize, MIntent>,
    /// By (scope, window start).
    tallies: BTreeMap<(Vec<u8>, u64), MTally>,
}

impl Model {
    /// The entity's state, if it has not expired.
    fn entity(&self, e: usize, now: u64) -> Option<&MEntity> {
        self.entities.get(&e).filter(|m| {
            !m.parked.is_empty() || !m.unacked.is_empty() || now / self.s.granularity <= m.bucket
        })
    }

    /// The entity's core record was written at `now`.
    fn wrote_entity(&mut self, e: usize, m: MEntity, now: u64) {
        let bucket = ((now + ENTITY_RETENTION) / self.s.granularity).max(m.bucket);
        self.entities.insert(e, MEntity { bucket, ..m });
    }

    /// The key's latest record, if it has not expired: what `get` answers.
    fn live(&self, k: usize, now: u64) -> Option<&MRec> {
        self.keys
            .get(&k)
            .filter(|r| r.kind == Kind::DeadLettered || now / self.s.granularity <= r.bucket)
    }

    /// The dead letters, by key.
    fn dead_letters(&self) -> BTreeMap<usize, &MRec> {
        self.keys
            .iter()
            .filter(|(_, r)| r.kind == Kind::DeadLettered)
            .map(|(k, r)| (*k, r))
            .collect()
    }

    /// Re-logs every dead letter whose bucket has expired at `now`, as
    /// eviction (`retention` `None`: for the longer of its own and the
    /// store's) and open (`Some`: the store's, which its requeue then
    /// uses) do.
    fn carry_dead_letters(&mut self, now: u64, at_open: bool) {
        let (g, store_retention) = (self.s.granularity, self.s.retention);
        for r in self.keys.values_mut() {
            if r.kind != Kind::DeadLettered || now / g <= r.bucket {
                continue;
            }
            let retention = if at_open {
                r.retention_ms = store_retention;
                store_retention
            } else {
                r.retention_ms.max(store_retention)
            };
            r.at = now;
            r.expires = now + retention;
            r.bucket = r.expires / g;
        }
    }

    /// The key's latest record if the key is present: live and not
    /// forgotten.
    fn present(&self, k: usize, now: u64) -> Option<&MRec> {
        self.live(k, now).filter(|r| r.kind != Kind::Forgotten)
    }

    /// A new operation's first-attempt time: now, but after a forgotten
    /// operation's (so the two never share a provider key).
    fn first_at_after_forget(&self, k: usize, now: u64) -> u64 {
        self.live(k, now)
            .filter(|r| r.kind == Kind::Forgotten)
            .map_or(now, |r| now.max(r.first_at + 1))
    }

    /// The bucket of the key's forget record, if that is live: a new record
    /// of the key goes no earlier.
    fn forgotten_bucket(&self, k: usize, now: u64) -> Option<u64> {
        self.live(k, now)
            .filter(|r| r.kind == Kind::Forgotten)
            .map(|r| r.bucket)
    }

    /// Stores `rec` as the key's latest record, written at `now` with the
    /// natural expiry `expires`; its bucket never moves before `prev`.
    fn write(&mut self, k: usize, mut rec: MRec, now: u64, expires: u64, prev: Option<u64>) {
        let g = self.s.granularity;
        rec.at = now;
        rec.expires = expires;
        rec.bucket = expires / g;
        if let Some(pb) = prev
            && pb > rec.bucket
        {
            rec.bucket = pb;
            rec.expires = rec.expires.max(pb * g);
        }
        self.keys.insert(k, rec);
    }

    /// What eviction (and an open) does to the intents and tallies of
    /// expired buckets: a pending intent is re-logged for the store's
    /// retention; a sent one and a window's totals go.
    fn expire_intents_and_tallies(&mut self, now: u64) {
        let (g, retention) = (self.s.granularity, self.s.retention);
        let nb = now / g;
        self.intents.retain(|_, i| i.bucket >= nb || !i.sent);
        for i in self.intents.values_mut() {
            if i.bucket < nb {
                i.bucket = (now + retention) / g;
            }
        }
        self.tallies.retain(|_, t| t.bucket >= nb);
    }

    /// A completion of key `k` at `now` with `amount`, counted in its
    /// scope's window.
    fn count_completion(&mut self, k: usize, now: u64, amount: i64) {
        let g = self.s.granularity;
        let start = now - now % RECONCILE_WINDOW;
        let t = self
            .tallies
            .entry((key(k).scope().to_vec(), start))
            .or_insert(MTally {
                count: 0,
                sum: 0,
                bucket: 0,
            });
        t.count += 1;
        t.sum += i128::from(amount);
        t.bucket = t.bucket.max((now + RECONCILE_RETENTION) / g);
    }

    /// The operation of `k` finished (complete, permanent failure,
    /// resolution): a pending intent is closed, a sent one stays.
    fn close_pending_intent(&mut self, k: usize) {
        if self.intents.get(&k).is_some_and(|i| !i.sent) {
            self.intents.remove(&k);
        }
    }

    /// At open: dead letters whose bucket expired while the store was
    /// closed are re-logged for the store's retention; the others go on
    /// with their record's retention.
    fn reopened(&mut self, now: u64) {
        // Hand-backs live in memory: the process that held them is gone.
        for m in self.entities.values_mut() {
            m.handed.clear();
        }
        self.expire_intents_and_tallies(now);
        self.carry_dead_letters(now, true);
        for r in self.keys.values_mut() {
            if r.kind == Kind::DeadLettered {
                r.retention_ms = r.expires - r.at;
            }
        }
    }

    /// The highest token of any live key: fresh tokens after a reopen must
    /// be above it.
    fn token_floor(&self, now: u64) -> u64 {
        (0..KEYS)
            .filter_map(|k| self.live(k, now))
            .map(|r| r.token)
            .max()
            .unwrap_or(0)
    }
}

/// `want` is the record the model expects; `provider` is the provider key
/// its operation's claims had, if the harness saw one.
fn check_record(k: usize, got: &Record, want: &MRec, provider: Option<&String>) -> TestResult {
    let state = match want.kind {
        Kind::Inserted => State::Inserted,
        Kind::Claimed => State::InProgress,
        Kind::Released => State::Retryable,
        Kind::Completed => State::Completed,
        Kind::Failed => State::Failed,
        Kind::Forgotten => State::Forgotten,
        Kind::DeadLettered => State::DeadLettered,
    };
    // A dead letter's outcome is its reason.
    let finished = matches!(
        want.kind,
        Kind::Completed | Kind::Failed | Kind::DeadLettered
    );
    prop_assert_eq!(got.key(), &key(k));
    prop_assert_eq!(got.state(), state, "key {} want {:?}", k, want);
    prop_assert_eq!(got.attempts(), want.attempt, "attempts of key {}", k);
    prop_assert_eq!(got.token(), want.token, "token of key {}", k);
    prop_assert_eq!(
        got.first_seen_at(),
        at(want.first_at),
        "first_seen of {}",
        k
    );
    prop_assert_eq!(got.updated_at(), at(want.at), "updated of key {}", k);
    prop_assert_eq!(got.expires_at(), at(want.expires), "expires of key {}", k);
    prop_assert_eq!(
        got.lease_expires_at(),
        (want.kind == Kind::Claimed).then(|| at(want.lease_until)),
        "lease of key {}",
        k
    );
    prop_assert_eq!(
        got.fingerprint(),
        want.is_operation().then_some(want.fp),
        "fingerprint of key {}",
        k
    );
    prop_assert_eq!(
        got.provider_key().is_some(),
        want.is_operation(),
        "provider key of key {}",
        k
    );
    if let (Some(got), Some(want)) = (got.provider_key(), provider) {
        prop_assert_eq!(&got, want, "provider key of key {}", k);
    }
    prop_assert_eq!(
        got.outcome(),
        finished.then_some(want.outcome.as_slice()),
        "outcome of key {}",
        k
    );
    prop_assert_eq!(got.is_failure(), want.kind == Kind::Failed);
    Ok(())
}

/// A dead letter as the listing or `begin` gives it, against the model's.
fn check_dead_letter(
    k: usize,
    got: &DeadLetter,
    want: &MRec,
    provider: Option<&String>,
) -> TestResult {
    prop_assert_eq!(want.kind, Kind::DeadLettered, "key {} is no dead letter", k);
    prop_assert_eq!(got.key(), &key(k));
    prop_assert_eq!(
        got.attempts(),
        want.attempt,
        "attempts of dead letter {}",
        k
    );
    prop_assert_eq!(
        got.reason().as_bytes(),
        want.outcome.as_slice(),
        "reason of dead letter {}",
        k
    );
    prop_assert_eq!(
        got.payload(),
        want.payload.as_deref(),
        "payload of dead letter {}",
        k
    );
    prop_assert_eq!(got.failed_at(), at(want.failed_at), "failed_at of {}", k);
    prop_assert_eq!(
        got.first_attempt_at(),
        at(want.first_at),
        "first attempt of dead letter {}",
        k
    );
    check_record(k, got.record(), want, provider)
}

// ----------------------------------------------------------------- harness

/// A claim handle the test holds, and what the model knows about it.
struct Held {
    claim: Claim,
    key: usize,
    token: u64,
    /// The store generation (reopen count) that issued it.
    generation: u32,
}

enum Medium {
    File(tempfile::TempDir),
    Crash(FaultBackend),
}

struct Harness {
    clock: ManualClock,
    medium: Medium,
    store: Option<Store>,
    generation: u32,
    model: Model,
    held: Vec<Held>,
    /// Tokens issued from now on must be above this.
    token_floor: u64,
    /// Claims with tokens up to this were made before the last reopen: their
    /// holder is gone, and `begin` takes them over at once.
    run_floor: u64,
    /// Keys whose latest record is the release of a dropped claim that may
    /// not be durable yet, with the record a crash would fall back to.
    unsettled: HashMap<usize, MRec>,
    /// The provider key of each operation seen, by (key, first attempt
    /// time), and the operation that has each.
    /// Provider keys by operation and request: (key, first attempt,
    /// fingerprint). A corrected request (`RetryableAnyRequest`) is a new
    /// provider operation.
    provider: HashMap<(usize, u64, Fingerprint), String>,
    provider_owner: HashMap<String, (usize, u64, Fingerprint)>,
}

impl Harness {
    fn new(s: Settings) -> TestResult<Harness> {
        let medium = if s.file {
            Medium::File(tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?)
        } else {
            Medium::Crash(FaultBackend::new())
        };
        let mut h = Harness {
            clock: ManualClock::new(T0),
            medium,
            store: None,
            generation: 0,
            model: Model {
                s,
                keys: HashMap::new(),
                entities: HashMap::new(),
                intents: HashMap::new(),
                tallies: BTreeMap::new(),
            },
            held: Vec::new(),
            token_floor: 0,
            run_floor: 0,
            unsettled: HashMap::new(),
            provider: HashMap::new(),
            provider_owner: HashMap::new(),
        };
        h.open(None)?;
        Ok(h)
    }

    fn now(&self) -> u64 {
        dedupkv::Clock::now_millis(&self.clock)
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("store is open")
    }

    fn open(&mut self, image: Option<FaultBackend>) -> TestResult {
        let s = self.model.s;
        let builder = Store::builder()
            .clock(self.clock.clone())
            .shards(4)
            // Eviction runs only when the ops say so, so a case replays
            // exactly.
            .background_eviction(false)
            .lease(Duration::from_millis(s.lease))
            .handback_lease(Duration::from_millis(s.lease))
            .retention(Duration::from_millis(s.retention))
            .bucket_granularity(Duration::from_millis(s.granularity))
            // Rows of a few records: commits of several rows (as a huge
            // batch makes) meet every operation and crash image.
            .row_split_bytes(96)
            // Small slices: evictions delete most tables a few rows per
            // commit, so crash images land part-way through one.
            .evict_slice_bytes(64)
            .entity_retention(Duration::from_millis(ENTITY_RETENTION))
            .max_hold(Duration::from_secs(10 * 365 * 86_400));
        let store = match (&mut self.medium, image) {
            (Medium::File(dir), _) => builder.open(dir.path().join("model.redb")),
            (Medium::Crash(backend), Some(image)) => {
                *backend = image;
                builder.open_with_backend(backend.clone())
            }
            (Medium::Crash(backend), None) => builder.open_with_backend(backend.clone()),
        };
        self.store = Some(check(store, "open")?);
        let now = self.now();
        self.model.reopened(now);
        self.generation += 1;
        self.token_floor = self.model.token_floor(self.now()).max(self.token_floor);
        // Every claim made so far belongs to a process that is gone.
        self.run_floor = self.token_floor;
        Ok(())
    }

    /// A write was acknowledged: every earlier record is durable too.
    fn settled(&mut self) {
        self.unsettled.clear();
    }

    fn apply(&mut self, op: &Op) -> TestResult {
        match op {
            Op::Insert(k) => self.insert(*k),
            Op::InsertBatch(ks) => self.insert_batch(ks),
            Op::Begin(k, f) => {
                let got = self.store().begin(&key(*k), fingerprint(*f));
                let (lease, retention) = (self.model.s.lease, self.model.s.retention);
                self.answer_begin(*k, *f, (lease, retention), got, None)
            }
            Op::BeginWithIntent(k, f, t, r) => {
                let (target, request) = (target(*t), request(*r));
                let got = self.store().begin_with_intent(
                    &key(*k),
                    fingerprint(*f),
                    &BeginOptions::new(),
                    Intent {
                        target: &target,
                        request: &request,
                    },
                );
                let (lease, retention) = (self.model.s.lease, self.model.s.retention);
                self.answer_begin(*k, *f, (lease, retention), got, Some((target, request)))
            }
            Op::MarkSent(c, r) => self.mark_sent(*c, *r),
            Op::ListPendingIntents => self.check_intents(),
            Op::ListDuplicateCandidates => self.check_intent_listing(true),
            Op::Tallies(sc) => {
                let all = scopes();
                self.check_tallies(&all[sc % all.len()])
            }
            Op::BeginWith(k, f, o) => self.begin_with(*k, *f, *o),
            Op::BeginBatch(items) => self.begin_batch(items),
            Op::Complete(..)
            | Op::FailRetryable(_)
            | Op::FailAnyRequest(_)
            | Op::FailPermanent(..)
            | Op::FailExhausted(..)
            | Op::CompleteWithAmount(..) => self.finish(op),
            Op::CompleteBatch(items) => self.complete_batch(items),
            Op::Renew(c) => self.renew(*c, None),
            Op::RenewFor(c, r) => self.renew(*c, Some(RENEW_FOR[r % RENEW_FOR.len()])),
            Op::DropClaim(c) => {
                self.drop_claim(*c);
                Ok(())
            }
            Op::Get(k) => self.get(*k),
            Op::Forget(k) => self.forget(*k),
            Op::Requeue(k) => self.leave_dead_letter(*k, None),
            Op::ResolveCompleted(k, o) => self.leave_dead_letter(*k, Some((true, *o))),
            Op::ResolveAbandoned(k, o) => self.leave_dead_letter(*k, Some((false, *o))),
            Op::ListDeadLetters => self.check_dead_letters(),
            Op::Sequence(e, seq, p) => self.sequence(*e, *seq, *p),
            Op::Ack(e, upto) => self.ack(*e, *upto),
            Op::Advance(step) => self.advance(*step),
            Op::Evict => self.evict(),
            Op::Flush => {
                check(self.store().flush(), "flush")?;
                self.settled();
                Ok(())
            }
            Op::Reopen => self.reopen(),
            Op::Downtime(days) => {
                self.store = None;
                self.settled();
                self.clock.advance(Duration::from_millis(days * 86_400_000));
                self.open(None)?;
                self.check_all()
            }
            Op::Crash => self.crash(),
        }
    }

    /// The provider key the claims of `want`'s operation had, if any was seen.
    fn provider_of(&self, k: usize, want: &MRec) -> Option<&String> {
        want.is_operation()
            .then(|| self.provider.get(&(k, want.first_at, want.fp)))
            .flatten()
    }

    fn check_record(&self, k: usize, got: &Record, want: &MRec) -> TestResult {
        check_record(k, got, want, self.provider_of(k, want))
    }

    /// Records a key absent at `now` as inserted.
    fn inserted(&mut self, k: usize, now: u64) {
        let expires = now + self.model.s.retention;
        let prev = self.model.forgotten_bucket(k, now);
        self.model.write(k, MRec::inserted(now), now, expires, prev);
    }

    fn insert(&mut self, k: usize) -> TestResult {
        let now = self.now();
        let got = check(self.store().insert_if_absent(&key(k)), "insert_if_absent")?;
        let want = self.model.present(k, now).is_none();
        prop_assert_eq!(got, want, "insert_if_absent of key {}", k);
        if want {
            self.inserted(k, now);
            self.settled();
        }
        Ok(())
    }

    fn insert_batch(&mut self, ks: &[usize]) -> TestResult {
        let now = self.now();
        let keys: Vec<Key<'static>> = ks.iter().map(|&k| key(k)).collect();
        let got = check(self.store().insert_batch(&keys), "insert_batch")?;
        let mut want = Vec::with_capacity(ks.len());
        for &k in ks {
            let new = self.model.present(k, now).is_none();
            if new {
                self.inserted(k, now);
            }
            want.push(new);
        }
        prop_assert_eq!(&got, &want, "insert_batch of keys {:?}", ks);
        if want.contains(&true) {
            self.settled();
        }
        Ok(())
    }

    fn begin_with(&mut self, k: usize, f: usize, o: usize) -> TestResult {
        let (lease, retention) = PER_CALL[o % PER_CALL.len()];
        let mut opts = BeginOptions::new();
        if let Some(ms) = lease {
            opts = opts.lease(Duration::from_millis(ms));
        }
        if let Some(ms) = retention {
            opts = opts.retention(Duration::from_millis(ms));
        }
        let got = self.store().begin_with(&key(k), fingerprint(f), &opts);
        let s = self.model.s;
        let op = (lease.unwrap_or(s.lease), retention.unwrap_or(s.retention));
        self.answer_begin(k, f, op, got, None)
    }

    /// Each item is answered as `begin` would answer it, in order: a key
    /// repeated in the batch finds the claim of its first position.
    fn begin_batch(&mut self, items: &[(usize, usize)]) -> TestResult {
        let keyed: Vec<(Key<'static>, Fingerprint)> = items
            .iter()
            .map(|&(k, f)| (key(k), fingerprint(f)))
            .collect();
        let got = check(self.store().begin_batch(&keyed), "begin_batch")?;
        prop_assert_eq!(got.len(), items.len(), "answers of begin_batch");
        let op = (self.model.s.lease, self.model.s.retention);
        for (&(k, f), got) in items.iter().zip(got) {
            self.answer_begin(k, f, op, got, None)?;
        }
        Ok(())
    }

    /// Checks `begin`'s answer `got` for key `k` and fingerprint `f` against
    /// the model, for an operation with `op` = (lease, retention) in ms,
    /// recording `intent` (target, request) if it starts.
    fn answer_begin(
        &mut self,
        k: usize,
        f: usize,
        op: (u64, u64),
        got: dedupkv::Result<Begin>,
        intent: Option<(String, Vec<u8>)>,
    ) -> TestResult {
        let now = self.now();
        let fp = fingerprint(f);
        let prev = self.model.present(k, now).cloned();
        let (attempt, first_at, prev_bucket) = match &prev {
            // A new operation; after a forget, first claimed no earlier
            // than a millisecond after the forgotten one (so its provider
            // key differs).
            None => (
                1,
                self.model.first_at_after_forget(k, now),
                self.model.forgotten_bucket(k, now),
            ),
            Some(r) if r.kind == Kind::Inserted => {
                let Ok(Begin::Completed(rec)) = &got else {
                    return Err(TestCaseError::fail(format!(
                        "begin on inserted key {k}: want Completed, got {got:?}"
                    )));
                };
                return self.check_record(k, rec, r);
            }
            Some(r) if r.fp != fp && !(r.kind == Kind::Released && r.any) => {
                let Err(Error::FingerprintMismatch {
                    recorded,
                    requested,
                    ..
                }) = &got
                else {
                    return Err(TestCaseError::fail(format!(
                        "begin on key {k} with another fingerprint: got {got:?}"
                    )));
                };
                prop_assert_eq!(*recorded, r.fp);
                prop_assert_eq!(*requested, fp);
                return Ok(());
            }
            Some(r) if matches!(r.kind, Kind::Completed | Kind::Failed) => {
                let Ok(Begin::Completed(rec)) = &got else {
                    return Err(TestCaseError::fail(format!(
                        "begin on finished key {k}: want Completed, got {got:?}"
                    )));
                };
                return self.check_record(k, rec, r);
            }
            Some(r) if r.kind == Kind::DeadLettered => return self.answer_dead_letter(k, r, &got),
            Some(r)
                if r.kind == Kind::Claimed && now < r.lease_until && r.token > self.run_floor =>
            {
                let Ok(Begin::InProgress(info)) = &got else {
                    return Err(TestCaseError::fail(format!(
                        "begin on claimed key {k}: want InProgress, got {got:?}"
                    )));
                };
                prop_assert_eq!(info.attempt(), r.attempt);
                prop_assert_eq!(info.lease_expires_at(), at(r.lease_until));
                prop_assert_eq!(info.first_seen_at(), at(r.first_at));
                return Ok(());
            }
            // Released (with this fingerprint, or any after
            // `RetryableAnyRequest`), or claimed with a lapsed lease or by
            // a process that is gone: a new attempt, with this fingerprint.
            Some(r) => (r.attempt + 1, r.first_at, Some(r.bucket)),
        };
        let interrupted = prev
            .as_ref()
            .is_some_and(|r| r.kind == Kind::Claimed || r.abandoned);
        let Ok(Begin::Started(claim)) = got else {
            return Err(TestCaseError::fail(format!(
                "begin on key {k} (model {prev:?}): want Started, got {got:?}"
            )));
        };
        let ((lease_ms, retention_ms), lease_until) = (op, now + op.0);
        prop_assert_eq!(claim.key(), &key(k));
        prop_assert_eq!(claim.attempt(), attempt);
        prop_assert_eq!(claim.interrupted(), interrupted, "interrupted, key {}", k);
        prop_assert_eq!(claim.lease_expires_at(), at(lease_until));
        prop_assert!(
            claim.token() > self.token_floor,
            "token {} not above {}",
            claim.token(),
            self.token_floor
        );
        self.token_floor = claim.token();
        let fixed = prev.as_ref().is_some_and(|r| r.fp != fp);
        self.check_provider_key(k, (first_at, fp), attempt, fixed, &claim)?;
        self.started_intent(k, &claim, (now, retention_ms), intent)?;
        let rec = MRec {
            kind: Kind::Claimed,
            fp,
            attempt,
            token: claim.token(),
            first_at,
            lease_until,
            lease_ms,
            retention_ms,
            ..MRec::inserted(now)
        };
        let expires = (now + retention_ms).max(lease_until);
        self.model.write(k, rec, now, expires, prev_bucket);
        self.held.push(Held {
            key: k,
            token: claim.token(),
            generation: self.generation,
            claim,
        });
        self.settled();
        Ok(())
    }

    /// `begin` on a dead-lettered key answers `DeadLettered` with it.
    fn answer_dead_letter(&self, k: usize, r: &MRec, got: &dedupkv::Result<Begin>) -> TestResult {
        let Ok(Begin::DeadLettered(dl)) = got else {
            return Err(TestCaseError::fail(format!(
                "begin on dead-lettered key {k} (model {r:?}): want DeadLettered, got {got:?}"
            )));
        };
        check_dead_letter(k, dl, r, self.provider_of(k, r))
    }

    /// Every attempt of one operation (key `k`, first attempt at
    /// `first_at`) has one provider key, and no two operations share one.
    fn check_provider_key(
        &mut self,
        k: usize,
        (first_at, fp): (u64, Fingerprint),
        attempt: u32,
        corrected: bool,
        claim: &Claim,
    ) -> TestResult {
        let pk = claim.provider_key();
        match self.provider.get(&(k, first_at, fp)) {
            Some(known) if attempt > 1 => {
                prop_assert_eq!(
                    &pk,
                    known,
                    "provider key of attempt {} of key {}",
                    attempt,
                    k
                );
            }
            Some(known) => {
                return Err(TestCaseError::fail(format!(
                    "key {k}: a new operation first claimed at {first_at} has the \
                     provider key {known} of an earlier one"
                )));
            }
            None => {
                prop_assert!(
                    attempt == 1 || corrected,
                    "attempt {} of key {}: no earlier attempt seen",
                    attempt,
                    k
                );
                if let Some(other) = self.provider_owner.get(&pk) {
                    return Err(TestCaseError::fail(format!(
                        "key {k} first claimed at {first_at} has the provider key {pk} of {other:?}"
                    )));
                }
                self.provider_owner.insert(pk.clone(), (k, first_at, fp));
                self.provider.insert((k, first_at, fp), pk);
            }
        }
        Ok(())
    }

    fn pick(&self, n: usize) -> Option<usize> {
        (!self.held.is_empty()).then(|| self.held.len() - 1 - n % self.held.len())
    }

    /// The model record of the key a held claim is for, if that claim is
    /// still the key's active claim.
    fn active(&self, i: usize) -> Option<MRec> {
        let h = &self.held[i];
        if h.generation != self.generation {
            return None; // issued by a store that was closed or crashed
        }
        self.model
            .live(h.key, self.now())
            .filter(|r| r.kind == Kind::Claimed && r.token == h.token)
            .cloned()
    }

    fn finish(&mut self, op: &Op) -> TestResult {
        let (Op::Complete(n, _)
        | Op::CompleteWithAmount(n, ..)
        | Op::FailRetryable(n)
        | Op::FailAnyRequest(n)
        | Op::FailPermanent(n, _)
        | Op::FailExhausted(n, ..)) = op
        else {
            unreachable!("not a finishing op")
        };
        let Some(i) = self.pick(*n) else {
            return Ok(());
        };
        let (store, claim) = (self.store(), &self.held[i].claim);
        let (reason, dead_payload) = match op {
            Op::FailExhausted(_, r, with) => (reason(*r), with.then(|| dead_payload(*r))),
            _ => (String::new(), None),
        };
        let (got, kind, bytes) = match op {
            Op::FailExhausted(..) => (
                store.fail(
                    claim,
                    Failure::Exhausted {
                        reason: &reason,
                        payload: dead_payload.as_deref(),
                    },
                ),
                Kind::DeadLettered,
                reason.clone().into_bytes(),
            ),
            Op::Complete(_, o) => (
                store.complete(claim, &outcome(*o)),
                Kind::Completed,
                outcome(*o),
            ),
            Op::CompleteWithAmount(_, o, a) => (
                store.complete_with_amount(claim, &outcome(*o), amount(*a)),
                Kind::Completed,
                outcome(*o),
            ),
            Op::FailPermanent(_, o) => (
                store.fail(claim, Failure::Permanent(&payload(*o))),
                Kind::Failed,
                payload(*o),
            ),
            Op::FailAnyRequest(_) => (
                store.fail(claim, Failure::RetryableAnyRequest),
                Kind::Released,
                Vec::new(),
            ),
            _ => (
                store.fail(claim, Failure::Retryable),
                Kind::Released,
                Vec::new(),
            ),
        };
        let any = matches!(op, Op::FailAnyRequest(_));
        let amount = match op {
            Op::CompleteWithAmount(_, _, a) => amount(*a),
            _ => 0,
        };
        if self.finished(op, i, got, (kind, bytes, amount), any)? {
            if let Some(rec) = self.model.keys.get_mut(&self.held[i].key)
                && rec.kind == Kind::DeadLettered
            {
                rec.failed_at = rec.at;
                rec.payload = dead_payload;
            }
            self.settled();
        }
        Ok(())
    }

    /// Each item as `complete` would answer it, in order: a claim repeated
    /// in the batch is already finished after its first position.
    fn complete_batch(&mut self, items: &[(usize, u8)]) -> TestResult {
        let picked: Vec<(usize, Vec<u8>)> = items
            .iter()
            .filter_map(|&(n, o)| self.pick(n).map(|i| (i, outcome(o))))
            .collect();
        let batch: Vec<(&Claim, &[u8])> = picked
            .iter()
            .map(|(i, o)| (&self.held[*i].claim, o.as_slice()))
            .collect();
        let got = check(self.store().complete_batch(&batch), "complete_batch")?;
        prop_assert_eq!(got.len(), picked.len(), "answers of complete_batch");
        let (op, mut wrote) = (Op::CompleteBatch(items.to_vec()), false);
        for ((i, bytes), got) in picked.into_iter().zip(got) {
            wrote |= self.finished(&op, i, got, (Kind::Completed, bytes, 0), false)?;
        }
        if wrote {
            self.settled();
        }
        Ok(())
    }

    /// Checks the answer `got` of finishing held claim `i` as `kind` with
    /// `bytes` (a completion counting `amount`), and records it; returns
    /// whether it wrote.
    fn finished(
        &mut self,
        op: &Op,
        i: usize,
        got: dedupkv::Result<()>,
        (kind, bytes, amount): (Kind, Vec<u8>, i64),
        any: bool,
    ) -> TestResult<bool> {
        let now = self.now();
        let k = self.held[i].key;
        let Some(prev) = self.active(i) else {
            prop_assert!(
                matches!(got, Err(Error::ClaimLost { .. })),
                "{:?} with a stale claim on key {}: got {:?}",
                op,
                k,
                got
            );
            return Ok(false);
        };
        check(got, "complete/fail")?;
        match kind {
            Kind::Completed => {
                self.model.count_completion(k, now, amount);
                self.model.close_pending_intent(k);
            }
            Kind::Failed => self.model.close_pending_intent(k),
            _ => {}
        }
        let expires = now + prev.retention_ms;
        let rec = MRec {
            kind,
            outcome: bytes,
            any,
            ..prev.clone()
        };
        self.model.write(k, rec, now, expires, Some(prev.bucket));
        Ok(true)
    }

    /// `renew` (`by` `None`: by the claim's lease) or `renew_for`.
    fn renew(&mut self, n: usize, by: Option<u64>) -> TestResult {
        let Some(i) = self.pick(n) else {
            return Ok(());
        };
        let now = self.now();
        let claim = &self.held[i].claim;
        let got = match by {
            None => self.store().renew(claim),
            Some(ms) => self.store().renew_for(claim, Duration::from_millis(ms)),
        };
        let k = self.held[i].key;
        let Some(prev) = self.active(i) else {
            prop_assert!(
                matches!(got, Err(Error::ClaimLost { .. })),
                "renew with a stale claim on key {}: got {:?}",
                k,
                got
            );
            return Ok(());
        };
        let until = check(got, "renew")?;
        let lease_ms = by.unwrap_or(prev.lease_ms);
        let lease_until = now + lease_ms;
        prop_assert_eq!(until, at(lease_until));
        prop_assert_eq!(self.held[i].claim.lease_expires_at(), at(lease_until));
        let rec = MRec {
            lease_until,
            lease_ms,
            ..prev.clone()
        };
        let expires = (now + prev.retention_ms).max(lease_until);
        self.model.write(k, rec, now, expires, Some(prev.bucket));
        self.settled();
        Ok(())
    }

    /// Dropping an unfinished, active claim releases the key (without
    /// waiting for the record to be durable).
    fn drop_claim(&mut self, n: usize) {
        let Some(i) = self.pick(n) else { return };
        let now = self.now();
        let prev = self.active(i);
        let held = self.held.remove(i);
        drop(held.claim);
        if let Some(prev) = prev {
            let rec = MRec {
                kind: Kind::Released,
                abandoned: true,
                any: false,
                ..prev.clone()
            };
            let expires = now + prev.retention_ms;
            self.model
                .write(held.key, rec, now, expires, Some(prev.bucket));
            self.unsettled.entry(held.key).or_insert(prev);
        }
    }

    fn get(&mut self, k: usize) -> TestResult {
        let got = check(self.store().get(&key(k)), "get")?;
        match (got, self.model.live(k, self.now())) {
            (None, None) => Ok(()),
            (Some(rec), Some(want)) => self.check_record(k, &rec, want),
            (got, want) => Err(TestCaseError::fail(format!(
                "get of key {k}: store {got:?}, model {want:?}"
            ))),
        }
    }

    /// `forget` removes a present key unless a live attempt of this run
    /// holds it; the forget record keeps what it replaced, for the store's
    /// retention from now, in no earlier bucket. Claims on the key are
    /// fenced.
    fn forget(&mut self, k: usize) -> TestResult {
        let now = self.now();
        let got = check(self.store().forget(&key(k)), "forget")?;
        let Some(prev) = self.model.present(k, now).cloned() else {
            prop_assert!(
                matches!(got, Forget::NotFound),
                "forget of absent key {}: got {:?}",
                k,
                got
            );
            return Ok(());
        };
        if prev.kind == Kind::Claimed && now < prev.lease_until && prev.token > self.run_floor {
            let Forget::InProgress(info) = &got else {
                return Err(TestCaseError::fail(format!(
                    "forget of claimed key {k}: want InProgress, got {got:?}"
                )));
            };
            prop_assert_eq!(info.attempt(), prev.attempt);
            prop_assert_eq!(info.lease_expires_at(), at(prev.lease_until));
            prop_assert_eq!(info.first_seen_at(), at(prev.first_at));
            return Ok(());
        }
        let Forget::Forgotten(old) = &got else {
            return Err(TestCaseError::fail(format!(
                "forget of key {k} (model {prev:?}): want Forgotten, got {got:?}"
            )));
        };
        self.check_record(k, old, &prev)?;
        let rec = MRec {
            kind: Kind::Forgotten,
            lease_until: 0,
            outcome: Vec::new(),
            any: false,
            payload: None,
            ..prev.clone()
        };
        let expires = now + self.model.s.retention;
        self.model.write(k, rec, now, expires, Some(prev.bucket));
        self.model.intents.remove(&k);
        self.settled();
        Ok(())
    }

    /// `requeue` (`resolution` `None`) or `resolve` (`Some((completed,
    /// o))`): `true` and a Released, Completed or Failed record, written
    /// for the dead letter's retention in no earlier bucket, if the key
    /// is a dead letter; else `false` and nothing written.
    fn leave_dead_letter(&mut self, k: usize, resolution: Option<(bool, u8)>) -> TestResult {
        let now = self.now();
        let (o, n) = match resolution {
            Some((_, o)) => (outcome(o), note(o)),
            None => (Vec::new(), String::new()),
        };
        let got = match resolution {
            None => self.store().requeue(&key(k)),
            Some((true, _)) => self.store().resolve(&key(k), Resolution::Completed(&o)),
            Some((false, _)) => self.store().resolve(&key(k), Resolution::Abandoned(&n)),
        };
        let got = check(got, "requeue/resolve")?;
        let prev = self
            .model
            .present(k, now)
            .filter(|r| r.kind == Kind::DeadLettered)
            .cloned();
        prop_assert_eq!(
            got,
            prev.is_some(),
            "{:?} of key {} (model {:?})",
            resolution,
            k,
            self.model.live(k, now)
        );
        let Some(prev) = prev else {
            return Ok(());
        };
        let (kind, outcome) = match resolution {
            None => (Kind::Released, Vec::new()),
            Some((true, _)) => (Kind::Completed, o),
            Some((false, _)) => (Kind::Failed, n.into_bytes()),
        };
        if resolution.is_some() {
            self.model.close_pending_intent(k);
        }
        if kind == Kind::Completed {
            self.model.count_completion(k, now, 0);
        }
        let rec = MRec {
            kind,
            outcome,
            lease_until: 0,
            abandoned: false,
            any: false,
            failed_at: 0,
            payload: None,
            ..prev.clone()
        };
        let expires = now + prev.retention_ms;
        self.model.write(k, rec, now, expires, Some(prev.bucket));
        self.settled();
        Ok(())
    }

    /// The whole listing holds the model's dead letters, oldest failure
    /// first; a listing paged two at a time gives the same entries in the
    /// same order; the stats count them and age the oldest.
    fn check_dead_letters(&self) -> TestResult {
        let now = self.now();
        let want = self.model.dead_letters();
        let page = check(
            self.store().dead_letters(&Listing::new().limit(1_000)),
            "dead_letters",
        )?;
        prop_assert!(page.next.is_none(), "one page holds them all");
        let mut seen = BTreeSet::new();
        for dl in &page.items {
            let Some(k) = (0..KEYS).find(|k| &key(*k) == dl.key()) else {
                return Err(TestCaseError::fail(format!(
                    "dead letter of a key outside the pool: {dl:?}"
                )));
            };
            let Some(w) = want.get(&k) else {
                return Err(TestCaseError::fail(format!(
                    "key {k} is listed as a dead letter, model {:?}",
                    self.model.keys.get(&k)
                )));
            };
            check_dead_letter(k, dl, w, self.provider_of(k, w))?;
            prop_assert!(seen.insert(k), "key {} listed twice", k);
        }
        let missing: Vec<&usize> = want.keys().filter(|k| !seen.contains(*k)).collect();
        prop_assert!(missing.is_empty(), "dead letters not listed: {:?}", missing);
        prop_assert!(
            page.items
                .windows(2)
                .all(|w| w[0].failed_at() <= w[1].failed_at()),
            "listing not oldest first: {:?}",
            page.items
        );
        let mut paged = Vec::new();
        let mut listing = Listing::new().limit(2);
        for _ in 0..=KEYS {
            let p = check(self.store().dead_letters(&listing), "dead_letters paged")?;
            prop_assert!(p.items.len() <= 2, "a page over its limit");
            paged.extend(p.items);
            match p.next {
                Some(c) => listing = listing.after(c),
                None => break,
            }
        }
        prop_assert_eq!(&paged, &page.items, "paged listing");
        let st = self.store().stats();
        prop_assert_eq!(st.dead_letters_now, want.len() as u64, "dead_letters_now");
        let oldest = want.values().map(|r| r.failed_at).min();
        prop_assert_eq!(
            st.oldest_dead_letter,
            oldest.map(|t| Duration::from_millis(now - t)),
            "oldest_dead_letter"
        );
        Ok(())
    }

    fn sequence(&mut self, e: usize, seq: u64, p: u8) -> TestResult {
        let now = self.now();
        let until = now + self.model.s.lease;
        let payload = outcome(p);
        let got = check(self.store().sequence(&entity(e), seq, &payload), "sequence")?;
        let mut m = self
            .model
            .entity(e, now)
            .cloned()
            .unwrap_or_else(MEntity::fresh);
        let (want, wrote) = if m.unacked.contains_key(&seq) {
            if let Some(&live) = m.handed.get(&seq).filter(|u| **u > now) {
                let Sequenced::Handling(h) = &got else {
                    return Err(TestCaseError::fail(format!(
                        "sequence {seq} of entity {e}: want Handling until {live}, got {got:?}"
                    )));
                };
                prop_assert_eq!(
                    h.lease_expires_at(),
                    UNIX_EPOCH + Duration::from_millis(live),
                    "lease of {} of entity {}",
                    seq,
                    e
                );
                return Ok(());
            }
            let mut out = vec![(seq, payload)];
            for (s, p) in m.unacked.range(seq + 1..) {
                if m.handed.get(s).is_some_and(|u| *u > now) {
                    break;
                }
                out.push((*s, p.clone()));
            }
            for (s, _) in &out {
                m.handed.insert(*s, until);
            }
            if let Some(stored) = self.model.entities.get_mut(&e) {
                stored.handed.clone_from(&m.handed);
            }
            (Some(out), false)
        } else if seq < m.next || m.parked.contains_key(&seq) {
            (None, false)
        } else if seq == m.next {
            let mut out = vec![(seq, payload.clone())];
            m.unacked.insert(seq, payload);
            m.handed.insert(seq, until);
            let mut n = seq + 1;
            while let Some(p) = m.parked.remove(&n) {
                out.push((n, p.clone()));
                m.unacked.insert(n, p);
                m.handed.insert(n, until);
                n += 1;
            }
            m.next = n;
            (Some(out), true)
        } else {
            m.parked.insert(seq, payload);
            prop_assert_eq!(&got, &Sequenced::Parked, "sequence {} of entity {}", seq, e);
            self.model.wrote_entity(e, m, now);
            self.settled();
            return Ok(());
        };
        match want {
            None => prop_assert_eq!(
                &got,
                &Sequenced::Duplicate,
                "sequence {} of entity {}",
                seq,
                e
            ),
            Some(out) => {
                let Sequenced::Delivered(got) = &got else {
                    return Err(TestCaseError::fail(format!(
                        "sequence {seq} of entity {e}: want {out:?}, got {got:?}"
                    )));
                };
                let got: Vec<(u64, Vec<u8>)> =
                    got.iter().map(|d| (d.seq, d.payload.clone())).collect();
                prop_assert_eq!(got, out, "sequence {} of entity {}", seq, e);
            }
        }
        if wrote {
            self.model.wrote_entity(e, m, now);
            self.settled();
        }
        Ok(())
    }

    fn ack(&mut self, e: usize, upto: u64) -> TestResult {
        let now = self.now();
        let got = check(self.store().ack(&entity(e), upto), "ack")?;
        let Some(mut m) = self.model.entity(e, now).cloned() else {
            prop_assert_eq!(got, 0, "ack of an expired entity {}", e);
            return Ok(());
        };
        let mark = upto.saturating_add(1).min(m.next);
        let still = m.unacked.split_off(&mark);
        let want = std::mem::replace(&mut m.unacked, still).len();
        m.handed = m.handed.split_off(&mark);
        prop_assert_eq!(got, want, "ack {} of entity {}", upto, e);
        if want > 0 {
            self.model.wrote_entity(e, m, now);
            self.settled();
        }
        Ok(())
    }

    /// Every entity's unacknowledged events, and the parked and
    /// unacknowledged totals, are as the model says.
    fn check_entities(&self) -> TestResult {
        let now = self.now();
        let (mut parked, mut unacked) = (0, 0);
        for e in 0..ENTITIES {
            let got: Vec<(u64, Vec<u8>, Option<SystemTime>)> =
                check(self.store().unacked(&entity(e)), "unacked")?
                    .into_iter()
                    .map(|d| (d.seq, d.payload, d.handling.map(|h| h.lease_expires_at())))
                    .collect();
            let want: Vec<(u64, Vec<u8>, Option<SystemTime>)> = self
                .model
                .entity(e, now)
                .map(|m| {
                    m.unacked
                        .iter()
                        .map(|(s, p)| {
                            let live = m.handed.get(s).filter(|u| **u > now);
                            let until = live.map(|u| UNIX_EPOCH + Duration::from_millis(*u));
                            (*s, p.clone(), until)
                        })
                        .collect()
                })
                .unwrap_or_default();
            prop_assert_eq!(got, want, "unacked of entity {}", e);
            if let Some(m) = self.model.entity(e, now) {
                parked += m.parked.len() as u64;
                unacked += m.unacked.len() as u64;
            }
        }
        let st = self.store().stats();
        prop_assert_eq!(st.parked_now + st.held_now, parked, "parked events");
        prop_assert_eq!(st.unacked_now, unacked, "unacknowledged events");
        Ok(())
    }

    fn advance(&mut self, step: Step) -> TestResult {
        let s = self.model.s;
        let now = self.now();
        let by = match step {
            Step::Millis(ms) => ms,
            Step::Days(d) => d * 86_400_000,
            Step::NearLease(d) => s.lease.saturating_add_signed(d),
            Step::NearRetention(d) => s.retention.saturating_add_signed(d),
            Step::BucketEdge(n, d) => ((now / s.granularity + n) * s.granularity)
                .saturating_add_signed(d)
                .saturating_sub(now),
        };
        self.clock.advance(Duration::from_millis(by));
        if matches!(step, Step::Days(_)) {
            self.evict()?;
        }
        Ok(())
    }

    /// `evict_expired`: changes no answer, but re-logs the dead letters of
    /// the buckets it deletes.
    fn evict(&mut self) -> TestResult {
        check(self.store().evict_expired(), "evict_expired")?;
        let now = self.now();
        self.model.carry_dead_letters(now, false);
        self.model.expire_intents_and_tallies(now);
        Ok(())
    }

    /// Closes the store cleanly (everything acknowledged or not is
    /// committed) and opens it again. Held claims become dead handles.
    fn reopen(&mut self) -> TestResult {
        self.store = None;
        self.settled();
        self.open(None)?;
        self.check_all()
    }

    /// Reopens from what a power cut would leave.
    fn crash(&mut self) -> TestResult {
        let image = match &self.medium {
            Medium::Crash(backend) => backend.crash_image(),
            Medium::File(_) => return self.reopen(),
        };
        self.store = None;
        self.open(Some(image))?;
        // A dropped claim's release that was not yet durable may be lost:
        // accept either record, and go on from the one the store has.
        let unsettled = std::mem::take(&mut self.unsettled);
        for (k, fallback) in unsettled {
            let got = check(self.store().get(&key(k)), "get")?;
            let now = self.now();
            let released = self.model.live(k, now).cloned();
            let fallback = Some(fallback).filter(|r| now / self.model.s.granularity <= r.bucket);
            let matches = |want: &Option<MRec>| match (&got, want) {
                (None, None) => true,
                (Some(rec), Some(want)) => self.check_record(k, rec, want).is_ok(),
                _ => false,
            };
            if !matches(&released) {
                prop_assert!(
                    matches(&fallback),
                    "after a crash key {} is {:?}; model {:?} or {:?}",
                    k,
                    got,
                    released,
                    fallback
                );
                match fallback {
                    Some(f) => self.model.keys.insert(k, f),
                    None => self.model.keys.remove(&k),
                };
            }
        }
        self.token_floor = self.model.token_floor(self.now());
        self.check_all()
    }

    /// Every key of the pool answers `get` as the model says, and every
    /// entity's stored events are there.
    fn check_all(&mut self) -> TestResult {
        for k in 0..KEYS {
            self.get(k)?;
        }
        self.check_entities()?;
        self.check_dead_letters()?;
        self.check_intents()?;
        for scope in scopes() {
            self.check_tallies(&scope)?;
        }
        Ok(())
    }

    /// A `Started` claim says whether a pending intent was there, and
    /// records `intent` (target, request), keeping a pending one's
    /// first-recorded time, for the operation's retention.
    fn started_intent(
        &mut self,
        k: usize,
        claim: &Claim,
        (now, retention_ms): (u64, u64),
        intent: Option<(String, Vec<u8>)>,
    ) -> TestResult {
        let earlier = self.model.intents.get(&k).cloned();
        let pending = earlier.as_ref().filter(|i| !i.sent);
        prop_assert_eq!(
            claim.unanswered_intent(),
            pending.is_some(),
            "unanswered_intent of key {} (model {:?})",
            k,
            earlier
        );
        if let Some((target, data)) = intent {
            let g = self.model.s.granularity;
            let bucket = ((now + retention_ms) / g).max(earlier.as_ref().map_or(0, |i| i.bucket));
            let recorded_at = pending.map_or(now, |i| i.recorded_at);
            // The calls so far: a new operation starts afresh (an earlier
            // one's unanswered call stays open); a later attempt keeps the
            // reference and doubt, its predecessor's call open if unanswered.
            let (reference, doubt) = match &earlier {
                Some(e) if claim.attempt() > 1 => (e.reference.clone(), e.doubt),
                _ => (None, false),
            };
            self.model.intents.insert(
                k,
                MIntent {
                    sent: false,
                    open: pending.is_some(),
                    reference,
                    doubt,
                    target,
                    data,
                    provider: claim.provider_key(),
                    attempt: claim.attempt(),
                    recorded_at,
                    bucket,
                },
            );
        }
        Ok(())
    }

    /// `mark_sent` of held claim `nth`: the key's active claim with an
    /// intent marks it sent, as of its own attempt and provider key.
    fn mark_sent(&mut self, nth: usize, r: u8) -> TestResult {
        let Some(i) = self.pick(nth) else {
            return Ok(());
        };
        let now = self.now();
        let k = self.held[i].key;
        let got = self.store().mark_sent(&self.held[i].claim, &reference(r));
        let Some(prev) = self.active(i) else {
            prop_assert!(
                matches!(got, Err(Error::ClaimLost { .. })),
                "mark_sent with a stale claim on key {}: got {:?}",
                k,
                got
            );
            return Ok(());
        };
        let Some(earlier) = self.model.intents.get(&k).cloned() else {
            prop_assert!(
                matches!(got, Err(Error::InvalidArgument { .. })),
                "mark_sent on key {} without an intent: got {:?}",
                k,
                got
            );
            return Ok(());
        };
        check(got, "mark_sent")?;
        let g = self.model.s.granularity;
        let r = reference(r);
        let doubt = earlier.doubt
            || match &earlier.reference {
                Some(first) => *first != r,
                None => earlier.open,
            };
        let intent = MIntent {
            sent: true,
            open: false,
            reference: Some(earlier.reference.clone().unwrap_or_else(|| r.clone())),
            doubt,
            data: r,
            provider: self.held[i].claim.provider_key(),
            attempt: prev.attempt,
            bucket: ((now + prev.retention_ms) / g).max(earlier.bucket),
            ..earlier
        };
        self.model.intents.insert(k, intent);
        self.settled();
        Ok(())
    }

    /// Every key's `intent`, both listings and the pending count are as the
    /// model says.
    fn check_intents(&self) -> TestResult {
        for k in 0..KEYS {
            let got = check(self.store().intent(&key(k)), "intent")?;
            match (&got, self.model.intents.get(&k)) {
                (None, None) => {}
                (Some(got), Some(want)) => check_intent(k, got, want)?,
                (got, want) => {
                    return Err(TestCaseError::fail(format!(
                        "intent of key {k}: store {got:?}, model {want:?}"
                    )));
                }
            }
        }
        self.check_intent_listing(false)?;
        self.check_intent_listing(true)?;
        let pending = self.model.intents.values().filter(|i| !i.sent).count();
        prop_assert_eq!(
            self.store().stats().intents_pending,
            pending as u64,
            "intents_pending"
        );
        Ok(())
    }

    /// `pending_intents` (or, `duplicates`, `duplicate_candidates`: a
    /// second reference, or one after a call of open fate) holds the model's, oldest recorded
    /// first, and paged two at a time gives the same.
    fn check_intent_listing(&self, duplicates: bool) -> TestResult {
        let list = |l: &Listing| {
            if duplicates {
                self.store().duplicate_candidates(l)
            } else {
                self.store().pending_intents(l)
            }
        };
        let want: BTreeMap<usize, &MIntent> = self
            .model
            .intents
            .iter()
            .filter(|(_, i)| if duplicates { i.doubt } else { !i.sent })
            .map(|(k, i)| (*k, i))
            .collect();
        let page = check(list(&Listing::new().limit(1_000)), "intent listing")?;
        prop_assert!(page.next.is_none(), "one page holds them all");
        let mut seen = BTreeSet::new();
        for e in &page.items {
            let Some(k) = (0..KEYS).find(|k| &key(*k) == e.key()) else {
                return Err(TestCaseError::fail(format!(
                    "intent of a key outside the pool: {e:?}"
                )));
            };
            let Some(w) = want.get(&k) else {
                return Err(TestCaseError::fail(format!(
                    "key {k} is listed (duplicates: {duplicates}), model {:?}",
                    self.model.intents.get(&k)
                )));
            };
            check_intent(k, e, w)?;
            prop_assert!(seen.insert(k), "key {} listed twice", k);
        }
        let missing: Vec<&usize> = want.keys().filter(|k| !seen.contains(*k)).collect();
        prop_assert!(
            missing.is_empty(),
            "intents not listed (duplicates: {}): {:?}",
            duplicates,
            missing
        );
        prop_assert!(
            page.items
                .windows(2)
                .all(|w| w[0].recorded_at() <= w[1].recorded_at()),
            "listing not oldest first: {:?}",
            page.items
        );
        let mut paged = Vec::new();
        let mut listing = Listing::new().limit(2);
        for _ in 0..=KEYS {
            let p = check(list(&listing), "intent listing paged")?;
            prop_assert!(p.items.len() <= 2, "a page over its limit");
            paged.extend(p.items);
            match p.next {
                Some(c) => listing = listing.after(c),
                None => break,
            }
        }
        prop_assert_eq!(&paged, &page.items, "paged intent listing");
        Ok(())
    }

    /// `tallies(scope)` lists the model's windows of the scope, oldest
    /// first, and `reconcile` with those same counts is clean.
    fn check_tallies(&self, scope: &[u8]) -> TestResult {
        let got: Vec<(SystemTime, Duration, u64, i128)> =
            check(self.store().tallies(scope), "tallies")?
                .into_iter()
                .map(|t| (t.window_start, t.window, t.count, t.amount))
                .collect();
        let want: Vec<(SystemTime, Duration, u64, i128)> = self
            .model
            .tallies
            .range((scope.to_vec(), 0)..=(scope.to_vec(), u64::MAX))
            .map(|((_, start), t)| {
                let window = Duration::from_millis(RECONCILE_WINDOW);
                (at(*start), window, t.count, t.sum)
            })
            .collect();
        prop_assert_eq!(&got, &want, "tallies of scope {:?}", scope);
        let theirs: Vec<Tally> = want
            .iter()
            .map(|&(start, _, count, sum)| Tally::new(start, count, sum))
            .collect();
        let report = check(self.store().reconcile(scope, &theirs), "reconcile")?;
        prop_assert!(
            report.is_clean(),
            "reconcile of scope {:?}: {:?}",
            scope,
            report
        );
        prop_assert_eq!(report.windows.len(), want.len(), "reconciled windows");
        Ok(())
    }
}

/// An intent as `intent` or a listing gives it, against the model's.
fn check_intent(k: usize, got: &IntentEntry, want: &MIntent) -> TestResult {
    prop_assert_eq!(got.key(), &key(k));
    prop_assert_eq!(got.is_sent(), want.sent, "sent, key {} want {:?}", k, want);
    prop_assert_eq!(got.target(), want.target.as_str(), "target of key {}", k);
    let (request, reference) = if want.sent {
        (None, Some(want.data.as_slice()))
    } else {
        (Some(want.data.as_slice()), None)
    };
    prop_assert_eq!(got.request(), request, "request of key {}", k);
    prop_assert_eq!(got.reference(), reference, "reference of key {}", k);
    prop_assert_eq!(&got.provider_key(), &want.provider, "provider key of {}", k);
    prop_assert_eq!(got.attempt(), want.attempt, "attempt of intent {}", k);
    prop_assert_eq!(
        got.recorded_at(),
        at(want.recorded_at),
        "recorded_at of intent {}",
        k
    );
    Ok(())
}

/// Runs `ops` on a fresh store with settings `s` and on the model, and
/// fails at the first answer that differs.
///
/// # Examples
///
/// ```
/// use dedupkv_testkit::model::{Op, Settings, Step, run};
///
/// let ops = [Op::Insert(0), Op::Advance(Step::Millis(1)), Op::Crash, Op::Get(0)];
/// run(Settings::preset(0, false), &ops).expect("the store agrees with the model");
/// ```
pub fn run(s: Settings, ops: &[Op]) -> TestResult {
    let mut h = Harness::new(s)?;
    for op in ops {
        h.apply(op)?;
    }
    h.check_all()?;
    // Claims still held are released (or, if dead, dropped) before the
    // store closes.
    h.held.clear();
    h.store = None;
    Ok(())
}
