//! One HTTP request as `tei.v1` unary calls on the gRPC front's own path: routed, deadlined and
//! counted once as one call from its headers; its inputs capped per request; sent in chunks of at
//! most TEI's max client batch size, each chunk admitted as a whole (charged its inputs at once)
//! and its calls in flight together through [`crate::forward::Forwarder::exchange`] (`crate::forward::bulk`, the
//! runner tei-manager's Arrow batches share); the answers decoded chunk by chunk and returned in
//! input order. Every chunk shares the request's deadline, and all of them
//! are dropped (their upstream streams reset) when the client goes away.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::TryStreamExt as _;
use http::HeaderMap;
use prost::Message;
use teifleet_proto::v1;
use teifleet_runtime::http_server::ConnectionNumber;
use teifleet_wire::headers::TIMEOUT_MS;
use tonic::metadata::MetadataMap;

use super::Shared;
use super::error::HttpError;
use super::upstream::Each;
use crate::admission::memory::Use;
use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::forward::bulk::{Bulk, CacheTally, Chunk, Exchanged};
use crate::forward::pools::Pool;
use crate::gate::door::{ConnectionId, Pass};
use crate::gate::request_meta::{InvalidMetadata, RequestMeta};
use crate::report::call::Call;
use crate::vocab::Protocol;
use crate::vocab::framing::Framed;
use crate::vocab::rpc::{self, Admit, Rpc};

/// Chunks waiting for or holding a permit at once: the next chunk queues while one runs, so a
/// long batch keeps TEI busy without flooding the queue it is admitted through.
const CHUNKS_AT_ONCE: usize = 2;

/// Info's path: `GET /info` is one Info call, and a call's `info()` (the model's limits) is fetched by one.
pub(super) const INFO: &str = "/tei.v1.Info/Info";

/// The table's row for `path`.
pub fn row(path: &str) -> &'static Rpc {
    rpc::find(path).unwrap_or_else(|| panic!("{path} is a row of rpc::RPCS"))
}

/// One HTTP request on its way upstream.
pub struct HttpCall<'a> {
    shared: &'a Shared,
    /// Counted once, whatever the request becomes.
    pub call: Call,
    meta: RequestMeta,
    pool: Arc<Pool>,
    /// The caller's headers that go along when the pool is another pool's sidecar.
    carried: MetadataMap,
    /// The size of the request's body, once read.
    body_bytes: usize,
    /// What the pool's cache held of the request's inputs.
    cached: CacheTally,
    /// A request of a route its pool caches goes through the door only once its inputs are known
    /// not all to be answered here (`Self::send_each`): the connection it came on, until then.
    door_later: Option<ConnectionId>,
    /// The door's pass, held until the request is answered.
    pass: Option<Pass>,
}

impl<'a> HttpCall<'a> {
    /// Routes a request of `rpc` from its headers; the call is counted from now. A request
    /// refused here is counted before it is answered.
    pub fn route(shared: &'a Shared, rpc: &'static Rpc, headers: &HeaderMap) -> Result<Self, HttpError> {
        let forwarder = &shared.forwarder;
        let mut call = forwarder.call(rpc, Protocol::Http);
        let routed = forwarder.route(&mut call, headers).and_then(|(mut meta, pool)| {
            if let Some(timeout) = timeout(headers)? {
                meta.set_timeout(timeout, call.arrived);
            }
            Ok((meta, pool))
        });
        match routed {
            Ok((meta, pool)) => {
                let carried = crate::gate::request_meta::carried_to_peers(headers);
                Ok(Self {
                    shared,
                    call,
                    meta,
                    pool,
                    carried,
                    body_bytes: 0,
                    cached: CacheTally::default(),
                    door_later: None,
                    pass: None,
                })
            }
            Err(error) => Err(HttpError::Call(call.fail(error))),
        }
    }

