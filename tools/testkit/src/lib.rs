//! Helpers the tests (and the benchmarks) share, written once: polling until a condition holds,
//! child processes that go away with their guard, free loopback ports, plain HTTP requests to admin
//! ports, lookups in Prometheus text, Redis and SeaweedFS servers on loopback and, with the `kube`
//! feature, CRD install and throwaway namespaces on a cluster, and, with the `certs` feature,
//! certificates for TLS tests.
//!
//! Polling panics on timeout, as a test wants ([`poll::eventually`], [`poll::until`]);
//! [`poll::try_eventually`] returns the timeout as an [`Error`] for programs that must not panic.
//! Everything else that can fail returns a [`Result`]; observations that may legitimately be
//! missing (an HTTP answer, a metric) are `Option`s.
#![forbid(unsafe_code)]

#[cfg(feature = "certs")]
pub mod certs;
pub mod http;
#[cfg(feature = "kube")]
pub mod kube;
pub mod net;
pub mod poll;
pub mod process;
pub mod prom;
pub mod redis;
pub mod seaweedfs;

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// What went wrong in a helper.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A condition did not hold in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    TimedOut { what: String, timeout: Duration },
    /// No loopback port could be bound.
    #[error("cannot find a free port: {0}")]
    FreePort(#[source] std::io::Error),
    /// A child process could not be started.
    #[error("cannot start {name}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// A child process ended while it was expected to come up.
    #[error("{name} exited before it was ready ({status}){}", log_hint(.log))]
    Exited { name: String, status: ExitStatus, log: Option<PathBuf> },
    /// A file (a log, a CRD) could not be read or written.
    #[error("cannot use {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A helper server refused what it was asked (SeaweedFS making a bucket).
    #[error("{what} failed: {answer}")]
    Refused { what: String, answer: String },
    /// A kubeconfig or a manifest did not make sense.
    #[cfg(feature = "kube")]
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    /// The Kubernetes API refused or failed a request.
    #[cfg(feature = "kube")]
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] ::kube::Error),
}

fn log_hint(log: &Option<PathBuf>) -> String {
    log.as_ref().map(|path| format!("; see {}", path.display())).unwrap_or_default()
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
