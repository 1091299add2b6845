//! Calling the pool: EmbedArrow's payloads, the retry policy, how large a call may be, and the
//! client.

pub mod ipc;
pub mod pool;
pub mod retry;
pub mod sizing;

pub use ipc::Answer;
pub use pool::{PoolClient, TooLarge};
pub use sizing::CallSize;
