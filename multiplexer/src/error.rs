//! Why a request was not served, typed where it is raised, and classified once.
//!
//! [`Error::kind`] is the one classification: the gRPC status (`report/status.rs`), the HTTP status and
//! body (`front/http/error.rs`) and the outcome a call is counted as are small maps from an
//! [`ErrorKind`], with no wildcard arm anywhere, so a new error must be placed on purpose and can
//! never be counted as the caller's fault by default.

use tonic::Code;

pub use crate::vocab::outcome::{ErrorKind, Shed};

use crate::admission::memory::OverBudget;
use crate::admission::{AdmissionError, UnknownPriority};
use crate::gate::auth::{self, AuthFailure};
use crate::gate::door::DoorRefusal;
use crate::gate::request_meta::{InvalidMetadata, MetaError};

/// Why one request was not served as asked. Clone, so calls sharing one upstream call
/// (`coalesce`) can each be told how it ended.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Refused at the gate for its API key (`auth`), before routing or admission.
    #[error("{}", .0.message())]
    Auth(auth::AuthFailure),

    #[error("pool {pool}: {source}")]
    Admission { pool: String, source: AdmissionError },

    /// A call a sibling replica spilled here found no room at once; the sibling serves it itself.
    #[error("pool {pool}: no room for a call spilled from {from}")]
    SpillRefused { pool: String, from: String },

    #[error(transparent)]
    InvalidPriority(#[from] UnknownPriority),

    #[error(transparent)]
    InvalidMetadata(#[from] InvalidMetadata),

    /// A stream's request message that could not be read (over the size limit, marked
    /// compressed, cut short): the status tonic gives for it, passed to the caller as it is.
    #[error("a request message was refused: {}", .0.message())]
    Message(tonic::Status),

    /// A unary call's request message did not arrive within the message deadline.
    #[error("the request message did not arrive within {within:?} of the call's admission")]
    SlowMessage { within: std::time::Duration },

    #[error("no pool named {requested:?} here; known pools: {known}")]
    UnknownPool { requested: String, known: String },

    #[error("no pool serves model {model:?}; known pools: {known}")]
    UnknownModel { model: String, known: String },

    #[error("this request was already forwarded by {by}; teifleet forwards a request at most once")]
    ForwardingLoop { by: String },

    /// The call came in TLS and names a pool served in plain text: passed on, it would cross the
    /// network in clear text. Its pool allows that with `spec.tls.allowPlaintextRoutes`.
    #[error(
        "pool {pool} is served in plain text, and this call came in TLS: it is not passed on unencrypted (the pool it came to may allow it with spec.tls.allowPlaintextRoutes)"
    )]
    PlaintextRoute { pool: String },

    #[error("pool {0} has no limits yet (waiting for its EmbeddingPool status)")]
    PoolNotReady(String),

    /// At the activator, a call that names no pool, by a header or by what its client dialled:
    /// no pool's to hold, and no retry will make it one.
    #[error(
        "the call names no pool: dial the pool's Service by its name or address, or name the pool in x-teifleet-pool"
    )]
    NoPoolNamed,

    /// At the activator, a call for a pool with mutual TLS that did not come on a connection
    /// whose client certificate that pool's client CA checked.
    #[error(
        "pool {pool} takes calls only with a client certificate from its client CA: dial the pool's Service in TLS with one"
    )]
    CertificateRequired { pool: String },

    #[error("the multiplexer is shutting down")]
    Draining,

    /// The pool has no ready replica (it scaled to zero) and none became ready while the call
    /// was held at the activator.
    #[error("pool {pool} has no ready replica yet (it is starting from zero); held {waited:?}, retry shortly")]
    ColdStart { pool: String, waited: std::time::Duration },

    /// The upstream answered with this status: it reaches the client as the upstream sent it.
    #[error("upstream {pool}: {status}")]
    Upstream { pool: String, status: tonic::Status },

    #[error("upstream {pool} is unreachable: {reason}")]
    Unreachable { pool: String, reason: String },

    #[error("upstream {pool}: the call's deadline passed after {waited:?}, while the upstream was working on it")]
    DeadlineAtUpstream { pool: String, waited: std::time::Duration },

    /// The pool's door did not let the call in (its deadline passed there, or the doors are full).
    #[error("pool {pool}: {source}")]
    Door { pool: String, source: DoorRefusal },

    /// The request would take the process past its memory budget: refused before its body is read.
    #[error(transparent)]
    Memory(#[from] OverBudget),

    /// The activator holds as many calls (or bytes) for this pool, or from this client, as it may.
    #[error("pool {pool} is starting from zero and {what} already wait for it (at most {limit}); retry shortly")]
    HoldsFull { pool: String, what: &'static str, limit: u64 },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// [`Error::for_client`]'s message.
pub struct ForClient<'a>(&'a Error);

impl std::fmt::Display for ForClient<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Error::Unreachable { pool, .. } => write!(f, "upstream {pool} is unreachable"),
            Error::Upstream { pool, status } if is_transport_failure(status) => {
                write!(f, "upstream {pool} is unreachable")
            }
            Error::ForwardingLoop { .. } => f.write_str(
                "this request was already forwarded by a teifleet sidecar; teifleet forwards a request at most once",
            ),
            Error::SpillRefused { pool, .. } => write!(f, "pool {pool}: no room for a call spilled from a sibling"),
            other => write!(f, "{other}"),
        }
    }
}

