//! teifleet's gRPC multiplexer: the sidecar in every TEI pod (and, same binary, a standalone
//! gateway) that speaks `tei.v1`, holds each pool's admission queue and routes by metadata.
//!
//! Layout: `admission` (permits and the priority queue), `request_meta` (what a request asks
//! for), `pools` (routing table of pools and their upstreams), `forward` (unary and streaming
//! forwarding under admission), `services` (the `tei.v1` trait impls), `status` (the one place
//! errors become gRPC status), `sources` (where pool limits come from: a file or Kubernetes),
//! `server`, `admin` and `metrics`.
#![deny(warnings, rust_2018_idioms)]
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod forward;
pub mod metrics;
pub mod pools;
pub mod request_meta;
pub mod server;
pub mod services;
pub mod sources;
pub mod status;
pub mod upstream;

use admission::{AdmissionError, UnknownPriority};

/// Everything that can go wrong with a request or with the multiplexer's configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("pool {pool}: {source}")]
    Admission { pool: String, source: AdmissionError },

    #[error(transparent)]
    InvalidPriority(#[from] UnknownPriority),

    #[error("invalid {header} metadata: {reason}")]
    InvalidMetadata { header: &'static str, reason: String },

    #[error("no pool named {requested:?} here; known pools: {known}")]
    UnknownPool { requested: String, known: String },

    #[error("no pool serves model {model:?}; known pools: {known}")]
    UnknownModel { model: String, known: String },

    #[error("this request was already forwarded by {by}; teifleet forwards a request at most once")]
    ForwardingLoop { by: String },

    #[error("pool {0} has no limits yet (waiting for its EmbeddingPool status)")]
    PoolNotReady(String),

    #[error("the multiplexer is shutting down")]
    Draining,

    #[error("upstream {pool}: {status}")]
    Upstream { pool: String, status: tonic::Status },

    #[error("invalid upstream address {url:?}: {reason}")]
    InvalidUpstream { url: String, reason: String },

    #[error("configuration: {0}")]
    Config(String),

    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
