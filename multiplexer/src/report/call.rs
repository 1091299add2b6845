//! One call's accounting: its outcome is counted exactly once, its time split between the
//! multiplexer's queue, TEI's queue and TEI's inference, and a call dropped unfinished (the
//! client went away) counts as cancelled.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;

use crate::admission::Priority;
use crate::error::{Error, ErrorKind};
use crate::report::metrics::{Metrics, Timings};
use crate::vocab::rpc::Rpc;
use crate::vocab::wire::TeiTiming;
use crate::vocab::{Outcome, Protocol};

/// Calls in flight and when the last one arrived, so a draining multiplexer knows it is idle.
pub struct Activity {
    started: Instant,
    active: AtomicUsize,
    last_arrival_ms: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Self { started: Instant::now(), active: AtomicUsize::new(0), last_arrival_ms: AtomicU64::new(0) }
    }
}

impl Activity {
    /// How long nothing has been in flight nor arrived; zero while a call is in flight.
    pub fn idle_for(&self) -> Duration {
        if self.active.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_arrival_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }
}

pub struct Call {
    metrics: Metrics,
    activity: Arc<Activity>,
    pub rpc: &'static Rpc,
    pub protocol: Protocol,
    pub pool: String,
    pub priority: Priority,
    /// The tenant's metric label (`default` for calls that name none).
    pub tenant: std::borrow::Cow<'static, str>,
    pub arrived: Instant,
    timings: Timings,
    finished: bool,
    /// A sibling replica spilled this call here: the sibling counts it as its client's call.
    spilled_in: bool,
}

impl Call {
    pub fn new(metrics: Metrics, activity: Arc<Activity>, rpc: &'static Rpc, protocol: Protocol, pool: &str) -> Self {
        let arrived = Instant::now();
        activity.active.fetch_add(1, Ordering::AcqRel);
        let since_start = arrived.saturating_duration_since(activity.started).as_millis();
        activity.last_arrival_ms.fetch_max(u64::try_from(since_start).unwrap_or(u64::MAX), Ordering::Relaxed);
        Self {
            metrics,
            activity,
            rpc,
            protocol,
            pool: pool.to_owned(),
            priority: Priority::default(),
            tenant: crate::admission::DEFAULT_TENANT.into(),
            arrived,
            timings: Timings::default(),
            finished: false,
            spilled_in: false,
        }
    }

    /// The call was spilled here by a sibling replica, which counts it as its client's call: it
    /// is counted here only as spilled in, so the pool counts every call once.
    pub fn spilled_in(&mut self) {
        self.spilled_in = true;
    }

    /// The call waited in the multiplexer's queue until now.
    pub fn admitted(&mut self) {
        self.admitted_at(Instant::now());
    }

    /// The call (or the identical call it shared) was admitted at `when`.
    pub fn admitted_at(&mut self, when: Instant) {
        self.timings.queue_wait = Some(when.saturating_duration_since(self.arrived));
    }

    /// Counts the call as failed with `error` and gives the error back, for the front to answer
    /// in its own protocol.
    pub fn fail(&mut self, error: Error) -> Error {
        let kind = error.kind();
        match &error {
            Error::Upstream { status, .. } if kind != ErrorKind::Unreachable => tracing::warn!(
                pool = %self.pool,
                rpc = self.rpc.label,
                code = crate::report::metrics::code_label(status.code()),
                message = status.message(),
                "upstream call failed"
            ),
            Error::Upstream { .. } | Error::Unreachable { .. } => {
                tracing::warn!(pool = %self.pool, rpc = self.rpc.label, %error, "upstream unreachable")
            }
            _ => {}
        }
        self.finish(error.code(), kind.into());
        error
    }

    /// Counts the call as refused by its front before it became a call upstream (a body that is
    /// not the route's JSON, too many inputs).
    pub fn refuse(&mut self, kind: ErrorKind) {
        self.finish(kind.code(), kind.into());
    }

    /// Records TEI's timing from one of its answers.
    pub fn observe(&mut self, timing: Option<TeiTiming>) {
        if let Some(timing) = timing {
            self.timings.tei_queue = Some(timing.queue);
            self.timings.tei_inference = Some(timing.inference);
        }
    }

    pub fn succeed(&mut self) {
        self.finish(Code::Ok, Outcome::Ok);
    }

    fn finish(&mut self, code: Code, outcome: Outcome) {
        if self.finished {
            return;
        }
        self.finished = true;
        if self.spilled_in {
            self.metrics.spilled_in(&self.pool, outcome);
            return;
        }
        self.timings.total = self.arrived.elapsed();
        let kind = (self.priority, self.protocol, self.rpc.label);
        self.metrics.call_done(&self.pool, kind, code, outcome, &self.tenant, &self.timings);
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(Code::Cancelled, Outcome::Cancelled);
        self.activity.active.fetch_sub(1, Ordering::AcqRel);
    }
}
