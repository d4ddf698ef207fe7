//! The threads of a run: workers making every call on a few keys and
//! entities, a driver moving the manual clock, an evictor (`evict_expired`
//! and `compact`) and a lister; each call recorded.
//!
//! The driver, evictor and lister pace themselves by the history's
//! progress (so many calls since their last move), not by wall time: the
//! clock moves about as far per call on a slow machine as on a fast one.

use std::sync::Arc;
use std::time::Duration;

use dedupkv::{
    Begin, BeginOptions, Claim, Failure, Fingerprint, Intent, Key, Listing, Resolution, Store,
};

use super::record::{Answer, Call, Recorder, Span, Target};
use crate::model::state::{BeginReq, Begun, End, Leave, Refusal, answer};
use crate::model::{Settings, entity, fingerprint, key};

/// A small, seeded generator (splitmix64): the run's choices, not its
/// interleaving, follow from the seed.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Index into `weights`, chosen by weight.
    pub(crate) fn pick(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut r = (self.next() % u64::from(total)) as u32;
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return i;
            }
            r -= w;
        }
        weights.len() - 1
    }
}

/// The store settings of a run: 1 s leases, 5 s retention, 1 s buckets.
pub(crate) const fn settings(file: bool) -> Settings {
    Settings {
        lease: 1_000,
        retention: 5_000,
        granularity: 1_000,
        file,
    }
}

/// Per-call (lease, retention) of `begin_with`, in ms (`None`: the
/// store's).
const PER_CALL: [(Option<u64>, Option<u64>); 5] = [
    (Some(300), None),
    (Some(2_500), None),
    (None, Some(2_000)),
    (None, Some(12_000)),
    (Some(400), Some(3_000)),
];

/// What the threads share.
pub(crate) struct World {
    pub(crate) store: Store,
    pub(crate) rec: Arc<Recorder>,
    pub(crate) s: Settings,
    pub(crate) keys: usize,
    pub(crate) entities: usize,
    /// What `complete_value` stores for 0, 1 and 2.
    pub(crate) values: [Vec<u8>; 3],
}

/// One worker thread: its slot, name, choices and the claims it holds.
pub(crate) struct Worker<'a> {
    w: &'a World,
    slot: usize,
    name: &'static str,
    rng: Rng,
    mix: &'static [(Act, u32)],
    held: Vec<(usize, Claim)>,
}

/// A worker's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Begin,
    BeginWith,
    BeginWithIntent,
    BeginBatch,
    Complete,
    CompleteValue,
    CompleteWithAmount,
    CompleteBatch,
    FailRetryable,
    FailAnyRequest,
    FailPermanent,
    FailExhausted,
    Renew,
    DropClaim,
    MarkSent,
    Forget,
    Requeue,
    Resolve,
    Get,
    IntentOf,
    Insert,
    ListDeadLetters,
    ListStranded,
    ListPendingIntents,
    Sequence,
    Ack,
    Advance,
    Unacked,
}

impl Act {
    /// Whether it needs a held claim.
    fn on_claim(self) -> bool {
        use Act::{
            Complete, CompleteBatch, CompleteValue, CompleteWithAmount, DropClaim, FailAnyRequest,
            FailExhausted, FailPermanent, FailRetryable, MarkSent, Renew,
        };
        matches!(
            self,
            Complete
                | CompleteValue
                | CompleteWithAmount
                | CompleteBatch
                | FailRetryable
                | FailAnyRequest
                | FailPermanent
                | FailExhausted
                | Renew
                | DropClaim
                | MarkSent
        )
    }
}

