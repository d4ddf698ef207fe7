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
//! A few entities run through the sequencer (`Sequence`, `Ack`) and move
//! their version (`Version`, `Store::advance`: newer applies, equal is a
//! duplicate, older is stale; kept with the entity's core record): parked
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
//! (`RECONCILE_WINDOW`), kept `RECONCILE_RETENTION` after the window's
//! end; eviction or an open past that bucket drops the window.
//!
//! What each call must answer for one key or entity, and what it leaves, is
//! stated once, in `model/state.rs` (`KeyState`, `EntityState`): this
//! harness steps it in the order it calls the store, and the
//! linearizability checker (`history.rs`) in every order a concurrent
//! history allows.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::{
    Begin, BeginOptions, Claim, Failure, Fingerprint, Intent, Key, Listing, ManualClock,
    Resolution, Store, Tally,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::FaultBackend;

pub(crate) mod state;

use state::{
    BeginReq, Begun, End, EntityState, KeyState, Kind, Leave, MIntent, MRec, Started, answer,
    check_dead_letter, check_intent, check_record,
};

/// The manual clock's start, in ms since the epoch.
pub const T0: u64 = 1_700_000_000_000;
const SCOPES: usize = 2;
/// Ids per scope: key `k < SCOPES * IDS` is id `k % IDS` in scope `k / IDS`.
pub const IDS: usize = 8;
/// Keys whose scope/id splits collide if the key hash did not keep the
/// two parts apart, NUL and quote bytes, and bytes that are not UTF-8.
/// (Empty parts are refused; `tests/api_bad_input.rs` checks every call.)
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
pub(crate) const ENTITY_RETENTION: u64 = 7 * 86_400_000;
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

pub(crate) fn at(ms: u64) -> SystemTime {
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
    /// `Store::advance(entity, version)`.
    Version(usize, u64),
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

/// A window's totals, and the bucket its retention ends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MTally {
    count: u64,
    sum: i128,
    bucket: u64,
}

#[derive(Debug)]
struct Model {
    s: Settings,
    keys: HashMap<usize, KeyState>,
    entities: HashMap<usize, EntityState>,
    /// By (scope, window start).
    tallies: BTreeMap<(Vec<u8>, u64), MTally>,
}

/// An entity the store never saw.
const NO_ENTITY: EntityState = EntityState(None);

impl Model {
    fn key(&self, k: usize) -> &KeyState {
        self.keys.get(&k).unwrap_or(&KeyState::EMPTY)
    }

    fn key_mut(&mut self, k: usize) -> &mut KeyState {
        self.keys.entry(k).or_default()
    }

    fn entity(&self, e: usize) -> &EntityState {
        self.entities.get(&e).unwrap_or(&NO_ENTITY)
    }

    fn entity_mut(&mut self, e: usize) -> &mut EntityState {
        self.entities.entry(e).or_default()
    }

    /// The key's latest record, if it has not expired: what `get` answers.
    fn live(&self, k: usize, now: u64) -> Option<&MRec> {
        self.key(k).live(&self.s, now)
    }

    /// The key's latest record if the key is present: live and not
    /// forgotten.
    fn present(&self, k: usize, now: u64) -> Option<&MRec> {
        self.key(k).present(&self.s, now)
    }

    /// The dead letters, by key.
    fn dead_letters(&self) -> BTreeMap<usize, &MRec> {
        self.keys
            .iter()
            .filter_map(|(k, ks)| ks.rec.as_ref().map(|r| (*k, r)))
            .filter(|(_, r)| r.kind == Kind::DeadLettered)
            .collect()
    }

    /// Every key's intent.
    fn intents(&self) -> impl Iterator<Item = (usize, &MIntent)> {
        self.keys
            .iter()
            .filter_map(|(k, ks)| ks.intent.as_ref().map(|i| (*k, i)))
    }

