//! The comparison harness's performance targets, checked against one run's medians.
//! Every ratio is dedupkv Immediate (durable) over a rival at equal or
//! weaker durability, measured side by side in the same run.

use std::fmt::Write as _;

use crate::report::{ScenarioReport, ratio};

/// "In `scenario`, dedupkv Immediate is at least `min_ratio` times `rival`."
#[derive(Debug, Clone)]
pub struct Target {
    /// The claim in words.
    pub what: String,
    /// Scenario name.
    pub scenario: &'static str,
    /// Contender id of the rival.
    pub rival: &'static str,
    /// Required dedupkv Immediate ÷ rival.
    pub min_ratio: f64,
}

/// A target and what was measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The target.
    pub target: Target,
    /// Measured ratio, if both sides ran.
    pub ratio: Option<f64>,
}

impl Outcome {
    /// `None` when not measured.
    pub fn met(&self) -> Option<bool> {
        self.ratio.map(|r| r >= self.target.min_ratio)
    }
}

fn t(what: &str, scenario: &'static str, rival: &'static str, min_ratio: f64) -> Target {
    Target {
        what: format!("{what} ({scenario}): dedupkv Immediate >= {min_ratio}x {rival}"),
        scenario,
        rival,
        min_ratio,
    }
}

/// The targets, in report order.
pub fn list() -> Vec<Target> {
    vec![
        t("batched durable inserts", "batch-w1", "postgres", 10.0),
        t("batched durable inserts", "batch-w4", "postgres", 10.0),
        t("batched durable inserts", "batch-w1", "sqlite-full", 3.0),
        t("batched durable inserts", "batch-w4", "sqlite-full", 3.0),
        t("one key per op, 16 workers", "key-w16", "sqlite-full", 20.0),
        t("one key per op, 16 workers", "key-w16", "postgres", 5.0),
        t(
            "50% duplicates, one key per op",
            "dup50-w16",
            "sqlite-full",
            50.0,
        ),
        t(
            "50% duplicates, batches",
            "dup50-batch-w4",
            "sqlite-full",
            50.0,
        ),
    ]
}

/// Checks each target against the scenarios that ran.
pub fn evaluate(all: &[ScenarioReport]) -> Vec<Outcome> {
    list()
        .into_iter()
        .map(|target| {
            let ratio = all
                .iter()
                .find(|s| s.name == target.scenario)
                .and_then(|s| s.baseline_ratio(target.rival));
            Outcome { target, ratio }
        })
        .collect()
}

/// The "targets" block for stdout.
pub fn block(outcomes: &[Outcome]) -> String {
    let mut out = String::from("## Targets\n\n```\n");
    for o in outcomes {
        let verdict = match (o.met(), o.ratio) {
            (Some(true), Some(r)) => format!("met     (measured {})", ratio(r)),
            (Some(false), Some(r)) => format!("NOT MET (measured {})", ratio(r)),
            _ => "not measured".to_owned(),
        };
        let _ = writeln!(out, "{verdict:<26} {}", o.target.what);
    }
    out.push_str("```\n");
    if outcomes.iter().any(|o| o.ratio.is_none()) {
        out.push_str("\n_not measured: the scenario or the rival did not run._\n");
    }
    out
}
