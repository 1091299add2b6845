//! The one generic service behind every `tei.v1` path: a row of the RPC table decides the shape,
//! the permit and the labels. tonic's server machinery does the framing, size limits, status and
//! trailers over message bytes ([`BytesCodec`]); nothing is decoded.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use teifleet_proto::BytesCodec;
use tonic::server::{ClientStreamingService, Grpc, ServerStreamingService, StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use crate::auth::Gate;
use crate::call::{Call, Protocol};
use crate::charge::cost_before_body;
use crate::forward::{Forwarder, ResponseStream, Routed};
use crate::rpc::{Admit, Rpc, Shape};
use crate::{Error, status};

/// Serves one RPC of the table.
#[derive(Clone)]
pub struct RpcService {
    rpc: &'static Rpc,
    forwarder: Arc<Forwarder>,
    gate: Arc<Gate>,
}

impl RpcService {
    pub fn new(rpc: &'static Rpc, forwarder: Arc<Forwarder>, gate: Arc<Gate>) -> Self {
        Self { rpc, forwarder, gate }
    }
}

impl<B> tower::Service<http::Request<B>> for RpcService
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The key first: a refused call is not routed, queued or counted as a call, only as a
        // refusal (`teifleet_auth_failures_total`), as on the HTTP front.
        if let Err(failure) = self.gate.admit(request.headers_mut(), Protocol::Grpc) {
            return futures::future::ready(Ok(status::into_status(Error::Auth(failure)).into_http())).boxed();
        }
        // The call's clock starts now, with tonic's own deadline timer, not at the first poll.
        let call = self.forwarder.call(self.rpc, Protocol::Grpc);
        let span = tracing::debug_span!("call", rpc = self.rpc.label, pool = tracing::field::Empty);
        // Recorded on a handle of its own: `Span::current()` costs a lookup even when disabled.
        serve(call, self.forwarder.clone(), request, span.clone()).map(Ok).instrument(span).boxed()
    }
}

/// Routes and admits a call from its headers, then lets tonic read the body and hand the message
/// bytes to the forwarder.
async fn serve<B>(
    mut call: Call,
    forwarder: Arc<Forwarder>,
    request: http::Request<B>,
    span: tracing::Span,
) -> http::Response<tonic::body::Body>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    let rpc = call.rpc;
    let (meta, pool) = match forwarder.route(&mut call, request.headers()) {
        Ok(routed) => routed,
        Err(error) => return Status::from(call.fail(error)).into_http(),
    };
    span.record("pool", pool.spec.name.as_str());
    let coalescer = pool.coalescer.clone().filter(|_| rpc.shape == Shape::Unary && rpc.admit == Admit::Permit);
    // A unary call whose cost its RPC tells waits for its permit before its body is read; other
    // unary calls once their bytes say what they cost, stream messages each as they arrive, and
    // coalesced calls in the call they share.
    let upfront = cost_before_body(&pool, rpc).filter(|_| coalescer.is_none());
    let permit = match (rpc.shape, upfront) {
        (Shape::Unary | Shape::ServerStream, Some(cost)) => {
            match forwarder.admit(&mut call, &pool, &meta, cost).await {
                Ok(permit) => permit,
                Err(error) => return Status::from(call.fail(error)).into_http(),
            }
        }
        _ => None,
    };
    let limit = Some(forwarder.max_message_bytes());
    let mut grpc = Grpc::new(BytesCodec).apply_max_message_size_config(limit, limit);
    let routed = Once(Some(Routed { forwarder, call, meta, pool, permit }));
    // Boxed: tonic's futures are large, and a call waiting for its permit above should not carry
    // their room while it waits.
    let exchange: BoxFuture<'static, _> = match (rpc.shape, coalescer) {
        (Shape::Unary, Some(coalescer)) => {
            Box::pin(async move { grpc.unary(Coalesced(routed, coalescer), request).await })
        }
        (Shape::Unary, None) => Box::pin(async move { grpc.unary(routed, request).await }),
        (Shape::ServerStream, _) => Box::pin(async move { grpc.server_streaming(routed, request).await }),
        (Shape::ClientStream, _) => Box::pin(async move { grpc.client_streaming(routed, request).await }),
        (Shape::Bidi, _) => Box::pin(async move { grpc.streaming(routed, request).await }),
    };
    exchange.await
}

/// A routed call, handed to tonic once its body has been read.
struct Once(Option<Routed>);

impl Once {
    fn take(&mut self) -> Routed {
        self.0.take().expect("tonic calls the service once per request")
    }
}

struct Coalesced(Once, Arc<crate::coalesce::Coalescer>);

type Answer<T> = BoxFuture<'static, Result<Response<T>, Status>>;

impl UnaryService<Bytes> for Once {
    type Response = Bytes;
    type Future = Answer<Bytes>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        self.take().unary(request).boxed()
    }
}

impl UnaryService<Bytes> for Coalesced {
    type Response = Bytes;
    type Future = Answer<Bytes>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        self.0.take().coalesced(self.1.clone(), request).boxed()
    }
}

impl ServerStreamingService<Bytes> for Once {
    type Response = Bytes;
    type ResponseStream = ResponseStream;
    type Future = Answer<ResponseStream>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        self.take().server_stream(request).boxed()
    }
}

impl ClientStreamingService<Bytes> for Once {
    type Response = Bytes;
    type Future = Answer<Bytes>;

    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        self.take().client_stream(request).boxed()
    }
}

impl StreamingService<Bytes> for Once {
    type Response = Bytes;
    type ResponseStream = ResponseStream;
    type Future = Answer<ResponseStream>;

    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        self.take().bidi(request).boxed()
    }
}
