//! The admin HTTP port: `/metrics`, `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus::{Encoder, TextEncoder};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::watch_health::WatchHealth;

/// What the admin endpoints report.
pub struct Health {
    pub metrics: Metrics,
    /// Set once the API server answered and the controller started (leading or standing by).
    pub ready: AtomicBool,
    pub watches: WatchHealth,
}

impl Health {
    pub fn new(metrics: Metrics) -> Arc<Self> {
        Arc::new(Self { metrics, ready: AtomicBool::new(false), watches: WatchHealth::default() })
    }
}

async fn healthz(State(health): State<Arc<Health>>) -> (StatusCode, &'static str) {
    if health.watches.healthy(std::time::Instant::now()) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "watches have been failing for minutes\n")
    }
}

async fn metrics(State(health): State<Arc<Health>>) -> (StatusCode, String) {
    let mut buffer = Vec::new();
    match TextEncoder::new().encode(&health.metrics.registry.gather(), &mut buffer) {
        Ok(()) => (StatusCode::OK, String::from_utf8_lossy(&buffer).into_owned()),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

async fn readyz(State(health): State<Arc<Health>>) -> (StatusCode, &'static str) {
    if health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

/// Serves until `shutdown` is cancelled.
pub async fn serve(addr: SocketAddr, health: Arc<Health>, shutdown: CancellationToken) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "admin server listening");
    axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await
}
