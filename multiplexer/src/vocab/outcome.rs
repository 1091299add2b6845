//! The counted vocabulary of how a call ends: what kind of failure it met ([`ErrorKind`], the one
//! classification every front and the metrics map from) and the outcome it is counted as
//! ([`Outcome`], a small map from the kind). The errors themselves are typed where they are
//! raised (`crate::error`); this is what every room needs to agree on about them.

/// What kind of failure a request met: the one classification every front and the metrics map
/// from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// No API key, or a wrong one (here, or at the pool the call was routed to).
    Unauthenticated,
    /// The request is malformed: its metadata, its priority, its body.
    InvalidRequest,
    /// The request asks for more than one request may carry (inputs, bytes).
    TooLarge,
    /// It names a pool or a model that is not served here.
    NotFound,
    /// It may not take the route it asks for: a multiplexer forwarded it already, or it came in
    /// TLS and names a pool served in plain text.
    RouteRefused,
    /// Refused at once to protect the pool, with a hint on when to retry.
    Shed(Shed),
    /// Waited the pool's whole queue timeout without a permit; may be retried.
    QueueTimedOut,
    /// Its deadline passed while it waited in the queue.
    ExpiredInQueue,
    /// Its deadline passed while the upstream worked on it.
    ExpiredAtUpstream,
    /// The multiplexer cannot take calls right now: draining, or its pool's limits or API keys
    /// not known yet. Retrying (elsewhere) helps.
    Unavailable,
    /// The upstream could not be reached.
    Unreachable,
    /// The upstream answered with an error of its own, which passes through as it was sent.
    Upstream,
}

/// Why admission refused a call at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// The queue is full (or the call was evicted from it by one that ranks higher).
    QueueFull,
    /// The call's deadline comes before its expected turn.
    Deadline,
    /// Its expected wait is longer than the pool's queue timeout.
    QueueTimeout,
}

/// How a request ended, as counted in `teifleet_requests_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    ShedQueueFull,
    ShedDeadline,
    ShedQueueTimeout,
    ExpiredInQueue,
    ExpiredAtUpstream,
    Cancelled,
    UpstreamError,
    /// The multiplexer could not take the call (draining, limits or keys not known yet).
    Unavailable,
    /// The caller's doing: a bad request, a wrong key, an unknown pool, too large.
    Rejected,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ShedQueueFull => "shed_queue_full",
            Self::ShedDeadline => "shed_deadline",
            Self::ShedQueueTimeout => "shed_queue_timeout",
            Self::ExpiredInQueue => "expired_in_queue",
            Self::ExpiredAtUpstream => "expired_at_upstream",
            Self::Cancelled => "cancelled",
            Self::UpstreamError => "upstream_error",
            Self::Unavailable => "unavailable",
            Self::Rejected => "rejected",
        }
    }
}

impl From<ErrorKind> for Outcome {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::Unauthenticated
            | ErrorKind::InvalidRequest
            | ErrorKind::TooLarge
            | ErrorKind::NotFound
            | ErrorKind::RouteRefused => Self::Rejected,
            ErrorKind::Shed(Shed::QueueFull) => Self::ShedQueueFull,
            ErrorKind::Shed(Shed::Deadline) => Self::ShedDeadline,
            ErrorKind::Shed(Shed::QueueTimeout) => Self::ShedQueueTimeout,
            ErrorKind::QueueTimedOut | ErrorKind::ExpiredInQueue => Self::ExpiredInQueue,
            ErrorKind::ExpiredAtUpstream => Self::ExpiredAtUpstream,
            ErrorKind::Unavailable => Self::Unavailable,
            ErrorKind::Unreachable | ErrorKind::Upstream => Self::UpstreamError,
        }
    }
}
