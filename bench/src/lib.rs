//! teifleet's benchmark suite: the `make bench` scenarios, each measuring the same traffic direct
//! to the backend and through the multiplexer in one run, against stated targets.
//!
//! Scenarios ([`scenarios`]) drive load with `teifleet-load`, start the processes they measure
//! ([`procs`]), and return typed results ([`results`]); [`targets`] turns results into verdicts,
//! and [`render`] is the one place results become Markdown tables and plots.
#![forbid(unsafe_code)]

pub mod admin;
pub mod callgrind;
pub mod error;
pub mod floor;
pub mod procfs;
pub mod procs;
pub mod render;
pub mod results;
pub mod scenarios;
pub mod targets;

pub use error::{Error, Result};
