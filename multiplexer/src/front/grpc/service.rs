//! The one generic service behind every `tei.v1` path: a row of the RPC table decides the shape,
//! the permit and the labels. Unary calls are framed by `crate::front::grpc::unary`, streams by
//! `crate::front::grpc::stream_body`, both with tonic's size limits and statuses. Nothing is decoded.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use tonic::Status;
use tracing::Instrument as _;

use crate::admission::memory::Charge;
use crate::cache::Cache;
use crate::error::Error;
use crate::error::refused_message;
use crate::forward::charge::{Grant, cost_before_body};
use crate::forward::pools::Pool;
use crate::forward::{Forwarder, Routed};
use crate::front::grpc::body_deadline::BodyDeadline;
use crate::front::grpc::connections::ConnectionInfo;
use crate::front::grpc::{stream_body, unary};
use crate::gate::auth::Gate;
use crate::gate::door::{ConnectionId, HoldBounds};
use crate::gate::request_meta::RequestMeta;
use crate::report::call::Call;
use crate::report::metrics::Metrics;
use crate::report::orca;
use crate::report::status;
use crate::vocab::Protocol;
use crate::vocab::rpc::{Admit, Rpc, Shape};

/// Serves one RPC of the table.
#[derive(Clone)]
pub struct RpcService {
    rpc: &'static Rpc,
    forwarder: Arc<Forwarder>,
    gate: Arc<Gate>,
    /// How long a unary call's request message may take to arrive once the call is admitted.
    message_timeout: Duration,
    /// How many calls the doors hold, how long, and the memory budget they are charged to.
    door: Arc<HoldBounds>,
}

impl RpcService {
    pub fn new(
        rpc: &'static Rpc,
        forwarder: Arc<Forwarder>,
        gate: Arc<Gate>,
        message_timeout: Duration,
        door: Arc<HoldBounds>,
    ) -> Self {
        Self { rpc, forwarder, gate, message_timeout, door }
    }
}

impl RpcService {
    /// Serves one call that arrived on `connection`.
    /// The RPC table's row this service serves.
    pub fn rpc(&self) -> &'static Rpc {
        self.rpc
    }

    pub fn call<B>(
        &self,
        mut request: http::Request<B>,
        connection: &ConnectionInfo,
    ) -> BoxFuture<'static, http::Response<tonic::body::Body>>
    where
        B: http_body::Body + Send + Unpin + 'static,
        B::Data: Send,
        B::Error: Into<tonic::codegen::StdError> + Send + 'static,
    {
        // The key first: a refused call is not routed, queued or counted as a call, only as a
        // refusal (`teifleet_auth_failures_total`), as on the HTTP front.
        if let Err(failure) = self.gate.admit(request.headers_mut(), connection.transport.as_ref(), Protocol::Grpc) {
            return futures::future::ready(status::into_http(status::into_status(Error::Auth(failure)))).boxed();
        }
        // The call's clock starts now, with the server's `grpc-timeout` backstop, not at the
        // first poll.
        let mut call = self.forwarder.call(self.rpc, Protocol::Grpc);
        let forwarder = self.forwarder.clone();
        let report = move |response| {
            orca::with_load_report(response, move |reuse_for| {
                own_load(&forwarder, |admission| forwarder.last_report.bin_header(admission, reuse_for))
            })
        };
        // Routed here, from the headers alone: a call refused now (an unknown pool, bad metadata)
        // costs no future, and the call's future holds what routing found, not the span.
        let (meta, pool) = match self.forwarder.route(&mut call, request.headers()) {
            Ok(routed) => routed,
            Err(error) => {
                return futures::future::ready(report(status::into_http(Status::from(call.fail(error))))).boxed();
            }
        };
        let span = tracing::debug_span!("call", rpc = self.rpc.label, pool = pool.spec.name.as_str());
        let (message_timeout, connection) = (self.message_timeout, ConnectionId(connection.number));
        let admitting = Admitting { call, meta, pool, connection, door: self.door.clone() };
        let served = serve(admitting, self.forwarder.clone(), request, message_timeout).map(report);
        // A span no subscriber takes (debug logs off) would still be entered and left at every
        // poll of the call.
        match span.is_disabled() {
            true => served.boxed(),
            false => served.instrument(span).boxed(),
        }
    }
}

