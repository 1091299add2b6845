//! Calls to an upstream on the `h2` crate directly, on one shared HTTP/2 connection: a unary
//! call's headers and its one message go out from the calling task, and the answer's headers,
//! message and trailers come back to it. No tower buffer, no hyper dispatch task and no
//! body task sit between the call and the connection: the bench's h2 floor showed those layers
//! cost about as much CPU per call as the whole of HAProxy's hop (docs/benchmarks.md).
//!
//! What tonic's client did for these calls is done here the same way: the caller's metadata goes
//! up minus the headers gRPC reserves, the answer's headers and trailers come back as its
//! metadata, TEI's status (with its message, details and metadata) is passed on as it came, and an
//! answer larger than `--max-message-bytes` is OUT_OF_RANGE. A connection that cannot be made or
//! breaks is `Error::Unreachable`. Streaming calls are in `stream`; health checks stay on tonic's
//! channel.

use std::future::{Future as _, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use h2::SendStream;
use h2::client::{ResponseFuture, SendRequest};
use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST, TE, TRANSFER_ENCODING, UPGRADE};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};

use super::{Dialer, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
use crate::error::{Error, Result};
use crate::gate::request_meta;
use crate::transport::corked::{self, Socket};
use crate::transport::keepalive;
use crate::vocab::framing::{self, Framed, Messages, Side};
use crate::vocab::framing::{GRPC_MESSAGE, GRPC_STATUS};
use crate::vocab::rpc::RPCS;

/// hyper's client windows, which tonic's channel used: large answers (a batch's embeddings) flow
/// without waiting on window updates.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
/// Request headers not passed up: the ones gRPC sets itself and those HTTP/2 forbids (`te` and
/// `content-type` are set anew, replacing the caller's). Names, not text: a `&str` key is parsed
/// on every lookup, and these are removed from every call.
static NOT_PASSED: [HeaderName; 9] = [
    CONTENT_LENGTH,
    GRPC_STATUS,
    GRPC_MESSAGE,
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    TRANSFER_ENCODING,
    UPGRADE,
    HOST,
];

/// One upstream's HTTP/2 connection for unary calls, made at the first call and again after it
/// breaks.
#[derive(Debug)]
pub struct Direct {
    url: String,
    scheme: Scheme,
    authority: Authority,
    dialer: Dialer,
    connect_timeout: Duration,
    open: Mutex<Option<Open>>,
    /// One connection attempt at a time: callers arriving meanwhile wait for it.
    connecting: tokio::sync::Mutex<()>,
    /// The URI of each RPC of the table here, made once: parsing a path and building a URI was
    /// a visible part of every call's own work (callgrind).
    uris: Vec<(&'static str, Uri)>,
}

#[derive(Clone, Debug)]
struct Open {
    send: SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
}

impl Direct {
    pub fn new(uri: &Uri, dialer: &Dialer, connect_timeout: Duration) -> Option<Self> {
        let scheme = uri.scheme().cloned()?;
        let authority = uri.authority().cloned()?;
        let uris =
            RPCS.iter().filter_map(|rpc| Some((rpc.path, uri_of(&scheme, &authority, rpc.path).ok()?))).collect();
        Some(Self {
            url: uri.to_string(),
            scheme,
            authority,
            dialer: dialer.clone(),
            connect_timeout,
            open: Mutex::default(),
            connecting: tokio::sync::Mutex::default(),
            uris,
        })
    }

    /// Sends one unary call of `path` and waits for its answer; an answer's message is at most
    /// `max_message` bytes.
    pub async fn unary(
        &self,
        pool: &str,
        path: &'static str,
        request: Request<Framed>,
        max_message: usize,
    ) -> Result<Response<Framed>> {
        let (metadata, _, message) = request.into_parts();
        let (answer, mut body) = self.start(pool, path, metadata).await?;
        body.send_data(message.into_framed(), true).map_err(|error| self.failed(pool, error))?;
        let response = answer.await.map_err(|error| self.failed(pool, error))?;
        read_answer(response, body, max_message).await.map_err(|error| match error {
            Answer::Status(status) => Error::Upstream { pool: pool.to_owned(), status },
            Answer::Broken(error) => self.failed(pool, error),
        })
    }

    /// Opens a call of `path` with the caller's `metadata`: its headers sent, its messages to
    /// follow on the stream returned.
    async fn start(
        &self,
        pool: &str,
        path: &'static str,
        metadata: MetadataMap,
    ) -> Result<(ResponseFuture, SendStream<Bytes>)> {
        let unreachable = |reason: String| Error::Unreachable { pool: pool.to_owned(), reason };
        let open = match self.current() {
            Some(open) => open,
            // Boxed: connecting (TCP, TLS, HTTP/2's handshake) is rare, and every call's future
            // would otherwise carry its room.
            None => Box::pin(self.open()).await.map_err(unreachable)?,
        };
        // A connection that cannot open a stream (gone, or going away) is made again at the next
        // call; this one fails as unreachable, as it did on tonic's channel.
        let closing = |error: h2::Error| {
            open.closed.store(true, Ordering::Release);
            self.failed(pool, error)
        };
        let mut send = open.send.clone().ready().await.map_err(closing)?;
        let head = self.head(path, metadata.into_headers()).map_err(|e| unreachable(e.to_string()))?;
        send.send_request(head, false).map_err(closing)
    }

    /// What a broken stream or connection means to the call: the status of a stream the upstream
    /// reset, or an unreachable upstream.
    fn failed(&self, pool: &str, error: h2::Error) -> Error {
        broken(pool, &self.url, error)
    }

    fn head(&self, path: &'static str, mut headers: HeaderMap) -> http::Result<http::Request<()>> {
        request_meta::remove_all(&mut headers, &NOT_PASSED);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        let known = self.uris.iter().find(|(known, _)| std::ptr::eq(*known, path) || *known == path);
        let uri = match known {
            Some((_, uri)) => uri.clone(),
            None => uri_of(&self.scheme, &self.authority, path)?,
        };
        let mut head = http::Request::new(());
        *head.method_mut() = Method::POST;
        *head.uri_mut() = uri;
        *head.headers_mut() = headers;
        Ok(head)
    }

    /// The open connection, or a new one.
    async fn open(&self) -> Result<Open, String> {
        if let Some(open) = self.current() {
            return Ok(open);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(open) = self.current() {
            return Ok(open);
        }
        let open = tokio::time::timeout(self.connect_timeout, self.connect())
            .await
            .unwrap_or_else(|_| Err(format!("{}: no connection within {:?}", self.url, self.connect_timeout)))?;
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = Some(open.clone());
        Ok(open)
    }

    fn current(&self) -> Option<Open> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.as_ref().filter(|open| !open.closed.load(Ordering::Acquire)).cloned()
    }

    async fn connect(&self) -> Result<Open, String> {
        if self.scheme == Scheme::HTTPS {
            let tls = self.dialer.dial_tls(&self.authority, self.connect_timeout).await?;
            return handshake(tls).await.map_err(|e| format!("{}: {e}", self.url));
        }
        let tcp = TcpStream::connect(self.authority.as_str()).await.map_err(|e| format!("{}: {e}", self.url))?;
        tcp.set_nodelay(true).map_err(|e| format!("{}: {e}", self.url))?;
        handshake(tcp).await.map_err(|e| format!("{}: {e}", self.url))
    }
}

/// Opens HTTP/2 on `io` and drives the connection in a task of its own, which PINGs it and ends
/// (marking it closed) when it breaks, goes unanswered or is no longer used.
async fn handshake<T>(io: T) -> Result<Open, h2::Error>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Corked as the gRPC port's connections are, and the same type (`crate::transport::corked`): the
    // requests of one wake-up leave in one write.
    let (corked, uncork) = corked::cork(Box::pin(io) as Socket);
    let (send, mut connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .enable_push(false)
        .handshake::<_, Bytes>(corked)
        .await?;
    let closed = Arc::new(AtomicBool::new(false));
    let pings = connection.ping_pong();
    let marks = closed.clone();
    tokio::spawn(async move {
        let (_watch, unanswered) = keepalive::watched(pings, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT);
        let driven = poll_fn(|cx| {
            let done = Pin::new(&mut connection).poll(cx);
            uncork.poll_send(cx);
            done
        });
        tokio::select! {
            _ = driven => {}
            Ok(()) = unanswered => tracing::debug!("upstream connection unanswered for {KEEPALIVE_TIMEOUT:?}: closed"),
        }
        marks.store(true, Ordering::Release);
    });
    Ok(Open { send, closed })
}

/// Why an answer did not come back whole.
enum Answer {
    /// gRPC's own answer: the upstream's status, or the answer was not one gRPC message.
    Status(Status),
    /// The stream or connection broke while the answer was read.
    Broken(h2::Error),
}

impl From<h2::Error> for Answer {
    fn from(error: h2::Error) -> Self {
        Self::Broken(error)
    }
}

/// The upstream stream of a unary call answered whole, held in the answer's extensions until the
/// gRPC port has queued the answer's headers for the caller (`crate::front::grpc::server`).
///
/// Why: h2 wakes a connection's task when the last handle of a closed stream is dropped, so that
/// it can let the stream go. Dropped as the answer was read, that woke the upstream connection's
/// task before the caller's connection's task was woken to write the answer, and the
/// single-threaded runtime ran them in that order: a full poll of the upstream connection sat
/// between TEI's answer and the caller's on every call. Held until the answer is queued, that
/// poll comes after the answer's write. Any other path that takes the answer (the HTTP front, a
/// shared coalesced call) drops it with the answer, as before.
#[derive(Clone)]
pub struct HeldUpstream(#[expect(dead_code, reason = "held, never read")] Arc<(SendStream<Bytes>, h2::RecvStream)>);

/// The answer's one message, with its headers and trailers as metadata; or the upstream's status.
/// `sent` is the call's request side, held with the answer's ([`HeldUpstream`]).
async fn read_answer(
    response: http::Response<h2::RecvStream>,
    sent: SendStream<Bytes>,
    max_message: usize,
) -> Result<Response<Framed>, Answer> {
    let (parts, mut body) = response.into_parts();
    // Trailers-only: the status is in the headers and there is no message.
    if let Some(status) = carried_status(&parts.headers) {
        return Err(Answer::Status(status.err().unwrap_or_else(|| framing::missing(Side::Answer))));
    }
    if parts.status != StatusCode::OK {
        return Err(Answer::Status(from_http_status(parts.status, parts.headers)));
    }
    let mut messages = Messages::new(max_message, Side::Answer);
    let mut message = None;
    while let Some(data) = body.data().await {
        let data = data?;
        let _ = body.flow_control().release_capacity(data.len());
        messages.push(data);
        // Messages after the first are checked and dropped, as tonic's client does.
        while let Some(next) = messages.take_framed().map_err(Answer::Status)? {
            message.get_or_insert(next);
        }
    }
    let mut headers = parts.headers;
    if let Some(trailers) = body.trailers().await? {
        match carried_status(&trailers) {
            Some(Err(status)) => return Err(Answer::Status(status)),
            _ => headers.extend(trailers),
        }
    }
    if messages.is_cut_short() {
        return Err(Answer::Status(framing::cut_short()));
    }
    let message = message.ok_or_else(|| Answer::Status(framing::missing(Side::Answer)))?;
    let mut extensions = tonic::Extensions::default();
    extensions.insert(HeldUpstream(Arc::new((sent, body))));
    Ok(Response::from_parts(MetadataMap::from_headers(headers), message, extensions))
}

/// The status a header block carries, if any: an OK one is told from its code alone, since
/// reading a whole `Status` (message, details, the rest as metadata) copies the block, and every
/// answer ends with one.
fn carried_status(headers: &HeaderMap) -> Option<std::result::Result<(), Status>> {
    match headers.get(&GRPC_STATUS)? {
        code if code == "0" => Some(Ok(())),
        _ => Status::from_header_map(headers).filter(|status| status.code() != Code::Ok).map(Err).or(Some(Ok(()))),
    }
}

/// An answer that is not gRPC's (a proxy's error page): the code gRPC maps its HTTP status to.
fn from_http_status(status: StatusCode, headers: HeaderMap) -> Status {
    let code = match status {
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    let message = format!("grpc-status header missing, mapped from HTTP status code {}", status.as_u16());
    Status::with_metadata(code, message, MetadataMap::from_headers(headers))
}

/// The URI of `path` at an upstream.
fn uri_of(scheme: &Scheme, authority: &Authority, path: &'static str) -> http::Result<Uri> {
    Uri::builder()
        .scheme(scheme.clone())
        .authority(authority.clone())
        .path_and_query(PathAndQuery::from_static(path))
        .build()
}

/// A broken stream or connection to `url`, as the call's error.
fn broken(pool: &str, url: &str, error: h2::Error) -> Error {
    match stream_status(&error) {
        Some(status) => Error::Upstream { pool: pool.to_owned(), status },
        None => Error::Unreachable { pool: pool.to_owned(), reason: format!("{url}: {error}") },
    }
}

/// The status a stream reset by the upstream stands for (REFUSED_STREAM is UNAVAILABLE, CANCEL
/// is CANCELLED, ...), as tonic maps it; `None` when the connection itself failed.
fn stream_status(error: &h2::Error) -> Option<Status> {
    if !error.is_reset() || error.is_go_away() || error.is_io() {
        return None;
    }
    let reason = error.reason()?;
    let code = match reason {
        h2::Reason::REFUSED_STREAM => Code::Unavailable,
        h2::Reason::CANCEL => Code::Cancelled,
        h2::Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
        h2::Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
        _ => Code::Internal,
    };
    Some(Status::new(code, format!("h2 protocol error: {error}")))
}

mod stream;

pub use self::stream::Exchange;

#[cfg(test)]
mod tests;
