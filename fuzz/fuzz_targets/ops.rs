//! `Arbitrary` operation sequences on an in-memory store with a manual
//! clock, checked against a small model of the semantics (the fuller model,
//! with crashes, is `tests/model.rs`). Any disagreement panics.
//!
//! Eviction runs when the input says so, and also whenever 2^21 buckets
//! passed since the last pass: the store requires a pass at least every
//! 2^22 buckets (its index keeps 24 bits of a bucket), which the background
//! evictor, off here, would provide.

#![no_main]

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arbitrary::Arbitrary;
use dedupkv::{Begin, Claim, Clock, Error, Failure, Fingerprint, Key, ManualClock, State, Store};
use libfuzzer_sys::fuzz_target;
use redb::StorageBackend;
use redb::backends::InMemoryBackend;

const T0: u64 = 1_700_000_000_000;
const MAX_OPS: usize = 64;
/// (lease, retention, bucket granularity) in ms.
const PRESETS: [(u64, u64, u64); 4] = [
    (30_000, 3_600_000, 60_000),
    (30_000, 120_000, 60_000),
    (30_000, 30_000, 10_000),
    (5_000, 20_000, 1_000),
];
/// Keys whose scope/id splits collide if the hash did not separate them.
const KEYS: [(&[u8], &[u8]); 8] = [
    (b"a", b"bc"),
    (b"ab", b"c"),
    (b"a", b"b"),
    (b"b", b"a"),
    (b"", b"ab"),
    (b"ab", b""),
    (b"x", b"\xff\x00"),
    (b"x", b""),
];
const FINGERPRINTS: [Fingerprint; 3] = [Fingerprint::NONE, Fingerprint(1), Fingerprint(u128::MAX)];

#[derive(Arbitrary, Debug)]
struct Input {
    preset: u8,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Insert(u8),
    InsertBatch(Vec<u8>),
    Begin(u8, u8),
    /// Claim operations pick a held claim by index from the newest.
    Complete(u8, u8),
    FailRetryable(u8),
    FailPermanent(u8, u8),
    Renew(u8),
    DropClaim(u8),
    Get(u8),
    /// Forward by n/16 buckets.
    Advance(u16),
    /// Forward by n days (at most 40).
    AdvanceDays(u8),
    /// Forward by the lease plus n ms.
    AdvanceLease(i8),
    /// Forward by the retention plus n/64 buckets.
    AdvanceRetention(i8),
    Evict,
    Flush,
    Reopen,
}

/// An in-memory file that outlives the store, so it can be reopened.
#[derive(Debug, Clone)]
struct Shared(Arc<InMemoryBackend>);

impl StorageBackend for Shared {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write(offset, data)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inserted,
    Claimed,
    Released,
    Completed,
    Failed,
}

#[derive(Debug, Clone)]
struct Rec {
    kind: Kind,
    fp: Fingerprint,
    attempt: u32,
    token: u64,
    first_at: u64,
    lease_until: u64,
    bucket: u64,
    outcome: Vec<u8>,
}

struct Held {
    claim: Claim,
    key: usize,
    token: u64,
    generation: u32,
}

struct Run {
    lease: u64,
    retention: u64,
    g: u64,
    clock: ManualClock,
    backend: Shared,
    store: Option<Store>,
    generation: u32,
    keys: [Option<Rec>; 8],
    held: Vec<Held>,
    token_floor: u64,
    last_eviction: u64,
}

fn key(k: usize) -> Key<'static> {
    let (scope, id) = KEYS[k % KEYS.len()];
    Key::owned(scope.to_vec(), id.to_vec())
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

impl Run {
    fn new(preset: u8) -> Run {
        let (lease, retention, g) = PRESETS[usize::from(preset) % PRESETS.len()];
        let mut run = Run {
            lease,
            retention,
            g,
            clock: ManualClock::new(T0),
            backend: Shared(Arc::new(InMemoryBackend::new())),
            store: None,
            generation: 0,
            keys: Default::default(),
            held: Vec::new(),
            token_floor: 0,
            last_eviction: T0,
        };
        run.open();
        run
    }

