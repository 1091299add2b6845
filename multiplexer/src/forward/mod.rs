//! Forwarding an admitted call to TEI, as message bytes: the one unary exchange and the stream
//! shapes (`forwarder`), a bulk call's sub-batches over the whole pool (`bulk`), what a call costs and the wait for its permit (`charge`), identical calls
//! sharing one upstream call (`coalesce`), a stream's two halves (`streams`), the routing table
//! of pools (`pools`), TEI's batch learned from its Info (`backend_batch`), the own pool's other replicas where calls spill (`siblings`), and the
//! connections to TEI (`upstream`). Imports every room below it; no front.

pub mod backend_batch;
pub mod bulk;
pub mod charge;
pub mod coalesce;
pub mod forwarder;
pub mod pools;
pub mod siblings;
pub mod streams;
pub mod upstream;

pub use forwarder::{Forwarder, Routed};
