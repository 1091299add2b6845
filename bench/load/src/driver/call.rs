//! One request: a unary Embed, an Info (the cheapest call: no device time), or one EmbedStream
//! call carrying a batch of messages, with the priority header and the deadline on it.

use std::time::Duration;

use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_proto::v1::{EmbedRequest, EmbedResponse, InfoRequest, Metadata};
use teifleet_wire::headers;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::{Call, LoadConfig};
use crate::inputs::Texts;
use crate::report::ServerTiming;
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
    pub(crate) deadline: Option<Duration>,
    call: Call,
}

impl CallSpec {
    pub fn new(config: &LoadConfig) -> Result<Self> {
        let priority = match &config.priority {
            Some(p) => Some(
                MetadataValue::try_from(p.as_str()).map_err(|e| Error::InvalidArgument(format!("--priority: {e}")))?,
            ),
            None => None,
        };
        Ok(Self {
            texts: Texts::new(&config.inputs, config.seed)?,
            priority,
            deadline: config.deadline,
            call: config.call,
        })
    }

    fn embed_request(&self, index: u64) -> EmbedRequest {
        EmbedRequest { inputs: self.texts.get(index).to_owned(), truncate: true, ..Default::default() }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(p) = &self.priority {
            request.metadata_mut().insert(headers::PRIORITY, p.clone());
        }
        if let Some(d) = self.deadline {
            request.set_timeout(d);
        }
        request
    }

    /// Sends request `index` on `channel` and waits for its answer (or the deadline, enforced
    /// here too as real gRPC clients do).
    pub async fn send(&self, channel: &Channel, index: u64) -> (Code, Vec<ServerTiming>) {
        let call = async {
            match self.call {
                Call::Embed => self.unary(channel, index).await,
                Call::EmbedStream { batch } => self.stream(channel, index, batch).await,
                Call::Info => self.info(channel).await,
            }
        };
        match self.deadline {
            None => call.await,
            Some(d) => tokio::time::timeout(d + CLIENT_SLACK, call).await.unwrap_or((Code::DeadlineExceeded, vec![])),
        }
    }

    async fn info(&self, channel: &Channel) -> (Code, Vec<ServerTiming>) {
        let mut client = InfoClient::new(channel.clone());
        match client.info(self.request(InfoRequest {})).await {
            Ok(_) => (Code::Ok, vec![]),
            Err(status) => (status.code(), vec![]),
        }
    }

    async fn unary(&self, channel: &Channel, index: u64) -> (Code, Vec<ServerTiming>) {
        let mut client = EmbedClient::new(channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES);
        match client.embed(self.request(self.embed_request(index))).await {
            Ok(response) => (Code::Ok, timing(&response.into_inner()).into_iter().collect()),
            Err(status) => (status.code(), vec![]),
        }
    }

    async fn stream(&self, channel: &Channel, index: u64, n: usize) -> (Code, Vec<ServerTiming>) {
        let mut client = EmbedClient::new(channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES);
        let messages: Vec<EmbedRequest> = (0..n as u64).map(|k| self.embed_request(index + k)).collect();
        let mut answers = match client.embed_stream(self.request(tokio_stream::iter(messages))).await {
            Ok(response) => response.into_inner(),
            Err(status) => return (status.code(), vec![]),
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
                Err(status) => return (status.code(), timings),
            }
        }
        if received == n { (Code::Ok, timings) } else { (stream_short(received, n).code(), timings) }
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
