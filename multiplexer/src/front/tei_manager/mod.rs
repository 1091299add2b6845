//! tei-manager's own API, `tei_multiplexer.v1.TeiMultiplexer` (proto/tei_multiplexer/v1), on the
//! gRPC port beside tei.v1, so a tei-manager client changes its address and nothing else. Each
//! wrapped RPC is the tei.v1 call it wraps (`wrap`: target to routing headers, field 2 passed on
//! untouched, the tei.v1 row's service doing the rest); the Arrow batches are served here
//! (`arrow`, `ipc`) as sub-batches over the whole pool. Refusals are tei-manager's where it has
//! words for them (`error`); the target's mapping is `target`.
//!
//! Served as one of the port's tonic routes: the port's dispatch puts the connection's
//! [`ConnectionInfo`] in each call's extensions, so a call waits in its connection's line at the
//! pool's door and a client certificate names its tenant, as for tei.v1 calls.

mod answers;
mod arrow;
mod dense_unary;
mod error;
mod inbound;
mod ipc;
mod layout;
mod streamed;
mod target;
mod upstream;
mod window;
mod wrap;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use http::HeaderMap;
use prost::Message as _;
use teifleet_proto::tei_multiplexer::v1 as mux;
use tonic::Status;

pub use self::error::ManagerError;
pub use self::inbound::{Decoded, MAX_INFLATED_BYTES, MAX_ROWS, decode_texts};
pub use self::ipc::{EMPTY_INPUT, NULL_INPUT, Texts};
use crate::admission::memory::{Charge, MemoryBudget, Use};
use crate::error::Error;
use crate::forward::Forwarder;
use crate::front::grpc::connections::ConnectionInfo;
use crate::front::grpc::server::{BUFFERED_PER_BYTE, REFUSED_MEMORY, STREAM_BYTES, room_for_answer};
use crate::front::grpc::service::RpcService;
use crate::front::grpc::{stream_body, unary};
use crate::gate::auth::Gate;
use crate::report::status;
use crate::vocab::Protocol;
use crate::vocab::framing::MessageStream;

/// The gRPC service name tei-manager's clients call.
pub const SERVICE: &str = "tei_multiplexer.v1.TeiMultiplexer";

/// Each wrapped method and the tei.v1 RPC it wraps.
const WRAPPED: [(&str, &str); 17] = [
    ("Info", "/tei.v1.Info/Info"),
    ("Embed", "/tei.v1.Embed/Embed"),
    ("EmbedStream", "/tei.v1.Embed/EmbedStream"),
    ("EmbedSparse", "/tei.v1.Embed/EmbedSparse"),
    ("EmbedSparseStream", "/tei.v1.Embed/EmbedSparseStream"),
    ("EmbedAll", "/tei.v1.Embed/EmbedAll"),
    ("EmbedAllStream", "/tei.v1.Embed/EmbedAllStream"),
    ("Predict", "/tei.v1.Predict/Predict"),
    ("PredictPair", "/tei.v1.Predict/PredictPair"),
    ("PredictStream", "/tei.v1.Predict/PredictStream"),
    ("PredictPairStream", "/tei.v1.Predict/PredictPairStream"),
    ("Rerank", "/tei.v1.Rerank/Rerank"),
    ("RerankStream", "/tei.v1.Rerank/RerankStream"),
    ("Tokenize", "/tei.v1.Tokenize/Tokenize"),
    ("TokenizeStream", "/tei.v1.Tokenize/TokenizeStream"),
    ("Decode", "/tei.v1.Tokenize/Decode"),
    ("DecodeStream", "/tei.v1.Tokenize/DecodeStream"),
];

/// What serving a tei-manager call needs.
pub struct Context {
    pub forwarder: Arc<Forwarder>,
    pub gate: Arc<Gate>,
    pub memory: Arc<MemoryBudget>,
    /// How long a call's first message may take to arrive.
    pub message_timeout: Duration,
    /// The largest message the port takes or sends.
    pub max_message: usize,
    /// TEI's max client batch size (the HTTP front's `--max-client-batch-size`): the largest
    /// sub-batch of an Arrow call.
    pub max_client_batch_size: usize,
}

/// The largest Arrow batch message (request or answer) the service takes or sends, whatever the
/// port's own limit below it: tei-manager's default `grpc_max_message_size_mb`, so a call
/// tei-manager answers is answered here (20,000 rows of 384 f32 numbers are 30 MB). Each is
/// charged to the memory budget before it is built, and held charged until it is sent.
pub const ARROW_MAX_MESSAGE: usize = 40 << 20;

