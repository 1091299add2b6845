//! The scaffolding every teifleet binary (operator, multiplexer, simulator) starts with, written
//! once: log setup, the shutdown signal, duration flags, the admin HTTP port and metric
//! registration.
//!
//! ```no_run
//! # async fn demo() -> Result<(), teifleet_runtime::Error> {
//! use teifleet_runtime::{admin, logging, shutdown};
//!
//! logging::init(logging::LogFormat::Json)?;
//! let stop = shutdown::signal()?;
//! let registry = prometheus::Registry::new();
//! let router = admin::routes(registry).readyz(|| Err::<(), _>("warming up")).into_router();
//! let listener = admin::bind("127.0.0.1:9090".parse().unwrap()).await?;
//! admin::serve(listener, router, |_reason| {}, async move {
//!     let signal = stop.await;
//!     tracing::info!(%signal, "shutting down");
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod admin;
pub mod duration;
pub mod http_server;
pub mod logging;
pub mod metrics;
pub mod shutdown;
pub mod tls;

use std::net::SocketAddr;

/// What can fail while a binary sets itself up or serves its admin port.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A global log subscriber was installed already.
    #[error("cannot install the log subscriber: {0}")]
    Logging(#[from] tracing_subscriber::util::TryInitError),
    /// The process cannot listen for a termination signal.
    #[error("cannot listen for {signal}: {source}")]
    Signal {
        signal: shutdown::Signal,
        #[source]
        source: std::io::Error,
    },
    /// The admin port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The admin server stopped with an error.
    #[error("admin server failed: {0}")]
    Serve(#[source] std::io::Error),
}
