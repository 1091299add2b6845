//! Places beyond a port's cap that only the kubelet's probes can use: a connection that finds the
//! port full (every place held, by one client or many) takes one, and is served one HTTP/1.1
//! request for a probe path within [`WITHIN`], then closed. A client holds such a place a second
//! at most by saying nothing, and no longer than a probe's answer by asking, so idle or slow
//! connections, however many, cannot make the kubelet restart the pod.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto::Builder;

use super::{ConnectionCap, Place, REFUSED_CONNECTION_LIMIT, REFUSED_PEER_LIMIT, Refused, ServerBounds};

/// The time a connection on a probe's place has to send its whole request: the kubelet sends it
/// as soon as it has connected, and its own probe timeout defaults to a second.
pub const WITHIN: Duration = Duration::from_secs(1);
/// Probe places one address may hold at once: the kubelet runs a container's liveness, readiness
/// and startup probes side by side.
const PER_PEER: usize = 3;

/// A port's probe places, if it keeps any.
pub struct Reserve {
    cap: Option<ConnectionCap>,
    builder: Arc<Builder<TokioExecutor>>,
}

impl Reserve {
    pub fn new(bounds: &ServerBounds, refused: &Refused) -> Self {
        let refused = refused.clone();
        // The port's own cap has counted the connection as turned away already.
        let counted: Refused = Arc::new(move |reason| {
            if reason != REFUSED_CONNECTION_LIMIT && reason != REFUSED_PEER_LIMIT {
                refused(reason);
            }
        });
        let cap = (bounds.probe_slots > 0).then(|| ConnectionCap::new(bounds.probe_slots, PER_PEER, WITHIN, counted));
        let mut builder = Builder::new(TokioExecutor::new()).http1_only();
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(WITHIN)
            .keep_alive(false)
            .max_headers(bounds.max_headers)
            .max_buf_size(bounds.max_header_bytes.max(8192));
        Self { cap, builder: Arc::new(builder) }
    }

    /// A probe place for a connection from `peer`, if one is free.
    pub fn place(&self, peer: std::net::IpAddr) -> Option<Place> {
        self.cap.as_ref()?.place(Some(peer))
    }

    /// How connections on probe places are served: HTTP/1.1, one request each.
    pub fn builder(&self) -> Arc<Builder<TokioExecutor>> {
        self.builder.clone()
    }
}

/// The answer to anything but a probe on a probe's place.
pub fn port_full() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "the port's connections are all taken; only probes are served\n").into_response()
}
