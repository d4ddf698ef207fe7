//! `RetryPolicy::call`, the runner of an external call, branch by branch:
//! a first call is made once and its answer recorded; a takeover asks the
//! provider first and does not call again when it has the call; an
//! unknown answer (of the call or of the lookup) is retried, asking first;
//! a refusal is recorded as an answer, and fails permanently or is retried
//! as `classify` says; exhausted retries are dead-lettered with the
//! request; and past the limits no call is made, while one lookup settles
//! the last one (bounded, if the lookup itself kills the worker).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use dedupkv::{
    Answer, Claim, Effect, ErrorClass, Fingerprint, GiveUpReason, Intent, Key, Listing,
    ManualClock, Result, RetryPolicy, Run, State, Store,
};
use dedupkv_testkit::{T0, tempdir};

const REQUEST: &[u8] = b"ship order 7: 2 parcels";
const INTENT: Intent<'static> = Intent {
    target: "carrier",
    request: REQUEST,
};

/// What the carrier does with the next call.
#[derive(Clone, Copy)]
enum Next {
    /// Accepts it.
    Accept,
    /// Accepts it, then the answer is lost (a timeout).
    AcceptSilently,
    /// Refuses it with this status.
    Refuse(u16),
}

/// A carrier that deduplicates on the idempotency key.
#[derive(Default)]
struct Carrier {
    shipments: RefCell<HashMap<String, String>>,
    next: RefCell<Vec<Next>>,
    lookups: Cell<u32>,
    calls: Cell<u32>,
    /// The lookup cannot tell (the carrier's API is down).
    lookup_down: Cell<bool>,
}

impl Carrier {
    fn lookup(&self, claim: &Claim) -> std::result::Result<Option<Vec<u8>>, String> {
        self.lookups.set(self.lookups.get() + 1);
        if self.lookup_down.get() {
            return Err("lookup timed out".to_string());
        }
        let shipments = self.shipments.borrow();
        Ok(shipments
            .get(&claim.provider_key().map_err(|e| e.to_string())?)
            .map(|l| l.clone().into_bytes()))
    }

    fn send(&self, claim: &Claim) -> std::result::Result<Vec<u8>, String> {
        self.calls.set(self.calls.get() + 1);
        let next = self.next.borrow_mut().pop().unwrap_or(Next::Accept);
        if let Next::Refuse(status) = next {
            return Err(format!("{status} from the carrier"));
        }
        let mut shipments = self.shipments.borrow_mut();
        let n = shipments.len();
        let label = shipments
            .entry(claim.provider_key().map_err(|e| e.to_string())?)
            .or_insert_with(|| format!("1Z{:03}", n + 1))
            .clone();
        match next {
            Next::AcceptSilently => Err("timeout".to_string()),
            _ => Ok(label.into_bytes()),
        }
    }

    /// The carrier's answers to the next calls, in order.
    fn will(&self, answers: &[Next]) {
        *self.next.borrow_mut() = answers.iter().rev().copied().collect();
    }
}

#[allow(clippy::ptr_arg)] // the runner hands the error as `&E`, and E is String
fn classify(e: &String) -> ErrorClass {
    if e.starts_with("400") {
        ErrorClass::Permanent
    } else if e.starts_with("timeout") {
        ErrorClass::Unanswered
    } else {
        ErrorClass::Retryable
    }
}

/// One delivery: the call through the runner.
fn call(s: &Setup, carrier: &Carrier) -> Result<Run<Vec<u8>, String>> {
    let effect = Effect::new(
        INTENT,
        |c: &Claim| carrier.lookup(c),
        |c: &Claim| carrier.send(c),
        classify,
    )
    .amount(2);
    s.policy.call(&s.store, &key(), fp(), effect)
}

struct Setup {
    _dir: tempfile::TempDir,
    clock: ManualClock,
    store: Store,
    policy: RetryPolicy,
}

fn setup(max_attempts: u32) -> Result<Setup> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = Store::builder()
        .clock(clock.clone())
        .open(dir.path().join("s.redb"))?;
    let policy = RetryPolicy::builder()
        .base(Duration::from_millis(1))
        .cap(Duration::from_millis(1))
        .max_attempts(max_attempts)
        .seed(1)
        .clock(clock.clone())
        .build()?;
    Ok(Setup {
        _dir: dir,
        clock,
        store,
        policy,
    })
}

fn key() -> Key<'static> {
    Key::new("orders", "7")
}

fn fp() -> Fingerprint {
    Fingerprint::of(REQUEST)
}

/// One attempt whose worker dies inside the call, after the carrier
/// accepted it (`accepted`) or before.
fn die_in_the_call(s: &Setup, carrier: &Carrier, accepted: bool) {
    let died = catch_unwind(AssertUnwindSafe(|| {
        let effect = Effect::new(
            INTENT,
            |c: &Claim| carrier.lookup(c),
            |c: &Claim| -> std::result::Result<Vec<u8>, String> {
                if accepted {
                    let _ = carrier.send(c);
                }
                panic!("the worker dies before it records the answer")
            },
            classify,
        );
        s.policy.call(&s.store, &key(), fp(), effect)
    }));
    assert!(died.is_err());
}

