//! The operator's Prometheus metrics.

use std::time::Duration;

use prometheus::{
    GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use teifleet_crds::{AutoscalingStatus, PoolDemand};
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
    demand: DemandGauges,
    autoscaling: AutoscalingGauges,
}

/// Each pool's `status.demand` as gauges, by `namespace` and `pool`, for autoscalers that read
/// Prometheus (KEDA, an HPA through an adapter).
#[derive(Clone)]
struct DemandGauges {
    in_flight: IntGaugeVec,
    queued: IntGaugeVec,
    utilization: GaugeVec,
    refused: GaugeVec,
    spilled: GaugeVec,
}

const POOL_LABELS: [&str; 2] = ["namespace", "pool"];

impl DemandGauges {
    fn new() -> Self {
        let int = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &POOL_LABELS).expect("valid metric");
        let float = |name: &str, help: &str| GaugeVec::new(Opts::new(name, help), &POOL_LABELS).expect("valid metric");
        Self {
            in_flight: int("teifleet_pool_in_flight", "Inputs in flight to TEI across the pool's reporting sidecars."),
            queued: int("teifleet_pool_queued", "Inputs waiting in the pool's reporting sidecars' queues."),
            utilization: float(
                "teifleet_pool_utilization",
                "In flight over the in-flight limits in force at the same sidecars (1 is full).",
            ),
            refused: float(
                "teifleet_pool_refused_per_second",
                "Calls the pool refused for capacity, per second over the sidecars' last minute.",
            ),
            spilled: float(
                "teifleet_pool_spilled_per_second",
                "Calls the pool's sidecars handed to a sibling replica, per second over their last minute.",
            ),
        }
    }

    fn set(&self, labels: &[&str; 2], demand: &PoolDemand) {
        self.in_flight.with_label_values(labels).set(i64::from(demand.in_flight));
        self.queued.with_label_values(labels).set(i64::from(demand.queued));
        self.utilization.with_label_values(labels).set(f64::from(demand.utilization_percent) / 100.0);
        self.refused.with_label_values(labels).set(demand.refused_per_second);
        self.spilled.with_label_values(labels).set(demand.spilled_per_second);
    }

    fn remove(&self, labels: &[&str; 2]) {
        // Absent already is fine: a pool whose sidecars never answered has no series.
        drop(self.in_flight.remove_label_values(labels));
        drop(self.queued.remove_label_values(labels));
        drop(self.utilization.remove_label_values(labels));
        drop(self.refused.remove_label_values(labels));
        drop(self.spilled.remove_label_values(labels));
    }
}

/// Each autoscaled pool's `status.autoscaling` counts, by `namespace` and `pool`.
#[derive(Clone)]
struct AutoscalingGauges {
    desired: IntGaugeVec,
    recommended: IntGaugeVec,
}

