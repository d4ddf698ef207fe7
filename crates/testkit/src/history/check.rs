//! Checking a recorded history for linearizability, key by key (keys and
//! entities are independent): is there an order of a key's calls,
//! consistent with real time (A before B if A returned before B was
//! invoked), that the model accepts? A depth-first search over the calls
//! that may come next (Wing & Gong, with Lowe's memo of visited (set of
//! calls done, model state) pairs, as Knossos and Porcupine do). A call
//! that read the clock tries every reading the clock had during it.
//!
//! A key that fails is cut down to a short failing history (the shortest
//! failing prefix, then without the observations and evictions the failure
//! does not need) and printed with the longest order the model accepts
//! and why each call that could come next does not fit.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::Hash;

use dedupkv::{Forget, Sequenced};

use super::record::{Answer, Call, Event, Target, key_name, rel};
use crate::model::state::{Begun, End, EntityState, KeyState, Kind, Refusal};
use crate::model::{Settings, T0, TestResult, entity};

/// The most states the search for a verdict may visit before it gives up.
const BUDGET: usize = 1_000_000;
/// The most states each search while shrinking may visit (one that gives
/// up counts as not failing: the calls it tried to drop stay).
const SHRINK_BUDGET: usize = 100_000;
/// How long shrinking the failing keys of one history may take in all;
/// then it stops where it is.
const SHRINK_TIME: std::time::Duration = std::time::Duration::from_secs(20);
/// The most calls a report prints (the last ones before the failure).
const SHOWN: usize = 150;

/// A state the search steps: a key's or an entity's.
pub(crate) trait Stepped: Clone + Eq + Hash + std::fmt::Debug + Default {
    /// Applies event `ev` of target number `n` at `now` (an exhausted
    /// failure read the clock at `failed_at`), if the model accepts its
    /// answer. `lenient`: a listing that left the key out while it was
    /// written meanwhile, which the store allows.
    fn step(
        &mut self,
        s: &Settings,
        n: usize,
        ev: &Event,
        reading: (u64, u64),
        lenient: bool,
    ) -> TestResult;

    /// The state, briefly.
    fn describe(&self) -> String;
}

fn unknown(ev: &Event) -> TestResult {
    Err(proptest::test_runner::TestCaseError::fail(format!(
        "the model has no step for {:?} answered {:?}",
        ev.call, ev.answer
    )))
}

fn refused(r: &Refusal) -> TestResult {
    Err(proptest::test_runner::TestCaseError::fail(format!(
        "unexpected error: {r:?}"
    )))
}

impl Stepped for KeyState {
    fn step(
        &mut self,
        s: &Settings,
        k: usize,
        ev: &Event,
        (now, failed_at): (u64, u64),
        lenient: bool,
    ) -> TestResult {
        match (&ev.call, &ev.answer) {
            (_, Answer::Refused(r)) => refused(r),
            (Call::Insert, Answer::Bool(b)) => self.insert(s, k, now, *b),
            (Call::Begin(req), Answer::Begun(got)) => self.begin(s, k, now, req, got, 0).map(drop),
            (Call::Finish { token, end, .. }, Answer::Unit(got)) => self
                .finish(s, (k, now, Some(*token)), end, failed_at, got)
                .map(drop),
            (Call::Renew { token, by }, Answer::Renewed(got)) => {
                self.renew(s, (k, now, Some(*token)), *by, got).map(drop)
            }
            (Call::Drop { token }, _) => {
                self.drop_claim(s, now, Some(*token));
                Ok(())
            }
            (
                Call::MarkSent {
                    token,
                    provider,
                    reference,
                },
                Answer::Unit(got),
            ) => self
                .mark_sent(s, (k, now, Some(*token)), (provider, reference), got)
                .map(drop),
            (Call::Get, Answer::Record(got)) => self.get(s, k, now, got.as_ref()),
            (Call::Intent, Answer::Intent(got)) => self.intent(k, got.as_ref()),
            (Call::Forget, Answer::Forget(got)) => self.forget(s, (k, now), got, 0).map(drop),
            (Call::Leave(how), Answer::Bool(got)) => {
                self.leave_dead_letter(s, (k, now), how, *got).map(drop)
            }
            (Call::ListDeadLetters, Answer::DeadLetter(None))
            | (Call::ListStranded, Answer::Stranded(None))
            | (Call::ListPendingIntents, Answer::PendingIntent(None))
                if lenient =>
            {
                Ok(())
            }
            (Call::ListDeadLetters, Answer::DeadLetter(got)) => {
                self.dead_letter_listed(k, got.as_ref())
            }
            (Call::ListStranded, Answer::Stranded(got)) => {
                self.stranded_listed(s, (k, now), got.as_ref(), 0)
            }
            (Call::ListPendingIntents, Answer::PendingIntent(got)) => {
                self.pending_intent_listed(k, got.as_ref())
            }
            (Call::CloseBuckets, _) => {
                self.close(s, now);
                Ok(())
            }
            (Call::Evict, _) => {
                self.evict_pass(s, now);
                Ok(())
            }
            _ => unknown(ev),
        }
    }

