//! Every plain HTTP port teifleet opens (the admin ports, the sidecar's HTTP front) is served
//! here, with bounds on what one client can make the process hold: open connections, time to
//! send a request's head (which also closes HTTP/1.1 keep-alive connections left idle), the
//! head's size and header count, and HTTP/2's header list, streams and reset floods. axum's own
//! `serve` sets no timer, so hyper's header timeout never ran there: a client sending one header
//! byte a minute kept its connection forever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tower::ServiceExt as _;

use crate::tls::{self, MaybeTls, ServerTls};

/// What one client may make a server hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerBounds {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Time to send a whole request head (on a new connection, counted from its accept), and the
    /// longest an HTTP/1.1 keep-alive connection may sit idle between requests.
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
/// A connection closed because its client did not show its protocol within the header timeout.
pub const REFUSED_NO_PROTOCOL: &str = "no_protocol";

/// Told each time a bound turns a client away, with the bound's reason.
pub type Refused = Arc<dyn Fn(&'static str) + Send + Sync>;

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
    serve_tls(listener, router, bounds, None, refused, shutdown).await
}

/// Which connection a request came on (in its extensions): unique in the process, so per-connection
/// state (a pool's door keeps one line per connection) can be keyed by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnectionNumber(pub u64);

/// [`serve`], in TLS while `tls` says so: each connection shakes hands with the certificate in
/// force when it arrives, within the header timeout, and its requests carry the client's
/// identity (`Option<ClientIdentity>`, in their extensions) when it showed a certificate.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    bounds: &ServerBounds,
    tls: Option<Arc<ServerTls>>,
    refused: impl Fn(&'static str) + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let builder = Arc::new(builder(bounds));
    let refused: Refused = Arc::new(refused);
    let cap = ConnectionCap::new(bounds.max_connections, bounds.header_read_timeout, refused.clone());
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
        let _ = stream.set_nodelay(true);
        let Some(place) = cap.place() else { continue };
        let (router, builder, tls, refused, watcher) =
            (router.clone(), builder.clone(), tls.clone(), refused.clone(), graceful.watcher());
        tokio::spawn(async move {
            let stream = match &tls {
                None => MaybeTls::Plain(stream),
                Some(tls) => match tls::accept(tls, stream, place.deadline()).await {
                    Ok(stream) => stream,
                    Err(reason) => return refused(reason),
                },
            };
            let client = stream.client().cloned();
            let held = place.hold(stream);
            let number = ConnectionNumber(held.number());
            let router = router.map_request(move |mut request: axum::http::Request<_>| {
                request.extensions_mut().insert(client.clone());
                request.extensions_mut().insert(number);
                request
            });
            let service = TowerToHyperService::new(router);
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(held), service);
            // A client that resets or breaks its connection is its own business.
            drop(watcher.watch(connection.into_owned()).await);
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

/// HTTP/2's connection preface, which hyper looks for in a connection's first bytes.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A port's cap on open connections, and the time a new one has to show its protocol; each
/// connection it turns away or closes is counted through `refused`.
#[derive(Clone)]
pub struct ConnectionCap {
    open: Arc<Semaphore>,
    protocol_within: Duration,
    refused: Refused,
}

impl ConnectionCap {
    pub fn new(max_connections: usize, protocol_within: Duration, refused: Refused) -> Self {
        Self { open: Arc::new(Semaphore::new(max_connections)), protocol_within, refused }
    }

    /// The connection, holding its place under the cap until it closes; `None` (and the
    /// connection dropped, so closed) when the cap is reached.
    pub fn admit<Io>(&self, io: Io) -> Option<Accepted<Io>> {
        Some(self.place()?.hold(io))
    }

    /// A place under the cap for a connection just accepted, whose protocol deadline starts now;
    /// `None` when the cap is reached. For connections that shake hands (TLS) before they are
    /// [held](Place::hold).
    pub fn place(&self) -> Option<Place> {
        let Ok(permit) = self.open.clone().try_acquire_owned() else {
            (self.refused)(REFUSED_CONNECTION_LIMIT);
            return None;
        };
        let deadline = tokio::time::Instant::now() + self.protocol_within;
        Some(Place { permit, deadline, refused: self.refused.clone() })
    }
}

/// A connection's place under a port's cap, and the instant by which it must show its protocol.
pub struct Place {
    permit: OwnedSemaphorePermit,
    deadline: tokio::time::Instant,
    refused: Refused,
}

impl Place {
    /// When the client must have shown its protocol (a TLS handshake counts against it too).
    pub fn deadline(&self) -> tokio::time::Instant {
        self.deadline
    }

    /// `io` in this place, under what is left of the protocol deadline.
    pub fn hold<Io>(self, io: Io) -> Accepted<Io> {
        let deadline = Some(Box::pin(tokio::time::sleep_until(self.deadline)));
        let number = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
        Accepted { io, number, matched: 0, deadline, timed_out: false, _place: self.permit, refused: self.refused }
    }
}

/// A connection under a port's bounds: it holds a place under the cap while open, and its client
/// must show which protocol it speaks within a deadline: a first byte that is not HTTP/2's, or
/// the whole preface. hyper and tonic read those bytes with no timer of their own (hyper's header
/// timeout starts once HTTP/1.1 is known; HTTP/2 has none), so a client that sent nothing, or
/// half the preface, kept its connection, and its place under the cap, forever.
pub struct Accepted<Io> {
    io: Io,
    /// Unique in this process: per-connection state elsewhere is keyed by it.
    number: u64,
    /// Bytes of the preface received so far, while the protocol is not known.
    matched: usize,
    deadline: Option<Pin<Box<Sleep>>>,
    /// The deadline passed (counted once, however often the server reads again).
    timed_out: bool,
    _place: OwnedSemaphorePermit,
    refused: Refused,
}

impl<Io> Accepted<Io> {
    /// The connection's number, unique in this process.
    pub fn number(&self) -> u64 {
        self.number
    }
}

/// Numbers accepted connections, across every port.
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(0);

/// What tonic puts in every request of an accepted connection: the connection's number and what
/// its transport says (for TLS, the client's proven identity).
#[derive(Clone, Debug)]
pub struct ConnectionInfo<T> {
    pub number: u64,
    pub transport: T,
}

#[cfg(feature = "tonic")]
impl<Io: tonic::transport::server::Connected> tonic::transport::server::Connected for Accepted<Io> {
    type ConnectInfo = ConnectionInfo<Io::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnectionInfo { number: self.number(), transport: self.io.connect_info() }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Accepted<Io> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Some(deadline) = &mut self.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            if !self.timed_out {
                self.timed_out = true;
                (self.refused)(REFUSED_NO_PROTOCOL);
            }
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "no protocol within the header timeout")));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if self.deadline.is_some() {
            let this = &mut *self;
            for &byte in &buf.filled()[before..] {
                if H2_PREFACE.get(this.matched) != Some(&byte) {
                    this.deadline = None;
                    break;
                }
                this.matched += 1;
            }
            if this.matched == H2_PREFACE.len() {
                this.deadline = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Accepted<Io> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    const WITHIN: Duration = Duration::from_millis(50);

    fn accepted<Io>(io: Io) -> Accepted<Io> {
        ConnectionCap::new(1, WITHIN, Arc::new(|_| {})).admit(io).expect("a place under the cap")
    }

    /// Sends `first`, reads it through an [`Accepted`] connection, and reads again past the
    /// deadline.
    async fn read_past_the_deadline(first: &[u8]) -> io::Result<usize> {
        let (mut client, server) = tokio::io::duplex(64);
        let mut server = accepted(server);
        let mut buffer = [0; 64];
        client.write_all(first).await?;
        assert_eq!(server.read(&mut buffer).await?, first.len());
        tokio::time::sleep(WITHIN * 2).await;
        client.write_all(b"x").await?;
        server.read(&mut buffer).await
    }

    #[tokio::test]
    async fn a_client_has_until_the_deadline_to_show_its_protocol() {
        // HTTP/1.1 is known at the first byte off HTTP/2's preface ("PO"), HTTP/2 at its last.
        assert_eq!(read_past_the_deadline(b"POST /embed").await.unwrap(), 1);
        assert_eq!(read_past_the_deadline(H2_PREFACE).await.unwrap(), 1);
        let undecided = read_past_the_deadline(&H2_PREFACE[..16]).await.unwrap_err();
        assert_eq!(undecided.kind(), io::ErrorKind::TimedOut);
        let (_client, server) = tokio::io::duplex(64);
        let silent = accepted(server).read(&mut [0; 64]).await.unwrap_err();
        assert_eq!(silent.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn a_connection_holds_its_place_under_the_cap_until_it_closes() {
        let turned_away = Arc::new(std::sync::Mutex::new(Vec::new()));
        let counted = turned_away.clone();
        let cap = ConnectionCap::new(1, WITHIN, Arc::new(move |reason| counted.lock().unwrap().push(reason)));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _guard = runtime.enter();
        let first = cap.admit(()).expect("room for one");
        assert!(cap.admit(()).is_none(), "the cap is reached");
        drop(first);
        assert!(cap.admit(()).is_some(), "its place is free again");
        assert_eq!(*turned_away.lock().unwrap(), [REFUSED_CONNECTION_LIMIT]);
    }
}
