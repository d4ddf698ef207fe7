//! What the provider answered, and the duplicate candidates it leaves: a
//! run shaped like a real shipper's (503s, timeouts with the ack dropped,
//! workers killed before and after the call, leases that lapse under a
//! stalled worker, lookups that fail) against a simulated carrier.
//!
//! With a carrier that deduplicates on the idempotency key and workers
//! that ask it first whenever the store says to, nothing is a candidate —
//! the carrier shows no duplicate either. With a carrier that does not
//! deduplicate and some workers that call again without asking, every
//! order the carrier shipped twice is listed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use dedupkv::{
    Answer, Begin, BeginOptions, Claim, Duplicate, Error, Failure, Fingerprint, Intent, Key,
    Listing, ManualClock, Result, Store, StoreBuilder,
};
use dedupkv_testkit::{T0, started, tempdir};

const LEASE: Duration = Duration::from_secs(30);
const ORDERS: usize = 300;

fn builder(clock: &ManualClock) -> StoreBuilder {
    dedupkv_testkit::builder(clock)
        .lease(LEASE)
        .retention(Duration::from_secs(24 * 3600))
}

/// A small deterministic generator (xorshift64*), so a run is the same on
/// every machine.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    /// True `pct` times in a hundred.
    fn pct(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// The carrier: labels by idempotency key, every shipment it made.
struct Carrier {
    dedups: bool,
    labels: BTreeMap<String, String>,
    shipments: BTreeMap<String, Vec<String>>,
    made: u32,
}

impl Carrier {
    fn new(dedups: bool) -> Self {
        Carrier {
            dedups,
            labels: BTreeMap::new(),
            shipments: BTreeMap::new(),
            made: 0,
        }
    }

    /// Ships (or, deduplicating, finds the shipment of) `key`.
    fn ship(&mut self, key: &str) -> String {
        if self.dedups
            && let Some(label) = self.labels.get(key)
        {
            return label.clone();
        }
        self.made += 1;
        let label = format!("1Z{:05}", self.made);
        self.labels.entry(key.to_owned()).or_insert(label.clone());
        self.shipments
            .entry(key.to_owned())
            .or_default()
            .push(label.clone());
        label
    }

    /// What it has under `key` (its first shipment).
    fn lookup(&self, key: &str) -> Option<String> {
        self.labels.get(key).cloned()
    }

    /// Orders it shipped more than once.
    fn duplicates(&self) -> BTreeSet<String> {
        self.shipments
            .iter()
            .filter(|(_, s)| s.len() > 1)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// One worker's attempt, as the fault plan has it go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Ok,
    /// 503 before the carrier does anything.
    Unavailable,
    /// The carrier ships; the ack is lost (a timeout).
    AckDropped,
    /// The worker is killed after the claim, before the call.
    KilledBefore,
    /// The worker is killed after the carrier shipped, before the answer.
    KilledAfter,
    /// The worker stalls past its lease after the call; another takes
    /// over, and the stalled one's answer comes too late.
    Stalled,
    /// The carrier ships and the answer is recorded; the worker is killed
    /// before it completes.
    KilledAfterAnswer,
}

struct Run {
    path: PathBuf,
    clock: ManualClock,
    store: Option<Store>,
    carrier: Carrier,
    rng: Rng,
    /// Percent of attempts that call again without asking first.
    naive: u64,
    done: BTreeMap<String, Vec<u8>>,
    /// How often each fate came, over every restart.
    seen: BTreeMap<String, u32>,
}

impl Run {
    fn new(dir: &Path, dedups: bool, naive: u64, seed: u64) -> Result<Self> {
        let clock = ManualClock::new(T0);
        let path = dir.join("s.redb");
        let store = builder(&clock).open(&path)?;
        Ok(Run {
            path,
            clock,
            store: Some(store),
            carrier: Carrier::new(dedups),
            rng: Rng(seed),
            naive,
            done: BTreeMap::new(),
            seen: BTreeMap::new(),
        })
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("open")
    }

    /// The process dies; a new one opens the store.
    fn restart(&mut self) -> Result<()> {
        self.store = None;
        self.store = Some(builder(&self.clock).open(&self.path)?);
        Ok(())
    }

    /// How the attempt goes. A naive worker (one that calls again
    /// without asking first) is never killed or stalled between its call
    /// and its answer: that leaves no trace a store could list (see
    /// `Store::duplicate_candidates`).
    fn fate(&mut self, naive: bool) -> Fate {
        let fate = match self.rng.below(100) {
            0..12 => Fate::Unavailable,
            12..20 => Fate::AckDropped,
            20..24 => Fate::KilledBefore,
            24..28 => Fate::KilledAfter,
            28..31 => Fate::Stalled,
            31..35 => Fate::KilledAfterAnswer,
            _ => Fate::Ok,
        };
        match fate {
            Fate::KilledAfter | Fate::Stalled if naive => Fate::Ok,
            other => other,
        }
    }

    fn begin(&self, key: &Key<'_>) -> Result<Begin> {
        let intent = Intent {
            target: "carrier",
            request: b"2 parcels to 12 Harbour Road",
        };
        self.store()
            .begin_with_intent(key, Fingerprint::of("order"), &BeginOptions::new(), intent)
    }

    /// Runs order `id` to completion, attempt after attempt.
    fn order(&mut self, id: &str) -> Result<()> {
        let key = Key::new("orders", id).into_owned();
        for _ in 0..200 {
            self.clock.advance(Duration::from_millis(50));
            let claim = match self.begin(&key)? {
                Begin::Started(c) => c,
                Begin::Completed(rec) => {
                    self.done
                        .insert(id.to_owned(), rec.outcome().unwrap_or_default().to_vec());
                    return Ok(());
                }
                Begin::InProgress(_) => {
                    self.clock.advance(LEASE);
                    continue;
                }
                other @ Begin::DeadLettered(_) => panic!("order {id}: {other:?}"),
            };
            self.attempt(claim)?;
        }
        panic!("order {id} never finished");
    }

    /// One attempt of a claim: ask first when told to (unless this worker
    /// is naive), call, record the answer, finish.
    fn attempt(&mut self, claim: Claim) -> Result<()> {
        let pk = claim.provider_key()?;
        let told = claim.interrupted() || claim.unanswered_intent();
        let naive = self.rng.pct(self.naive);
        if told && !naive {
            if self.rng.pct(10) {
                // The lookup itself timed out: nothing learned.
                *self.seen.entry("LookupFailed".into()).or_default() += 1;
                return self.store().fail(&claim, Failure::Retryable);
            }
            *self.seen.entry("Asked".into()).or_default() += 1;
            match self.carrier.lookup(&pk) {
                Some(label) => {
                    self.store()
                        .mark_answered(&claim, Answer::Found(label.as_bytes()))?;
                    return self.store().complete(&claim, label.as_bytes());
                }
                None => self.store().mark_answered(&claim, Answer::NotFound)?,
            }
        }
        let fate = self.fate(naive);
        *self.seen.entry(format!("{fate:?}")).or_default() += 1;
        match fate {
            Fate::Ok => {
                let label = self.carrier.ship(&pk);
                self.store()
                    .mark_answered(&claim, Answer::Accepted(label.as_bytes()))?;
                self.store().complete(&claim, label.as_bytes())
            }
            Fate::Unavailable => {
                self.store()
                    .mark_answered(&claim, Answer::Refused("503 Service Unavailable"))?;
                self.store().fail(&claim, Failure::Retryable)
            }
            Fate::AckDropped => {
                self.carrier.ship(&pk);
                self.store().mark_answered(&claim, Answer::Unknown)?;
                self.store().fail(&claim, Failure::Retryable)
            }
            Fate::KilledBefore => {
                std::mem::forget(claim);
                self.restart()
            }
            Fate::KilledAfter => {
                self.carrier.ship(&pk);
                std::mem::forget(claim);
                self.restart()
            }
            Fate::KilledAfterAnswer => {
                let label = self.carrier.ship(&pk);
                self.store()
                    .mark_answered(&claim, Answer::Accepted(label.as_bytes()))?;
                std::mem::forget(claim);
                self.restart()
            }
            Fate::Stalled => {
                let label = self.carrier.ship(&pk);
                self.clock.advance(LEASE + Duration::from_secs(1));
                // Another worker takes the order over meanwhile.
                let other = started(self.begin(claim.key())?);
                assert!(other.interrupted());
                self.attempt(other)?;
                let late = self
                    .store()
                    .mark_answered(&claim, Answer::Accepted(label.as_bytes()));
                assert!(matches!(late, Err(Error::ClaimLost { .. })), "{late:?}");
                Ok(())
            }
        }
    }

    fn finish(&mut self) -> Result<()> {
        for i in 0..ORDERS {
            self.order(&format!("order-{i:04}"))?;
        }
        Ok(())
    }

    fn candidates(&self) -> Result<BTreeMap<String, Duplicate>> {
        let page = self
            .store()
            .duplicate_candidates(&Listing::new().limit(10_000))?;
        Ok(page
            .items
            .iter()
            .map(|e| {
                let pk = e.provider_key();
                (pk, e.duplicate().expect("a candidate says why"))
            })
            .collect())
    }
}

/// The run went wrong in every way often enough to mean something.
fn check_shape(run: &Run) {
    for fate in [
        "Unavailable",
        "AckDropped",
        "KilledBefore",
        "KilledAfter",
        "Stalled",
        "KilledAfterAnswer",
        "LookupFailed",
        "Asked",
    ] {
        let n = run.seen.get(fate).copied().unwrap_or(0);
        assert!(n >= 3, "{fate} {n} times: {:?}", run.seen);
    }
}

#[test]
fn a_deduplicating_carrier_and_workers_that_ask_first_leave_no_candidate() -> Result<()> {
    let dir = tempdir();
    let mut run = Run::new(dir.path(), true, 0, 0x5eed_0001)?;
    run.finish()?;
    check_shape(&run);
    let store = run.store();
    assert_eq!(run.done.len(), ORDERS, "every order finished");
    assert!(
        run.carrier.duplicates().is_empty(),
        "the carrier deduplicated"
    );
    // Every order completed with the carrier's one label.
    for (id, outcome) in &run.done {
        let e = store.intent(&Key::new("orders", id))?;
        if let Some(e) = e {
            let label = run.carrier.lookup(&e.provider_key()).expect("shipped");
            assert_eq!(outcome, label.as_bytes(), "order {id}");
        }
    }
    let candidates = run.candidates()?;
    assert!(
        candidates.is_empty(),
        "{} candidates, for no duplicate: {candidates:?}",
        candidates.len()
    );
    assert!(
        store.pending_intents(&Listing::new())?.items.is_empty(),
        "nothing left ambiguous"
    );
    Ok(())
}

#[test]
fn every_order_a_carrier_shipped_twice_is_a_candidate() -> Result<()> {
    let dir = tempdir();
    // A carrier that does not deduplicate, and a third of the attempts
    // calling again without asking it first.
    let mut run = Run::new(dir.path(), false, 35, 0x5eed_0002)?;
    run.finish()?;
    check_shape(&run);
    let twice = run.carrier.duplicates();
    assert!(
        twice.len() >= 5,
        "the run must ship some orders twice to mean something: {}",
        twice.len()
    );
    let candidates = run.candidates()?;
    let missed: Vec<&String> = twice
        .iter()
        .filter(|k| !candidates.contains_key(*k))
        .collect();
    assert!(missed.is_empty(), "shipped twice, not listed: {missed:?}");
    // Both signs show: two labels the carrier gave, and a call after one
    // whose fate was unknown.
    for sign in [Duplicate::TwoReferences, Duplicate::AfterUnknown] {
        assert!(
            candidates.values().any(|d| *d == sign),
            "{sign:?}: {candidates:?}"
        );
    }
    eprintln!(
        "{} orders shipped twice, {} candidates: {:?}",
        twice.len(),
        candidates.len(),
        run.seen
    );
    Ok(())
}

/// One attempt of `RetryPolicy::call` for `key`, the carrier and the
/// lookup going as `fate` and `lookup_down` say (see the test below):
/// `true` once the order is settled.
fn call_once(
    (store, policy): (&Store, &dedupkv::RetryPolicy),
    carrier: &std::cell::RefCell<Carrier>,
    key: &Key<'_>,
    (fate, lookup_down): (u64, bool),
) -> Result<bool> {
    use dedupkv::{Effect, ErrorClass, Run as Ran};
    use std::panic::{AssertUnwindSafe, catch_unwind};

    let effect = Effect::new(
        Intent {
            target: "carrier",
            request: b"2 parcels",
        },
        |c: &Claim| -> std::result::Result<Option<Vec<u8>>, String> {
            if lookup_down {
                return Err("lookup timed out".into());
            }
            Ok(carrier
                .borrow()
                .lookup(&c.provider_key().map_err(|e| e.to_string())?)
                .map(String::into_bytes))
        },
        |c: &Claim| -> std::result::Result<Vec<u8>, String> {
            let pk = c.provider_key().map_err(|e| e.to_string())?;
            match fate {
                0..12 => Err("503 Service Unavailable".into()),
                12..20 => {
                    carrier.borrow_mut().ship(&pk);
                    Err("timeout".into())
                }
                20..24 => panic!("killed before the call"),
                24..28 => {
                    carrier.borrow_mut().ship(&pk);
                    panic!("killed after the carrier shipped")
                }
                _ => Ok(carrier.borrow_mut().ship(&pk).into_bytes()),
            }
        },
        |e: &String| {
            if e.starts_with("timeout") {
                ErrorClass::Unanswered
            } else {
                ErrorClass::Retryable
            }
        },
    );
    let run = catch_unwind(AssertUnwindSafe(|| {
        policy.call(store, key, Fingerprint::of("order"), effect)
    }));
    match run {
        Err(_) => Ok(false), // the worker died; its claim was dropped
        Ok(run) => match run? {
            Ran::Done(_) | Ran::Reconciled(_) | Ran::Replayed(_) => Ok(true),
            Ran::RetryAfter { .. } => Ok(false),
            other => panic!("{key}: {other:?}"),
        },
    }
}

/// The store's own runner (`RetryPolicy::call`), which asks first and
/// records every answer, on the same kind of run: a deduplicating carrier
/// that answers 503 now and then, drops acks, and workers that die before
/// and after the carrier ships (a panic inside the call: the claim is
/// dropped, the next attempt is interrupted), and lookups that time out.
#[test]
fn the_call_runner_on_a_deduplicating_carrier_leaves_no_candidate() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = builder(&clock).open(dir.path().join("s.redb"))?;
    let policy = dedupkv::RetryPolicy::builder()
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(1))
        .max_attempts(1_000)
        .seed(3)
        .clock(clock.clone())
        .build()?;
    let carrier = std::cell::RefCell::new(Carrier::new(true));
    let mut rng = Rng(0x5eed_0003);
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for i in 0..ORDERS {
        let id = format!("order-{i:04}");
        let key = Key::new("orders", &id);
        for _ in 0..1_000 {
            clock.advance(Duration::from_millis(50));
            let fate = rng.below(100);
            let lookup_down = rng.pct(10);
            let what = match fate {
                0..12 => "503",
                12..20 => "ack dropped",
                20..24 => "died before",
                24..28 => "died after",
                _ => "ok",
            };
            *seen.entry(what).or_default() += 1;
            if call_once((&store, &policy), &carrier, &key, (fate, lookup_down))? {
                break;
            }
        }
        assert!(
            matches!(
                store.begin(&key, Fingerprint::of("order"))?,
                Begin::Completed(_)
            ),
            "order {id} finished"
        );
    }
    for (what, n) in &seen {
        assert!(*n >= 5, "{what} {n} times: {seen:?}");
    }
    assert!(carrier.borrow().duplicates().is_empty());
    let candidates = store.duplicate_candidates(&Listing::new().limit(10_000))?;
    assert!(
        candidates.items.is_empty(),
        "{} candidates for no duplicate: {:?}",
        candidates.items.len(),
        candidates.items.first()
    );
    assert!(store.pending_intents(&Listing::new())?.items.is_empty());
    Ok(())
}

