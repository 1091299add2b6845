//! TLS to `https://` targets (a sidecar started with `--tls-cert`): TCP with `TCP_NODELAY`, then
//! rustls (ring, ALPN `h2`) trusting only the run's CA bundle, under tonic's HTTP/2 channel. One
//! client configuration serves every connection of a run, so its session store lets a new
//! connection resume (a TLS 1.3 ticket) instead of making a full handshake; how many did is
//! counted.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::Uri;

use crate::report::Handshakes;
use crate::{Error, Result};

/// The client side of a run's TLS connections: one configuration (and session store) for all.
#[derive(Clone, Debug)]
pub struct TlsClient {
    config: Arc<ClientConfig>,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    full: AtomicU64,
    resumed: AtomicU64,
}

impl TlsClient {
    /// A client trusting the CA certificates in `ca_pem` (and nothing else).
    pub fn from_pem(ca_pem: &[u8]) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("--ca-cert: {why}"));
        let mut roots = RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(ca_pem) {
            roots.add(certificate.map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(bad("no PEM certificate in the CA bundle".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self { config: Arc::new(config), counts: Arc::default() })
    }

    /// A client trusting the CA bundle in the PEM file at `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let pem = std::fs::read(path).map_err(|source| Error::File { what: "reading", path: path.into(), source })?;
        Self::from_pem(&pem)
    }

    /// Handshakes made so far, full and resumed.
    pub fn handshakes(&self) -> Handshakes {
        Handshakes {
            full: self.counts.full.load(Ordering::Relaxed),
            resumed: self.counts.resumed.load(Ordering::Relaxed),
        }
    }

    /// One TLS connection to `uri`'s host and port, verified as its host (an IP address is
    /// verified against the certificate's IP names).
    pub async fn dial(self, uri: Uri) -> std::io::Result<TokioIo<TlsStream<TcpStream>>> {
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
        let host = uri.host().ok_or_else(|| invalid(format!("{uri} names no host")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let name = ServerName::try_from(host.clone()).map_err(|e| invalid(format!("{host:?}: {e}")))?;
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        tcp.set_nodelay(true)?;
        let stream = TlsConnector::from(self.config).connect(name, tcp).await?;
        let counter = match stream.get_ref().1.handshake_kind() {
            Some(HandshakeKind::Resumed) => &self.counts.resumed,
            _ => &self.counts.full,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(TokioIo::new(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_without_certificates_is_refused() {
        let error = TlsClient::from_pem(b"not a certificate").unwrap_err();
        assert!(error.to_string().contains("no PEM certificate"), "{error}");
    }
}
