//! Running the process: both ports, TEI's health checks and graceful draining (`server`), and
//! the admin port with `/metrics`, `/healthz`, `/readyz`, `/admission` and TEI's health on TEI's
//! behalf (`admin`). The top room: it wires every other one.

pub mod admin;
pub mod server;
