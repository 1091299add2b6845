//! The gRPC port's HTTP/2 server, on the `h2` crate directly: each connection is one task that
//! accepts streams and PINGs, and each stream one task that runs the call and writes its answer.
//!
//! Why not tonic's `Server` (hyper's HTTP/2 server under tower layers and an axum router): on a
//! proxied unary call those layers cost more CPU and latency than the sidecar's own work (a
//! boxed service and body per layer, a hyper task per stream, a router lookup), measured in
//! `make bench` scenarios 1 and 5 against a floor written on `h2` alone. What they did is kept
//! here, each in one place: the bounds of [`Bounds`] (streams, header list, reset floods,
//! keepalive, connection age, idle timeout), the connection's number and TLS identity in every request
//! ([`ConnectionInfo`]), tonic's `grpc-timeout` backstop, and a drain that lets calls in flight
//! finish. [`crate::front::grpc::service::RpcService`] serves the RPC table's calls; tonic's routes (health,
//! reflection, UNIMPLEMENTED) the rest.

mod answer;
mod drained;
mod stream;

use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use teifleet_runtime::http_server::{Accepted, Busy};
use teifleet_runtime::tls::MaybeTls;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc::{self, UnboundedSender};
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use tonic::transport::server::Connected as _;

pub use self::answer::room_for as room_for_answer;
pub use self::stream::{BUFFERED_PER_BYTE, Dispatch, REFUSED_MEMORY, RequestBody, STREAM_BYTES};
use crate::front::grpc::connections::ConnectionInfo;
use crate::transport::corked::{self, Socket};
use crate::transport::keepalive;

/// Flow-control windows offered to clients: hyper's server defaults, which tonic's `Server` used.
const STREAM_WINDOW: u32 = 1024 * 1024;
const CONNECTION_WINDOW: u32 = 1024 * 1024;
/// How much framing overhead of small DATA frames h2 may hold for a connection before it closes
/// it (GOAWAY `ENHANCE_YOUR_CALM` "too_many_data_frames"): each frame under 256 bytes costs 256
/// less its size until a stream's reader takes it. Streams' bodies are drained as they arrive
/// (`server::drained`), but h2 takes in a whole burst read from the socket before any reader
/// runs, and a client streaming small messages as fast as it can sends thousands in one burst (a
/// 20-byte message costs 236; h2's default, half the connection window, allows about 2,200).
/// This allows about 35,000 such frames in one burst, a few megabytes of h2's buffers at most.
const DATA_FRAME_BUDGET: usize = 8 * 1024 * 1024;

/// What one HTTP/2 connection may do, and how long it lives.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub max_concurrent_streams: u32,
    pub max_header_list_bytes: u32,
    /// Streams a client may reset before the server accepts them; one more is a reset flood
    /// (CVE-2023-44487), answered with GOAWAY `ENHANCE_YOUR_CALM`.
    pub max_pending_accept_reset_streams: usize,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Connections older than this get a GOAWAY, so clients behind a ClusterIP rebalance...
    pub max_connection_age: Duration,
    /// ...and are closed this long after it, with whatever is still in flight.
    pub max_connection_age_grace: Duration,
    /// Connections with no stream open this long get a GOAWAY, and are closed once the client
    /// has had the grace to leave: idle connections do not keep places under the port's cap.
    pub idle_timeout: Duration,
}

/// Serves `dispatch` on every connection `incoming` yields until `stop` is cancelled; then each
/// connection is told GOAWAY, and this returns once their calls in flight have finished.
pub async fn serve<S>(incoming: S, dispatch: Dispatch, bounds: Bounds, stop: CancellationToken)
where
    S: Stream<Item = Result<Accepted<MaybeTls<TcpStream>>, io::Error>>,
{
    let connections = TaskTracker::new();
    let mut incoming = std::pin::pin!(incoming);
    loop {
        let accepted = tokio::select! {
            accepted = incoming.next() => accepted,
            () = stop.cancelled() => break,
        };
        let Some(Ok(io)) = accepted else { break };
        let info: ConnectionInfo = io.connect_info();
        connections.spawn(serve_connection(io, info, dispatch.clone(), bounds.clone(), stop.clone()));
    }
    connections.close();
    connections.wait().await;
}