    fn describe(&self) -> String {
        let rec = match &self.rec {
            None => "absent".to_owned(),
            Some(r) => {
                let mut d = format!(
                    "{:?} attempt {} token {} at +{} expires +{} (bucket {})",
                    r.kind,
                    r.attempt,
                    r.token,
                    r.at.saturating_sub(T0),
                    r.expires.saturating_sub(T0),
                    r.bucket
                );
                if r.kind == Kind::Claimed {
                    let _ = write!(d, " lease until +{}", r.lease_until.saturating_sub(T0));
                }
                if !r.outcome.is_empty() {
                    let _ = write!(d, " outcome {:?}", String::from_utf8_lossy(&r.outcome));
                }
                d
            }
        };
        match &self.intent {
            None => rec,
            Some(i) => format!(
                "{rec}; intent {} attempt {}",
                if i.sent { "sent" } else { "pending" },
                i.attempt
            ),
        }
    }
}

impl Stepped for EntityState {
    fn step(
        &mut self,
        s: &Settings,
        e: usize,
        ev: &Event,
        (now, _): (u64, u64),
        _: bool,
    ) -> TestResult {
        match (&ev.call, &ev.answer) {
            (_, Answer::Refused(r)) => refused(r),
            (Call::Sequence { seq, payload }, Answer::Sequenced(got)) => self
                .sequence(s, (e, now), (*seq, payload, s.lease), got)
                .map(drop),
            (Call::Ack { upto }, Answer::Acked(got)) => {
                self.ack(s, (e, now), *upto, *got).map(drop)
            }
            (Call::Advance { version }, Answer::Advanced(got)) => {
                self.advance(s, (e, now), *version, *got).map(drop)
            }
            (Call::Unacked, Answer::Unacked(got)) => self.unacked(s, (e, now), got),
            _ => unknown(ev),
        }
    }

    fn describe(&self) -> String {
        match &self.0 {
            None => "fresh".to_owned(),
            Some(m) => format!(
                "next {} parked {:?} unacked {:?} version {:?}",
                m.next,
                m.parked.keys().collect::<Vec<_>>(),
                m.unacked.keys().collect::<Vec<_>>(),
                m.version
            ),
        }
    }
}

/// A set of calls, by position.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
}

/// One target's calls, ready to search.
struct Target1<'a> {
    s: &'a Settings,
    n: usize,
    evs: Vec<&'a Event>,
    lenient: Vec<bool>,
    /// Per call, the clock readings during it.
    times: Vec<Vec<u64>>,
}

/// What a search found.
enum Found<M> {
    Linearizable,
    /// No order: the longest one the model accepts (positions), the state
    /// it leaves, and why each call that may come next does not fit.
    Violation {
        order: Vec<usize>,
        state: M,
        next: Vec<(usize, String)>,
    },
    /// Gave up after visiting as many states as it was given.
    Budget,
}

