//! What the admin port's probes report; `teifleet_runtime::admin` serves them with `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use teifleet_runtime::admin::{self, AdminRoutes};

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

    /// Liveness: a blind operator (watches failing for minutes) is better restarted.
    pub fn live(&self) -> Result<(), &'static str> {
        if self.watches.healthy(Instant::now()) { Ok(()) } else { Err("watches have been failing for minutes") }
    }

    /// Readiness: standby replicas are ready too, or a rollout would stall behind the leader.
    pub fn ready(&self) -> Result<(), &'static str> {
        if self.ready.load(Ordering::Relaxed) { Ok(()) } else { Err("starting") }
    }
}

/// `/metrics`, `/healthz` and `/readyz` for `health`.
pub fn routes(health: &Arc<Health>) -> AdminRoutes {
    let (live, ready) = (Arc::clone(health), Arc::clone(health));
    admin::routes(health.metrics.registry.clone()).healthz(move || live.live()).readyz(move || ready.ready())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_started() {
        let health = Health::new(Metrics::new());
        assert_eq!(health.ready(), Err("starting"));
        health.ready.store(true, Ordering::Relaxed);
        assert_eq!(health.ready(), Ok(()));
        assert_eq!(health.live(), Ok(()));
    }
}