impl Context {
    /// The largest Arrow batch message: [`ARROW_MAX_MESSAGE`], or the port's limit if larger.
    pub fn arrow_max_message(&self) -> usize {
        self.max_message.max(ARROW_MAX_MESSAGE)
    }
}

/// The `tei_multiplexer.v1.TeiMultiplexer` service, one of the gRPC port's routes.
#[derive(Clone)]
pub struct TeiManager {
    cx: Arc<Context>,
    /// By tei-manager method: the tei.v1 row's own service.
    wrapped: Arc<HashMap<&'static str, (RpcService, bool)>>,
}

impl TeiManager {
    /// `rpc_service` makes the tei.v1 service of a row, as the port's dispatch does.
    pub fn new(cx: Context, rpc_service: impl Fn(&'static crate::vocab::rpc::Rpc) -> RpcService) -> Self {
        let wrapped = WRAPPED
            .iter()
            .map(|(method, path)| {
                let rpc = crate::vocab::rpc::find(path).unwrap_or_else(|| panic!("{path} is a row of rpc::RPCS"));
                (*method, (rpc_service(rpc), *method == "Info"))
            })
            .collect();
        Self { cx: Arc::new(cx), wrapped: Arc::new(wrapped) }
    }
}

impl tonic::server::NamedService for TeiManager {
    const NAME: &'static str = SERVICE;
}

impl tower::Service<http::Request<tonic::body::Body>> for TeiManager {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.serve(request).await) })
    }
}

/// Numbers for calls whose connection the route was not told: one of their own each, far from
/// the port's own connection numbers.
static UNKNOWN_CONNECTION: AtomicU64 = AtomicU64::new(1 << 62);

impl TeiManager {
    async fn serve(self, mut request: http::Request<tonic::body::Body>) -> http::Response<tonic::body::Body> {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
        let connection = request.extensions().get::<ConnectionInfo>().cloned().unwrap_or_else(|| ConnectionInfo {
            number: UNKNOWN_CONNECTION.fetch_add(1, Ordering::Relaxed),
            transport: None,
        });
        // The key first, as for every tei.v1 call: a refused caller's body is never read.
        if let Err(failure) = self.cx.gate.admit(request.headers_mut(), connection.transport.as_ref(), Protocol::Grpc) {
            return status::into_http(status::into_status(Error::Auth(failure)));
        }
        let wrapped = self.wrapped.get(method.as_str());
        // A wrapped EmbedAll is refused up front like tei.v1's own when large answers have
        // filled their share of the budget.
        let room = wrapped.map_or(Ok(()), |(service, _)| room_for_answer(&self.cx.memory, service.rpc()));
        let charge = match room.and_then(|()| self.cx.memory.charge(Use::RequestBodies, STREAM_BYTES)) {
            Ok(charge) => Arc::new(charge),
            Err(over) => {
                self.cx.forwarder.metrics.refused_input(PORT, REFUSED_MEMORY);
                return status::into_http(status::into_status(Error::Memory(over)));
            }
        };
        if let Some((service, info)) = wrapped {
            return self.wrapped(service, *info, request, charge, &connection).await;
        }
        let request = request
            .map(|body| tonic::body::Body::new(Charged { body, charge: charge.clone(), per_byte: BUFFERED_PER_BYTE }));
        match method.as_str() {
            "EmbedArrow" => self.arrow_unary(request, false, charge).await,
            "EmbedSparseArrow" => self.arrow_unary(request, true, charge).await,
            "EmbedArrowStream" => self.arrow_stream(request, charge),
            _ => status::into_http(Status::unimplemented(format!("{SERVICE}/{method} is not a method of {SERVICE}"))),
        }
    }

