//! The multiplexer's Prometheus metrics, per pool and priority (names in docs/metrics.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use tonic::Code;

use crate::admission::memory::{MemoryBudget, Use};
use crate::admission::{
    Admission, DEFAULT_TENANT, IngestWhy, LANE_OUTCOMES, Lane, LaneObserver, Limits, Priority, Snapshot,
};
use crate::report::rates::{self, RecentRates};
use crate::vocab::Outcome;
use crate::vocab::Protocol;

/// Buckets from 0.5 ms to 30 s: TEI inference is milliseconds, queueing under overload seconds.
const BUCKETS: [f64; 16] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0];

/// Cheap to clone (one reference count): every request's tracker holds one.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    families: Arc<Families>,
    /// The last minute's refusals and spills per pool, for the report the operator reads.
    recent: Arc<RecentRates>,
    /// Per pool, the series each kind of call ends in.
    call_series: Arc<Mutex<HashMap<String, HashMap<CallKind, CallSeries>>>>,
    /// The embedding cache's families (`crate::cache`).
    cache: Arc<crate::report::cache::CacheFamilies>,
}

/// A call's priority, front and RPC label: with its pool, what its series are labelled by.
type CallKind = (Priority, Protocol, &'static str);

/// The series a call of one pool, priority, front and RPC ends in, looked up by their labels
/// once: a label lookup hashes every label value, and every call ended in five of them.
struct CallSeries {
    /// `teifleet_requests_total` with code OK and outcome ok.
    succeeded: IntCounter,
    /// `teifleet_tenant_requests_total` of the default tenant, outcome ok: most calls name no
    /// tenant, and each would otherwise hash three label values to find it.
    default_tenant_succeeded: IntCounter,
    queue_wait: Histogram,
    tei_queue: Histogram,
    tei_inference: Histogram,
    total: Histogram,
}

impl CallSeries {
    fn new(families: &Families, pool: &str, (priority, protocol, rpc): CallKind) -> Self {
        let ok = [pool, priority.as_str(), protocol.as_str(), rpc, code_label(Code::Ok), Outcome::Ok.as_str()];
        let labels = [pool, priority.as_str()];
        Self {
            succeeded: families.requests.with_label_values(&ok),
            default_tenant_succeeded: families.tenant_requests.with_label_values(&[
                pool,
                DEFAULT_TENANT,
                Outcome::Ok.as_str(),
            ]),
            queue_wait: families.queue_wait.with_label_values(&labels),
            tei_queue: families.tei_queue.with_label_values(&labels),
            tei_inference: families.tei_inference.with_label_values(&labels),
            total: families.total.with_label_values(&[pool, priority.as_str(), protocol.as_str()]),
        }
    }
}

struct Families {
    requests: IntCounterVec,
    coalesced: IntCounterVec,
    in_flight: IntGaugeVec,
    queued: IntGaugeVec,
    lane_admissions: IntCounterVec,
    ingest_let_in: IntCounterVec,
    limit_in_flight: IntGaugeVec,
    limit_in_flight_share: IntGaugeVec,
    limit_queued: IntGaugeVec,
    limit_device_time: IntGaugeVec,
    in_flight_tokens: IntGaugeVec,
    limit_in_flight_tokens: IntGaugeVec,
    chars_per_token: GaugeVec,
    batch_fixed: GaugeVec,
    batch_per_input: GaugeVec,
    ingest_places: IntGaugeVec,
    standing_queue: IntGaugeVec,
    limit_changes: IntCounterVec,
    tenant_requests: IntCounterVec,
    queue_wait: HistogramVec,
    tei_queue: HistogramVec,
    tei_inference: HistogramVec,
    total: HistogramVec,
    refused_input: IntCounterVec,
    spills: IntCounterVec,
    spilled_in: IntCounterVec,
    held_at_door: IntGauge,
    memory_budget: IntGauge,
    memory_charged: IntGaugeVec,
}

fn histogram(name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()), labels).expect("valid histogram")
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge")
}