/// A candidate whose operation finishes while its calls are still
/// unanswered (two timeouts in a row, then the operation is completed by
/// hand) is no longer pending, but stays a candidate, durably.
#[test]
fn a_candidate_finished_unanswered_stays_listed_and_leaves_the_pending_list() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let key = Key::new("orders", "order-1");
    let intent = Intent {
        target: "carrier",
        request: b"2 parcels",
    };
    let begin =
        |s: &Store| s.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent);
    {
        let store = builder(&clock).open(&path)?;
        let c = started(begin(&store)?);
        store.mark_answered(&c, Answer::Unknown)?;
        store.fail(&c, Failure::Retryable)?;
        let c = started(begin(&store)?);
        assert!(c.unanswered_intent());
        store.mark_answered(&c, Answer::Unknown)?; // called again without asking
        let e = store.intent(&key)?.expect("recorded");
        assert_eq!(
            (e.duplicate(), e.answer(), e.is_sent()),
            (Some(Duplicate::AfterUnknown), Some(Answer::Unknown), false)
        );
        assert_eq!(store.pending_intents(&Listing::new())?.items.len(), 1);
        store.complete(&c, b"shipped by hand")?;
    }
    let store = builder(&clock).open(&path)?;
    assert!(store.pending_intents(&Listing::new())?.items.is_empty());
    let listed = store.duplicate_candidates(&Listing::new())?;
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].key(), &key);
    assert_eq!(listed.items[0].duplicate(), Some(Duplicate::AfterUnknown));
    Ok(())
}