/// A routed call on its way through the door and admission.
struct Admitting {
    call: Call,
    meta: RequestMeta,
    pool: Arc<Pool>,
    connection: ConnectionId,
    door: Arc<HoldBounds>,
}

/// This replica's load as an ORCA report (`encode` picks the form), when its pool's budget is
/// known: what a balancing client weighs this endpoint by.
pub fn own_load(
    forwarder: &Forwarder,
    encode: impl FnOnce(&crate::admission::Admission) -> Option<http::HeaderValue>,
) -> Option<http::HeaderValue> {
    encode(&forwarder.pools.get(forwarder.pools.own_name())?.admission)
}

/// Admits a routed call, then reads its body and hands the message bytes to the forwarder. Not an
/// `async fn`: one keeps its arguments twice, as arguments and as locals (rust-lang/rust#62958),
/// and these are what a waiting call holds.
#[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice")]
fn serve<B>(
    mut admitting: Admitting,
    forwarder: Arc<Forwarder>,
    request: http::Request<B>,
    message_timeout: Duration,
) -> impl Future<Output = http::Response<tonic::body::Body>> + Send + 'static
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    async move {
        // Used in place until the call is admitted: an async fn keeps its arguments apart from its
        // locals, so moving them out would hold them twice while the call waits.
        let Admitting { call, meta, pool, connection, door } = &mut admitting;
        let rpc = call.rpc;
        if rpc.shape == Shape::Unary && pool.cache.is_some() && Cache::caches(rpc) {
            return serve_cached(admitting, forwarder, request, message_timeout).await;
        }
        // Held until the call is answered: calls waiting at the pool's door go in as calls finish.
        let _inside = match crate::front::door::go_through(rpc, meta, pool, *connection, door, call.arrived).await {
            Ok(pass) => pass,
            Err(error) => return status::into_http(Status::from(call.fail(error))),
        };
        let coalescer = pool.coalescer.clone().filter(|_| rpc.shape == Shape::Unary && rpc.admit == Admit::Permit);
        // A unary call whose cost its RPC tells waits for its permit before its body is read; other
        // unary calls once their bytes say what they cost, stream messages each as they arrive, and
        // coalesced calls in the call they share.
        let upfront = cost_before_body(pool, rpc).filter(|_| coalescer.is_none());
        // Scoped: a local of an async fn keeps its room in the call's future until its scope ends,
        // even once moved, and everything here is moved into the boxed exchange.
        let exchange = {
            let admitted = match (rpc.shape, upfront) {
                (Shape::Unary, Some(cost)) => forwarder.admit(call, pool, meta, cost).await,
                (Shape::ServerStream, Some(cost)) => {
                    forwarder.admit_here(call, pool, meta, cost).await.map(|permit| permit.map(Grant::Local))
                }
                _ => Ok(None),
            };
            let grant = match admitted {
                Ok(grant) => grant,
                Err(error) => return status::into_http(Status::from(call.fail(error))),
            };
            let Admitting { call, meta, pool, .. } = admitting;
            exchange(rpc.shape, Routed { forwarder, call, meta, pool, grant }, request, coalescer, message_timeout)
        };
        let (response, unread) = exchange.await;
        if let Some(mut routed) = unread.0 {
            count_refused_message(&mut routed, &response);
        }
        response
    }
}

