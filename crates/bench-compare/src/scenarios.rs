//! The scenarios of a comparison run.

use crate::workload::{OpKind, Repeats, Spec, SplitMix64};

/// Exponent of the Zipf repeats (YCSB's default).
pub const ZIPF_S: f64 = 0.99;

/// One workload shape, sized by the run's scale.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name for `--scenario` and the targets.
    pub name: &'static str,
    /// One line for the table heading.
    pub title: &'static str,
    /// Workers, each a thread with its own handle.
    pub workers: usize,
    /// Processes the workers are spread over, each with its own handle on
    /// one shared instance ([`crate::processes`]); 1: all threads of this
    /// process.
    pub processes: usize,
    /// Keys per commit.
    pub batch: usize,
    /// Fraction of operations that repeat an earlier key.
    pub dup_ratio: f64,
    /// How repeats pick their key.
    pub repeats: Repeats,
    /// Insert or begin+complete.
    pub kind: OpKind,
    /// Length of the generated sequence at scale 1: the most keys a timed
    /// run covers (fast contenders); slower ones stop at the time budget.
    pub max_ops: usize,
}

impl Scenario {
    /// The workload spec at `scale`.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )] // sizes
    pub fn spec(&self, scale: f64) -> Spec {
        let round = self.workers * self.batch;
        let ops = ((self.max_ops as f64 * scale) as usize).max(4 * round);
        // The same keys as threads and as processes: seeded by the name
        // without its `-pN`.
        let family = match self.processes {
            1 => self.name,
            _ => self.name.rsplit_once("-p").map_or(self.name, |(f, _)| f),
        };
        // Wrapping, as release builds always did: a debug build overflowed
        // on the longer names (`dup10-batch-w4`).
        let hash = family.bytes().fold(0x5eed_u64, |h, b| {
            h.wrapping_mul(31).wrapping_add(u64::from(b))
        });
        let mut seed = SplitMix64::new(hash);
        Spec {
            ops,
            dup_ratio: self.dup_ratio,
            repeats: self.repeats,
            workers: self.workers,
            batch: self.batch,
            kind: self.kind,
            seed: seed.next_u64(),
        }
    }

    /// Keys in the check run every contender runs first (also its
    /// calibration): two rounds, and about 1,000 keys at scale 1.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )] // sizes
    pub fn check_ops(&self, scale: f64) -> usize {
        let round = self.workers * self.batch;
        ((1_000.0 * scale.min(1.0)) as usize)
            .max(100)
            .max(2 * round)
    }

    /// What one latency sample covers.
    pub fn latency_unit(&self) -> String {
        match (self.kind, self.batch) {
            (OpKind::BeginComplete, _) => "per begin+complete round".into(),
            (OpKind::Insert, 1) => "per operation (one key)".into(),
            (OpKind::Insert, b) => format!("per batch of {b} keys (one commit)"),
        }
    }
}

/// All scenarios, in report order.
pub fn all() -> Vec<Scenario> {
    let mut all = threads();
    let at = all
        .iter()
        .position(|s| s.name == "key-w64")
        .map_or(0, |i| i + 1);
    // Workers as processes on one shared instance; the keys of `key-wN`.
    let procs = |name, title, workers, processes| Scenario {
        name,
        title,
        workers,
        processes,
        ..all[0].clone()
    };
    let with_procs = [
        procs(
            "key-w16-p4",
            "one key per op, 16 workers as 4 processes of 4 threads, 10% duplicates",
            16,
            4,
        ),
        procs(
            "key-w16-p16",
            "one key per op, 16 workers as 16 processes of 1 thread, 10% duplicates",
            16,
            16,
        ),
        procs(
            "key-w64-p4",
            "one key per op, 64 workers as 4 processes of 16 threads, 10% duplicates",
            64,
            4,
        ),
    ];
    all.splice(at..at, with_procs);
    all
}

/// The scenarios whose workers are threads of this process.
fn threads() -> Vec<Scenario> {
    let base = Scenario {
        name: "",
        title: "",
        workers: 1,
        processes: 1,
        batch: 1,
        dup_ratio: 0.1,
        repeats: Repeats::Uniform,
        kind: OpKind::Insert,
        max_ops: 1_000_000,
    };
    let key = |name, title, workers| Scenario {
        name,
        title,
        workers,
        ..base.clone()
    };
    let batch = |name, title, workers, dup_ratio, repeats| Scenario {
        name,
        title,
        workers,
        batch: 1_000,
        dup_ratio,
        repeats,
        max_ops: 4_000_000,
        ..base.clone()
    };
    let zipf = Repeats::Zipf(ZIPF_S);
    vec![
        key("key-w1", "one key per op, 1 worker, 10% duplicates", 1),
        key("key-w4", "one key per op, 4 workers, 10% duplicates", 4),
        key("key-w16", "one key per op, 16 workers, 10% duplicates", 16),
        key("key-w64", "one key per op, 64 workers, 10% duplicates", 64),
        batch(
            "batch-w1",
            "batches of 1,000 keys, 1 worker, 10% duplicates",
            1,
            0.1,
            Repeats::Uniform,
        ),
        batch(
            "batch-w4",
            "batches of 1,000 keys, 4 workers, 10% duplicates",
            4,
            0.1,
            Repeats::Uniform,
        ),
        Scenario {
            repeats: zipf,
            ..key(
                "dup10-w16",
                "one key per op, 16 workers, 10% Zipf duplicates",
                16,
            )
        },
        Scenario {
            dup_ratio: 0.5,
            repeats: zipf,
            ..key(
                "dup50-w16",
                "one key per op, 16 workers, 50% Zipf duplicates",
                16,
            )
        },
        batch(
            "dup10-batch-w4",
            "batches of 1,000 keys, 4 workers, 10% Zipf duplicates",
            4,
            0.1,
            zipf,
        ),
        batch(
            "dup50-batch-w4",
            "batches of 1,000 keys, 4 workers, 50% Zipf duplicates",
            4,
            0.5,
            zipf,
        ),
        Scenario {
            kind: OpKind::BeginComplete,
            ..key(
                "bc-w1",
                "begin+complete with a 64-byte outcome, 1 worker, 10% duplicates",
                1,
            )
        },
        Scenario {
            kind: OpKind::BeginComplete,
            ..key(
                "bc-w16",
                "begin+complete with a 64-byte outcome, 16 workers, 10% duplicates",
                16,
            )
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    /// A scenario run as processes has the keys of its threads-only twin.
    #[test]
    fn processes_run_the_keys_of_their_threads_twin() {
        let all = all();
        let by = |name: &str| all.iter().find(|s| s.name == name).cloned();
        for (procs, twin) in [("key-w16-p4", "key-w16"), ("key-w64-p4", "key-w64")] {
            let (p, t) = (by(procs).unwrap(), by(twin).unwrap());
            assert!(p.processes > 1 && t.processes == 1);
            let (wp, wt) = (
                Workload::generate(p.spec(0.01)),
                Workload::generate(t.spec(0.01)),
            );
            assert_eq!(wp.keys, wt.keys, "{procs} vs {twin}");
        }
    }
}
