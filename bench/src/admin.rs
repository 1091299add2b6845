//! The simulator's counters over its admin port (`GET /stats`, `POST /stats/reset`), and the
//! multiplexer's metrics, read with the test kit's HTTP and Prometheus helpers.

use std::net::SocketAddr;

use teifleet_testkit::{http, prom};

/// The simulator's counters, the part the scenarios read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SimStats {
    /// Inference calls and stream messages that got one of TEI's slots.
    pub requests_admitted: u64,
    /// Calls and stream messages answered successfully.
    pub completed: u64,
    pub batches_run: u64,
    /// Requests holding one of TEI's slots now.
    #[serde(default)]
    pub in_flight: u64,
    /// The most requests that held a slot at once since the last reset.
    #[serde(default)]
    pub max_in_flight_observed: u64,
    /// Time the device spent running batches since the last reset, µs (0 from a simulator that
    /// does not count it).
    #[serde(default)]
    pub device_busy_us: u64,
}

/// Resets the simulator's counters, so the next [`sim_stats`] counts one run.
pub async fn reset_sim_stats(admin: SocketAddr) -> Option<()> {
    http::post(admin, "/stats/reset").await.map(|_| ())
}

pub async fn sim_stats(admin: SocketAddr) -> Option<SimStats> {
    serde_json::from_str(&http::get(admin, "/stats").await?).ok()
}

/// Sets the simulator's fault (`none`, `fail`, `stall`): `stall` holds every inference request,
/// and its slot, until the fault is cleared.
pub async fn set_sim_fault(admin: SocketAddr, fault: &str) -> Option<()> {
    let path = match fault {
        "none" => "/fault/clear".to_owned(),
        other => format!("/fault/{other}"),
    };
    http::post(admin, &path).await.map(|_| ())
}

/// The sum of metric `name` over the series carrying every one of `labels`.
pub async fn metric_sum_matching(admin: SocketAddr, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let text = http::get(admin, "/metrics").await?;
    Some(prom::sum_matching(&text, name, labels))
}

/// The sum of metric `name` over its labels at `admin`'s `/metrics`; `None` when the metrics
/// cannot be read or do not have it.
pub async fn metric_sum(admin: SocketAddr, name: &str) -> Option<f64> {
    let text = http::get(admin, "/metrics").await?;
    text.lines().any(|l| l.starts_with(name)).then(|| prom::sum(&text, name))
}

/// The one series written exactly as `series` at `admin`'s `/metrics`.
pub async fn metric_value(admin: SocketAddr, series: &str) -> Option<f64> {
    prom::value(&http::get(admin, "/metrics").await?, series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_stats_ignore_fields_they_do_not_need() {
        let body = r#"{"requests_received":9,"requests_admitted":7,"requests_refused_overloaded":2,"in_flight":0,
                       "max_in_flight_observed":4,"completed":7,"batches_run":3}"#;
        let stats: SimStats = serde_json::from_str(body).unwrap();
        let expected = SimStats {
            requests_admitted: 7,
            completed: 7,
            batches_run: 3,
            max_in_flight_observed: 4,
            ..SimStats::default()
        };
        assert_eq!(stats, expected);
    }
}
