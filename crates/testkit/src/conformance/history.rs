//! The contract's concurrent history check: many threads make the
//! contract's calls at once on a few keys, every call is recorded with
//! its invocation and response in one global order, and each key's calls
//! must then have an order, consistent with real time, in which the
//! specification ([`Spec`]) gives every answer the backend gave (the way
//! Jepsen's Knossos and Porcupine check recorded histories).
//!
//! The threads work in rounds: between rounds, with no call in flight,
//! the driver moves the manual clock (often by a whole lease or more), so
//! every call of a round reads one time, and a round after a lease
//! lapsed races takeovers against the zombie's `complete`, `fail` and
//! `renew`. Claims are kept across rounds; the calls are `insert`, `get`,
//! `begin` (one key or a batch), `complete` (one claim or a batch),
//! `fail` (permanently or for a retry), `renew`, `forget`, and dropping
//! an unfinished claim.
//!
//! What is compared is what the sequential suite compares (plain views:
//! which variant, attempt, interruption, state, outcome, lease end, which
//! error), so any backend of the contract can be checked, not only the
//! engine (whose deeper checker, `history.rs`, also checks its tokens,
//! times, eviction and listings).

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use dedupkv::contract::{Outcome, Read, Settle, Write};
use dedupkv::{Began, BeginOptions, Clock, Failure, Fingerprint, Forget, Key, ManualClock, Record};

use super::spec::{Detached, Spec};
use super::{BeginView, LEASE_MS, RecordView, Rng, begin_view, forget_view, record_view, view};
use crate::model::T0;

/// How much concurrent history to make.
///
/// # Examples
/// ```
/// use dedupkv_testkit::conformance::History;
///
/// let h = History { rounds: 5, ..History::seed(3) };
/// assert_eq!(h.workers, 8);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct History {
    /// Chooses every call and clock step (not the interleaving, which is
    /// the machine's).
    pub seed: u64,
    /// Threads making calls at once. Default: 8.
    pub workers: usize,
    /// Rounds; the clock moves between them. Default: 40.
    pub rounds: usize,
    /// Calls per worker per round. Default: 3.
    pub calls: usize,
    /// Keys the calls are on. Default: 3.
    pub keys: usize,
}

impl History {
    /// The default history of `seed`.
    ///
    /// # Examples
    /// See [`History`].
    #[must_use]
    pub fn seed(seed: u64) -> History {
        History {
            seed,
            workers: 8,
            rounds: 40,
            calls: 3,
            keys: 3,
        }
    }
}

/// What a history that passed held.
///
/// # Examples
/// ```
/// use dedupkv::Store;
/// use dedupkv_testkit::conformance::{self, History};
///
/// let done = conformance::history(|clock| {
///     let dir = dedupkv_testkit::tempdir();
///     let store = Store::builder().clock(clock).open(dir.path().join("s.redb"))?;
///     Ok((store, dir))
/// }, History { workers: 4, rounds: 6, ..History::seed(1) })?;
/// assert!(done.calls > 0);
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Checked {
    /// Calls recorded (an item of a batch counts as one).
    pub calls: usize,
    /// `begin`s told `Started` on an interrupted attempt: a lapsed or
    /// dropped claim taken over.
    pub takeovers: usize,
    /// `complete`, `fail` or `renew` of a claim no longer the key's,
    /// refused with `ClaimLost`.
    pub refused: usize,
}

/// A recorded call of one key.
#[derive(Clone, Debug)]
enum Call {
    Insert,
    Get,
    Begin(Fingerprint),
    Complete {
        claim: u64,
        outcome: Vec<u8>,
    },
    Fail {
        claim: u64,
        permanent: Option<Vec<u8>>,
    },
    Renew {
        claim: u64,
        by: Option<Duration>,
    },
    Drop {
        claim: u64,
    },
    Forget,
}