    /// Takes the request through its pool's door when it is patient (`crate::front::door`): the
    /// pass to hold until it is answered. A request without a connection number (a router
    /// served without `teifleet_runtime::http_server`) gets a line of its own.
    pub async fn through_door(&mut self, connection: Option<ConnectionNumber>) -> Result<Option<Pass>, HttpError> {
        static UNNUMBERED: AtomicU64 = AtomicU64::new(u64::MAX);
        let connection = connection.map_or_else(|| UNNUMBERED.fetch_sub(1, Ordering::Relaxed), |number| number.0);
        if self.pool.cache.is_some() && Cache::caches(self.call.rpc) {
            self.door_later = Some(ConnectionId(connection));
            return Ok(None);
        }
        let (rpc, arrived) = (self.call.rpc, self.call.arrived);
        let bounds = &self.shared.door;
        crate::front::door::go_through(rpc, &mut self.meta, &self.pool, ConnectionId(connection), bounds, arrived)
            .await
            .map_err(HttpError::Call)
    }

    pub fn settings(&self) -> &super::HttpSettings {
        &self.shared.settings
    }

    /// The most tokens `texts` can become upstream
    /// ([`most_tokens`](super::answer::most_tokens)): each text's bytes and the special tokens,
    /// a prompt's more when one is named, at most the model's input length each when TEI
    /// truncates. From the model's Info and the texts alone, so no caller can move it.
    pub async fn most_tokens(&self, texts: &[String], truncate: bool, prompt: bool) -> Result<u64, HttpError> {
        let cap = match truncate {
            true => Some(self.info().await?.max_input_length),
            false => None,
        };
        let prompt = if prompt { super::answer::PROMPT_TOKENS } else { 0 };
        let one = |text: &String| super::answer::most_tokens(text.len(), prompt, cap);
        Ok(texts.iter().map(one).fold(0, u64::saturating_add))
    }

    /// The charge of an answer of `units` of `cost` (`super::answer`), and the pool's learned
    /// vector size.
    pub fn answer_charge(
        &self,
        units: u64,
        cost: super::answer::Cost,
    ) -> Result<super::memory::AnswerCharge, HttpError> {
        super::answer::charge(&self.shared.memory, units, cost, self.shared.settings.max_answer_bytes)
    }

    /// Corrects an answer's charge to what came (`super::answer::settle`).
    pub fn settle(
        &self,
        charge: &super::memory::AnswerCharge,
        units: u64,
        cost: super::answer::Cost,
    ) -> Result<(), HttpError> {
        super::answer::settle(charge, units, cost, self.shared.settings.max_answer_bytes)
    }

    /// The pool's vector size, as its answers showed it.
    pub fn dimensions(&self) -> u64 {
        self.shared.dimensions.of(&self.pool.spec.name)
    }

    /// The pool's answers carry vectors of `size` numbers.
    pub fn learn_dimensions(&self, size: usize) {
        self.shared.dimensions.learn(&self.pool.spec.name, size);
    }

