//! teifleet's gRPC multiplexer: the sidecar in every TEI pod (and, same binary, a standalone
//! gateway) that speaks `tei.v1`, holds each pool's admission queue and routes by metadata.
//!
//! The rooms, in the order a call meets them (docs/architecture.md draws the path):
//!
//! | room | what a call meets there |
//! | --- | --- |
//! | [`front`] | accepted: the gRPC port (`front::grpc`) or TEI's HTTP API and OpenAI's route (`front::http`), each turning bytes into one of the RPC table's calls |
//! | [`gate`] | authenticated and routed: its headers read (`request_meta`), its key or certificate checked (`auth`), held at the pool's door when the pool is full and it is patient (`door`) |
//! | [`admission`] | admitted: the pool's budget in TEI's units, the fair priority queue, the adaptive limit (no gRPC) |
//! | [`cache`] | looked up: each embedding input by its content, in this process and in a store the pool's replicas share; only the misses go on to admission and TEI |
//! | [`forward`] | forwarded or spilled: its cost charged, coalesced with identical calls, sent to TEI (`upstream`) or to a sibling replica with room (`siblings`) |
//! | [`report`] | answered and counted: its outcome and time split (`call`), metrics, rates, ORCA load reports, the gRPC status of an error |
//! | [`activator`] | the role that holds calls for pools scaled to zero until a replica is ready |
//! | [`sources`] | where pools, limits, keys, certificates and siblings come from: files or Kubernetes |
//! | [`run`] | the process: both ports, the admin port, TEI's health, draining |
//!
//! Underneath: [`vocab`] (the RPC table, protobuf fields, gRPC framing, `Protocol`, error kinds
//! and outcomes: what every room shares), [`transport`] (corked writes, keepalive, flow control,
//! TLS: both HTTP/2 sides), and [`error`] (why a call was not served, typed where raised and
//! classified once).
//!
//! A room imports only from rooms below it: `vocab` < `transport` < `admission` < `gate` <
//! `error` < `report` < `cache` < `activator` < `forward` < `front` < `sources` < `run`
//! (`tools/rooms.py --check`, run by `make lint`).
#![deny(warnings, rust_2018_idioms)]
#![forbid(unsafe_code)]

pub mod activator;
pub mod admission;
pub mod cache;
pub mod error;
pub mod forward;
pub mod front;
pub mod gate;
pub mod report;
pub mod run;
pub mod sources;
pub mod transport;
pub mod vocab;

pub use error::{Error, ErrorKind, Result};
pub use vocab::SetupError;
