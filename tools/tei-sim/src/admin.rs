//! The admin HTTP port: counters and faults, next to `teifleet_runtime::admin`'s `/metrics` and
//! probes.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State as Extract};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use teifleet_runtime::admin;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Fault;
use crate::state::State;

type Shared = Arc<State>;

pub(crate) fn router(state: Shared) -> Router {
    // 503 while failing, like TEI's `/health`, so an HTTP prober sees the fault too.
    let failing = |state: Shared| {
        move || match state.fault() {
            Fault::Fail => Err("failing (injected fault)"),
            Fault::None | Fault::Stall => Ok(()),
        }
    };
    let probes = admin::routes(state.metrics.registry().clone())
        .healthz(failing(Arc::clone(&state)))
        .readyz(failing(Arc::clone(&state)))
        .into_router();
    Router::new()
        .route("/stats", get(stats))
        .route("/stats/reset", post(reset_stats))
        .route("/fault", get(fault))
        .route("/fault/fail", post(|s: Extract<Shared>| set_fault(s, Fault::Fail)))
        .route("/fault/stall", post(|s: Extract<Shared>| set_fault(s, Fault::Stall)))
        .route("/fault/clear", post(|s: Extract<Shared>| set_fault(s, Fault::None)))
        .route("/device/slowdown/{factor}", post(set_slowdown))
        .with_state(state)
        .merge(probes)
}

pub(crate) async fn serve(listener: TcpListener, state: Shared, shutdown: CancellationToken) {
    if let Err(error) = admin::serve(listener, router(state), |_reason| {}, shutdown.cancelled_owned()).await {
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

/// `POST /device/slowdown/2` makes every batch take twice its device time (half the capacity);
/// `/device/slowdown/1` restores it.
async fn set_slowdown(Extract(state): Extract<Shared>, Path(factor): Path<f64>) -> Response {
    if !(factor.is_finite() && factor > 0.0) {
        return (StatusCode::BAD_REQUEST, "the slowdown factor must be a positive number\n").into_response();
    }
    state.slowdown.set(factor);
    tracing::info!(factor, "device slowdown changed");
    json(&serde_json::json!({ "slowdown": factor }))
}

async fn set_fault(Extract(state): Extract<Shared>, fault: Fault) -> Response {
    state.set_fault(fault);
    json(&FaultBody { fault })
}
