//! teifleet's gRPC multiplexer: the sidecar in every TEI pod (and, same binary, a standalone
//! gateway) that speaks `tei.v1`, holds each pool's admission queue and routes by metadata.
//!
//! Layout: `activator` (the role that holds calls for pools scaled to zero), `rpc` (every tei.v1 RPC as a row of one table), `auth` (API keys, checked first on
//! both fronts), `service` (the one generic service serving every row), `forward` (unary and
//! streaming forwarding of message bytes under admission), `streams` (the two halves of a
//! forwarded stream, admitted message by message), `coalesce` (identical calls in flight share
//! one upstream call), `siblings` (the own pool's other replicas, where calls spill), `orca`
//! (load reports for balancing clients), `rates` (refusals and spills over the last minute),
//! `call` (one call's accounting), `wire` (the few protobuf fields read
//! without decoding), `admission` (permits and the priority queue), `request_meta` (what a
//! request asks for, from its headers), `pools` (routing table of pools and their upstreams),
//! `tls` (the certificate set in force, from its source),
//! `error` (request errors, typed where raised and classified once), `status` (their gRPC
//! status and counted outcome), `orca` (the load report every answer carries, for clients that
//! balance by load), `http` (TEI's HTTP API and
//! OpenAI's embeddings route, translated to `tei.v1` calls on the same path), `sources` (where
//! pool limits and API keys come from: files or Kubernetes), `server`, `admin` and `metrics`.
#![deny(warnings, rust_2018_idioms)]
#![forbid(unsafe_code)]

pub mod activator;
pub mod admin;
pub mod admission;
pub mod auth;
pub mod body_deadline;
pub mod call;
pub mod charge;
pub mod coalesce;
pub mod connections;
pub mod corked;
pub mod door;
pub mod error;
pub mod flags;
pub mod forward;
pub mod framing;
pub mod grpc_server;
pub mod http;
pub mod keepalive;
pub mod metrics;
pub mod orca;
pub mod pools;
pub mod rates;
pub mod request_meta;
pub mod rpc;
pub mod send_window;
pub mod server;
pub mod service;
pub mod siblings;
pub mod sources;
pub mod status;
pub mod stream_body;
pub mod streams;
pub mod tls;
pub mod unary;
pub mod upstream;
pub mod wire;

use std::net::SocketAddr;

pub use error::{Error, ErrorKind, Result};

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
