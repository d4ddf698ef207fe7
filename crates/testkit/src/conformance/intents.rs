//! The conformance cases of [`Intents`]: an intent recorded with its
//! claim or not at all, the five answers, the provider key every attempt
//! and every instance derives, and what the listings (pending intents,
//! duplicate candidates) show after each history of calls.

use dedupkv::contract::{Handle, Intents, Outcome, Read, Settle, Write};
use dedupkv::{
    Answer, Began, BeginOptions, Duplicate, Error, Failure, Fingerprint, Intent, IntentEntry, Key,
};

/// How the listings are reached on a backend (they are not part of the
/// contract's traits): its pending intents and its duplicate candidates,
/// every scope, oldest first.
pub struct Listings<'a, B> {
    /// The unanswered intents of open operations.
    pub pending: &'a dyn Fn(&B) -> dedupkv::Result<Vec<IntentEntry>>,
    /// The candidates for a duplicate external effect.
    pub duplicates: &'a dyn Fn(&B) -> dedupkv::Result<Vec<IntentEntry>>,
}

const INTENT: Intent<'static> = Intent {
    target: "carrier",
    request: b"2 parcels",
};

fn key(id: &str) -> Key<'static> {
    Key::new("intents", id.as_bytes()).into_owned()
}

fn begin<B: Write>(b: &B, k: &Key<'_>, fp: Fingerprint) -> Result<B::Claim, String> {
    let told = b
        .begin(k, fp, &BeginOptions::new(), Some(INTENT))
        .map_err(|e| format!("begin {k:?} with an intent: {e}"))?;
    match b.tell(told).map_err(|e| format!("begin {k:?}: {e}"))? {
        Began::Started(c) => Ok(c),
        other => Err(format!(
            "begin {k:?}: Started expected, got {:?}",
            kind(&other)
        )),
    }
}

fn kind<C>(b: &Began<C>) -> &'static str {
    match b {
        Began::Started(_) => "Started",
        Began::InProgress(_) => "InProgress",
        Began::Completed(_) => "Completed",
        Began::DeadLettered(_) => "DeadLettered",
    }
}

fn answer<B: Intents>(b: &B, c: &B::Claim, a: Answer<'_>) -> Result<(), String> {
    let told = b
        .mark_answered(c, a)
        .map_err(|e| format!("mark_answered {a:?} on {:?}: {e}", c.key()))?;
    b.tell(told)
        .map_err(|e| format!("mark_answered {a:?}: {e}"))
}

fn complete<B: Write>(b: &B, c: &B::Claim) -> Result<(), String> {
    let told = b
        .complete(c, Outcome::raw(b"done"))
        .map_err(|e| format!("complete {:?}: {e}", c.key()))?;
    b.tell(told).map_err(|e| format!("complete: {e}"))
}

fn fail<B: Write>(b: &B, c: &B::Claim, failure: Failure<'_>) -> Result<(), String> {
    let told = b
        .fail(c, failure)
        .map_err(|e| format!("fail {:?} {failure:?}: {e}", c.key()))?;
    b.tell(told).map_err(|e| format!("fail: {e}"))
}

fn provider_key<B: Read + Settle>(b: &B, k: &Key<'_>) -> Result<String, String> {
    let told = b.get(k).map_err(|e| format!("get {k:?}: {e}"))?;
    b.tell(told)
        .map_err(|e| format!("get {k:?}: {e}"))?
        .and_then(|r| r.provider_key())
        .ok_or_else(|| format!("{k:?}: a begun operation has a provider key"))
}

fn keys_of(list: &[IntentEntry]) -> Vec<(String, Option<Duplicate>)> {
    list.iter()
        .map(|e| {
            (
                String::from_utf8_lossy(e.key().id()).into_owned(),
                e.duplicate(),
            )
        })
        .collect()
}

