//! The HTTP front: TEI's HTTP API and OpenAI's embeddings route on a port of their own,
//! translated to `tei.v1` calls that take the gRPC front's path (routing headers, admission,
//! deadlines, metrics) through the same `Forwarder`.
//!
//! Layout: `table` (every route, one row each: the router is built from it), `routes` (one
//! handler per route), `types` (the JSON of TEI and OpenAI), `request` (one
//! request: its call, its input cap, its inputs as unary upstream calls admitted per chunk),
//! `info` (each pool's Info, fetched once) and `error` (the one place failures become status
//! codes and error bodies).

pub mod answer;
mod capped;
pub mod error;
pub mod info;
pub mod memory;
pub mod request;
pub mod routes;
pub mod table;
pub mod types;
pub mod upstream;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode, header};
use serde::Serialize;

use self::error::HttpError;
pub use self::table::{ROUTES, Route, RouteKind, RouteMethod, example_body};
use crate::admission::memory::MemoryBudget;
use crate::forward::Forwarder;
use crate::front::Readiness;
use crate::gate::auth::{self, Gate};
use crate::gate::door::HoldBounds;
use crate::vocab::Protocol;

/// TEI's `--payload-limit` default, as the pool spec defaults it.
pub const DEFAULT_PAYLOAD_LIMIT: usize = teifleet_crds::TEI_DEFAULT_PAYLOAD_LIMIT as usize;
/// TEI's `--max-client-batch-size` default, as the pool spec defaults it.
pub const DEFAULT_MAX_CLIENT_BATCH_SIZE: usize = teifleet_crds::TEI_DEFAULT_MAX_CLIENT_BATCH_SIZE as usize;
/// Most inputs in one HTTP request, as the pool spec defaults it.
pub const DEFAULT_MAX_REQUEST_INPUTS: usize = teifleet_crds::DEFAULT_MAX_REQUEST_INPUTS as usize;

/// The HTTP front's limits. Declared once: these are the binary's flags (the operator renders
/// them from the pool spec), and their defaults are [`Default`]'s.
#[derive(Clone, Debug, clap::Args)]
pub struct HttpSettings {
    /// Largest request body in bytes (TEI's --payload-limit); 413 beyond.
    #[arg(long, default_value_t = DEFAULT_PAYLOAD_LIMIT)]
    pub payload_limit: usize,
    /// Inputs sent upstream under one permit (TEI's --max-client-batch-size, which TEI refuses
    /// beyond); larger batches are split and put back in order.
    #[arg(long, default_value_t = DEFAULT_MAX_CLIENT_BATCH_SIZE, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_client_batch_size: usize,
    /// Most inputs in one request (413 beyond): bounds the upstream calls, the time and the
    /// memory one small body can cost.
    #[arg(long, default_value_t = DEFAULT_MAX_REQUEST_INPUTS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_request_inputs: usize,
    /// What a request that says nothing about truncation gets: TEI's --auto-truncate, which
    /// TEI's HTTP routes follow and its gRPC API ignores (its `truncate` is false when unset).
    #[arg(long, action = clap::ArgAction::Set, default_value_t = teifleet_crds::TEI_DEFAULT_AUTO_TRUNCATE)]
    pub auto_truncate: bool,
    /// Largest answer in bytes of JSON (`64Mi`, `1000000`): a request whose answer is estimated
    /// larger before it is sent upstream (inputs x tokens x dimensions for /embed_all) is refused
    /// with 413; what is assembled is charged to the memory budget meanwhile.
    #[arg(long, default_value = "32Mi", value_parser = crate::admission::memory::parse_bytes)]
    pub max_answer_bytes: u64,
    /// Concurrent HTTP/2 streams per connection on the HTTP port: each is a whole request with
    /// its body buffered, so few.
    #[arg(long, default_value_t = 16)]
    pub http_max_concurrent_streams: u32,
}

