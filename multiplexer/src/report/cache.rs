//! The embedding cache's series (`crate::cache`; names in docs/metrics.md): what each input found,
//! what each tier holds and keeps, and how the shared store answers.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use teifleet_runtime::metrics::SharedCollector;

/// Store round trips: tenths of a millisecond (a store beside the pod) to its timeout and beyond.
const STORE_BUCKETS: [f64; 10] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0];

pub struct CacheFamilies {
    inputs: IntCounterVec,
    local_bytes: IntGaugeVec,
    local_entries: IntGaugeVec,
    evictions: IntCounterVec,
    stored: IntCounterVec,
    store_errors: IntCounterVec,
    store_seconds: HistogramVec,
    store_up: IntGaugeVec,
    /// Per pool and tenant label, the input series, looked up by their labels once.
    resolved: Mutex<HashMap<(String, String), InputSeries>>,
}

/// What each input of a call found: one counter per result.
#[derive(Clone)]
pub struct InputSeries {
    pub hit_local: IntCounter,
    pub hit_store: IntCounter,
    pub miss: IntCounter,
    pub bypass: IntCounter,
}

/// The local tier's series for one pool.
#[derive(Clone)]
pub struct LocalSeries {
    pub bytes: IntGauge,
    pub entries: IntGauge,
    pub evictions: IntCounter,
    pub stored: IntCounter,
    pub not_kept: IntCounter,
}

/// The shared store's series for one pool.
#[derive(Clone)]
pub struct StoreSeries {
    pub get_seconds: Histogram,
    pub set_seconds: Histogram,
    pub get_timeouts: IntCounter,
    pub get_errors: IntCounter,
    pub get_skipped: IntCounter,
    /// Entries whose seal did not verify (`crate::cache::seal`): someone else wrote them.
    pub get_forged: IntCounter,
    pub set_timeouts: IntCounter,
    pub set_errors: IntCounter,
    pub set_skipped: IntCounter,
    pub stored: IntCounter,
    pub up: IntGauge,
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter")
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge")
}

impl CacheFamilies {
    pub fn new() -> Self {
        Self {
            inputs: counter(
                "teifleet_cache_inputs_total",
                "Inputs of cached calls (Embed, EmbedSparse, from every front) by what they found: hit_local, \
                 hit_store, miss (sent to TEI), bypass (the cache could not be used: TEI's model not known yet).",
                &["pool", "tenant", "result"],
            ),
            local_bytes: gauge(
                "teifleet_cache_local_bytes",
                "Bytes the local tier holds (answers and per-entry overhead); never above its size.",
                &["pool"],
            ),
            local_entries: gauge("teifleet_cache_local_entries", "Entries in the local tier.", &["pool"]),
            evictions: counter(
                "teifleet_cache_evictions_total",
                "Entries the local tier let go for room or age.",
                &["pool"],
            ),
            stored: counter(
                "teifleet_cache_stored_total",
                "Answers kept, by tier (local, store); local counts answers not kept as tier=local_skipped.",
                &["pool", "tier"],
            ),
            store_errors: counter(
                "teifleet_cache_store_errors_total",
                "Shared-store reads and writes that failed (error), took longer than the timeout (timeout), were \
                 not tried while the store rests after a failure (skipped), or entries read whose seal did not \
                 verify (forged: written by someone without the pool's peer key).",
                &["pool", "op", "reason"],
            ),
            store_seconds: HistogramVec::new(
                HistogramOpts::new("teifleet_cache_store_seconds", "Shared-store round trips, by op (get, set).")
                    .buckets(STORE_BUCKETS.to_vec()),
                &["pool", "op"],
            )
            .expect("valid histogram"),
            store_up: gauge(
                "teifleet_cache_store_up",
                "1 while the shared store answers, 0 while it rests after a failure.",
                &["pool"],
            ),
            resolved: Mutex::default(),
        }
    }

    pub fn collectors(&self) -> [&dyn SharedCollector; 8] {
        [
            &self.inputs,
            &self.local_bytes,
            &self.local_entries,
            &self.evictions,
            &self.stored,
            &self.store_errors,
            &self.store_seconds,
            &self.store_up,
        ]
    }

    /// The input series of `pool`'s calls by `tenant` (a name the pool configures, or "").
    pub fn inputs(&self, pool: &str, tenant: &str) -> InputSeries {
        let mut resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        resolved
            .entry((pool.to_owned(), tenant.to_owned()))
            .or_insert_with(|| {
                let of = |result| self.inputs.with_label_values(&[pool, tenant, result]);
                InputSeries {
                    hit_local: of("hit_local"),
                    hit_store: of("hit_store"),
                    miss: of("miss"),
                    bypass: of("bypass"),
                }
            })
            .clone()
    }

    pub fn local(&self, pool: &str) -> LocalSeries {
        LocalSeries {
            bytes: self.local_bytes.with_label_values(&[pool]),
            entries: self.local_entries.with_label_values(&[pool]),
            evictions: self.evictions.with_label_values(&[pool]),
            stored: self.stored.with_label_values(&[pool, "local"]),
            not_kept: self.stored.with_label_values(&[pool, "local_skipped"]),
        }
    }

    pub fn store(&self, pool: &str) -> StoreSeries {
        let errors = |op, reason| self.store_errors.with_label_values(&[pool, op, reason]);
        StoreSeries {
            get_seconds: self.store_seconds.with_label_values(&[pool, "get"]),
            set_seconds: self.store_seconds.with_label_values(&[pool, "set"]),
            get_timeouts: errors("get", "timeout"),
            get_errors: errors("get", "error"),
            get_skipped: errors("get", "skipped"),
            get_forged: errors("get", "forged"),
            set_timeouts: errors("set", "timeout"),
            set_errors: errors("set", "error"),
            set_skipped: errors("set", "skipped"),
            stored: self.stored.with_label_values(&[pool, "store"]),
            up: self.store_up.with_label_values(&[pool]),
        }
    }
}

impl Default for CacheFamilies {
    fn default() -> Self {
        Self::new()
    }
}
