//! `Arbitrary` operation sequences against the model that `tests/model.rs`
//! runs under proptest (`dedupkv_testkit::model`): a store with a manual
//! clock on an in-memory file, clean reopens and power-cut crash images,
//! every answer checked against a `HashMap` of what each key should say.
//! Any disagreement panics. This target only maps libFuzzer's bytes onto
//! the model's operations; the model itself is the test's.

#![no_main]

use arbitrary::Arbitrary;
use dedupkv_testkit::model::{FINGERPRINTS, KEYS, Op, PER_CALL, RENEW_FOR, Settings, Step, run};
use libfuzzer_sys::fuzz_target;

/// Operations per input, at most.
const MAX_OPS: usize = 64;
/// Items per batch call (`insert_batch`, `begin_batch`, `complete_batch`),
/// at most.
const MAX_BATCH: usize = 8;

#[derive(Arbitrary, Debug)]
struct Input {
    /// Lease, retention and bucket granularity: one of the model's presets.
    preset: u8,
    ops: Vec<FuzzOp>,
}

/// An [`Op`] with small arbitrary fields, mapped into the ranges the
/// model accepts (key, fingerprint and per-call setting numbers modulo
/// their pools, at most 40 days of clock per step).
#[derive(Arbitrary, Debug)]
enum FuzzOp {
    Insert(u8),
    InsertBatch(Vec<u8>),
    Begin(u8, u8),
    /// Key, fingerprint, and one of the model's per-call settings.
    BeginWith(u8, u8, u8),
    BeginBatch(Vec<(u8, u8)>),
    /// Claim operations pick a held claim by its place from the newest.
    Complete(u8, u8),
    CompleteBatch(Vec<(u8, u8)>),
    FailRetryable(u8),
    FailAnyRequest(u8),
    FailPermanent(u8, u8),
    /// A held claim, a reason number, and whether a payload goes with it.
    FailExhausted(u8, u8, bool),
    Requeue(u8),
    ResolveCompleted(u8, u8),
    ResolveAbandoned(u8, u8),
    ListDeadLetters,
    /// Key, fingerprint, the intent's target and request by number.
    BeginWithIntent(u8, u8, u8, u8),
    /// A held claim and a reference number.
    MarkSent(u8, u8),
    /// A held claim, an outcome and an amount number.
    CompleteWithAmount(u8, u8, u8),
    ListPendingIntents,
    ListDuplicateCandidates,
    /// A scope of the key pool, by number.
    Tallies(u8),
    Renew(u8),
    /// A held claim, and one of the model's `renew_for` amounts.
    RenewFor(u8, u8),
    DropClaim(u8),
    Get(u8),
    Forget(u8),
    /// Forward by this many ms.
    Millis(u16),
    /// Forward by 1 to 40 days, then an eviction pass.
    Days(u8),
    /// Forward by the lease plus this many ms.
    NearLease(i16),
    /// Forward by the retention plus this many ms.
    NearRetention(i16),
    /// To 1 to 256 buckets ahead, then 1 ms before, on or after the edge.
    BucketEdge(u8, i8),
    Evict,
    Flush,
    Reopen,
    Crash,
}

impl FuzzOp {
    fn op(&self) -> Op {
        let key = |k: &u8| usize::from(*k) % KEYS;
        let n = |n: &u8| usize::from(*n);
        match self {
            FuzzOp::Insert(k) => Op::Insert(key(k)),
            FuzzOp::InsertBatch(ks) => {
                Op::InsertBatch(ks.iter().take(MAX_BATCH).map(key).collect())
            }
            FuzzOp::Begin(k, f) => Op::Begin(key(k), n(f) % FINGERPRINTS),
            FuzzOp::BeginWith(k, f, o) => {
                Op::BeginWith(key(k), n(f) % FINGERPRINTS, n(o) % PER_CALL.len())
            }
            FuzzOp::BeginBatch(items) => Op::BeginBatch(
                items
                    .iter()
                    .take(MAX_BATCH)
                    .map(|(k, f)| (key(k), n(f) % FINGERPRINTS))
                    .collect(),
            ),
            FuzzOp::Complete(c, o) => Op::Complete(n(c), *o),
            FuzzOp::CompleteBatch(items) => Op::CompleteBatch(
                items
                    .iter()
                    .take(MAX_BATCH)
                    .map(|(c, o)| (n(c), *o))
                    .collect(),
            ),
            FuzzOp::FailRetryable(c) => Op::FailRetryable(n(c)),
            FuzzOp::FailAnyRequest(c) => Op::FailAnyRequest(n(c)),
            FuzzOp::FailPermanent(c, o) => Op::FailPermanent(n(c), *o),
            FuzzOp::FailExhausted(c, r, p) => Op::FailExhausted(n(c), *r, *p),
            FuzzOp::Requeue(k) => Op::Requeue(key(k)),
            FuzzOp::ResolveCompleted(k, o) => Op::ResolveCompleted(key(k), *o),
            FuzzOp::ResolveAbandoned(k, o) => Op::ResolveAbandoned(key(k), *o),
            FuzzOp::ListDeadLetters => Op::ListDeadLetters,
            FuzzOp::BeginWithIntent(k, f, t, r) => {
                Op::BeginWithIntent(key(k), n(f) % FINGERPRINTS, *t, *r)
            }
            FuzzOp::MarkSent(c, r) => Op::MarkSent(n(c), *r),
            FuzzOp::CompleteWithAmount(c, o, a) => Op::CompleteWithAmount(n(c), *o, *a),
            FuzzOp::ListPendingIntents => Op::ListPendingIntents,
            FuzzOp::ListDuplicateCandidates => Op::ListDuplicateCandidates,
            FuzzOp::Tallies(s) => Op::Tallies(n(s)),
            FuzzOp::Renew(c) => Op::Renew(n(c)),
            FuzzOp::RenewFor(c, r) => Op::RenewFor(n(c), n(r) % RENEW_FOR.len()),
            FuzzOp::DropClaim(c) => Op::DropClaim(n(c)),
            FuzzOp::Get(k) => Op::Get(key(k)),
            FuzzOp::Forget(k) => Op::Forget(key(k)),
            FuzzOp::Millis(ms) => Op::Advance(Step::Millis(u64::from(*ms))),
            FuzzOp::Days(d) => Op::Advance(Step::Days(u64::from(d % 40) + 1)),
            FuzzOp::NearLease(d) => Op::Advance(Step::NearLease(i64::from(*d))),
            FuzzOp::NearRetention(d) => Op::Advance(Step::NearRetention(i64::from(*d))),
            FuzzOp::BucketEdge(b, d) => {
                Op::Advance(Step::BucketEdge(u64::from(*b) + 1, i64::from(d.signum())))
            }
            FuzzOp::Evict => Op::Evict,
            FuzzOp::Flush => Op::Flush,
            FuzzOp::Reopen => Op::Reopen,
            FuzzOp::Crash => Op::Crash,
        }
    }
}

fuzz_target!(|input: Input| {
    let ops: Vec<Op> = input.ops.iter().take(MAX_OPS).map(FuzzOp::op).collect();
    // In memory: a real file per input would slow the search down.
    let settings = Settings::preset(usize::from(input.preset), false);
    if let Err(e) = run(settings, &ops) {
        panic!("the store disagrees with the model: {e}");
    }
});
