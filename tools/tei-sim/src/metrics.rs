//! TEI-named Prometheus metrics, in a registry of their own so several simulators can share a
//! test process without colliding in the global one; and two of the simulator's own
//! (`te_sim_*`), read from its counters at each scrape, for tests that can reach a simulator only
//! through its metrics (in a pod, behind the sidecar's `/upstream/metrics`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use teifleet_runtime::metrics::register;

use crate::SimError;
use crate::stats::Counters;

#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) request_count: IntCounter,
    pub(crate) request_success: IntCounter,
    request_failure: IntCounterVec,
    pub(crate) queue_size: IntGauge,
    pub(crate) batch_next_size: IntGauge,
    pub(crate) batch_next_tokens: IntGauge,
    tokenization_duration: Histogram,
    queue_duration: Histogram,
    inference_duration: Histogram,
    request_duration: Histogram,
    pub(crate) input_length: Histogram,
}

/// Why a request failed, as the `err` label of `te_request_failure`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureKind {
    Overloaded,
    Unhealthy,
    Validation,
    Backend,
}

impl FailureKind {
    fn label(self) -> &'static str {
        match self {
            Self::Overloaded => "overloaded",
            Self::Unhealthy => "unhealthy",
            Self::Validation => "validation",
            Self::Backend => "backend",
        }
    }

    pub(crate) fn of(code: tonic::Code) -> Self {
        match code {
            tonic::Code::ResourceExhausted => Self::Overloaded,
            tonic::Code::Unavailable => Self::Unhealthy,
            tonic::Code::InvalidArgument => Self::Validation,
            _ => Self::Backend,
        }
    }
}

fn duration_buckets() -> Vec<f64> {
    // From 100µs to about 52s, doubling: covers a fast GPU batch and a long stall.
    prometheus::exponential_buckets(0.0001, 2.0, 20).unwrap_or_default()
}

impl Metrics {
    /// The TEI-named metrics, and the simulator's own read from `counters` at each scrape.
    pub(crate) fn new(counters: Arc<Counters>) -> Result<Self, SimError> {
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        };
        let request_failure =
            IntCounterVec::new(Opts::new("te_request_failure", "Inference requests that failed"), &["err"])?;
        // Created up front so every label shows (at zero) before the first failure.
        for kind in [FailureKind::Overloaded, FailureKind::Unhealthy, FailureKind::Validation, FailureKind::Backend] {
            request_failure.with_label_values(&[kind.label()]);
        }
        let length_buckets = prometheus::exponential_buckets(2.0, 2.0, 14).unwrap_or_default();
        let metrics = Self {
            registry: Registry::new(),
            request_count: IntCounter::new("te_request_count", "Inference requests received")?,
            request_success: IntCounter::new("te_request_success", "Inference requests answered successfully")?,
            request_failure,
            queue_size: IntGauge::new("te_queue_size", "Requests waiting for the device")?,
            batch_next_size: IntGauge::new("te_batch_next_size", "Requests in the next batch")?,
            batch_next_tokens: IntGauge::new("te_batch_next_tokens", "Tokens in the next batch")?,
            tokenization_duration: histogram(
                "te_request_tokenization_duration",
                "Tokenization time in seconds",
                duration_buckets(),
            )?,
            queue_duration: histogram("te_request_queue_duration", "Queue time in seconds", duration_buckets())?,
            inference_duration: histogram(
                "te_request_inference_duration",
                "Device time of the request's batch in seconds",
                duration_buckets(),
            )?,
            request_duration: histogram("te_request_duration", "Total request time in seconds", duration_buckets())?,
            input_length: histogram("te_request_input_length", "Input length in tokens", length_buckets)?,
        };
        register(
            &metrics.registry,
            &[
                &metrics.request_count,
                &metrics.request_success,
                &metrics.request_failure,
                &metrics.queue_size,
                &metrics.batch_next_size,
                &metrics.batch_next_tokens,
                &metrics.tokenization_duration,
                &metrics.queue_duration,
                &metrics.inference_duration,
                &metrics.request_duration,
                &metrics.input_length,
            ],
        )?;
        metrics.registry.register(Box::new(SimCounters::new(counters)?))?;
        Ok(metrics)
    }

    pub(crate) fn failure(&self, kind: FailureKind) {
        self.request_failure.with_label_values(&[kind.label()]).inc();
    }

    pub(crate) fn observe_timings(
        &self,
        tokenization: Duration,
        queue: Duration,
        inference: Duration,
        total: Duration,
    ) {
        self.tokenization_duration.observe(tokenization.as_secs_f64());
        self.queue_duration.observe(queue.as_secs_f64());
        self.inference_duration.observe(inference.as_secs_f64());
        self.request_duration.observe(total.as_secs_f64());
    }

    /// Where every metric is registered, for `/metrics`.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// The simulator's own counters as metrics, read at each scrape (like `/stats`, and reset with
