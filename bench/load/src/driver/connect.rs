//! Connections to the target: several HTTP/2 connections, requests spread over them round robin,
//! as a client pool behind a load balancer would; `https://` targets in TLS ([`crate::tls`]).
//! Loopback only: this instrument is for measuring servers on this machine.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint, Uri};

use crate::tls::TlsClient;
use crate::{Error, Result};

/// Refuses targets that are not `http://` or `https://` on a loopback address.
pub fn check_loopback(target: &str) -> Result<()> {
    let uri: http::Uri =
        target.parse().map_err(|e| Error::InvalidArgument(format!("--target {target:?} is not a URL: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(Error::InvalidArgument(format!(
            "--target must be http://HOST:PORT (plaintext gRPC) or https://HOST:PORT (TLS), not {target:?}"
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

/// Whether `target` is reached in TLS.
pub fn is_tls(target: &str) -> bool {
    target.starts_with("https://")
}

/// How connections to one target are made: plaintext HTTP/2, or TLS with the run's one client
/// configuration (so later connections resume).
#[derive(Clone, Debug)]
pub struct Dialer {
    target: String,
    endpoint: Endpoint,
    tls: Option<TlsClient>,
}

impl Dialer {
    /// `tls` is required for an `https://` target and unused otherwise.
    pub fn new(target: &str, tls: Option<&TlsClient>) -> Result<Self> {
        check_loopback(target)?;
        let tls = match (is_tls(target), tls) {
            (true, None) => {
                return Err(Error::InvalidArgument(format!("{target} is https://: give the CA bundle (--ca-cert)")));
            }
            (true, Some(tls)) => Some(tls.clone()),
            (false, _) => None,
        };
        let endpoint = Endpoint::from_shared(target.to_owned())
            .map_err(|source| Error::Connect { target: target.into(), source })?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            // Requests beyond the server's stream limit wait in this buffer rather than failing.
            .buffer_size(65_536);
        Ok(Self { target: target.to_owned(), endpoint, tls })
    }

    /// One new HTTP/2 connection.
    pub async fn connect(&self) -> Result<Channel> {
        let channel = match &self.tls {
            None => self.endpoint.connect().await,
            Some(tls) => {
                let tls = tls.clone();
                let connector = tower::service_fn(move |uri: Uri| tls.clone().dial(uri));
                self.endpoint.connect_with_connector(connector).await
            }
        };
        channel.map_err(|source| Error::Connect { target: self.target.clone(), source })
    }
}

/// Opens `count` separate plaintext HTTP/2 connections.
pub async fn connect(target: &str, count: usize) -> Result<Vec<Channel>> {
    connect_spread(&[target], count, None).await
}

/// Opens `count` HTTP/2 connections over `targets` in turn: connection k goes to target
/// k mod `targets.len()`, so requests spread round robin over the connections spread over the
/// targets too. `https://` targets are reached with `tls`.
pub async fn connect_spread(targets: &[&str], count: usize, tls: Option<&TlsClient>) -> Result<Vec<Channel>> {
    let dialers = targets.iter().map(|t| Dialer::new(t, tls)).collect::<Result<Vec<_>>>()?;
    let mut channels = Vec::with_capacity(count);
    for k in 0..count {
        let Some(dialer) = dialers.get(k % dialers.len().max(1)) else { break };
        channels.push(dialer.connect().await?);
    }
    Ok(channels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_targets_in_plaintext_or_tls() {
        assert!(check_loopback("http://127.0.0.1:50051").is_ok());
        assert!(check_loopback("http://127.0.0.2:1").is_ok());
        assert!(check_loopback("http://localhost:8080").is_ok());
        assert!(check_loopback("http://[::1]:8080").is_ok());
        assert!(check_loopback("https://127.0.0.1:8080").is_ok());
        assert!(check_loopback("http://10.0.0.1:8080").is_err());
        assert!(check_loopback("https://example.com:8080").is_err());
        assert!(check_loopback("ftp://127.0.0.1:8080").is_err());
        assert!(check_loopback("127.0.0.1:8080").is_err());
    }

    #[test]
    fn an_https_target_needs_a_ca_bundle() {
        let error = Dialer::new("https://127.0.0.1:1", None).unwrap_err();
        assert!(error.to_string().contains("--ca-cert"), "{error}");
        assert!(Dialer::new("http://127.0.0.1:1", None).is_ok());
    }
}
