//! Forwarding `tei.v1` calls to a pool's upstream under its admission control, as message bytes.
//!
//! A call is routed from its headers alone. A call whose cost is known from its RPC (one input,
//! no token budget) is also admitted before its body is read: a refused call costs no decoding,
//! and a queued call holds no message. Others are admitted once their bytes are in, charged what
//! the bytes carry (inputs, estimated tokens), read straight from the wire. Unary calls hold their
//! permit for the call. Streams take a permit per message before it goes upstream and give it
//! back when that message's answer comes back (TEI answers stream messages in order), so a long
//! stream never holds more than it uses. Every answer's TEI timing feeds the pool's estimates.
//! Every exit path, including a client that goes away, is counted exactly once and releases every
//! permit it held.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::Either;
use futures::{FutureExt as _, Stream, StreamExt as _};
use http::uri::PathAndQuery;
use teifleet_proto::BytesCodec;
use teifleet_wire::headers::{FORWARDED_BY, PEER_KEY as PEER_KEY_HEADER, SPILLED_FROM};
use tokio::time::Instant;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::admission::{AdmissionError, Cost, Lane, Permit};
use crate::error::{Error, Result};
use crate::forward::bulk;
use crate::forward::charge::{self, Grant, cost_of, observe, timing};
use crate::forward::coalesce::{Answer, Caller, Coalescer, Key, Role, is_leaders_deadline};
use crate::forward::pools::{Pool, PoolTable};
use crate::forward::siblings::{Ended, Lease};
use crate::forward::streams::{Admitted, Answers, Held, Upstreamed};
use crate::forward::upstream::Upstream;
use crate::gate::peer::PEER_KEY;
use crate::gate::request_meta::{self, RequestMeta};
use crate::report::call::{Activity, Call};
use crate::report::metrics::Metrics;
use crate::vocab::Protocol;
use crate::vocab::framing::MessageStream;
use crate::vocab::framing::{Framed, Side, missing};
use crate::vocab::rpc::{Admit, Rpc, Shape};
use crate::vocab::wire::TeiTiming;

pub struct Forwarder {
    pub pools: Arc<PoolTable>,
    pub metrics: Metrics,
    /// The hop marker written into requests forwarded to another pool's multiplexer.
    hop_marker: Option<MetadataValue<tonic::metadata::Ascii>>,
    max_message_bytes: usize,
    draining: AtomicBool,
    activity: Arc<Activity>,
    /// This replica's last load report on the gRPC port, reused by answers close behind it.
    pub last_report: crate::report::orca::LastReport,
}

/// A routed call on its way upstream: everything the body-reading half of the call needs.
pub struct Routed {
    pub forwarder: Arc<Forwarder>,
    pub call: Call,
    pub meta: RequestMeta,
    pub pool: Arc<Pool>,
    /// Where the call was admitted, when it was before its body was read.
    pub grant: Option<Grant>,
}

impl Forwarder {
    pub fn new(pools: Arc<PoolTable>, metrics: Metrics, identity: &str, max_message_bytes: usize) -> Self {
        let hop_marker = MetadataValue::try_from(identity).ok();
        let (draining, activity) = (AtomicBool::new(false), Arc::default());
        let last_report = crate::report::orca::LastReport::default();
        Self { pools, metrics, hop_marker, max_message_bytes, draining, activity, last_report }
    }