impl AutoscalingGauges {
    fn new() -> Self {
        let int = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &POOL_LABELS).expect("valid metric");
        Self {
            desired: int("teifleet_pool_desired_replicas", "The replicas the autoscaler set for the pool."),
            recommended: int(
                "teifleet_pool_recommended_replicas",
                "The replicas the pool's load asked for, before stabilization and bounds.",
            ),
        }
    }

    fn remove(&self, labels: &[&str; 2]) {
        drop(self.desired.remove_label_values(labels));
        drop(self.recommended.remove_label_values(labels));
    }
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
        let demand = DemandGauges::new();
        let autoscaling = AutoscalingGauges::new();
        let d = &demand;
        register(
            &registry,
            &[
                &reconciliations,
                &errors,
                &duration,
                &status_writes,
                &leader,
                &refused_input,
                &d.in_flight,
                &d.queued,
                &d.utilization,
                &d.refused,
                &d.spilled,
                &autoscaling.desired,
                &autoscaling.recommended,
            ],
        )
        .expect("metric names are unique");
        Self { registry, reconciliations, errors, duration, status_writes, leader, refused_input, demand, autoscaling }
    }

    /// A registry with a series in every family this operator exports, labelled with placeholders
    /// (`namespace`, `pool`, `example`): what `teifleet-operator --print-metrics` prints, so checks
    /// that dashboards and alert rules name only real metrics (tools/check_metric_names.py) read
    /// the names from this code, not from a copy. A labelled family shows no series before its
    /// first use; the destructuring below names every field, so a new family does not compile
    /// until it is given one here, and the unit test compares the result with every family's
    /// registration.
    pub fn every_series() -> Self {
        let metrics = Self::new();
        let Self {
            registry: _,
            reconciliations,
            errors,
            duration,
            status_writes,
            leader,
            refused_input,
            demand,
            autoscaling: AutoscalingGauges { desired, recommended },
        } = &metrics;
        let labels = ["namespace", "pool"];
        demand.set(&labels, &PoolDemand::default());
        desired.with_label_values(&labels).set(0);
        recommended.with_label_values(&labels).set(0);
        reconciliations.with_label_values(&["example"]).inc_by(0);
        errors.with_label_values(&["example"]).inc_by(0);
        duration.observe(0.0);
        status_writes.inc_by(0);
        leader.set(0);
        refused_input.with_label_values(&["admin", "example"]).inc_by(0);
        metrics
    }

    /// Shows a pool's demand, the same numbers as its `status.demand`; `None` (no sidecar
    /// answered) removes its series, since an unknown load is not a zero one.
    pub fn pool_demand(&self, namespace: &str, pool: &str, demand: Option<&PoolDemand>) {
        match demand {
            Some(demand) => self.demand.set(&[namespace, pool], demand),
            None => self.demand.remove(&[namespace, pool]),
        }
    }

    /// Shows what the autoscaler decided for a pool (`status.autoscaling`); `None` (a pool sized
    /// by hand) removes its series.
    pub fn pool_autoscaling(&self, namespace: &str, pool: &str, autoscaling: Option<&AutoscalingStatus>) {
        let labels = [namespace, pool];
        match autoscaling {
            Some(status) => {
                self.autoscaling.desired.with_label_values(&labels).set(i64::from(status.desired_replicas));
                self.autoscaling.recommended.with_label_values(&labels).set(i64::from(status.recommended_replicas));
            }
            None => self.autoscaling.remove(&labels),
        }
    }

    /// Drops the series of a pool that is gone.
    pub fn forget_pool(&self, namespace: &str, pool: &str) {
        self.demand.remove(&[namespace, pool]);
        self.autoscaling.remove(&[namespace, pool]);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sample of `name` as (labels, value).
    fn samples(metrics: &Metrics, name: &str) -> Vec<(Vec<String>, f64)> {
        let families = metrics.registry.gather();
        let Some(family) = families.iter().find(|family| family.name() == name) else { return Vec::new() };
        family
            .get_metric()
            .iter()
            .map(|metric| {
                let labels = metric.get_label().iter().map(|label| label.value().to_owned()).collect();
                (labels, metric.get_gauge().get_value())
            })
            .collect()
    }

    #[test]
    fn every_series_shows_every_registered_family() {
        use prometheus::core::Collector;

        let metrics = Metrics::every_series();
        let Metrics {
            registry,
            reconciliations,
            errors,
            duration,
            status_writes,
            leader,
            refused_input,
            demand: DemandGauges { in_flight, queued, utilization, refused, spilled },
            autoscaling: AutoscalingGauges { desired, recommended },
        } = &metrics;
        let collectors: [&dyn Collector; 13] = [
            reconciliations,
            errors,
            duration,
            status_writes,
            leader,
            refused_input,
            in_flight,
            queued,
            utilization,
            refused,
            spilled,
            desired,
            recommended,
        ];
        let mut registered: Vec<String> =
            collectors.iter().flat_map(|c| c.desc()).map(|desc| desc.fq_name.clone()).collect();
        let mut shown: Vec<String> = registry
            .gather()
            .iter()
            .filter(|family| !family.get_metric().is_empty())
            .map(|family| family.name().to_owned())
            .collect();
        registered.sort();
        shown.sort();
        assert_eq!(shown, registered);
    }

    #[test]
    fn a_pools_demand_is_shown_by_namespace_and_pool_and_removed_when_unknown_or_gone() {
        let metrics = Metrics::new();
        let demand = PoolDemand {
            replicas_reporting: 2,
            in_flight: 40,
            queued: 5,
            utilization_percent: 63,
            refused_per_second: 0.5,
            spilled_per_second: 1.2,
        };
        metrics.pool_demand("ml", "bge", Some(&demand));
        metrics.pool_demand("ml", "gte", Some(&PoolDemand::default()));
        let labels = vec!["ml".to_owned(), "bge".to_owned()];
        let of_bge = |name| samples(&metrics, name).into_iter().find(|(l, _)| *l == labels).map(|(_, v)| v);
        assert_eq!(of_bge("teifleet_pool_in_flight"), Some(40.0));
        assert_eq!(of_bge("teifleet_pool_queued"), Some(5.0));
        assert_eq!(of_bge("teifleet_pool_utilization"), Some(0.63));
        assert_eq!(of_bge("teifleet_pool_refused_per_second"), Some(0.5));
        assert_eq!(of_bge("teifleet_pool_spilled_per_second"), Some(1.2));

        metrics.pool_demand("ml", "bge", None);
        assert_eq!(of_bge("teifleet_pool_in_flight"), None, "no answer is not zero load");
        assert_eq!(samples(&metrics, "teifleet_pool_queued").len(), 1, "the other pool stays");
        metrics.forget_pool("ml", "gte");
        metrics.forget_pool("ml", "never-reported");
        for name in ["teifleet_pool_in_flight", "teifleet_pool_utilization", "teifleet_pool_spilled_per_second"] {
            assert!(samples(&metrics, name).is_empty(), "{name}");
        }
    }

    #[test]
    fn an_autoscaled_pools_counts_are_shown_and_removed_when_it_is_sized_by_hand_or_gone() {
        let metrics = Metrics::new();
        let decided =
            AutoscalingStatus { desired_replicas: 4, recommended_replicas: 6, ..AutoscalingStatus::default() };
        metrics.pool_autoscaling("ml", "bge", Some(&decided));
        metrics.pool_autoscaling("ml", "gte", Some(&decided));
        assert_eq!(samples(&metrics, "teifleet_pool_desired_replicas")[0], (vec!["ml".into(), "bge".into()], 4.0));
        assert_eq!(samples(&metrics, "teifleet_pool_recommended_replicas")[0].1, 6.0);
        metrics.pool_autoscaling("ml", "bge", None);
        assert_eq!(samples(&metrics, "teifleet_pool_desired_replicas").len(), 1, "bge is sized by hand now");
        metrics.forget_pool("ml", "gte");
        assert!(samples(&metrics, "teifleet_pool_recommended_replicas").is_empty());
    }
}
