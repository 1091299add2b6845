//! The pool's OpenAI route: `POST <pool-http-url>/v1/embeddings` over HTTP/1.1 (the workspace's
//! hyper client), one line's body per call, its answer read up to a bound. A pool shedding load
//! (429, 503, or holding a call past [`CALL_TIMEOUT`]) is waited out for as long as it takes: the
//! job's `spec.deadline` bounds the job, and a batch's lines are bulk work that should wait rather
//! than fail. A pool that cannot be reached (connection errors, 502, 504) is retried for up to the
//! retry budget, as the gRPC path does. Any other answer is the line's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use teifleet_wire::headers::LANE;

use super::line::ENDPOINT;
use crate::embed::retry::Backoff;
use crate::settings::Lane;
use crate::{Error, Result};

/// How long one call may take to answer before it is dropped and tried again. The ingest lane
/// may hold a call behind queries for a while; this only catches a stuck one.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `Retry-After` honoured: a pool asking for more is asked again sooner.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The shortest wait after a load refusal, whatever `Retry-After` says: a pool answering
/// `Retry-After: 0` to every call is not hammered.
const SHORTEST_WAIT: Duration = Duration::from_millis(50);

/// How to reach the pool's HTTP port and what to ask it.
#[derive(Debug, Clone)]
pub struct BatchSettings {
    /// `http://host:port` of the pool Service's HTTP port.
    pub pool_http_url: String,
    /// The pool's model: lines asking for another are not sent.
    pub model: String,
    pub lane: Lane,
    /// Sent as `authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// The largest answer read for one line; a larger one is that line's error.
    pub max_answer_bytes: usize,
    /// How long a call may keep failing to reach the pool before the run gives up.
    pub retry_budget: Duration,
}

impl BatchSettings {
    /// 2048 inputs of 1024 dimensions as JSON floats are about 20 MB: room for that and more.
    pub const DEFAULT_MAX_ANSWER_BYTES: usize = 64 << 20;

    pub fn new(pool_http_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            pool_http_url: pool_http_url.into(),
            model: model.into(),
            lane: Lane::default(),
            api_key: None,
            max_answer_bytes: Self::DEFAULT_MAX_ANSWER_BYTES,
            retry_budget: crate::settings::PoolSettings::DEFAULT_RETRY_BUDGET,
        }
    }
}

/// What the pool said to one line's call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An answer, read whole: a success or an error the line keeps.
    Answered { status: StatusCode, body: Bytes },
    /// An answer over the bound, not read: `bytes` when it said its length.
    TooLarge { bytes: Option<u64> },
}

/// A client of one pool's HTTP port, cheap to share between concurrent calls.
#[derive(Debug, Clone)]
pub struct BatchClient {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    settings: BatchSettings,
    lane: HeaderValue,
    authorization: Option<HeaderValue>,
    /// Calls sent, retries included (for the run's summary).
    calls: Arc<AtomicU64>,
}

impl BatchClient {
    pub fn new(settings: BatchSettings) -> Result<Self> {
        let url = settings.pool_http_url.trim_end_matches('/');
        if !url.starts_with("http://") {
            return Err(Error::flag("pool-http-url", format!("{url:?}: expected http://host:port")));
        }
        let uri: Uri = format!("{url}{ENDPOINT}")
            .parse()
            .map_err(|error| Error::flag("pool-http-url", format!("{url:?}: {error}")))?;
        if settings.model.is_empty() {
            return Err(Error::flag("model", "must not be empty"));
        }
        let authorization = match &settings.api_key {
            Some(key) => Some(
                HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| Error::flag("api-key-file", "the key holds characters a header cannot carry"))?,
            ),
            None => None,
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        let lane = HeaderValue::from_static(settings.lane.as_str());
        Ok(Self { client, uri, settings, lane, authorization, calls: Arc::default() })
    }

    pub fn settings(&self) -> &BatchSettings {
        &self.settings
    }

