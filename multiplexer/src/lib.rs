//! teifleet's gRPC multiplexer: the sidecar in every TEI pod that speaks `tei.v1`, holds the pool's
//! admission queue and routes by metadata. It is built by its own issue; this crate reserves its
//! place in the workspace so the layout shows the architecture from day one.
