//! The jitter's random numbers: `SplitMix64`, seeded from the operating
//! system unless a test fixes the seed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A seed from the operating system; if it has none to give, one from the
/// time and a per-process counter (jitter needs spread, not secrecy).
pub(super) fn random_seed() -> u64 {
    static FALLBACK: AtomicU64 = AtomicU64::new(0);
    getrandom::u64().unwrap_or_else(|_| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos
            ^ FALLBACK
                .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
                .rotate_left(32)
    })
}

/// `SplitMix64` (Steele, Lea and Flood, 2014): one 64-bit state advanced by a
/// fixed odd step, so an atomic add makes it shareable between threads
/// without a lock. Small and fast, statistically strong for jitter; not
/// cryptographic.
#[derive(Debug)]
pub(super) struct SplitMix64(AtomicU64);

impl SplitMix64 {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    pub(super) fn new(seed: u64) -> Self {
        Self(AtomicU64::new(seed))
    }

    fn next_u64(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(Self::GAMMA, Ordering::Relaxed)
            .wrapping_add(Self::GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n]`. From 128 random bits modulo `n + 1`: the bias is
    /// below `(n + 1) / 2^128`, under 2^-34 for any `Duration` in nanoseconds.
    pub(super) fn up_to(&self, n: u128) -> u128 {
        let r = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
        match n.checked_add(1) {
            Some(m) => r % m,
            None => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The first outputs of the reference implementation seeded with 0.
        let rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn up_to_stays_in_range_at_the_edges() {
        let rng = SplitMix64::new(9);
        for _ in 0..1000 {
            assert_eq!(rng.up_to(0), 0);
            assert!(rng.up_to(1) <= 1);
            assert!(rng.up_to(Duration::MAX.as_nanos()) <= Duration::MAX.as_nanos());
        }
        // n + 1 would overflow: every value is in range, and nothing panics.
        let _ = rng.up_to(u128::MAX);
    }
}