impl<'a> Target1<'a> {
    fn new(s: &'a Settings, n: usize, mut evs: Vec<&'a Event>, all_times: &[u64]) -> Target1<'a> {
        evs.sort_by_key(|e| e.span.inv);
        let times = evs
            .iter()
            .map(|e| {
                let lo = all_times.partition_point(|t| *t < e.span.t_inv);
                let hi = all_times.partition_point(|t| *t <= e.span.t_resp);
                all_times[lo..hi.max(lo + 1).min(all_times.len())].to_vec()
            })
            .collect();
        let lenient = evs
            .iter()
            .map(|e| {
                matches!(
                    e.call,
                    Call::ListDeadLetters | Call::ListStranded | Call::ListPendingIntents
                ) && evs.iter().any(|o| {
                    !o.call.reads() && o.span.inv < e.span.resp && e.span.inv < o.span.resp
                })
            })
            .collect();
        Target1 {
            s,
            n,
            evs,
            lenient,
            times,
        }
    }

    /// The (`now`, `failed_at`) pairs call `i` may have read.
    fn readings(&self, i: usize) -> Vec<(u64, u64)> {
        let ts = &self.times[i];
        let exhausted = matches!(
            self.evs[i].call,
            Call::Finish {
                end: End::Exhausted { .. },
                ..
            }
        );
        let mut out = Vec::new();
        for (j, &now) in ts.iter().enumerate() {
            if exhausted {
                out.extend(ts[..=j].iter().map(|&f| (now, f)));
            } else {
                out.push((now, now));
            }
        }
        out
    }

    /// The positions that may come next after `done`: not done, and
    /// invoked before every call not done returned.
    fn next(&self, done: &Bits, from: usize) -> Vec<usize> {
        let mut min_resp = u64::MAX;
        let mut out = Vec::new();
        for i in from..self.evs.len() {
            let e = self.evs[i];
            if e.span.inv >= min_resp {
                break;
            }
            if done.has(i) {
                continue;
            }
            min_resp = min_resp.min(e.span.resp);
            out.push(i);
        }
        out.retain(|&i| self.evs[i].span.inv < min_resp);
        out
    }

    fn search<M: Stepped>(&self, only: &[usize], budget: usize) -> Found<M> {
        // `only`: the positions in play (the rest count as done).
        let n = self.evs.len();
        let mut start = Bits::new(n);
        let mut playing = vec![false; n];
        for &i in only {
            playing[i] = true;
        }
        for (i, p) in playing.iter().enumerate() {
            if !p {
                start.set(i);
            }
        }
        let total = only.len();
        // Nodes: (done, first position not done, state, parent, position).
        let mut nodes: Vec<(usize, usize)> = Vec::new();
        let mut seen: HashSet<(Bits, M)> = HashSet::new();
        let mut stack: Vec<(Bits, usize, M, usize, Option<usize>)> =
            vec![(start.clone(), 0, M::default(), 0, None)];
        let mut best: (usize, Option<usize>, M, Bits) = (0, None, M::default(), start.clone());
        let mut visited = 0usize;
        while let Some((done, from, state, depth, node)) = stack.pop() {
            visited += 1;
            if visited > budget {
                return Found::Budget;
            }
            if depth == total {
                return Found::Linearizable;
            }
            if depth > best.0 {
                best = (depth, node, state.clone(), done.clone());
            }
            let mut from = from;
            while from < n && done.has(from) {
                from += 1;
            }
            let next = self.next(&done, from);
            for &i in next.iter().rev() {
                for reading in self.readings(i) {
                    let mut st = state.clone();
                    if st
                        .step(self.s, self.n, self.evs[i], reading, self.lenient[i])
                        .is_err()
                    {
                        continue;
                    }
                    let mut d = done.clone();
                    d.set(i);
                    if seen.insert((d.clone(), st.clone())) {
                        nodes.push((node.map_or(usize::MAX, |p| p), i));
                        let id = nodes.len() - 1;
                        stack.push((d, from, st, depth + 1, Some(id)));
                    }
                }
            }
        }
        // No order: explain the deepest point.
        let (_, node, state, done) = best;
        let mut order = Vec::new();
        let mut at = node;
        while let Some(id) = at {
            let (parent, i) = nodes[id];
            order.push(i);
            at = (parent != usize::MAX).then_some(parent);
        }
        order.reverse();
        let from = (0..n).find(|&i| !done.has(i)).unwrap_or(n);
        let next = self
            .next(&done, from)
            .into_iter()
            .map(|i| {
                // Each reason once, with the clock readings that give it.
                let mut why: Vec<(String, Vec<u64>)> = Vec::new();
                for reading in self.readings(i) {
                    let mut st = state.clone();
                    let r = st.step(self.s, self.n, self.evs[i], reading, self.lenient[i]);
                    let msg = r.map_or_else(
                        |e| e.to_string().trim_start_matches("Case failed: ").to_owned(),
                        |()| "fits, but leaves no order for the rest".to_owned(),
                    );
                    match why.iter_mut().find(|(m, _)| *m == msg) {
                        Some((_, at)) => at.push(reading.0 - T0),
                        None => why.push((msg, vec![reading.0 - T0])),
                    }
                }
                let why = why
                    .into_iter()
                    .map(|(m, at)| format!("at +{at:?}: {m}"))
                    .collect::<Vec<_>>()
                    .join("\n      ");
                (i, why)
            })
            .collect();
        Found::Violation { order, state, next }
    }

    /// Cuts a failing target down: the shortest failing prefix (by
    /// invocation) with the calls overlapping its last one, then without
    /// the observations and evictions the failure does not need (in
    /// halving chunks). Returns the positions kept.
    fn shrink<M: Stepped>(&self, until: std::time::Instant) -> Vec<usize> {
        let fails = |only: &[usize]| {
            std::time::Instant::now() < until
                && matches!(
                    self.search::<M>(only, SHRINK_BUDGET),
                    Found::Violation { .. }
                )
        };
        let n = self.evs.len();
        let (mut lo, mut hi) = (1, n);
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            if fails(&(0..mid).collect::<Vec<_>>()) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let mut kept: Vec<usize> = (0..hi).collect();
        if !fails(&kept) {
            return (0..n).collect();
        }
        if let Some(&last) = kept.last() {
            // With the calls that overlap the one that broke it (invoked
            // after it, so not in the prefix), the story is whole.
            let with: Vec<usize> = (0..n)
                .filter(|&i| i < hi || self.evs[i].span.inv < self.evs[last].span.resp)
                .collect();
            if fails(&with) {
                kept = with;
            }
        }
        let mut chunk = kept.len().div_ceil(2);
        while chunk > 0 {
            let drops: Vec<usize> = kept
                .iter()
                .copied()
                .filter(|&i| droppable(self.evs[i]))
                .collect();
            for part in drops.chunks(chunk) {
                let fewer: Vec<usize> =
                    kept.iter().copied().filter(|i| !part.contains(i)).collect();
                if fewer.len() < kept.len() && fails(&fewer) {
                    kept = fewer;
                }
            }
            chunk /= 2;
        }
        kept
    }

    fn name(&self) -> String {
        match self.evs.first().map(|e| e.target) {
            Some(Target::Entity(e)) => format!("entity {} (#{e})", entity(e)),
            _ => format!("key {} (#{})", key_name(self.n), self.n),
        }
    }

    /// Checks the target; the readable failure if it is not linearizable.
    fn check<M: Stepped>(&self, until: std::time::Instant) -> Result<(), String> {
        let all: Vec<usize> = (0..self.evs.len()).collect();
        match self.search::<M>(&all, BUDGET) {
            Found::Linearizable => Ok(()),
            Found::Budget => Err(format!(
                "{}: the search gave up after {BUDGET} states over {} calls (no verdict)",
                self.name(),
                self.evs.len()
            )),
            Found::Violation { .. } => {
                let mut kept = self.shrink::<M>(until);
                let mut found = self.search::<M>(&kept, BUDGET);
                if !matches!(found, Found::Violation { .. }) {
                    kept = all;
                    found = self.search::<M>(&kept, BUDGET);
                }
                let Found::Violation { order, state, next } = found else {
                    unreachable!("the whole history failed")
                };
                Err(self.report(&kept, &order, &state, &next))
            }
        }
    }

    fn report<M: Stepped>(
        &self,
        kept: &[usize],
        order: &[usize],
        state: &M,
        next: &[(usize, String)],
    ) -> String {
        let mut out = format!(
            "{}: no order of these {} calls that real time allows is one the model accepts \
             (of its {} calls; observations and evictions the failure does not need are left \
             out; times in ms after the start, [invocation..response] in the global order):\n",
            self.name(),
            kept.len(),
            self.evs.len()
        );
        if kept.len() > SHOWN {
            let _ = writeln!(
                out,
                "  ... ({} earlier calls not shown)",
                kept.len() - SHOWN
            );
        }
        for &i in &kept[kept.len().saturating_sub(SHOWN)..] {
            let _ = writeln!(out, "  {}", show(self.evs[i]));
        }
        let _ = writeln!(
            out,
            "The model accepts at most {} of them, in this order: {}",
            order.len(),
            order
                .iter()
                .map(|&i| format!("#{}", self.evs[i].id))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let _ = writeln!(out, "which leaves the key {}", state.describe());
        let _ = writeln!(out, "and no call that may come next fits:");
        for (i, why) in next {
            let _ = writeln!(out, "  #{}: {why}", self.evs[*i].id);
        }
        out
    }
}