/// The mixes of calls a run's workers make, by weight: every call; the
/// dead-letter area (begin, exhaust, requeue, list); claims against
/// `forget` and replays.
const MIXES: [&[(Act, u32)]; 3] = [
    &[
        (Act::Begin, 8),
        (Act::BeginWith, 4),
        (Act::BeginWithIntent, 3),
        (Act::BeginBatch, 2),
        (Act::Complete, 5),
        (Act::CompleteValue, 2),
        (Act::CompleteWithAmount, 2),
        (Act::CompleteBatch, 1),
        (Act::FailRetryable, 2),
        (Act::FailAnyRequest, 1),
        (Act::FailPermanent, 1),
        (Act::FailExhausted, 3),
        (Act::Renew, 2),
        (Act::DropClaim, 2),
        (Act::MarkSent, 2),
        (Act::Forget, 3),
        (Act::Requeue, 3),
        (Act::Resolve, 2),
        (Act::Get, 4),
        (Act::IntentOf, 1),
        (Act::Insert, 1),
        (Act::ListDeadLetters, 1),
        (Act::ListStranded, 1),
        (Act::ListPendingIntents, 1),
        (Act::Sequence, 2),
        (Act::Ack, 1),
        (Act::Advance, 1),
        (Act::Unacked, 1),
    ],
    &[
        (Act::Begin, 6),
        (Act::FailExhausted, 6),
        (Act::Requeue, 6),
        (Act::ListDeadLetters, 6),
        (Act::Complete, 1),
        (Act::Resolve, 1),
        (Act::Get, 1),
    ],
    &[
        (Act::Begin, 6),
        (Act::BeginWith, 2),
        (Act::Complete, 3),
        (Act::FailRetryable, 3),
        (Act::FailExhausted, 2),
        (Act::DropClaim, 2),
        (Act::Forget, 5),
        (Act::Requeue, 2),
        (Act::Get, 2),
        (Act::ListStranded, 1),
    ],
];

