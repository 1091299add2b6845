//! A minimal HTTP/1.0 client for the admin ports on loopback (metrics, readiness, simulator
//! faults): enough for polling, with no HTTP client dependency.

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
    }
}
