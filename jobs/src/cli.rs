//! `teifleet-job run`'s flags, exactly as the operator renders them, and how they become a
//! [`Worker`] and its progress sink.

use std::path::PathBuf;

use clap::ArgAction;

use crate::embed::PoolClient;
use crate::openai_batch::{BatchClient, BatchSettings};
use crate::progress::FileSink;
use crate::settings::{Dtype, EmbedOptions, Fields, InputFormat, Lane, PoolSettings};
use crate::size::parse_bytes;
use crate::store::{S3Credentials, S3Settings, Store, StoreRole};
use crate::worker::{JobSettings, Worker};
use crate::{Error, Result};

/// One worker's flags.
/// `--calls-in-flight`'s defaults: EmbedArrow calls of up to `--rows-per-call` rows each, and
/// openai-batch request lines (one or a few inputs each).
pub const ARROW_CALLS_IN_FLIGHT: usize = 4;
pub const BATCH_LINES_IN_FLIGHT: usize = 128;

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// gRPC address of the pool's Service, e.g. http://bge.ns.svc:50051.
    #[arg(long)]
    pub pool_url: String,
    /// The pool's name (the tei-manager target's instance name).
    #[arg(long)]
    pub pool: String,
    /// file:///path/corpus.jsonl, file:///path/dir/, s3://bucket/prefix/ or s3://bucket/key.
    #[arg(long)]
    pub input: String,
    #[arg(long, value_enum)]
    pub input_format: InputFormat,
    /// The pool Service's HTTP port, e.g. http://10.0.0.7:8000: where openai-batch lines go
    /// (`POST /v1/embeddings`). Needed for --input-format=openai-batch, unused otherwise.
    #[arg(long)]
    pub pool_http_url: Option<String>,
    /// The pool's model id: an openai-batch line whose `body.model` is another is not sent (its
    /// error is `model_not_found`). Needed for --input-format=openai-batch, unused otherwise.
    #[arg(long)]
    pub model: Option<String>,
    /// The id's JSON key or Parquet column.
    #[arg(long, default_value = "id")]
    pub id_field: String,
    /// The text's JSON key or Parquet column.
    #[arg(long, default_value = "text")]
    pub text_field: String,
    /// file:///path/dir/ or s3://bucket/prefix/: one part-NNNNNN.parquet per shard goes under it.
    #[arg(long)]
    pub output: String,
    /// This worker's index, below --workers (an Indexed Job sets JOB_COMPLETION_INDEX).
    #[arg(long, env = "JOB_COMPLETION_INDEX", default_value_t = 0)]
    pub worker: u32,
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// JSONL shard size: bytes, or a quantity such as 8Mi.
    #[arg(long, default_value = "8Mi", value_parser = parse_bytes)]
    pub shard_bytes: u64,
    /// Rows per EmbedArrow call.
    #[arg(long, default_value_t = 512)]
    pub rows_per_call: usize,
    /// The largest gRPC message the pool takes and sends (the multiplexer's --max-message-bytes):
    /// each call is cut so its request and its answer fit, and a text no call can carry is its
    /// row's error. Bytes, or a quantity such as 4Mi.
    #[arg(long, default_value = "4Mi", value_parser = parse_bytes)]
    pub max_message_bytes: u64,
    /// Calls in flight at once: EmbedArrow calls of up to --rows-per-call rows (default 4), or for
    /// openai-batch, request lines (default 128): each line is one call of its own few inputs, and
    /// a replica's batches fill only with dozens of them at once.
    #[arg(long)]
    pub calls_in_flight: Option<usize>,
    /// Unit-length vectors (`--normalize=false` to turn off).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub normalize: bool,
    /// Cut texts longer than the model takes instead of failing their rows.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub truncate: bool,
    /// Matryoshka dimensions to keep.
    #[arg(long)]
    pub dimensions: Option<u32>,
    /// A prompt configured on the model, put before each text.
    #[arg(long)]
    pub prompt_name: Option<String>,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: Dtype,
    /// The admission lane (sent as x-teifleet-lane).
    #[arg(long, value_enum, default_value = "ingest")]
    pub lane: Lane,
    /// A file holding the API key, sent as `authorization: Bearer <key>`.
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    #[arg(long)]
    pub input_s3_endpoint: Option<String>,
    #[arg(long, default_value = "us-east-1")]
    pub input_s3_region: String,
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub input_s3_allow_http: bool,
    #[arg(long)]
    pub output_s3_endpoint: Option<String>,
    #[arg(long, default_value = "us-east-1")]
    pub output_s3_region: String,
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub output_s3_allow_http: bool,
    /// After each finished shard, this worker's progress goes to this file as JSON.
    #[arg(long)]
    pub progress_file: Option<PathBuf>,
    /// After each finished shard, the plan and that shard go into this ConfigMap's data (the
    /// job's `<job>-progress`, in the namespace of `POD_NAMESPACE`), where the operator reads them.
    #[arg(long = "progress-configmap")]
    pub progress_config_map: Option<String>,
    /// The pod's namespace, from the downward API.
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
}

