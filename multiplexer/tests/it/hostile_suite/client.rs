//! Clients that say what the server did, whatever it did: a gRPC call over a raw HTTP/2
//! connection (any bytes as its messages, any headers, a window of zero), an HTTP/1.1 exchange
//! on a TCP connection of its own. A broken stream, a closed connection or no answer in time is an
//! outcome here, not a panic: it is what the suite reports.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use h2::client::SendRequest;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

use super::table::GrpcRow;

/// How long any one call of the suite may take before it counts as not answered.
pub const CALL_LIMIT: Duration = Duration::from_secs(15);

/// A TCP connection from `from` (a loopback address of its own, so it is another peer).
pub async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// An HTTP/2 connection (prior knowledge, as gRPC clients and h2c speak it). `window`: the
/// initial stream window the client grants, `Some(0)` for a client that never reads answers.
pub async fn h2(tcp: TcpStream, window: Option<u32>) -> Result<SendRequest<Bytes>, String> {
    let mut builder = h2::client::Builder::new();
    if let Some(window) = window {
        builder.initial_window_size(window);
    }
    let (client, connection) = builder.handshake(tcp).await.map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(connection);
    Ok(client)
}

pub async fn h2_to(addr: SocketAddr) -> Result<SendRequest<Bytes>, String> {
    h2(TcpStream::connect(addr).await.map_err(|e| e.to_string())?, None).await
}

/// gRPC's length-prefixed framing of one message.
pub fn frame(message: &[u8]) -> Bytes {
    frame_as(0, u32::try_from(message.len()).unwrap_or(u32::MAX), message)
}

/// A frame with its compressed flag and declared length as given, whatever follows.
pub fn frame_as(compressed: u8, declared: u32, message: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(compressed);
    framed.put_u32(declared);
    framed.put_slice(message);
    framed.freeze()
}

/// What a gRPC call (or any HTTP/2 request) came to.
#[derive(Debug, Default)]
pub struct GrpcAnswer {
    /// The HTTP status.
    pub status: u16,
    /// `grpc-status`, from the trailers or a trailers-only answer.
    pub code: Option<i32>,
    pub message: String,
    /// Bytes of answer messages received (framing included).
    pub bytes: usize,
    /// The answer's headers and trailers, as text (for retry hints).
    pub headers: String,
}

impl GrpcAnswer {
    pub fn code(&self) -> tonic::Code {
        self.code.map_or(tonic::Code::Unknown, tonic::Code::from_i32)
    }
}

/// Starts a call: its headers and `body` (framed messages) sent, the request ended.
pub fn start_call(
    client: &mut SendRequest<Bytes>,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<h2::client::ResponseFuture, String> {
    let grpc = [("content-type", "application/grpc"), ("te", "trailers")];
    start_request(client, "POST", path, &[&grpc[..], headers].concat(), body)
}

/// Starts an HTTP/2 request: its headers and `body` sent, the request ended.
pub fn start_request(
    client: &mut SendRequest<Bytes>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<h2::client::ResponseFuture, String> {
    let mut request = http::Request::builder().method(method).uri(format!("http://sidecar{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(()).map_err(|e| e.to_string())?;
    let (answer, mut send) = client.send_request(request, body.is_empty()).map_err(|e| format!("send: {e}"))?;
    if !body.is_empty() {
        send.send_data(body, true).map_err(|e| format!("send data: {e}"))?;
    }
    Ok(answer)
}

/// Reads a started call's answer to its end (or to its first message, `first`: an endless one).
pub async fn finish_call(answer: h2::client::ResponseFuture, first: bool) -> Result<GrpcAnswer, String> {
    let response = answer.await.map_err(|e| format!("broken: {e}"))?;
    let (parts, mut body) = response.into_parts();
    let mut outcome =
        GrpcAnswer { status: parts.status.as_u16(), headers: format!("{:?}", parts.headers), ..GrpcAnswer::default() };
    let status = |headers: &http::HeaderMap, outcome: &mut GrpcAnswer| {
        if let Some(code) = headers.get("grpc-status").and_then(|v| v.to_str().ok()?.parse().ok()) {
            outcome.code = Some(code);
            let message = headers.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or_default();
            outcome.message = percent_encoding::percent_decode_str(message).decode_utf8_lossy().into_owned();
        }
    };
    status(&parts.headers, &mut outcome);
    if outcome.code.is_some() && body.is_end_stream() {
        return Ok(outcome);
    }
    while let Some(data) = body.data().await {
        let data = data.map_err(|e| format!("broken body: {e}"))?;
        outcome.bytes += data.len();
        let _ = body.flow_control().release_capacity(data.len());
        if first {
            return Ok(GrpcAnswer { code: Some(0), ..outcome });
        }
    }
    if let Some(trailers) = body.trailers().await.map_err(|e| format!("broken trailers: {e}"))? {
        outcome.headers.push_str(&format!("{trailers:?}"));
        status(&trailers, &mut outcome);
    }
    Ok(outcome)
}

/// One gRPC call of `row` to its end, within `limit`.
pub async fn grpc_call(
    client: &SendRequest<Bytes>,
    row: &GrpcRow,
    headers: &[(&str, &str)],
    body: Bytes,
    limit: Duration,
) -> Result<GrpcAnswer, String> {
    let call = async {
        let mut client = client.clone().ready().await.map_err(|e| format!("connection: {e}"))?;
        finish_call(start_call(&mut client, row.path, headers, body)?, row.endless).await
    };
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| Err(format!("no answer in {limit:?}")))
}

/// An HTTP/1.1 answer.
#[derive(Debug)]
pub struct HttpAnswer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl HttpAnswer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// The request's bytes: a head with `connection: close` and the body.
pub fn http_request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: sidecar\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    [head.as_bytes(), body].concat()
}

/// One HTTP/1.1 exchange on a connection of its own (from `from`, a loopback address), within
/// [`CALL_LIMIT`].
pub async fn http_call_from(from: IpAddr, addr: SocketAddr, request: &[u8]) -> Result<HttpAnswer, String> {
    let exchange = async {
        let mut stream = connect_from(from, addr).await.map_err(|e| format!("connect: {e}"))?;
        // A server refusing a large body may answer and close before reading all of it.
        let (mut read, mut write) = stream.split();
        let (_, raw) = tokio::join!(write.write_all(request), async {
            let mut raw = Vec::new();
            let _ = read.read_to_end(&mut raw).await;
            raw
        });
        parse_answer(&raw)
    };
    tokio::time::timeout(CALL_LIMIT, exchange).await.unwrap_or_else(|_| Err(format!("no answer in {CALL_LIMIT:?}")))
}

pub async fn http_call(addr: SocketAddr, request: &[u8]) -> Result<HttpAnswer, String> {
    http_call_from(IpAddr::from([127, 0, 0, 1]), addr, request).await
}

fn parse_answer(raw: &[u8]) -> Result<HttpAnswer, String> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| {
        format!("no answer, the connection closed after {:?}", String::from_utf8_lossy(&raw[..raw.len().min(200)]))
    })?;
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("no status: {head}"))?;
    Ok(HttpAnswer { status, body: raw[split + 4..].to_vec() })
}
