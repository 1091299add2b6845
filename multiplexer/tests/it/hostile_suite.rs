//! The hostile suite (issue 43): every surface the multiplexer serves to callers, taken from the
//! product's own tables (`table`, held to them by `coverage`), meets the same attacks, each run
//! against the multiplexer binary in front of the TEI simulator on loopback with the sidecar's
//! memory limit: the largest body and per-input amplification, compressed bodies, malformed
//! messages, answers never read, a flood of the cheapest call beside a steady caller (the gRPC
//! rows in `grpc_attacks`, the HTTP rows in `http_attacks`), and once per port, idle connections
//! (`ports`). Each attack goes through every row and reports each (`[hostile]` lines on stderr),
//! then fails naming every row that did not hold. `fuzz_bodies` fuzzes the HTTP routes' bodies
//! through the whole front in process.

mod bodies;
mod client;
mod compressed;
mod coverage;
mod fuzz_bodies;
mod grpc_attacks;
mod http_attacks;
mod ports;
mod report;
mod requests;
mod sidecar;
mod steady;
mod table;

use std::time::Duration;

use teifleet_tei_sim::{SimConfig, SimHandle};

/// The simulator behind every attacked sidecar: TEI's defaults (384 dimensions).
fn sim(_: &mut SimConfig) {}

/// Waits until the simulator has been sent nothing new for a moment (what an attack started
/// has reached it, or never will), at most 5 s.
async fn quiet(sim: &SimHandle) {
    let mut last = sim.stats().requests_received;
    let mut still = 0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = sim.stats().requests_received;
        still = if now == last { still + 1 } else { 0 };
        last = now;
        if still >= 2 {
            return;
        }
    }
}
