//! Connections to the target: several HTTP/2 connections, requests spread over them round robin,
//! as a client pool behind a load balancer would. Loopback only: this instrument is for
//! measuring servers on this machine.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::{Error, Result};

/// Refuses targets that are not `http://` on a loopback address.
pub fn check_loopback(target: &str) -> Result<()> {
    let uri: http::Uri =
        target.parse().map_err(|e| Error::InvalidArgument(format!("--target {target:?} is not a URL: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(Error::InvalidArgument(format!(
            "--target must be http://HOST:PORT (plaintext gRPC), not {target:?}"
        )));
    }
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Err(Error::InvalidArgument(format!(
            "--target must be a loopback address (127.0.0.1, localhost, [::1]), not {host:?}"
        )));
    }
    Ok(())
}

/// Opens `count` separate HTTP/2 connections (one per endpoint `connect`).
pub async fn connect(target: &str, count: usize) -> Result<Vec<Channel>> {
    check_loopback(target)?;
    let endpoint = Endpoint::from_shared(target.to_owned())
        .map_err(|source| Error::Connect { target: target.into(), source })?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        // Requests beyond the server's stream limit wait in this buffer rather than failing.
        .buffer_size(65_536);
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        channels.push(endpoint.connect().await.map_err(|source| Error::Connect { target: target.into(), source })?);
    }
    Ok(channels)
}

/// Opens `count` HTTP/2 connections over `targets` in turn: connection k goes to target
/// k mod `targets.len()`, so requests spread round robin over the connections spread over the
/// targets too.
pub async fn connect_spread(targets: &[&str], count: usize) -> Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(count);
    for k in 0..count {
        let Some(target) = targets.get(k % targets.len().max(1)) else { break };
        channels.extend(connect(target, 1).await?);
    }
    Ok(channels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plaintext_loopback_targets() {
        assert!(check_loopback("http://127.0.0.1:50051").is_ok());
        assert!(check_loopback("http://127.0.0.2:1").is_ok());
        assert!(check_loopback("http://localhost:8080").is_ok());
        assert!(check_loopback("http://[::1]:8080").is_ok());
        assert!(check_loopback("http://10.0.0.1:8080").is_err());
        assert!(check_loopback("http://example.com:8080").is_err());
        assert!(check_loopback("https://127.0.0.1:8080").is_err());
        assert!(check_loopback("127.0.0.1:8080").is_err());
    }
}
