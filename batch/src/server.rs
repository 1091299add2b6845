//! The HTTP server: its routes, and serving them within bounds until shutdown.

use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::{MethodRouter, get, post};
use teifleet_runtime::http_server::{self, ServerBounds};
use tokio::net::TcpListener;

pub use crate::state::{AppState, JobDefaults, JobStore, Limits};
use crate::{batches, files};

/// Multipart framing and the `purpose` field around an upload's bytes: an upload's body may be
/// this much larger than the file. The file's own bound is counted as it streams, so the caller
/// hears OpenAI's message, not the body limit's.
const MULTIPART_OVERHEAD: u64 = 1 << 20;

/// One row of the API: a path, the methods it answers and their handlers. A new route is a row
/// here, and `batch/tests/hostile_routes.rs` fails until it has its attacks.
pub struct Route {
    pub path: &'static str,
    pub methods: &'static [Method],
    handlers: MethodRouter<AppState>,
}

/// Every route the server answers, `/healthz` included.
pub fn routes(limits: &Limits) -> Vec<Route> {
    let upload_limit = usize::try_from(limits.max_file_bytes.saturating_add(MULTIPART_OVERHEAD)).unwrap_or(usize::MAX);
    let route = |path, methods, handlers| Route { path, methods, handlers };
    vec![
        route(
            "/v1/files",
            &[Method::POST, Method::GET],
            post(files::upload::upload).layer(DefaultBodyLimit::max(upload_limit)).get(files::list::list),
        ),
        route("/v1/files/{id}", &[Method::GET, Method::DELETE], get(files::get::get).delete(files::delete::delete)),
        route("/v1/files/{id}/content", &[Method::GET], get(files::content::content)),
        route("/v1/batches", &[Method::POST, Method::GET], post(batches::create::create).get(batches::handlers::list)),
        route("/v1/batches/{id}", &[Method::GET], get(batches::handlers::get)),
        route("/v1/batches/{id}/cancel", &[Method::POST], post(batches::handlers::cancel)),
        route("/healthz", &[Method::GET], get(|| async { "ok" })),
    ]
}

/// The API's routes.
pub fn router(state: AppState) -> Router {
    let routes = routes(&state.limits);
    routes.into_iter().fold(Router::new(), |router, r| router.route(r.path, r.handlers)).with_state(state)
}

/// What one client may make the server hold (teifleet's shared HTTP server enforces them): the
/// API's clients are SDKs and pipelines, a few connections each; an upload is a request in
/// flight, never idle, however long it streams.
pub const BOUNDS: ServerBounds = ServerBounds {
    max_connections: 1024,
    max_connections_per_peer: 256,
    idle_timeout: Duration::from_secs(60),
    header_read_timeout: Duration::from_secs(30),
    max_headers: 64,
    max_header_bytes: 16 * 1024,
    max_concurrent_streams: 64,
    probe_slots: 8,
    probe_paths: &["/healthz"],
};

/// Serves `router` on `listener` within [`BOUNDS`] until `shutdown` resolves, then lets calls in
/// flight finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let refused = |reason: &'static str| tracing::debug!(reason, "connection refused");
    http_server::serve(listener, router, &BOUNDS, refused, shutdown).await
}
