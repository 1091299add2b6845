//! What admission is asked for and answers with: limits, costs, asks, refusals, what TEI reports,
//! and snapshots of a pool's state.

use std::time::Duration;

use tokio::time::Instant;

use super::adaptive::Change;
use super::batch_curve::Line;
use super::lane::{DEFAULT_INGEST_SHARE, Lane};
use super::priority::Priority;

/// One pool's limits on this replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Inputs in flight to TEI; with `adaptive`, the ceiling of the limit that finds itself.
    pub max_in_flight: usize,
    /// Inputs waiting.
    pub max_queued: usize,
    pub queue_timeout: Duration,
    /// Estimated tokens in flight, when the pool has a token budget.
    pub max_in_flight_tokens: Option<usize>,
    pub adaptive: bool,
    /// Percent of admissions ingest is owed while queries would take them all (see `lanes`).
    pub ingest_share: u8,
    /// Percent of the in-flight limit ingest leaves to queries while they come; none: what TEI's
    /// batch-time curve says their p99 needs (see `ingest_gate`).
    pub query_reserve: Option<u8>,
    /// Percent of the time this replica may keep TEI busy while its calls queue (see
    /// `device_time`); none: no cap.
    pub device_time_cap: Option<u8>,
    /// Percent of a time-sliced GPU that is this replica's share: the cap on TEI time while a
    /// neighbour is busy on the device, none while it is quiet (see `contention`); ignored under
    /// `device_time_cap`. None: not on a shared GPU.
    pub gpu_share: Option<u8>,
}

impl Limits {
    pub fn new(max_in_flight: usize, max_queued: usize, queue_timeout: Duration) -> Self {
        Self {
            max_in_flight,
            max_queued,
            queue_timeout,
            max_in_flight_tokens: None,
            adaptive: false,
            ingest_share: DEFAULT_INGEST_SHARE,
            query_reserve: None,
            device_time_cap: None,
            gpu_share: None,
        }
    }
}

/// What one call (or one stream message) takes from the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    pub inputs: u32,
    /// Estimated tokens; charged only when the pool has a token budget.
    pub tokens: u32,
}

impl Cost {
    pub const ONE: Cost = Cost { inputs: 1, tokens: 0 };
}

/// What a call asks for.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    pub priority: Priority,
    pub lane: Lane,
    /// `None`: the default tenant.
    pub tenant: Option<&'a str>,
    pub cost: Cost,
    /// The caller's own deadline (from `grpc-timeout`); the pool's queue timeout applies as well.
    pub deadline: Option<Instant>,
    /// Waits for room whatever the queue looks like: neither refused for a full queue (it may
    /// stand beyond `max_queued`) nor for an expected wait, only when the queue timeout passes.
    /// For calls let in by the pool's door, which bounds how many there are.
    pub patient: bool,
}

impl<'a> Ask<'a> {
    pub fn new(priority: Priority) -> Self {
        Self { priority, lane: Lane::Query, tenant: None, cost: Cost::ONE, deadline: None, patient: false }
    }

    pub fn lane(self, lane: Lane) -> Self {
        Self { lane, ..self }
    }

    pub fn patient(self, patient: bool) -> Self {
        Self { patient, ..self }
    }

    pub fn deadline(self, deadline: Option<Instant>) -> Self {
        Self { deadline, ..self }
    }

    pub fn tenant(self, tenant: Option<&'a str>) -> Self {
        Self { tenant, ..self }
    }

    pub fn cost(self, cost: Cost) -> Self {
        Self { cost, ..self }
    }
}

/// What a refused caller is told about coming back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Come back after this long: about when the caller's turn comes.
    After(Duration),
    /// The caller's turn would come after its deadline: retrying cannot help, and a retry would
    /// only take a turn from a caller that can still be served.
    Futile,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    #[error("the queue is full ({queued} inputs waiting)")]
    QueueFull { queued: usize, retry_after: Retry },
    #[error("the deadline cannot be met: about {expected_wait:?} of queue ahead")]
    DeadlineUnmeetable { expected_wait: Duration, retry_after: Retry },
    #[error("about {expected_wait:?} of queue ahead, more than the pool's queue timeout ({queue_timeout:?})")]
    QueueTimeoutUnmeetable { expected_wait: Duration, queue_timeout: Duration, retry_after: Retry },
    #[error("waited {waited:?} in the queue, the pool's queue timeout")]
    QueueTimeout { waited: Duration, retry_after: Retry },
    #[error("the request's deadline passed after {waited:?} in the queue")]
    DeadlineExpired { waited: Duration },
    #[error("evicted from the full queue by a higher-priority request or a tenant with less of the queue")]
    Evicted { retry_after: Retry },
}

impl AdmissionError {
    /// What to tell the client about retrying, if anything.
    pub fn retry(&self) -> Option<Retry> {
        match self {
            Self::QueueFull { retry_after, .. }
            | Self::DeadlineUnmeetable { retry_after, .. }
            | Self::QueueTimeoutUnmeetable { retry_after, .. }
            | Self::QueueTimeout { retry_after, .. }
            | Self::Evicted { retry_after } => Some(*retry_after),
            Self::DeadlineExpired { .. } => None,
        }
    }

    /// The back-off to suggest to the client, if retrying can help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.retry()? {
            Retry::After(after) => Some(after),
            Retry::Futile => None,
        }
    }
}

/// What TEI reported for one answer (its response Metadata).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    pub tei_queue: Duration,
    pub tei_inference: Duration,
    pub chars: u64,
    pub tokens: u64,
}

/// What the pool looks like right now, for metrics and tests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Snapshot {
    pub limits: Limits,
    /// The in-flight limit in force: `limits.max_in_flight`, or the adaptive limit below it.
    pub effective_limit: usize,
    /// Inputs in flight.
    pub in_flight: usize,
    pub in_flight_tokens: u64,
    /// Queued inputs per priority, in [`Priority::ALL`] order.
    pub queued: [usize; 3],
    pub chars_per_token: f64,
    /// The queries' queue stands (a signal only: nobody is refused for it, see `standing`).
    pub standing_queue: bool,
    /// The cap on TEI time in force, in percent: `limits.device_time_cap`, or `limits.gpu_share`
    /// while a neighbour is busy on the GPU (see `contention`).
    pub device_time_cap: Option<u8>,
    /// TEI's batch time as a line in its inputs, learned from its answers (`None` until batches of
    /// sizes far enough apart came back; see `batch_curve`).
    pub batch_line: Option<Line>,
    /// The inputs of TEI's next batch ingest may fill while queries come (see `ingest_gate`).
    pub ingest_places: usize,
    /// Set on the snapshot taken right after the adaptive limit moved.
    pub change: Option<Change>,
}

impl Snapshot {
    pub fn queued_total(&self) -> usize {
        self.queued.iter().sum()
    }
}
