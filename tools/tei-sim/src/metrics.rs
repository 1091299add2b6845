//! TEI-named Prometheus metrics, in a registry of their own so several simulators can share a
//! test process without colliding in the global one.

use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use teifleet_runtime::metrics::register;

use crate::SimError;

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
    pub(crate) fn new() -> Result<Self, SimError> {
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
