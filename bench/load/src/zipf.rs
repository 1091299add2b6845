//! Zipf-distributed popularity: rank k (1-based) of n is drawn with probability proportional to
//! 1/k^s. Query logs look like this (a few hot queries, a long tail), and it is what makes
//! identical calls overlap in flight, which is what coalescing feeds on.
//!
//! Draws are a pure function of (seed, request index), so the direct and the multiplexed run of a
//! scenario, and an open and a closed loop, ask for the same queries in the same order.

use crate::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct Zipf {
    exponent: f64,
    /// `cdf[k]`: probability of a rank ≤ k + 1; the last entry is 1.
    cdf: Vec<f64>,
}

impl Zipf {
    /// Ranks 1..=`n` with exponent `s` (s = 0 is uniform; s ≈ 1 is typical of query logs).
    pub fn new(exponent: f64, n: usize) -> Result<Self> {
        if n == 0 || !exponent.is_finite() || exponent < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "a Zipf mix needs at least one text and a finite exponent ≥ 0, not n={n}, s={exponent}"
            )));
        }
        let weights: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-exponent)).collect();
        let total: f64 = weights.iter().sum();
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for w in weights {
            acc += w / total;
            cdf.push(acc);
        }
        // Rounding may leave the sum a hair under 1; a draw of 0.999999... must still land.
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        Ok(Self { exponent, cdf })
    }

    pub fn exponent(&self) -> f64 {
        self.exponent
    }

    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// Probability of 0-based rank `k` (0 is the hottest).
    pub fn probability(&self, k: usize) -> f64 {
        match k {
            0 => self.cdf.first().copied().unwrap_or(0.0),
            _ if k < self.cdf.len() => self.cdf[k] - self.cdf[k - 1],
            _ => 0.0,
        }
    }

    /// The 0-based rank whose CDF interval holds `u` (a uniform draw in [0, 1)).
    pub fn rank(&self, u: f64) -> usize {
        self.cdf.partition_point(|c| *c <= u).min(self.cdf.len() - 1)
    }

    /// The rank of request `index` under `seed`.
    pub fn draw(&self, seed: u64, index: u64) -> usize {
        self.rank(uniform(seed, index))
    }
}

/// A uniform draw in [0, 1) that depends only on `seed` and `index` (SplitMix64 of both), so any
/// request can be drawn without replaying the ones before it.
pub fn uniform(seed: u64, index: u64) -> f64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    // The top 53 bits make an exact double in [0, 1).
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_follow_the_power_law_and_sum_to_one() {
        let z = Zipf::new(1.1, 1000).unwrap();
        let sum: f64 = (0..1000).map(|k| z.probability(k)).sum();
        assert!((sum - 1.0).abs() < 1e-9, "{sum}");
        // p(k) / p(1) = k^-s.
        let ratio = z.probability(9) / z.probability(0);
        assert!((ratio - 10f64.powf(-1.1)).abs() < 1e-9, "{ratio}");
        assert!((0..999).all(|k| z.probability(k) > z.probability(k + 1)));
        assert_eq!(z.probability(1000), 0.0);
    }

    #[test]
    fn draws_match_the_distribution_and_are_reproducible() {
        let z = Zipf::new(1.1, 1000).unwrap();
        let n = 200_000u64;
        let mut counts = vec![0u64; 1000];
        for i in 0..n {
            counts[z.draw(42, i)] += 1;
        }
        for k in [0, 1, 9, 99] {
            let seen = counts[k] as f64 / n as f64;
            let want = z.probability(k);
            // Within 5 standard errors of a binomial share.
            let tolerance = 5.0 * (want * (1.0 - want) / n as f64).sqrt();
            assert!((seen - want).abs() < tolerance, "rank {k}: {seen} vs {want}");
        }
        assert_eq!(z.draw(42, 12_345), z.draw(42, 12_345));
        let a: Vec<usize> = (0..50).map(|i| z.draw(1, i)).collect();
        let b: Vec<usize> = (0..50).map(|i| z.draw(2, i)).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn exponent_zero_is_uniform_and_the_edges_land_inside() {
        let z = Zipf::new(0.0, 4).unwrap();
        assert!((0..4).all(|k| (z.probability(k) - 0.25).abs() < 1e-12));
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(0.2499), 0);
        assert_eq!(z.rank(0.25), 1);
        assert_eq!(z.rank(0.999_999_999), 3);
        assert_eq!(z.rank(1.0), 3);
        assert!(Zipf::new(1.0, 0).is_err());
        assert!(Zipf::new(-1.0, 10).is_err());
        assert!(Zipf::new(f64::NAN, 10).is_err());
    }

    #[test]
    fn uniform_draws_are_in_range_and_spread() {
        let draws: Vec<f64> = (0..10_000).map(|i| uniform(7, i)).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}
