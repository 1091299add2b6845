//! The memo floor: a tonic server that answers a unary call it has seen before (the same path and
//! the same request bytes) with the answer bytes upstream gave the first time, and forwards the
//! others as [`super::tonic`] does. No admission, no key digest, no bound on bytes, no metrics:
//! the least an answer from memory costs on this machine, on the multiplexer's stack. The cache
//! scenario interleaves calls to it with the cache's hits, so both meet the same machine in the
//! same seconds (a shared 2-core VM whose idle vCPUs can take milliseconds to wake).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::PathAndQuery;
use teifleet_proto::BytesCodec;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::UnaryService;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

use crate::{Error, Result};

/// Answers remembered at most: a bench's hot set is far smaller; past it calls are forwarded.
const MOST_REMEMBERED: usize = 1 << 16;

type Memo = Arc<Mutex<HashMap<(PathAndQuery, Bytes), Bytes>>>;

/// A tower service answering repeated unary calls from memory.
#[derive(Clone, Debug)]
pub struct MemoServer {
    upstream: tonic::client::Grpc<Channel>,
    memo: Memo,
}

impl Service<http::Request<axum::body::Body>> for MemoServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<axum::body::Body>) -> Self::Future {
        let (upstream, memo) = (self.upstream.clone(), self.memo.clone());
        Box::pin(super::tonic::unary_bytes(request, move |path| Answer { upstream, memo, path }))
    }
}

/// One call: from memory when its bytes were seen, else forwarded and remembered.
struct Answer {
    upstream: tonic::client::Grpc<Channel>,
    memo: Memo,
    path: PathAndQuery,
}

impl UnaryService<Bytes> for Answer {
    type Response = Bytes;
    type Future = BoxFuture<Response<Bytes>, Status>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let key = (self.path.clone(), request.get_ref().clone());
        let held = self.memo.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let (mut upstream, memo) = (self.upstream.clone(), self.memo.clone());
        Box::pin(async move {
            if let Some(answer) = held {
                return Ok(Response::new(answer));
            }
            upstream.ready().await.map_err(|e| Status::unavailable(format!("upstream: {e}")))?;
            let answer = upstream.unary(request, key.0.clone(), BytesCodec).await?;
            let mut memo = memo.lock().unwrap_or_else(|p| p.into_inner());
            if memo.len() < MOST_REMEMBERED {
                memo.insert(key, answer.get_ref().clone());
            }
            Ok(answer)
        })
    }
}

/// Connects to `upstream` and serves on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, upstream: &str) -> Result<()> {
    let channel = super::tonic::connect(upstream).await?;
    let service = MemoServer { upstream: tonic::client::Grpc::new(channel), memo: Memo::default() };
    let router = axum::Router::new().fallback_service(service);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    Server::builder()
        .add_routes(Routes::from(router))
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| Error::Process(format!("memo floor: {e}")))
}
