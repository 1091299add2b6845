//! teifleet's load generator: drives any `tei.v1` endpoint (a TEI, the simulator, the
//! multiplexer) open loop (precomputed arrivals, latency from the scheduled time, so there is no
//! coordinated omission) or closed loop (fixed concurrency), and reports what it saw.
//!
//! It links no Kubernetes and no plotting: the scenarios of `make bench` (`teifleet-bench`) are
//! built on it, and so is the `teifleet-load` command.
#![forbid(unsafe_code)]

pub mod arrivals;
pub mod codes;
mod driver;
pub mod error;
pub mod inputs;
mod progress;
pub mod render;
pub mod report;
pub mod retry;
mod sink;
pub mod summary;
pub mod tls;
pub mod zipf;

pub use driver::{Call, Dialer, LoadConfig, Mode, Protocol, check_loopback, connect, connect_spread, is_tls, run};
pub use error::{Error, Result};
pub use report::Report;
