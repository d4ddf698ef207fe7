//! Results of a comparison run and their text forms: markdown tables, CSV,
//! JSON (hand-written; no serde_json dependency).

#![allow(clippy::doc_markdown)] // product names (PostgreSQL, SQLite) are not code

use std::fmt::Write as _;

/// The contender every ratio is taken against.
pub const BASELINE: &str = "dedupkv-immediate";

/// One contender's results in one scenario.
#[derive(Debug, Clone)]
pub struct Row {
    /// Contender id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Durability label.
    pub durability: String,
    /// Keys covered by the median run.
    pub ops_per_run: usize,
    /// Keys per second of each timed run, in run order.
    pub runs: Vec<f64>,
    /// Median of `runs`.
    pub median: f64,
    /// Latency quantiles (ns) of the median run.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// New keys reported by the median run (checked against the model).
    pub new_keys: u64,
}

/// One scenario's results.
#[derive(Debug, Clone)]
pub struct ScenarioReport {
    /// Short name (`key-w16`).
    pub name: String,
    /// One-line description.
    pub title: String,
    /// Worker threads.
    pub workers: usize,
    /// Keys per commit.
    pub batch: usize,
    /// Fraction of operations repeating an earlier key.
    pub dup_ratio: f64,
    /// How repeats pick their key.
    pub repeats: String,
    /// What one latency sample covers.
    pub latency_unit: String,
    /// Keys in the check run every contender ran.
    pub check_ops: usize,
    /// New keys the model expects in the check run.
    pub check_new: u64,
    /// Per contender.
    pub rows: Vec<Row>,
    /// Skips and errors.
    pub notes: Vec<String>,
    /// Cores other processes (kernel threads included) used on average
    /// while the in-process contenders ran: near 0 on a quiet machine.
    pub other_cpu_cores: Option<f64>,
}

impl ScenarioReport {
    /// Median ops/s of the contender `id`.
    pub fn median_of(&self, id: &str) -> Option<f64> {
        self.rows.iter().find(|r| r.id == id).map(|r| r.median)
    }

    /// How many times faster the baseline is than the contender `id`.
    pub fn baseline_ratio(&self, id: &str) -> Option<f64> {
        Some(self.median_of(BASELINE)? / self.median_of(id)?)
    }
}

/// The median of `v` (mean of the middle two for an even count).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        f64::midpoint(s[m - 1], s[m])
    }
}

/// `1234567.8` as `1,234,568`.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // rounded, non-negative rate
pub fn thousands(x: f64) -> String {
    let digits = (x.max(0.0).round() as u64).to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A latency in ns with three significant digits and a unit.
#[allow(clippy::cast_precision_loss)] // display only
pub fn duration_ns(ns: u64) -> String {
    let (v, unit) = match ns {
        0..1_000 => return format!("{ns} ns"),
        1_000..1_000_000 => (ns as f64 / 1e3, "µs"),
        1_000_000..1_000_000_000 => (ns as f64 / 1e6, "ms"),
        _ => (ns as f64 / 1e9, "s"),
    };
    if v >= 100.0 {
        format!("{v:.0} {unit}")
    } else if v >= 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

/// A ratio as `12.3×`, `0.042×`.
pub fn ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}×")
    } else if r >= 10.0 {
        format!("{r:.1}×")
    } else if r >= 0.1 {
        format!("{r:.2}×")
    } else {
        // Two significant digits.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a small digit count
        let digits = (-r.max(1e-12).log10()).ceil() as usize + 1;
        format!("{r:.digits$}×")
    }
}

/// The scenario's markdown section: heading, parameters and table.
pub fn markdown(s: &ScenarioReport, runs: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "### {} — {}\n", s.name, s.title);
    let _ = writeln!(
        out,
        "{} worker(s), {} key(s) per commit, {:.0}% duplicates ({} repeats); latency is {}; \
         ops/s = keys/s, median of {runs} run(s); every contender first ran the same {}-key check \
         workload and reported {} new keys.\n",
        s.workers,
        s.batch,
        s.dup_ratio * 100.0,
        s.repeats,
        s.latency_unit,
        thousands(count(s.check_ops)),
        thousands(u64_f64(s.check_new)),
    );
    let _ = writeln!(
        out,
        "| contender | durability | keys/run | ops/s | p50 | p99 | p99.9 | dedupkv Immediate ÷ this |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|");
    for r in &s.rows {
        let vs = s
            .baseline_ratio(&r.id)
            .map_or_else(|| "n/a".to_owned(), ratio);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.durability,
            thousands(count(r.ops_per_run)),
            thousands(r.median),
            duration_ns(r.p50_ns),
            duration_ns(r.p99_ns),
            duration_ns(r.p999_ns),
            vs
        );
    }
    for n in &s.notes {
        let _ = writeln!(out, "\n_{n}_");
    }
    if let Some(c) = s.other_cpu_cores {
        let _ = writeln!(
            out,
            "\n_Other processes (kernel threads included) used {c:.2} cores on average while the \
             in-process contenders ran._"
        );
    }
    out
}