/// An answer as compared.
#[derive(Clone, Debug, PartialEq, Eq)]
enum View {
    Bool(bool),
    Record(Option<RecordView>),
    Begin(BeginView),
    Unit,
    Renewed(SystemTime),
    Forget(String),
    Nothing,
}

#[derive(Clone, Debug)]
struct Event {
    worker: usize,
    round: usize,
    key: usize,
    inv: u64,
    resp: u64,
    call: Call,
    got: Result<View, String>,
    /// The claim a `Started` answer handed out.
    claim: Option<u64>,
}

fn hkey(seed: u64, k: usize) -> Key<'static> {
    Key::owned(b"hist".to_vec(), format!("s{seed}-k{k}").into_bytes())
}

/// Runs `h` on a backend `open` makes (as [`run`](super::run)'s: fresh,
/// empty, its time the given clock's) and checks its history.
///
/// # Errors
/// A key whose calls no order explains, with its round's calls and what
/// the specification held before them; a call whose error the
/// specification never gives shows as that key's failure too.
///
/// # Examples
/// See [`Checked`].
pub fn history<B, G>(
    open: impl FnOnce(ManualClock) -> dedupkv::Result<(B, G)>,
    h: History,
) -> Result<Checked, String>
where
    B: Write + Sync,
    B::Claim: Send,
{
    let clock = ManualClock::new(T0);
    let (backend, _keep) = open(clock.clone()).map_err(|e| format!("open failed: {e}"))?;
    let seq = AtomicU64::new(0);
    let barrier = Barrier::new(h.workers + 1);
    let mut rng = Rng::new(h.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut times = Vec::with_capacity(h.rounds);
    let events: Vec<Event> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..h.workers)
            .map(|w| {
                let (backend, seq, barrier) = (&backend, &seq, &barrier);
                s.spawn(move || {
                    let mut worker = Worker {
                        backend,
                        seq,
                        h,
                        w,
                        rng: Rng::new(h.seed ^ (w as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9)),
                        held: Vec::new(),
                        events: Vec::new(),
                        next_claim: 0,
                    };
                    for round in 0..h.rounds {
                        barrier.wait();
                        for _ in 0..h.calls {
                            worker.one(round);
                        }
                        barrier.wait();
                    }
                    // Unfinished claims are dropped when `worker` is.
                    worker.events
                })
            })
            .collect();
        for _ in 0..h.rounds {
            // Lease ends are met exactly as often as passed.
            let step = [0, 1_000, LEASE_MS - 1, LEASE_MS, 2 * LEASE_MS][rng.pick(&[3, 3, 1, 2, 1])];
            clock.advance(Duration::from_millis(step));
            times.push(clock.now_millis());
            barrier.wait();
            barrier.wait();
        }
        workers
            .into_iter()
            .flat_map(|t| t.join().unwrap_or_default())
            .collect()
    });
    let want = h.workers * h.rounds * h.calls;
    if events.len() < want {
        return Err(format!(
            "{} calls recorded of at least {want}: a worker panicked",
            events.len()
        ));
    }
    check(&events, &times, h)
}

/// [`history`] of each seed (`History::seed`), each on a fresh backend;
/// the counts summed. Fails unless the runs together took a lapsed claim
/// over and refused a zombie: a run that never made them did not check
/// them.
///
/// # Errors
/// The first failing seed's report; or no takeover or no refusal.
///
/// # Examples
/// ```
/// use dedupkv_testkit::conformance::{self, Spec};
///
/// let done = conformance::histories(|clock| Ok((Spec::new(clock), ())), &[1, 2])?;
/// assert!(done.takeovers > 0 && done.refused > 0);
/// # Ok::<(), String>(())
/// ```
pub fn histories<B, G>(
    mut open: impl FnMut(ManualClock) -> dedupkv::Result<(B, G)>,
    seeds: &[u64],
) -> Result<Checked, String>
where
    B: Write + Sync,
    B::Claim: Send,
{
    let mut all = Checked {
        calls: 0,
        takeovers: 0,
        refused: 0,
    };
    for &seed in seeds {
        let done =
            history(&mut open, History::seed(seed)).map_err(|e| format!("seed {seed}: {e}"))?;
        all.calls += done.calls;
        all.takeovers += done.takeovers;
        all.refused += done.refused;
    }
    if all.takeovers == 0 || all.refused == 0 {
        return Err(format!(
            "seeds {seeds:?}: {} takeovers and {} refused zombies; the runs checked neither",
            all.takeovers, all.refused
        ));
    }
    Ok(all)
}

