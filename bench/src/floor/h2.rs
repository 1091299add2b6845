//! The h2 floor: every stream relayed on the `h2` crate alone, frame by frame (headers, data,
//! trailers), on one upstream HTTP/2 connection: no hyper, no tonic, no tower, no gRPC framing
//! read. The least a proxy on the well-kept Rust HTTP/2 stack can spend on a hop here.

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use tokio::net::{TcpListener, TcpStream};

use crate::{Error, Result};

/// The upstream connection's handle, shared by every stream.
type Upstream = h2::client::SendRequest<Bytes>;

pub async fn serve(listener: TcpListener, upstream: &str) -> Result<()> {
    let uri: Uri = upstream.parse().map_err(|e| Error::Process(format!("--upstream {upstream}: {e}")))?;
    let authority = uri.authority().cloned().ok_or_else(|| Error::Process(format!("{upstream} names no host")))?;
    let tcp = TcpStream::connect(authority.as_str())
        .await
        .map_err(|e| Error::Process(format!("connecting to {upstream}: {e}")))?;
    tcp.set_nodelay(true).map_err(|e| Error::Process(format!("TCP_NODELAY: {e}")))?;
    let (send, connection) =
        h2::client::handshake(tcp).await.map_err(|e| Error::Process(format!("HTTP/2 to {upstream}: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("teifleet-floor-proxy: upstream connection: {e}");
        }
    });
    loop {
        let (tcp, _) = listener.accept().await.map_err(|e| Error::Process(format!("accepting: {e}")))?;
        let _ = tcp.set_nodelay(true);
        tokio::spawn(serve_connection(tcp, send.clone(), authority.clone()));
    }
}

async fn serve_connection(tcp: TcpStream, upstream: Upstream, authority: Authority) {
    let Ok(mut connection) = h2::server::handshake(tcp).await else { return };
    while let Some(Ok((request, respond))) = connection.accept().await {
        tokio::spawn(relay(request, respond, upstream.clone(), authority.clone()));
    }
}

/// One stream: the request goes upstream as it came, the answer back as it came; a stream that
/// breaks on either side is reset.
async fn relay(
    request: Request<RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    upstream: Upstream,
    authority: Authority,
) {
    if let Err(reason) = exchange(request, &mut respond, upstream, authority).await {
        respond.send_reset(reason);
    }
}

async fn exchange(
    request: Request<RecvStream>,
    respond: &mut h2::server::SendResponse<Bytes>,
    upstream: Upstream,
    authority: Authority,
) -> std::result::Result<(), h2::Reason> {
    let broken = |_| h2::Reason::INTERNAL_ERROR;
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().cloned().ok_or(h2::Reason::PROTOCOL_ERROR)?;
    parts.uri = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(|_| h2::Reason::PROTOCOL_ERROR)?;
    let mut upstream = upstream.ready().await.map_err(broken)?;
    let (answer, sending) = upstream.send_request(Request::from_parts(parts, ()), false).map_err(broken)?;
    // Both directions at once, in this one task: a stream's client may wait for answers before it
    // sends more, and the multiplexer relays a stream's answers while its requests still come.
    let answering = async {
        let (parts, body) = answer.await.map_err(broken)?.into_parts();
        let sending = respond.send_response(Response::from_parts(parts, ()), false).map_err(broken)?;
        pipe(body, sending).await
    };
    tokio::try_join!(pipe(body, sending), answering).map(|_| ())
}

/// Data frames as they arrive, then the trailers (or an empty end of stream when the last frame
/// did not end it), each frame's window given back once it is passed on.
async fn pipe(mut from: RecvStream, mut to: SendStream<Bytes>) -> std::result::Result<(), h2::Reason> {
    let broken = |_| h2::Reason::INTERNAL_ERROR;
    while let Some(data) = from.data().await {
        let data = data.map_err(broken)?;
        let len = data.len();
        // The last frame carries the end of the stream itself, as it came.
        let last = from.is_end_stream();
        to.send_data(data, last).map_err(broken)?;
        from.flow_control().release_capacity(len).map_err(broken)?;
        if last {
            return Ok(());
        }
    }
    match from.trailers().await.map_err(broken)? {
        Some(trailers) => to.send_trailers(trailers).map_err(broken),
        None => to.send_data(Bytes::new(), true).map_err(broken),
    }
}