/// When a call held for a pool starting from zero is told to come back: soon, since the pool's
/// first replica is on its way.
pub const COLD_START_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl From<MetaError> for Error {
    fn from(error: MetaError) -> Self {
        match error {
            MetaError::Metadata(invalid) => Self::InvalidMetadata(invalid),
            MetaError::Priority(unknown) => Self::InvalidPriority(unknown),
        }
    }
}

impl Error {
    /// What the caller is told: the error's message, less what names the inside of the
    /// deployment (an upstream's URL or address, a sidecar's pod name), which stays in the log
    /// (`report::call`). A client outside the cluster learns nothing of its topology from an error.
    pub fn for_client(&self) -> ForClient<'_> {
        ForClient(self)
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Auth(AuthFailure::KeysNotLoaded) => ErrorKind::Unavailable,
            Self::Auth(AuthFailure::Missing | AuthFailure::Malformed | AuthFailure::InvalidKey)
            | Self::CertificateRequired { .. } => ErrorKind::Unauthenticated,
            Self::Admission { source, .. } => match source {
                AdmissionError::QueueFull { .. } | AdmissionError::Evicted { .. } => ErrorKind::Shed(Shed::QueueFull),
                AdmissionError::DeadlineUnmeetable { .. } => ErrorKind::Shed(Shed::Deadline),
                AdmissionError::QueueTimeoutUnmeetable { .. } => ErrorKind::Shed(Shed::QueueTimeout),
                AdmissionError::QueueTimeout { .. } => ErrorKind::QueueTimedOut,
                AdmissionError::DeadlineExpired { .. } => ErrorKind::ExpiredInQueue,
            },
            Self::SpillRefused { .. } => ErrorKind::Shed(Shed::QueueFull),
            Self::InvalidPriority(_) | Self::InvalidMetadata(_) | Self::SlowMessage { .. } => ErrorKind::InvalidRequest,
            Self::Message(status) => refused_message(status.code()).map_or(ErrorKind::InvalidRequest, |(kind, _)| kind),
            Self::UnknownPool { .. } | Self::UnknownModel { .. } | Self::NoPoolNamed => ErrorKind::NotFound,
            Self::ForwardingLoop { .. } | Self::PlaintextRoute { .. } => ErrorKind::RouteRefused,
            Self::PoolNotReady(_) | Self::Draining | Self::ColdStart { .. } => ErrorKind::Unavailable,
            Self::Unreachable { .. } => ErrorKind::Unreachable,
            Self::DeadlineAtUpstream { .. } => ErrorKind::ExpiredAtUpstream,
            Self::Door { source, .. } => match source {
                DoorRefusal::Deadline => ErrorKind::ExpiredInQueue,
                DoorRefusal::Full { .. } | DoorRefusal::Memory(_) => ErrorKind::Shed(Shed::QueueFull),
                DoorRefusal::HeldTooLong { .. } => ErrorKind::QueueTimedOut,
            },
            // Refused to protect the process, with a retry hint, as a full queue is.
            Self::Memory(_) | Self::HoldsFull { .. } => ErrorKind::Shed(Shed::QueueFull),
            Self::Upstream { status, .. } if is_transport_failure(status) => ErrorKind::Unreachable,
            Self::Upstream { status, .. } => match status.code() {
                Code::DeadlineExceeded => ErrorKind::ExpiredAtUpstream,
                // Another pool's sidecar refused the caller's key: the caller's doing.
                Code::Unauthenticated => ErrorKind::Unauthenticated,
                _ => ErrorKind::Upstream,
            },
        }
    }

    /// The gRPC code the client receives: the upstream's own for its answers, else the kind's.
    pub fn code(&self) -> Code {
        match self {
            Self::Upstream { status, .. } if self.kind() != ErrorKind::Unreachable => status.code(),
            Self::Message(status) => status.code(),
            _ => self.kind().code(),
        }
    }
}

