//! The admin HTTP port: `/metrics`, `/healthz`, `/readyz`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `stop`.
pub async fn serve(listener: TcpListener, metrics: Metrics, readiness: Arc<Readiness>, stop: CancellationToken) {
    let router =
        teifleet_runtime::admin::routes(metrics.registry.clone()).readyz(move || readiness.ready()).into_router();
    if let Err(error) = teifleet_runtime::admin::serve(listener, router, stop.cancelled_owned()).await {
        tracing::error!(%error, "admin server failed");
    }
}
