//! teifleet's gRPC multiplexer: the sidecar in every TEI pod (and, same binary, a standalone
//! gateway) that speaks `tei.v1`, holds each pool's admission queue and routes by metadata.
#![deny(warnings, rust_2018_idioms)]
#![forbid(unsafe_code)]

pub mod admission;