    /// A new call of `rpc` that came in on `protocol`, attributed to the own pool until routed.
    pub fn call(&self, rpc: &'static Rpc, protocol: Protocol) -> Call {
        Call::new(self.metrics.clone(), self.activity.clone(), rpc, protocol, self.pools.own_name())
    }

    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// New calls are refused with UNAVAILABLE from now on; calls in flight finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Picks the pool for a call from its headers; the call is attributed to that pool from now.
    pub fn route(&self, call: &mut Call, headers: &http::HeaderMap) -> Result<(RequestMeta, Arc<Pool>)> {
        if self.is_draining() {
            return Err(Error::Draining);
        }
        let mut meta = request_meta::parse(headers, call.arrived)?;
        if meta.spilled_from.is_some() && !self.pools.siblings().peer_key().vouches(headers) {
            // A client's claim, not a sibling's: the call is served and counted like any other.
            tracing::debug!(
                claimed = meta.spilled_from.as_deref(),
                "a spill without the pool's peer key: a client's call"
            );
            meta.spilled_from = None;
        }
        // A stream is a bulk call: ingest, unless it says otherwise.
        if !meta.lane_named && call.rpc.shape != Shape::Unary {
            meta.lane = Lane::Ingest;
        }
        call.priority = meta.priority;
        if meta.spilled_from.is_some() {
            call.spilled_in();
        }
        let pool = self.pools.resolve(&meta.target, meta.forwarded_by.as_deref())?;
        if let Some(gate) = self.pools.keys_of(&pool.spec.name) {
            gate.check(headers).map_err(Error::Auth)?;
        }
        // A spilled call is served by this replica's TEI or not at all: never passed on again.
        if let Some(from) = &meta.spilled_from
            && pool.spec.remote
        {
            return Err(Error::ForwardingLoop { by: from.clone() });
        }
        call.pool.clone_from(&pool.spec.name);
        if meta.tenant.is_some() {
            call.tenant = pool.admission.tenant_label(meta.tenant.as_deref()).into();
        }
        Ok((meta, pool))
    }

    /// Waits for room for a unary call, if its RPC needs a permit: here, or at a sibling replica.
    pub async fn admit(&self, call: &mut Call, pool: &Pool, meta: &RequestMeta, cost: Cost) -> Result<Option<Grant>> {
        if call.rpc.admit == Admit::Free {
            return Ok(None);
        }
        let grant = charge::admit(pool, meta, cost).await?;
        call.admitted();
        Ok(Some(grant))
    }

    /// Waits for the call's permit here, if its RPC needs one (streams stay where they start).
    pub async fn admit_here(
        &self,
        call: &mut Call,
        pool: &Pool,
        meta: &RequestMeta,
        cost: Cost,
    ) -> Result<Option<Permit>> {
        if call.rpc.admit == Admit::Free {
            return Ok(None);
        }
        let permit = charge::acquire(pool, meta, cost).await?;
        call.admitted();
        Ok(Some(permit))
    }

    /// The request as it goes upstream: the caller's metadata (minus its timeout), the time left
    /// on the caller's clock, and the hop marker when the upstream is another multiplexer.
    /// The local TEI gets none of teifleet's headers and not the caller's key: it needs neither, and
    /// what reaches it may reach its logs.
    pub fn outgoing<T>(&self, request: Request<T>, meta: &RequestMeta, pool: &Pool) -> Request<T> {
        self.outgoing_to(request, meta, pool, !pool.spec.remote)
    }

    fn outgoing_to<T>(&self, request: Request<T>, meta: &RequestMeta, pool: &Pool, to_tei: bool) -> Request<T> {
        let (metadata, _, message) = request.into_parts();
        let mut headers = metadata.into_headers();
        headers.remove(&request_meta::GRPC_TIMEOUT);
        if to_tei {
            request_meta::strip_for_tei(&mut headers);
        } else {
            // A sibling's claim is this replica's to check, never to pass on.
            request_meta::remove_all(&mut headers, &[request_meta::SPILLED_FROM.clone(), PEER_KEY.clone()]);
        }
        let metadata = tonic::metadata::MetadataMap::from_headers(headers);
        let mut request = Request::from_parts(metadata, tonic::Extensions::default(), message);
        if let Some(deadline) = meta.caller_deadline {
            request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        }
        if pool.spec.remote
            && let Some(marker) = &self.hop_marker
        {
            request.metadata_mut().insert(FORWARDED_BY, marker.clone());
        }
        request
    }

    /// The activator holds a call until its pool has a ready replica (the caller's deadline still
    /// runs, outside).
    async fn activated(&self, pool: &Pool) -> Result<()> {
        if let Some(activations) = self.pools.activations()
            && let Some(ready) = activations.wait_for_replica(&pool.spec.name).await
        {
            ready?;
        }
        Ok(())
    }

