//! The library's one error type.

use std::net::SocketAddr;

/// Why a simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The configuration cannot work.
    #[error("invalid simulator configuration: {0}")]
    InvalidConfig(String),
    /// A fault name other than none, fail, stall (or clear).
    #[error("unknown fault {0:?} (expected none, fail or stall)")]
    UnknownFault(String),
    /// A device mode other than sleep or spin.
    #[error("unknown device {0:?} (expected sleep or spin)")]
    UnknownDevice(String),
    /// A listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: std::io::Error,
    },
    /// The reflection service could not read the descriptor set.
    #[error("cannot open the shared device's lock file {path}: {source}")]
    SharedDevice {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// A metric could not be registered.
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}