impl ErrorKind {
    /// The gRPC code of a failure the multiplexer describes itself.
    pub fn code(self) -> Code {
        match self {
            Self::Unauthenticated => Code::Unauthenticated,
            Self::InvalidRequest => Code::InvalidArgument,
            // As gRPC answers a message over its size limit.
            Self::TooLarge => Code::OutOfRange,
            Self::NotFound => Code::NotFound,
            // The route is not open to the call as it came: no retry of the same call opens it.
            Self::RouteRefused => Code::FailedPrecondition,
            Self::Shed(_) | Self::QueueTimedOut => Code::ResourceExhausted,
            Self::ExpiredInQueue | Self::ExpiredAtUpstream => Code::DeadlineExceeded,
            Self::Unavailable | Self::Unreachable => Code::Unavailable,
            // Only reached for an upstream answer that carries no code of its own.
            Self::Upstream => Code::Unknown,
        }
    }
}

impl Error {
    /// How long the caller should wait before trying again, for the refusals that carry a hint
    /// beside admission's own (which `source.retry()` gives).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::ColdStart { .. } | Self::HoldsFull { .. } => Some(COLD_START_RETRY),
            Self::Memory(over) => Some(over.retry_after()),
            Self::Door { source, .. } => source.retry_after(),
            _ => None,
        }
    }
}

/// A request message the gRPC port refused, by the status it was answered with (tonic's words):
/// its kind, and the reason `teifleet_refused_input_total` counts it under (none for the message
/// deadline, counted where it fired). `None` for a status that is not the message's fault: the
/// caller went away, or its connection broke.
pub fn refused_message(code: Code) -> Option<(ErrorKind, Option<&'static str>)> {
    match code {
        Code::Cancelled | Code::Unknown | Code::Ok => None,
        Code::OutOfRange => Some((ErrorKind::TooLarge, Some("message_too_large"))),
        // The body outgrew the process's memory budget as it arrived.
        Code::ResourceExhausted => Some((ErrorKind::Shed(Shed::QueueFull), Some("memory_budget"))),
        Code::InvalidArgument => Some((ErrorKind::InvalidRequest, None)),
        // A `grpc-encoding` the multiplexer does not take: nothing is ever decompressed here.
        Code::Unimplemented => Some((ErrorKind::InvalidRequest, Some("compressed_message"))),
        _ => Some((ErrorKind::InvalidRequest, Some("malformed_message"))),
    }
}

/// A call tonic could not make (connection refused or reset), as opposed to an answer: whatever
/// code tonic gives it (UNKNOWN, or UNAVAILABLE for a connection refused on the activator's
/// balancer), its words are the transport's, not the upstream's, and may say where the upstream
/// lives. An answer read from the wire has no source.
pub fn is_transport_failure(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    status.source().is_some_and(|source| source.is::<tonic::transport::Error>())
}
