//! Runs the main job, `examples/consumer.rs`, as a test: its first life is
//! a child process killed (SIGKILL) mid-stream, its second life reopens the store,
//! and it fails (panics) if any effect happened twice or a payment was not
//! charged exactly once. Built without the test harness, so the example can
//! re-execute this binary as its child.

#[path = "../examples/consumer.rs"]
mod consumer;

fn main() -> dedupkv::Result<()> {
    // `cargo test <filter>` passes the filter on; run only when it matches.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if std::env::var_os("DEDUPKV_CONSUMER_CHILD").is_none()
        && !filters.is_empty()
        && !filters
            .iter()
            .any(|f| "consumer_example".contains(f.as_str()))
    {
        return Ok(());
    }
    consumer::main()
}
