//! One request: a unary Embed, an Info (the cheapest call: no device time), or one EmbedStream
//! call carrying a batch of messages, with the priority, tenant and lane headers and the deadline on
//! it, over gRPC or (Embed and Info) TEI's HTTP API; with a retry policy, the refused attempts are
//! retried as the policy says, within the same deadline (gRPC's deadline covers every attempt of
//! a call).

use std::time::Duration;

use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_proto::v1::{EmbedRequest, EmbedResponse, InfoRequest, Metadata};
use teifleet_wire::headers;
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::attempt::Attempt;
use super::tei_http::{self, HttpClient, Routes};
use super::{Call, Connection, LoadConfig, Protocol};
use crate::inputs::Texts;
use crate::report::ServerTiming;
use crate::retry::{Backoff, Hint, RetryPolicy};
use crate::{Error, Result};

/// The client-side deadline fires this long after the gRPC deadline, so a server that answers
/// at its deadline is heard (with its own code) before the client gives up.
const CLIENT_SLACK: Duration = Duration::from_millis(5);

/// Answers carry a whole embedding; allow large ones as TEI's own clients do.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// What every request of a run carries; texts are built once.
#[derive(Clone, Debug)]
pub struct CallSpec {
    texts: Texts,
    priority: Option<AsciiMetadataValue>,
    tenant: Option<AsciiMetadataValue>,
    pool: Option<AsciiMetadataValue>,
    lane: Option<AsciiMetadataValue>,
    pub(crate) deadline: Option<Duration>,
    call: Call,
    retry: Option<RetryPolicy>,
    /// HTTP runs: the routes under the target.
    routes: Option<Routes>,
}

/// What one call came to, over all its attempts.
#[derive(Debug)]
pub struct Sent {
    /// The last attempt's code (or `DEADLINE_EXCEEDED` when the deadline ran out meanwhile).
    pub code: Code,
    pub server: Vec<ServerTiming>,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// The retry hints (`grpc-retry-pushback-ms` ≥ 0) the refusals carried.
    pub hints: Vec<Duration>,
}

impl CallSpec {
    pub fn new(config: &LoadConfig) -> Result<Self> {
        let header = |flag: &str, value: &Option<String>| match value {
            Some(v) => MetadataValue::try_from(v.as_str())
                .map(Some)
                .map_err(|e| Error::InvalidArgument(format!("{flag}: {e}"))),
            None => Ok(None),
        };
        Ok(Self {
            texts: Texts::new(&config.inputs, config.seed)?,
            priority: header("--priority", &config.priority)?,
            tenant: header("--tenant", &config.tenant)?,
            pool: header("--pool", &config.pool)?,
            lane: header("--lane", &config.lane)?,
            deadline: config.deadline,
            call: config.call,
            retry: config.retry,
            routes: match config.protocol {
                Protocol::Grpc => None,
                Protocol::Http => Some(Routes::new(&config.target)?),
            },
        })
    }

    fn embed_request(&self, index: u64) -> EmbedRequest {
        EmbedRequest { inputs: self.texts.get(index).to_owned(), truncate: true, ..Default::default() }
    }

    /// A request carrying the run's headers and `timeout` (what is left of the call's deadline).
    fn request<T>(&self, message: T, timeout: Option<Duration>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(p) = &self.priority {
            request.metadata_mut().insert(headers::PRIORITY, p.clone());
        }
        if let Some(t) = &self.tenant {
            request.metadata_mut().insert(headers::TENANT, t.clone());
        }
        if let Some(p) = &self.pool {
            request.metadata_mut().insert(headers::POOL, p.clone());
        }
        if let Some(l) = &self.lane {
            request.metadata_mut().insert(headers::LANE, l.clone());
        }
        if let Some(d) = timeout {
            request.set_timeout(d);
        }
        request
    }

    /// Sends request `index` on `connection` and waits for its answer (or the deadline, enforced
    /// here too as real gRPC clients do), retrying refusals as the run's policy says.
    pub async fn send(&self, connection: &Connection, index: u64) -> Sent {
        let mut sent = Sent { code: Code::Unknown, server: vec![], attempts: 0, hints: vec![] };
        let started = Instant::now();
        let call = self.attempts(connection, index, started, &mut sent);
        match self.deadline {
            None => call.await,
            // The deadline covers the attempts and the waits between them: a wait it cuts short
            // ends the call with DEADLINE_EXCEEDED, as in gRPC.
            Some(d) => {
                if tokio::time::timeout(d + CLIENT_SLACK, call).await.is_err() {
                    sent.code = Code::DeadlineExceeded;
                }
            }
        }
        sent
    }