impl Metrics {
    pub fn new() -> Self {
        let families = Families {
            requests: IntCounterVec::new(
                Opts::new(
                    "teifleet_requests_total",
                    "Requests by pool, priority, protocol (grpc or http), RPC, gRPC code and outcome.",
                ),
                &["pool", "priority", "protocol", "rpc", "code", "outcome"],
            )
            .expect("valid counter"),
            coalesced: IntCounterVec::new(
                Opts::new(
                    "teifleet_coalesced_total",
                    "Calls answered by joining an identical call already in flight (no TEI call of their own).",
                ),
                &["pool", "rpc"],
            )
            .expect("valid counter"),
            in_flight: gauge("teifleet_in_flight", "Requests holding a permit (in flight to TEI).", &["pool"]),
            queued: gauge(
                "teifleet_queued",
                "Inputs waiting for a permit, by priority and lane.",
                &["pool", "priority", "lane"],
            ),
            lane_admissions: IntCounterVec::new(
                Opts::new(
                    "teifleet_lane_admissions_total",
                    "Admission decisions by lane (query or ingest) and outcome: admitted, or why not \
                     (shed_queue_full, shed_deadline, shed_queue_timeout, queue_timeout, expired_in_queue, \
                     evicted, cancelled). A stream message or an HTTP chunk is one decision.",
                ),
                &["pool", "lane", "outcome"],
            )
            .expect("valid counter"),
            ingest_let_in: IntCounterVec::new(
                Opts::new(
                    "teifleet_ingest_let_in_total",
                    "Ingest calls let in flight, by the rule that let them: no_queries, idle_tei, stale_count, \
                     empty_next_batch, places (within what the query reserve leaves), floor_turn (ingestShare).",
                ),
                &["pool", "reason"],
            )
            .expect("valid counter"),
            limit_in_flight: gauge(
                "teifleet_limit_in_flight",
                "In-flight limit in force on this replica, in inputs (the adaptive limit when on; TEI's next batch kept ready included).",
                &["pool"],
            ),
            limit_in_flight_share: gauge(
                "teifleet_limit_in_flight_share",
                "This replica's share of the pool's maxInFlight, in inputs (the adaptive limit's ceiling).",
                &["pool"],
            ),
            limit_queued: gauge("teifleet_limit_queued", "Queue limit of this replica, in inputs.", &["pool"]),
            limit_device_time: gauge(
                "teifleet_limit_device_time_percent",
                "The most of the time this replica keeps TEI busy while calls queue, in force (deviceTimeCap, or the GPU share while a neighbour is busy; 100: no cap).",
                &["pool"],
            ),
            in_flight_tokens: gauge("teifleet_in_flight_tokens", "Estimated tokens in flight to TEI.", &["pool"]),
            limit_in_flight_tokens: gauge(
                "teifleet_limit_in_flight_tokens",
                "Token budget of this replica (absent without maxInFlightTokens).",
                &["pool"],
            ),
            chars_per_token: GaugeVec::new(
                Opts::new("teifleet_chars_per_token", "Characters per token learned from TEI's answers."),
                &["pool"],
            )
            .expect("valid gauge"),
            batch_fixed: GaugeVec::new(
                Opts::new(
                    "teifleet_tei_batch_fixed_seconds",
                    "TEI's batch time learned from its answers, as fixed + per input x inputs: the fixed part \
                     (absent until batches of sizes far enough apart came back).",
                ),
                &["pool"],
            )
            .expect("valid gauge"),
            batch_per_input: GaugeVec::new(
                Opts::new(
                    "teifleet_tei_batch_per_input_seconds",
                    "TEI's learned batch time: what each input adds (see teifleet_tei_batch_fixed_seconds).",
                ),
                &["pool"],
            )
            .expect("valid gauge"),
            ingest_places: gauge(
                "teifleet_ingest_places",
                "Inputs of TEI's next batch ingest may fill while queries come, at the queries' rate now \
                 (queryReserve's share, or what the learned batch time leaves).",
                &["pool"],
            ),
            standing_queue: gauge(
                "teifleet_queue_standing",
                "1 while the queries' queue stands (waits above target for a whole interval), 0 otherwise; \
                 a signal only, nothing is refused for it.",
                &["pool"],
            ),
            limit_changes: IntCounterVec::new(
                Opts::new(
                    "teifleet_limit_changes_total",
                    "Moves of the adaptive in-flight limit, by direction and reason.",
                ),
                &["pool", "direction", "reason"],
            )
            .expect("valid counter"),
            tenant_requests: IntCounterVec::new(
                Opts::new(
                    "teifleet_tenant_requests_total",
                    "Calls by tenant and outcome; tenants the spec lists by name, the rest as `other`.",
                ),
                &["pool", "tenant", "outcome"],
            )
            .expect("valid counter"),
            queue_wait: histogram(
                "teifleet_queue_wait_seconds",
                "Time waiting for a permit in the multiplexer.",
                &["pool", "priority"],
            ),
            tei_queue: histogram(
                "teifleet_tei_queue_seconds",
                "Time in TEI's own queue, from TEI's response Metadata.",
                &["pool", "priority"],
            ),
            tei_inference: histogram(
                "teifleet_tei_inference_seconds",
                "TEI inference time, from TEI's Metadata.",
                &["pool", "priority"],
            ),
            total: histogram(
                "teifleet_request_duration_seconds",
                "Whole request time seen by the multiplexer, by protocol (an HTTP request's includes its JSON).",
                &["pool", "priority", "protocol"],
            ),
            refused_input: teifleet_runtime::metrics::refused_input(),
            spills: IntCounterVec::new(
                Opts::new(
                    "teifleet_spills_total",
                    "Calls handed to a sibling replica of the pool with room, by result: served there, \
                     refused (no room after all) or unreachable; the last two were served here.",
                ),
                &["pool", "result"],
            )
            .expect("valid counter"),
            spilled_in: IntCounterVec::new(
                Opts::new(
                    "teifleet_spilled_in_total",
                    "Calls sibling replicas spilled here, by outcome (not in teifleet_requests_total: \
                     the replica that took the call from its client counts it).",
                ),
                &["pool", "outcome"],
            )
            .expect("valid counter"),
            held_at_door: IntGauge::new(
                "teifleet_held_at_door",
                "gRPC calls waiting at their connection's door: the connection has its share of the \
                 budget outstanding (crate docs: `door`).",
            )
            .expect("valid gauge"),
            memory_budget: IntGauge::new(
                "teifleet_memory_budget_bytes",
                "Bytes requests may hold in this process before or outside admission (a fraction of \
                 its memory limit); a request that finds no room is refused at once.",
            )
            .expect("valid gauge"),
            memory_charged: gauge(
                "teifleet_memory_charged_bytes",
                "Bytes charged to the memory budget now, by use: request_bodies, door, answers, cache (the embedding cache's local tier).",
                &["use"],
            ),
        };
        let registry = Registry::new();
        let f = &families;
        teifleet_runtime::metrics::register(
            &registry,
            &[
                &f.requests,
                &f.coalesced,
                &f.in_flight,
                &f.queued,
                &f.lane_admissions,
                &f.ingest_let_in,
                &f.limit_in_flight,
                &f.limit_in_flight_share,
                &f.limit_queued,
                &f.limit_device_time,
                &f.in_flight_tokens,
                &f.limit_in_flight_tokens,
                &f.chars_per_token,
                &f.batch_fixed,
                &f.batch_per_input,
                &f.ingest_places,
                &f.standing_queue,
                &f.limit_changes,
                &f.tenant_requests,
                &f.queue_wait,
                &f.tei_queue,
                &f.tei_inference,
                &f.total,
                &f.refused_input,
                &f.spills,
                &f.spilled_in,
                &f.held_at_door,
                &f.memory_budget,
                &f.memory_charged,
            ],
        )
        .expect("unique metric names");
        let cache = Arc::new(crate::report::cache::CacheFamilies::new());
        teifleet_runtime::metrics::register(&registry, &cache.collectors()).expect("unique metric names");
        Self {
            registry,
            families: Arc::new(families),
            recent: Arc::new(RecentRates::new()),
            call_series: Arc::default(),
            cache,
        }
    }