/// A call whose removal can only drop a constraint (an observation, a
/// refusal) or an eviction.
fn droppable(ev: &Event) -> bool {
    ev.call.reads()
        || matches!(ev.call, Call::Evict | Call::CloseBuckets)
        || matches!(
            ev.answer,
            Answer::Begun(
                Begun::InProgress(_)
                    | Begun::Completed(_)
                    | Begun::DeadLettered(_)
                    | Begun::Refused(_)
            ) | Answer::Unit(Err(_))
                | Answer::Renewed(Err(_))
                | Answer::Forget(Forget::NotFound | Forget::InProgress(_))
                | Answer::Bool(false)
                | Answer::Sequenced(Sequenced::Duplicate)
                | Answer::Acked(0)
        )
}

/// One call, on one line.
pub(crate) fn show(e: &Event) -> String {
    let s = &e.span;
    format!(
        "#{:<5} {:<6} [{:>6}..{:>6}] t {:>6}..{:<6} {}: {} → {}",
        e.id,
        e.thread,
        s.inv,
        s.resp,
        s.t_inv.saturating_sub(T0),
        s.t_resp.saturating_sub(T0),
        e.name,
        show_call(&e.call),
        show_answer(&e.answer)
    )
}

fn show_call(c: &Call) -> String {
    match c {
        Call::Begin(r) => format!(
            "begin fp {:x} lease {} retention {}{}",
            r.fp.0 & 0xffff,
            r.lease_ms,
            r.retention_ms,
            if r.intent.is_some() {
                " with intent"
            } else {
                ""
            }
        ),
        Call::Finish { token, end, .. } => match end {
            End::Complete(o) => format!("complete token {token} {:?}", String::from_utf8_lossy(o)),
            End::Permanent(_) => format!("fail Permanent token {token}"),
            End::Retryable => format!("fail Retryable token {token}"),
            End::AnyRequest => format!("fail RetryableAnyRequest token {token}"),
            End::Exhausted { reason, .. } => format!("fail Exhausted({reason:?}) token {token}"),
        },
        Call::Renew { token, by } => format!("renew token {token} by {by:?}"),
        Call::Drop { token } => format!("drop claim token {token}"),
        Call::MarkSent { token, .. } => format!("mark_sent token {token}"),
        Call::Leave(l) => format!("{l:?}"),
        other => format!("{other:?}"),
    }
}