    /// A wrapped call: its first message's target routes it, then the tei.v1 row serves it.
    async fn wrapped(
        &self,
        service: &RpcService,
        info: bool,
        request: http::Request<tonic::body::Body>,
        charge: Arc<Charge>,
        connection: &ConnectionInfo,
    ) -> http::Response<tonic::body::Body> {
        let (mut parts, body) = request.into_parts();
        let opening = wrap::open(body, self.cx.max_message, Some(charge.clone()), info);
        let opened = match tokio::time::timeout(self.cx.message_timeout, opening).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(Ok(refused))) => return self.refused(refused),
            Ok(Err(Err(status))) => return status::into_http(status),
            Err(_) => return self.refused(Error::SlowMessage { within: self.cx.message_timeout }.into()),
        };
        if let Err(refused) = opened.target.route(&mut parts.headers) {
            return self.refused(refused);
        }
        parts.extensions.insert(charge);
        service.call(http::Request::from_parts(parts, opened.body), connection).await
    }

    /// EmbedArrow or EmbedSparseArrow: one RecordBatch in, one out.
    async fn arrow_unary(
        &self,
        request: http::Request<tonic::body::Body>,
        sparse: bool,
        charge: Arc<Charge>,
    ) -> http::Response<tonic::body::Body> {
        let cx = &*self.cx;
        let reading = unary::read_request(request, cx.arrow_max_message());
        let message = match tokio::time::timeout(cx.message_timeout, reading).await {
            Ok(Ok(message)) => message,
            Ok(Err(status)) => return status::into_http(status),
            Err(_) => return self.refused(Error::SlowMessage { within: cx.message_timeout }.into()),
        };
        let (metadata, _, framed) = message.into_parts();
        let bytes = framed.into_message();
        // Read whole, the body is one buffer now, however it was charged as it came.
        if let Err(over) = charge.set(bytes.len() as u64) {
            return status::into_http(status::into_status(Error::Memory(over)));
        }
        let tag = if sparse { upstream::SPARSE_PROMPT_NAME } else { upstream::DENSE_PROMPT_NAME };
        if let Err(refused) = upstream::check_prompt_name(&bytes, tag) {
            return self.refused(refused);
        }
        let decoded = match sparse {
            false => mux::EmbedArrowRequest::decode(bytes)
                .map_err(|_| ManagerError::Undecodable { what: "EmbedArrowRequest" })
                .and_then(|request| Ok((arrow::Options::dense(&request)?, request.arrow_ipc))),
            true => mux::EmbedSparseArrowRequest::decode(bytes)
                .map_err(|_| ManagerError::Undecodable { what: "EmbedSparseArrowRequest" })
                .and_then(|request| Ok((arrow::Options::sparse(&request)?, request.arrow_ipc))),
        };
        let (options, ipc_in) = match decoded {
            Ok(decoded) => decoded,
            Err(refused) => return self.refused(refused),
        };
        let mut headers = metadata.into_headers();
        if let Err(refused) = options.target.route(&mut headers) {
            return self.refused(refused);
        }
        let mut routed = match arrow::Routed::route(cx, &options, &headers) {
            Ok(routed) => routed,
            Err(error) => return status::into_http(status::into_status(error)),
        };
        if !sparse {
            // Its answer held as below, or streamed when too large to hold.
            return dense_unary::unary(self.cx.clone(), routed, options, ipc_in, charge).await;
        }
        let result = arrow::batch(cx, &mut routed, &options, ipc_in, &charge).await;
        drop(charge);
        // The answer stays charged until the socket has taken it all (a slow reader holds it
        // that long).
        match routed.finish(result) {
            Ok(answer) => answers::held(answer),
            Err(error) => status::into_http(error.into_status()),
        }
    }

    /// EmbedArrowStream: one answer per request batch, in order; the first request's target and
    /// options hold for the whole stream (later requests' are ignored, as tei-manager does). A
    /// batch that fails ends the stream with its status; each batch uses the whole pool. Each
    /// request message is charged until its answer is made, each answer until the socket took it.
    fn arrow_stream(
        &self,
        mut request: http::Request<tonic::body::Body>,
        charge: Arc<Charge>,
    ) -> http::Response<tonic::body::Body> {
        let metrics = self.cx.forwarder.metrics.clone();
        // The body's charge for bytes read is given back as each message is taken from it
        // (`stream_body::incoming`); the message itself is charged on its own until answered.
        request.extensions_mut().insert(charge);
        let incoming = match stream_body::incoming(request, self.cx.arrow_max_message(), metrics) {
            Ok(incoming) => incoming,
            Err(status) => return status::into_http(status),
        };
        let (metadata, _, messages) = incoming.into_parts();
        let state =
            Streaming { cx: self.cx.clone(), headers: metadata.into_headers(), messages, call: None, done: false };
        let answers = futures::stream::unfold(state, |mut state| async move {
            let answer = state.next().await?;
            Some((answer, state))
        });
        answers::stream(answers)
    }

    /// A refusal before the call is routed, counted by its reason.
    fn refused(&self, refused: ManagerError) -> http::Response<tonic::body::Body> {
        if let Some(reason) = refused.refused_reason() {
            self.cx.forwarder.metrics.refused_input(PORT, reason);
        }
        status::into_http(refused.into_status())
    }
}

