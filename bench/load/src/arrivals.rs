//! Precomputed arrival schedules for the open loop. Computing every send time before the run
//! starts is what makes the loop open: a slow answer can never delay the next send, and the
//! latency of each request is measured from the time it was *due*, not from when it went out.

use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use crate::Error;

/// How inter-arrival gaps are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Exponential gaps: independent clients, as real traffic arrives (seed 002's model).
    Poisson,
    /// Equal gaps of 1/rate.
    Constant,
}

impl FromStr for Arrivals {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "poisson" => Ok(Self::Poisson),
            "constant" => Ok(Self::Constant),
            other => Err(Error::InvalidArgument(format!("arrivals must be poisson or constant, not {other:?}"))),
        }
    }
}

/// Send offsets from the start of the run, in order: as many as `max_count`, stopping before
/// `max_duration`. The same seed gives the same schedule, so direct and multiplexed runs of one
/// scenario see identical traffic.
pub fn schedule(kind: Arrivals, rate: f64, max_count: u64, max_duration: Duration, seed: u64) -> Vec<Duration> {
    if !(rate.is_finite() && rate > 0.0) {
        return Vec::new();
    }
    let horizon = max_duration.as_secs_f64();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut offsets = Vec::with_capacity(usize::try_from(max_count.min(1 << 24)).unwrap_or(0));
    let mut t = 0.0_f64;
    for i in 0..max_count {
        let at = match kind {
            // The first request goes at 0 so a run never starts with an idle gap.
            Arrivals::Constant => i as f64 / rate,
            Arrivals::Poisson if i == 0 => 0.0,
            Arrivals::Poisson => {
                // Inverse transform of a uniform draw in (0, 1]; 1 - u avoids ln(0).
                let u: f64 = rng.random();
                t += -(1.0 - u).ln() / rate;
                t
            }
        };
        if at >= horizon {
            break;
        }
        offsets.push(Duration::from_secs_f64(at));
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_schedule_is_evenly_spaced_and_bounded_by_count() {
        let s = schedule(Arrivals::Constant, 100.0, 5, Duration::from_secs(60), 1);
        assert_eq!(s.len(), 5);
        assert_eq!(s[0], Duration::ZERO);
        assert_eq!(s[4], Duration::from_millis(40));
    }

    #[test]
    fn schedule_stops_at_the_duration() {
        let s = schedule(Arrivals::Constant, 100.0, 10_000, Duration::from_secs(2), 1);
        assert_eq!(s.len(), 200);
        assert!(s.iter().all(|d| *d < Duration::from_secs(2)));
    }

    #[test]
    fn poisson_schedule_has_the_asked_mean_rate_and_is_reproducible() {
        let rate = 1000.0;
        let a = schedule(Arrivals::Poisson, rate, 50_000, Duration::from_secs(3600), 7);
        let b = schedule(Arrivals::Poisson, rate, 50_000, Duration::from_secs(3600), 7);
        assert_eq!(a, b);
        let span = a.last().unwrap().as_secs_f64();
        let measured = (a.len() - 1) as f64 / span;
        assert!((measured - rate).abs() / rate < 0.02, "measured rate {measured}");
        assert!(a.windows(2).all(|w| w[0] <= w[1]), "offsets are sorted");
        // Exponential gaps: the coefficient of variation is about 1 (constant gaps would give 0).
        let gaps: Vec<f64> = a.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.05, "coefficient of variation {cv}");
    }

    #[test]
    fn different_seeds_differ_and_bad_rates_give_nothing() {
        let a = schedule(Arrivals::Poisson, 100.0, 100, Duration::from_secs(60), 1);
        let b = schedule(Arrivals::Poisson, 100.0, 100, Duration::from_secs(60), 2);
        assert_ne!(a, b);
        assert!(schedule(Arrivals::Poisson, 0.0, 100, Duration::from_secs(60), 1).is_empty());
        assert!(schedule(Arrivals::Constant, f64::NAN, 100, Duration::from_secs(60), 1).is_empty());
    }
}