    fn open(&mut self) {
        let store = Store::builder()
            .clock(self.clock.clone())
            .shards(2)
            .lease(Duration::from_millis(self.lease))
            .retention(Duration::from_millis(self.retention))
            .bucket_granularity(Duration::from_millis(self.g))
            .background_eviction(false)
            .open_with_backend(self.backend.clone())
            .expect("open");
        self.store = Some(store);
        self.generation += 1;
        let now = self.now();
        self.token_floor = (0..KEYS.len())
            .filter_map(|k| self.live(k, now))
            .map(|r| r.token)
            .max()
            .unwrap_or(0);
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("open store")
    }

    fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    fn live(&self, k: usize, now: u64) -> Option<&Rec> {
        self.keys[k].as_ref().filter(|r| now / self.g <= r.bucket)
    }

    /// Records `rec` as written now with natural expiry `expires`; a key's
    /// bucket never moves before `prev`.
    fn write(&mut self, k: usize, mut rec: Rec, expires: u64, prev: Option<u64>) {
        rec.bucket = (expires / self.g).max(prev.unwrap_or(0));
        self.keys[k] = Some(rec);
    }

    /// Moves the clock (by at most 40 days: under 2^22 buckets of 1 s),
    /// evicting first if the step would leave the last pass 2^21 buckets
    /// or more behind, and after.
    fn advance(&mut self, by: u64) {
        let by = by.min(40 * 86_400_000);
        let due = (1 << 21) * self.g;
        if self.now() + by - self.last_eviction >= due {
            self.evict();
        }
        self.clock.advance(Duration::from_millis(by));
        if self.now() - self.last_eviction >= due {
            self.evict();
        }
    }

    /// Must change no answer.
    fn evict(&mut self) {
        self.store().evict_expired().expect("evict_expired");
        self.last_eviction = self.now();
    }

    fn pick(&self, n: u8) -> Option<usize> {
        let len = self.held.len();
        (len > 0).then(|| len - 1 - usize::from(n) % len)
    }

    fn active(&self, i: usize) -> Option<Rec> {
        let h = &self.held[i];
        if h.generation != self.generation {
            return None;
        }
        self.live(h.key, self.now())
            .filter(|r| r.kind == Kind::Claimed && r.token == h.token)
            .cloned()
    }

    fn apply(&mut self, op: &Op) {
        let now = self.now();
        match op {
            Op::Insert(k) => {
                let k = usize::from(*k) % KEYS.len();
                let got = self.store().insert_if_absent(&key(k)).expect("insert");
                assert_eq!(got, self.live(k, now).is_none(), "insert of key {k}");
                if got {
                    self.write(k, inserted(now), now + self.retention, None);
                }
            }
            Op::InsertBatch(ks) => {
                let ks: Vec<usize> = ks
                    .iter()
                    .take(8)
                    .map(|k| usize::from(*k) % KEYS.len())
                    .collect();
                let keys: Vec<Key<'static>> = ks.iter().map(|&k| key(k)).collect();
                let got = self.store().insert_batch(&keys).expect("insert_batch");
                let mut want = Vec::new();
                for &k in &ks {
                    let new = self.live(k, now).is_none();
                    if new {
                        self.write(k, inserted(now), now + self.retention, None);
                    }
                    want.push(new);
                }
                assert_eq!(got, want, "insert_batch of {ks:?}");
            }
            Op::Begin(k, f) => self.begin(usize::from(*k) % KEYS.len(), *f),
            Op::Complete(n, _) | Op::FailRetryable(n) | Op::FailPermanent(n, _) => {
                self.finish(*n, op);
            }
            Op::Renew(n) => self.renew(*n),
            Op::DropClaim(n) => {
                let Some(i) = self.pick(*n) else { return };
                let prev = self.active(i);
                let held = self.held.remove(i);
                drop(held.claim);
                if let Some(prev) = prev {
                    let bucket = prev.bucket;
                    let rec = Rec {
                        kind: Kind::Released,
                        ..prev
                    };
                    self.write(held.key, rec, now + self.retention, Some(bucket));
                }
            }
            Op::Get(k) => self.get(usize::from(*k) % KEYS.len()),
            Op::Advance(n) => self.advance(u64::from(*n) * self.g / 16),
            Op::AdvanceDays(d) => self.advance(u64::from(*d) * 86_400_000),
            Op::Evict => self.evict(),
            Op::AdvanceLease(d) => self.advance(self.lease.saturating_add_signed(i64::from(*d))),
            Op::AdvanceRetention(d) => {
                let by = i64::from(*d) * i64::try_from(self.g).expect("small") / 64;
                self.advance(self.retention.saturating_add_signed(by));
            }
            Op::Flush => self.store().flush().expect("flush"),
            Op::Reopen => {
                self.store = None;
                self.open();
                for k in 0..KEYS.len() {
                    self.get(k);
                }
            }
        }
    }

