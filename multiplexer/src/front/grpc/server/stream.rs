//! One HTTP/2 stream of the gRPC port: its request handed to the service its path names, its
//! answer written back frame by frame as the service gives it, and the call dropped as soon as
//! the client resets the stream (so a cancelled call leaves its queue, door or permit at once).
//!
//! Every stream of the RPC table is charged to the process's memory budget from its first
//! header: [`STREAM_BYTES`] at once (refused then, before its body is read, when there is no
//! room), and its body as it is taken from h2, at [`BUFFERED_PER_BYTE`] bytes a byte. A unary
//! call keeps the charge until it is answered; a stream gives each message's back once the
//! message is passed on (`crate::front::grpc::stream_body`). Its answer is charged from when the
//! writer takes it until h2 has written it to the socket (`super::answer`).

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http_body::{Body, Frame};
use http_body_util::BodyExt as _;
use tonic::Status;
use tower::ServiceExt as _;

use crate::activator::PoolNaming;
use crate::admission::memory::{Charge, MemoryBudget, OverBudget, Use};
use crate::error::Error;
use crate::forward::upstream::HeldUpstream;
use crate::front::grpc::connections::ConnectionInfo;
use crate::front::grpc::reflection::Reflection;
use crate::front::grpc::service::RpcService;
use crate::gate::request_meta::{GRPC_TIMEOUT, parse_grpc_timeout};
use crate::report::status;
use crate::transport::send_window;
use crate::vocab::rpc::{RPCS, Shape};

use super::answer::{self, AnswerBuf, Answering};
use super::drained::Drained;

type Answer = http::Response<tonic::body::Body>;

/// What a stream costs before its body: h2's state for it, its headers, its task and its call's
/// future (a call parked at the door measured 3.6 KB in all).
pub const STREAM_BYTES: u64 = 4 * 1024;
/// What a byte of a request body costs while it is held: a message split over frames is put back
/// together in a buffer that grows by doubling, so up to twice its size.
pub const BUFFERED_PER_BYTE: u64 = 2;
/// The `reason` a refusal for memory is counted under in `teifleet_refused_input_total`.
pub const REFUSED_MEMORY: &str = "memory_budget";