impl Default for HttpSettings {
    fn default() -> Self {
        crate::vocab::flags::defaults()
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct Shared {
    forwarder: Arc<Forwarder>,
    readiness: Arc<Readiness>,
    settings: HttpSettings,
    info: Arc<info::InfoCache>,
    /// The process's memory budget, answers being assembled charged to it.
    memory: Arc<MemoryBudget>,
    /// Each pool's vector size, learned from its answers.
    dimensions: Arc<answer::Dimensions>,
    /// How many requests the pools' doors may hold, and for how long (shared with the gRPC port).
    door: Arc<HoldBounds>,
}

/// Every route of the HTTP front ([`ROUTES`]), behind the API-key gate.
pub fn router(
    forwarder: Arc<Forwarder>,
    readiness: Arc<Readiness>,
    settings: HttpSettings,
    gate: Arc<Gate>,
    body_timeout: std::time::Duration,
    memory: Arc<MemoryBudget>,
    door: Arc<HoldBounds>,
) -> Router {
    let limit = settings.payload_limit;
    let metrics = forwarder.metrics.clone();
    let bodies = memory::Bodies { memory: memory.clone(), payload_limit: limit, metrics, flavor: table::flavor };
    table::ROUTES
        .iter()
        .fold(Router::new(), |router, route| router.route(route.path, route.handlers()))
        .layer(DefaultBodyLimit::max(limit))
        // A body trickled in a byte at a time holds its connection and buffer no longer than this.
        .layer(tower_http::timeout::RequestBodyDeadlineLayer::new(body_timeout))
        // After the key (a caller without one holds nothing), before the body is read.
        .layer(middleware::from_fn_with_state(bodies, memory::charge_body))
        .layer(middleware::from_fn_with_state(gate, require_key))
        .layer(middleware::map_response_with_state(forwarder.clone(), load_report))
        .with_state(Shared {
            forwarder,
            readiness,
            settings,
            info: Arc::default(),
            memory,
            dimensions: Arc::default(),
            door,
        })
}

/// This replica's load on every answer, in the text form of ORCA's header that Envoy reads on
/// HTTP (`crate::report::orca`), so a balancing proxy can weigh replicas per request.
async fn load_report(State(forwarder): State<Arc<Forwarder>>, mut response: Response) -> Response {
    if let Some(report) = crate::front::grpc::service::own_load(&forwarder, crate::report::orca::text_header) {
        response.headers_mut().insert(crate::report::orca::ENDPOINT_LOAD_METRICS, report);
    }
    response
}

/// The API-key gate, before any route reads the body: every route needs a key when the pool has
/// keys, except the health checks, which load balancers and probes call without one and which
/// tell nothing but readiness ([`Route::keyless_get`]). Every other route (a new one included)
/// needs a key.
async fn require_key(State(gate): State<Arc<Gate>>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if request.method() == Method::GET && table::route(path).is_some_and(table::Route::keyless_get) {
        return next.run(request).await;
    }
    // OpenAI's clients read OpenAI's error shape; every other route answers in TEI's.
    let flavor = table::flavor(path);
    let certified = auth::certified(request.extensions()).cloned();
    match gate.admit(request.headers_mut(), certified.as_ref(), Protocol::Http) {
        Ok(()) => next.run(request).await,
        Err(failure) => HttpError::Call(crate::error::Error::Auth(failure)).into_response(flavor),
    }
}

pub(crate) fn json_bytes(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub(crate) fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => json_bytes(StatusCode::OK, body),
        Err(error) => error::HttpError::Unencodable(error.to_string()).into_response(error::Flavor::Tei),
    }
}

/// `value` as JSON, encoded on a blocking thread: an answer of millions of numbers holds a CPU
/// for a while, and the async workers keep serving every other call meanwhile (a worker busy
/// encoding cannot hand its queued tasks to the others at once).
pub(crate) async fn json_off_workers<T: Serialize + Send + 'static>(value: T) -> Response {
    match tokio::task::spawn_blocking(move || serde_json::to_vec(&value)).await {
        Ok(Ok(body)) => json_bytes(StatusCode::OK, body),
        Ok(Err(error)) => error::HttpError::Unencodable(error.to_string()).into_response(error::Flavor::Tei),
        Err(error) => error::HttpError::Unencodable(error.to_string()).into_response(error::Flavor::Tei),
    }
}