#[test]
fn a_first_call_is_made_once_and_recorded_with_its_answer() -> Result<()> {
    let s = setup(3)?;
    let carrier = Carrier::default();
    let run = call(&s, &carrier)?;
    assert!(matches!(run, Run::Done(ref l) if l == b"1Z001"), "{run:?}");
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (0, 1));
    let intent = s.store.intent(&key())?.expect("recorded");
    assert!(intent.is_sent());
    assert_eq!(intent.reference(), Some(&b"1Z001"[..]));
    assert_eq!(
        s.store.tallies("orders")?[0].amount,
        2,
        "the amount is counted"
    );
    // A redelivery replays the label: the carrier is neither asked nor called.
    let run = call(&s, &carrier)?;
    assert!(
        matches!(run, Run::Replayed(ref l) if l == b"1Z001"),
        "{run:?}"
    );
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (0, 1));
    Ok(())
}

#[test]
fn a_takeover_asks_first_and_does_not_call_a_provider_that_has_the_call() -> Result<()> {
    let s = setup(3)?;
    let carrier = Carrier::default();
    die_in_the_call(&s, &carrier, true);
    assert_eq!(carrier.calls.get(), 1);
    let run = call(&s, &carrier)?;
    assert!(
        matches!(run, Run::Reconciled(ref l) if l == b"1Z001"),
        "{run:?}"
    );
    assert_eq!(
        (carrier.lookups.get(), carrier.calls.get()),
        (1, 1),
        "asked, not called again"
    );
    let rec = s.store.get(&key())?.expect("recorded");
    assert_eq!(
        (rec.state(), rec.outcome()),
        (State::Completed, Some(&b"1Z001"[..]))
    );
    assert!(s.store.pending_intents(&Listing::new())?.items.is_empty());
    assert_eq!(carrier.shipments.borrow().len(), 1);
    Ok(())
}

#[test]
fn a_takeover_whose_call_never_reached_the_provider_calls_it() -> Result<()> {
    let s = setup(3)?;
    let carrier = Carrier::default();
    die_in_the_call(&s, &carrier, false);
    let run = call(&s, &carrier)?;
    assert!(matches!(run, Run::Done(ref l) if l == b"1Z001"), "{run:?}");
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (1, 1));
    Ok(())
}

#[test]
fn an_unknown_answer_is_retried_asking_first() -> Result<()> {
    let s = setup(5)?;
    let carrier = Carrier::default();
    // The carrier accepts, but the answer times out.
    carrier.will(&[Next::AcceptSilently]);
    let run = call(&s, &carrier)?;
    assert!(matches!(run, Run::RetryAfter { attempt: 1, .. }), "{run:?}");
    let pending = s.store.pending_intents(&Listing::new())?;
    assert_eq!(
        pending.items.len(),
        1,
        "the answer is unknown: not recorded"
    );
    // The next attempt asks; the lookup cannot tell either: retried again.
    s.clock.advance(Duration::from_millis(5));
    carrier.lookup_down.set(true);
    let run = call(&s, &carrier)?;
    assert!(matches!(run, Run::RetryAfter { attempt: 2, .. }), "{run:?}");
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (1, 1));
    // Then the lookup finds the call: completed without calling again.
    s.clock.advance(Duration::from_millis(5));
    carrier.lookup_down.set(false);
    let run = call(&s, &carrier)?;
    assert!(
        matches!(run, Run::Reconciled(ref l) if l == b"1Z001"),
        "{run:?}"
    );
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (2, 1));
    assert!(s.store.pending_intents(&Listing::new())?.items.is_empty());
    Ok(())
}

#[test]
fn a_refusal_for_good_fails_permanently_with_the_answer_recorded() -> Result<()> {
    let s = setup(3)?;
    let carrier = Carrier::default();
    carrier.will(&[Next::Refuse(400)]);
    let run = call(&s, &carrier)?;
    assert!(
        matches!(
            run,
            Run::GaveUp {
                attempts: 1,
                reason: GiveUpReason::Permanent,
                dead_lettered: false,
                ..
            }
        ),
        "{run:?}"
    );
    let rec = s.store.get(&key())?.expect("recorded");
    assert_eq!(rec.state(), State::Failed);
    assert_eq!(
        rec.outcome(),
        Some(&b"permanent error: 400 from the carrier"[..])
    );
    let intent = s.store.intent(&key())?.expect("answered");
    assert_eq!(
        intent.answer(),
        Some(Answer::Refused("400 from the carrier"))
    );
    // Later deliveries replay the failure without asking or calling.
    let run = call(&s, &carrier)?;
    assert!(matches!(run, Run::Failed(_)), "{run:?}");
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (0, 1));
    Ok(())
}

