//! Runs a prefix of a workload through one contender instance with
//! concurrent worker threads, timing each operation.

use std::collections::HashSet;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::contender::{Instance, Key16, Result, Worker};
use crate::workload::{OpKind, Workload, outcome_for};

/// The outcome of one timed run.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Keys processed.
    pub ops: usize,
    /// Distinct keys among those processed: the count of "new" answers a
    /// correct engine gives, whatever the interleaving of workers.
    pub expected_new: u64,
    /// From the start signal until every worker is done and the instance
    /// has made everything durable.
    pub elapsed: Duration,
    /// Keys the engine answered as new.
    pub new_keys: u64,
    /// Latency of each operation (each batch for batched workloads), in
    /// nanoseconds, sorted.
    pub latencies_ns: Vec<u64>,
}

impl Measured {
    /// Keys per second.
    #[allow(clippy::cast_precision_loss)] // op counts are far below 2^53
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q`-quantile (0..=1) of the operation latencies, nearest rank.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_sign_loss,
        clippy::cast_possible_truncation
    )] // a rank computed from a count and a fraction in [0, 1]
    pub fn latency_ns(&self, q: f64) -> u64 {
        if self.latencies_ns.is_empty() {
            return 0;
        }
        let rank = (q * self.latencies_ns.len() as f64).ceil() as usize;
        self.latencies_ns[rank.clamp(1, self.latencies_ns.len()) - 1]
    }
}

/// What one worker did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Share {
    pub(crate) new: u64,
    /// One entry per chunk done; chunk `id + i * workers` took `lat[i]` ns.
    pub(crate) lat: Vec<u64>,
}

/// Runs the first `n` operations of `w` (rounded with [`Workload::fit`]) on
/// `instance`. With a `budget`, each worker stops after the batch during
/// which the budget ran out, so the run covers the chunks each worker got
/// through. Worker handles are made before the clock starts and dropped
/// after it stops.
pub fn run(
    instance: &dyn Instance,
    w: &Workload,
    n: usize,
    budget: Option<Duration>,
) -> Result<Measured> {
    let n = w.fit(n);
    let ids: Vec<usize> = (0..w.spec.workers).collect();
    let (shares, elapsed) = run_workers(instance, w, n, budget, &ids, || Ok(()))?;
    Ok(measured(w, n, shares, elapsed))
}

/// Runs workers `ids` of `w` (of `w.spec.workers`) on `instance`, one
/// thread each, over the first `n` (fitted) operations; `go` is called once
/// every worker's handle is made, and the clock starts when it returns.
/// Returns each worker's share, in the order of `ids`, and the time until
/// all are done and the instance made everything durable.
pub(crate) fn run_workers(
    instance: &dyn Instance,
    w: &Workload,
    n: usize,
    budget: Option<Duration>,
    ids: &[usize],
    go: impl FnOnce() -> Result<()>,
) -> Result<(Vec<Share>, Duration)> {
    let chunks = n.div_ceil(w.spec.batch);
    let handles = ids
        .iter()
        .map(|_| instance.worker())
        .collect::<Result<Vec<_>>>()?;
    let barrier = Barrier::new(ids.len() + 1);
    let abort = AtomicBool::new(false);
    let (elapsed, shares) = std::thread::scope(|s| {
        let (barrier, abort) = (&barrier, &abort);
        let threads: Vec<_> = handles
            .into_iter()
            .zip(ids)
            .map(|(mut handle, &id)| {
                s.spawn(move || {
                    barrier.wait();
                    if abort.load(Ordering::Relaxed) {
                        return (handle, Err("not started".into()));
                    }
                    let res = drive(&mut *handle, w, id, chunks, n, budget);
                    (handle, res)
                })
            })
            .collect();
        let started = go();
        abort.store(started.is_err(), Ordering::Relaxed);
        barrier.wait();
        let start = Instant::now();
        let mut shares = Vec::with_capacity(ids.len());
        let mut kept = Vec::with_capacity(ids.len());
        for t in threads {
            match t.join() {
                Ok((handle, res)) => {
                    kept.push(handle);
                    shares.push(res);
                }
                Err(_) => shares.push(Err("a worker thread panicked".into())),
            }
        }
        let finished = started.and_then(|()| instance.finish());
        let elapsed = start.elapsed();
        drop(kept);
        (elapsed, finished.map(|()| shares))
    });
    Ok((shares?.into_iter().collect::<Result<Vec<_>>>()?, elapsed))
}

/// The run's figures from every worker's share, `shares[id]` being worker
/// `id`'s, over the first `n` (fitted) operations of `w`.
pub(crate) fn measured(w: &Workload, n: usize, shares: Vec<Share>, elapsed: Duration) -> Measured {
    let workers = w.spec.workers;
    let chunks = n.div_ceil(w.spec.batch);
    let done: usize = shares.iter().map(|s| s.lat.len()).sum();
    let (ops, expected_new) = if done == chunks {
        (n, w.expected_new(n))
    } else {
        let mut seen: HashSet<&Key16> = HashSet::new();
        let mut ops = 0;
        for (id, share) in shares.iter().enumerate() {
            for i in 0..share.lat.len() {
                let keys = w.chunk(id + i * workers, n);
                ops += keys.len();
                seen.extend(keys);
            }
        }
        (ops, seen.len() as u64)
    };
    let new_keys = shares.iter().map(|s| s.new).sum();
    let mut latencies_ns: Vec<u64> = shares.into_iter().flat_map(|s| s.lat).collect();
    latencies_ns.sort_unstable();
    Measured {
        ops,
        expected_new,
        elapsed,
        new_keys,
        latencies_ns,
    }
}

/// One worker's share: chunks `id, id + workers, ...`.
pub(crate) fn drive(
    handle: &mut dyn Worker,
    w: &Workload,
    id: usize,
    chunks: usize,
    n: usize,
    budget: Option<Duration>,
) -> Result<Share> {
    let start = Instant::now();
    let workers = w.spec.workers;
    let mut lat = Vec::with_capacity(chunks / workers + 1);
    let mut new = 0u64;
    for j in (id..chunks).step_by(workers) {
        let keys = w.chunk(j, n);
        let t = Instant::now();
        new += match w.spec.kind {
            OpKind::Insert => handle.insert_batch(keys)? as u64,
            OpKind::BeginComplete => {
                u64::from(handle.begin_complete(&keys[0], &outcome_for(&keys[0]))?)
            }
        };
        lat.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
        if budget.is_some_and(|b| start.elapsed() >= b) {
            break;
        }
    }
    Ok(Share { new, lat })
}