    /// An admission state whose every change is mirrored into this pool's gauges. The gauges are
    /// resolved once here: the observer runs under the pool's lock on every acquire and release.
    pub fn admission_for(&self, pool: &str, limits: Limits) -> Admission {
        let f = &self.families;
        let in_flight = f.in_flight.with_label_values(&[pool]);
        let limit_in_flight = f.limit_in_flight.with_label_values(&[pool]);
        let share = f.limit_in_flight_share.with_label_values(&[pool]);
        let limit_queued = f.limit_queued.with_label_values(&[pool]);
        let limit_device_time = f.limit_device_time.with_label_values(&[pool]);
        let tokens = f.in_flight_tokens.with_label_values(&[pool]);
        let (token_budget, token_family) =
            (f.limit_in_flight_tokens.with_label_values(&[pool]), f.limit_in_flight_tokens.clone());
        let chars_per_token = f.chars_per_token.with_label_values(&[pool]);
        let standing = f.standing_queue.with_label_values(&[pool]);
        let ingest_places = f.ingest_places.with_label_values(&[pool]);
        // The line's series appear once it is learned (it is never forgotten).
        let (batch_fixed, batch_per_input) = (f.batch_fixed.clone(), f.batch_per_input.clone());
        let batch_line = OnceLock::new();
        let (changes, pool_name) = (f.limit_changes.clone(), pool.to_owned());
        // The series exists from `with_label_values` above until the first snapshot says otherwise.
        let token_budget_shown = AtomicBool::new(true);
        let lanes = LaneSeries {
            queued: Lane::ALL.map(|lane| {
                Priority::ALL.map(|priority| f.queued.with_label_values(&[pool, priority.as_str(), lane.as_str()]))
            }),
            decided: Lane::ALL.map(|lane| {
                LANE_OUTCOMES.map(|outcome| f.lane_admissions.with_label_values(&[pool, lane.as_str(), outcome]))
            }),
            ingest_let_in: IngestWhy::ALL.map(|why| f.ingest_let_in.with_label_values(&[pool, why.as_str()])),
        };
        let observer = move |snapshot: &Snapshot| {
            in_flight.set(snapshot.in_flight as i64);
            limit_in_flight.set(snapshot.effective_limit as i64);
            share.set(snapshot.limits.max_in_flight as i64);
            limit_queued.set(snapshot.limits.max_queued as i64);
            limit_device_time.set(i64::from(snapshot.device_time_cap.unwrap_or(100)));
            tokens.set(i64::try_from(snapshot.in_flight_tokens).unwrap_or(i64::MAX));
            // Shown only while the pool has a token budget; removing the series is a hash and a
            // lock, so it happens once, when the budget goes away, not on every change.
            match snapshot.limits.max_in_flight_tokens {
                Some(budget) => {
                    token_budget.set(i64::try_from(budget).unwrap_or(i64::MAX));
                    token_budget_shown.store(true, Ordering::Relaxed);
                }
                None if token_budget_shown.swap(false, Ordering::Relaxed) => {
                    drop(token_family.remove_label_values(&[&pool_name]));
                }
                None => {}
            }
            chars_per_token.set(snapshot.chars_per_token);
            standing.set(i64::from(snapshot.standing_queue));
            ingest_places.set(i64::try_from(snapshot.ingest_places).unwrap_or(i64::MAX));
            if let Some(line) = snapshot.batch_line {
                let (fixed, per_input) = batch_line.get_or_init(|| {
                    (batch_fixed.with_label_values(&[&pool_name]), batch_per_input.with_label_values(&[&pool_name]))
                });
                fixed.set(line.fixed);
                per_input.set(line.per_input);
            }
            if let Some(change) = snapshot.change {
                let direction = if change.to > change.from { "up" } else { "down" };
                changes.with_label_values(&[&pool_name, direction, change.reason.as_str()]).inc();
            }
        };
        Admission::with_observers(limits, observer, lanes)
    }