/// Runs the intent cases on `a` and `b`, two instances of one fresh,
/// empty backend (the same store twice, for a single-process one), with
/// the default lease and retention (no lease lapses in these cases).
///
/// # Errors
/// The first case that does not hold, naming it and what was seen.
///
/// # Examples
/// ```
/// use dedupkv::Store;
/// use dedupkv_testkit::conformance::{self, Listings};
/// # let dir = dedupkv_testkit::tempdir();
/// let store = Store::open(dir.path().join("s.redb"))?;
/// let all = dedupkv::Listing::new();
/// conformance::intents(&store, &store, &Listings {
///     pending: &|s: &Store| Ok(s.pending_intents(&all)?.items),
///     duplicates: &|s: &Store| Ok(s.duplicate_candidates(&all)?.items),
/// })
/// .unwrap();
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn intents<B>(a: &B, b: &B, list: &Listings<'_, B>) -> Result<(), String>
where
    B: Intents,
{
    recorded_with_the_claim(a, b, list)?;
    every_answer(a)?;
    one_provider_key(a, b)?;
    refused(a, b)?;
    duplicates(a, b, list)
}

/// The intent is recorded by `begin`, listed as pending at once (from
/// either instance), and settled by the provider's acceptance; one too
/// large is refused and nothing, not even the claim, is recorded.
fn recorded_with_the_claim<B: Intents>(a: &B, b: &B, list: &Listings<'_, B>) -> Result<(), String> {
    let k = key("recorded");
    let c = begin(a, &k, Fingerprint::NONE)?;
    let pending = (list.pending)(b).map_err(|e| format!("pending intents: {e}"))?;
    let [entry] = pending.as_slice() else {
        return Err(format!(
            "one pending intent expected, got {:?}",
            keys_of(&pending)
        ));
    };
    let pk = provider_key(b, &k)?;
    if (
        entry.key(),
        entry.target(),
        entry.request(),
        entry.is_sent(),
        entry.attempt(),
    ) != (&k, "carrier", Some(&b"2 parcels"[..]), false, 1)
        || entry.provider_key() != pk
    {
        return Err(format!(
            "the pending intent of {k:?} as recorded expected, got {entry:?}"
        ));
    }
    answer(a, &c, Answer::Accepted(b"1Z"))?;
    let pending = (list.pending)(b).map_err(|e| format!("pending intents: {e}"))?;
    if !pending.is_empty() {
        return Err(format!(
            "accepted: nothing pending expected, got {:?}",
            keys_of(&pending)
        ));
    }
    complete(a, &c)?;

    let big = vec![0u8; 2 << 20];
    let k = key("too-large");
    let intent = Intent {
        target: "carrier",
        request: &big,
    };
    if a.begin(&k, Fingerprint::NONE, &BeginOptions::new(), Some(intent))
        .is_ok()
    {
        return Err("begin with a 2 MiB intent: refused expected".into());
    }
    let told = b.get(&k).map_err(|e| format!("get {k:?}: {e}"))?;
    if b.tell(told).map_err(|e| e.to_string())?.is_some() {
        return Err(format!(
            "{k:?}: an intent refused, and a claim recorded without it"
        ));
    }
    Ok(())
}

/// Each of the five answers is recorded on an active claim with an intent.
fn every_answer<B: Intents>(a: &B) -> Result<(), String> {
    let answers = [
        Answer::Accepted(b"ref-1"),
        Answer::Refused("503 Service Unavailable"),
        Answer::Unknown,
        Answer::NotFound,
        Answer::Found(b"ref-2"),
    ];
    for (i, ans) in answers.into_iter().enumerate() {
        let k = key(&format!("answer-{i}"));
        let c = begin(a, &k, Fingerprint::NONE)?;
        answer(a, &c, ans)?;
        complete(a, &c)?;
    }
    Ok(())
}

/// Every attempt of one operation, on either instance, gets the same
/// provider key; another key, or a corrected request, another one.
fn one_provider_key<B: Intents>(a: &B, b: &B) -> Result<(), String> {
    let k = key("provider-key");
    let first = begin(a, &k, Fingerprint::of("v1"))?;
    let pk = provider_key(a, &k)?;
    drop(first); // released: the next attempt is told it was interrupted
    let second = begin(b, &k, Fingerprint::of("v1"))?;
    if second.attempt() != 2 || !second.interrupted() {
        return Err(format!(
            "a released claim's next attempt: attempt 2, interrupted expected, got {} {}",
            second.attempt(),
            second.interrupted()
        ));
    }
    let (on_a, on_b) = (provider_key(a, &k)?, provider_key(b, &k)?);
    if on_a != pk || on_b != pk {
        return Err(format!(
            "one provider key for every attempt and instance: {pk} then {on_a} / {on_b}"
        ));
    }
    if provider_key(a, &key("recorded"))? == pk {
        return Err("two operations with one provider key".into());
    }
    let told = b
        .fail(&second, Failure::RetryableAnyRequest)
        .map_err(|e| format!("fail: {e}"))?;
    b.tell(told).map_err(|e| format!("fail: {e}"))?;
    let corrected = begin(a, &k, Fingerprint::of("v2"))?;
    if provider_key(b, &k)? == pk {
        return Err("a corrected request kept the operation's provider key".into());
    }
    complete(a, &corrected)
}

/// `mark_answered` is refused for a finished claim, one taken over, and
/// one that recorded no intent.
fn refused<B: Intents>(a: &B, b: &B) -> Result<(), String> {
    let k = key("refused");
    let c = begin(a, &k, Fingerprint::NONE)?;
    complete(a, &c)?;
    match a.mark_answered(&c, Answer::Unknown) {
        Err(Error::ClaimLost { .. }) => {}
        other => {
            return Err(format!(
                "mark_answered after complete: ClaimLost expected, got {:?}",
                other.map(|_| ())
            ));
        }
    }
    let k = key("no-intent");
    let told = b
        .begin(&k, Fingerprint::NONE, &BeginOptions::new(), None)
        .map_err(|e| format!("begin: {e}"))?;
    let Began::Started(c) = b.tell(told).map_err(|e| format!("begin: {e}"))? else {
        return Err("begin of a fresh key: Started expected".into());
    };
    match a.mark_answered(&c, Answer::Unknown) {
        Err(Error::InvalidArgument { what: "claim", .. }) => {}
        other => {
            return Err(format!(
                "mark_answered of a claim without an intent: InvalidArgument expected, got {:?}",
                other.map(|_| ())
            ));
        }
    }
    complete(b, &c)
}

/// The histories of calls the engine's `Calls` distinguishes, and which
/// of them are candidates for a duplicate effect; the unanswered ones of
/// open operations are pending.
fn duplicates<B: Intents>(a: &B, b: &B, list: &Listings<'_, B>) -> Result<(), String> {
    // (id, steps): `d` the attempt is dropped (released), a letter an
    // answer; every history ends completed unless it ends in `d`.
    let cases: [(&str, &[Answer<'_>], bool); 6] = [
        // Called, died unanswered, asked: found. One effect.
        ("asked", &[Answer::Found(b"1Z")], false),
        // Called, died, called again and accepted without asking.
        ("after-unknown", &[Answer::Accepted(b"1Z")], false),
        // Called, died, asked: none; called, accepted.
        (
            "not-found",
            &[Answer::NotFound, Answer::Accepted(b"1Z")],
            false,
        ),
        // Refused, then (next attempt) accepted: one effect.
        ("refused", &[], false),
        // Two references.
        ("two-refs", &[], false),
        // Timed out, left open: pending.
        ("open", &[Answer::Unknown], true),
    ];
    for (id, steps, leave_open) in cases {
        let k = key(&format!("dup-{id}"));
        let c = begin(a, &k, Fingerprint::NONE)?;
        match id {
            "refused" => answer(a, &c, Answer::Refused("503"))?,
            "two-refs" => answer(a, &c, Answer::Accepted(b"1Z001"))?,
            _ => {} // died before any answer
        }
        drop(c);
        let c = begin(b, &k, Fingerprint::NONE)?;
        match id {
            "refused" => answer(b, &c, Answer::Accepted(b"1Z"))?,
            "two-refs" => answer(b, &c, Answer::Accepted(b"1Z002"))?,
            _ => {}
        }
        for s in steps {
            answer(b, &c, *s)?;
        }
        if leave_open {
            std::mem::forget(c); // in progress, its call's fate unknown
        } else {
            complete(b, &c)?;
        }
    }
    // Recorded in one millisecond, perhaps: compared as sets.
    let mut got = keys_of(&(list.duplicates)(a).map_err(|e| format!("duplicate candidates: {e}"))?);
    got.sort_by(|x, y| x.0.cmp(&y.0));
    let want = vec![
        (
            "dup-after-unknown".to_owned(),
            Some(Duplicate::AfterUnknown),
        ),
        ("dup-open".to_owned(), Some(Duplicate::AfterUnknown)),
        ("dup-two-refs".to_owned(), Some(Duplicate::TwoReferences)),
    ];
    if got != want {
        return Err(format!(
            "duplicate candidates: {want:?} expected, got {got:?}"
        ));
    }
    let pending = keys_of(&(list.pending)(b).map_err(|e| format!("pending intents: {e}"))?);
    if pending != vec![("dup-open".to_owned(), Some(Duplicate::AfterUnknown))] {
        return Err(format!(
            "pending intents: dup-open only expected, got {pending:?}"
        ));
    }
    Ok(())
}

/// What of an intent entry two backends must agree on (not times or
/// provider keys, which are each backend's own).
type EntryView = Option<(
    Option<String>,
    bool,
    Option<Duplicate>,
    u32,
    Option<Vec<u8>>,
)>;

fn entry_view(e: Option<IntentEntry>) -> EntryView {
    e.map(|e| {
        (
            e.answer().map(|a| format!("{a:?}")),
            e.is_sent(),
            e.duplicate(),
            e.attempt(),
            e.request().map(<[u8]>::to_vec),
        )
    })
}

/// A claim on each of two backends, for one step of a history.
struct Both<CA, CB>(CA, CB);

/// Seeded random histories of one operation's calls, each made on `a`
/// and on `b` (two fresh, empty backends) side by side: attempts that
/// record the intent, die unanswered (a dropped claim), get each of the
/// five answers (two references), complete. After every step both must
/// show the same intent (`intent`: how each shows a key's), and at the end
/// the same pending intents and duplicate candidates: the engine's rules
/// of when a call may have happened twice, restated by another backend,
/// checked against it.
///
/// # Errors
/// The first step where they differ: the case, the history so far, and
/// both views.
///
/// # Examples
/// ```
/// use dedupkv::{Key, Listing, Store};
/// use dedupkv_testkit::conformance::{self, Listings};
/// # let (d1, d2) = (dedupkv_testkit::tempdir(), dedupkv_testkit::tempdir());
/// let (a, b) = (Store::open(d1.path().join("a.redb"))?, Store::open(d2.path().join("b.redb"))?);
/// let all = Listing::new();
/// let list = Listings {
///     pending: &|s: &Store| Ok(s.pending_intents(&all)?.items),
///     duplicates: &|s: &Store| Ok(s.duplicate_candidates(&all)?.items),
/// };
/// let intent = |s: &Store, k: &Key<'_>| s.intent(k);
/// conformance::intent_histories((&a, &list, &intent), (&b, &list, &intent), 20).unwrap();
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[allow(clippy::type_complexity)] // (backend, its listings, its intent lookup)
pub fn intent_histories<A: Intents, B: Intents>(
    (a, la, ia): (
        &A,
        &Listings<'_, A>,
        &dyn Fn(&A, &Key<'_>) -> dedupkv::Result<Option<IntentEntry>>,
    ),
    (b, lb, ib): (
        &B,
        &Listings<'_, B>,
        &dyn Fn(&B, &Key<'_>) -> dedupkv::Result<Option<IntentEntry>>,
    ),
    cases: u64,
) -> Result<(), String> {
    const STEPS: &[&str] = &[
        "drop",
        "accept 1Z1",
        "accept 1Z2",
        "refuse",
        "unknown",
        "not found",
        "found 1Z1",
        "complete",
        "retry",
        "fail",
        "give up",
    ];
    for case in 0..cases {
        let mut rng =
            crate::history::workload::Rng::new(case.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let k = key(&format!("history-{case}"));
        let mut claims = Some(Both(
            begin(a, &k, Fingerprint::NONE)?,
            begin(b, &k, Fingerprint::NONE)?,
        ));
        let mut done = vec!["begin"];
        for _ in 0..=rng.below(12) {
            let step = STEPS[rng.below(STEPS.len())];
            done.push(step);
            let Some(Both(ca, cb)) = claims.take() else {
                break;
            };
            let ans = match step {
                "drop" | "complete" | "retry" | "fail" | "give up" => None,
                "accept 1Z1" => Some(Answer::Accepted(b"1Z1")),
                "accept 1Z2" => Some(Answer::Accepted(b"1Z2")),
                "refuse" => Some(Answer::Refused("503")),
                "unknown" => Some(Answer::Unknown),
                "not found" => Some(Answer::NotFound),
                _ => Some(Answer::Found(b"1Z1")),
            };
            match ans {
                Some(x) => {
                    answer(a, &ca, x)?;
                    answer(b, &cb, x)?;
                    claims = Some(Both(ca, cb));
                }
                None if step == "complete" => {
                    complete(a, &ca)?;
                    complete(b, &cb)?;
                }
                None if step != "drop" => {
                    let failure = match step {
                        "retry" => Failure::Retryable,
                        "fail" => Failure::Permanent(b"no"),
                        _ => Failure::Exhausted {
                            reason: "gave up",
                            payload: None,
                        },
                    };
                    fail(a, &ca, failure)?;
                    fail(b, &cb, failure)?;
                    if step == "retry" {
                        claims = Some(Both(
                            begin(a, &k, Fingerprint::NONE)?,
                            begin(b, &k, Fingerprint::NONE)?,
                        ));
                        done.push("begin");
                    }
                }
                None => {
                    drop((ca, cb));
                    claims = Some(Both(
                        begin(a, &k, Fingerprint::NONE)?,
                        begin(b, &k, Fingerprint::NONE)?,
                    ));
                    done.push("begin");
                }
            }
            let va = entry_view(ia(a, &k).map_err(|e| format!("intent: {e}"))?);
            let vb = entry_view(ib(b, &k).map_err(|e| format!("intent: {e}"))?);
            if va != vb {
                return Err(format!(
                    "case {case}, after {done:?}: {va:?} on one backend, {vb:?} on the other"
                ));
            }
            if claims.is_none() {
                break;
            }
        }
        if let Some(Both(ca, cb)) = claims {
            // Left in progress (its calls as they are), not released.
            std::mem::forget((ca, cb));
        }
    }
    same_listings((a, la), (b, lb))
}

/// Both backends list the same pending intents and duplicate candidates
/// (as sets: recorded in one millisecond, their order may differ).
fn same_listings<A, B>(
    (a, la): (&A, &Listings<'_, A>),
    (b, lb): (&B, &Listings<'_, B>),
) -> Result<(), String> {
    let sorted = |mut v: Vec<(String, Option<Duplicate>)>| {
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    for (what, xa, xb) in [
        ("pending intents", (la.pending)(a), (lb.pending)(b)),
        (
            "duplicate candidates",
            (la.duplicates)(a),
            (lb.duplicates)(b),
        ),
    ] {
        let xa = sorted(keys_of(&xa.map_err(|e| format!("{what}: {e}"))?));
        let xb = sorted(keys_of(&xb.map_err(|e| format!("{what}: {e}"))?));
        if xa != xb {
            return Err(format!(
                "{what}: {xa:?} on one backend, {xb:?} on the other"
            ));
        }
    }
    Ok(())
}