#[test]
fn a_refusal_for_now_is_answered_so_the_retry_does_not_ask() -> Result<()> {
    let s = setup(3)?;
    let carrier = Carrier::default();
    carrier.will(&[Next::Refuse(503)]);
    let run = call(&s, &carrier)?;
    assert!(matches!(run, Run::RetryAfter { attempt: 1, .. }), "{run:?}");
    assert!(s.store.pending_intents(&Listing::new())?.items.is_empty());
    s.clock.advance(Duration::from_millis(5));
    let run = call(&s, &carrier)?;
    assert!(matches!(run, Run::Done(ref l) if l == b"1Z001"), "{run:?}");
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (0, 2));
    Ok(())
}

#[test]
fn exhausted_retries_are_dead_lettered_with_the_request() -> Result<()> {
    let s = setup(2)?;
    let carrier = Carrier::default();
    carrier.will(&[Next::Refuse(503), Next::Refuse(503)]);
    assert!(matches!(
        call(&s, &carrier)?,
        Run::RetryAfter { attempt: 1, .. }
    ));
    s.clock.advance(Duration::from_millis(5));
    let run = call(&s, &carrier)?;
    assert!(
        matches!(
            run,
            Run::GaveUp {
                attempts: 2,
                reason: GiveUpReason::MaxAttempts { max: 2 },
                dead_lettered: true,
                ..
            }
        ),
        "{run:?}"
    );
    let dl = &s.store.dead_letters(&Listing::new())?.items[0];
    assert_eq!(
        dl.reason(),
        "gave up after 2 attempts (max_attempts): 503 from the carrier"
    );
    assert_eq!(dl.payload(), Some(REQUEST));
    assert!(
        s.store.pending_intents(&Listing::new())?.items.is_empty(),
        "the refusals were answers: nothing is ambiguous"
    );
    let run = call(&s, &carrier)?;
    assert!(matches!(run, Run::DeadLettered(_)), "{run:?}");
    assert_eq!(carrier.calls.get(), 2);
    Ok(())
}

#[test]
fn past_the_limit_no_call_is_made_and_one_lookup_settles_the_last() -> Result<()> {
    let s = setup(2)?;
    let carrier = Carrier::default();
    die_in_the_call(&s, &carrier, false);
    die_in_the_call(&s, &carrier, false);
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (1, 0));
    let run = call(&s, &carrier)?;
    assert!(
        matches!(
            run,
            Run::Exhausted {
                attempt: 3,
                reason: GiveUpReason::Interrupted {
                    attempts: 2,
                    interrupted: 2
                },
                ..
            }
        ),
        "{run:?}"
    );
    assert_eq!(
        (carrier.lookups.get(), carrier.calls.get()),
        (2, 0),
        "asked once more, not called"
    );
    let dl = &s.store.dead_letters(&Listing::new())?.items[0];
    assert_eq!(
        dl.reason(),
        "interrupted 2 times (max_attempts); attempt 3 not started"
    );
    assert_eq!(dl.payload(), Some(REQUEST));
    assert!(s.store.pending_intents(&Listing::new())?.items.is_empty());
    let intent = s.store.intent(&key())?.expect("answered");
    assert_eq!(intent.answer(), Some(Answer::NotFound));
    Ok(())
}

#[test]
fn past_the_limit_a_call_the_provider_has_is_completed() -> Result<()> {
    let s = setup(1)?;
    let carrier = Carrier::default();
    die_in_the_call(&s, &carrier, true); // accepted, then the worker died
    let run = call(&s, &carrier)?;
    assert!(
        matches!(run, Run::Reconciled(ref l) if l == b"1Z001"),
        "{run:?}"
    );
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (1, 1));
    assert_eq!(
        s.store.get(&key())?.map(|r| r.state()),
        Some(State::Completed)
    );
    Ok(())
}

#[test]
fn past_the_limit_a_lookup_that_kills_its_worker_is_bounded() -> Result<()> {
    let s = setup(1)?;
    let carrier = Carrier::default();
    die_in_the_call(&s, &carrier, false);
    // Attempt 2, one past the limit, asks, and dies inside the lookup.
    let died = catch_unwind(AssertUnwindSafe(|| {
        let effect = Effect::new(
            INTENT,
            |_: &Claim| -> std::result::Result<Option<Vec<u8>>, String> {
                carrier.lookups.set(carrier.lookups.get() + 1);
                panic!("the lookup crashes the worker")
            },
            |c: &Claim| carrier.send(c),
            classify,
        );
        s.policy.call(&s.store, &key(), fp(), effect)
    }));
    assert!(died.is_err());
    // Attempt 3 does not ask again: dead-lettered, the call unanswered.
    let run = call(&s, &carrier)?;
    assert!(matches!(run, Run::Exhausted { attempt: 3, .. }), "{run:?}");
    assert_eq!((carrier.lookups.get(), carrier.calls.get()), (1, 0));
    let dl = &s.store.dead_letters(&Listing::new())?.items[0];
    assert_eq!(
        dl.reason(),
        "interrupted 2 times (max_attempts); attempt 3 not started; \
         an earlier call is unanswered (see pending_intents)"
    );
    assert_eq!(s.store.pending_intents(&Listing::new())?.items.len(), 1);
    Ok(())
}