    /// Counts a call handed to a sibling replica, by how that went (every hand-off counts in the
    /// last minute's spill rate: a refused one was still demand this replica could not take).
    pub fn spilled(&self, pool: &str, result: &'static str) {
        self.families.spills.with_label_values(&[pool, result]).inc();
        self.recent.record_spilled(pool);
    }

    /// Counts a call a sibling replica spilled here, once it ended.
    pub fn spilled_in(&self, pool: &str, outcome: Outcome) {
        self.families.spilled_in.with_label_values(&[pool, outcome.as_str()]).inc();
    }

    pub fn request_done(
        &self,
        pool: &str,
        priority: Priority,
        protocol: Protocol,
        rpc: &str,
        code: Code,
        outcome: Outcome,
    ) {
        let labels = [pool, priority.as_str(), protocol.as_str(), rpc, code_label(code), outcome.as_str()];
        self.families.requests.with_label_values(&labels).inc();
        if rates::refused_for_capacity(outcome) {
            self.recent.record_refused(pool);
        }
    }

    /// Calls of `pool` refused for capacity and spilled, per second over the last minute.
    pub fn recent_rates(&self, pool: &str) -> (f64, f64) {
        self.recent.per_second(pool)
    }

    pub fn tenant_done(&self, pool: &str, tenant: &str, outcome: Outcome) {
        self.families.tenant_requests.with_label_values(&[pool, tenant, outcome.as_str()]).inc();
    }