    async fn attempts(&self, connection: &Connection, index: u64, started: Instant, sent: &mut Sent) {
        let mut backoff = self.retry.map(Backoff::new);
        loop {
            let left = self.deadline.map(|d| d.saturating_sub(started.elapsed()));
            if left.is_some_and(|left| left.is_zero()) {
                sent.code = Code::DeadlineExceeded;
                return;
            }
            sent.attempts += 1;
            let attempt = match connection {
                Connection::Grpc(channel) => self.grpc(channel, index, left).await,
                // The channel, and with it the connection, is dropped once the call is over.
                Connection::PerCall(dialer) => match dialer.connect().await {
                    Ok(channel) => self.grpc(&channel, index, left).await,
                    Err(_) => Attempt::refused(Code::Unavailable, Hint::Absent),
                },
                Connection::Http(client) => self.http(client, index, left).await,
            };
            sent.code = attempt.code;
            sent.server.extend(attempt.server);
            if attempt.code == Code::Ok || attempt.committed {
                return;
            }
            if let Hint::RetryAfter(hint) = attempt.hint {
                sent.hints.push(hint);
            }
            let draw = rand::random_range(0.0..1.0);
            match backoff.as_mut().and_then(|b| b.after_failure(attempt.code, attempt.hint, draw)) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => return,
            }
        }
    }

    async fn grpc(&self, channel: &Channel, index: u64, timeout: Option<Duration>) -> Attempt {
        match self.call {
            Call::Embed => self.unary(channel, index, timeout).await,
            Call::EmbedStream { batch } => self.stream(channel, index, batch, timeout).await,
            Call::Info => self.info(channel, timeout).await,
        }
    }

    async fn http(&self, client: &HttpClient, index: u64, timeout: Option<Duration>) -> Attempt {
        let Some(routes) = &self.routes else { return Attempt::refused(Code::Internal, Hint::Absent) };
        fn text(value: Option<&AsciiMetadataValue>) -> Option<&str> {
            value.and_then(|v| v.to_str().ok())
        }
        let headers = tei_http::Headers {
            priority: text(self.priority.as_ref()),
            tenant: text(self.tenant.as_ref()),
            pool: text(self.pool.as_ref()),
            lane: text(self.lane.as_ref()),
            timeout,
        };
        match self.call {
            Call::Embed => tei_http::embed(client, routes, self.texts.get(index), headers).await,
            Call::Info => tei_http::info(client, routes, headers).await,
            // Refused by LoadConfig::validate: TEI's HTTP API has no streams.
            Call::EmbedStream { .. } => Attempt::refused(Code::Unimplemented, Hint::Absent),
        }
    }

    async fn info(&self, channel: &Channel, timeout: Option<Duration>) -> Attempt {
        let mut client = InfoClient::new(channel.clone());
        match client.info(self.request(InfoRequest {}, timeout)).await {
            Ok(_) => Attempt::ok(vec![]),
            Err(status) => Attempt::failed(&status, vec![]),
        }
    }

    async fn unary(&self, channel: &Channel, index: u64, timeout: Option<Duration>) -> Attempt {
        let mut client = EmbedClient::new(channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES);
        match client.embed(self.request(self.embed_request(index), timeout)).await {
            Ok(response) => Attempt::ok(timing(&response.into_inner()).into_iter().collect()),
            Err(status) => Attempt::failed(&status, vec![]),
        }
    }

    async fn stream(&self, channel: &Channel, index: u64, n: usize, timeout: Option<Duration>) -> Attempt {
        let mut client = EmbedClient::new(channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES);
        let messages: Vec<EmbedRequest> = (0..n as u64).map(|k| self.embed_request(index + k)).collect();
        let mut answers = match client.embed_stream(self.request(tokio_stream::iter(messages), timeout)).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Attempt::failed(&status, vec![]),
        };
        let mut timings = Vec::with_capacity(n);
        let mut received = 0;
        loop {
            match answers.message().await {
                Ok(Some(answer)) => {
                    received += 1;
                    timings.extend(timing(&answer));
                }
                Ok(None) => break,
                Err(status) => return Attempt::failed(&status, timings).committed(),
            }
        }
        if received == n {
            Attempt::ok(timings)
        } else {
            Attempt::failed(&stream_short(received, n), timings).committed()
        }
    }
}

/// A stream that ended early without an error status is a server bug; count it as one.
fn stream_short(received: usize, expected: usize) -> Status {
    Status::internal(format!("stream ended after {received} of {expected} answers"))
}

fn timing(response: &EmbedResponse) -> Option<ServerTiming> {
    let Metadata { queue_time_ns, inference_time_ns, .. } = response.metadata?;
    // TEI fills both; an answer without them (another server) has no split to report.
    (queue_time_ns > 0 || inference_time_ns > 0).then(|| ServerTiming {
        queue: Duration::from_nanos(queue_time_ns),
        inference: Duration::from_nanos(inference_time_ns),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_goes_on_every_request_and_only_query_or_ingest_is_one() {
        let config = LoadConfig { lane: Some("ingest".into()), ..LoadConfig::closed("http://127.0.0.1:1", 1, 1) };
        config.validate().unwrap();
        assert_eq!(config.info().lane.as_deref(), Some("ingest"));
        let request = CallSpec::new(&config).unwrap().request(InfoRequest {}, None);
        assert_eq!(request.metadata().get(headers::LANE).and_then(|v| v.to_str().ok()), Some("ingest"));
        let bulk = LoadConfig { lane: Some("bulk".into()), ..config };
        assert!(matches!(bulk.validate(), Err(Error::InvalidArgument(why)) if why.contains("--lane")));
    }
}
