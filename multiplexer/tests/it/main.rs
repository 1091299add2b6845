//! The multiplexer's integration tests, one binary (one link, one process start) for every area:
//! each module drives the real gRPC and HTTP fronts on loopback against the TEI simulator.

mod activator;
mod activator_tls;
mod admission;
mod attacks;
mod auth;
mod bad_input;
mod cache;
mod claims;
mod door;
mod drain;
mod faults;
mod fuzz;
mod hostile_arrow;
mod hostile_connections;
mod hostile_http;
mod hostile_http_amplify;
mod hostile_suite;
mod http_front;
mod interop;
mod lanes;
mod live_limits;
mod load_report;
mod long_streams;
mod observability;
mod passthrough;
mod process;
mod routing;
mod spill;
mod streamed_arrow;
mod support;
mod tei_manager;
mod tei_parity;
mod tls;
mod tls_expiry;
mod units_and_tenants;