/// An EmbedArrowStream call between its answers.
struct Streaming {
    cx: Arc<Context>,
    headers: HeaderMap,
    messages: MessageStream,
    /// Routed at the first request, with its options.
    call: Option<(arrow::Routed, arrow::Options)>,
    done: bool,
}

impl Streaming {
    /// The next answer, or the status that ends the stream; `None` once it has ended.
    async fn next(&mut self) -> Option<Result<(Bytes, Arc<answers::Taken>), Status>> {
        if self.done {
            return None;
        }
        let message = match self.messages.next().await {
            Some(Ok(message)) => message,
            Some(Err(status)) => return Some(Err(self.end(status))),
            None if self.call.is_none() => return Some(Err(self.end_with(ManagerError::EmptyStream))),
            // Its headers went out before any row was looked up: the tally over every batch is
            // a trailer, beside the status.
            None => {
                self.done = true;
                let (routed, _) = self.call.as_mut()?;
                routed.call.succeed();
                return Some(Err(routed.cache.ended()));
            }
        };
        // This message's bytes, held until its answer is made: a long stream holds one at a time.
        let held = match self.cx.memory.charge(Use::RequestBodies, message.len() as u64) {
            Ok(held) => held,
            Err(over) => return Some(Err(self.end_with(ManagerError::Call(Error::Memory(over))))),
        };
        if let Err(refused) = upstream::check_prompt_name(&message, upstream::DENSE_PROMPT_NAME) {
            return Some(Err(self.end_with(refused)));
        }
        let request = match mux::EmbedArrowRequest::decode(message) {
            Ok(request) => request,
            Err(_) => return Some(Err(self.end_with(ManagerError::Undecodable { what: "EmbedArrowRequest" }))),
        };
        if self.call.is_none() {
            let routed = arrow::Options::dense(&request).and_then(|options| {
                options.target.route(&mut self.headers)?;
                let routed = arrow::Routed::route(&self.cx, &options, &self.headers)?;
                Ok((routed, options))
            });
            match routed {
                Ok(call) => self.call = Some(call),
                Err(refused) => return Some(Err(self.end_with(refused))),
            }
        }
        let (routed, options) = self.call.as_mut()?;
        let result = arrow::batch(&self.cx, routed, options, request.arrow_ipc, &held).await;
        drop(held);
        Some(match result {
            Ok(answer) => {
                let taken = Arc::new(answers::Taken::default());
                Ok((answers::charged(answer, Some(taken.clone())), taken))
            }
            Err(error) => Err(self.end_with(error)),
        })
    }

    /// Ends the stream with `refused`, counted once: on the call if it was routed, as a
    /// refusal if not.
    fn end_with(&mut self, refused: ManagerError) -> Status {
        self.done = true;
        match self.call.take() {
            Some((mut routed, _)) => routed.fail(refused).into_status(),
            None => {
                if let Some(reason) = refused.refused_reason() {
                    self.cx.forwarder.metrics.refused_input(PORT, reason);
                }
                refused.into_status()
            }
        }
    }

    /// Ends the stream with the status its request body ended with (cut short, too large).
    fn end(&mut self, status: Status) -> Status {
        self.done = true;
        if let Some((mut routed, _)) = self.call.take() {
            routed.call.refuse(crate::vocab::outcome::ErrorKind::InvalidRequest);
        }
        status
    }
}

/// The `port` label of the gRPC port's refusals.
const PORT: &str = Protocol::Grpc.as_str();

/// A request body and its memory charge, held until the body is dropped. An Arrow call's request
/// body grows its charge by `per_byte` for each byte read (the port's dispatch charges only
/// tei.v1's own paths): a 100,000-row batch counts against the budget before it is decoded.
/// Answers are charged apart, until the socket takes them (`answers`).
struct Charged {
    body: tonic::body::Body,
    charge: Arc<Charge>,
    per_byte: u64,
}

impl http_body::Body for Charged {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let frame = std::task::ready!(std::pin::Pin::new(&mut self.body).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
            && self.per_byte > 0
            && let Err(over) = self.charge.grow(self.per_byte * data.len() as u64)
        {
            return Poll::Ready(Some(Err(status::into_status(Error::Memory(over)))));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
