//! teifleet's OpenAI Files and Batches API for embeddings (issue 47): `teifleet-batch`, a
//! stateless HTTP server. Uploaded files live in a store ([`store`]: a directory on a claim or an
//! S3 prefix, as `teifleet-job` reads them), and every batch IS an `EmbeddingJob` the server
//! creates in its namespace ([`cluster`]), read back into OpenAI's Batch object by a pure mapping
//! ([`batches::mapping`]). A restart loses nothing: there is no state but the store and the jobs.
#![forbid(unsafe_code)]

pub mod auth;
pub mod batches;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod error;
pub mod files;
pub mod ids;
pub mod paging;
pub mod server;
pub mod state;
pub mod store;

pub use error::Error;

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