/// One worker thread: its choices, the claims it holds, its record.
struct Worker<'a, B: Write> {
    backend: &'a B,
    seq: &'a AtomicU64,
    h: History,
    w: usize,
    rng: Rng,
    held: Vec<(u64, usize, B::Claim)>,
    events: Vec<Event>,
    next_claim: u64,
}

impl<B: Write> Worker<'_, B> {
    fn key(&mut self) -> usize {
        self.rng.below(self.h.keys)
    }

    /// Runs `f` between two ticks of the global order.
    fn timed<T>(&self, f: impl FnOnce() -> T) -> (T, u64, u64) {
        let inv = self.seq.fetch_add(1, Ordering::SeqCst);
        let got = f();
        let resp = self.seq.fetch_add(1, Ordering::SeqCst);
        (got, inv, resp)
    }

    fn push(
        &mut self,
        (round, key, inv, resp): (usize, usize, u64, u64),
        call: Call,
        got: Result<View, String>,
    ) {
        self.events.push(Event {
            worker: self.w,
            round,
            key,
            inv,
            resp,
            call,
            got,
            claim: None,
        });
    }

    /// Records a `begin`'s answer, keeping a `Started` claim.
    fn began(
        &mut self,
        at: (usize, usize, u64, u64),
        fp: Fingerprint,
        got: dedupkv::Result<Began<B::Claim>>,
    ) {
        self.push(
            at,
            Call::Begin(fp),
            view(&got, |b| View::Begin(begin_view(b))),
        );
        if let Ok(Began::Started(c)) = got {
            let id = (self.w as u64) << 32 | self.next_claim;
            self.next_claim += 1;
            if let Some(e) = self.events.last_mut() {
                e.claim = Some(id);
            }
            self.held.push((id, at.1, c));
        }
    }

    fn one(&mut self, round: usize) {
        let mut act = self.rng.pick(&[5, 1, 3, 1, 2, 2, 1, 1, 1, 2]);
        if (2..=6).contains(&act) && self.held.is_empty() {
            act = 0;
        }
        if act <= 1 && self.held.len() >= 2 {
            act = 2;
        }
        if act == 1 && self.h.keys < 2 {
            act = 0;
        }
        let fp = if self.rng.below(8) == 0 {
            Fingerprint::of("params-2")
        } else {
            Fingerprint::NONE
        };
        match act {
            0 => self.begin(round, fp),
            1 => self.begin_batch(round, fp),
            2 | 3 => self.finish(round, act == 2),
            4 => self.renew(round),
            5 => {
                let i = self.rng.below(self.held.len());
                let (id, k, claim) = self.held.swap_remove(i);
                let ((), inv, resp) = self.timed(|| drop(claim));
                let call = Call::Drop { claim: id };
                self.push((round, k, inv, resp), call, Ok(View::Nothing));
            }
            6 => self.complete_batch(round),
            _ => self.key_call(round, act),
        }
    }

    fn begin(&mut self, round: usize, fp: Fingerprint) {
        let (b, k) = (self.backend, self.key());
        let (got, inv, resp) = self.timed(|| {
            b.begin(&hkey(self.h.seed, k), fp, &BeginOptions::new(), None)
                .and_then(|p| b.tell(p))
        });
        self.began((round, k, inv, resp), fp, got);
    }

    /// `begin_batch` of two different keys, so each item's answer is its
    /// key's.
    fn begin_batch(&mut self, round: usize, fp: Fingerprint) {
        let b = self.backend;
        let k1 = self.key();
        let k2 = (k1 + 1 + self.rng.below(self.h.keys - 1)) % self.h.keys;
        let items = [(hkey(self.h.seed, k1), fp), (hkey(self.h.seed, k2), fp)];
        let (got, inv, resp) = self.timed(|| b.begin_batch(&items).and_then(|p| b.tell(p)));
        match got {
            Ok(all) => {
                for (k, got) in [k1, k2].into_iter().zip(all) {
                    self.began((round, k, inv, resp), fp, got);
                }
            }
            Err(e) => {
                for k in [k1, k2] {
                    self.push((round, k, inv, resp), Call::Begin(fp), Err(e.to_string()));
                }
            }
        }
    }

    /// Completes a held claim, or fails it (permanently or for a retry).
    fn finish(&mut self, round: usize, complete: bool) {
        let b = self.backend;
        let i = self.rng.below(self.held.len());
        let (id, k, claim) = self.held.swap_remove(i);
        let outcome = format!("w{}-{id:x}-{round}", self.w).into_bytes();
        let permanent = (!complete && self.rng.below(2) == 0).then(|| outcome.clone());
        let (got, inv, resp) = self.timed(|| {
            let p = match (complete, &permanent) {
                (true, _) => b.complete(&claim, Outcome::raw(&outcome)),
                (_, Some(p)) => b.fail(&claim, Failure::Permanent(p)),
                _ => b.fail(&claim, Failure::Retryable),
            };
            p.and_then(|p| b.tell(p))
        });
        let call = if complete {
            Call::Complete { claim: id, outcome }
        } else {
            Call::Fail {
                claim: id,
                permanent,
            }
        };
        self.push((round, k, inv, resp), call, view(&got, |()| View::Unit));
    }

    fn renew(&mut self, round: usize) {
        let b = self.backend;
        let i = self.rng.below(self.held.len());
        let by = [None, Some(Duration::from_secs(45))][self.rng.below(2)];
        let (id, k) = (self.held[i].0, self.held[i].1);
        let claim = &self.held[i].2;
        let (got, inv, resp) = self.timed(|| b.renew(claim, by).and_then(|p| b.tell(p)));
        let got = view(&got, |t| View::Renewed(*t));
        self.push((round, k, inv, resp), Call::Renew { claim: id, by }, got);
    }

    /// Both claims of this worker in one `complete_batch` (or the one).
    fn complete_batch(&mut self, round: usize) {
        let b = self.backend;
        let n = self.held.len().min(2);
        let picked: Vec<_> = self.held.drain(..n).collect();
        let outcomes: Vec<Vec<u8>> = picked
            .iter()
            .map(|(id, _, _)| format!("b{}-{id:x}-{round}", self.w).into_bytes())
            .collect();
        let items: Vec<_> = picked
            .iter()
            .zip(&outcomes)
            .map(|((_, _, c), o)| (c, &o[..]))
            .collect();
        let (got, inv, resp) = self.timed(|| b.complete_batch(&items).and_then(|p| b.tell(p)));
        drop(items);
        for (i, ((id, k, _), outcome)) in picked.iter().zip(outcomes).enumerate() {
            let one = match &got {
                Ok(all) => all.get(i).map_or_else(
                    || Err("no answer for the item".to_owned()),
                    |r| view(r, |()| View::Unit),
                ),
                Err(e) => Err(e.to_string()),
            };
            let call = Call::Complete {
                claim: *id,
                outcome,
            };
            self.push((round, *k, inv, resp), call, one);
        }
    }

    /// `forget` (act 7), `insert` (8) or `get` of a key.
    fn key_call(&mut self, round: usize, act: usize) {
        let (b, k) = (self.backend, self.key());
        let key = hkey(self.h.seed, k);
        let ((call, got), inv, resp) = self.timed(|| match act {
            7 => (
                Call::Forget,
                view(&b.forget(&key).and_then(|p| b.tell(p)), |f| {
                    View::Forget(forget_view(f))
                }),
            ),
            8 => (
                Call::Insert,
                view(&b.insert(&key, None).and_then(|p| b.tell(p)), |n| {
                    View::Bool(*n)
                }),
            ),
            _ => (
                Call::Get,
                view(
                    &b.get(&key).and_then(|p| b.tell(p)),
                    |r: &Option<Record>| View::Record(r.as_ref().map(record_view)),
                ),
            ),
        });
        self.push((round, k, inv, resp), call, got);
    }
}

