//! Runs the main job, `crates/consumer/src/main.rs`, as a test: its first life is
//! a child process killed (SIGKILL) mid-stream, its second life reopens the store,
//! and it fails (panics) if any effect did not happen exactly once. Built
//! without the test harness, so the job can re-execute this binary as
//! its child; libtest's arguments are read as the other such tests read
//! them (`tests/child/mod.rs`).

use std::process::ExitCode;

#[path = "../crates/consumer/src/main.rs"]
mod consumer;

#[path = "child/mod.rs"]
mod child;

fn main() -> ExitCode {
    child::main(
        "DEDUPKV_CONSUMER_CHILD",
        || consumer::main().expect("the consumer's first life"),
        &[("consumer_example", consumer::main)],
    )
}