/// Which service serves a request: the RPC table's own by path, tonic's routes (health,
/// reflection, UNIMPLEMENTED) for the rest.
#[derive(Clone)]
pub struct Dispatch {
    /// One per row of [`RPCS`], in its order.
    rpcs: Arc<[RpcService]>,
    routes: tonic::service::Routes,
    /// The activator role's naming: a call naming no pool is for the pool its client dialled.
    pool_naming: Option<Arc<PoolNaming>>,
    /// The process's memory budget every RPC's stream is charged to.
    memory: Arc<MemoryBudget>,
    /// Counts a stream refused for memory.
    refused: Arc<dyn Fn(&'static str) + Send + Sync>,
    /// Whether reflection calls reach `routes` or are UNIMPLEMENTED.
    reflection: Arc<Reflection>,
}

impl Dispatch {
    /// `rpc_service` makes the service of each row of [`RPCS`].
    pub fn new(
        rpc_service: impl Fn(&'static crate::vocab::rpc::Rpc) -> RpcService,
        routes: tonic::service::Routes,
        pool_naming: Option<Arc<PoolNaming>>,
        memory: Arc<MemoryBudget>,
        refused: Arc<dyn Fn(&'static str) + Send + Sync>,
        reflection: Arc<Reflection>,
    ) -> Self {
        let rpcs = RPCS.iter().map(rpc_service).collect();
        Self { rpcs, routes: routes.prepare(), pool_naming, memory, refused, reflection }
    }

    /// The charge of a new stream on `path`: none for health and reflection (small, and what
    /// probes call), refused when the budget has no room for it, or for its answer
    /// (`answer::room_for`).
    fn charge(&self, path: &str) -> Result<Option<Arc<Charge>>, OverBudget> {
        let Some(rpc) = RPCS.iter().find(|rpc| rpc.path == path) else {
            return Ok(None);
        };
        let charged =
            answer::room_for(&self.memory, rpc).and_then(|()| self.memory.charge(Use::RequestBodies, STREAM_BYTES));
        match charged {
            Ok(charge) => Ok(Some(Arc::new(charge))),
            Err(over) => {
                (self.refused)(REFUSED_MEMORY);
                Err(over)
            }
        }
    }

    /// Where a stream on `path` charges its answer: nowhere for health and reflection.
    fn answers(&self, path: &str) -> Option<Answers> {
        answer::charged(path).then(|| Answers { memory: self.memory.clone(), refused: self.refused.clone() })
    }

    fn call(&self, mut request: http::Request<RequestBody>, connection: &ConnectionInfo) -> BoxFuture<'static, Answer> {
        if let Some(naming) = &self.pool_naming {
            let uri = request.uri().clone();
            if let Err(refused) = naming.name_pool_for(request.headers_mut(), &uri, connection.transport.as_ref()) {
                return futures::future::ready(status::into_http(status::into_status(refused))).boxed();
            }
        }
        match RPCS.iter().position(|rpc| rpc.path == request.uri().path()) {
            Some(row) => self.rpcs[row].call(request, connection),
            // As tonic's routes answer a service they do not have.
            None if self.reflection.refuses(request.uri().path()) => {
                futures::future::ready(status::into_http(Status::unimplemented(""))).boxed()
            }
            None => {
                // tonic's routes carry no connection of their own: tei-manager's API takes its
                // turn at the door in its connection's line, and its tenant from its certificate.
                request.extensions_mut().insert(connection.clone());
                self.routes.clone().oneshot(request).map(|answer| answer.unwrap_or_else(|never| match never {})).boxed()
            }
        }
    }
}

/// The call of one stream, started on the connection's task (reading its headers, checking its
/// key, making its future), and what is left to run on a task of its own: waiting for the answer
/// and writing it back.
pub fn serve(
    request: http::Request<RecvStream>,
    respond: SendResponse<AnswerBuf>,
    dispatch: &Dispatch,
    connection: &ConnectionInfo,
) -> impl Future<Output = ()> + Send + 'static {
    let (mut parts, body) = request.into_parts();
    let answers = dispatch.answers(parts.uri.path());
    let timeout = parts.headers.get(&GRPC_TIMEOUT).and_then(|value| parse_grpc_timeout(value.to_str().ok()?).ok());
    let answer = match dispatch.charge(parts.uri.path()) {
        Ok(charge) => {
            if let Some(charge) = &charge {
                parts.extensions.insert(charge.clone());
            }
            let body = RequestBody::new(parts.uri.path(), body, charge);
            dispatch.call(http::Request::from_parts(parts, body), connection)
        }
        Err(over) => futures::future::ready(status::into_http(status::into_status(Error::Memory(over)))).boxed(),
    };
    answer_stream(timeout_backstop(timeout, answer), respond, answers)
}

/// The memory budget a stream's answer is charged to, and the count of refusals for it.
struct Answers {
    memory: Arc<MemoryBudget>,
    refused: Arc<dyn Fn(&'static str) + Send + Sync>,
}

impl Answers {
    /// Starts charging an answer whose body holds at least `known` bytes.
    fn start(&self, known: u64) -> Result<Answering, OverBudget> {
        Answering::start(&self.memory, known).inspect_err(|_| (self.refused)(REFUSED_MEMORY))
    }
}

/// Waits for the answer and writes it; a stream that breaks is the client's business.
async fn answer_stream(
    answer: BoxFuture<'static, Answer>,
    mut respond: SendResponse<AnswerBuf>,
    answers: Option<Answers>,
) {
    // The client may reset the stream while the call waits (its deadline passed, it gave up):
    // dropping the call then is what takes it out of the queue, the door or its permit.
    let answer = tokio::select! {
        biased;
        reset = poll_fn(|cx| respond.poll_reset(cx)) => {
            return tracing::debug!(?reset, "stream reset before its answer");
        }
        answer = answer => answer,
    };
    let (mut parts, body) = answer.into_parts();
    // Let go once the headers are queued, which wakes this connection's task first
    // (`crate::forward::upstream::HeldUpstream`).
    let upstream = parts.extensions.remove::<HeldUpstream>();
    let end_of_stream = body.is_end_stream();
    // What the body is known to hold (a unary answer's message) is charged before the headers
    // go: a call whose answer does not fit is answered RESOURCE_EXHAUSTED alone.
    let answering =
        match answers.as_ref().filter(|_| !end_of_stream).map(|answers| answers.start(body.size_hint().lower())) {
            None => None,
            Some(Ok(answering)) => Some(answering),
            Some(Err(over)) => {
                let (parts, ()) = status::into_http(status::into_status(Error::Memory(over))).into_parts();
                if let Err(error) = respond.send_response(http::Response::from_parts(parts, ()), true) {
                    tracing::debug!(%error, "stream closed before its answer");
                }
                return;
            }
        };
    let sending = match respond.send_response(http::Response::from_parts(parts, ()), end_of_stream) {
        Ok(sending) => sending,
        Err(error) => return tracing::debug!(%error, "stream closed before its answer"),
    };
    drop(upstream);
    // Boxed: a call's task waits above far longer than it writes here, and should hold only what
    // waiting needs meanwhile.
    if !end_of_stream && let Err(error) = Box::pin(send_body(body, sending, answering, answers)).await {
        tracing::debug!(%error, "stream broken while answering");
    }
}

/// tonic's server answered a call still unanswered at its `grpc-timeout` with CANCELLED; the
/// multiplexer's own deadlines fire before it, so this is a backstop, kept as tonic had it. Its
/// timer is boxed: every waiting call's task holds this future, most calls have no deadline, and
/// a timer is the largest part of it.
fn timeout_backstop(timeout: Option<Duration>, answer: BoxFuture<'static, Answer>) -> BoxFuture<'static, Answer> {
    match timeout {
        None => answer,
        Some(timeout) => Box::pin(
            tokio::time::timeout(timeout, answer)
                .map(|answer| answer.unwrap_or_else(|_| status::into_http(Status::cancelled("Timeout expired")))),
        ),
    }
}

/// The answer's frames as the body yields them: data within the client's window, then the
/// trailers or an empty end of stream. A body that fails resets the stream. Each data frame is
/// charged to `answering` until h2 writes it; one that does not fit ends the answer with
/// RESOURCE_EXHAUSTED in its trailers.
async fn send_body(
    body: tonic::body::Body,
    mut to: SendStream<AnswerBuf>,
    mut answering: Option<Answering>,
    answers: Option<Answers>,
) -> Result<(), h2::Error> {
    let mut body = pin!(body);
    loop {
        let frame = tokio::select! {
            biased;
            reset = poll_fn(|cx| to.poll_reset(cx)) => return Err(h2::Error::from(reset?)),
            frame = body.frame() => frame,
        };
        let frame = match frame {
            None => return to.send_data(AnswerBuf::plain(Bytes::new()), true),
            Some(Ok(frame)) => frame,
            Some(Err(status)) => {
                tracing::debug!(%status, "answer body failed: stream reset");
                to.send_reset(Reason::INTERNAL_ERROR);
                return Ok(());
            }
        };
        let frame = match frame.into_data() {
            Ok(data) => {
                let end_of_stream = body.is_end_stream();
                let len = data.len();
                let data = match answering.as_mut() {
                    None => AnswerBuf::plain(data),
                    Some(answering) => match answering.take(data) {
                        Ok(charged) => charged,
                        Err(over) => {
                            if let Some(answers) = &answers {
                                (answers.refused)(REFUSED_MEMORY);
                            }
                            return to.send_trailers(refusal_trailers(over));
                        }
                    },
                };
                if len > 0 {
                    send_window::room(&mut to, len).await?;
                }
                to.send_data(data, end_of_stream)?;
                if end_of_stream {
                    return Ok(());
                }
                continue;
            }
            Err(frame) => frame,
        };
        if let Some(answering) = &mut answering {
            answering.end();
        }
        if let Ok(trailers) = frame.into_trailers() {
            return to.send_trailers(trailers);
        }
    }
}

/// The trailers that end an answer refused for memory midway: RESOURCE_EXHAUSTED with the
/// retry hint, as a refusal before the answer would say.
fn refusal_trailers(over: OverBudget) -> http::HeaderMap {
    let (mut parts, ()) = status::into_http(status::into_status(Error::Memory(over))).into_parts();
    parts.headers.remove(http::header::CONTENT_TYPE);
    parts.headers
}

/// A request body read from its h2 stream. A unary call's is read as the call takes it; a
/// streaming call's is drained from h2 as it arrives ([`Drained`]).
pub enum RequestBody {
    Direct(Direct),
    Drained(Drained),
}

impl RequestBody {
    fn new(path: &str, recv: RecvStream, charge: Option<Arc<Charge>>) -> Self {
        match RPCS.iter().find(|rpc| rpc.path == path) {
            Some(rpc) if rpc.shape != Shape::Unary => Self::Drained(Drained::start(recv, charge, BUFFERED_PER_BYTE)),
            _ => Self::Direct(Direct { recv, data_ended: false, charge }),
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::Direct(direct) => Pin::new(direct).poll_frame(cx),
            Self::Drained(drained) => Pin::new(drained).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Direct(direct) => direct.is_end_stream(),
            Self::Drained(drained) => drained.is_end_stream(),
        }
    }
}

/// A unary call's body: each data frame's window is given back as the frame is taken, as hyper
/// does, so a call's body never waits on bytes already read.
pub struct Direct {
    recv: RecvStream,
    data_ended: bool,
    /// The stream's charge, grown by each data frame taken (none for health and reflection).
    charge: Option<Arc<Charge>>,
}

impl Body for Direct {
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if !this.data_ended {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Charged before the window is given back: a body refused here is not sent
                    // more of.
                    if let Some(charge) = &this.charge
                        && let Err(over) = charge.grow(BUFFERED_PER_BYTE * data.len() as u64)
                    {
                        this.data_ended = true;
                        let status = status::into_status(Error::Memory(over));
                        return Poll::Ready(Some(Err(Box::new(status))));
                    }
                    // Fails only once the stream is gone, which the next poll reports.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(error)) => return Poll::Ready(Some(Err(error.into()))),
                None => this.data_ended = true,
            }
        }
        let trailers = ready!(this.recv.poll_trailers(cx)).transpose();
        Poll::Ready(trailers.map(|trailers| trailers.map(Frame::trailers).map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}