impl RunArgs {
    /// The worker and its progress sink. `environment` looks up the S3 credential variables
    /// (the process environment in the binary). Call it within a Tokio runtime: the pool's
    /// channel starts its connection task there.
    pub fn into_worker(self, environment: impl Fn(&str) -> Option<String>) -> Result<(Worker, Option<FileSink>)> {
        let input_s3 = S3Settings {
            endpoint: self.input_s3_endpoint.clone(),
            region: self.input_s3_region.clone(),
            allow_http: self.input_s3_allow_http,
            credentials: S3Credentials::from_env(StoreRole::Input, &environment)?,
        };
        let output_s3 = S3Settings {
            endpoint: self.output_s3_endpoint.clone(),
            region: self.output_s3_region.clone(),
            allow_http: self.output_s3_allow_http,
            credentials: S3Credentials::from_env(StoreRole::Output, &environment)?,
        };
        let input = Store::open(StoreRole::Input, &self.input, &input_s3)?;
        let output = Store::open(StoreRole::Output, &self.output, &output_s3)?;
        let pool_settings = self.pool_settings()?;
        let batch = match self.input_format {
            InputFormat::OpenaiBatch => Some(BatchClient::new(self.batch_settings(&pool_settings)?)?),
            InputFormat::Jsonl | InputFormat::Parquet => None,
        };
        let pool = PoolClient::new(pool_settings)?;
        let calls_in_flight = self.calls_in_flight();
        let settings = JobSettings {
            format: self.input_format,
            fields: Fields { id: self.id_field, text: self.text_field },
            worker: self.worker,
            workers: self.workers,
            shard_bytes: self.shard_bytes,
            rows_per_call: self.rows_per_call,
            calls_in_flight,
            max_message_bytes: self.max_message_bytes,
        };
        let sink = self.progress_file.map(FileSink::new);
        let worker = Worker::new(settings, input, output, pool)?;
        let worker = match batch {
            Some(batch) => worker.with_batch_client(batch),
            None => worker,
        };
        Ok((worker, sink))
    }

    /// `--calls-in-flight`, or its default for the input's format.
    pub fn calls_in_flight(&self) -> usize {
        self.calls_in_flight.unwrap_or(match self.input_format {
            InputFormat::OpenaiBatch => BATCH_LINES_IN_FLIGHT,
            InputFormat::Jsonl | InputFormat::Parquet => ARROW_CALLS_IN_FLIGHT,
        })
    }