    async fn client_of(&self, pool: &Pool, channel: Channel) -> Result<tonic::client::Grpc<Channel>> {
        self.activated(pool).await?;
        let mut client = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes);
        client.ready().await.map_err(|e| Error::Unreachable { pool: pool.spec.name.clone(), reason: e.to_string() })?;
        Ok(client)
    }

    /// Opens a streaming call of `rpc` (its messages sent as `request` yields them) on the pool's
    /// direct connection, or on its channel when it has none.
    async fn open_stream<S>(&self, pool: &Pool, rpc: &Rpc, request: Request<S>) -> Result<Upstreamed>
    where
        S: Stream<Item = Bytes> + Send + Unpin + 'static,
    {
        let name = &pool.spec.name;
        if let Some(direct) = pool.upstream.direct() {
            self.activated(pool).await?;
            return direct.stream(name, rpc.path, request, self.max_message_bytes).await.map(Upstreamed::Direct);
        }
        let mut client = self.client_of(pool, pool.upstream.channel()).await?;
        match client.streaming(request, PathAndQuery::from_static(rpc.path), BytesCodec).await {
            Ok(response) => {
                let (metadata, answers, _) = response.into_parts();
                Ok(Upstreamed::Channel { pool: name.clone(), metadata, answers })
            }
            Err(status) => Err(Error::Upstream { pool: name.clone(), status }),
        }
    }

    /// One unary call to `upstream` (the pool's, or a sibling replica's sidecar): on its direct
    /// connection, or on its channel when it has none.
    async fn unary_on(
        &self,
        pool: &Pool,
        upstream: &Upstream,
        rpc: &Rpc,
        request: Request<Framed>,
    ) -> Result<Response<Framed>> {
        if let Some(direct) = upstream.direct() {
            self.activated(pool).await?;
            return direct.unary(&pool.spec.name, rpc.path, request, self.max_message_bytes).await;
        }
        // Boxed: tonic's client is the rare path (the activator's balanced channel), and every
        // call's future would otherwise carry its room.
        Box::pin(async move {
            let answer = |status| Error::Upstream { pool: pool.spec.name.clone(), status };
            let mut client = self.client_of(pool, upstream.channel()).await?;
            let request = request.map(Framed::into_message);
            let response = client.unary(request, PathAndQuery::from_static(rpc.path), BytesCodec).await;
            response.map(|response| response.map(|message| Framed::new(&message))).map_err(answer)
        })
        .await
    }

    /// One admitted unary exchange, as every unary path makes it (a gRPC call, the call
    /// identical callers share, each call of an HTTP batch): the request goes out with the
    /// caller's metadata and remaining deadline, to the pool's upstream or, under a sibling's
    /// lease, to that replica; a deadline that passes meanwhile is DEADLINE_EXCEEDED; TEI's
    /// timing of the answer feeds the pool through a local permit.
    pub async fn exchange(
        &self,
        pool: &Pool,
        rpc: &Rpc,
        meta: &RequestMeta,
        request: Request<Framed>,
        grant: Option<&Grant>,
    ) -> Result<(Response<Framed>, Option<TeiTiming>)> {
        if let Some(Grant::Sibling(lease)) = grant {
            // Boxed: a spill holds two exchanges and an admission, and every call's future would
            // otherwise carry (and move) that room.
            return Box::pin(self.spill(pool, rpc, meta, request, lease)).await;
        }
        self.exchange_here(pool, rpc, meta, request, grant.and_then(Grant::permit)).await
    }

    async fn exchange_here(
        &self,
        pool: &Pool,
        rpc: &Rpc,
        meta: &RequestMeta,
        request: Request<Framed>,
        permit: Option<&Permit>,
    ) -> Result<(Response<Framed>, Option<TeiTiming>)> {
        // A bulk call's sub-batch sends its messages under one permit: each answer is TEI's
        // for this message's inputs only. A permit of one input needs no second look at the
        // message (every plain Embed: this is the request path).
        let inputs =
            permit.filter(|permit| permit.cost().inputs > 1).map(|_| charge::inputs_of(rpc, request.get_ref()));
        let sent = Instant::now();
        let upstream = self.unary_on(pool, &pool.upstream, rpc, self.outgoing(request, meta, pool));
        let response = within_deadline(pool, meta, sent, upstream).await?;
        let timing = timing(rpc, response.get_ref());
        observe(permit, timing, inputs);
        Ok((response, timing))
    }

    /// Sends the call to the sibling the lease names. The sibling's answers pass through as
    /// they came; if it had no room after all (its own callers took it), is going away or cannot
    /// be reached, the call is served here instead, so the caller never hears of it.
    async fn spill(
        &self,
        pool: &Pool,
        rpc: &Rpc,
        meta: &RequestMeta,
        request: Request<Framed>,
        lease: &Lease,
    ) -> Result<(Response<Framed>, Option<TeiTiming>)> {
        let mut outgoing = self.outgoing_to(
            Request::from_parts(request.metadata().clone(), tonic::Extensions::default(), request.get_ref().clone()),
            meta,
            pool,
            false,
        );
        // Always marked, so the sibling neither queues nor spills it again; with the pool's peer
        // key, so the sibling believes the mark (`crate::gate::peer`).
        let marker = self.hop_marker.clone().unwrap_or_else(|| MetadataValue::from_static("teifleet-multiplexer"));
        outgoing.metadata_mut().insert(SPILLED_FROM, marker);
        if let Some(key) = self.pools.siblings().peer_key().value()
            && let Ok(key) = MetadataValue::try_from(key.as_bytes())
        {
            outgoing.metadata_mut().insert(PEER_KEY_HEADER, key);
        }
        let sent = Instant::now();
        let upstream = self.unary_on(pool, lease.upstream(), rpc, outgoing);
        let ended = match within_deadline(pool, meta, sent, upstream).await {
            Ok(response) => {
                self.metrics.spilled(&pool.spec.name, Ended::Answered.label());
                let timing = timing(rpc, response.get_ref());
                return Ok((response, timing));
            }
            Err(error) => crate::forward::siblings::spill_ended(&error).ok_or(error)?,
        };
        lease.refused(ended);
        self.metrics.spilled(&pool.spec.name, ended.label());
        tracing::debug!(pool = %pool.spec.name, sibling = lease.url(), why = ended.label(), "spill not served there: served here");
        let permit = charge::acquire(pool, meta, cost_of(pool, rpc, request.get_ref())).await?;
        self.exchange_here(pool, rpc, meta, request, Some(&permit)).await
    }
}

