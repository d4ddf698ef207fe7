//! Workers as several processes on one shared instance (scenarios with
//! [`Scenario::processes`] > 1): the bench binary runs itself once per
//! process with [`CHILD_FLAG`], each process attaches to the instance the
//! parent opened ([`Contender::attach`]) and runs its workers as threads,
//! so a store's in-process sharing (a pool, a group commit) is split the way
//! separate application instances would split it.
//!
//! The protocol, one line each, on the child's stdin and stdout: the child
//! says `ready` once its workers' handles are made; the parent starts the
//! clock and says `go` to every child; each child answers
//! `share ID NEW LAT…` per worker (the worker's id, its new keys, each
//! chunk's latency in ns) and exits. The clock stops when every child has
//! exited and the instance made everything durable. Worker `id` runs in
//! process `id % processes`, over the same chunks as in a threads-only run.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::contender::{Contender, Instance, Result};
use crate::runner::{self, Measured, Share};
use crate::scenarios::{self, Scenario};
use crate::workload::Workload;
use crate::{lineup, machine};

/// The flag that makes the bench binary a worker process.
pub const CHILD_FLAG: &str = "--worker-process";

/// Whether this process was started as a worker process.
///
/// # Examples
///
/// ```
/// assert!(!dedupkv_bench_compare::processes::is_child());
/// ```
pub fn is_child() -> bool {
    std::env::args().any(|a| a == CHILD_FLAG)
}

