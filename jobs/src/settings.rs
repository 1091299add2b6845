//! The choices a job's flags make, as the library takes them (the binary's clap flags in
//! [`crate::cli`] fill these in).

use std::time::Duration;

/// The input's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InputFormat {
    /// One JSON object per line; shards are byte ranges.
    Jsonl,
    /// Parquet files; shards are row groups.
    Parquet,
    /// OpenAI Batch API request lines for `/v1/embeddings` (`--input-format=openai-batch`);
    /// shards are byte ranges, as for JSONL, and each line's body goes to the pool's OpenAI route.
    OpenaiBatch,
}

/// The names of the id and text fields (JSONL keys, Parquet columns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    pub id: String,
    pub text: String,
}

impl Default for Fields {
    fn default() -> Self {
        Self { id: "id".to_owned(), text: "text".to_owned() }
    }
}

/// The element type of the vectors asked for and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Dtype {
    #[default]
    F32,
    F16,
}

/// The admission lane the pool queues the job's calls in (`x-teifleet-lane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Lane {
    /// Interactive traffic's lane, served first.
    Query,
    /// Bulk work: takes the room queries leave, and waits rather than being refused.
    #[default]
    Ingest,
}

impl Lane {
    /// The metadata value, as the multiplexer reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Query => "query",
            Self::Ingest => "ingest",
        }
    }
}

/// What every EmbedArrow call asks of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedOptions {
    pub normalize: bool,
    pub truncate: bool,
    /// Matryoshka truncation of the vectors; none: the model's full size.
    pub dimensions: Option<u32>,
    pub prompt_name: Option<String>,
    pub dtype: Dtype,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        Self { normalize: true, truncate: false, dimensions: None, prompt_name: None, dtype: Dtype::F32 }
    }
}

/// How to reach the pool and call it.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// `http://host:port` of the pool's gRPC Service.
    pub url: String,
    /// The pool's name: the tei-manager target's instance name.
    pub pool: String,
    pub lane: Lane,
    /// Sent as `authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    pub options: EmbedOptions,
    /// How long one call may keep failing with retryable errors before the run gives up.
    pub retry_budget: Duration,
}

impl PoolSettings {
    /// Ten minutes: long enough to ride out a pool's rollout or a scale-up from zero.
    pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(600);

    /// Settings for `pool` at `url`, everything else at its default.
    pub fn new(url: impl Into<String>, pool: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            pool: pool.into(),
            lane: Lane::default(),
            api_key: None,
            options: EmbedOptions::default(),
            retry_budget: Self::DEFAULT_RETRY_BUDGET,
        }
    }
}