    /// Counts a client or request one of this process's ports turned away at a bound on input.
    pub fn refused_input(&self, port: &'static str, reason: &'static str) {
        self.families.refused_input.with_label_values(&[port, reason]).inc();
    }

    /// The same, as a callback for a server that knows only its reasons.
    pub fn refusal_counter(&self, port: &'static str) -> impl Fn(&'static str) + Send + Sync + 'static {
        let counter = self.families.refused_input.clone();
        move |reason| counter.with_label_values(&[port, reason]).inc()
    }

    /// A call began (`1`) or stopped (`-1`) waiting at its connection's door.
    /// The gauge of calls held at the pools' doors, for each pool's door to move.
    pub fn held_at_door(&self) -> IntGauge {
        self.families.held_at_door.clone()
    }

    /// The process's memory budget of `bytes`, its use shown in `teifleet_memory_charged_bytes`.
    pub fn memory_budget(&self, bytes: u64) -> Arc<MemoryBudget> {
        let f = &self.families;
        f.memory_budget.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        let gauges = Use::ALL.map(|what| f.memory_charged.with_label_values(&[what.as_str()]));
        MemoryBudget::new(bytes, Some(gauges))
    }

    /// The embedding cache's series.
    pub fn cache(&self) -> &crate::report::cache::CacheFamilies {
        &self.cache
    }

    pub fn coalesced(&self, pool: &str, rpc: &str) {
        self.families.coalesced.with_label_values(&[pool, rpc]).inc();
    }

    /// A call of `pool` ended: its outcome, its tenant's and its time split.
    pub fn call_done(
        &self,
        pool: &str,
        (priority, protocol, rpc): CallKind,
        code: Code,
        outcome: Outcome,
        tenant: &str,
        timings: &Timings,
    ) {
        let succeeded = outcome == Outcome::Ok && code == Code::Ok;
        let default_tenant = tenant == DEFAULT_TENANT;
        if !(default_tenant && outcome == Outcome::Ok) {
            self.tenant_done(pool, tenant, outcome);
        }
        if !succeeded {
            self.request_done(pool, priority, protocol, rpc, code, outcome);
        }
        let mut series = self.call_series.lock().unwrap_or_else(PoisonError::into_inner);
        let pool_series = match series.get_mut(pool) {
            Some(pool_series) => pool_series,
            None => series.entry(pool.to_owned()).or_default(),
        };
        let kind = (priority, protocol, rpc);
        let series = pool_series.entry(kind).or_insert_with(|| CallSeries::new(&self.families, pool, kind));
        if succeeded {
            series.succeeded.inc();
        }
        if default_tenant && outcome == Outcome::Ok {
            series.default_tenant_succeeded.inc();
        }
        if let Some(wait) = timings.queue_wait {
            series.queue_wait.observe(wait.as_secs_f64());
        }
        if let Some(tei) = timings.tei_queue {
            series.tei_queue.observe(tei.as_secs_f64());
        }
        if let Some(tei) = timings.tei_inference {
            series.tei_inference.observe(tei.as_secs_f64());
        }
        series.total.observe(timings.total.as_secs_f64());
    }
}

/// One pool's per-lane series, resolved once: the observer runs under the pool's lock.
struct LaneSeries {
    /// By lane, then priority.
    queued: [[IntGauge; 3]; 2],
    /// By lane, then outcome in `LANE_OUTCOMES` order.
    decided: [[IntCounter; LANE_OUTCOMES.len()]; 2],
    /// In `IngestWhy::ALL` order.
    ingest_let_in: [IntCounter; IngestWhy::ALL.len()],
}

impl LaneObserver for LaneSeries {
    fn queued(&self, lane: Lane, queued: [usize; 3]) {
        for (gauge, waiting) in self.queued[lane.index()].iter().zip(queued) {
            gauge.set(waiting as i64);
        }
    }

    fn decided(&self, lane: Lane, outcome: &'static str) {
        if let Some(at) = LANE_OUTCOMES.iter().position(|known| *known == outcome) {
            self.decided[lane.index()][at].inc();
        }
    }

