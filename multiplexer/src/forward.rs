//! Forwarding `tei.v1` calls to a pool's upstream under its admission control.
//!
//! Unary calls take one permit for the call. Streams take one permit per message before it goes
//! upstream and give it back when that message's answer comes back (TEI answers stream messages
//! in order), so a long stream never holds more than it uses. Every exit path, including a client
//! that goes away, is counted exactly once and releases every permit it held.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use teifleet_proto::v1;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::admission::{Permit, Priority};
use crate::metrics::{Metrics, Timings};
use crate::pools::{Pool, PoolTable};
use crate::request_meta::{self, FORWARDED_BY_HEADER, RequestMeta, TIMEOUT_HEADER};
use crate::status::{self, Outcome};
use crate::{Error, Result};

/// The stream type every streaming RPC answers with.
pub type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Responses that carry TEI's timing Metadata.
pub trait TeiTimed {
    fn tei_metadata(&self) -> Option<&v1::Metadata> {
        None
    }
}

macro_rules! timed {
    ($($response:ty),*) => {$(
        impl TeiTimed for $response {
            fn tei_metadata(&self) -> Option<&v1::Metadata> {
                self.metadata.as_ref()
            }
        }
    )*};
}
timed!(v1::EmbedResponse, v1::EmbedSparseResponse, v1::EmbedAllResponse, v1::PredictResponse, v1::RerankResponse);
impl TeiTimed for v1::InfoResponse {}
impl TeiTimed for v1::EncodeResponse {}
impl TeiTimed for v1::DecodeResponse {}

/// Whether a call waits for an inference permit. Info and tokenization do not reach TEI's model
/// queue, so they pass without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Permit,
    Free,
}

pub struct Forwarder {
    pub pools: Arc<PoolTable>,
    pub metrics: Metrics,
    /// Name written into the hop marker of forwarded requests.
    pub identity: String,
    draining: AtomicBool,
}

/// Records one request's outcome exactly once; if dropped unfinished, the client went away.
struct Tracker {
    metrics: Metrics,
    pool: String,
    priority: Priority,
    rpc: &'static str,
    arrived: Instant,
    timings: Timings,
    finished: bool,
}

impl Tracker {
    fn fail(&mut self, error: Error) -> Status {
        let status = status::to_status(&error);
        self.finish(status.code(), status::outcome(&error));
        status
    }

    fn finish(&mut self, code: Code, outcome: Outcome) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.metrics.request_done(&self.pool, self.priority, self.rpc, code, outcome);
        self.timings.total = self.arrived.elapsed();
        self.metrics.timings(&self.pool, self.priority, &self.timings);
    }

    /// Records how a call that reached the upstream ended, and passes its answer on.
    fn conclude<Resp: TeiTimed>(
        &mut self,
        pool: &str,
        result: Result<Response<Resp>, Status>,
    ) -> Result<Response<Resp>, Status> {
        match result {
            Ok(response) => {
                self.observe(response.get_ref().tei_metadata());
                self.finish(Code::Ok, Outcome::Ok);
                Ok(response)
            }
            Err(status) => Err(self.fail(Error::Upstream { pool: pool.to_owned(), status })),
        }
    }

    fn observe(&mut self, metadata: Option<&v1::Metadata>) {
        if let Some(metadata) = metadata {
            self.timings.tei_queue = Some(Duration::from_nanos(metadata.queue_time_ns));
            self.timings.tei_inference = Some(Duration::from_nanos(metadata.inference_time_ns));
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.finish(Code::Cancelled, Outcome::Cancelled);
    }
}

impl Forwarder {
    pub fn new(pools: Arc<PoolTable>, metrics: Metrics, identity: String) -> Self {
        Self { pools, metrics, identity, draining: AtomicBool::new(false) }
    }

