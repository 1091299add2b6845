//! Latency distributions: an HdrHistogram of nanoseconds, summarised as the percentiles people
//! compare (p50/p90/p99/p99.9/max). HdrHistogram keeps 3 significant digits over the whole range,
//! so a 1 ms median and a 30 s tail are both exact to 0.1%.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// One hour in nanoseconds: longer than any bounded run.
const MAX_NS: u64 = 3_600_000_000_000;

#[derive(Clone, Debug)]
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    pub fn new() -> Self {
        // Constant bounds and precision that hdrhistogram accepts (a unit test builds one).
        Self(Histogram::new_with_bounds(1, MAX_NS, 3).expect("valid histogram bounds"))
    }

    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(MAX_NS).max(1);
        self.0.saturating_record(ns);
    }

    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn add(&mut self, other: &Self) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// The value at quantile `q` (0..=1), in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        ms(self.0.value_at_quantile(q))
    }

    pub fn summary(&self) -> Summary {
        if self.0.is_empty() {
            return Summary::default();
        }
        Summary {
            count: self.0.len(),
            mean_ms: self.0.mean() / 1e6,
            p50_ms: self.quantile_ms(0.5),
            p90_ms: self.quantile_ms(0.9),
            p99_ms: self.quantile_ms(0.99),
            p999_ms: self.quantile_ms(0.999),
            max_ms: ms(self.0.max()),
        }
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Percentiles of one distribution, in milliseconds; all zero when nothing was recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_uniform_distribution() {
        let mut l = Latencies::new();
        for i in 1..=1000 {
            l.record(Duration::from_micros(i * 10));
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        let close = |a: f64, b: f64| (a - b).abs() / b < 0.002;
        assert!(close(s.p50_ms, 5.0), "{s:?}");
        assert!(close(s.p90_ms, 9.0), "{s:?}");
        assert!(close(s.p99_ms, 9.9), "{s:?}");
        assert!(close(s.p999_ms, 9.99), "{s:?}");
        assert!(close(s.max_ms, 10.0), "{s:?}");
        assert!(close(s.mean_ms, 5.005), "{s:?}");
    }

    #[test]
    fn a_single_outlier_shows_in_the_tail_only() {
        let mut l = Latencies::new();
        for _ in 0..999 {
            l.record(Duration::from_millis(1));
        }
        l.record(Duration::from_secs(2));
        let s = l.summary();
        assert!((s.p99_ms - 1.0).abs() < 0.01);
        assert!((s.max_ms - 2000.0).abs() < 2.0);
    }

    #[test]
    fn empty_is_zero_and_extremes_saturate() {
        assert_eq!(Latencies::new().summary(), Summary::default());
        let mut l = Latencies::new();
        l.record(Duration::ZERO);
        l.record(Duration::from_secs(100_000));
        assert_eq!(l.len(), 2);
        let mut m = Latencies::new();
        m.add(&l);
        assert_eq!(m.len(), 2);
    }
}
