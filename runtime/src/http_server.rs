//! Every plain HTTP port teifleet opens (the admin ports, the sidecar's HTTP front) is served
//! here, with bounds on what one client can make the process hold: open connections, time to
//! send a request's head (which also closes HTTP/1.1 keep-alive connections left idle), the
//! head's size and header count, and HTTP/2's header list, streams and reset floods. axum's own
//! `serve` sets no timer, so hyper's header timeout never ran there: a client sending one header
//! byte a minute kept its connection forever.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What one client may make a server hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerBounds {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Time to send a whole request head, and the longest an HTTP/1.1 keep-alive connection may
    /// sit idle between requests.
    pub header_read_timeout: Duration,
    /// Headers in one HTTP/1.1 request (431 beyond).
    pub max_headers: usize,
    /// Bytes of one request head: HTTP/1.1's read buffer, HTTP/2's header list.
    pub max_header_bytes: usize,
    /// HTTP/2 streams open at once on one connection.
    pub max_concurrent_streams: u32,
}

impl ServerBounds {
    /// The bounds of a port that only probes and Prometheus call.
    pub const ADMIN: Self = Self {
        max_connections: 256,
        header_read_timeout: Duration::from_secs(10),
        max_headers: 64,
        max_header_bytes: 16 * 1024,
        max_concurrent_streams: 16,
    };
}

/// Why a server refused a client before any request was read: the `reason` label of the
/// refusal counters.
pub const REFUSED_CONNECTION_LIMIT: &str = "connection_limit";

/// Serves `router` on `listener` within `bounds` until `shutdown` resolves, then lets open
/// requests finish. `refused` is told each time a bound turns a client away here (the bounds
/// hyper enforces inside a connection answer the client themselves: 431, a closed connection).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: &ServerBounds,
    refused: impl Fn(&'static str) + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let builder = builder(bounds);
    let open = Arc::new(Semaphore::new(bounds.max_connections));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors and the like: the next accept may succeed.
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            refused(REFUSED_CONNECTION_LIMIT);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A client that resets or breaks its connection is its own business.
            let _ = connection.await;
            drop(permit);
        });
    }
    graceful.shutdown().await;
    Ok(())
}

fn builder(bounds: &ServerBounds) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read_timeout)
        .max_headers(bounds.max_headers)
        // hyper's floor for its read buffer is 8 KiB.
        .max_buf_size(bounds.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(bounds.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(bounds.max_concurrent_streams)
        .max_pending_accept_reset_streams(Some(bounds.max_concurrent_streams as usize))
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    builder
}