/// Runs the first `n` operations of `w` (rounded with [`Workload::fit`]) as
/// `sc.processes` processes attached to `instance`, which `c` opened, with
/// the workload generated at `scale`; `budget` as in [`runner::run`].
///
/// # Errors
/// When the instance cannot be shared, a process cannot be started, or a
/// process fails (its own message goes to stderr).
///
/// # Examples
///
/// ```no_run
/// use dedupkv_bench_compare::contender::Contender;
/// use dedupkv_bench_compare::{pg, processes, scenarios, workload::Workload};
///
/// let c = pg::Postgres::connect("host=127.0.0.1 user=postgres")?;
/// let sc = scenarios::all().into_iter().find(|s| s.name == "key-w16-p4").unwrap();
/// let w = Workload::generate(sc.spec(0.01));
/// let inst = c.open(w.keys.len())?;
/// let m = processes::run(&c, &*inst, &sc, &w, 0.01, w.keys.len(), None)?;
/// assert_eq!(m.new_keys, m.expected_new);
/// # Ok::<(), dedupkv_bench_compare::contender::Error>(())
/// ```
pub fn run(
    c: &dyn Contender,
    instance: &dyn Instance,
    sc: &Scenario,
    w: &Workload,
    scale: f64,
    n: usize,
    budget: Option<Duration>,
) -> Result<Measured> {
    let name = instance
        .shared_name()
        .ok_or_else(|| format!("{}: its instances cannot be shared by processes", c.name()))?;
    let n = w.fit(n);
    let exe = std::env::current_exe()?;
    let mut kids = Kids(Vec::with_capacity(sc.processes));
    for part in 0..sc.processes {
        let mut cmd = Command::new(&exe);
        cmd.args([CHILD_FLAG, "--contender", c.id(), "--scenario", sc.name])
            .args(["--attach", name.as_str()])
            .args(["--part", &part.to_string(), "--ops", &n.to_string()])
            .args(["--scale", &scale.to_string()]);
        if let Some(b) = budget {
            cmd.args(["--budget-secs", &b.as_secs_f64().to_string()]);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        kids.0.push((child, stdin, stdout.map(BufReader::new)));
    }
    for (_, _, out) in &mut kids.0 {
        let line = read_line(out)?;
        if line != "ready" {
            return Err(format!("a worker process said {line:?} instead of ready").into());
        }
    }
    let start = Instant::now();
    for (_, stdin, _) in &mut kids.0 {
        let stdin = stdin.as_mut().ok_or("no stdin")?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
    }
    let mut shares: Vec<Option<Share>> = (0..w.spec.workers).map(|_| None).collect();
    for (child, stdin, out) in &mut kids.0 {
        drop(stdin.take());
        loop {
            let line = read_line(out)?;
            if line.is_empty() {
                break;
            }
            let (id, share) = parse_share(&line)?;
            *shares.get_mut(id).ok_or("a worker id out of range")? = Some(share);
        }
        let status = child.wait()?;
        if !status.success() {
            return Err(
                format!("a worker process failed ({status}); see its message above").into(),
            );
        }
    }
    instance.finish()?;
    let elapsed = start.elapsed();
    let shares = shares
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or("a worker process did not report every worker")?;
    Ok(runner::measured(w, n, shares, elapsed))
}

/// The worker processes, killed if still running when dropped (the parent
/// gave up on them).
struct Kids(Vec<(Child, Option<ChildStdin>, Option<BufReader<ChildStdout>>)>);

impl Drop for Kids {
    fn drop(&mut self) {
        for (child, _, _) in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// One line without its newline; empty at the end of the stream.
fn read_line(out: &mut Option<BufReader<ChildStdout>>) -> Result<String> {
    let mut line = String::new();
    out.as_mut().ok_or("no stdout")?.read_line(&mut line)?;
    Ok(line.trim_end().to_owned())
}

fn share_line(id: usize, share: &Share) -> String {
    let mut line = format!("share {id} {}", share.new);
    for l in &share.lat {
        line.push(' ');
        line.push_str(&l.to_string());
    }
    line
}

fn parse_share(line: &str) -> Result<(usize, Share)> {
    let bad = || format!("a worker process said {line:?}, not a share");
    let mut f = line.split(' ');
    if f.next() != Some("share") {
        return Err(bad().into());
    }
    let mut num = || -> Result<u64> { Ok(f.next().ok_or_else(bad)?.parse().map_err(|_| bad())?) };
    let id = usize::try_from(num()?)?;
    let new = num()?;
    let lat = f
        .map(|v| v.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    Ok((id, Share { new, lat }))
}

/// The worker process's `main`: attaches, runs its workers when told to,
/// reports their shares (see the module docs).
///
/// # Errors
/// Bad arguments, an unknown contender or scenario, or a failed worker.
///
/// # Examples
///
/// ```no_run
/// // In the bench's `main`, before anything else:
/// if dedupkv_bench_compare::processes::is_child() {
///     dedupkv_bench_compare::processes::child_main()?;
/// }
/// # Ok::<(), dedupkv_bench_compare::contender::Error>(())
/// ```
pub fn child_main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str| -> Result<&str> {
        let at = args.iter().position(|a| a == flag);
        Ok(at
            .and_then(|i| args.get(i + 1))
            .ok_or_else(|| format!("a worker process needs {flag}"))?)
    };
    let num = |flag: &str| -> Result<f64> { Ok(arg(flag)?.parse::<f64>()?) };
    let lineup = lineup::all(lineup::pg_url_from_env().as_deref())?;
    let id = arg("--contender")?;
    let c = lineup
        .contenders
        .iter()
        .find(|c| c.id() == id)
        .ok_or_else(|| format!("no contender {id} here"))?;
    let name = arg("--scenario")?;
    let sc = scenarios::all()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| format!("no scenario {name}"))?;
    let w = Workload::generate(sc.spec(num("--scale")?));
    let part: usize = arg("--part")?.parse()?;
    let n: usize = arg("--ops")?.parse()?;
    let budget = match arg("--budget-secs") {
        Ok(v) => Some(Duration::from_secs_f64(v.parse()?)),
        Err(_) => None,
    };
    let inst = c.attach(arg("--attach")?)?;
    let ids: Vec<usize> = (part..sc.workers).step_by(sc.processes.max(1)).collect();
    let go = || -> Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        if line.trim_end() == "go" {
            Ok(())
        } else {
            Err(format!("{} told {line:?} instead of go", machine::clock()).into())
        }
    };
    let (shares, _) = runner::run_workers(&*inst, &w, n, budget, &ids, go)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (id, share) in ids.iter().zip(&shares) {
        writeln!(out, "{}", share_line(*id, share))?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A share survives the line it is sent as, and a line that is not a
    /// share is an error, not a zero.
    #[test]
    fn shares_travel_as_lines() -> Result<()> {
        let share = Share {
            new: 3,
            lat: vec![10, 20, 30],
        };
        assert_eq!(parse_share(&share_line(7, &share))?, (7, share));
        assert_eq!(parse_share("share 0 0")?, (0, Share::default()));
        assert!(parse_share("ready").is_err());
        assert!(parse_share("share 1 x 2").is_err());
        Ok(())
    }
}
