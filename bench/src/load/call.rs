//! One request: a unary Embed, or (stream mode) one EmbedStream call carrying a batch of
//! messages, with the priority header and the deadline on it.

use std::time::Duration;

use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_proto::v1::{EmbedRequest, EmbedResponse, Metadata};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::LoadConfig;
use crate::inputs::{self, Tokens};
use crate::report::ServerTiming;
use crate::{Error, Result};

/// The client-side deadline fires this long after the gRPC deadline, so a server that answers
/// at its deadline is heard (with its own code) before the client gives up.
const CLIENT_SLACK: Duration = Duration::from_millis(5);

/// What every request of a run carries; texts are built once per size.
#[derive(Clone, Debug)]
pub struct CallSpec {
    tokens: Tokens,
    texts: Vec<(usize, String)>,
    priority: Option<AsciiMetadataValue>,
    pub(crate) deadline: Option<Duration>,
    stream_batch: Option<usize>,
}

impl CallSpec {
    pub fn new(config: &LoadConfig) -> Result<Self> {
        let priority = match &config.priority {
            Some(p) => Some(
                MetadataValue::try_from(p.as_str()).map_err(|e| Error::InvalidArgument(format!("--priority: {e}")))?,
            ),
            None => None,
        };
        let texts = config.tokens.sizes().into_iter().map(|n| (n, inputs::text(n))).collect();
        Ok(Self {
            tokens: config.tokens.clone(),
            texts,
            priority,
            deadline: config.deadline,
            stream_batch: config.stream_batch,
        })
    }

    fn text(&self, index: u64) -> String {
        let n = self.tokens.for_request(index);
        self.texts.iter().find(|(size, _)| *size == n).map(|(_, t)| t.clone()).unwrap_or_else(|| inputs::text(n))
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(p) = &self.priority {
            request.metadata_mut().insert("x-teifleet-priority", p.clone());
        }
        if let Some(d) = self.deadline {
            request.set_timeout(d);
        }
        request
    }

    /// Sends request `index` and waits for its answer (or the deadline, enforced here too as real
    /// gRPC clients do).
    pub async fn send(&self, client: &mut EmbedClient<Channel>, index: u64) -> (Code, Vec<ServerTiming>) {
        let call = async {
            match self.stream_batch {
                None => self.unary(client, index).await,
                Some(n) => self.stream(client, index, n).await,
            }
        };
        match self.deadline {
            None => call.await,
            Some(d) => tokio::time::timeout(d + CLIENT_SLACK, call).await.unwrap_or((Code::DeadlineExceeded, vec![])),
        }
    }

    async fn unary(&self, client: &mut EmbedClient<Channel>, index: u64) -> (Code, Vec<ServerTiming>) {
        let message = EmbedRequest { inputs: self.text(index), truncate: true, ..Default::default() };
        match client.embed(self.request(message)).await {
            Ok(response) => (Code::Ok, timing(&response.into_inner()).into_iter().collect()),
            Err(status) => (status.code(), vec![]),
        }
    }

    async fn stream(&self, client: &mut EmbedClient<Channel>, index: u64, n: usize) -> (Code, Vec<ServerTiming>) {
        let messages: Vec<EmbedRequest> = (0..n as u64)
            .map(|k| EmbedRequest { inputs: self.text(index + k), truncate: true, ..Default::default() })
            .collect();
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