impl<'a> Worker<'a> {
    pub(crate) fn new(
        w: &'a World,
        (slot, name): (usize, &'static str),
        mix: usize,
        seed: u64,
    ) -> Self {
        Worker {
            w,
            slot,
            name,
            rng: Rng::new(seed),
            mix: MIXES[mix % MIXES.len()],
            held: Vec::new(),
        }
    }

    /// Makes `ops` calls (fewer if the run stops), then drops the claims
    /// it still holds.
    pub(crate) fn run(mut self, ops: usize) {
        for _ in 0..ops {
            if self.w.rec.stopped() {
                break;
            }
            self.one();
        }
        while !self.held.is_empty() && !self.w.rec.stopped() {
            self.drop_claim(0);
        }
    }

    fn key(&mut self) -> usize {
        self.rng.below(self.w.keys)
    }

    fn fp(&mut self) -> usize {
        // Mostly one request, sometimes another (a mismatch).
        if self.rng.below(8) == 0 { 2 } else { 1 }
    }

    /// A held claim, by position.
    fn claim(&mut self) -> Option<usize> {
        (!self.held.is_empty()).then(|| self.rng.below(self.held.len()))
    }

    fn one(&mut self) {
        let weights: Vec<u32> = self.mix.iter().map(|(_, w)| *w).collect();
        let mut act = self.mix[self.rng.pick(&weights)].0;
        // Claim calls need a claim; a worker holding three finishes one.
        if act.on_claim() && self.held.is_empty() {
            act = Act::Begin;
        }
        if matches!(
            act,
            Act::Begin | Act::BeginWith | Act::BeginWithIntent | Act::BeginBatch
        ) && self.held.len() >= 3
        {
            act = Act::Complete;
        }
        let n = self.rng.below(3) as u8;
        match act {
            Act::Begin => {
                let (k, f) = (self.key(), self.fp());
                self.begin(k, f, None, false);
            }
            Act::BeginWith => {
                let (k, f, o) = (self.key(), self.fp(), self.rng.below(PER_CALL.len()));
                self.begin(k, f, Some(PER_CALL[o]), false);
            }
            Act::BeginWithIntent => {
                let (k, f) = (self.key(), self.fp());
                self.begin(k, f, None, true);
            }
            Act::BeginBatch => self.begin_batch(),
            Act::CompleteBatch => self.complete_batch(),
            Act::Complete
            | Act::CompleteValue
            | Act::CompleteWithAmount
            | Act::FailRetryable
            | Act::FailAnyRequest
            | Act::FailPermanent
            | Act::FailExhausted => self.end(act, n),
            Act::Renew => {
                let Some(i) = self.claim() else { return };
                let by = [None, Some(200), Some(1_500)][usize::from(n)];
                self.renew(i, by);
            }
            Act::DropClaim => {
                let Some(i) = self.claim() else { return };
                self.drop_claim(i);
            }
            Act::MarkSent => {
                let Some(i) = self.claim() else { return };
                self.mark_sent(i, vec![b'x'; usize::from(n) + 1]);
            }
            Act::Forget => {
                let k = self.key();
                self.forget(k);
            }
            Act::Requeue | Act::Resolve => {
                let k = self.key();
                let how = match (act, n) {
                    (Act::Requeue, _) => Leave::Requeue,
                    (_, 0) => Leave::Completed(b"resolved".to_vec()),
                    _ => Leave::Abandoned("by hand".to_owned()),
                };
                self.leave(k, how);
            }
            Act::Get => {
                let k = self.key();
                self.get(k);
            }
            Act::IntentOf => {
                let k = self.key();
                self.intent(k);
            }
            Act::Insert => {
                let k = self.key();
                self.insert(k);
            }
            Act::ListDeadLetters => list(self.w, (self.slot, self.name), 0),
            Act::ListStranded => list(self.w, (self.slot, self.name), 1),
            Act::ListPendingIntents => list(self.w, (self.slot, self.name), 2),
            Act::Sequence | Act::Ack | Act::Advance | Act::Unacked => {
                let e = self.rng.below(self.w.entities);
                self.entity_call(act, e);
            }
        }
    }

    /// Finishes a held claim as `act` says (`n` varies the outcome).
    fn end(&mut self, act: Act, n: u8) {
        let Some(i) = self.claim() else { return };
        let (end, how) = match act {
            Act::Complete => (End::Complete(vec![b'o'; usize::from(n)]), How::Raw),
            Act::CompleteValue => (
                End::Complete(self.w.values[usize::from(n)].clone()),
                How::Value(u32::from(n)),
            ),
            Act::CompleteWithAmount => (
                End::Complete(vec![b'a'; usize::from(n)]),
                How::Amount(i64::from(n) * 100 - 50),
            ),
            Act::FailRetryable => (End::Retryable, How::Raw),
            Act::FailAnyRequest => (End::AnyRequest, How::Raw),
            Act::FailPermanent => (End::Permanent(vec![b'f'; usize::from(n) + 1]), How::Raw),
            _ => (
                End::Exhausted {
                    reason: format!("gave up {n}"),
                    payload: (n > 0).then(|| vec![b'd'; usize::from(n)]),
                },
                How::Raw,
            ),
        };
        self.finish(i, end, how);
    }

    fn push(&self, name: &'static str, target: Target, call: Call, answer: Answer, span: Span) {
        self.w
            .rec
            .push((self.name, name), target, call, answer, span);
    }

    fn begin(
        &mut self,
        k: usize,
        f: usize,
        per_call: Option<(Option<u64>, Option<u64>)>,
        with_intent: bool,
    ) {
        let (store, s) = (&self.w.store, self.w.s);
        let (lease, retention) = per_call.unwrap_or((None, None));
        let mut opts = BeginOptions::new();
        if let Some(ms) = lease {
            opts = opts.lease(Duration::from_millis(ms));
        }
        if let Some(ms) = retention {
            opts = opts.retention(Duration::from_millis(ms));
        }
        let intent = with_intent.then(|| {
            (
                format!("t{}", self.rng.below(2)),
                vec![b'q'; self.rng.below(3)],
            )
        });
        let req = BeginReq {
            fp: fingerprint(f),
            lease_ms: lease.unwrap_or(s.lease),
            retention_ms: retention.unwrap_or(s.retention),
            intent: intent.clone(),
        };
        let name = match (&intent, per_call) {
            (Some(_), _) => "begin_with_intent",
            (None, Some(_)) => "begin_with",
            (None, None) => "begin",
        };
        let Some((got, span)) = self.w.rec.call(
            self.slot,
            || format!("{}: {name} of key {}", self.name, key(k)),
            || match &intent {
                Some((target, request)) => store.begin_with_intent(
                    &key(k),
                    fingerprint(f),
                    &opts,
                    Intent { target, request },
                ),
                None => store.begin_with(&key(k), fingerprint(f), &opts),
            },
        ) else {
            return;
        };
        self.push(
            name,
            Target::Key(k),
            Call::Begin(req),
            Answer::Begun(Begun::of(&got)),
            span,
        );
        if let Ok(Begin::Started(c)) = got {
            self.held.push((k, c));
        }
    }

    fn begin_batch(&mut self) {
        let store = &self.w.store;
        let n = 2 + self.rng.below(2);
        let items: Vec<(usize, usize)> = (0..n).map(|_| (self.key(), self.fp())).collect();
        let keyed: Vec<(Key<'static>, Fingerprint)> = items
            .iter()
            .map(|&(k, f)| (key(k), fingerprint(f)))
            .collect();
        let Some((got, span)) = self.w.rec.call(
            self.slot,
            || format!("{}: begin_batch of {items:?}", self.name),
            || store.begin_batch(&keyed),
        ) else {
            return;
        };
        let got = match got {
            Ok(v) => v,
            Err(e) => {
                return self.w.rec.fail(format!(
                    "{}: begin_batch of {items:?} failed: {e}",
                    self.name
                ));
            }
        };
        for (&(k, f), got) in items.iter().zip(got) {
            let req = BeginReq {
                fp: fingerprint(f),
                lease_ms: self.w.s.lease,
                retention_ms: self.w.s.retention,
                intent: None,
            };
            self.push(
                "begin_batch",
                Target::Key(k),
                Call::Begin(req),
                Answer::Begun(Begun::of(&got)),
                span,
            );
            if let Ok(Begin::Started(c)) = got {
                self.held.push((k, c));
            }
        }
    }

    /// Finishes held claim `i` as `end`, made by the call `how` says; the
    /// handle is dropped after (recorded, though it changes nothing once
    /// the claim is finished).
    fn finish(&mut self, i: usize, end: End, how: How) {
        let store = &self.w.store;
        let (k, claim) = &self.held[i];
        let (k, token) = (*k, claim.token());
        let name = match (&end, how) {
            (End::Complete(_), How::Value(_)) => "complete_value",
            (End::Complete(_), How::Amount(_)) => "complete_with_amount",
            (End::Complete(_), How::Raw) => "complete",
            _ => "fail",
        };
        let Some((got, span)) = self.w.rec.call(
            self.slot,
            || format!("{}: {name} of key {}", self.name, key(k)),
            || match (&end, how) {
                (End::Complete(_), How::Value(v)) => store.complete_value(claim, &v),
                (End::Complete(o), How::Amount(a)) => store.complete_with_amount(claim, o, a),
                (End::Complete(o), How::Raw) => store.complete(claim, o),
                (End::Permanent(p), _) => store.fail(claim, Failure::Permanent(p)),
                (End::Retryable, _) => store.fail(claim, Failure::Retryable),
                (End::AnyRequest, _) => store.fail(claim, Failure::RetryableAnyRequest),
                (End::Exhausted { reason, payload }, _) => store.fail(
                    claim,
                    Failure::Exhausted {
                        reason,
                        payload: payload.as_deref(),
                    },
                ),
            },
        ) else {
            return;
        };
        let amount = match how {
            How::Amount(a) => a,
            _ => 0,
        };
        self.push(
            name,
            Target::Key(k),
            Call::Finish { token, end, amount },
            Answer::Unit(answer(&got)),
            span,
        );
        self.drop_claim(i);
    }

    fn complete_batch(&mut self) {
        let store = &self.w.store;
        let n = self.held.len().min(2);
        let picked: Vec<(usize, u64, Vec<u8>)> = (0..n)
            .map(|i| (self.held[i].0, self.held[i].1.token(), vec![b'b'; i + 1]))
            .collect();
        let batch: Vec<(&Claim, &[u8])> = (0..n)
            .map(|i| (&self.held[i].1, picked[i].2.as_slice()))
            .collect();
        let Some((got, span)) = self.w.rec.call(
            self.slot,
            || format!("{}: complete_batch", self.name),
            || store.complete_batch(&batch),
        ) else {
            return;
        };
        let got = match got {
            Ok(v) => v,
            Err(e) => {
                return self
                    .w
                    .rec
                    .fail(format!("{}: complete_batch failed: {e}", self.name));
            }
        };
        for ((k, token, o), got) in picked.into_iter().zip(got) {
            self.push(
                "complete_batch",
                Target::Key(k),
                Call::Finish {
                    token,
                    end: End::Complete(o),
                    amount: 0,
                },
                Answer::Unit(answer(&got)),
                span,
            );
        }
        for _ in 0..n {
            self.drop_claim(0);
        }
    }

    fn renew(&mut self, i: usize, by: Option<u64>) {
        let store = &self.w.store;
        let (k, claim) = &self.held[i];
        let (k, token) = (*k, claim.token());
        let Some((got, span)) = self.w.rec.call(
            self.slot,
            || format!("{}: renew of key {}", self.name, key(k)),
            || match by {
                None => store.renew(claim),
                Some(ms) => store.renew_for(claim, Duration::from_millis(ms)),
            },
        ) else {
            return;
        };
        self.push(
            "renew",
            Target::Key(k),
            Call::Renew { token, by },
            Answer::Renewed(answer(&got)),
            span,
        );
    }

    /// Drops held claim `i` (an unfinished, active one releases its key).
    fn drop_claim(&mut self, i: usize) {
        let (k, claim) = self.held.remove(i);
        let token = claim.token();
        let Some(((), span)) = self.w.rec.call(
            self.slot,
            || format!("{}: dropping the claim on key {}", self.name, key(k)),
            || drop(claim),
        ) else {
            return;
        };
        self.push(
            "drop",
            Target::Key(k),
            Call::Drop { token },
            Answer::None,
            span,
        );
    }

    fn mark_sent(&mut self, i: usize, reference: Vec<u8>) {
        let store = &self.w.store;
        let (k, claim) = &self.held[i];
        let provider = claim
            .provider_key()
            .unwrap_or_else(|e| format!("(no provider key: {e})"));
        let (k, token) = (*k, claim.token());
        let Some((got, span)) = self.w.rec.call(
            self.slot,
            || format!("{}: mark_sent of key {}", self.name, key(k)),
            || store.mark_sent(claim, &reference),
        ) else {
            return;
        };
        self.push(
            "mark_sent",
            Target::Key(k),
            Call::MarkSent {
                token,
                provider,
                reference,
            },
            Answer::Unit(answer(&got)),
            span,
        );
    }

    /// A call of key `k` whose error the model never expects.
    fn key_call<T>(
        &self,
        (k, name): (usize, &'static str),
        call: Call,
        f: impl FnOnce(&Store, &Key<'static>) -> dedupkv::Result<T>,
        wrap: impl FnOnce(T) -> Answer,
    ) {
        let store = &self.w.store;
        let Some((got, span)) = self.w.rec.call(
            self.slot,
            || format!("{}: {name} of key {}", self.name, key(k)),
            || f(store, &key(k)),
        ) else {
            return;
        };
        let answer = match got {
            Ok(v) => wrap(v),
            Err(e) => Answer::Refused(Refusal::of(&e)),
        };
        self.push(name, Target::Key(k), call, answer, span);
    }

    fn forget(&self, k: usize) {
        self.key_call((k, "forget"), Call::Forget, Store::forget, Answer::Forget);
    }

    fn get(&self, k: usize) {
        self.key_call((k, "get"), Call::Get, Store::get, Answer::Record);
    }

    fn intent(&self, k: usize) {
        self.key_call((k, "intent"), Call::Intent, Store::intent, Answer::Intent);
    }

    fn insert(&self, k: usize) {
        self.key_call(
            (k, "insert_if_absent"),
            Call::Insert,
            Store::insert_if_absent,
            Answer::Bool,
        );
    }

    fn leave(&self, k: usize, how: Leave) {
        let name = if matches!(how, Leave::Requeue) {
            "requeue"
        } else {
            "resolve"
        };
        let h = how.clone();
        self.key_call(
            (k, name),
            Call::Leave(how),
            move |store, key| match &h {
                Leave::Requeue => store.requeue(key),
                Leave::Completed(o) => store.resolve(key, Resolution::Completed(o)),
                Leave::Abandoned(n) => store.resolve(key, Resolution::Abandoned(n)),
            },
            Answer::Bool,
        );
    }

    fn entity_call(&mut self, act: Act, e: usize) {
        let store = &self.w.store;
        let ent = entity(e);
        let seq = 1 + self.rng.below(8) as u64;
        let (name, call) = match act {
            Act::Sequence => (
                "sequence",
                Call::Sequence {
                    seq,
                    payload: vec![b'p'; self.rng.below(3)],
                },
            ),
            Act::Ack => ("ack", Call::Ack { upto: seq }),
            Act::Advance => ("advance", Call::Advance { version: seq }),
            _ => ("unacked", Call::Unacked),
        };
        let Some((answer, span)) = self.w.rec.call(
            self.slot,
            || format!("{}: {name} of entity {ent}", self.name),
            || {
                let r = match &call {
                    Call::Sequence { seq, payload } => {
                        store.sequence(&ent, *seq, payload).map(Answer::Sequenced)
                    }
                    Call::Ack { upto } => store.ack(&ent, *upto).map(Answer::Acked),
                    Call::Advance { version } => {
                        store.advance(&ent, *version).map(Answer::Advanced)
                    }
                    _ => store.unacked(&ent).map(Answer::Unacked),
                };
                r.unwrap_or_else(|e| Answer::Refused(Refusal::of(&e)))
            },
        ) else {
            return;
        };
        self.push(name, Target::Entity(e), call, answer, span);
    }
}

/// How a completion is made.
#[derive(Clone, Copy)]
enum How {
    Raw,
    /// `complete_value` of a `u32`.
    Value(u32),
    Amount(i64),
}

/// One listing (`which`: dead letters, stranded claims, pending intents)
/// of the whole store, recorded as one call per key of the pool.
pub(crate) fn list(w: &World, (slot, thread): (usize, &'static str), which: usize) {
    let listing = Listing::new().limit(1_000);
    let store = &w.store;
    let name = ["dead_letters", "stranded_claims", "pending_intents"][which % 3];
    let Some((got, span)) = w.rec.call(
        slot,
        || format!("{thread}: {name}()"),
        || -> dedupkv::Result<Vec<(Key<'static>, Answer)>> {
            Ok(match which % 3 {
                0 => store
                    .dead_letters(&listing)?
                    .items
                    .into_iter()
                    .map(|d| (d.key().clone(), Answer::DeadLetter(Some(d))))
                    .collect(),
                1 => store
                    .stranded_claims(&listing)?
                    .items
                    .into_iter()
                    .map(|r| (r.key().clone(), Answer::Stranded(Some(r))))
                    .collect(),
                _ => store
                    .pending_intents(&listing)?
                    .items
                    .into_iter()
                    .map(|i| (i.key().clone(), Answer::PendingIntent(Some(i))))
                    .collect(),
            })
        },
    ) else {
        return;
    };
    let mut items = match got {
        Ok(items) => items,
        Err(e) => return w.rec.fail(format!("{thread}: {name}() failed: {e}")),
    };
    for k in 0..w.keys {
        let mine: Vec<usize> = (0..items.len()).filter(|&i| items[i].0 == key(k)).collect();
        if mine.len() > 1 {
            return w
                .rec
                .fail(format!("{thread}: {name}() lists key {} twice", key(k)));
        }
        let answer = match mine.first() {
            Some(&i) => items.swap_remove(i).1,
            None => match which % 3 {
                0 => Answer::DeadLetter(None),
                1 => Answer::Stranded(None),
                _ => Answer::PendingIntent(None),
            },
        };
        let call = match which % 3 {
            0 => Call::ListDeadLetters,
            1 => Call::ListStranded,
            _ => Call::ListPendingIntents,
        };
        w.rec
            .push((thread, name), Target::Key(k), call, answer, span);
    }
    if let Some((other, _)) = items.first() {
        w.rec.fail(format!(
            "{thread}: {name}() lists {other}, not a key of the run"
        ));
    }
}

/// Waits until the history has moved `calls` invocations or responses
/// past `since` (or the run stopped); returns the new mark.
pub(crate) fn pace(rec: &Recorder, since: u64, calls: u64) -> Option<u64> {
    loop {
        if rec.stopped() {
            return None;
        }
        let now = rec.progress();
        if now >= since + calls {
            return Some(now);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The clock's driver: a step for every eight calls (mostly short,
/// sometimes past a lease or a bucket, rarely past the retention), the
/// steps due since it last looked taken at once.
pub(crate) fn drive(rec: &Recorder, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut mark = 0;
    while let Some(m) = pace(rec, mark, 8) {
        let due = (m - mark) / 8;
        mark += due * 8;
        let ms: u64 = (0..due)
            .map(|_| match rng.pick(&[75, 20, 4, 1]) {
                0 => 10 + rng.below(30) as u64,
                1 => 100 + rng.below(200) as u64,
                2 => 500 + rng.below(500) as u64,
                _ => 3_000 + rng.below(3_000) as u64,
            })
            .sum();
        rec.advance(ms);
    }
}

/// The evictor: every few calls `evict_expired` (recorded as a call of
/// every key), and every fifth time `compact`.
pub(crate) fn evict(w: &World, slot: usize) {
    let mut mark = 0;
    let mut n = 0u64;
    while let Some(m) = pace(&w.rec, mark, 40) {
        mark = m;
        n += 1;
        let Some((got, span)) = w.rec.call(
            slot,
            || "evictor: evict_expired()".to_owned(),
            || w.store.evict_expired(),
        ) else {
            return;
        };
        if let Err(e) = got {
            return w.rec.fail(format!("evictor: evict_expired() failed: {e}"));
        }
        for k in 0..w.keys {
            for call in [Call::CloseBuckets, Call::Evict] {
                w.rec.push(
                    ("evict", "evict_expired"),
                    Target::Key(k),
                    call,
                    Answer::None,
                    span,
                );
            }
        }
        if n.is_multiple_of(5) {
            let Some((got, _)) = w.rec.call(
                slot,
                || "evictor: compact()".to_owned(),
                || w.store.compact(),
            ) else {
                return;
            };
            if let Err(e) = got {
                return w.rec.fail(format!("evictor: compact() failed: {e}"));
            }
        }
    }
}

/// The lister: every few calls, one of the three listings in turn.
pub(crate) fn lister(w: &World, slot: usize) {
    let mut mark = 0;
    let mut which = 0;
    while let Some(m) = pace(&w.rec, mark, 6) {
        mark = m;
        list(w, (slot, "lister"), which);
        which += 1;
    }
}
