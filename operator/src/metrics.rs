//! The operator's Prometheus metrics.

use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use teifleet_runtime::metrics::register;

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    reconciliations: IntCounterVec,
    errors: IntCounterVec,
    duration: Histogram,
    status_writes: IntCounter,
    leader: IntGauge,
    refused_input: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let reconciliations = IntCounterVec::new(
            Opts::new("teifleet_operator_reconciliations_total", "Reconciliations of EmbeddingPools by result."),
            &["result"],
        )
        .expect("valid metric");
        let errors = IntCounterVec::new(
            Opts::new("teifleet_operator_reconcile_errors_total", "Failed reconciliations by error kind."),
            &["error"],
        )
        .expect("valid metric");
        let duration = Histogram::with_opts(
            HistogramOpts::new("teifleet_operator_reconcile_duration_seconds", "Time one reconciliation took.")
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
        )
        .expect("valid metric");
        let status_writes = IntCounter::new(
            "teifleet_operator_status_writes_total",
            "Status patches written; stays flat while pools are steady.",
        )
        .expect("valid metric");
        let leader = IntGauge::new("teifleet_operator_leader", "1 while this replica holds the leader lease.")
            .expect("valid metric");
        let refused_input = teifleet_runtime::metrics::refused_input();
        register(&registry, &[&reconciliations, &errors, &duration, &status_writes, &leader, &refused_input])
            .expect("metric names are unique");
        Self { registry, reconciliations, errors, duration, status_writes, leader, refused_input }
    }

    pub fn reconciled(&self, took: Duration) {
        self.reconciliations.with_label_values(&["ok"]).inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn failed(&self, error: &crate::Error) {
        self.reconciliations.with_label_values(&["error"]).inc();
        self.errors.with_label_values(&[error.metric_label()]).inc();
    }

    /// Counts a client the admin port turned away at one of its bounds.
    pub fn refusal_counter(&self) -> impl Fn(&'static str) + Send + Sync + 'static {
        let counter = self.refused_input.clone();
        move |reason| counter.with_label_values(&["admin", reason]).inc()
    }

    pub fn status_written(&self) {
        self.status_writes.inc();
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