    /// Calls sent so far, retries included.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Sends one line's body and reads the answer, through load refusals and transient failures.
    pub async fn post(&self, body: Bytes) -> Result<Reply> {
        let mut backoff = Backoff::default();
        // Since when calls have failed to reach the pool, with no answer between.
        let mut unreachable_since: Option<Instant> = None;
        loop {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let failure = match tokio::time::timeout(CALL_TIMEOUT, self.call_once(body.clone())).await {
                Ok(Ok(Attempt::Done(reply))) => return Ok(reply),
                Ok(Ok(Attempt::Shed { status, retry_after })) => {
                    unreachable_since = None;
                    let wait = retry_after.unwrap_or_else(|| backoff.next_wait()).max(SHORTEST_WAIT);
                    tracing::info!(%status, wait_ms = wait.as_millis() as u64, "the pool is shedding load; waiting");
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Err(_) => {
                    // Connecting has its own, shorter timeout: a call that connected and got no
                    // answer is held in the pool's queue (the ingest lane waits rather than
                    // refuses), which is load, waited out like a refusal.
                    unreachable_since = None;
                    tracing::info!(seconds = CALL_TIMEOUT.as_secs(), "no answer from the pool yet; asking again");
                    continue;
                }
                Ok(Ok(Attempt::Unreachable(reason))) | Ok(Err(reason)) => reason,
            };
            let since = *unreachable_since.get_or_insert_with(Instant::now);
            let wait = backoff.next_wait();
            if since.elapsed() + wait > self.settings.retry_budget {
                return Err(Error::PoolHttp {
                    url: self.uri.to_string(),
                    message: format!("{failure} (still failing after {}s of retries)", since.elapsed().as_secs()),
                });
            }
            tracing::warn!(url = %self.uri, %failure, wait_ms = wait.as_millis() as u64, "the pool call failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// One try. `Err` is a transport failure, worth retrying.
    async fn call_once(&self, body: Bytes) -> Result<Attempt, String> {
        let mut request = Request::post(self.uri.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(LANE, self.lane.clone())
            .body(Full::new(body))
            .map_err(|error| error.to_string())?;
        if let Some(authorization) = &self.authorization {
            request.headers_mut().insert(AUTHORIZATION, authorization.clone());
        }
        let response = self.client.request(request).await.map_err(|error| describe(&error))?;
        let status = response.status();
        if matches!(status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
            return Ok(Attempt::Shed { status, retry_after: retry_after(response.headers()) });
        }
        if matches!(status, StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT) {
            return Ok(Attempt::Unreachable(format!("HTTP {status}")));
        }
        let limit = self.settings.max_answer_bytes;
        let announced = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if announced.is_some_and(|bytes| bytes > limit as u64) {
            return Ok(Attempt::Done(Reply::TooLarge { bytes: announced }));
        }
        let mut body = response.into_body();
        let mut read = Vec::with_capacity(announced.map_or(0, |bytes| bytes as usize));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| format!("reading the answer: {}", describe(&error)))?;
            if let Ok(data) = frame.into_data() {
                if read.len() + data.len() > limit {
                    return Ok(Attempt::Done(Reply::TooLarge { bytes: None }));
                }
                read.extend_from_slice(&data);
            }
        }
        Ok(Attempt::Done(Reply::Answered { status, body: read.into() }))
    }
}

/// What one try came to.
enum Attempt {
    Done(Reply),
    /// Refused for load: try again after the hint or the backoff, however long it takes.
    Shed {
        status: StatusCode,
        retry_after: Option<Duration>,
    },
    /// A gateway in between could not reach the pool.
    Unreachable(String),
}

/// `Retry-After` in seconds (its date form is not used by the multiplexer), capped.
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(LONGEST_RETRY_AFTER))
}

/// An error and its causes on one line (hyper's own message is often just "client error").
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text = format!("{text}: {inner_text}");
        }
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_urls_are_taken() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _entered = runtime.enter();
        let client = BatchClient::new(BatchSettings::new("http://pool.ns:8000/", "bge")).unwrap();
        assert_eq!(client.uri.to_string(), "http://pool.ns:8000/v1/embeddings");
        let refused =
            |url: &str, model: &str| BatchClient::new(BatchSettings::new(url, model)).unwrap_err().to_string();
        assert!(refused("https://pool:8000", "bge").starts_with("--pool-http-url: "));
        assert!(refused("http://bad host", "bge").starts_with("--pool-http-url: "));
        assert_eq!(refused("http://pool:8000", ""), "--model: must not be empty");
    }

    /// Serves `answers` in turn, one connection each, on a port of its own; the requests (head
    /// and body) come back from the task.
    async fn serve(answers: Vec<String>) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = tokio::spawn(async move {
            let mut requests = Vec::new();
            for answer in answers {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut read = Vec::new();
                let mut buffer = [0u8; 4096];
                loop {
                    let n = socket.read(&mut buffer).await.unwrap();
                    read.extend_from_slice(&buffer[..n]);
                    let text = String::from_utf8_lossy(&read).into_owned();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| l.to_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                            .and_then(|v| v.parse::<usize>().ok())
                            .unwrap_or(0);
                        if read.len() >= end + 4 + length {
                            requests.push(text);
                            break;
                        }
                    }
                }
                let _ = socket.write_all(answer.as_bytes()).await;
            }
            requests
        });
        (url, served)
    }

    fn answer(status: &str, headers: &str, body: &str) -> String {
        format!("HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: {}\r\n{headers}\r\n{body}", body.len())
    }

    fn client(url: &str, configure: impl FnOnce(&mut BatchSettings)) -> BatchClient {
        let mut settings = BatchSettings::new(url, "bge");
        configure(&mut settings);
        BatchClient::new(settings).unwrap()
    }

    #[tokio::test]
    async fn load_refusals_are_waited_out_and_the_body_goes_verbatim() {
        let answers = vec![
            answer("429 Too Many Requests", "retry-after: 0\r\n", "{}"),
            answer("503 Service Unavailable", "retry-after: 0\r\n", "{}"),
            answer("200 OK", "content-type: application/json\r\n", r#"{"object":"list"}"#),
        ];
        let (url, served) = serve(answers).await;
        let client = client(&url, |settings| settings.api_key = Some("k3y".into()));
        let body = r#"{"model": "bge", "input": ["a"]}"#;
        let reply = client.post(Bytes::from_static(body.as_bytes())).await.unwrap();
        assert_eq!(
            reply,
            Reply::Answered { status: StatusCode::OK, body: Bytes::from_static(br#"{"object":"list"}"#) }
        );
        assert_eq!(client.calls(), 3);
        let requests = served.await.unwrap();
        assert_eq!(requests.len(), 3);
        let last = requests[2].to_lowercase();
        assert!(last.starts_with("post /v1/embeddings http/1.1\r\n"), "{last}");
        assert!(
            last.contains("x-teifleet-lane: ingest\r\n") && last.contains("authorization: bearer k3y\r\n"),
            "{last}"
        );
        assert!(requests[2].ends_with(body), "the body verbatim: {}", requests[2]);
    }

    #[tokio::test]
    async fn other_answers_are_the_lines_and_large_ones_are_not_read() {
        let too_many = r#"{"error":{"message":"too many inputs","type":"invalid_request_error"}}"#;
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n800\r\n{}\r\n0\r\n\r\n",
            "x".repeat(0x800)
        );
        let answers =
            vec![answer("413 Payload Too Large", "", too_many), answer("200 OK", "", &"y".repeat(2000)), chunked];
        let (url, _served) = serve(answers).await;
        let client = client(&url, |settings| settings.max_answer_bytes = 1000);
        let reply = client.post(Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(reply, Reply::Answered { status: StatusCode::PAYLOAD_TOO_LARGE, body: Bytes::from(too_many) });
        assert_eq!(client.post(Bytes::from_static(b"{}")).await.unwrap(), Reply::TooLarge { bytes: Some(2000) });
        assert_eq!(client.post(Bytes::from_static(b"{}")).await.unwrap(), Reply::TooLarge { bytes: None });
        assert_eq!(client.calls(), 3, "none retried");
    }

    #[tokio::test]
    async fn an_unreachable_pool_fails_the_run_past_the_retry_budget() {
        // Port 9 (discard) on loopback: nothing listens there, so the connection is refused.
        let client = client("http://127.0.0.1:9", |settings| settings.retry_budget = Duration::from_millis(500));
        let error = client.post(Bytes::from_static(b"{}")).await.unwrap_err().to_string();
        assert!(error.starts_with("pool http://127.0.0.1:9/v1/embeddings: "), "{error}");
        assert!(error.contains("still failing after"), "{error}");
        assert!(client.calls() >= 2, "retried before giving up");
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3600"));
        assert_eq!(retry_after(&headers), Some(LONGEST_RETRY_AFTER));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(retry_after(&headers), None);
    }
}