/// The specification at one point of an order: its records and the
/// claims the history's `Started` answers stand for.
struct Model {
    spec: Spec,
    claims: BTreeMap<u64, Detached>,
}

impl Clone for Model {
    fn clone(&self) -> Model {
        Model {
            spec: self.spec.fork(),
            claims: self.claims.clone(),
        }
    }
}

impl Model {
    fn digest(&self) -> String {
        format!(
            "{} {:?}",
            self.spec.digest(),
            self.claims.keys().collect::<Vec<_>>()
        )
    }

    /// Replays `e` on the specification: whether it answers as the
    /// backend did.
    fn apply(&mut self, e: &Event, key: &Key<'static>) -> bool {
        let s = &self.spec;
        let claim = |id: &u64| self.claims.get(id).map(Detached::claim);
        let got = match &e.call {
            Call::Insert => view(&s.insert(key, None).and_then(|p| s.tell(p)), |n| {
                View::Bool(*n)
            }),
            Call::Get => {
                let v = |r: &Option<Record>| View::Record(r.as_ref().map(record_view));
                view(&s.get(key).and_then(|p| s.tell(p)), v)
            }
            Call::Forget => view(&s.forget(key).and_then(|p| s.tell(p)), |f: &Forget| {
                View::Forget(forget_view(f))
            }),
            Call::Begin(fp) => {
                let r = s
                    .begin(key, *fp, &BeginOptions::new(), None)
                    .and_then(|p| s.tell(p));
                let got = view(&r, |b| View::Begin(begin_view(b)));
                if got != e.got {
                    return false;
                }
                if let Ok(Began::Started(c)) = r {
                    let Some(id) = e.claim else { return false };
                    self.claims.insert(id, c.detach());
                }
                return true;
            }
            Call::Complete { claim: id, outcome } => {
                let Some(c) = claim(id) else { return false };
                view(
                    &s.complete(&c, Outcome::raw(outcome))
                        .and_then(|p| s.tell(p)),
                    |()| View::Unit,
                )
            }
            Call::Fail {
                claim: id,
                permanent,
            } => {
                let Some(c) = claim(id) else { return false };
                let f = permanent
                    .as_deref()
                    .map_or(Failure::Retryable, Failure::Permanent);
                view(&s.fail(&c, f).and_then(|p| s.tell(p)), |()| View::Unit)
            }
            Call::Renew { claim: id, by } => {
                let Some(c) = claim(id) else { return false };
                view(&s.renew(&c, *by).and_then(|p| s.tell(p)), |t| {
                    View::Renewed(*t)
                })
            }
            Call::Drop { claim: id } => {
                if let Some(c) = self.claims.get(id) {
                    self.spec.release(c);
                }
                Ok(View::Nothing)
            }
        };
        got == e.got
    }
}

