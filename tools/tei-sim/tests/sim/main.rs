//! End-to-end tests of the simulator over real gRPC and HTTP on 127.0.0.1.

mod admin;
mod admission;
mod as_tei;
mod batching;
mod common;
mod device;
mod embed;
mod faults;
mod services;
