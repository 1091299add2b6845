//! The vocabulary every room shares, and nothing else of the crate: every `tei.v1` RPC as a row
//! of one table (`rpc`), the few protobuf fields read without decoding (`wire`), gRPC's message
//! framing (`framing`), which front a call came in on (`Protocol`), the kinds of failure and the
//! outcomes a call is counted as (`outcome`), the error of setup, and settings declared once as
//! flags (`flags`). Imports no other room.

pub mod flags;
pub mod framing;
pub mod outcome;
pub mod protocol;
pub mod rpc;
pub mod setup;
pub mod wire;

pub use outcome::{ErrorKind, Outcome, Shed};
pub use protocol::Protocol;
pub use setup::SetupError;