fn show_record(r: &dedupkv::Record) -> String {
    let mut d = format!(
        "{:?} attempt {} token {} updated +{} expires +{}",
        r.state(),
        r.attempts(),
        r.token(),
        rel(r.updated_at()),
        rel(r.expires_at())
    );
    if let Some(l) = r.lease_expires_at() {
        let _ = write!(d, " lease until +{}", rel(l));
    }
    if let Some(o) = r.outcome() {
        let _ = write!(d, " outcome {:?}", String::from_utf8_lossy(o));
    }
    d
}

fn show_answer(a: &Answer) -> String {
    match a {
        Answer::Begun(Begun::Started(c)) => format!(
            "Started attempt {} token {} lease until +{}{}",
            c.attempt,
            c.token,
            rel(c.lease_until),
            if c.interrupted { " interrupted" } else { "" }
        ),
        Answer::Begun(Begun::Completed(r)) => format!("Completed({})", show_record(r)),
        Answer::Begun(Begun::InProgress(i)) => format!(
            "InProgress(attempt {} lease until +{})",
            i.attempt(),
            rel(i.lease_expires_at())
        ),
        Answer::Begun(Begun::DeadLettered(d)) => {
            format!("DeadLettered({})", show_record(d.record()))
        }
        Answer::Begun(Begun::Refused(r)) | Answer::Refused(r) => format!("Err({r:?})"),
        Answer::Record(Some(r)) | Answer::Stranded(Some(r)) => show_record(r),
        Answer::DeadLetter(Some(d)) => show_record(d.record()),
        Answer::Forget(Forget::Forgotten(r)) => format!("Forgotten({})", show_record(r)),
        Answer::Renewed(Ok(t)) => format!("Ok(until +{})", rel(*t)),
        Answer::Record(None)
        | Answer::Stranded(None)
        | Answer::DeadLetter(None)
        | Answer::PendingIntent(None) => "not there".to_owned(),
        other => format!("{other:?}"),
    }
}

