//! The tonic floor: a tonic server that takes every unary call, whatever its path, as raw message
//! bytes ([`BytesCodec`]) and forwards it on one pooled HTTP/2 channel, with no admission, no
//! routing and no metrics: what any proxy on the multiplexer's stack (tonic's server and client,
//! hyper, h2) adds here before doing any work of its own.

use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::PathAndQuery;
use teifleet_proto::BytesCodec;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::UnaryService;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

use crate::{Error, Result};

/// A tower service forwarding unary calls of any path to `upstream`.
#[derive(Clone, Debug)]
pub struct FloorProxy {
    upstream: tonic::client::Grpc<Channel>,
}

impl FloorProxy {
    pub fn new(upstream: Channel) -> Self {
        Self { upstream: tonic::client::Grpc::new(upstream) }
    }
}

impl Service<http::Request<axum::body::Body>> for FloorProxy {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is the upstream channel's, awaited per call in `Forward`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<axum::body::Body>) -> Self::Future {
        let upstream = self.upstream.clone();
        Box::pin(unary_bytes(request, move |path| Forward { upstream, path }))
    }
}

/// Serves `request` as one unary call of raw message bytes, answered by what `answer` makes for
/// its path.
pub async fn unary_bytes<S>(
    request: http::Request<axum::body::Body>,
    answer: impl FnOnce(PathAndQuery) -> S,
) -> Result<http::Response<Body>, Infallible>
where
    S: UnaryService<Bytes, Response = Bytes>,
{
    let Some(path) = request.uri().path_and_query().cloned() else {
        return Ok(Status::unimplemented("no path").into_http());
    };
    let mut server = tonic::server::Grpc::new(BytesCodec);
    Ok(server.unary(answer(path), request).await)
}

/// One call: the request's bytes and metadata go upstream as they came.
struct Forward {
    upstream: tonic::client::Grpc<Channel>,
    path: PathAndQuery,
}

impl UnaryService<Bytes> for Forward {
    type Response = Bytes;
    type Future = BoxFuture<Response<Bytes>, Status>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let (mut upstream, path) = (self.upstream.clone(), self.path.clone());
        Box::pin(async move {
            upstream.ready().await.map_err(|e| Status::unavailable(format!("upstream: {e}")))?;
            upstream.unary(request, path, BytesCodec).await
        })
    }
}

/// One HTTP/2 connection to `upstream`, TCP_NODELAY as the multiplexer's.
pub async fn connect(upstream: &str) -> Result<Channel> {
    Endpoint::from_shared(upstream.to_owned())
        .map_err(|e| Error::Process(format!("--upstream {upstream}: {e}")))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| Error::Process(format!("connecting to {upstream}: {e}")))
}

/// Connects to `upstream` (one HTTP/2 connection, TCP_NODELAY as the multiplexer's) and serves
/// on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, upstream: &str) -> Result<()> {
    let channel = connect(upstream).await?;
    let router = axum::Router::new().fallback_service(FloorProxy::new(channel));
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    Server::builder()
        .add_routes(Routes::from(router))
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| Error::Process(format!("floor proxy: {e}")))
}
