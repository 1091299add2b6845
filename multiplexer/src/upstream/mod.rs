//! Channels to TEI (or to another pool's multiplexer): one pooled HTTP/2 connection per upstream,
//! multiplexing every request, reconnecting on its own after failures.
//!
//! An `https://` upstream (a sidecar of a pool with `spec.tls`) is reached in TLS with this
//! sidecar's own certificate set ([`Dialer`]): it trusts the set's CA bundle and shows its own
//! certificate to peers that ask for one. Each connection takes the set in force when it is made,
//! so a rotation reaches the next reconnect.

use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use teifleet_runtime::tls::ServerTls;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::SetupError;

/// How this sidecar reaches `https://` upstreams.
#[derive(Clone, Debug, Default)]
pub struct Dialer {
    /// The own certificate set (none in force: TLS upstreams cannot be reached).
    tls: Arc<ServerTls>,
    /// The name to verify peers reached by IP address under: the own pool Service's, which is
    /// what the pool's certificate names (pod IPs are in no certificate). Siblings are reached
    /// by their pod IP.
    ip_peers_named: Arc<RwLock<Option<String>>>,
}

impl Dialer {
    pub fn new(tls: Arc<ServerTls>) -> Self {
        Self { tls, ip_peers_named: Arc::default() }
    }

    /// Peers reached by IP address are verified as `name` from now on.
    pub fn name_ip_peers(&self, name: Option<String>) {
        *self.ip_peers_named.write().unwrap_or_else(PoisonError::into_inner) = name;
    }

    fn server_name(&self, host: &str) -> Result<ServerName<'static>, String> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let named = self.ip_peers_named.read().unwrap_or_else(PoisonError::into_inner).clone();
        let name = match (host.parse::<IpAddr>(), named) {
            (Ok(_), Some(name)) => name,
            _ => host.to_owned(),
        };
        ServerName::try_from(name.clone()).map_err(|e| format!("{name:?} is not a server name: {e}"))
    }

    async fn dial(
        self,
        uri: Uri,
        within: Duration,
    ) -> Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>, String> {
        let host = uri.host().ok_or_else(|| format!("{uri} names no host"))?;
        let port = uri.port_u16().unwrap_or(443);
        let config = self.tls.client().ok_or_else(|| {
            format!("{uri} serves TLS, and this sidecar has no certificate set in force to trust it with")
        })?;
        let name = self.server_name(host)?;
        let connect = async {
            let tcp = TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port)).await?;
            tcp.set_nodelay(true)?;
            TlsConnector::from(config).connect(name, tcp).await
        };
        match tokio::time::timeout(within, connect).await {
            Ok(Ok(stream)) => Ok(TokioIo::new(stream)),
            Ok(Err(error)) => Err(format!("{uri}: {error}")),
            Err(_) => Err(format!("{uri}: no TLS connection within {within:?}")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Upstream {
    url: String,
    channel: Channel,
}

impl Upstream {
    /// Prepares a channel without connecting: the first request connects, and a TEI that is
    /// down makes requests fail fast with UNAVAILABLE instead of stalling startup.
    pub fn lazy(url: &str, dialer: &Dialer) -> Result<Self, SetupError> {
        Self::lazy_within(url, dialer, Duration::from_secs(1))
    }

    /// The same, giving up on a connection attempt after `connect_timeout`.
    pub fn lazy_within(url: &str, dialer: &Dialer, connect_timeout: Duration) -> Result<Self, SetupError> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| SetupError::InvalidUpstream { url: url.to_owned(), reason: e.to_string() })?
            .tcp_nodelay(true)
            .connect_timeout(connect_timeout)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        let channel = if endpoint.uri().scheme_str() == Some("https") {
            let dialer = dialer.clone();
            endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
                dialer.clone().dial(uri, connect_timeout)
            }))
        } else {
            endpoint.connect_lazy()
        };
        Ok(Self { url: url.to_owned(), channel })
    }

    /// An upstream over a channel made elsewhere (the activator's balancer over a pool's ready
    /// replicas); `url` names it in logs.
    pub fn from_channel(url: &str, channel: Channel) -> Self {
        Self { url: url.to_owned(), channel }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }
}
