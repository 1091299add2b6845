//! The admin HTTP port: `/metrics`, `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus::{Encoder, TextEncoder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pools::PoolTable;

/// What `/readyz` and gRPC health report.
pub struct Readiness {
    pub pools: Arc<PoolTable>,
    /// The pool's own TEI answered its last health check.
    pub upstream_serving: AtomicBool,
    /// Cleared when draining starts.
    pub accepting: AtomicBool,
}

impl Readiness {
    /// Serving only when TEI is reachable, the pool's limits are known, and not draining.
    pub fn ready(&self) -> Result<(), &'static str> {
        if !self.accepting.load(Ordering::Relaxed) {
            return Err("draining");
        }
        match self.pools.get(self.pools.own_name()) {
            Some(pool) if pool.spec.limits.is_some() => {}
            _ => return Err("pool configuration not known yet"),
        }
        if !self.upstream_serving.load(Ordering::Relaxed) {
            return Err("TEI is not serving");
        }
        Ok(())
    }
}

#[derive(Clone)]
struct AdminState {
    metrics: Metrics,
    readiness: Arc<Readiness>,
}

async fn metrics(State(state): State<AdminState>) -> (StatusCode, String) {
    let mut buffer = Vec::new();
    match TextEncoder::new().encode(&state.metrics.registry.gather(), &mut buffer) {
        Ok(()) => (StatusCode::OK, String::from_utf8_lossy(&buffer).into_owned()),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

async fn readyz(State(state): State<AdminState>) -> (StatusCode, String) {
    match state.readiness.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

/// Serves the admin endpoints on `listener` until `stop`.
pub async fn serve(listener: TcpListener, metrics: Metrics, readiness: Arc<Readiness>, stop: CancellationToken) {
    let app = Router::new()
        .route("/metrics", get(self::metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(AdminState { metrics, readiness });
    if let Err(error) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
        tracing::error!(%error, "admin server failed");
    }
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
