//! The fronts that accept bytes: tei.v1 gRPC on the gRPC port (`grpc`: its HTTP/2 server, the
//! connections' bounds, a call's message in and its answer out, and the one generic service that
//! takes every RPC of the table through the gate, admission and forwarding) and TEI's HTTP API
//! with OpenAI's embeddings route (`http`), translated to the same calls; tei-manager's
//! `tei_multiplexer.v1` on the gRPC port (`tei_manager`), its wrapped RPCs as tei.v1's and its Arrow
//! batches over the whole pool. Both answer to one
//! [`Readiness`]. Imports every room below it.

pub mod door;
pub mod grpc;
pub mod http;
pub mod tei_manager;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::forward::pools::PoolTable;

/// What `/readyz` and gRPC health report.
pub struct Readiness {
    pub pools: Arc<PoolTable>,
    /// The pool's own TEI answered its last health check.
    pub upstream_serving: AtomicBool,
    /// Cleared when draining starts.
    pub accepting: AtomicBool,
}

impl Readiness {
    /// Serving only when TEI is reachable, the pool's limits are known, and not draining.
    pub fn ready(&self) -> Result<(), &'static str> {
        if !self.accepting.load(Ordering::Relaxed) {
            return Err("draining");
        }
        // The activator fronts no TEI: it is ready once it knows the pools.
        if self.pools.activations().is_some() {
            return if self.pools.synced() { Ok(()) } else { Err("pools not known yet") };
        }
        match self.pools.get(self.pools.own_name()) {
            Some(pool) if pool.spec.limits.is_some() => {}
            _ => return Err("pool configuration not known yet"),
        }
        if !self.upstream_serving.load(Ordering::Relaxed) {
            return Err("TEI is not serving");
        }
        Ok(())
    }
}
