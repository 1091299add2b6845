//! A minimal HTTP/1.0 client for the admin ports on loopback (metrics, readiness, the
//! simulator's counters and faults): enough for polling, with no HTTP client dependency.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The body of a 200 answer, or `None` for anything else (including no answer within 2 s).
pub async fn request(port: u16, method: &str, path: &str) -> Option<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let head = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n");
        stream.write_all(head.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?;
        (status == "200").then(|| body.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), exchange).await.ok().flatten()
}

pub async fn get(port: u16, path: &str) -> Option<String> {
    request(port, "GET", path).await
}

pub async fn post(port: u16, path: &str) -> Option<String> {
    request(port, "POST", path).await
}

/// The simulator's counters (`GET /stats`), the part the scenarios read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SimStats {
    /// Inference calls and stream messages that got one of TEI's slots.
    pub requests_admitted: u64,
    /// Calls and stream messages answered successfully.
    pub completed: u64,
    pub batches_run: u64,
}

/// Resets the simulator's counters, so the next [`sim_stats`] counts one run.
pub async fn reset_sim_stats(port: u16) -> Option<()> {
    post(port, "/stats/reset").await.map(|_| ())
}

pub async fn sim_stats(port: u16) -> Option<SimStats> {
    serde_json::from_str(&get(port, "/stats").await?).ok()
}

/// The value of the one series written exactly as `series` (name and labels), if present.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Sum of every series of `name` in Prometheus text (all label sets).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_a_metric_over_its_labels_only() {
        let text = "# HELP teifleet_queued x\nteifleet_queued{pool=\"a\",priority=\"standard\"} 7\n\
                    teifleet_queued{pool=\"a\",priority=\"critical\"} 3\nteifleet_queued_total 100\n";
        assert_eq!(metric_sum(text, "teifleet_queued"), 10.0);
        assert_eq!(metric_sum(text, "missing"), 0.0);
        assert_eq!(metric_value(text, "teifleet_queued{pool=\"a\",priority=\"critical\"}"), Some(3.0));
        assert_eq!(metric_value(text, "teifleet_queued"), None);
    }

    #[test]
    fn sim_stats_ignore_fields_they_do_not_need() {
        let body = r#"{"requests_received":9,"requests_admitted":7,"requests_refused_overloaded":2,"in_flight":0,
                       "max_in_flight_observed":4,"completed":7,"batches_run":3}"#;
        let stats: SimStats = serde_json::from_str(body).unwrap();
        assert_eq!(stats, SimStats { requests_admitted: 7, completed: 7, batches_run: 3 });
    }
}
