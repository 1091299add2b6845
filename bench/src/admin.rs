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
}

/// Resets the simulator's counters, so the next [`sim_stats`] counts one run.
pub async fn reset_sim_stats(admin: SocketAddr) -> Option<()> {
    http::post(admin, "/stats/reset").await.map(|_| ())
}

pub async fn sim_stats(admin: SocketAddr) -> Option<SimStats> {
    serde_json::from_str(&http::get(admin, "/stats").await?).ok()
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
        assert_eq!(stats, SimStats { requests_admitted: 7, completed: 7, batches_run: 3 });
    }
}
