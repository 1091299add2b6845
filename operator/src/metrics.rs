//! The operator's Prometheus metrics.

use std::time::Duration;

use prometheus::{
    GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use teifleet_crds::{AutoscalingStatus, EmbeddingJobStatus, PoolDemand};
use teifleet_runtime::metrics::register;

use crate::jobs::status::{PHASES, shown_phase};

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
    jobs: JobGauges,
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

/// Each EmbeddingJob's status as gauges, by `namespace` and `job_name` (not `job`: that is the
/// label Prometheus gives every series for its scrape job; kube-state-metrics names a batch Job
/// `job_name` too, and the EmbeddingJob's batch Job has its name).
#[derive(Clone)]
struct JobGauges {
    /// `state`: `total` (absent while unknown), `done`, `failed`.
    rows: IntGaugeVec,
    rows_per_second: GaugeVec,
    /// `state`: `total` (absent until a worker planned the input), `done`.
    shards: IntGaugeVec,
    /// `phase`: one of [`PHASES`], 1 for the one the status shows and 0 for the others.
    phase: IntGaugeVec,
}

const JOB_LABELS: [&str; 2] = ["namespace", "job_name"];

impl JobGauges {
    fn new() -> Self {
        let with = |name: &str, help: &str, extra: &str| {
            IntGaugeVec::new(Opts::new(name, help), &[JOB_LABELS[0], JOB_LABELS[1], extra]).expect("valid metric")
        };
        Self {
            rows: with(
                "teifleet_job_rows",
                "An EmbeddingJob's rows by state: total (in the input, estimated for JSONL until the end), done (written), failed (written with an error).",
                "state",
            ),
            rows_per_second: GaugeVec::new(
                Opts::new(
                    "teifleet_job_rows_per_second",
                    "An EmbeddingJob's rows done per second since its workers started (over the whole run once it ended).",
                ),
                &JOB_LABELS,
            )
            .expect("valid metric"),
            shards: with(
                "teifleet_job_shards",
                "An EmbeddingJob's shards by state: total (planned), done (written and reported).",
                "state",
            ),
            phase: with(
                "teifleet_job_phase",
                "1 for the phase an EmbeddingJob's status shows (Pending, Running, Suspended, Blocked, Complete, Failed), 0 for the others.",
                "phase",
            ),
        }
    }

    fn set(&self, labels: &[&str; 2], status: &EmbeddingJobStatus) {
        let [namespace, job] = *labels;
        let optional = |family: &IntGaugeVec, state: &str, value: Option<i64>| match value {
            Some(value) => family.with_label_values(&[namespace, job, state]).set(value),
            // Unknown is not zero.
            None => drop(family.remove_label_values(&[namespace, job, state])),
        };
        optional(&self.rows, "total", status.rows_total);
        self.rows.with_label_values(&[namespace, job, "done"]).set(status.rows_done);
        self.rows.with_label_values(&[namespace, job, "failed"]).set(status.rows_failed);
        match status.rows_per_second {
            Some(rate) => self.rows_per_second.with_label_values(labels).set(rate),
            None => drop(self.rows_per_second.remove_label_values(labels)),
        }
        optional(&self.shards, "total", status.shards_total);
        self.shards.with_label_values(&[namespace, job, "done"]).set(status.shards_done);
        let shown = shown_phase(status);
        for phase in PHASES {
            self.phase.with_label_values(&[namespace, job, phase]).set(i64::from(phase == shown));
        }
    }

    fn remove(&self, labels: &[&str; 2]) {
        let [namespace, job] = *labels;
        // Absent already is fine: a job not reconciled since the operator started has no series.
        for state in ["total", "done", "failed"] {
            drop(self.rows.remove_label_values(&[namespace, job, state]));
        }
        drop(self.rows_per_second.remove_label_values(labels));
        for state in ["total", "done"] {
            drop(self.shards.remove_label_values(&[namespace, job, state]));
        }
        for phase in PHASES {
            drop(self.phase.remove_label_values(&[namespace, job, phase]));
        }
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
        let jobs = JobGauges::new();
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
                &jobs.rows,
                &jobs.rows_per_second,
                &jobs.shards,
                &jobs.phase,
            ],
        )
        .expect("metric names are unique");
        Self {
            registry,
            reconciliations,
            errors,
            duration,
            status_writes,
            leader,
            refused_input,
            demand,
            autoscaling,
            jobs,
        }
    }

    /// A registry with a series in every family this operator exports, labelled with placeholders
    /// (`namespace`, `pool`, `job_name`, `example`): what `teifleet-operator --print-metrics` prints, so checks
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
            jobs,
        } = &metrics;
        // Every optional field set, so that every state has its series.
        let job = EmbeddingJobStatus {
            rows_total: Some(0),
            shards_total: Some(0),
            rows_per_second: Some(0.0),
            ..EmbeddingJobStatus::default()
        };
        jobs.set(&JOB_LABELS, &job);
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

    /// Shows an EmbeddingJob's status (what the operator wrote, or found already written):
    /// rows, rate, shards and phase. A count the status does not know yet has no series.
    pub fn job_status(&self, namespace: &str, job: &str, status: &EmbeddingJobStatus) {
        self.jobs.set(&[namespace, job], status);
    }

    /// Drops every series of an EmbeddingJob that is gone (or going).
    pub fn forget_job(&self, namespace: &str, job: &str) {
        self.jobs.remove(&[namespace, job]);
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
            jobs: JobGauges { rows, rows_per_second, shards, phase },
        } = &metrics;
        let collectors: [&dyn Collector; 17] = [
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
            rows,
            rows_per_second,
            shards,
            phase,
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

    /// The value of the sample of `name` whose labels include every one of `labels`.
    fn value(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let families = metrics.registry.gather();
        let family = families.iter().find(|family| family.name() == name)?;
        let has = |metric: &prometheus::proto::Metric, (key, want): &(&str, &str)| {
            metric.get_label().iter().any(|label| label.name() == *key && label.value() == *want)
        };
        family.get_metric().iter().find(|metric| labels.iter().all(|pair| has(metric, pair))).map(|metric| match family
            .get_field_type()
        {
            prometheus::proto::MetricType::GAUGE => metric.get_gauge().get_value(),
            _ => f64::NAN,
        })
    }

    fn job_status(running: (&str, &str), complete: bool, failed: bool) -> EmbeddingJobStatus {
        use teifleet_crds::job::job_conditions::{COMPLETE, FAILED, RUNNING};
        let condition =
            |type_: &str, status: bool, reason: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: type_.into(),
                status: if status { "True" } else { "False" }.into(),
                reason: reason.into(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            };
        let (status, reason) = running;
        EmbeddingJobStatus {
            conditions: vec![
                condition(RUNNING, status == "True", reason),
                condition(COMPLETE, complete, reason),
                condition(FAILED, failed, reason),
            ],
            ..EmbeddingJobStatus::default()
        }
    }

    #[test]
    fn a_jobs_status_is_shown_by_namespace_and_job_name_and_removed_when_it_is_gone() {
        let metrics = Metrics::new();
        let running = EmbeddingJobStatus {
            shards_total: Some(40),
            shards_done: 10,
            rows_done: 10_000,
            rows_failed: 20,
            rows_total: Some(40_000),
            rows_total_estimated: true,
            rows_per_second: Some(100.0),
            ..job_status(("True", "WorkersRunning"), false, false)
        };
        metrics.job_status("ml", "wiki", &running);
        metrics.job_status("ml", "news", &job_status(("True", "WorkersPending"), false, false));
        let wiki =
            |name, extra: (&str, &str)| value(&metrics, name, &[("namespace", "ml"), ("job_name", "wiki"), extra]);
        assert_eq!(wiki("teifleet_job_rows", ("state", "total")), Some(40_000.0));
        assert_eq!(wiki("teifleet_job_rows", ("state", "done")), Some(10_000.0));
        assert_eq!(wiki("teifleet_job_rows", ("state", "failed")), Some(20.0));
        assert_eq!(wiki("teifleet_job_rows_per_second", ("job_name", "wiki")), Some(100.0));
        assert_eq!(wiki("teifleet_job_shards", ("state", "total")), Some(40.0));
        assert_eq!(wiki("teifleet_job_shards", ("state", "done")), Some(10.0));
        assert_eq!(wiki("teifleet_job_phase", ("phase", "Running")), Some(1.0));
        for phase in ["Pending", "Suspended", "Blocked", "Complete", "Failed"] {
            assert_eq!(wiki("teifleet_job_phase", ("phase", phase)), Some(0.0), "{phase}");
        }
        // A job not planned yet: no totals and no rate, which are unknown, not zero.
        let news = |name, extra: (&str, &str)| value(&metrics, name, &[("job_name", "news"), extra]);
        assert_eq!(news("teifleet_job_rows", ("state", "total")), None);
        assert_eq!(news("teifleet_job_rows", ("state", "done")), Some(0.0));
        assert_eq!(news("teifleet_job_shards", ("state", "total")), None);
        assert_eq!(news("teifleet_job_rows_per_second", ("namespace", "ml")), None);
        assert_eq!(news("teifleet_job_phase", ("phase", "Pending")), Some(1.0));

        // The job moves on: the phase moves with it, and a count that became unknown goes.
        let failed = EmbeddingJobStatus {
            conditions: job_status(("False", "WorkersFailed"), false, true).conditions,
            rows_total: None,
            rows_per_second: None,
            ..running
        };
        metrics.job_status("ml", "wiki", &failed);
        assert_eq!(wiki("teifleet_job_phase", ("phase", "Failed")), Some(1.0));
        assert_eq!(wiki("teifleet_job_phase", ("phase", "Running")), Some(0.0));
        assert_eq!(wiki("teifleet_job_rows", ("state", "total")), None);
        assert_eq!(wiki("teifleet_job_rows_per_second", ("job_name", "wiki")), None);
        assert_eq!(samples(&metrics, "teifleet_job_phase").len(), 12, "six phases each for two jobs");

        metrics.forget_job("ml", "wiki");
        metrics.forget_job("ml", "never-reconciled");
        for name in ["teifleet_job_rows", "teifleet_job_shards", "teifleet_job_phase"] {
            assert!(samples(&metrics, name).iter().all(|(labels, _)| labels.contains(&"news".to_owned())), "{name}");
        }
        assert_eq!(samples(&metrics, "teifleet_job_phase").len(), 6, "news stays");
        metrics.forget_job("ml", "news");
        for name in ["teifleet_job_rows", "teifleet_job_rows_per_second", "teifleet_job_shards", "teifleet_job_phase"] {
            assert!(samples(&metrics, name).is_empty(), "{name}: no stale series");
        }
    }

    #[test]
    fn a_jobs_phase_is_the_one_its_conditions_show() {
        let phase_of = |running, complete, failed| {
            let metrics = Metrics::new();
            metrics.job_status("ml", "wiki", &job_status(running, complete, failed));
            let shown: Vec<String> = metrics
                .registry
                .gather()
                .iter()
                .filter(|family| family.name() == "teifleet_job_phase")
                .flat_map(|family| family.get_metric().to_vec())
                .filter(|metric| metric.get_gauge().get_value() == 1.0)
                .flat_map(|metric| {
                    metric
                        .get_label()
                        .iter()
                        .filter(|l| l.name() == "phase")
                        .map(|l| l.value().to_owned())
                        .collect::<Vec<_>>()
                })
                .collect();
            assert_eq!(shown.len(), 1, "exactly one phase holds: {shown:?}");
            shown[0].clone()
        };
        assert_eq!(phase_of(("True", "WorkersPending"), false, false), "Pending");
        assert_eq!(phase_of(("True", "WorkersRunning"), false, false), "Running");
        assert_eq!(phase_of(("False", "Suspended"), false, false), "Suspended");
        for blocker in
            ["PoolNotFound", "PoolUsesTLS", "APIKeyRequired", "JobNameTaken", "InputUnreadable", "OutputUnwritable"]
        {
            assert_eq!(phase_of(("False", blocker), false, false), "Blocked", "{blocker}");
        }
        assert_eq!(phase_of(("False", "Completed"), true, false), "Complete");
        for failure in ["WorkersFailed", "DeadlineExceeded", "JobFailed"] {
            assert_eq!(phase_of(("False", failure), false, true), "Failed", "{failure}");
        }
        // A job the operator has not written a status for yet.
        let metrics = Metrics::new();
        metrics.job_status("ml", "new", &EmbeddingJobStatus::default());
        assert_eq!(value(&metrics, "teifleet_job_phase", &[("job_name", "new"), ("phase", "Pending")]), Some(1.0));
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
