//! Why the multiplexer could not start, or could not apply a configuration: the one error of
//! setup, raised in every room that reads configuration.

use std::net::SocketAddr;

/// Why the multiplexer could not start, or could not apply a configuration.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot listen on {addr}: {error}")]
    Bind { addr: SocketAddr, error: std::io::Error },

    #[error("invalid upstream address {url:?}: {reason}")]
    InvalidUpstream { url: String, reason: String },

    #[error("configuration: {0}")]
    Config(String),

    #[error("server reflection: {0}")]
    Reflection(String),

    #[error("{task} failed: {reason}")]
    Task { task: &'static str, reason: String },

    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}
