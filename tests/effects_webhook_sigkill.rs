//! The payment webhook of `tests/webhook/mod.rs` as a test: a handler
//! in a child process, `SIGKILL`ed right after the carrier accepted a call,
//! under a sender that redelivers, duplicates and retries. Asserts each
//! line the harness prints. Built without the test harness, so the harness
//! can re-execute this binary as its child (`tests/child/mod.rs`).

use std::process::ExitCode;

mod webhook;

#[path = "child/mod.rs"]
mod child;

/// One shipment per paid order, whatever the sender and the kills did.
fn every_shipment_exactly_once() -> dedupkv::Result<()> {
    let report = webhook::run()?;
    let text = report.to_string();
    println!("{text}");
    let has = |line: &str| {
        assert!(
            text.lines().any(|l| l == line),
            "missing line {line:?} in:\n{text}"
        );
    };
    // orders = shipments (the undeliverable ones are dead letters instead)
    assert_eq!(report.orders, 200);
    assert_eq!(report.undeliverable.len(), 9);
    assert_eq!(report.shipments, report.orders - report.undeliverable.len());
    assert_eq!(report.shipments, report.expected_shipments);
    has(&format!("orders: {}", report.orders));
    has(&format!("shipments: {}", report.shipments));
    // zero duplicate labels
    assert_eq!(report.duplicate_labels, 0);
    has("duplicate labels: 0");
    assert!(report.labels_match, "a stored label is not the carrier's");
    // every ambiguous call reconciled: each kill left one, found accepted
    assert_eq!(report.kills, 3);
    assert_eq!(report.pending_intents, 0);
    assert!(
        report.reconciled_accepted >= report.kills,
        "{} takeovers found an accepted call, after {} kills",
        report.reconciled_accepted,
        report.kills
    );
    assert!(text.lines().any(|l| l.starts_with(&format!(
        "ambiguous calls reconciled: {} (",
        report.reconciled_accepted
    )) && l.ends_with("; 0 pending)")));
    // dead letters listed with reasons
    let dead: Vec<u64> = report.dead_letters.iter().map(|(o, _)| *o).collect();
    assert_eq!(dead, report.undeliverable);
    // The carrier's refusal, or (when a kill interrupted an order's third
    // attempt) the limit the runner found before a fourth call.
    assert!(
        text.lines()
            .any(|l| l.starts_with("dead letters: 9 (") && l.contains(webhook::REFUSED))
    );
    for (order, r) in &report.dead_letters {
        assert!(webhook::dead_letter_reason(r), "order {order}: {r}");
        has(&format!("  order {order}"));
    }
    // reconciliation clean
    assert!(report.reconciliation_clean);
    has("reconciliation clean: yes");
    assert!(report.exactly_once());
    has("every shipment exactly once: yes");
    Ok(())
}

fn main() -> ExitCode {
    child::main(
        "DEDUPKV_WEBHOOK_CHILD",
        || webhook::main().expect("the webhook handler"),
        &[("every_shipment_exactly_once", every_shipment_exactly_once)],
    )
}
