//! The crate's one error type. Every variant that concerns a file or object names it, so the one
//! line a failed run prints says where to look.

use std::path::PathBuf;

/// Why a run (or one of its steps) failed. Per-row problems are not errors: they become the row's
/// `error` in the output.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag's value is unusable.
    #[error("--{flag}: {reason}")]
    InvalidFlag { flag: &'static str, reason: String },

    /// An S3 access key is half set.
    #[error("S3 credentials: {0}")]
    Credentials(String),

    /// A store could not be opened, listed, read or written.
    #[error("{url}: {source}")]
    Store {
        url: String,
        #[source]
        source: object_store::Error,
    },

    /// The input prefix holds nothing to embed.
    #[error("{url}: no input objects (names starting with `.` or `_` are ignored)")]
    NoInput { url: String },

    /// A Parquet input or output file could not be read or written.
    #[error("{url}: {source}")]
    Parquet {
        url: String,
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// A Parquet input lacks a column the flags name.
    #[error("{url}: no column `{column}` (it has: {available})")]
    MissingColumn { url: String, column: String, available: String },

    /// A Parquet input's text column holds something other than strings or bytes.
    #[error("{url}: column `{column}` is {found}, not a string column")]
    NotText { url: String, column: String, found: String },

    /// Arrow could not build or encode a batch (a bug, or memory exhausted).
    #[error("building an Arrow batch: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),

    /// The pool refused a call for a reason retrying cannot fix, or kept failing past the retry
    /// budget.
    #[error("pool {pool}: {status_code:?}: {message}")]
    Pool { pool: String, status_code: tonic::Code, message: String },

    /// The worker was asked to stop (SIGTERM: its pod is being deleted, as for a suspended job or
    /// a cancelled batch) before its shards were done; the shard it was on is redone by the next run.
    #[error("stopped before shard {shard} was done (the next run redoes it)")]
    Stopped { shard: u32 },

    /// The pool's HTTP port kept failing to answer past the retry budget (openai-batch input).
    #[error("pool {url}: {message}")]
    PoolHttp { url: String, message: String },

    /// The pool's answer does not follow EmbedArrow's contract.
    #[error("pool {pool}: malformed EmbedArrow answer: {reason}")]
    MalformedAnswer { pool: String, reason: String },

    /// The output prefix holds a part made from other input (another job's, or this input cut
    /// into other shards).
    #[error("{url} was written from {written_from}, not {expected}: write this job to an empty --output")]
    ForeignPart { url: String, written_from: String, expected: String },

    /// The progress file could not be written.
    #[error("progress file {path}: {source}")]
    Progress {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The job's progress ConfigMap could not be patched (its Role, or the API server).
    #[error("cannot report progress to ConfigMap {name}: {message}")]
    ProgressConfigMap { name: String, message: String },

    /// The API key file could not be read.
    #[error("API key file {path}: {reason}")]
    ApiKey { path: PathBuf, reason: String },
}

impl Error {
    /// An error naming the flag whose value is unusable.
    pub(crate) fn flag(flag: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidFlag { flag, reason: reason.into() }
    }
}