/// Runs `upstream` within the caller's deadline: a deadline that passes while TEI works on the
/// call is DEADLINE_EXCEEDED, counted as a deadline, not as TEI's error or a cancellation. Not an
/// `async fn`: that would hold `upstream` twice (as its argument and inside the timer), and the
/// upstream call's future is the largest part of every call's.
fn within_deadline<'a, T>(
    pool: &'a Pool,
    meta: &RequestMeta,
    sent: Instant,
    upstream: impl std::future::Future<Output = Result<T>> + 'a,
) -> impl std::future::Future<Output = Result<T>> + 'a {
    match meta.deadline {
        Some(deadline) => Either::Left(tokio::time::timeout_at(deadline, upstream).map(move |answer| {
            answer.unwrap_or_else(|_| {
                Err(Error::DeadlineAtUpstream { pool: pool.spec.name.clone(), waited: sent.elapsed() })
            })
        })),
        None => Either::Right(upstream),
    }
}

impl Routed {
    /// Forwards a unary call; the permit is held until the answer is back. Not an `async fn`: one
    /// keeps its arguments twice (rust-lang/rust#62958), and a call and its request are large.
    #[expect(clippy::manual_async_fn, reason = "an async fn holds its arguments twice")]
    pub fn unary(mut self, request: Request<Framed>) -> impl Future<Output = Result<Response<Framed>, Status>> + Send {
        async move {
            let cache = self.pool.cache_for(self.call.rpc, self.meta.tenant.as_deref());
            let looked = match &cache {
                Some(cache) => Some(cache.look_up(&[request.get_ref().as_ref()]).await),
                None => None,
            };
            if let Some(hit) = looked.as_ref().and_then(|looked| looked.answers[0].clone()) {
                drop(self.grant.take());
                self.call.admitted();
                self.call.succeed();
                return Ok(cache_header(Response::new(hit), true));
            }
            if self.grant.is_none() && self.call.rpc.admit == Admit::Permit {
                let cost = cost_of(&self.pool, self.call.rpc, request.get_ref());
                match self.forwarder.admit(&mut self.call, &self.pool, &self.meta, cost).await {
                    Ok(grant) => self.grant = grant,
                    Err(error) => return Err(self.call.fail(error).into()),
                }
            }
            let grant = self.grant.take();
            let result = self.forwarder.exchange(&self.pool, self.call.rpc, &self.meta, request, grant.as_ref()).await;
            drop(grant);
            match result {
                Ok((response, timing)) => {
                    self.call.observe(timing);
                    self.call.succeed();
                    match (cache, looked) {
                        (Some(cache), Some(looked)) => {
                            cache.keep(&looked, 0, response.get_ref());
                            Ok(cache_header(response, false))
                        }
                        _ => Ok(response),
                    }
                }
                Err(error) => Err(self.call.fail(error).into()),
            }
        }
    }