    fn begin(&mut self, k: usize, f: u8) {
        let now = self.now();
        let fp = FINGERPRINTS[usize::from(f) % FINGERPRINTS.len()];
        let got = self.store().begin(&key(k), fp);
        let prev = self.live(k, now).cloned();
        let (attempt, first_at, prev_bucket) = match &prev {
            None => (1, now, None),
            Some(r) if r.kind != Kind::Inserted && r.fp != fp => {
                assert!(
                    matches!(&got, Err(Error::FingerprintMismatch { recorded, requested, .. })
                        if *recorded == r.fp && *requested == fp),
                    "begin on key {k} with another fingerprint: {got:?}"
                );
                return;
            }
            Some(r) if matches!(r.kind, Kind::Inserted | Kind::Completed | Kind::Failed) => {
                let Ok(Begin::Completed(rec)) = &got else {
                    panic!("begin on finished key {k} ({r:?}): {got:?}")
                };
                check(k, Some(rec), Some(r));
                return;
            }
            Some(r) if r.kind == Kind::Claimed && now < r.lease_until => {
                let Ok(Begin::InProgress(info)) = &got else {
                    panic!("begin on claimed key {k} ({r:?}): {got:?}")
                };
                assert_eq!(info.attempt(), r.attempt);
                assert_eq!(info.lease_expires_at(), at(r.lease_until));
                assert_eq!(info.first_seen_at(), at(r.first_at));
                return;
            }
            Some(r) => (r.attempt + 1, r.first_at, Some(r.bucket)),
        };
        let Ok(Begin::Started(claim)) = got else {
            panic!("begin on key {k} ({prev:?}): want Started, got {got:?}")
        };
        assert_eq!(claim.attempt(), attempt, "attempt of key {k}");
        assert_eq!(claim.lease_expires_at(), at(now + self.lease));
        assert!(
            claim.token() > self.token_floor,
            "token {} not above {}",
            claim.token(),
            self.token_floor
        );
        self.token_floor = claim.token();
        let rec = Rec {
            kind: Kind::Claimed,
            fp,
            attempt,
            token: claim.token(),
            first_at,
            lease_until: now + self.lease,
            bucket: 0,
            outcome: Vec::new(),
        };
        let expires = (now + self.retention).max(now + self.lease);
        self.write(k, rec, expires, prev_bucket);
        self.held.push(Held {
            key: k,
            token: claim.token(),
            generation: self.generation,
            claim,
        });
    }