/// it): `te_sim_device_busy_seconds_total`, the time the device spent running batches, and
/// `te_sim_max_in_flight`, the most requests that held a slot at once.
#[derive(Clone, Debug)]
struct SimCounters {
    counters: Arc<Counters>,
    device_busy: Counter,
    max_in_flight: IntGauge,
    /// One scrape at a time sets the values it reports.
    scrape: Arc<Mutex<()>>,
}

impl SimCounters {
    fn new(counters: Arc<Counters>) -> Result<Self, SimError> {
        Ok(Self {
            counters,
            device_busy: Counter::new(
                "te_sim_device_busy_seconds_total",
                "Time the simulated device spent running batches, since start or the last stats reset",
            )?,
            max_in_flight: IntGauge::new(
                "te_sim_max_in_flight",
                "The most requests holding a slot at once, since start or the last stats reset",
            )?,
            scrape: Arc::default(),
        })
    }
}

impl Collector for SimCounters {
    fn desc(&self) -> Vec<&Desc> {
        self.device_busy.desc().into_iter().chain(self.max_in_flight.desc()).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let stats = self.counters.snapshot();
        self.device_busy.reset();
        self.device_busy.inc_by(Duration::from_micros(stats.device_busy_us).as_secs_f64());
        self.max_in_flight.set(i64::try_from(stats.max_in_flight_observed).unwrap_or(i64::MAX));
        let mut families = self.device_busy.collect();
        families.extend(self.max_in_flight.collect());
        families
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn scrape(metrics: &Metrics) -> String {
        teifleet_runtime::metrics::render(metrics.registry()).unwrap()
    }

    #[test]
    fn device_busy_time_and_the_high_water_mark_follow_the_counters() {
        let counters = Arc::new(Counters::default());
        let metrics = Metrics::new(Arc::clone(&counters)).unwrap();
        let text = scrape(&metrics);
        assert!(text.contains("# TYPE te_sim_device_busy_seconds_total counter"), "{text}");
        assert!(text.contains("te_sim_device_busy_seconds_total 0\n"), "{text}");
        assert!(text.contains("te_sim_max_in_flight 0\n"), "{text}");

        counters.batch_run(Duration::from_millis(1500));
        counters.batch_run(Duration::from_millis(250));
        for _ in 0..3 {
            counters.admitted();
        }
        counters.released();
        counters.released();
        let text = scrape(&metrics);
        assert!(text.contains("te_sim_device_busy_seconds_total 1.75\n"), "{text}");
        assert!(text.contains("te_sim_max_in_flight 3\n"), "{text}");
        // Scrapes report, they do not add up.
        assert!(scrape(&metrics).contains("te_sim_device_busy_seconds_total 1.75\n"));

        // A stats reset zeroes the busy time; the high-water mark restarts from what is in flight.
        counters.reset();
        let text = scrape(&metrics);
        assert!(text.contains("te_sim_device_busy_seconds_total 0\n"), "{text}");
        assert!(text.contains("te_sim_max_in_flight 1\n"), "{text}");
    }
}
