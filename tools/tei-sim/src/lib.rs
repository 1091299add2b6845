//! A simulator of Hugging Face Text Embeddings Inference (TEI) speaking TEI's `tei.v1` gRPC API,
//! with TEI's admission (`RESOURCE_EXHAUSTED` when a unary call finds no free slot, streamed
//! messages waiting instead), TEI's batching in front of a simulated device, deterministic
//! answers, injectable faults and counters for tests.
//!
//! ```no_run
//! # async fn demo() -> Result<(), teifleet_tei_sim::SimError> {
//! let sim = teifleet_tei_sim::start(teifleet_tei_sim::SimConfig::default()).await?;
//! println!("gRPC on {}", sim.addr());
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod admin;
mod batcher;
mod config;
mod embedding;
mod error;
mod metrics;
pub mod profile;
mod server;
mod service;
mod shared_device;
mod state;
mod stats;
mod tokenizer;

pub use config::{Device, Fault, SimConfig};
pub use embedding::embedding_for;
pub use error::SimError;
pub use server::{SimHandle, start};
pub use stats::Stats;