    /// Forwards one request whose answers stream back; the permit is held until the stream ends.
    pub async fn server_stream(self, request: Request<Bytes>) -> Result<Response<MessageStream>, Status> {
        let Self { forwarder, mut call, meta, pool, grant } = self;
        // A stream stays on this replica: admitted here before its body was read, or now.
        let mut permit = match grant {
            Some(Grant::Local(permit)) => Some(permit),
            Some(Grant::Sibling(_)) | None => None,
        };
        if permit.is_none() && call.rpc.admit == Admit::Permit {
            let cost = cost_of(&pool, call.rpc, request.get_ref());
            permit = forwarder
                .admit_here(&mut call, &pool, &meta, cost)
                .await
                .map_err(|error| Status::from(call.fail(error)))?;
        }
        let outgoing = forwarder.outgoing(request.map(|message| futures::stream::iter(Some(message))), &meta, &pool);
        let opened = forwarder.open_stream(&pool, call.rpc, outgoing).await;
        let answers = opened.map_err(|error| Status::from(call.fail(error)))?;
        let held = Held::new(Mutex::new(permit.into_iter().collect::<VecDeque<_>>()));
        Ok(Response::new(Box::pin(Answers::new(answers, call, held, false, None))))
    }

    /// Forwards a bidirectional stream message by message: on one upstream stream to this
    /// replica's TEI, or, in a pool with siblings, spread over every replica with room.
    pub async fn bidi(self, request: Request<MessageStream>) -> Result<Response<MessageStream>, Status> {
        if let Some(unary) = spread_as(&self.pool, self.call.rpc) {
            return Ok(self.spread(request, unary));
        }
        let Self { forwarder, mut call, meta, pool, .. } = self;
        let (metadata, extensions, inbound) = request.into_parts();
        let (admitted, held, refusal) = Admitted::new(inbound, pool.clone(), meta.clone(), call.rpc);
        let outgoing = forwarder.outgoing(Request::from_parts(metadata, extensions, admitted), &meta, &pool);
        let answers =
            forwarder.open_stream(&pool, call.rpc, outgoing).await.map_err(|error| Status::from(call.fail(error)))?;
        Ok(Response::new(Box::pin(Answers::new(answers, call, held, true, Some(refusal)))))
    }

