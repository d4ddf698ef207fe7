//! The contract's conformance suite (`dedupkv_testkit::conformance`) run
//! against the engine: on a file, and on the fault backend's memory, in
//! both durability modes; and against the specification itself (which
//! checks the driver and its races, not the spec); and the concurrent
//! history check against the engine, the specification, and a broken
//! backend it must catch.

use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use dedupkv::contract::{Basis, BegunBatch, Outcome, Pending, Read, Settle, Write};
use dedupkv::{
    Began, BeginOptions, Durability, Error, Failure, Fingerprint, Forget, Intent, Key, ManualClock,
    Record, Store,
};
use dedupkv_testkit::conformance::{self, History, SpecClaim, Suite};
use dedupkv_testkit::{FaultBackend, tempdir};
use tempfile::TempDir;

/// A fresh store in a file of a temporary directory (kept as long as the
/// store), on `clock`.
fn on_file(clock: ManualClock) -> dedupkv::Result<(Store, TempDir)> {
    let dir = tempdir();
    let store = Store::builder()
        .clock(clock)
        .open(dir.path().join("s.redb"))?;
    Ok((store, dir))
}

#[test]
fn the_engine_on_a_file_passes_the_conformance_suite() -> Result<(), String> {
    conformance::run(on_file, Suite::default())
}

#[test]
fn the_engine_in_deferred_mode_passes_the_conformance_suite() -> Result<(), String> {
    conformance::run(
        |clock| {
            let store = Store::builder()
                .clock(clock)
                .durability(Durability::Deferred {
                    max_delay: Duration::from_millis(5),
                })
                .open_with_backend(FaultBackend::new())?;
            Ok((store, ()))
        },
        Suite {
            cases: 8,
            ..Suite::default()
        },
    )
}

#[test]
fn the_specification_passes_its_own_suite() -> Result<(), String> {
    conformance::run(
        |clock| Ok((conformance::Spec::new(clock), ())),
        Suite::default(),
    )
}

/// Seeds of the concurrent history runs (`DEDUPKV_CONF_SEEDS=7,9` to
/// repeat others).
fn seeds() -> Vec<u64> {
    std::env::var("DEDUPKV_CONF_SEEDS").map_or_else(
        |_| vec![1, 2, 3],
        |s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
    )
}

#[test]
fn the_engine_passes_the_concurrent_history_check_with_takeovers() -> Result<(), String> {
    let done = conformance::histories(on_file, &seeds())?;
    eprintln!("{done:?}");
    Ok(())
}

#[test]
fn the_specification_passes_its_own_history_check() -> Result<(), String> {
    conformance::histories(|clock| Ok((conformance::Spec::new(clock), ())), &seeds())?;
    Ok(())
}

/// A backend that acknowledges a zombie's `complete` (the specification,
/// but `complete` answers `Ok` where it should be `ClaimLost`): the
/// history check must catch it.
struct Lax(conformance::Spec);

impl Settle for Lax {
    type Waiter = ();
    fn wait(&self, basis: Basis) -> dedupkv::Result<()> {
        self.0.wait(basis)
    }
    fn poll_settled(
        &self,
        b: Basis,
        w: &mut (),
        cx: &mut Context<'_>,
    ) -> Poll<dedupkv::Result<()>> {
        self.0.poll_settled(b, w, cx)
    }
    fn stop_waiting(&self, w: &mut ()) {
        self.0.stop_waiting(w);
    }
}

impl Read for Lax {
    fn get(&self, key: &Key<'_>) -> dedupkv::Result<Pending<Option<Record>>> {
        self.0.get(key)
    }
}

impl Write for Lax {
    type Claim = SpecClaim;
    fn insert(&self, key: &Key<'_>, r: Option<Duration>) -> dedupkv::Result<Pending<bool>> {
        self.0.insert(key, r)
    }
    fn insert_batch(&self, keys: &[Key<'_>]) -> dedupkv::Result<Pending<Vec<bool>>> {
        self.0.insert_batch(keys)
    }
    fn forget(&self, key: &Key<'_>) -> dedupkv::Result<Pending<Forget>> {
        self.0.forget(key)
    }
    fn begin(
        &self,
        key: &Key<'_>,
        fp: Fingerprint,
        o: &BeginOptions,
        i: Option<Intent<'_>>,
    ) -> dedupkv::Result<Pending<Began<SpecClaim>>> {
        self.0.begin(key, fp, o, i)
    }
    fn begin_batch(
        &self,
        items: &[(Key<'_>, Fingerprint)],
    ) -> dedupkv::Result<BegunBatch<SpecClaim>> {
        self.0.begin_batch(items)
    }
    fn complete(&self, c: &SpecClaim, o: Outcome<'_>) -> dedupkv::Result<Pending<()>> {
        match self.0.complete(c, o) {
            Err(Error::ClaimLost { .. }) => Ok(Pending::settled(())),
            other => other,
        }
    }
    fn complete_batch(
        &self,
        items: &[(&SpecClaim, &[u8])],
    ) -> dedupkv::Result<Pending<Vec<dedupkv::Result<()>>>> {
        self.0.complete_batch(items)
    }
    fn fail(&self, c: &SpecClaim, f: Failure<'_>) -> dedupkv::Result<Pending<()>> {
        self.0.fail(c, f)
    }
    fn renew(&self, c: &SpecClaim, by: Option<Duration>) -> dedupkv::Result<Pending<SystemTime>> {
        self.0.renew(c, by)
    }
}

#[test]
fn a_backend_that_acknowledges_a_zombies_complete_fails_the_history_check() {
    let failed = seeds().into_iter().any(|seed| {
        conformance::history(
            |clock| Ok((Lax(conformance::Spec::new(clock)), ())),
            History::seed(seed),
        )
        .is_err_and(|e| e.contains("Complete"))
    });
    assert!(failed, "no seed caught the zombie's acknowledged complete");
}

#[test]
fn the_engine_passes_the_intent_cases() -> Result<(), String> {
    let (store, _dir) = on_file(ManualClock::new(1_700_000_000_000)).map_err(|e| e.to_string())?;
    let all = dedupkv::Listing::new();
    conformance::intents(
        &store,
        &store,
        &conformance::Listings {
            pending: &|s: &Store| Ok(s.pending_intents(&all)?.items),
            duplicates: &|s: &Store| Ok(s.duplicate_candidates(&all)?.items),
        },
    )
}

#[test]
fn the_engine_passes_the_version_cases() -> Result<(), String> {
    let (store, _dir) = on_file(ManualClock::new(1_700_000_000_000)).map_err(|e| e.to_string())?;
    conformance::versions(&store)
}

#[test]
fn the_engine_passes_the_tally_cases() -> Result<(), String> {
    let clock = ManualClock::new(1_700_000_000_000);
    let (store, _dir) = on_file(clock.clone()).map_err(|e| e.to_string())?;
    conformance::tallies(&store, &clock)
}

#[test]
fn the_engine_passes_the_key_reconciliation_cases() -> Result<(), String> {
    let clock = ManualClock::new(1_700_000_000_000);
    let dir = dedupkv_testkit::tempdir();
    let store = Store::builder()
        .clock(clock.clone())
        .reconcile_keys_of("shipments")
        .open(dir.path().join("s.redb"))
        .map_err(|e| e.to_string())?;
    conformance::key_reconciliation(&store, &clock)
}

#[test]
fn the_engine_passes_the_sequencer_cases() -> Result<(), String> {
    let clock = ManualClock::new(1_700_000_000_000);
    let (store, _dir) = on_file(clock.clone()).map_err(|e| e.to_string())?;
    conformance::sequencer(&store, &store, &clock)
}