    /// What eviction at `now` does: expired records leave, dead letters
    /// and pending intents of expired buckets are re-logged, sent intents
    /// and the windows' totals of expired buckets go.
    fn evicted(&mut self, now: u64) {
        let s = self.s;
        for ks in self.keys.values_mut() {
            ks.evicted(&s, now);
        }
        self.tallies.retain(|_, t| t.bucket >= now / s.granularity);
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
        t.bucket = (start + RECONCILE_WINDOW + RECONCILE_RETENTION) / g;
    }

    /// At open: what expired while the store was closed is gone, except
    /// dead letters, re-logged for the store's retention; the others go on
    /// with their record's retention.
    fn reopened(&mut self, now: u64) {
        let s = self.s;
        // Hand-backs live in memory: the process that held them is gone.
        for m in self.entities.values_mut() {
            m.reopened();
        }
        self.tallies.retain(|_, t| t.bucket >= now / s.granularity);
        for ks in self.keys.values_mut() {
            ks.expire(&s, now);
            ks.carry_dead_letter(&s, now, true);
            if let Some(r) = ks.rec.as_mut()
                && r.kind == Kind::DeadLettered
            {
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
    /// Provider keys by operation and request: (key, first attempt,
    /// fingerprint), and the operation that has each. A corrected request
    /// (`RetryableAnyRequest`) is a new provider operation.
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
            Op::Version(e, v) => self.version(*e, *v),
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

    /// Records a key absent at `now` as inserted.
    fn inserted(&mut self, k: usize, now: u64) {
        let s = self.model.s;
        self.model.key_mut(k).inserted(&s, now);
    }

    fn insert(&mut self, k: usize) -> TestResult {
        let now = self.now();
        let got = check(self.store().insert_if_absent(&key(k)), "insert_if_absent")?;
        let s = self.model.s;
        self.model.key_mut(k).insert(&s, k, now, got)?;
        if got {
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
        (lease_ms, retention_ms): (u64, u64),
        got: dedupkv::Result<Begin>,
        intent: Option<(String, Vec<u8>)>,
    ) -> TestResult {
        let now = self.now();
        let req = BeginReq {
            fp: fingerprint(f),
            lease_ms,
            retention_ms,
            intent,
        };
        let (s, run_floor) = (self.model.s, self.run_floor);
        let answer = Begun::of(&got);
        let Some(started) = self
            .model
            .key_mut(k)
            .begin(&s, k, now, &req, &answer, run_floor)?
        else {
            return Ok(());
        };
        let Ok(Begin::Started(claim)) = got else {
            unreachable!("the model accepted {answer:?} as Started")
        };
        prop_assert!(
            claim.token() > self.token_floor,
            "token {} not above {}",
            claim.token(),
            self.token_floor
        );
        self.token_floor = claim.token();
        self.check_provider_key(
            k,
            (started.first_at, req.fp),
            &started,
            claim
                .provider_key()
                .map_err(|e| TestCaseError::fail(format!("provider key of key {k}: {e}")))?,
        )?;
        self.held.push(Held {
            key: k,
            token: claim.token(),
            generation: self.generation,
            claim,
        });
        self.settled();
        Ok(())
    }

    /// Every attempt of one operation (key `k`, first attempt at
    /// `first_at`) has one provider key, and no two operations share one.
    fn check_provider_key(
        &mut self,
        k: usize,
        (first_at, fp): (u64, Fingerprint),
        started: &Started,
        pk: String,
    ) -> TestResult {
        let attempt = started.attempt;
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
                    attempt == 1 || started.corrected,
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

    /// The token of held claim `i`, `None` if a store that was closed or
    /// crashed issued it (its handle is dead).
    fn token_of(&self, i: usize) -> Option<u64> {
        let h = &self.held[i];
        (h.generation == self.generation).then_some(h.token)
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
        let end = match op {
            Op::FailExhausted(_, r, with) => End::Exhausted {
                reason: reason(*r),
                payload: with.then(|| dead_payload(*r)),
            },
            Op::Complete(_, o) | Op::CompleteWithAmount(_, o, _) => End::Complete(outcome(*o)),
            Op::FailPermanent(_, o) => End::Permanent(payload(*o)),
            Op::FailAnyRequest(_) => End::AnyRequest,
            _ => End::Retryable,
        };
        let amount = match op {
            Op::CompleteWithAmount(_, _, a) => amount(*a),
            _ => 0,
        };
        let (store, claim) = (self.store(), &self.held[i].claim);
        let got = match (&end, op) {
            (End::Exhausted { reason, payload }, _) => store.fail(
                claim,
                Failure::Exhausted {
                    reason,
                    payload: payload.as_deref(),
                },
            ),
            (End::Complete(o), Op::CompleteWithAmount(..)) => {
                store.complete_with_amount(claim, o, amount)
            }
            (End::Complete(o), _) => store.complete(claim, o),
            (End::Permanent(p), _) => store.fail(claim, Failure::Permanent(p)),
            (End::AnyRequest, _) => store.fail(claim, Failure::RetryableAnyRequest),
            _ => store.fail(claim, Failure::Retryable),
        };
        if self.finished(i, &got, &end, amount)? {
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
        let mut wrote = false;
        for ((i, bytes), got) in picked.into_iter().zip(got) {
            wrote |= self.finished(i, &got, &End::Complete(bytes), 0)?;
        }
        if wrote {
            self.settled();
        }
        Ok(())
    }

    /// Checks the answer `got` of finishing held claim `i` as `end` (a
    /// completion counting `amount`), and records it; returns whether it
    /// wrote.
    fn finished(
        &mut self,
        i: usize,
        got: &dedupkv::Result<()>,
        end: &End,
        amount: i64,
    ) -> TestResult<bool> {
        let now = self.now();
        let (k, token, s) = (self.held[i].key, self.token_of(i), self.model.s);
        let wrote = self
            .model
            .key_mut(k)
            .finish(&s, (k, now, token), end, now, &answer(got))?;
        if wrote && matches!(end, End::Complete(_)) {
            self.model.count_completion(k, now, amount);
        }
        Ok(wrote)
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
        let (k, token, s) = (self.held[i].key, self.token_of(i), self.model.s);
        let renewed = self
            .model
            .key_mut(k)
            .renew(&s, (k, now, token), by, &answer(&got))?;
        if let Some(until) = renewed {
            prop_assert_eq!(self.held[i].claim.lease_expires_at(), at(until));
            self.settled();
        }
        Ok(())
    }

    /// Dropping an unfinished, active claim releases the key (without
    /// waiting for the record to be durable).
    fn drop_claim(&mut self, n: usize) {
        let Some(i) = self.pick(n) else { return };
        let now = self.now();
        let token = self.token_of(i);
        let held = self.held.remove(i);
        drop(held.claim);
        let s = self.model.s;
        if let Some(prev) = self.model.key_mut(held.key).drop_claim(&s, now, token) {
            self.unsettled.entry(held.key).or_insert(prev);
        }
    }

    fn get(&mut self, k: usize) -> TestResult {
        let got = check(self.store().get(&key(k)), "get")?;
        self.model
            .key(k)
            .get(&self.model.s, k, self.now(), got.as_ref())
    }

    fn forget(&mut self, k: usize) -> TestResult {
        let now = self.now();
        let got = check(self.store().forget(&key(k)), "forget")?;
        let (s, run_floor) = (self.model.s, self.run_floor);
        if self
            .model
            .key_mut(k)
            .forget(&s, (k, now), &got, run_floor)?
        {
            self.settled();
        }
        Ok(())
    }

    /// `requeue` (`resolution` `None`) or `resolve` (`Some((completed,
    /// o))`) of key `k`.
    fn leave_dead_letter(&mut self, k: usize, resolution: Option<(bool, u8)>) -> TestResult {
        let now = self.now();
        let how = match resolution {
            None => Leave::Requeue,
            Some((true, o)) => Leave::Completed(outcome(o)),
            Some((false, o)) => Leave::Abandoned(note(o)),
        };
        let got = match &how {
            Leave::Requeue => self.store().requeue(&key(k)),
            Leave::Completed(o) => self.store().resolve(&key(k), Resolution::Completed(o)),
            Leave::Abandoned(n) => self.store().resolve(&key(k), Resolution::Abandoned(n)),
        };
        let got = check(got, "requeue/resolve")?;
        let s = self.model.s;
        if self
            .model
            .key_mut(k)
            .leave_dead_letter(&s, (k, now), &how, got)?
        {
            if matches!(how, Leave::Completed(_)) {
                self.model.count_completion(k, now, 0);
            }
            self.settled();
        }
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
                    self.model.key(k).rec
                )));
            };
            check_dead_letter(k, dl, w)?;
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
        let payload = outcome(p);
        let got = check(self.store().sequence(&entity(e), seq, &payload), "sequence")?;
        let s = self.model.s;
        if self
            .model
            .entity_mut(e)
            .sequence(&s, (e, now), (seq, &payload, s.lease), &got)?
        {
            self.settled();
        }
        Ok(())
    }

    fn ack(&mut self, e: usize, upto: u64) -> TestResult {
        let now = self.now();
        let got = check(self.store().ack(&entity(e), upto), "ack")?;
        let s = self.model.s;
        if self.model.entity_mut(e).ack(&s, (e, now), upto, got)? {
            self.settled();
        }
        Ok(())
    }

    /// `Store::advance` of entity `e` to version `v`.
    fn version(&mut self, e: usize, v: u64) -> TestResult {
        let now = self.now();
        let got = check(self.store().advance(&entity(e), v), "advance")?;
        let s = self.model.s;
        if self.model.entity_mut(e).advance(&s, (e, now), v, got)? {
            self.settled();
        }
        Ok(())
    }

    /// Every entity's unacknowledged events, and the parked and
    /// unacknowledged totals, are as the model says.
    fn check_entities(&self) -> TestResult {
        let (s, now) = (self.model.s, self.now());
        let (mut parked, mut unacked) = (0, 0);
        for e in 0..ENTITIES {
            let got = check(self.store().unacked(&entity(e)), "unacked")?;
            self.model.entity(e).unacked(&s, (e, now), &got)?;
            if let Some(m) = self.model.entity(e).live(&s, now) {
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
        self.model.evicted(now);
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
                (Some(rec), Some(want)) => check_record(k, rec, want).is_ok(),
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
                self.model.key_mut(k).rec = fallback;
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

    /// `mark_sent` of held claim `nth`: the key's active claim with an
    /// intent marks it sent, as of its own attempt and provider key.
    fn mark_sent(&mut self, nth: usize, r: u8) -> TestResult {
        let Some(i) = self.pick(nth) else {
            return Ok(());
        };
        let now = self.now();
        let got = self.store().mark_sent(&self.held[i].claim, &reference(r));
        let (k, token, s) = (self.held[i].key, self.token_of(i), self.model.s);
        let pk = self.held[i]
            .claim
            .provider_key()
            .map_err(|e| TestCaseError::fail(format!("provider key of key {k}: {e}")))?;
        if self.model.key_mut(k).mark_sent(
            &s,
            (k, now, token),
            (&pk, &reference(r)),
            &answer(&got),
        )? {
            self.settled();
        }
        Ok(())
    }

    /// Every key's `intent`, both listings and the pending count are as the
    /// model says.
    fn check_intents(&self) -> TestResult {
        for k in 0..KEYS {
            let got = check(self.store().intent(&key(k)), "intent")?;
            self.model.key(k).intent(k, got.as_ref())?;
        }
        self.check_intent_listing(false)?;
        self.check_intent_listing(true)?;
        let pending = self.model.intents().filter(|(_, i)| !i.sent).count();
        prop_assert_eq!(
            self.store().stats().intents_pending,
            pending as u64,
            "intents_pending"
        );
        Ok(())
    }

    /// `pending_intents` (or, `duplicates`, `duplicate_candidates`: a
    /// second reference, or one after a call of open fate) holds the
    /// model's, oldest recorded first, and paged two at a time gives the
    /// same.
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
            .intents()
            .filter(|(_, i)| if duplicates { i.doubt } else { !i.sent })
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
                    self.model.key(k).intent
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
