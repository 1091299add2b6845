//! The pool's bulk path: tei-manager's `EmbedArrow` on the pool's gRPC Service, with the lane and
//! key in the metadata, each call retried through transient failures for up to the retry budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow_array::Array as _;
use bytes::Bytes;
use teifleet_proto::tei_multiplexer::v1 as mux;
use teifleet_proto::tei_multiplexer::v1::tei_multiplexer_client::TeiMultiplexerClient;
use teifleet_wire::headers::{LANE, POOL};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use super::ipc::{Answer, decode_answer, encode_texts};
use super::retry::{Backoff, Verdict, verdict};
use crate::settings::{Dtype, PoolSettings};
use crate::{Error, Result};

/// How long one call may take before it counts as timed out (and is retried). A full call under
/// the ingest lane may wait its turn behind queries for a while; this only catches a stuck one.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// The largest answer accepted: rows-per-call vectors of the model's size, with room to spare.
const MAX_MESSAGE_BYTES: usize = 256 << 20;
/// What the dimension probe embeds.
const PROBE_TEXT: &str = "teifleet-job dimension probe";
/// Load refusals in a row after which a call of several rows is split rather than retried whole.
pub const SHED_BEFORE_SPLIT: u32 = 3;

/// The pool refused a call for its size: its code and message, for the row error of a single
/// row refused so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    pub code: tonic::Code,
    pub message: String,
}

/// A client of one pool, cheap to share between concurrent calls.
#[derive(Debug, Clone)]
pub struct PoolClient {
    client: TeiMultiplexerClient<Channel>,
    settings: PoolSettings,
    lane: MetadataValue<Ascii>,
    pool_name: MetadataValue<Ascii>,
    authorization: Option<MetadataValue<Ascii>>,
    /// EmbedArrow calls sent, retries and split halves included (for the run's summary).
    calls: Arc<AtomicU64>,
}

impl PoolClient {
    /// A client for the pool. It connects on the first call, so a pool that is not up yet is
    /// waited for like any other transient failure.
    pub fn new(settings: PoolSettings) -> Result<Self> {
        if !settings.url.starts_with("http://") {
            return Err(Error::flag("pool-url", format!("{:?}: expected http://host:port", settings.url)));
        }
        let endpoint = Endpoint::from_shared(settings.url.clone())
            .map_err(|error| Error::flag("pool-url", format!("{:?}: {error}", settings.url)))?
            .connect_timeout(Duration::from_secs(10))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        let client = TeiMultiplexerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let lane = MetadataValue::from_static(settings.lane.as_str());
        let pool_name = settings
            .pool
            .parse()
            .map_err(|_| Error::flag("pool", format!("{:?}: not a name a header can carry", settings.pool)))?;
        let authorization = match &settings.api_key {
            Some(key) => Some(
                format!("Bearer {key}")
                    .parse()
                    .map_err(|_| Error::flag("api-key-file", "the key holds characters a header cannot carry"))?,
            ),
            None => None,
        };
        Ok(Self { client, settings, lane, pool_name, authorization, calls: Arc::default() })
    }

    /// Embeds `texts`: one answer row per text, in order. A call the pool refuses for its size
    /// is a failure here (the probe's one short text is never too large); [`Self::embed_sized`]
    /// tells it apart so the caller can split the call.
    pub async fn embed(&self, texts: &[&str]) -> Result<Answer> {
        match self.embed_sized(texts).await? {
            Ok(answer) => Ok(answer),
            Err(too_large) => Err(Error::Pool {
                pool: self.settings.pool.clone(),
                status_code: too_large.code,
                message: too_large.message,
            }),
        }
    }

