//! teifleet's gRPC multiplexer: the sidecar in every TEI pod (and, same binary, a standalone
//! gateway) that speaks `tei.v1`, holds each pool's admission queue and routes by metadata.
//!
//! Layout: `rpc` (every tei.v1 RPC as a row of one table), `auth` (API keys, checked first on
//! both fronts), `service` (the one generic service serving every row), `forward` (unary and
//! streaming forwarding of message bytes under admission), `streams` (the two halves of a
//! forwarded stream, admitted message by message), `coalesce` (identical calls in flight share
//! one upstream call), `call` (one call's accounting), `wire` (the few protobuf fields read
//! without decoding), `admission` (permits and the priority queue), `request_meta` (what a
//! request asks for, from its headers), `pools` (routing table of pools and their upstreams),
//! `status` (the one place request errors become gRPC status), `http` (TEI's HTTP API and
//! OpenAI's embeddings route, translated to `tei.v1` calls on the same path), `sources` (where
//! pool limits and API keys come from: files or Kubernetes), `server`, `admin` and `metrics`.
#![deny(warnings, rust_2018_idioms)]
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod auth;
pub mod call;
pub mod coalesce;
pub mod forward;
pub mod http;
pub mod metrics;
pub mod pools;
pub mod request_meta;
pub mod rpc;
pub mod server;
pub mod service;
pub mod sources;
pub mod status;
pub mod streams;
pub mod upstream;
pub mod wire;

use std::net::SocketAddr;

use admission::{AdmissionError, UnknownPriority};

/// Why one request was not served as asked. `status.rs` maps each to the gRPC status the client
/// receives; nothing else becomes a status. Clone, so calls sharing one upstream call
/// (`coalesce`) can each be told how it ended.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Refused at the gate for its API key (`auth`), before routing or admission.
    #[error("{}", .0.message())]
    Auth(auth::AuthFailure),

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

    /// The upstream answered with this status: it reaches the client as the upstream sent it.
    #[error("upstream {pool}: {status}")]
    Upstream { pool: String, status: tonic::Status },

    #[error("upstream {pool} is unreachable: {reason}")]
    Unreachable { pool: String, reason: String },

    #[error("upstream {pool}: the call's deadline passed after {waited:?}, while the upstream was working on it")]
    DeadlineAtUpstream { pool: String, waited: std::time::Duration },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
