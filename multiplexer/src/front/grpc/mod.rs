//! tei.v1 gRPC on the gRPC port, in the order a call meets it: the HTTP/2 server on `h2`
//! (`server`, a task per connection and per stream) under the port's connection bounds
//! (`connections`), a unary call's message in and answer out (`unary`) or a stream's
//! (`stream_body`), a request body cut off at its deadline (`body_deadline`), and the one generic
//! service that serves every row of the RPC table through the gate, admission and forwarding
//! (`service`); server reflection, switched off for pools with keys (`reflection`).

pub mod body_deadline;
pub mod connections;
pub mod reflection;
pub mod server;
pub mod service;
pub mod stream_body;
pub mod unary;
