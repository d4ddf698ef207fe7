//! Issue #31's webhook on two instances over one PostgreSQL, as a test:
//! 500 orders, each fired at both instances at once with the same key;
//! 0 double charges, every client gets the first response
//! (examples/webhook.rs, run here). Skips without `DEDUPKV_PG_URL`,
//! fails instead under CI.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL) are not code

#[path = "../examples/webhook.rs"]
mod webhook;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_charge_each_order_once()
-> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let Some(url) = dedupkv_testkit::pg_url("two_instances_charge_each_order_once") else {
        return Ok(());
    };
    let schema = format!("webhook_test_{}", std::process::id());
    let report = webhook::run(&url, &schema, 500, 16).await?;
    eprintln!("{report:?}");
    assert_eq!(report.double_charges, 0, "{report:?}");
    assert_eq!(report.uncharged, 0, "{report:?}");
    assert_eq!(report.different_answers, 0, "{report:?}");
    // Of each order's two requests one ran and the other was a replay.
    assert_eq!(report.replays, report.orders, "{report:?}");
    Ok(())
}
