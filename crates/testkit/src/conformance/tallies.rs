//! The conformance cases of [`Tallies`]: every completion counted once,
//! with its amount, in the window of its completion, whichever way it
//! completed; nothing else counted; scopes apart; the comparison with the
//! system of record's counts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dedupkv::contract::{DeadLetters, Outcome, Tallies, Write};
use dedupkv::{
    Began, BeginOptions, Clock, Error, Failure, Fingerprint, Key, ManualClock, Resolution, Tally,
    WindowKeys,
};

/// The claim of a fresh `begin` of `id` in `scope`.
fn started<B: Write>(b: &B, scope: &str, id: &str) -> Result<B::Claim, String> {
    let key = Key::new(scope, id);
    let p = b
        .begin(&key, Fingerprint::NONE, &BeginOptions::new(), None)
        .map_err(|e| format!("begin {key:?}: {e}"))?;
    match b.tell(p).map_err(|e| format!("begin {key:?}: {e}"))? {
        Began::Started(c) => Ok(c),
        _ => Err(format!("begin {key:?}: not started")),
    }
}

fn complete<B: Write>(b: &B, c: &B::Claim, amount: i64) -> Result<(), String> {
    let p = b
        .complete(c, Outcome::raw(b"ok").amount(amount))
        .map_err(|e| format!("complete: {e}"))?;
    b.tell(p).map_err(|e| format!("complete: {e}"))
}

/// The window both backends use by default, ms.
const HOUR: u64 = 3_600_000;

/// `(window start, count, amount)` of each of `scope`'s windows.
fn counts<B: Tallies>(b: &B, scope: &str) -> Result<Vec<(SystemTime, u64, i128)>, String> {
    Ok(b.tallies(scope.as_bytes())
        .map_err(|e| format!("tallies {scope:?}: {e}"))?
        .into_iter()
        .map(|t| (t.window_start, t.count, t.amount))
        .collect())
}

/// Runs the tally cases on a fresh, empty backend whose time is `clock`
/// and whose reconciliation window is 1 hour (both backends' default).
///
/// # Errors
/// The first case that does not hold, naming it and what was seen.
///
/// # Examples
/// ```
/// use dedupkv::{ManualClock, Store};
/// use dedupkv_testkit::conformance;
/// # let dir = dedupkv_testkit::tempdir();
/// let clock = ManualClock::new(1_700_000_000_000);
/// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
/// conformance::tallies(&store, &clock).unwrap();
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn tallies<B: DeadLetters + Tallies>(backend: &B, clock: &ManualClock) -> Result<(), String> {
    let b = backend;
    let hour = Duration::from_millis(HOUR);
    super::same("window", &b.tally_window(), &hour)?;
    let w0 = UNIX_EPOCH + Duration::from_millis(clock.now_millis() / HOUR * HOUR);
    // Completions with amounts (negative too), a batch, a dead letter
    // resolved as completed: all counted. Failures are not.
    let first = started(b, "shipments", "a")?;
    complete(b, &first, 700)?;
    let second = started(b, "shipments", "b")?;
    complete(b, &second, -200)?;
    let batched = (started(b, "shipments", "c")?, started(b, "shipments", "d")?);
    let batch = b
        .complete_batch(&[(&batched.0, b"x"), (&batched.1, b"y")])
        .map_err(|x| format!("complete_batch: {x}"))?;
    for r in b.tell(batch).map_err(|x| format!("complete_batch: {x}"))? {
        r.map_err(|x| format!("complete_batch item: {x}"))?;
    }
    for (id, failure) in [
        ("e", Failure::Permanent(b"no")),
        ("f", Failure::Retryable),
        (
            "g",
            Failure::Exhausted {
                reason: "gave up",
                payload: None,
            },
        ),
    ] {
        let claim = started(b, "shipments", id)?;
        let p = b
            .fail(&claim, failure)
            .map_err(|x| format!("fail {id}: {x}"))?;
        b.tell(p).map_err(|x| format!("fail {id}: {x}"))?;
    }
    super::same(
        "before the resolution",
        &counts(b, "shipments")?,
        &vec![(w0, 4, 500)],
    )?;
    let dead = Key::new("shipments", "g");
    let p = b
        .resolve(&dead, Resolution::Completed(b"shipped by hand"))
        .map_err(|x| format!("resolve: {x}"))?;
    super::same(
        "resolved",
        &b.tell(p).map_err(|x| format!("resolve: {x}"))?,
        &true,
    )?;
    super::same("one window", &counts(b, "shipments")?, &vec![(w0, 5, 500)])?;
    // A forgotten completion stays counted: the effect happened.
    let p = b
        .forget(&Key::new("shipments", "a"))
        .map_err(|x| format!("forget: {x}"))?;
    b.tell(p).map_err(|x| format!("forget: {x}"))?;
    super::same(
        "after a forget",
        &counts(b, "shipments")?,
        &vec![(w0, 5, 500)],
    )?;
    // The next window, and another scope apart.
    clock.advance(hour);
    let later = started(b, "shipments", "h")?;
    complete(b, &later, i64::MAX)?;
    let refund = started(b, "refunds", "r1")?;
    complete(b, &refund, 3)?;
    let w1 = w0 + hour;
    super::same(
        "two windows",
        &counts(b, "shipments")?,
        &vec![(w0, 5, 500), (w1, 1, i128::from(i64::MAX))],
    )?;
    super::same("another scope", &counts(b, "refunds")?, &vec![(w1, 1, 3)])?;
    super::same("a scope with none", &counts(b, "nothing")?, &vec![])?;
    reconciled(b, w0)?;
    // A tally off the window grid and an empty scope are refused.
    let off = b.reconcile(
        b"shipments",
        &[Tally::new(w0 + Duration::from_secs(1), 1, 0)],
    );
    if !matches!(off, Err(Error::InvalidArgument { .. })) {
        return Err(format!("a tally off the grid: {off:?}"));
    }
    let empty = b.tallies(b"");
    if !matches!(empty, Err(Error::InvalidArgument { .. })) {
        return Err(format!("an empty scope: {empty:?}"));
    }
    Ok(())
}