/// Distinct states a key may be in at a round's end; more are not kept.
const STATES: usize = 64;
/// Orders tried per key and round before the check gives up on it.
const BUDGET: usize = 200_000;

fn check(events: &[Event], times: &[u64], h: History) -> Result<Checked, String> {
    for k in 0..h.keys {
        let key = hkey(h.seed, k);
        let mut states = vec![Model {
            spec: Spec::new(ManualClock::new(T0)),
            claims: BTreeMap::new(),
        }];
        for (round, &now) in times.iter().enumerate() {
            let mut evs: Vec<&Event> = events
                .iter()
                .filter(|e| e.key == k && e.round == round)
                .collect();
            if evs.is_empty() {
                continue;
            }
            if evs.len() > 64 {
                return Err(format!(
                    "key {key:?}, round {round}: {} calls, more than the check takes",
                    evs.len()
                ));
            }
            evs.sort_by_key(|e| e.inv);
            let mut search = Search {
                evs: &evs,
                key: &key,
                out: Vec::new(),
                seen: HashSet::new(),
                visited: HashSet::new(),
                budget: BUDGET,
            };
            for st in &states {
                let at_round = Model {
                    spec: st.spec.fork_at(now),
                    claims: st.claims.clone(),
                };
                search.dfs(&at_round, 0);
            }
            if search.out.is_empty() {
                return Err(report(&key, round, now, &evs, &states, search.budget == 0));
            }
            states = search.out;
        }
    }
    let takeovers = events
        .iter()
        .filter(|e| {
            matches!(
                e.got,
                Ok(View::Begin(BeginView::Started {
                    interrupted: true,
                    ..
                }))
            )
        })
        .count();
    let refused = events
        .iter()
        .filter(|e| {
            matches!(
                e.call,
                Call::Complete { .. } | Call::Fail { .. } | Call::Renew { .. }
            )
        })
        .filter(|e| matches!(&e.got, Err(m) if m == "ClaimLost"))
        .count();
    Ok(Checked {
        calls: events.len(),
        takeovers,
        refused,
    })
}