    /// The openai-batch client's settings: its URL and model from their flags, the lane, key
    /// and retry budget as the gRPC path has them.
    pub fn batch_settings(&self, pool: &PoolSettings) -> Result<BatchSettings> {
        let needed = |flag| Error::flag(flag, "needed for --input-format=openai-batch");
        let url = self.pool_http_url.clone().ok_or_else(|| needed("pool-http-url"))?;
        let model = self.model.clone().ok_or_else(|| needed("model"))?;
        Ok(BatchSettings {
            lane: pool.lane,
            api_key: pool.api_key.clone(),
            retry_budget: pool.retry_budget,
            ..BatchSettings::new(url, model)
        })
    }

    /// The pool's settings, the API key read from its file.
    pub fn pool_settings(&self) -> Result<PoolSettings> {
        let api_key = self.api_key_file.as_deref().map(read_api_key).transpose()?;
        Ok(PoolSettings {
            url: self.pool_url.clone(),
            pool: self.pool.clone(),
            lane: self.lane,
            api_key,
            options: EmbedOptions {
                normalize: self.normalize,
                truncate: self.truncate,
                dimensions: self.dimensions,
                prompt_name: self.prompt_name.clone(),
                dtype: self.dtype,
            },
            retry_budget: PoolSettings::DEFAULT_RETRY_BUDGET,
        })
    }
}