    fn ingest_let_in(&self, why: IngestWhy) {
        if let Some(at) = IngestWhy::ALL.iter().position(|known| *known == why) {
            self.ingest_let_in[at].inc();
        }
    }
}

/// The `code` label: the gRPC code's name, as `tonic::Code`'s Debug spells it, without allocating.
pub(crate) fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "Ok",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{Ask, Cost, Observation};

    fn value(metrics: &Metrics, name: &str) -> Option<f64> {
        let text = prometheus::TextEncoder::new().encode_to_string(&metrics.registry.gather()).unwrap();
        text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// TEI answering batches of 2 in 50 ms and of 6 in 70 ms (40 ms + 5 ms an input), each batch
    /// let in while the one before runs, as TEI keeps its next batch ready: the line the pool
    /// learns from them, and the places it leaves ingest, are on its metrics. (A batch much
    /// shorter than the mean batch time would be taken for the last calls of the one before.)
    #[tokio::test(start_paused = true)]
    async fn the_learned_batch_time_and_ingests_places_are_shown() {
        let metrics = Metrics::new();
        let admission = metrics.admission_for("p", Limits::new(16, 64, Duration::from_secs(1)));
        let (fixed, per_input) =
            ("teifleet_tei_batch_fixed_seconds{pool=\"p\"}", "teifleet_tei_batch_per_input_seconds{pool=\"p\"}");
        assert_eq!(value(&metrics, fixed), None, "no series before the line is learned");
        assert_eq!(
            value(&metrics, "teifleet_ingest_places{pool=\"p\"}"),
            Some(4.0),
            "half TEI's batch of 8 until then"
        );

        let time = |size: usize| Duration::from_millis(40 + 5 * size as u64);
        let let_in = |size: usize| -> Vec<_> {
            (0..size).map(|_| admission.try_acquire(&Ask::new(Priority::Standard)).unwrap()).collect()
        };
        let mut running = (2, let_in(2));
        for size in [2, 6].repeat(12) {
            let next = (size, let_in(size));
            tokio::time::advance(time(running.0)).await;
            for permit in running.1 {
                permit.observe(Observation { tei_inference: time(running.0), ..Default::default() });
            }
            running = next;
        }
        let line = admission.snapshot().batch_line.expect("batches of 2 and 6 teach the line");
        assert!((line.fixed - 0.040).abs() < 0.002 && (line.per_input - 0.005).abs() < 0.0005, "{line:?}");
        assert_eq!(value(&metrics, fixed), Some(line.fixed));
        assert_eq!(value(&metrics, per_input), Some(line.per_input));
        let places = admission.snapshot().ingest_places;
        assert_eq!(value(&metrics, "teifleet_ingest_places{pool=\"p\"}"), Some(places as f64));
    }

    /// A bulk call's sub-batch: one permit for several messages, each answered on its own. Each
    /// answer counts its own inputs, so the batches are as large as TEI ran them (counted as the
    /// whole permit each, a sub-batch of 6 would make a batch of 36).
    #[tokio::test(start_paused = true)]
    async fn a_sub_batchs_answers_count_their_own_inputs() {
        let admission = Admission::new(Limits::new(16, 64, Duration::from_secs(1)));
        let time = |size: u32| Duration::from_millis(40 + 5 * u64::from(size));
        let let_in = |size: u32| {
            admission.try_acquire(&Ask::new(Priority::Standard).cost(Cost { inputs: size, tokens: 0 })).unwrap()
        };
        let mut running = (2, let_in(2));
        for size in [2, 6].repeat(12) {
            let next = (size, let_in(size));
            tokio::time::advance(time(running.0)).await;
            for _ in 0..running.0 {
                running.1.observe_answer(Observation { tei_inference: time(running.0), ..Default::default() }, 1);
            }
            drop(running.1);
            running = next;
        }
        let line = admission.snapshot().batch_line.expect("batches of 2 and 6");
        assert!((line.fixed - 0.040).abs() < 0.002 && (line.per_input - 0.005).abs() < 0.0005, "{line:?}");
    }

    #[test]
    fn code_labels_match_tonics_names() {
        for value in 0..=16 {
            let code = Code::from_i32(value);
            assert_eq!(code_label(code), format!("{code:?}"));
        }
    }
}
