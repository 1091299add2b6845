//! Channels to TEI (or to another pool's multiplexer): one pooled HTTP/2 connection per upstream,
//! multiplexing every request, reconnecting on its own after failures. The RPC table's calls,
//! unary and streaming, go on a connection of their own made on `h2` directly ([`Direct`]);
//! health checks, and every call to a channel made elsewhere (the activator's balancer), on
//! tonic's channel.
//!
//! An `https://` upstream (a sidecar of a pool with `spec.tls`) is reached in TLS with this
//! sidecar's own certificate set ([`Dialer`]): it trusts the set's CA bundle and shows its own
//! certificate to peers that ask for one. Each connection takes the set in force when it is made,
//! so a rotation reaches the next reconnect.

use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use http::uri::Authority;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use teifleet_runtime::tls::ServerTls;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

pub use self::direct::{Direct, Exchange, HeldUpstream};
use crate::vocab::SetupError;

mod direct;

/// How often an upstream connection, idle or busy, is checked with a PING, and how long its PONG
/// may take: a peer that vanished without closing (its node gone) fails calls within this
/// instead of never. Both the direct connection and the tonic channel use them.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// Whether this sidecar's own ports serve TLS (or wait for a certificate to): its certificate
    /// set is the ports' (`crate::run::server::Settings::tls`), so every call it takes then came
    /// encrypted.
    pub fn serves_tls(&self) -> bool {
        !matches!(self.tls.in_force(), Ok(None))
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

    /// A TLS connection to `authority` (port 443 unless it names one).
    pub(crate) async fn dial_tls(
        &self,
        authority: &Authority,
        within: Duration,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let (host, port) = (authority.host(), authority.port_u16().unwrap_or(443));
        let config = self.tls.client().ok_or_else(|| {
            format!("{authority} serves TLS, and this sidecar has no certificate set in force to trust it with")
        })?;
        let name = self.server_name(host)?;
        let connect = async {
            let tcp = TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port)).await?;
            tcp.set_nodelay(true)?;
            TlsConnector::from(config).connect(name, tcp).await
        };
        match tokio::time::timeout(within, connect).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(error)) => Err(format!("{authority}: {error}")),
            Err(_) => Err(format!("{authority}: no TLS connection within {within:?}")),
        }
    }

    async fn dial(
        self,
        uri: Uri,
        within: Duration,
    ) -> Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>, String> {
        let authority = uri.authority().ok_or_else(|| format!("{uri} names no host"))?;
        self.dial_tls(authority, within).await.map(TokioIo::new)
    }
}

#[derive(Clone, Debug)]
pub struct Upstream {
    url: String,
    channel: Channel,
    /// The RPC table's calls' connection; none for a channel made elsewhere (the activator's
    /// balancer).
    direct: Option<Arc<Direct>>,
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
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let direct = Direct::new(endpoint.uri(), dialer, connect_timeout).map(Arc::new);
        let channel = if endpoint.uri().scheme_str() == Some("https") {
            let dialer = dialer.clone();
            endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
                dialer.clone().dial(uri, connect_timeout)
            }))
        } else {
            endpoint.connect_lazy()
        };
        Ok(Self { url: url.to_owned(), channel, direct })
    }

    /// An upstream over a channel made elsewhere (the activator's balancer over a pool's ready
    /// replicas); `url` names it in logs.
    pub fn from_channel(url: &str, channel: Channel) -> Self {
        Self { url: url.to_owned(), channel, direct: None }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where the RPC table's calls go, when not on [`Self::channel`].
    pub fn direct(&self) -> Option<&Direct> {
        self.direct.as_deref()
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }
}