/// A unary call of an RPC its pool caches: its message read first (it is charged to the memory
/// budget as any body), so that a call whose answer this process holds neither waits at the
/// door nor for a permit; the others go through the door, and then as any unary call (which
/// looks the message up, counted, and keeps TEI's answer).
fn serve_cached<B>(
    admitting: Admitting,
    forwarder: Arc<Forwarder>,
    request: http::Request<B>,
    message_timeout: Duration,
) -> BoxFuture<'static, http::Response<tonic::body::Body>>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    Box::pin(async move {
        let Admitting { mut call, mut meta, pool, connection, door } = admitting;
        let rpc = call.rpc;
        let max_message = forwarder.max_message_bytes();
        let _charge = request.extensions().get::<Arc<Charge>>().cloned();
        let request =
            match unary::read_request(within(message_timeout, request, forwarder.metrics.clone()), max_message).await {
                Ok(request) => request,
                Err(refused) => {
                    let response = status::into_http(refused);
                    let mut routed = Routed { forwarder, call, meta, pool, grant: None };
                    count_refused_message(&mut routed, &response);
                    return response;
                }
            };
        let here = pool
            .cache_for(rpc, meta.tenant.as_deref())
            .is_some_and(|cache| cache.all_here(&[request.get_ref().as_ref()]));
        let _inside = match here {
            true => None,
            false => match crate::front::door::go_through(rpc, &mut meta, &pool, connection, &door, call.arrived).await
            {
                Ok(pass) => pass,
                Err(error) => return status::into_http(Status::from(call.fail(error))),
            },
        };
        let coalescer = pool.coalescer.clone().filter(|_| rpc.admit == Admit::Permit);
        let routed = Routed { forwarder, call, meta, pool, grant: None };
        let answer = match coalescer {
            Some(coalescer) => routed.coalesced(coalescer, request).await,
            None => routed.unary(request).await,
        };
        unary::answer(answer, max_message)
    })
}

/// The admitted call's exchange: its body read and its message forwarded, its answer written.
/// Boxed: these futures are large, and a call waiting for its permit should not carry their room
/// while it waits. Each gives back the call never handed over: its request message was refused
/// (too large, compressed, cut short, too slow).
fn exchange<B>(
    shape: Shape,
    routed: Routed,
    request: http::Request<B>,
    coalescer: Option<Arc<crate::forward::coalesce::Coalescer>>,
    message_timeout: Duration,
) -> BoxFuture<'static, (http::Response<tonic::body::Body>, Once)>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    let max_message = routed.forwarder.max_message_bytes();
    let metrics = routed.forwarder.metrics.clone();
    let mut routed = Once(Some(routed));
    match shape {
        // One message each way, framed by `crate::front::grpc::unary` rather than tonic's streaming codec.
        Shape::Unary => Box::pin(async move {
            // The message's bytes stay charged to the memory budget until the call is answered.
            let _charge = request.extensions().get::<Arc<Charge>>().cloned();
            let request = match unary::read_request(within(message_timeout, request, metrics), max_message).await {
                Ok(request) => request,
                Err(refused) => return (status::into_http(refused), routed),
            };
            let answer = match coalescer {
                Some(coalescer) => routed.take().coalesced(coalescer, request).await,
                None => routed.take().unary(request).await,
            };
            (unary::answer(answer, max_message), routed)
        }),
        Shape::ServerStream => Box::pin(async move {
            let _charge = request.extensions().get::<Arc<Charge>>().cloned();
            let request = match unary::read_request(within(message_timeout, request, metrics), max_message).await {
                Ok(request) => request,
                Err(refused) => return (status::into_http(refused), routed),
            };
            let request = request.map(crate::vocab::framing::Framed::into_message);
            (stream_body::answer(routed.take().server_stream(request).await), routed)
        }),
        // A stream's messages come as the caller sends them: the call starts at once.
        Shape::ClientStream => Box::pin(async move {
            let request = match stream_body::incoming(request, max_message, metrics) {
                Ok(request) => request,
                Err(refused) => return (status::into_http(refused), routed),
            };
            (unary::answer(routed.take().client_stream(request).await, max_message), routed)
        }),
        Shape::Bidi => Box::pin(async move {
            let request = match stream_body::incoming(request, max_message, metrics) {
                Ok(request) => request,
                Err(refused) => return (status::into_http(refused), routed),
            };
            (stream_body::answer(routed.take().bidi(request).await), routed)
        }),
    }
}

