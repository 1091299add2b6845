//! The embedding cache (issue 46) against real processes: the multiplexer binary with its pools'
//! `cache:` blocks in a `--config` file, the TEI simulator on loopback as TEI (its own counters
//! say what TEI did), and Debian's redis-server as the shared store. Hits are exactly TEI's
//! answers and cost TEI nothing (`exact`), per input on every front (`exact`), keyed by every
//! option (`exact`), never for an error (`exact`) nor for another tenant (`tenants`); the local
//! tier resists scans and stays within its size (`scan`); replicas share answers through the
//! store, and the store failing fails no call (`store`).

mod exact;
mod fleet;
mod scan;
mod store;
mod tenants;