    /// Embeds `texts`, or says the pool refused the call for its size: OUT_OF_RANGE (a message
    /// over the pool's limit, either way), RESOURCE_EXHAUSTED with a negative retry pushback (a
    /// call that will never fit), or RESOURCE_EXHAUSTED [`SHED_BEFORE_SPLIT`] times in a row on
    /// a call of several rows (the memory budget may refuse the call for its size, and smaller
    /// calls fit where one large one waits for room). Retrying such a call whole would fail the
    /// same way: the caller splits it.
    pub async fn embed_sized(&self, texts: &[&str]) -> Result<Result<Answer, TooLarge>> {
        let ipc = encode_texts(texts)?;
        let started = Instant::now();
        let mut backoff = Backoff::default();
        let mut shed_in_a_row = 0u32;
        loop {
            let status = match self.call_once(ipc.clone()).await {
                Ok(answer) => {
                    return decode_answer(&answer.arrow_ipc, texts.len(), self.settings.options.dtype)
                        .map(Ok)
                        .map_err(|reason| Error::MalformedAnswer { pool: self.settings.pool.clone(), reason });
                }
                Err(status) => status,
            };
            let verdict = verdict(&status);
            shed_in_a_row = if status.code() == tonic::Code::ResourceExhausted { shed_in_a_row + 1 } else { 0 };
            let too_large = match verdict {
                Verdict::TooLarge => true,
                Verdict::Retry { .. } => texts.len() > 1 && shed_in_a_row >= SHED_BEFORE_SPLIT,
                Verdict::Fail => false,
            };
            if too_large {
                return Ok(Err(TooLarge { code: status.code(), message: status.message().to_owned() }));
            }
            let wait = match verdict {
                Verdict::Fail | Verdict::TooLarge => return Err(self.failure(&status, "")),
                Verdict::Retry { hint } => hint.unwrap_or_else(|| backoff.next_wait()),
            };
            let elapsed = started.elapsed();
            if elapsed + wait > self.settings.retry_budget {
                return Err(self.failure(&status, &format!(" (still failing after {}s of retries)", elapsed.as_secs())));
            }
            tracing::warn!(
                pool = %self.settings.pool,
                code = ?status.code(),
                message = %describe(&status),
                wait_ms = wait.as_millis() as u64,
                "EmbedArrow failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// The vectors' length, learnt by embedding one short text: needed to type the output's
    /// `embedding` column even for a shard whose every row fails.
    pub async fn probe_dimensions(&self) -> Result<usize> {
        let answer = self.embed(&[PROBE_TEXT]).await?;
        if answer.embeddings.is_valid(0) {
            return Ok(answer.dimensions());
        }
        let reason = if answer.errors.is_valid(0) { answer.errors.value(0) } else { "no vector" };
        Err(Error::Pool {
            pool: self.settings.pool.clone(),
            status_code: tonic::Code::Ok,
            message: format!("refused the probe text {PROBE_TEXT:?}: {reason}"),
        })
    }

    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// EmbedArrow calls sent so far by this client and its clones.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    async fn call_once(&self, arrow_ipc: Bytes) -> Result<mux::EmbedArrowResponse, Status> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let options = &self.settings.options;
        let message = mux::EmbedArrowRequest {
            target: Some(mux::Target { routing: Some(mux::target::Routing::InstanceName(self.settings.pool.clone())) }),
            arrow_ipc,
            truncate: options.truncate,
            normalize: options.normalize,
            prompt_name: options.prompt_name.clone(),
            dimensions: options.dimensions,
            output_dtype: match options.dtype {
                Dtype::F32 => mux::OutputDtype::F32,
                Dtype::F16 => mux::OutputDtype::F16,
            } as i32,
            ..Default::default()
        };
        let mut request = Request::new(message);
        // No `grpc-timeout`: an ingest call without a deadline is the patient kind, which the pool
        // queues however full its queue is and never refuses for load; with one, each sub-batch
        // would be held to the pool's queue timeout like a query, and one refused fails the whole
        // call, which is then sent again in full (bench scenario 20 measured 186,000 rows embedded
        // for 100,000 written). A call stuck past CALL_TIMEOUT is dropped below, which resets its
        // stream, so the pool stops working on it then too.
        request.metadata_mut().insert(LANE, self.lane.clone());
        // The pool by name too: an activator holding calls for a pool at zero tells pools apart
        // by it (the worker dials the Service's ClusterIP, which names no pool).
        request.metadata_mut().insert(POOL, self.pool_name.clone());
        if let Some(authorization) = &self.authorization {
            request.metadata_mut().insert("authorization", authorization.clone());
        }
        let mut client = self.client.clone();
        match tokio::time::timeout(CALL_TIMEOUT, client.embed_arrow(request)).await {
            Ok(answer) => answer.map(tonic::Response::into_inner),
            Err(_) => Err(Status::deadline_exceeded(format!("no answer in {}s", CALL_TIMEOUT.as_secs()))),
        }
    }

    fn failure(&self, status: &Status, suffix: &str) -> Error {
        Error::Pool {
            pool: self.settings.pool.clone(),
            status_code: status.code(),
            message: format!("{}{suffix}", describe(status)),
        }
    }
}

/// A status's message, with the cause of a transport failure (whose message alone is vague).
fn describe(status: &Status) -> String {
    match std::error::Error::source(status) {
        Some(cause) if status.message().is_empty() => cause.to_string(),
        Some(cause) => format!("{}: {cause}", status.message()),
        None => status.message().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_pool_urls_are_taken() {
        let error = PoolClient::new(PoolSettings::new("https://pool:50051", "p")).unwrap_err().to_string();
        assert_eq!(error, "--pool-url: \"https://pool:50051\": expected http://host:port");
        assert!(PoolClient::new(PoolSettings::new("pool:50051", "p")).is_err());
    }

    #[tokio::test]
    async fn an_unreachable_pool_fails_once_the_retry_budget_is_spent() {
        let settings =
            PoolSettings { retry_budget: Duration::from_millis(600), ..PoolSettings::new("http://127.0.0.1:9", "bge") };
        let started = Instant::now();
        let error = PoolClient::new(settings).unwrap().embed(&["x"]).await.unwrap_err().to_string();
        assert!(error.starts_with("pool bge: "), "{error}");
        assert!(error.contains("still failing after"), "{error}");
        assert!(started.elapsed() >= Duration::from_millis(100), "it waited and retried first");
    }
}