    fn finish(&mut self, n: u8, op: &Op) {
        let Some(i) = self.pick(n) else { return };
        let now = self.now();
        let claim = &self.held[i].claim;
        let (got, kind, bytes) = match op {
            Op::Complete(_, o) => {
                let out = vec![b'o'; usize::from(*o % 4)];
                (self.store().complete(claim, &out), Kind::Completed, out)
            }
            Op::FailPermanent(_, o) => {
                let out = vec![b'f'; usize::from(*o % 4)];
                (
                    self.store().fail(claim, Failure::Permanent(&out)),
                    Kind::Failed,
                    out,
                )
            }
            _ => (
                self.store().fail(claim, Failure::Retryable),
                Kind::Released,
                Vec::new(),
            ),
        };
        let k = self.held[i].key;
        let Some(prev) = self.active(i) else {
            assert!(
                matches!(got, Err(Error::ClaimLost { .. })),
                "{op:?} on a stale claim of key {k}: {got:?}"
            );
            return;
        };
        got.expect("finish an active claim");
        let bucket = prev.bucket;
        let rec = Rec {
            kind,
            outcome: bytes,
            ..prev
        };
        self.write(k, rec, now + self.retention, Some(bucket));
    }

    fn renew(&mut self, n: u8) {
        let Some(i) = self.pick(n) else { return };
        let now = self.now();
        let got = self.store().renew(&self.held[i].claim);
        let k = self.held[i].key;
        let Some(prev) = self.active(i) else {
            assert!(
                matches!(got, Err(Error::ClaimLost { .. })),
                "renew of a stale claim of key {k}: {got:?}"
            );
            return;
        };
        assert_eq!(got.expect("renew an active claim"), at(now + self.lease));
        let bucket = prev.bucket;
        let rec = Rec {
            lease_until: now + self.lease,
            ..prev
        };
        let expires = (now + self.retention).max(now + self.lease);
        self.write(k, rec, expires, Some(bucket));
    }

    fn get(&self, k: usize) {
        let got = self.store().get(&key(k)).expect("get");
        check(k, got.as_ref(), self.live(k, self.now()));
    }
}

fn inserted(now: u64) -> Rec {
    Rec {
        kind: Kind::Inserted,
        fp: Fingerprint::NONE,
        attempt: 0,
        token: 0,
        first_at: now,
        lease_until: 0,
        bucket: 0,
        outcome: Vec::new(),
    }
}

fn check(k: usize, got: Option<&dedupkv::Record>, want: Option<&Rec>) {
    let (got, want) = match (got, want) {
        (None, None) => return,
        (Some(g), Some(w)) => (g, w),
        (g, w) => panic!("key {k}: store {g:?}, model {w:?}"),
    };
    let state = match want.kind {
        Kind::Inserted => State::Inserted,
        Kind::Claimed => State::InProgress,
        Kind::Released => State::Retryable,
        Kind::Completed => State::Completed,
        Kind::Failed => State::Failed,
    };
    let finished = matches!(want.kind, Kind::Completed | Kind::Failed);
    assert_eq!(got.key(), &key(k));
    assert_eq!(got.state(), state, "state of key {k}");
    assert_eq!(got.attempts(), want.attempt, "attempts of key {k}");
    assert_eq!(got.token(), want.token, "token of key {k}");
    assert_eq!(
        got.first_seen_at(),
        at(want.first_at),
        "first seen of key {k}"
    );
    assert_eq!(
        got.lease_expires_at(),
        (want.kind == Kind::Claimed).then(|| at(want.lease_until))
    );
    assert_eq!(
        got.fingerprint(),
        (want.kind != Kind::Inserted).then_some(want.fp)
    );
    assert_eq!(
        got.outcome(),
        finished.then_some(want.outcome.as_slice()),
        "outcome of key {k}"
    );
}

fuzz_target!(|input: Input| {
    let mut run = Run::new(input.preset);
    for op in input.ops.iter().take(MAX_OPS) {
        run.apply(op);
    }
    for k in 0..KEYS.len() {
        run.get(k);
    }
    run.held.clear();
});