    /// New calls are refused with UNAVAILABLE from now on; calls in flight finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    fn tracker(&self, rpc: &'static str, arrived: Instant) -> Tracker {
        Tracker {
            metrics: self.metrics.clone(),
            pool: self.pools.own_name().to_owned(),
            priority: Priority::default(),
            rpc,
            arrived,
            timings: Timings::default(),
            finished: false,
        }
    }

    fn route(
        &self,
        tracker: &mut Tracker,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<(RequestMeta, Arc<Pool>)> {
        if self.is_draining() {
            return Err(Error::Draining);
        }
        let meta = request_meta::parse(metadata, tracker.arrived)?;
        tracker.priority = meta.priority;
        let pool = self.pools.resolve(&meta.target, meta.forwarded_by.as_deref())?;
        tracker.pool = pool.spec.name.clone();
        Ok((meta, pool))
    }

    /// The request as it goes upstream: the caller's metadata (minus its timeout), the remaining
    /// deadline, and the hop marker when the upstream is another multiplexer.
    fn outgoing<T>(
        &self,
        metadata: tonic::metadata::MetadataMap,
        message: T,
        meta: &RequestMeta,
        pool: &Pool,
    ) -> Request<T> {
        let mut metadata = metadata;
        metadata.remove(TIMEOUT_HEADER);
        let mut request = Request::from_parts(metadata, tonic::Extensions::default(), message);
        if let Some(deadline) = meta.deadline {
            request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        }
        if pool.spec.remote
            && let Ok(value) = MetadataValue::try_from(self.identity.as_str())
        {
            request.metadata_mut().insert(FORWARDED_BY_HEADER, value);
        }
        request
    }

    async fn admit(
        &self,
        tracker: &mut Tracker,
        pool: &Pool,
        meta: &RequestMeta,
        admit: Admit,
    ) -> Result<Option<Permit>> {
        if admit == Admit::Free {
            return Ok(None);
        }
        let permit = pool
            .admission
            .acquire(meta.priority, meta.deadline)
            .await
            .map_err(|source| Error::Admission { pool: pool.spec.name.clone(), source })?;
        tracker.timings.queue_wait = Some(tracker.arrived.elapsed());
        Ok(Some(permit))
    }

    /// Forwards a unary call.
    pub async fn unary<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        admit: Admit,
        request: Request<Req>,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        Resp: TeiTimed,
        F: FnOnce(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let mut tracker = self.tracker(rpc, Instant::now());
        let (meta, pool) = self.route(&mut tracker, request.metadata()).map_err(|e| tracker.fail(e))?;
        let permit = self.admit(&mut tracker, &pool, &meta, admit).await.map_err(|e| tracker.fail(e))?;
        let (metadata, _, message) = request.into_parts();
        let result = call(pool.upstream.channel(), self.outgoing(metadata, message, &meta, &pool)).await;
        drop(permit);
        tracker.conclude(&pool.spec.name, result)
    }

    /// Forwards a bidirectional stream message by message.
    pub async fn bidi<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        admit: Admit,
        request: Request<Streaming<Req>>,
        call: F,
    ) -> Result<Response<ResponseStream<Resp>>, Status>
    where
        Req: Send + 'static,
        Resp: TeiTimed + Send + 'static,
        F: FnOnce(Channel, Request<ReceiverStream<Req>>) -> Fut,
        Fut: Future<Output = Result<Response<Streaming<Resp>>, Status>>,
    {
        let mut tracker = self.tracker(rpc, Instant::now());
        let (meta, pool) = self.route(&mut tracker, request.metadata()).map_err(|e| tracker.fail(e))?;
        let (metadata, _, inbound) = request.into_parts();
        let pump = Pump::start(inbound, pool.clone(), meta.clone(), admit);
        let outgoing = self.outgoing(metadata, ReceiverStream::new(pump.upstream_rx), &meta, &pool);
        let mut answers = match call(pool.upstream.channel(), outgoing).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Err(tracker.fail(Error::Upstream { pool: pool.spec.name.clone(), status })),
        };
        let (to_client, from_upstream) = mpsc::channel(1);
        let (permits, mut failure, pool_name) = (pump.permits, Some(pump.failure), pool.spec.name.clone());
        let _abort_pump_with_stream = pump.task;
        tokio::spawn(async move {
            let _pump = _abort_pump_with_stream;
            loop {
                tokio::select! {
                    answer = answers.message() => match answer {
                        Ok(Some(answer)) => {
                            drop(permits.lock().unwrap_or_else(|p| p.into_inner()).pop_front());
                            tracker.observe(answer.tei_metadata());
                            if to_client.send(Ok(answer)).await.is_err() {
                                return; // The client went away; the tracker counts it as cancelled.
                            }
                        }
                        Ok(None) => {
                            tracker.finish(Code::Ok, Outcome::Ok);
                            return;
                        }
                        Err(status) => {
                            let status = tracker.fail(Error::Upstream { pool: pool_name.clone(), status });
                            let _ = to_client.send(Err(status)).await;
                            return;
                        }
                    },
                    error = async { failure.as_mut().expect("guarded").await }, if failure.is_some() => {
                        failure = None;
                        if let Ok(error) = error {
                            let _ = to_client.send(Err(tracker.fail(error))).await;
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(from_upstream))))
    }

    /// Forwards a client stream that ends in one answer (RerankStream). Every message's permit is
    /// held until the answer arrives.
    pub async fn client_stream<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        request: Request<Streaming<Req>>,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Send + 'static,
        Resp: TeiTimed,
        F: FnOnce(Channel, Request<ReceiverStream<Req>>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let mut tracker = self.tracker(rpc, Instant::now());
        let (meta, pool) = self.route(&mut tracker, request.metadata()).map_err(|e| tracker.fail(e))?;
        let (metadata, _, inbound) = request.into_parts();
        let pump = Pump::start(inbound, pool.clone(), meta.clone(), Admit::Permit);
        let _abort_pump = pump.task;
        let outgoing = self.outgoing(metadata, ReceiverStream::new(pump.upstream_rx), &meta, &pool);
        // A message refused admission must fail the call: ending the upstream stream early would
        // make TEI rank only part of the texts.
        let result = tokio::select! {
            result = call(pool.upstream.channel(), outgoing) => result,
            Ok(error) = pump.failure => return Err(tracker.fail(error)),
        };
        drop(pump.permits);
        tracker.conclude(&pool.spec.name, result)
    }
}

/// Moves a client's stream upstream one message at a time, each under its own permit.
struct Pump<Req> {
    upstream_rx: mpsc::Receiver<Req>,
    permits: Arc<Mutex<VecDeque<Permit>>>,
    failure: oneshot::Receiver<Error>,
    task: AbortOnDrop,
}

impl<Req: Send + 'static> Pump<Req> {
    fn start(mut inbound: Streaming<Req>, pool: Arc<Pool>, meta: RequestMeta, admit: Admit) -> Self {
        // Capacity 1: a slow upstream slows the client down instead of buffering its stream here.
        let (to_upstream, upstream_rx) = mpsc::channel(1);
        let (fail, failure) = oneshot::channel();
        let permits = Arc::new(Mutex::new(VecDeque::new()));
        let held = permits.clone();
        let task = tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                if admit == Admit::Permit {
                    match pool.admission.acquire(meta.priority, meta.deadline).await {
                        Ok(permit) => held.lock().unwrap_or_else(|p| p.into_inner()).push_back(permit),
                        Err(source) => {
                            let _ = fail.send(Error::Admission { pool: pool.spec.name.clone(), source });
                            return;
                        }
                    }
                }
                if to_upstream.send(message).await.is_err() {
                    return;
                }
            }
        });
        Self { upstream_rx, permits, failure, task: AbortOnDrop(task) }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
