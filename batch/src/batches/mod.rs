//! OpenAI's Batches API: each batch IS an EmbeddingJob ([`job`] builds it, [`mapping`] reads it
//! back as a Batch object); [`create`] checks a request and its input file ([`scan`]) first,
//! [`handlers`] lists, gets and cancels.

pub mod create;
pub mod handlers;
pub mod job;
pub mod mapping;
pub mod scan;

/// The one endpoint batches run against here.
pub const ENDPOINT: &str = "/v1/embeddings";
/// The one completion window OpenAI offers, and the job's deadline.
pub const COMPLETION_WINDOW: &str = "24h";
/// [`COMPLETION_WINDOW`] in seconds.
pub const COMPLETION_WINDOW_SECONDS: i64 = 24 * 3600;
