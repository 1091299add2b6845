//! What the sidecar says about the calls it served: one call's accounting, its outcome counted
//! once and its time split (`call`), the embedding cache's series (`cache`), the Prometheus metrics (`metrics`), the last minute's rates
//! the operator sums into a pool's demand (`rates`), the load report every answer carries for
//! clients that balance by load (`orca`), and an error as the gRPC status the caller receives
//! (`status`). Imports `vocab`, `admission` and `error`.

pub mod cache;
pub mod call;
pub mod metrics;
pub mod orca;
pub mod rates;
pub mod status;
