//! Channels to TEI (or to another pool's multiplexer): one pooled HTTP/2 connection per upstream,
//! multiplexing every request, reconnecting on its own after failures.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::SetupError;

#[derive(Clone, Debug)]
pub struct Upstream {
    url: String,
    channel: Channel,
}

impl Upstream {
    /// Prepares a channel without connecting: the first request connects, and a TEI that is
    /// down makes requests fail fast with UNAVAILABLE instead of stalling startup.
    pub fn lazy(url: &str) -> Result<Self, SetupError> {
        Self::lazy_within(url, Duration::from_secs(1))
    }

    /// The same, giving up on a connection attempt after `connect_timeout`.
    pub fn lazy_within(url: &str, connect_timeout: Duration) -> Result<Self, SetupError> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| SetupError::InvalidUpstream { url: url.to_owned(), reason: e.to_string() })?
            .tcp_nodelay(true)
            .connect_timeout(connect_timeout)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        Ok(Self { url: url.to_owned(), channel: endpoint.connect_lazy() })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }
}
