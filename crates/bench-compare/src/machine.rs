//! Facts about the machine, and how much CPU other processes take from a
//! run (the machine may be shared).

use std::time::{Duration, Instant};

/// Facts about the machine and the engines, for the header and the JSON.
pub fn machine_facts(pg: Option<&crate::pg::Postgres>) -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mem = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    let tmp = std::env::temp_dir();
    let mounts = read("/proc/mounts");
    let mount = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && tmp.starts_with(f[1]))
                .then(|| (f[1].len(), format!("{} on {} ({})", f[0], f[1], f[2])))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, m)| m)
        .unwrap_or_default();
    let mut facts = vec![
        ("date".to_owned(), utc_date()),
        ("cpu".to_owned(), format!("{cpu}, {cores} cores")),
        ("memory".to_owned(), mem),
        (
            "kernel".to_owned(),
            read("/proc/sys/kernel/osrelease").trim().to_owned(),
        ),
        (
            "temp dir".to_owned(),
            format!("{} — {mount}", tmp.display()),
        ),
        ("dedupkv".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        (
            "redb".to_owned(),
            "4.6 (raw table contender; also dedupkv's log)".to_owned(),
        ),
        (
            "sqlite".to_owned(),
            format!("{} (bundled by rusqlite 0.37)", rusqlite::version()),
        ),
    ];
    if let Some(pg) = pg {
        facts.push((
            "postgres".to_owned(),
            pg.settings()
                .unwrap_or_else(|e| format!("settings unavailable: {e}")),
        ));
    }
    facts
}

/// Today's UTC date, `YYYY-MM-DD`.
fn utc_date() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut date = crate::civil::rfc3339(ms);
    date.truncate(10);
    date
}

/// The time of day (UTC), for progress lines.
pub fn clock() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        % 86_400;
    format!("{:02}:{:02}:{:02}", t / 3_600, t / 60 % 60, t % 60)
}

/// CPU time in clock ticks: (the whole machine busy, this process).
/// Their difference is what other processes (and kernel threads) used.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = f.get(..8)?.iter().sum::<u64>() - f[3] - f[4];
    let me = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = me.rsplit_once(") ")?.1;
    let g: Vec<&str> = after.split_whitespace().collect();
    // utime, stime, and cutime, cstime: worker processes this one started
    // and waited for count as its own.
    let own = g
        .get(11..15)?
        .iter()
        .map(|v| v.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    Some((busy, own))
}

/// CPU that other processes used while `f` ran, in cores on average.
pub fn others_cpu<T>(f: impl FnOnce() -> T) -> (T, Option<(f64, f64)>) {
    let before = cpu_ticks();
    let start = Instant::now();
    let out = f();
    let secs = start.elapsed().as_secs_f64();
    let used = before.zip(cpu_ticks()).map(|((b0, o0), (b1, o1))| {
        // USER_HZ is 100 on Linux.
        #[allow(clippy::cast_precision_loss)] // small tick counts
        let others = b1.saturating_sub(b0).saturating_sub(o1.saturating_sub(o0)) as f64 / 100.0;
        (others, secs)
    });
    (out, used)
}

/// Other processes' CPU use above which a scenario counts as disturbed.
pub const QUIET_CORES: f64 = 0.15;

/// Waits (sampling for a second at a time) until other processes use less
/// than [`QUIET_CORES`], or `allowance` runs out; the time waited is taken
/// from `allowance`.
pub fn wait_for_quiet(allowance: &mut Duration) {
    loop {
        let start = Instant::now();
        let ((), used) = others_cpu(|| std::thread::sleep(Duration::from_secs(1)));
        *allowance = allowance.saturating_sub(start.elapsed());
        match used {
            Some((cpu, secs)) if cpu / secs >= QUIET_CORES && !allowance.is_zero() => {
                if allowance.as_secs().is_multiple_of(15) {
                    eprintln!(
                        "{} other processes use {:.2} cores; waiting (up to {} s more)",
                        clock(),
                        cpu / secs,
                        allowance.as_secs()
                    );
                }
            }
            _ => return,
        }
    }
}
