//! Every plain HTTP port teifleet opens (the admin ports, the sidecar's HTTP front) is served
//! here, with bounds on what one client can make the process hold: open connections, in all and
//! from one address (`peers`), time to send a request's head (which also closes HTTP/1.1
//! keep-alive connections left idle), connections with no request open closed after an idle
//! timeout (`idle`, HTTP/2's too), the head's size and header count, and HTTP/2's header list,
//! streams and reset floods. A port may keep a few places beyond its cap for probe requests alone
//! (`probes`), so the kubelet's probes are answered whoever holds the rest. axum's own `serve`
//! sets no timer, so hyper's header timeout never ran there: a client sending one header byte a
//! minute kept its connection forever.

mod idle;
mod peers;
mod probes;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Sleep;
use tower::ServiceExt as _;

pub use self::idle::{Busy, Open};
use self::peers::{PeerSlot, Peers};
use crate::tls::{self, MaybeTls, ServerTls};

/// What one client may make a server hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerBounds {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Connections open at once from one client address; one more from it is closed as soon as
    /// it is accepted, so one client cannot take every place under `max_connections`.
    pub max_connections_per_peer: usize,
    /// How long a connection with no request open (an idle HTTP/1.1 keep-alive connection, an
    /// HTTP/2 connection with no stream) is kept before it is closed (HTTP/2: GOAWAY first).
    pub idle_timeout: Duration,
    /// Time to send a whole request head (on a new connection, counted from its accept), and the
    /// longest an HTTP/1.1 keep-alive connection may sit idle between requests.
    pub header_read_timeout: Duration,
    /// Headers in one HTTP/1.1 request (431 beyond).
    pub max_headers: usize,
    /// Bytes of one request head: HTTP/1.1's read buffer, HTTP/2's header list.
    pub max_header_bytes: usize,
    /// HTTP/2 streams open at once on one connection.
    pub max_concurrent_streams: u32,
    /// Places beyond `max_connections` for probes: a connection that finds the port full takes
    /// one, and is served one HTTP/1.1 request for one of `probe_paths` (others are answered
    /// 503), sent within [`probes::WITHIN`], then closed. None on ports probes do not call.
    pub probe_slots: usize,
    /// The paths the kubelet's probes call on this port.
    pub probe_paths: &'static [&'static str],
}

impl ServerBounds {
    /// The bounds of a port that only probes and Prometheus call.
    /// Its callers are the kubelet (a connection per probe), Prometheus and the operator (one
    /// each), so idle connections are closed soon; its probes have places of their own. One
    /// address holds at most an eighth of the port: a client's idle connections cannot keep
    /// Prometheus or the operator from `/metrics` (it takes 8 addresses to fill the port).
    pub const ADMIN: Self = Self {
        max_connections: 256,
        max_connections_per_peer: 32,
        idle_timeout: Duration::from_secs(10),
        header_read_timeout: Duration::from_secs(10),
        max_headers: 64,
        max_header_bytes: 16 * 1024,
        max_concurrent_streams: 16,
        probe_slots: 8,
        probe_paths: &["/healthz", "/readyz"],
    };
}

/// Why a server refused a client before any request was read: the `reason` label of the
/// refusal counters.
pub const REFUSED_CONNECTION_LIMIT: &str = "connection_limit";
/// A connection closed at once because its client's address already held its share of the cap.
pub const REFUSED_PEER_LIMIT: &str = "peer_connection_limit";
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
    let cap = ConnectionCap::new(
        bounds.max_connections,
        bounds.max_connections_per_peer,
        bounds.header_read_timeout,
        refused.clone(),
    );
    let probes = probes::Reserve::new(bounds, &refused);
    let idle_timeout = bounds.idle_timeout;
    // Dropped when the server stops: every connection is told to finish what it serves and close.
    let (stopping, stop) = watch::channel(());
    // Each connection's task holds a sender: the receiver ends once every one has finished.
    let (open, mut all_closed) = mpsc::channel::<Infallible>(1);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
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
        let (place, probe_paths) = match cap.place(Some(peer.ip())) {
            Some(place) => (place, None),
            None => match probes.place(peer.ip()) {
                Some(place) => (place, Some(bounds.probe_paths)),
                None => continue,
            },
        };
        // A probe's place is kept for one prompt request: whatever else its client speaks (an
        // HTTP/2 preface, which the HTTP/1.1-only builder does not end the connection for), the
        // place is given back after `probes::WITHIN` with no request open, not the port's idle time.
        let (builder, idle_timeout) = match probe_paths {
            None => (builder.clone(), idle_timeout),
            Some(_) => (probes.builder(), probes::WITHIN),
        };
        let (router, tls, refused, mut stop, open) =
            (router.clone(), tls.clone(), refused.clone(), stop.clone(), open.clone());
        tokio::spawn(async move {
            let _open = open;
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
            let busy = Arc::new(Busy::new());
            let calls = busy.clone();
            let service = tower::service_fn(move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(client.clone());
                request.extensions_mut().insert(number);
                // Open until its answer's last byte is sent: the connection is not idle meanwhile.
                let open = calls.enter();
                let refused = probe_paths.is_some_and(|paths| !paths.contains(&request.uri().path()));
                let router = router.clone();
                async move {
                    if refused {
                        return Ok::<_, Infallible>(probes::port_full());
                    }
                    let answer = router.oneshot(request).await?;
                    Ok(answer.map(|body| axum::body::Body::new(idle::Answer::new(body, open))))
                }
            });
            let connection =
                builder.serve_connection_with_upgrades(TokioIo::new(held), TowerToHyperService::new(service));
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                // A client that resets or breaks its connection is its own business.
                _ = connection.as_mut() => return,
                () = busy.idle_for(idle_timeout) => {}
                _ = stop.changed() => {}
            }
            // HTTP/1.1: closed once the request being served is answered; HTTP/2: GOAWAY, and
            // closed once its streams are answered.
            connection.as_mut().graceful_shutdown();
            drop(connection.await);
        });
    }
    drop((stopping, open));
    // Never sent: it ends when the last connection's task has dropped its sender.
    let _ = all_closed.recv().await;
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

