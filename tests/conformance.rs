//! The contract's conformance suite (`dedupkv_testkit::conformance`) run
//! against the engine: on a file, and on the fault backend's memory, in
//! both durability modes; and against the specification itself (which
//! checks the driver and its races, not the spec).

use std::time::Duration;

use dedupkv::{Durability, Store};
use dedupkv_testkit::conformance::{self, Suite};
use dedupkv_testkit::{FaultBackend, tempdir};

#[test]
fn the_engine_on_a_file_passes_the_conformance_suite() -> Result<(), String> {
    conformance::run(
        |clock| {
            let dir = tempdir();
            let store = Store::builder()
                .clock(clock)
                .open(dir.path().join("s.redb"))?;
            Ok((store, dir))
        },
        Suite::default(),
    )
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
