//! A pool's demand (`status.demand`) from what its sidecars reported.

use teifleet_crds::{PoolDemand, SidecarAdmission};

/// Rates below this are written as 0: far under one call a minute (0.017/s), the smallest rate a
/// sidecar counting whole calls over a minute reports, and out of reach of the rounding's scale.
const NEGLIGIBLE_PER_SECOND: f64 = 1e-6;

/// The demand over `reports`; `None` when no sidecar answered, which says nothing about the load
/// (an idle pool answers with zeros).
pub fn demand(reports: &[SidecarAdmission]) -> Option<PoolDemand> {
    if reports.is_empty() {
        return None;
    }
    let sum = |field: fn(&SidecarAdmission) -> u32| reports.iter().map(|r| u64::from(field(r))).sum::<u64>();
    let rate = |field: fn(&SidecarAdmission) -> f64| two_significant_digits(reports.iter().map(field).sum());
    let in_flight = sum(|r| r.in_flight);
    // A limit of 0 with calls still in flight (an adaptive limit cannot get there, a share of a
    // zero budget can) reads as over 100%, as any limit below what is in flight does.
    let limits = sum(|r| r.effective_in_flight).max(1);
    Some(PoolDemand {
        replicas_reporting: clamped(reports.len() as u64),
        in_flight: clamped(in_flight),
        queued: clamped(sum(|r| r.queued)),
        utilization_percent: clamped((in_flight * 100 + limits / 2) / limits),
        refused_per_second: rate(|r| r.refused_per_second),
        spilled_per_second: rate(|r| r.spilled_per_second),
    })
}

fn clamped(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// `value` rounded to two significant digits (0.0167 → 0.017, 1234 → 1200): a rate that jitters
/// by a call or two a minute keeps its status, and the result prints as short as it reads.
pub(crate) fn two_significant_digits(value: f64) -> f64 {
    if !value.is_finite() || value < NEGLIGIBLE_PER_SECOND {
        return 0.0;
    }
    let magnitude = value.log10().floor() as i32;
    let decimals = 1 - magnitude;
    // Dividing by an exact power of ten gives the double nearest the decimal, which prints as
    // that decimal (0.3, never 0.30000000000000004).
    if decimals >= 0 {
        let scale = 10f64.powi(decimals);
        (value * scale).round() / scale
    } else {
        let scale = 10f64.powi(-decimals);
        (value / scale).round() * scale
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A sidecar's report, as the status tests need it.
    pub(in crate::status) fn report(
        limit: u32,
        in_flight: u32,
        queued: u32,
        refused: f64,
        spilled: f64,
    ) -> SidecarAdmission {
        SidecarAdmission {
            pool: "bge".into(),
            effective_in_flight: limit,
            max_in_flight: 32,
            adaptive: false,
            in_flight,
            queued,
            standing_queue: false,
            refused_per_second: refused,
            spilled_per_second: spilled,
            idle_seconds: None,
            tls: None,
        }
    }

    #[test]
    fn sums_the_reports_and_divides_by_the_limits_of_the_same_sidecars() {
        assert_eq!(demand(&[]), None, "no answer is not an idle pool");
        let reports = [report(32, 20, 0, 0.0, 0.5), report(32, 31, 7, 1.25, 0.0), report(16, 16, 40, 3.0, 0.0)];
        assert_eq!(
            demand(&reports),
            Some(PoolDemand {
                replicas_reporting: 3,
                in_flight: 67,
                queued: 47,
                // 67 of 80, not of the spec's budget: the limits of the sidecars that answered.
                utilization_percent: 84,
                refused_per_second: 4.3,
                spilled_per_second: 0.5,
            })
        );
    }

    #[test]
    fn an_idle_pool_is_all_zeros_and_a_limit_below_what_is_in_flight_reads_over_100() {
        let idle = demand(&[report(32, 0, 0, 0.0, 0.0)]).unwrap();
        assert_eq!(idle, PoolDemand { replicas_reporting: 1, ..PoolDemand::default() });
        // An adaptive limit just dropped to 8 under 12 calls still in flight.
        assert_eq!(demand(&[report(8, 12, 0, 0.0, 0.0)]).unwrap().utilization_percent, 150);
        assert_eq!(demand(&[report(0, 2, 0, 0.0, 0.0)]).unwrap().utilization_percent, 200);
        assert_eq!(demand(&[report(0, 0, 0, 0.0, 0.0)]).unwrap().utilization_percent, 0);
        // Half a percent rounds up; one call in flight of a limit of 1000 shows as 0%.
        assert_eq!(demand(&[report(200, 1, 0, 0.0, 0.0)]).unwrap().utilization_percent, 1);
        assert_eq!(demand(&[report(1000, 1, 0, 0.0, 0.0)]).unwrap().utilization_percent, 0);
    }

    #[test]
    fn rates_keep_two_significant_digits_so_jitter_does_not_rewrite_status() {
        for (value, rounded) in [
            (0.0, 0.0),
            (-1.0, 0.0),
            (f64::NAN, 0.0),
            (f64::INFINITY, 0.0),
            (1e-9, 0.0),
            (1.0 / 60.0, 0.017),
            (0.29999, 0.3),
            (1.234, 1.2),
            (9.96, 10.0),
            (42.0, 42.0),
            (1234.5, 1200.0),
            (98_765.0, 99_000.0),
        ] {
            assert_eq!(two_significant_digits(value), rounded, "{value}");
        }
        // A minute with one more or one fewer refusal in 600 leaves the status as it was.
        let rates = [599.0 / 60.0, 600.0 / 60.0, 601.0 / 60.0];
        let statuses: Vec<f64> = rates.iter().map(|rate| two_significant_digits(*rate)).collect();
        assert_eq!(statuses, [10.0, 10.0, 10.0]);
        assert_eq!(serde_json::to_string(&two_significant_digits(0.29999)).unwrap(), "0.3");
    }
}
