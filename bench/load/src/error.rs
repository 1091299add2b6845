//! The load generator's error type: usage mistakes and unreachable targets. A request that fails
//! is never an error here: it is data, counted by its gRPC code.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag or configuration value that cannot be used.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The target could not be reached at all.
    #[error("cannot connect to {target}: {source}")]
    Connect {
        target: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// The target does not answer HTTP.
    #[error("cannot reach {target} over HTTP: {reason}")]
    HttpConnect { target: String, reason: String },
    #[error("{what} {path}: {source}")]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serializing the report: {0}")]
    Json(#[from] serde_json::Error),
    /// A bug in the generator itself (a request task that outlived its run).
    #[error("load generator: {0}")]
    Internal(String),
}
