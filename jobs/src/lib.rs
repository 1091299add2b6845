//! teifleet's embedding-job runner (issue 33): one worker of an `EmbeddingJob`. The operator runs
//! N of them as an Indexed Job; each plans the whole job the same way from the input's listing
//! ([`plan`]), takes the shards whose number is its index modulo N, and for each one that has no
//! output yet reads its rows ([`input`]), embeds them through the pool's bulk path ([`embed`]) and
//! writes one Parquet part ([`output`]), reporting [`progress`] as it goes ([`worker`]).
#![forbid(unsafe_code)]

pub mod cli;
pub mod embed;
pub mod error;
pub mod input;
pub mod listing;
pub mod openai_batch;
pub mod output;
pub mod plan;
pub mod progress;
pub mod progress_config_map;
pub mod settings;
pub mod shard;
pub mod size;
pub mod store;
pub mod worker;

pub use error::Error;

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