/// The search for orders of one key's calls in one round.
struct Search<'a> {
    evs: &'a [&'a Event],
    key: &'a Key<'static>,
    out: Vec<Model>,
    seen: HashSet<String>,
    visited: HashSet<(u64, String)>,
    budget: usize,
}

impl Search<'_> {
    fn dfs(&mut self, m: &Model, done: u64) {
        let full = if self.evs.len() == 64 {
            u64::MAX
        } else {
            (1 << self.evs.len()) - 1
        };
        if done == full {
            if self.out.len() < STATES && self.seen.insert(m.digest()) {
                self.out.push(m.clone());
            }
            return;
        }
        if self.budget == 0 || !self.visited.insert((done, m.digest())) {
            return;
        }
        self.budget -= 1;
        let pending = (0..self.evs.len()).filter(|i| done & (1 << i) == 0);
        // A call can come next only if no pending call returned before it began.
        let first_resp = pending
            .clone()
            .map(|i| self.evs[i].resp)
            .min()
            .unwrap_or(u64::MAX);
        for i in pending {
            if self.evs[i].inv > first_resp {
                continue;
            }
            let mut next = m.clone();
            if next.apply(self.evs[i], self.key) {
                self.dfs(&next, done | (1 << i));
            }
        }
    }
}

fn report(
    key: &Key<'_>,
    round: usize,
    now: u64,
    evs: &[&Event],
    states: &[Model],
    gave_up: bool,
) -> String {
    let mut out = format!(
        "key {key:?}, round {round} (clock T0 + {} ms): no order of its calls gives the backend's \
         answers{}\nthe specification before the round (one of {}): {}\ncalls (worker, invoked, returned, call, answer):\n",
        now - T0,
        if gave_up { " (the search gave up)" } else { "" },
        states.len(),
        states.first().map(Model::digest).unwrap_or_default(),
    );
    for e in evs {
        let _ = writeln!(
            out,
            "  w{} [{}..{}] {:?} -> {:?}{}",
            e.worker,
            e.inv,
            e.resp,
            e.call,
            e.got,
            e.claim
                .map(|c| format!(" (claim {c:x})"))
                .unwrap_or_default()
        );
    }
    out
}
