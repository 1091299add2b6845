//! Calling the pool: EmbedArrow's payloads, the retry policy, and the client.

pub mod ipc;
pub mod pool;
pub mod retry;

pub use ipc::Answer;
pub use pool::PoolClient;
