//! The multiplexer's Prometheus metrics, per pool and priority (names in docs/metrics.md).

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::admission::{Admission, Limits, Priority, Snapshot};
use crate::status::Outcome;

/// Buckets from 0.5 ms to 30 s: TEI inference is milliseconds, queueing under overload seconds.
const BUCKETS: [f64; 16] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0];

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    requests: IntCounterVec,
    in_flight: IntGaugeVec,
    queued: IntGaugeVec,
    limit_in_flight: IntGaugeVec,
    limit_queued: IntGaugeVec,
    queue_wait: HistogramVec,
    tei_queue: HistogramVec,
    tei_inference: HistogramVec,
    total: HistogramVec,
}

fn histogram(name: &str, help: &str) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()), &["pool", "priority"])
        .expect("valid histogram")
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge")
}

impl Metrics {
    pub fn new() -> Self {
        let metrics = Self {
            registry: Registry::new(),
            requests: IntCounterVec::new(
                Opts::new("teifleet_requests_total", "Requests by pool, priority, RPC, gRPC code and outcome."),
                &["pool", "priority", "rpc", "code", "outcome"],
            )
            .expect("valid counter"),
            in_flight: gauge("teifleet_in_flight", "Requests holding a permit (in flight to TEI).", &["pool"]),
            queued: gauge("teifleet_queued", "Requests waiting for a permit.", &["pool", "priority"]),
            limit_in_flight: gauge("teifleet_limit_in_flight", "Current in-flight limit of this replica.", &["pool"]),
            limit_queued: gauge("teifleet_limit_queued", "Current queue limit of this replica.", &["pool"]),
            queue_wait: histogram("teifleet_queue_wait_seconds", "Time waiting for a permit in the multiplexer."),
            tei_queue: histogram(
                "teifleet_tei_queue_seconds",
                "Time in TEI's own queue, from TEI's response Metadata.",
            ),
            tei_inference: histogram("teifleet_tei_inference_seconds", "TEI inference time, from TEI's Metadata."),
            total: histogram("teifleet_request_duration_seconds", "Whole request time seen by the multiplexer."),
        };
        for collector in [
            Box::new(metrics.requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(metrics.in_flight.clone()),
            Box::new(metrics.queued.clone()),
            Box::new(metrics.limit_in_flight.clone()),
            Box::new(metrics.limit_queued.clone()),
            Box::new(metrics.queue_wait.clone()),
            Box::new(metrics.tei_queue.clone()),
            Box::new(metrics.tei_inference.clone()),
            Box::new(metrics.total.clone()),
        ] {
            metrics.registry.register(collector).expect("unique metric names");
        }
        metrics
    }

    /// An admission state whose every change is mirrored into this pool's gauges.
    pub fn admission_for(&self, pool: &str, limits: Limits) -> Admission {
        let (pool, metrics) = (pool.to_owned(), self.clone());
        Admission::with_observer(limits, move |snapshot: &Snapshot| {
            metrics.in_flight.with_label_values(&[&pool]).set(snapshot.in_flight as i64);
            metrics.limit_in_flight.with_label_values(&[&pool]).set(snapshot.limits.max_in_flight as i64);
            metrics.limit_queued.with_label_values(&[&pool]).set(snapshot.limits.max_queued as i64);
            for (priority, queued) in Priority::ALL.iter().zip(snapshot.queued) {
                metrics.queued.with_label_values(&[pool.as_str(), priority.as_str()]).set(queued as i64);
            }
        })
    }

    pub fn request_done(&self, pool: &str, priority: Priority, rpc: &str, code: tonic::Code, outcome: Outcome) {
        let code = format!("{code:?}");
        self.requests.with_label_values(&[pool, priority.as_str(), rpc, code.as_str(), outcome.as_str()]).inc();
    }

    pub fn timings(&self, pool: &str, priority: Priority, timings: &Timings) {
        let labels = [pool, priority.as_str()];
        if let Some(wait) = timings.queue_wait {
            self.queue_wait.with_label_values(&labels).observe(wait.as_secs_f64());
        }
        if let Some(tei) = timings.tei_queue {
            self.tei_queue.with_label_values(&labels).observe(tei.as_secs_f64());
        }
        if let Some(tei) = timings.tei_inference {
            self.tei_inference.with_label_values(&labels).observe(tei.as_secs_f64());
        }
        self.total.with_label_values(&labels).observe(timings.total.as_secs_f64());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Where one request's time went.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub queue_wait: Option<Duration>,
    pub tei_queue: Option<Duration>,
    pub tei_inference: Option<Duration>,
    pub total: Duration,
}
