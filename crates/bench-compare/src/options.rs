//! Command-line options and environment of the comparison bench.

use crate::contender::Result;

/// Seconds per timed run at scale 1.
pub const DEFAULT_SECS: f64 = 1.5;

/// What to run and where to write.
#[derive(Debug)]
pub struct Options {
    /// Multiplies sequence lengths (and, below 1, the time budget).
    pub scale: f64,
    /// Timed runs per contender and scenario; the median is reported.
    pub runs: usize,
    /// Time budget of one timed run, in seconds.
    pub secs: f64,
    /// Scenario names to run; empty = all.
    pub scenarios: Vec<String>,
    /// Contender ids to run; empty = all.
    pub contenders: Vec<String>,
    /// Also write `docs/bench/compare.svg`.
    pub update_docs: bool,
    /// Seconds the whole run may spend waiting for other processes to go
    /// quiet and re-running disturbed scenarios.
    pub quiet_wait: f64,
    /// Started without `--bench` (`cargo test --benches`): a tiny smoke
    /// run that writes no files.
    pub test_mode: bool,
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={v} is not a valid value").into()),
        _ => Ok(None),
    }
}

/// Options from the arguments and the environment (see `benches/compare.rs`).
pub fn parse_options() -> Result<Options> {
    let mut quick = false;
    let mut runs = env_parse::<usize>("DEDUPKV_BENCH_RUNS")?;
    let mut secs = env_parse::<f64>("DEDUPKV_BENCH_SECS")?;
    let mut quiet_wait = env_parse::<f64>("DEDUPKV_BENCH_QUIET_WAIT")?;
    let mut scenarios = Vec::new();
    let mut contenders = Vec::new();
    let mut update_docs =
        std::env::var("DEDUPKV_BENCH_UPDATE_DOCS").is_ok_and(|v| v == "1" || v == "true");
    let mut bench = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = |what: &str| -> Result<String> {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{what} needs a value").into())
        };
        match flag.as_str() {
            "--bench" => bench = true,
            "--quick" => quick = true,
            "--update-docs" => update_docs = true,
            "--scenario" => scenarios.extend(value("--scenario")?.split(',').map(str::to_owned)),
            "--contender" => contenders.extend(value("--contender")?.split(',').map(str::to_owned)),
            "--runs" => {
                runs = Some(
                    value("--runs")?
                        .parse()
                        .map_err(|_| "--runs needs a number")?,
                );
            }
            "--quiet-wait" => {
                quiet_wait = Some(
                    value("--quiet-wait")?
                        .parse()
                        .map_err(|_| "--quiet-wait needs a number")?,
                );
            }
            "--secs" => {
                secs = Some(
                    value("--secs")?
                        .parse()
                        .map_err(|_| "--secs needs a number")?,
                );
            }
            _ => {} // filters, anything else
        }
    }
    // Like criterion: without cargo bench's `--bench`, only smoke-test.
    let test_mode = !bench;
    let small = if test_mode {
        Some(0.01)
    } else {
        quick.then_some(0.1)
    };
    let scale = env_parse::<f64>("DEDUPKV_BENCH_SCALE")?.unwrap_or(small.unwrap_or(1.0));
    if !(scale > 0.0 && scale.is_finite()) {
        return Err("DEDUPKV_BENCH_SCALE must be a positive number".into());
    }
    Ok(Options {
        scale,
        runs: runs.unwrap_or(if small.is_some() { 1 } else { 3 }).max(1),
        secs: secs.unwrap_or(DEFAULT_SECS * scale.min(1.0)),
        scenarios,
        contenders,
        update_docs: update_docs && !test_mode,
        quiet_wait: quiet_wait
            .unwrap_or(if small.is_some() { 0.0 } else { 300.0 })
            .max(0.0),
        test_mode,
    })
}