    /// A long stream is a bulk call: its messages go as sub-batches of the unary RPC each one is
    /// to TEI, admitted one sub-batch at a time here or at a sibling with room (the spill path),
    /// so one client's stream keeps every replica busy, not only the one it opened on; the
    /// answers come back in order. TEI's streams answer message by message as its unary calls do.
    fn spread(self, request: Request<MessageStream>, unary: &'static Rpc) -> Response<MessageStream> {
        let Self { forwarder, call, meta, pool, .. } = self;
        let (metadata, _, inbound) = request.into_parts();
        let size = bulk::sub_batch(&pool, SPREAD_SUB_BATCH, meta.lane);
        let window = bulk::window(&pool, size);
        let spread = bulk::Spread { forwarder, pool, meta, carried: metadata, rpc: unary };
        let tally = Arc::new(Mutex::new(bulk::CacheTally::default()));
        let answers = Box::pin(spread.answers(inbound, size, window, tally.clone()));
        let answers = Counted { answers, call, tally, answered: false, done: false };
        Response::new(Box::pin(answers))
    }

    /// Forwards a client stream that ends in one answer (RerankStream). Every message's permit is
    /// held until the answer arrives.
    pub async fn client_stream(self, request: Request<MessageStream>) -> Result<Response<Framed>, Status> {
        let Self { forwarder, mut call, meta, pool, .. } = self;
        let (metadata, extensions, inbound) = request.into_parts();
        let (admitted, held, refusal) = Admitted::holding_all(inbound, pool.clone(), meta.clone(), call.rpc);
        let outgoing = forwarder.outgoing(Request::from_parts(metadata, extensions, admitted), &meta, &pool);
        let upstream = within_deadline(&pool, &meta, call.arrived, async {
            let mut answers = forwarder.open_stream(&pool, call.rpc, outgoing).await?;
            let missing = || Error::Upstream { pool: pool.spec.name.clone(), status: missing(Side::Answer) };
            let message = answers.next().await.unwrap_or_else(|| Err(missing()))?;
            let metadata = answers.metadata().await?;
            Ok(Response::from_parts(metadata, Framed::new(&message), tonic::Extensions::default()))
        });
        // A message refused admission must fail the call: ending the upstream stream early would
        // make TEI rank only part of the texts.
        let result = tokio::select! {
            result = upstream => result,
            Ok(error) = refusal => return Err(call.fail(error).into()),
        };
        let permits = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
        match result {
            Ok(response) => {
                let timing = timing(call.rpc, response.get_ref());
                // One answer for every message the permits held.
                observe(permits.front(), timing, Some(permits.iter().map(|permit| permit.cost().inputs).sum()));
                drop(permits);
                call.observe(timing);
                call.succeed();
                Ok(response)
            }
            Err(error) => Err(call.fail(error).into()),
        }
    }
}

