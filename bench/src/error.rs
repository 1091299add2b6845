//! The benchmark suite's error type: environment failures that stop a scenario from measuring.
//! A request that fails is never an error here: it is data, counted by its gRPC code.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The load generator could not run (unreachable target, bad configuration).
    #[error(transparent)]
    Load(#[from] teifleet_load::Error),
    #[error("{what} {path}: {source}")]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serializing results: {0}")]
    Json(#[from] serde_json::Error),
    /// A helper process (simulator, multiplexer, operator, valgrind) that would not start, answer
    /// or report.
    #[error("{0}")]
    Process(String),
    /// A helper of the test kit: a process that exited or was not ready in time, a port, a file,
    /// the local control plane.
    #[error(transparent)]
    Testkit(#[from] teifleet_testkit::Error),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("plotting {path}: {message}")]
    Plot { path: PathBuf, message: String },
}