/// `b`'s windows of "shipments" (`w0` and the next) compared with the
/// system of record's counts: two of one window add up; a window only
/// they counted is extra.
fn reconciled<B: Tallies>(b: &B, w0: SystemTime) -> Result<(), String> {
    let hour = Duration::from_millis(HOUR);
    let w1 = w0 + hour;
    let theirs = [
        Tally::new(w0, 2, 300),
        Tally::new(w0, 3, 200),
        Tally::new(w1, 0, 0),
        Tally::new(w1 + hour, 1, 9),
    ];
    let report = b
        .reconcile(b"shipments", &theirs)
        .map_err(|x| format!("reconcile: {x}"))?;
    let seen: Vec<_> = report
        .windows
        .iter()
        .map(|w| (w.window_start, w.missing, w.extra))
        .collect();
    super::same(
        "reconciled",
        &seen,
        &vec![(w0, 0, 0), (w1, 1, 0), (w1 + hour, 0, 1)],
    )?;
    Ok(())
}

/// Runs the key reconciliation cases on a fresh, empty backend whose time
/// is `clock`, whose reconciliation window is 1 hour and which keeps the
/// keys of scope `shipments`: ids matched per window, a key completed
/// just after a boundary matched across it (`straddled`) within the
/// settle margin, missing and extra ids, provider keys matched, and a
/// settle longer than the window refused.
///
/// # Errors
/// The first case that does not hold, naming it and what was seen.
///
/// # Examples
/// ```
/// use dedupkv::{ManualClock, Store};
/// use dedupkv_testkit::conformance;
/// # let dir = dedupkv_testkit::tempdir();
/// let clock = ManualClock::new(1_700_000_000_000);
/// let store = Store::builder()
///     .clock(clock.clone())
///     .reconcile_keys_of("shipments")
///     .open(dir.path().join("s.redb"))?;
/// conformance::key_reconciliation(&store, &clock).unwrap();
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn key_reconciliation<B: Tallies + Write>(
    backend: &B,
    clock: &ManualClock,
) -> Result<(), String>
where
    B::Claim: dedupkv::contract::Handle,
{
    let b = backend;
    let hour = Duration::from_millis(HOUR);
    // Mid-window (away from both boundaries' margins), then just after
    // the next boundary.
    let start = clock.now_millis() / HOUR * HOUR + HOUR;
    let w0 = UNIX_EPOCH + Duration::from_millis(start);
    clock.set(start + HOUR / 2);
    let mut provider_keys = Vec::new();
    for id in ["o1", "o2"] {
        let claim = started(b, "shipments", id)?;
        complete(b, &claim, 0)?;
        let rec = b
            .tell(
                b.get(&Key::new("shipments", id))
                    .map_err(|x| x.to_string())?,
            )
            .map_err(|x| x.to_string())?;
        provider_keys.push(rec.and_then(|r| r.provider_key()).unwrap_or_default());
    }
    clock.advance(hour / 2 + Duration::from_secs(1)); // w1 + 1 s
    let late = started(b, "shipments", "o3")?;
    complete(b, &late, 0)?;
    let w1 = w0 + hour;
    let invoice = [
        WindowKeys::ids(w0, ["o1", "o3", "o9"]),
        WindowKeys::ids(w1, Vec::<&str>::new()),
    ];
    let report = b
        .reconcile_keys(b"shipments", &invoice, Duration::from_secs(5))
        .map_err(|x| format!("reconcile_keys: {x}"))?;
    let seen: Vec<_> = report
        .windows
        .iter()
        .map(|w| {
            (
                w.window_start,
                w.matched,
                w.missing.clone(),
                w.extra.clone(),
                w.straddled.clone(),
            )
        })
        .collect();
    let ids = |l: &[&str]| l.iter().map(|k| k.as_bytes().to_vec()).collect::<Vec<_>>();
    super::same(
        "by id",
        &seen,
        &vec![
            (w0, 2, ids(&["o2"]), ids(&["o9"]), ids(&["o3"])),
            (w1, 0, ids(&[]), ids(&[]), ids(&[])),
        ],
    )?;
    let by_pk = b
        .reconcile_keys(
            b"shipments",
            &[WindowKeys::provider_keys(
                w0,
                provider_keys.iter().map(String::as_bytes),
            )],
            Duration::ZERO,
        )
        .map_err(|x| format!("reconcile_keys by provider key: {x}"))?;
    super::same("by provider key", &by_pk.is_clean(), &true)?;
    let long = b.reconcile_keys(b"shipments", &invoice, hour + Duration::from_millis(1));
    if !matches!(long, Err(Error::InvalidArgument { what: "settle", .. })) {
        return Err(format!("a settle longer than the window: {long:?}"));
    }
    Ok(())
}