async fn serve_connection<Io>(io: Io, info: ConnectionInfo, dispatch: Dispatch, bounds: Bounds, stop: CancellationToken)
where
    Io: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (corked, uncork) = corked::cork(Box::pin(io) as Socket);
    let handshake = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .data_frame_budget(DATA_FRAME_BUDGET)
        .max_concurrent_streams(bounds.max_concurrent_streams)
        .max_header_list_size(bounds.max_header_list_bytes)
        .max_pending_accept_reset_streams(bounds.max_pending_accept_reset_streams)
        .handshake::<_, answer::AnswerBuf>(corked);
    // The client's preface is timed by `Accepted` (the header timeout): no timer here.
    let mut connection = match handshake.await {
        Ok(connection) => connection,
        Err(error) => return tracing::debug!(%error, "HTTP/2 handshake failed"),
    };
    let streams = TaskTracker::new();
    // The connection's timers run in a task of their own, which tells this one what they call
    // for: a connection task wakes several times per call, and polling two timers and the stop
    // token at every wake cost more than reading one channel.
    let (tell, mut told) = mpsc::unbounded_channel();
    let busy = Arc::new(Busy::new());
    let _watch = AbortOnDropHandle::new(tokio::spawn(watch(connection.ping_pong(), bounds, busy.clone(), stop, tell)));
    let mut closing = false;
    loop {
        tokio::select! {
            accepted = poll_fn(|cx| {
                let accepted = connection.poll_accept(cx);
                // What h2 wrote in this wake-up, every stream's frames and its own, leaves in
                // one write (`corked`).
                uncork.poll_send(cx);
                accepted
            }) => match accepted {
                Some(Ok((request, respond))) => {
                    // Open until the call's task ends: the connection is not idle meanwhile.
                    let (open, call) = (busy.enter(), stream::serve(request, respond, &dispatch, &info));
                    streams.spawn(async move {
                        call.await;
                        drop(open);
                    });
                }
                Some(Err(error)) => {
                    tracing::debug!(%error, "HTTP/2 connection failed");
                    break;
                }
                None => break,
            },
            Some(event) = told.recv() => match event {
                Watch::GoAway if !closing => {
                    closing = true;
                    connection.graceful_shutdown();
                }
                Watch::GoAway => {}
                Watch::Close(why) => {
                    tracing::debug!("{why}: connection closed");
                    break;
                }
            },
        }
    }
    drop(connection);
    // Calls still running (their connection closed) end as their clients are gone.
    streams.close();
    streams.wait().await;
}

/// What a connection's timers call for.
#[derive(Debug)]
enum Watch {
    /// Tell the client GOAWAY and finish the calls in flight: the server is stopping, or the
    /// connection has reached its age or sat idle past its timeout.
    GoAway,
    /// Close it now: the client left a PING unanswered, or the connection is past its age (or
    /// idle timeout) and grace.
    Close(&'static str),
}

/// A connection's timers: keepalive PINGs, its age and grace, its idle timeout and grace, and the
/// server's stop.
async fn watch(
    pings: Option<h2::PingPong>,
    bounds: Bounds,
    busy: Arc<Busy>,
    stop: CancellationToken,
    tell: UnboundedSender<Watch>,
) {
    let born = tokio::time::Instant::now();
    let ages = async {
        tokio::select! {
            () = tokio::time::sleep_until(born + bounds.max_connection_age) => {}
            () = stop.cancelled() => {
                let _ = tell.send(Watch::GoAway);
                tokio::time::sleep_until(born + bounds.max_connection_age).await;
            }
        }
        let _ = tell.send(Watch::GoAway);
        tokio::time::sleep(bounds.max_connection_age_grace).await;
        let _ = tell.send(Watch::Close("connection past its age and grace"));
    };
    let idle = async {
        busy.idle_for(bounds.idle_timeout).await;
        let _ = tell.send(Watch::GoAway);
        tokio::time::sleep(bounds.max_connection_age_grace).await;
        let _ = tell.send(Watch::Close("idle connection past its grace"));
    };
    tokio::select! {
        () = keepalive::unanswered(pings, bounds.keepalive_interval, bounds.keepalive_timeout) => {
            let _ = tell.send(Watch::Close("client unanswered PING"));
        }
        () = ages => {}
        () = idle => {}
    }
}