/// A count as f64 for display.
#[allow(clippy::cast_precision_loss)] // counts far below 2^53
pub fn count(n: usize) -> f64 {
    n as f64
}

#[allow(clippy::cast_precision_loss)] // counts far below 2^53
fn u64_f64(n: u64) -> f64 {
    n as f64
}

/// Every row of every scenario as CSV with a header line.
pub fn csv(all: &[ScenarioReport]) -> String {
    let mut out = String::from(
        "scenario,contender_id,contender,durability,workers,batch,dup_ratio,repeats,latency_unit,\
         keys_per_run,runs,ops_per_sec_median,ops_per_sec_min,ops_per_sec_max,p50_us,p99_us,p999_us,\
         new_keys,dedupkv_immediate_over_this\n",
    );
    for s in all {
        for r in &s.rows {
            let min = r.runs.iter().copied().fold(f64::INFINITY, f64::min);
            let max = r.runs.iter().copied().fold(0.0, f64::max);
            let vs = s
                .baseline_ratio(&r.id)
                .map_or_else(String::new, |x| format!("{x:.3}"));
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{},{}",
                s.name,
                r.id,
                csv_field(&r.name),
                csv_field(&r.durability),
                s.workers,
                s.batch,
                s.dup_ratio,
                csv_field(&s.repeats),
                csv_field(&s.latency_unit),
                r.ops_per_run,
                r.runs.len(),
                r.median,
                min,
                max,
                u64_f64(r.p50_ns) / 1e3,
                u64_f64(r.p99_ns) / 1e3,
                u64_f64(r.p999_ns) / 1e3,
                r.new_keys,
                vs
            );
        }
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "null".into()
    }
}

/// The whole run as one JSON document: `meta` (key/value strings), the
/// scenarios with their rows, and the target lines.
pub fn json(
    meta: &[(String, String)],
    all: &[ScenarioReport],
    targets: &[crate::targets::Outcome],
) -> String {
    let mut out = String::from("{\n  \"meta\": {");
    for (i, (k, v)) in meta.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}\n    {}: {}", json_str(k), json_str(v));
    }
    out.push_str("\n  },\n  \"scenarios\": [");
    for (i, s) in all.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            out,
            "{sep}\n    {{\"name\": {}, \"title\": {}, \"workers\": {}, \"batch\": {}, \"dup_ratio\": {}, \
             \"repeats\": {}, \"latency_unit\": {}, \"check_ops\": {}, \"check_new_keys\": {}, \"other_cpu_cores\": {}, \"notes\": [{}], \"rows\": [",
            json_str(&s.name),
            json_str(&s.title),
            s.workers,
            s.batch,
            s.dup_ratio,
            json_str(&s.repeats),
            json_str(&s.latency_unit),
            s.check_ops,
            s.check_new,
            s.other_cpu_cores.map_or_else(|| "null".into(), json_num),
            s.notes
                .iter()
                .map(|n| json_str(n))
                .collect::<Vec<_>>()
                .join(", "),
        );
        for (j, r) in s.rows.iter().enumerate() {
            let sep = if j == 0 { "" } else { "," };
            let _ = write!(
                out,
                "{sep}\n      {{\"id\": {}, \"name\": {}, \"durability\": {}, \"keys_per_run\": {}, \
                 \"ops_per_sec_runs\": [{}], \"ops_per_sec_median\": {}, \"p50_ns\": {}, \"p99_ns\": {}, \
                 \"p999_ns\": {}, \"new_keys\": {}, \"dedupkv_immediate_over_this\": {}}}",
                json_str(&r.id),
                json_str(&r.name),
                json_str(&r.durability),
                r.ops_per_run,
                r.runs
                    .iter()
                    .map(|&x| json_num(x))
                    .collect::<Vec<_>>()
                    .join(", "),
                json_num(r.median),
                r.p50_ns,
                r.p99_ns,
                r.p999_ns,
                r.new_keys,
                s.baseline_ratio(&r.id)
                    .map_or_else(|| "null".into(), json_num),
            );
        }
        out.push_str("\n    ]}");
    }
    out.push_str("\n  ],\n  \"targets\": [");
    for (i, t) in targets.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            out,
            "{sep}\n    {{\"target\": {}, \"scenario\": {}, \"rival\": {}, \"min_ratio\": {}, \"ratio\": {}, \"met\": {}}}",
            json_str(&t.target.what),
            json_str(t.target.scenario),
            json_str(t.target.rival),
            json_num(t.target.min_ratio),
            t.ratio.map_or_else(|| "null".into(), json_num),
            t.met().map_or_else(|| "null".into(), |m| m.to_string()),
        );
    }
    out.push_str("\n  ]\n}\n");
    out
}
