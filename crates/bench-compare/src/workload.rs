//! Deterministic workloads: a seeded sequence of operations over 16-byte
//! keys, a fraction of which repeat an earlier key, split among workers.
//!
//! Invariant: an operation only ever repeats a key from an *earlier*
//! position, so every prefix of a workload is itself a workload with the
//! same shape, and its count of new keys is known exactly.

use crate::contender::Key16;

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, good enough to make
/// benchmark keys.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    #[allow(clippy::cast_precision_loss)] // 53-bit integer into an f64: exact
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)` (Lemire's multiply-shift; the bias is below
    /// 2^-40 for the sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// Zipf over ranks `0..n` (`P(r) ∝ 1 / (r + 1)^s`), sampled by inverse CDF
/// (binary search in the cumulative weights), optionally truncated to the
/// first `m` ranks.
#[derive(Debug, Clone)]
pub struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    /// The distribution over `n >= 1` ranks with exponent `s`.
    #[allow(clippy::cast_precision_loss)] // ranks are far below 2^53
    pub fn new(n: usize, s: f64) -> Self {
        let mut total = 0.0;
        let cumulative = (0..n.max(1))
            .map(|r| {
                total += 1.0 / ((r + 1) as f64).powf(s);
                total
            })
            .collect();
        Self { cumulative }
    }

    /// A rank in `0..m` (`1 <= m <= n`) for a uniform `u` in `[0, 1)`.
    pub fn sample_below(&self, m: usize, u: f64) -> usize {
        let m = m.clamp(1, self.cumulative.len());
        let target = u * self.cumulative[m - 1];
        self.cumulative[..m]
            .partition_point(|&c| c <= target)
            .min(m - 1)
    }
}

/// Which earlier key a repeat picks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Repeats {
    /// Any earlier key, uniformly.
    Uniform,
    /// Zipf with this exponent over earlier keys ranked by first appearance
    /// (the oldest key is the hottest).
    Zipf(f64),
}

impl Repeats {
    /// For tables: "uniform" or "Zipf s=0.99".
    pub fn label(self) -> String {
        match self {
            Repeats::Uniform => "uniform".into(),
            Repeats::Zipf(s) => format!("Zipf s={s}"),
        }
    }
}

/// What one operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Insert-if-absent of `batch` keys in one commit.
    Insert,
    /// `begin` + `complete` with a 64-byte outcome (batch is 1).
    BeginComplete,
}

/// The shape of a workload.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Operations (keys) in the whole sequence.
    pub ops: usize,
    /// Probability that an operation repeats an earlier key.
    pub dup_ratio: f64,
    /// How repeats pick their key.
    pub repeats: Repeats,
    /// Concurrent worker threads.
    pub workers: usize,
    /// Keys per commit (1 = one key per operation).
    pub batch: usize,
    /// Insert or begin+complete.
    pub kind: OpKind,
    /// PRNG seed.
    pub seed: u64,
}

/// A generated sequence of keys and, per position, whether it is the key's
/// first appearance.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The shape it was generated from.
    pub spec: Spec,
    /// The key of each operation, in sequence order.
    pub keys: Vec<Key16>,
    /// `new_before[i]` = distinct keys among `keys[..i]`.
    new_before: Vec<u32>,
}

impl Workload {
    /// Generates the workload for `spec`; the same spec gives the same keys.
    pub fn generate(spec: Spec) -> Self {
        assert!(
            spec.workers >= 1 && spec.batch >= 1,
            "workers and batch must be at least 1"
        );
        assert!(
            spec.kind == OpKind::Insert || spec.batch == 1,
            "begin+complete works one key at a time"
        );
        let mut rng = SplitMix64::new(spec.seed);
        let zipf = match spec.repeats {
            Repeats::Zipf(s) => Some(Zipf::new(spec.ops, s)),
            Repeats::Uniform => None,
        };
        let mut distinct: Vec<Key16> = Vec::new();
        let mut keys = Vec::with_capacity(spec.ops);
        let mut new_before = Vec::with_capacity(spec.ops + 1);
        new_before.push(0);
        for _ in 0..spec.ops {
            let repeat = !distinct.is_empty() && rng.next_f64() < spec.dup_ratio;
            let key = if repeat {
                let m = distinct.len();
                let i = match &zipf {
                    Some(z) => z.sample_below(m, rng.next_f64()),
                    None => rng.below(m),
                };
                distinct[i]
            } else {
                let mut k = [0u8; 16];
                k[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
                k[8..].copy_from_slice(&rng.next_u64().to_le_bytes());
                distinct.push(k);
                k
            };
            keys.push(key);
            new_before.push(u32::try_from(distinct.len()).expect("fewer than 2^32 keys"));
        }
        Self {
            spec,
            keys,
            new_before,
        }
    }

    /// Distinct keys among the first `n` operations: the count of "new"
    /// answers every correct engine gives for that prefix, whatever the
    /// interleaving of workers.
    pub fn expected_new(&self, n: usize) -> u64 {
        u64::from(self.new_before[n.min(self.keys.len())])
    }

    /// Keys per scheduling unit: every worker gets one batch.
    pub fn round(&self) -> usize {
        self.spec.workers * self.spec.batch
    }

    /// `n` rounded down to whole rounds, at least one round, at most the
    /// whole sequence.
    pub fn fit(&self, n: usize) -> usize {
        let round = self.round();
        (n / round * round).max(round).min(self.keys.len())
    }

    /// The keys of chunk `j` (a batch) within the first `n` operations.
    /// Chunk `j` goes to worker `j % workers`.
    pub fn chunk(&self, j: usize, n: usize) -> &[Key16] {
        let b = self.spec.batch;
        &self.keys[j * b..((j + 1) * b).min(n)]
    }
}

/// The 64-byte outcome stored for `key` in the begin+complete round.
pub fn outcome_for(key: &Key16) -> [u8; 64] {
    let mut o = [0u8; 64];
    for (i, b) in o.iter_mut().enumerate() {
        *b = key[i % 16] ^ (i as u8);
    }
    o
}