/// What checking a history found.
pub(crate) struct Checked {
    pub(crate) targets: usize,
}

/// Checks every key and entity of `events`, and what spans keys: a token
/// handed out after another returned is larger; one provider key per
/// (key, first attempt, fingerprint), and no two share one.
pub(crate) fn check(events: &[Event], s: &Settings, times: &[u64]) -> Result<Checked, String> {
    let all: Vec<&Event> = events.iter().collect();
    let mut by_target: HashMap<Target, Vec<&Event>> = HashMap::new();
    for e in &all {
        by_target.entry(e.target).or_default().push(e);
    }
    let mut targets: Vec<Target> = by_target.keys().copied().collect();
    targets.sort();
    let mut failures = Vec::new();
    let until = std::time::Instant::now() + SHRINK_TIME;
    for t in &targets {
        let evs = by_target[t].clone();
        let r = match *t {
            Target::Key(k) => Target1::new(s, k, evs, times).check::<KeyState>(until),
            Target::Entity(e) => Target1::new(s, e, evs, times).check::<EntityState>(until),
        };
        if let Err(msg) = r {
            failures.push(msg);
        }
    }
    if let Err(msg) = tokens_grow(&all) {
        failures.push(msg);
    }
    if let Err(msg) = provider_keys(&all) {
        failures.push(msg);
    }
    if failures.is_empty() {
        Ok(Checked {
            targets: targets.len(),
        })
    } else {
        Err(failures.join("\n"))
    }
}

/// A `Started` token is above every token handed out before it was
/// invoked.
fn tokens_grow(all: &[&Event]) -> Result<(), String> {
    let mut started: Vec<(&Event, u64)> = all
        .iter()
        .filter_map(|e| match &e.answer {
            Answer::Begun(Begun::Started(c)) => Some((*e, c.token)),
            _ => None,
        })
        .collect();
    let mut by_resp = started.clone();
    by_resp.sort_by_key(|(e, _)| e.span.resp);
    started.sort_by_key(|(e, _)| e.span.inv);
    let (mut j, mut max): (usize, Option<(&Event, u64)>) = (0, None);
    for (e, token) in &started {
        while j < by_resp.len() && by_resp[j].0.span.resp < e.span.inv {
            if max.is_none_or(|(_, t)| by_resp[j].1 > t) {
                max = Some(by_resp[j]);
            }
            j += 1;
        }
        if let Some((before, t)) = max
            && t >= *token
        {
            return Err(format!(
                "token {token} of\n  {}\nis not above token {t} handed out before it:\n  {}",
                show(e),
                show(before)
            ));
        }
    }
    Ok(())
}

/// One provider key per operation and request, and no two share one.
fn provider_keys(all: &[&Event]) -> Result<(), String> {
    let mut by_op: HashMap<(Target, i128, u128), (String, usize)> = HashMap::new();
    let mut by_pk: HashMap<String, ((Target, i128, u128), usize)> = HashMap::new();
    let mut note = |e: &Event, (first, fp): (i128, u128), pk: String| -> Result<(), String> {
        let op = (e.target, first, fp);
        if let Some((known, id)) = by_op.get(&op)
            && *known != pk
        {
            return Err(format!(
                "two provider keys for one operation (first attempt +{first}): #{id} and\n  {}",
                show(e)
            ));
        }
        if let Some((other, id)) = by_pk.get(&pk)
            && *other != op
        {
            return Err(format!(
                "two operations share provider key {pk}: #{id} and\n  {}",
                show(e)
            ));
        }
        by_op.insert(op, (pk.clone(), e.id));
        by_pk.insert(pk, (op, e.id));
        Ok(())
    };
    for e in all {
        let fp = match &e.call {
            Call::Begin(r) => r.fp.0,
            _ => 0,
        };
        match &e.answer {
            Answer::Begun(Begun::Started(c)) => {
                note(e, (rel(c.first_seen), fp), c.provider_key.clone())?;
            }
            Answer::Begun(Begun::Completed(r))
            | Answer::Record(Some(r))
            | Answer::Stranded(Some(r))
            | Answer::Forget(Forget::Forgotten(r)) => {
                if let (Some(pk), Some(f)) = (r.provider_key(), r.fingerprint()) {
                    note(e, (rel(r.first_seen_at()), f.0), pk)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}