/// The key, without the newline a Secret's file often ends with.
fn read_api_key(path: &std::path::Path) -> Result<String> {
    let error = |reason: String| Error::ApiKey { path: path.to_owned(), reason };
    let key = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(error("empty".to_owned()));
    }
    Ok(key.to_owned())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        run: RunArgs,
    }

    const REQUIRED: [&str; 7] = [
        "teifleet-job",
        "--pool-url=http://bge.ns.svc:50051",
        "--pool=bge",
        "--input=file:///data/input/corpus.jsonl",
        "--input-format=jsonl",
        "--output",
        "s3://bucket/vectors/",
    ];

    fn parse(extra: &[&str]) -> RunArgs {
        Command::try_parse_from(REQUIRED.iter().chain(extra)).unwrap().run
    }

    #[test]
    fn defaults_are_the_contracts() {
        let args = parse(&["--workers", "4", "--worker=3"]);
        assert_eq!((args.id_field.as_str(), args.text_field.as_str()), ("id", "text"));
        assert_eq!(args.shard_bytes, 8 << 20);
        assert_eq!(args.rows_per_call, 512);
        assert_eq!(args.max_message_bytes, 4 << 20);
        assert!(args.normalize && !args.truncate);
        assert_eq!((args.dtype, args.lane), (Dtype::F32, Lane::Ingest));
        assert_eq!((args.worker, args.workers), (3, 4));
        assert_eq!(args.input_s3_region, "us-east-1");
        assert!(!args.input_s3_allow_http && !args.output_s3_allow_http);
    }

    #[test]
    fn boolean_flags_take_a_bare_or_explicit_value() {
        let args = parse(&["--normalize=false", "--truncate", "--output-s3-allow-http"]);
        assert!(!args.normalize && args.truncate && args.output_s3_allow_http);
        let args = parse(&["--normalize", "--truncate=false", "--input-s3-allow-http=true"]);
        assert!(args.normalize && !args.truncate && args.input_s3_allow_http);
    }

    #[test]
    fn sizes_and_options_parse() {
        let args = parse(&[
            "--shard-bytes=512Ki",
            "--rows-per-call=64",
            "--dimensions=256",
            "--prompt-name=query",
            "--dtype=f16",
            "--lane=query",
            "--output-s3-endpoint=http://seaweedfs:8333",
            "--output-s3-region=eu-west-1",
        ]);
        assert_eq!(args.shard_bytes, 512 << 10);
        let pool = args.pool_settings().unwrap();
        assert_eq!(pool.options.dimensions, Some(256));
        assert_eq!(pool.options.prompt_name.as_deref(), Some("query"));
        assert_eq!((pool.options.dtype, pool.lane), (Dtype::F16, Lane::Query));
        assert_eq!(pool.retry_budget, std::time::Duration::from_secs(600));
        assert!(Command::try_parse_from(REQUIRED.iter().chain(&["--shard-bytes=lots"])).is_err());
    }

    #[tokio::test]
    async fn the_flags_make_a_worker_with_its_stores() {
        let env = |name: &str| match name {
            "TEIFLEET_OUTPUT_S3_ACCESS_KEY_ID" => Some("id".to_owned()),
            "TEIFLEET_OUTPUT_S3_SECRET_ACCESS_KEY" => Some("secret".to_owned()),
            _ => None,
        };
        let args = parse(&[
            "--output-s3-endpoint=http://seaweedfs:8333",
            "--output-s3-allow-http",
            "--progress-file=/tmp/p.json",
        ]);
        let (_worker, sink) = args.into_worker(env).unwrap();
        assert!(sink.is_some());

        // A plain-HTTP endpoint without --output-s3-allow-http is refused, naming the URL.
        let args = parse(&["--output-s3-endpoint=http://seaweedfs:8333"]);
        let error = args.into_worker(env).unwrap_err().to_string();
        assert!(error.starts_with("s3://bucket/vectors/: ") && error.contains("allow-http"), "{error}");

        let args = parse(&["--worker=4", "--workers=4"]);
        assert_eq!(args.into_worker(env).unwrap_err().to_string(), "--worker: 4 is not below --workers 4");
    }

    #[tokio::test]
    async fn openai_batch_takes_the_pools_http_url_and_model() {
        let batch = |extra: &[&str]| {
            let mut args = parse(extra);
            args.input_format = InputFormat::OpenaiBatch;
            args
        };
        let args = batch(&["--pool-http-url=http://10.0.0.7:8000", "--model=BAAI/bge-small-en-v1.5", "--lane=query"]);
        let settings = args.batch_settings(&args.pool_settings().unwrap()).unwrap();
        assert_eq!(
            (settings.pool_http_url.as_str(), settings.model.as_str()),
            ("http://10.0.0.7:8000", "BAAI/bge-small-en-v1.5")
        );
        assert_eq!((settings.lane, settings.max_answer_bytes), (Lane::Query, 64 << 20));
        // Lines are calls of a few inputs each: many more at once than EmbedArrow's calls.
        assert_eq!((args.calls_in_flight(), parse(&[]).calls_in_flight()), (128, 4));
        assert_eq!(batch(&["--calls-in-flight=8"]).calls_in_flight(), 8);
        let env = |_: &str| None;
        assert!(args.into_worker(env).is_ok());
        let error = batch(&["--model=m"]).into_worker(env).unwrap_err().to_string();
        assert_eq!(error, "--pool-http-url: needed for --input-format=openai-batch");
        let error = batch(&["--pool-http-url=http://p:8000"]).into_worker(env).unwrap_err().to_string();
        assert_eq!(error, "--model: needed for --input-format=openai-batch");
        let parsed = Command::try_parse_from([
            "teifleet-job",
            "--pool-url=http://p:50051",
            "--pool=p",
            "--input=file:///x",
            "--input-format=openai-batch",
            "--output=file:///o/",
        ])
        .unwrap();
        assert_eq!(parsed.run.input_format, InputFormat::OpenaiBatch);
        assert!(parse(&[]).into_worker(env).is_ok(), "other formats need neither flag");
    }

    #[test]
    fn the_api_key_is_read_and_trimmed() {
        let path = std::env::temp_dir().join(format!("teifleet-job-key-{}", std::process::id()));
        std::fs::write(&path, "s3cr3t\n").unwrap();
        let args = parse(&[&format!("--api-key-file={}", path.display())]);
        assert_eq!(args.pool_settings().unwrap().api_key.as_deref(), Some("s3cr3t"));
        std::fs::write(&path, "\n").unwrap();
        assert!(args.pool_settings().unwrap_err().to_string().ends_with(": empty"));
        std::fs::remove_file(&path).unwrap();
    }
}