impl Routed {
    /// Forwards a unary call through the pool's coalescer: an identical call already in flight is
    /// joined instead of sent again. Admission happens in the shared call, so one permit serves
    /// every caller.
    pub async fn coalesced(
        mut self,
        coalescer: Arc<Coalescer>,
        request: Request<Framed>,
    ) -> Result<Response<Framed>, Status> {
        let (metadata, _, message) = request.into_parts();
        // The cache first: a hit needs no call to share.
        let cache = self.pool.cache_for(self.call.rpc, self.meta.tenant.as_deref());
        let looked = match &cache {
            Some(cache) => Some(cache.look_up(&[message.as_ref()]).await),
            None => None,
        };
        if let Some(hit) = looked.as_ref().and_then(|looked| looked.answers[0].clone()) {
            self.call.admitted();
            self.call.succeed();
            return Ok(cache_header(Response::new(hit), true));
        }
        let caller = Caller::of(metadata.as_ref());
        let key = Key { path: self.call.rpc.path, priority: self.meta.priority, request: message.clone(), caller };
        let mut retried = false;
        loop {
            let lead = || {
                let (forwarder, pool, meta, rpc) =
                    (self.forwarder.clone(), self.pool.clone(), self.meta.clone(), self.call.rpc);
                let request = Request::from_parts(metadata.clone(), tonic::Extensions::default(), message.clone());
                async move {
                    let grant = charge::admit(&pool, &meta, cost_of(&pool, rpc, request.get_ref())).await?;
                    let admitted = Instant::now();
                    let (response, _) = forwarder.exchange(&pool, rpc, &meta, request, Some(&grant)).await?;
                    drop(grant);
                    let (metadata, message, _) = response.into_parts();
                    Ok(Arc::new(Answer { metadata, message, admitted }))
                }
                .boxed()
            };
            let (answer, role) = coalescer.join_or_lead(key.clone(), self.meta.deadline, lead);
            if role != Role::Leader {
                self.forwarder.metrics.coalesced(&self.pool.spec.name, self.call.rpc.label);
            }
            let answer = match self.meta.deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, answer).await.unwrap_or_else(|_| {
                    let waited = self.call.arrived.elapsed();
                    Err(Error::Admission {
                        pool: self.pool.spec.name.clone(),
                        source: AdmissionError::DeadlineExpired { waited },
                    })
                }),
                None => answer.await,
            };
            match answer {
                Ok(answer) => {
                    self.call.admitted_at(answer.admitted);
                    self.call.observe(timing(self.call.rpc, &answer.message));
                    self.call.succeed();
                    let (metadata, message) = (answer.metadata.clone(), answer.message.clone());
                    let response = Response::from_parts(metadata, message, tonic::Extensions::default());
                    return Ok(match (&cache, &looked) {
                        (Some(cache), Some(looked)) => {
                            cache.keep(looked, 0, response.get_ref());
                            cache_header(response, false)
                        }
                        _ => response,
                    });
                }
                Err(error) if !retried && is_leaders_deadline(&error, role, self.meta.deadline) => retried = true,
                Err(error) => return Err(self.call.fail(error).into()),
            }
        }
    }
}

/// `response` with the `x-teifleet-cache` header: a `hit`, or a `miss` whose answer was kept.
fn cache_header(mut response: Response<Framed>, hit: bool) -> Response<Framed> {
    let value = crate::cache::header_value(usize::from(hit), 1);
    response.metadata_mut().insert(crate::cache::HEADER, MetadataValue::from_static(value));
    response
}

/// Messages of a spread stream sent under one grant at most: few, so a stream's messages are
/// spread over the replicas in small steps and none waits long for a sub-batch to fill (a
/// sub-batch takes the messages that are in, never waiting for more).
const SPREAD_SUB_BATCH: usize = 8;

/// The unary row a stream of `rpc` is spread as, when `pool` has siblings to spread it over.
/// A pool with a cache spreads its cached streams too, even alone: each message is then looked up
/// as its unary call is.
fn spread_as(pool: &Pool, rpc: &'static Rpc) -> Option<&'static Rpc> {
    if pool.spec.remote || rpc.admit != Admit::Permit {
        return None;
    }
    let unary = rpc.unary()?;
    let siblings = pool.siblings.as_ref().is_some_and(|siblings| siblings.slots() > 0);
    let cached = pool.cache.is_some() && crate::cache::Cache::caches(unary);
    (siblings || cached).then_some(unary)
}

/// A spread stream's answers; the call is counted when they end.
struct Counted {
    answers: Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>,
    call: Call,
    /// Its messages' lookups in the pool's cache, for the trailers.
    tally: Arc<Mutex<bulk::CacheTally>>,
    /// An answer came: the call's wait ended with its first.
    answered: bool,
    done: bool,
}

impl Stream for Counted {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return std::task::Poll::Ready(None);
        }
        std::task::Poll::Ready(match futures::ready!(this.answers.as_mut().poll_next(cx)) {
            Some(Ok(answer)) => {
                if !std::mem::replace(&mut this.answered, true) {
                    this.call.admitted();
                }
                Some(Ok(answer))
            }
            Some(Err(error)) => {
                this.done = true;
                Some(Err(this.call.fail(error).into()))
            }
            // The tally in the trailers: a status that ends the body (`stream_body::trailers`).
            None => {
                this.done = true;
                this.call.succeed();
                let ended = this.tally.lock().unwrap_or_else(|p| p.into_inner()).ended();
                (!ended.metadata().is_empty()).then_some(Err(ended))
            }
        })
    }
}
