//! teifleet's measuring instrument and benchmark suite.
//!
//! The load generator ([`load`]) drives any `tei.v1` endpoint (a TEI, the simulator, or the
//! multiplexer) open loop (precomputed arrivals, latency from the scheduled time, so there is no
//! coordinated omission) or closed loop (fixed concurrency), and reports what it saw ([`report`]).
//! The scenarios of `make bench` ([`scenarios`]) use it to compare going to the backend directly
//! with going through the multiplexer, in one run, against stated targets ([`targets`]).
#![forbid(unsafe_code)]

pub mod arrivals;
pub mod codes;
pub mod error;
pub mod inputs;
pub mod load;
pub mod plots;
pub mod procfs;
pub mod progress;
pub mod render;
pub mod report;
pub mod results;
pub mod scenarios;
pub mod summary;
pub mod targets;

pub use error::{Error, Result};
