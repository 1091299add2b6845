//! Scenario 11's two tenants, shared by its runs (`fairness`) and its new-user runs
//! (`fairness_defaults`): who floods, who is light, at what share of capacity, and their reports
//! side by side.

use serde::{Deserialize, Serialize};
use teifleet_load::Report;

use crate::targets::ratio;

pub const FLOOD_FACTOR: f64 = 5.0;
pub const LIGHT_FACTOR: f64 = 0.2;
pub const FLOOD: &str = "a";
pub const LIGHT: &str = "b";

/// Tenant A and tenant B's runs side by side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    pub flood: Report,
    pub light: Report,
}

impl Pair {
    /// B's OK answers within the deadline ÷ what B sent.
    pub fn light_share(&self) -> f64 {
        ratio(self.light.ok_in_time as f64, self.light.sent as f64)
    }

    pub fn total_goodput_rps(&self) -> f64 {
        self.flood.goodput_rps + self.light.goodput_rps
    }
}

/// A tenant's report with the figures scenario 11's targets read, for its tests.
#[cfg(test)]
pub fn report(sent: u64, ok_in_time: u64, goodput_rps: f64, p99_ms: f64) -> Report {
    use teifleet_load::summary::Summary;
    Report { sent, ok_in_time, goodput_rps, latency: Summary { p99_ms, ..Summary::default() }, ..Report::default() }
}