/// The request body, cut off `timeout` from now: a caller that trickles its message holds its
/// stream, and possibly a permit, no longer than that.
fn within<B>(
    timeout: Duration,
    request: http::Request<B>,
    metrics: Metrics,
) -> http::Request<impl http_body::Body<Data = B::Data, Error = tonic::codegen::StdError> + Send + Unpin + 'static>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    let elapsed = move || {
        metrics.refused_input(PORT, REFUSED_SLOW_MESSAGE);
        // tonic answers a Status found in a body error as it is.
        Box::new(Status::from(Error::SlowMessage { within: timeout })) as tonic::codegen::StdError
    };
    let deadline = tokio::time::Instant::now() + timeout;
    request.map(|body| BodyDeadline::new(body, deadline, elapsed))
}

/// The `port` label of the gRPC port's refusals.
const PORT: &str = Protocol::Grpc.as_str();
const REFUSED_SLOW_MESSAGE: &str = "message_timeout";

/// Counts a call whose request message tonic refused before the call could be forwarded, by the
/// status tonic answered (its own words reach the caller unchanged).
fn count_refused_message(routed: &mut Routed, response: &http::Response<tonic::body::Body>) {
    let Some(status) = Status::from_header_map(response.headers()) else { return };
    // The caller left or broke its connection: counted as cancelled when the call drops.
    let Some((kind, reason)) = refused_message(status.code()) else { return };
    if let Some(reason) = reason {
        routed.forwarder.metrics.refused_input(PORT, reason);
    }
    routed.call.refuse(kind);
}

/// A routed call, handed over once its request could be read; kept when it could not.
struct Once(Option<Routed>);

impl Once {
    fn take(&mut self) -> Routed {
        self.0.take().expect("a call is handed over once")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Cost;
    use crate::forward::upstream::Direct;
    use crate::front::grpc::server::RequestBody;
    use crate::vocab::framing::Framed;
    use tonic::Request;

    /// Every call's future is as large as its largest state, and is moved whole at least once:
    /// rare paths (a spill, connecting upstream, tonic's client) are boxed so the common one does
    /// not carry their room. Bounds with room to spare over a debug build's sizes (3.1 KB for a
    /// unary call's forwarding, 12.3 KB before the rare paths were boxed).
    #[test]
    fn a_unary_calls_futures_carry_no_rare_paths() {
        fn unary<Fut>(_: fn(Routed, Request<Framed>) -> Fut) -> usize {
            size_of::<Fut>()
        }
        type Exchange<Fut> = fn(
            &'static Forwarder,
            &'static Pool,
            &'static Rpc,
            &'static RequestMeta,
            Request<Framed>,
            Option<&'static Grant>,
        ) -> Fut;
        fn exchange<Fut>(_: Exchange<Fut>) -> usize {
            size_of::<Fut>()
        }
        fn direct<Fut>(_: fn(&'static Direct, &'static str, &'static str, Request<Framed>, usize) -> Fut) -> usize {
            size_of::<Fut>()
        }
        fn admit<Fut>(
            _: fn(&'static Forwarder, &'static mut Call, &'static Pool, &'static RequestMeta, Cost) -> Fut,
        ) -> usize {
            size_of::<Fut>()
        }
        fn serve<Fut>(_: fn(Admitting, Arc<Forwarder>, http::Request<RequestBody>, Duration) -> Fut) -> usize {
            size_of::<Fut>()
        }
        let sizes = [
            // What a call waiting for its permit holds (1.3 KB in a debug build, 2.2 KB as an
            // `async fn`).
            ("serve", serve(super::serve), 1792),
            ("Routed::unary", unary(Routed::unary), 6 * 1024),
            ("Forwarder::exchange", exchange(Forwarder::exchange), 3 * 1024),
            ("Direct::unary", direct(Direct::unary), 2 * 1024),
            ("Forwarder::admit", admit(Forwarder::admit), 2 * 1024),
        ];
        for (future, size, bound) in sizes {
            assert!(size <= bound, "{future}'s future is {size} bytes, over {bound}");
        }
    }
}