/// A port's cap on open connections, in all and per client address, and the time a new one has
/// to show its protocol; each connection it turns away or closes is counted through `refused`.
#[derive(Clone)]
pub struct ConnectionCap {
    open: Arc<Semaphore>,
    peers: Arc<Peers>,
    protocol_within: Duration,
    refused: Refused,
}

impl ConnectionCap {
    pub fn new(max_connections: usize, per_peer: usize, protocol_within: Duration, refused: Refused) -> Self {
        Self {
            open: Arc::new(Semaphore::new(max_connections)),
            peers: Arc::new(Peers::new(per_peer)),
            protocol_within,
            refused,
        }
    }

    /// The connection, holding its place under the cap until it closes; `None` (and the
    /// connection dropped, so closed) when the cap is reached.
    pub fn admit<Io>(&self, io: Io, peer: Option<IpAddr>) -> Option<Accepted<Io>> {
        Some(self.place(peer)?.hold(io))
    }

    /// A place under the cap for a connection just accepted from `peer`, whose protocol deadline
    /// starts now; `None` when the cap, or `peer`'s share of it, is reached. For connections
    /// that shake hands (TLS) before they are [held](Place::hold).
    pub fn place(&self, peer: Option<IpAddr>) -> Option<Place> {
        let Ok(permit) = self.open.clone().try_acquire_owned() else {
            (self.refused)(REFUSED_CONNECTION_LIMIT);
            return None;
        };
        let peer = match peer {
            None => None,
            Some(address) => match self.peers.enter(address) {
                Some(slot) => Some(slot),
                None => {
                    (self.refused)(REFUSED_PEER_LIMIT);
                    return None;
                }
            },
        };
        let deadline = tokio::time::Instant::now() + self.protocol_within;
        Some(Place { permit, peer, deadline, refused: self.refused.clone() })
    }
}

/// A connection's place under a port's cap, and the instant by which it must show its protocol.
pub struct Place {
    permit: OwnedSemaphorePermit,
    peer: Option<PeerSlot>,
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
        let place = (self.permit, self.peer);
        Accepted { io, number, matched: 0, deadline, timed_out: false, _place: place, refused: self.refused }
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
    _place: (OwnedSemaphorePermit, Option<PeerSlot>),
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
        ConnectionCap::new(1, 1, WITHIN, Arc::new(|_| {})).admit(io, None).expect("a place under the cap")
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
        let cap = ConnectionCap::new(1, 1, WITHIN, Arc::new(move |reason| counted.lock().unwrap().push(reason)));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _guard = runtime.enter();
        let first = cap.admit((), None).expect("room for one");
        assert!(cap.admit((), None).is_none(), "the cap is reached");
        drop(first);
        assert!(cap.admit((), None).is_some(), "its place is free again");
        assert_eq!(*turned_away.lock().unwrap(), [REFUSED_CONNECTION_LIMIT]);
    }

    #[test]
    fn one_address_holds_its_share_of_the_cap_and_no_more() {
        let turned_away = Arc::new(std::sync::Mutex::new(Vec::new()));
        let counted = turned_away.clone();
        let cap = ConnectionCap::new(3, 2, WITHIN, Arc::new(move |reason| counted.lock().unwrap().push(reason)));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _guard = runtime.enter();
        let (one, other): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let first = cap.admit((), Some(one)).expect("room");
        let _second = cap.admit((), Some(mapped)).expect("room: the same address, written as IPv6");
        assert!(cap.admit((), Some(one)).is_none(), "its share is held");
        let _third = cap.admit((), Some(other)).expect("another address has room");
        assert!(cap.admit((), Some(other)).is_none(), "the port is full");
        drop(first);
        assert!(cap.admit((), Some(one)).is_some(), "its place is free again");
        assert_eq!(*turned_away.lock().unwrap(), [REFUSED_PEER_LIMIT, REFUSED_CONNECTION_LIMIT]);
    }
}
