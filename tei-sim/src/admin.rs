//! The admin HTTP port: counters, faults, Prometheus metrics and a health probe.

use std::sync::Arc;

use axum::Router;
use axum::extract::State as Extract;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Fault;
use crate::state::State;

type Shared = Arc<State>;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/stats", get(stats))
        .route("/stats/reset", post(reset_stats))
        .route("/fault", get(fault))
        .route("/fault/fail", post(|s: Extract<Shared>| set_fault(s, Fault::Fail)))
        .route("/fault/stall", post(|s: Extract<Shared>| set_fault(s, Fault::Stall)))
        .route("/fault/clear", post(|s: Extract<Shared>| set_fault(s, Fault::None)))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(state)
}

pub(crate) async fn serve(listener: TcpListener, state: Shared, shutdown: CancellationToken) {
    let app = router(state);
    if let Err(error) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(%error, "admin server failed");
    }
}

/// axum is built without its `json` feature, so JSON is written by hand.
fn json(body: &impl serde::Serialize) -> Response {
    match serde_json::to_string(body) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

async fn stats(Extract(state): Extract<Shared>) -> Response {
    json(&state.counters.snapshot())
}

async fn reset_stats(Extract(state): Extract<Shared>) -> Response {
    state.counters.reset();
    json(&state.counters.snapshot())
}

#[derive(serde::Serialize)]
struct FaultBody {
    fault: Fault,
}

async fn fault(Extract(state): Extract<Shared>) -> Response {
    json(&FaultBody { fault: state.fault() })
}

async fn set_fault(Extract(state): Extract<Shared>, fault: Fault) -> Response {
    state.set_fault(fault);
    json(&FaultBody { fault })
}

async fn metrics(Extract(state): Extract<Shared>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

/// 503 while failing, like TEI's `/health`, so an HTTP prober sees the fault too.
async fn healthz(Extract(state): Extract<Shared>) -> Response {
    match state.fault() {
        Fault::Fail => (StatusCode::SERVICE_UNAVAILABLE, "unhealthy\n").into_response(),
        Fault::None | Fault::Stall => (StatusCode::OK, "ok\n").into_response(),
    }
}