    /// The `x-teifleet-cache` header's value, when the pool's cache was asked.
    pub fn cache_header(&self) -> Option<&'static str> {
        self.cached.header()
    }

    /// Counts how the request ended; an error is handed back to be answered.
    pub fn finish<T>(mut self, result: Result<T, HttpError>) -> Result<T, HttpError> {
        match result {
            Ok(answer) => {
                self.call.succeed();
                Ok(answer)
            }
            Err(HttpError::Call(error)) => Err(HttpError::Call(self.call.fail(error))),
            Err(error) => {
                self.call.refuse(error.kind());
                Err(error)
            }
        }
    }

    /// Sends each of `each`'s messages as one unary call of `rpc` and decodes the answers, in
    /// order; `per_permit` messages share one permit. Refused whole before any message is built
    /// when the request carries more `inputs` than one may, when its messages would be many
    /// times its body (413), or when what they would hold at once finds no room in the memory
    /// budget (429; `super::upstream`).
    pub async fn send_each<M, T, Resp>(
        &mut self,
        rpc: &'static Rpc,
        mut each: Each<M, T>,
        inputs: usize,
        per_permit: usize,
    ) -> Result<Vec<Resp>, HttpError>
    where
        M: Message + Clone + Send + 'static,
        T: Default + Send + 'static,
        Resp: Message + Default,
    {
        self.call.rpc = rpc;
        self.within_cap(inputs)?;
        if let Some(connection) = self.door_later.take() {
            let cache = self.pool.cache_for(rpc, self.meta.tenant.as_deref());
            let here = cache.is_some_and(|cache| each.all(|message| cache.all_here(&[message])));
            if !here {
                let (arrived, bounds) = (self.call.arrived, &self.shared.door);
                self.pass =
                    crate::front::door::go_through(rpc, &mut self.meta, &self.pool, connection, bounds, arrived)
                        .await
                        .map_err(HttpError::Call)?;
            }
        }
        let plan = each.plan(per_permit, super::upstream::chunk_bytes(self.body_bytes), CHUNKS_AT_ONCE);
        let limit = super::upstream::most_upstream_bytes(self.body_bytes);
        if plan.total > limit {
            return Err(HttpError::UpstreamTooLarge { bytes: plan.total, limit });
        }
        let _messages = self.shared.memory.charge(Use::RequestBodies, plan.peak).map_err(|over| {
            self.shared.forwarder.metrics.refused_input("http", crate::front::grpc::server::REFUSED_MEMORY);
            HttpError::Call(Error::Memory(over))
        })?;
        let pool = &*self.pool;
        let bulk = Bulk { forwarder: &self.shared.forwarder, pool, meta: &self.meta, carried: &self.carried, rpc };
        // Decoded as they come, so the answer bytes do not outlive their chunk.
        let decode = move |exchanged: Exchanged| {
            let (response, _) = exchanged?;
            Resp::decode(response.get_ref().as_ref()).map_err(|e| undecodable(pool, &e))
        };
        let chunks = bulk.run(each.chunks(plan.chunks), CHUNKS_AT_ONCE, decode);
        let done: Vec<Chunk<Resp>> = chunks.try_collect().await.map_err(HttpError::Call)?;
        if let Some(first) = done.first()
            && rpc.admit == Admit::Permit
        {
            self.call.admitted_at(first.admitted);
        }
        self.call.observe(done.iter().rev().find_map(|chunk| chunk.timing));
        done.iter().for_each(|chunk| self.cached.add(chunk));
        Ok(done.into_iter().flat_map(|chunk| chunk.answers).collect())
    }

    /// More inputs than a request may carry are refused as such, before anything is built for
    /// them or their answer estimated.
    pub fn within_cap(&self, inputs: usize) -> Result<(), HttpError> {
        let limit = self.shared.settings.max_request_inputs;
        match inputs > limit {
            true => Err(HttpError::TooManyInputs { inputs, limit }),
            false => Ok(()),
        }
    }

    /// The request's body was `bytes` long: the measure of what its messages may hold per chunk.
    pub fn read_body(&mut self, bytes: usize) {
        self.body_bytes = bytes;
    }

    /// The pool's `tei.v1.Info`, from the pool's cache when fresh (one upstream call per pool and
    /// model, not one per request).
    pub async fn info(&self) -> Result<Arc<v1::InfoResponse>, HttpError> {
        let (forwarder, pool) = (&*self.shared.forwarder, &*self.pool);
        let fetch = async {
            let request = tonic::Request::from_parts(
                self.carried.clone(),
                tonic::Extensions::default(),
                Framed::encode(&v1::InfoRequest {}),
            );
            let (response, _) = forwarder.exchange(pool, row(INFO), &self.meta, request, None).await?;
            v1::InfoResponse::decode(response.get_ref().as_ref()).map_err(|e| undecodable(pool, &e))
        };
        self.shared.info.get_or_fetch(pool, fetch).await.map_err(HttpError::Call)
    }
}

/// TEI answered with bytes that are not the message its API promises: the upstream's fault.
fn undecodable(pool: &Pool, error: &prost::DecodeError) -> Error {
    let status = tonic::Status::internal(format!("the upstream answered with an undecodable message: {error}"));
    Error::Upstream { pool: pool.spec.name.clone(), status }
}

/// The caller's `x-teifleet-timeout-ms`: HTTP has no `grpc-timeout`.
fn timeout(headers: &HeaderMap) -> Result<Option<Duration>> {
    let Some(value) = headers.get(TIMEOUT_MS) else { return Ok(None) };
    let invalid =
        || Error::from(InvalidMetadata { header: TIMEOUT_MS, reason: "expected 1 to 99999999 milliseconds".into() });
    let millis: u64 = value.to_str().ok().and_then(|v| v.trim().parse().ok()).ok_or_else(invalid)?;
    if millis == 0 || millis > 99_999_999 {
        return Err(invalid());
    }
    Ok(Some(Duration::from_millis(millis)))
}
