//! A bulk call's messages as TEI-sized sub-batches over the whole pool: each sub-batch admitted on
//! its own with [`charge::admit`] (a permit here, or a lease on a sibling replica with room, so one
//! call keeps every replica busy), its messages sent together as unary exchanges through
//! [`Forwarder::exchange`] under that grant, its answers turned into what the call keeps as they
//! come. At most `window` sub-batches are in flight or answered and not yet taken, in order: the
//! caller consumes them in input order, and a slow consumer holds no more than the window. The
//! HTTP front's batches and tei-manager's Arrow batches both run here.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{FutureExt as _, Stream, StreamExt as _, TryStreamExt as _};
use tokio::time::Instant;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Response, Status};

use crate::admission::Lane;
use crate::error::{Error, Result};
use crate::forward::Forwarder;
use crate::forward::charge;
use crate::forward::pools::Pool;
use crate::forward::siblings::window_cap;
use crate::gate::request_meta::RequestMeta;
use crate::vocab::framing::{Framed, MessageStream};
use crate::vocab::rpc::{Admit, Rpc};
use crate::vocab::wire::TeiTiming;

/// One exchange's outcome as [`Forwarder::exchange`] gives it.
pub type Exchanged = Result<(Response<Framed>, Option<TeiTiming>)>;

/// Where a bulk call's sub-batches go and on whose behalf.
#[derive(Clone, Copy)]
pub struct Bulk<'a> {
    pub forwarder: &'a Forwarder,
    pub pool: &'a Pool,
    pub meta: &'a RequestMeta,
    /// The caller's headers that go along to another pool's or a sibling's sidecar.
    pub carried: &'a MetadataMap,
    pub rpc: &'static Rpc,
}

/// What one sub-batch brought back, in its messages' order.
pub struct Chunk<T> {
    pub answers: Vec<T>,
    pub admitted: Instant,
    pub timing: Option<TeiTiming>,
    /// Answers that came from the pool's cache.
    pub hits: usize,
    /// The pool's cache was asked (its answers are kept).
    pub cached: bool,
}

/// How a call's inputs fared in its pool's cache over its sub-batches: what its
/// `x-teifleet-cache` says. Rows refused before any lookup are no inputs of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheTally {
    hits: usize,
    inputs: usize,
    cached: bool,
}

impl CacheTally {
    pub fn add<T>(&mut self, chunk: &Chunk<T>) {
        self.hits += chunk.hits;
        self.inputs += chunk.answers.len();
        self.cached |= chunk.cached;
    }

    /// The header's value; `None` when the pool's cache was never asked (no cache, nothing sent).
    pub fn header(&self) -> Option<&'static str> {
        self.cached.then(|| crate::cache::header_value(self.hits, self.inputs))
    }

    /// The status a streamed answer that went well ends with: its headers went out before its
    /// inputs were looked up, so the tally goes in the trailers beside `grpc-status: 0`.
    pub fn ended(&self) -> Status {
        let mut status = Status::ok("");
        if let Some(value) = self.header() {
            status.metadata_mut().insert(crate::cache::HEADER, MetadataValue::from_static(value));
        }
        status
    }
}

impl<'a> Bulk<'a> {
    /// Runs `chunks` in order, at most `window` at once; `keep` turns each exchange's outcome into
    /// what the call keeps of it (an `Err` ends the call: the sub-batches still in flight are
    /// dropped, their upstream streams reset).
    pub fn run<T, K, I>(self, chunks: I, window: usize, keep: K) -> impl Stream<Item = Result<Chunk<T>>> + Send + 'a
    where
        T: Send + 'a,
        K: Fn(Exchanged) -> Result<T> + Clone + Send + Sync + 'a,
        // Made as they are run: a 100,000-row call holds only its window's messages.
        I: IntoIterator<Item = Vec<Framed>>,
        I::IntoIter: Send + 'a,
    {
        futures::stream::iter(chunks).map(move |chunk| self.chunk(chunk, keep.clone())).buffered(window.max(1))
    }

    /// One sub-batch: its inputs looked up in the pool's cache, then one grant for all its
    /// misses, their calls in flight together, within the deadline, kept as they come so the
    /// answer bytes do not outlive their sub-batch. Hits take no permit and wait for nothing.
    async fn chunk<T, K>(self, chunk: Vec<Framed>, keep: K) -> Result<Chunk<T>>
    where
        K: Fn(Exchanged) -> Result<T>,
    {
        let Self { forwarder, pool, meta, carried, rpc } = self;
        let inputs = chunk.len();
        let cache = pool.cache_for(rpc, meta.tenant.as_deref());
        let looked = match &cache {
            Some(cache) => Some(cache.look_up(&chunk.iter().map(|m| m.as_ref()).collect::<Vec<_>>()).await),
            None => None,
        };
        let hits = looked.as_ref().map_or(0, |looked| looked.hits());
        let is_hit = |i: usize| looked.as_ref().is_some_and(|looked| looked.answers[i].is_some());
        let grant = match rpc.admit {
            Admit::Permit if hits < inputs => {
                let misses = chunk.iter().enumerate().filter(|(i, _)| !is_hit(*i)).map(|(_, m)| m.as_ref());
                Some(charge::admit(pool, meta, charge::cost_of_all(pool, rpc, misses)).await?)
            }
            _ => None,
        };
        let admitted = Instant::now();
        let calls = chunk.into_iter().enumerate().map(|(i, message)| {
            if let Some(hit) = looked.as_ref().and_then(|looked| looked.answers[i].clone()) {
                return futures::future::ready(keep(Ok((Response::new(hit), None))).map(|kept| (kept, None)))
                    .left_future();
            }
            let request = tonic::Request::from_parts(carried.clone(), tonic::Extensions::default(), message);
            let (cache, looked, keep) = (&cache, &looked, &keep);
            forwarder
                .exchange(pool, rpc, meta, request, grant.as_ref())
                .map(move |exchanged| {
                    if let (Some(cache), Some(looked), Ok((answer, _))) = (cache, looked, &exchanged) {
                        cache.keep(looked, i, answer.get_ref());
                    }
                    let timing = exchanged.as_ref().ok().and_then(|(_, timing)| *timing);
                    keep(exchanged).map(|kept| (kept, timing))
                })
                .right_future()
        });
        let kept = futures::future::try_join_all(calls).await?;
        drop(grant);
        let timing = kept.iter().rev().find_map(|(_, timing)| *timing);
        let answers = kept.into_iter().map(|(answer, _)| answer).collect();
        Ok(Chunk { answers, admitted, timing, hits, cached: cache.is_some() })
    }
}

/// What a stream spread over the pool owns: its answers outlive the call's future.
pub struct Spread {
    pub forwarder: Arc<Forwarder>,
    pub pool: Arc<Pool>,
    pub meta: RequestMeta,
    pub carried: MetadataMap,
    /// The unary row each message is sent as (`Rpc::unary`).
    pub rpc: &'static Rpc,
}

impl Spread {
    /// A stream's messages as sub-batches of the messages that are in (at most `size`, never
    /// waiting for more), each admitted on its own and sent to whichever replica has room, at
    /// most `window` at once; the answers in the messages' order. A message that cannot be read,
    /// or one refused, ends the answers with its error (as TEI ends a stream). `tally` counts
    /// the messages' lookups as their sub-batches are answered.
    pub fn answers(
        self,
        messages: MessageStream,
        size: usize,
        window: usize,
        tally: Arc<Mutex<CacheTally>>,
    ) -> impl Stream<Item = Result<Bytes>> + Send {
        let spread = Arc::new(self);
        messages
            .ready_chunks(size.max(1))
            .map(move |chunk| {
                let spread = spread.clone();
                async move {
                    let chunk = chunk
                        .into_iter()
                        .map(|message| message.map(|message| Framed::new(&message)).map_err(Error::Message))
                        .collect::<Result<Vec<_>>>()?;
                    let Self { forwarder, pool, meta, carried, rpc } = &*spread;
                    let bulk = Bulk { forwarder, pool, meta, carried, rpc };
                    bulk.chunk(chunk, |exchanged: Exchanged| exchanged.map(|(answer, _)| answer.into_inner())).await
                }
            })
            .buffered(window.max(1))
            .map_ok(move |chunk| {
                tally.lock().unwrap_or_else(|p| p.into_inner()).add(&chunk);
                futures::stream::iter(chunk.answers.into_iter().map(|answer| Ok(answer.into_message())))
            })
            .try_flatten()
    }
}

/// How many messages one sub-batch of `pool` carries for a call of `lane`: TEI's max client batch
/// size, and no more than half one replica's share of the budget: a whole share could never spill
/// to a sibling beside anything else, and a replica whose share one sub-batch fills idles from its
/// answer to the next sub-batch's admission (measured: scenario 18's replica left a third idle).
/// Ingest goes in sixteenths of the share: a sub-batch is only a unit of admission (its messages
/// are TEI calls of their own), and while queries come ingest takes the places they leave in TEI's
/// next batch, which a sub-batch as large as that batch cannot fit into beside any query (it went
/// in after the batch had started with the queries alone, and the next queries waited behind it:
/// bench scenario 20's queries beside a job, p99 1.8x alone); and the places the learned query
/// reserve leaves (`admission/ingest_gate.rs`) are filled within an eighth of a batch, not a
/// quarter.
pub fn sub_batch(pool: &Pool, max_client_batch_size: usize, lane: Lane) -> usize {
    let share = pool.admission.snapshot().limits.max_in_flight;
    let part = match lane {
        Lane::Query => share / 2,
        Lane::Ingest => share / INGEST_PARTS,
    };
    max_client_batch_size.min(part).max(1)
}

/// Ingest sub-batches per replica share (see [`sub_batch`]).
const INGEST_PARTS: usize = 16;

/// How many sub-batches of `size` a bulk call keeps in flight: enough for this replica's share and
/// every sibling's window to be busy at once, and one more waiting its turn here, so no replica
/// idles between one sub-batch's answer and the next.
pub fn window(pool: &Pool, size: usize) -> usize {
    let share = pool.admission.snapshot().limits.max_in_flight;
    let siblings = match &pool.siblings {
        Some(siblings) => siblings.slots().min(window_cap(share).saturating_mul(MAX_SIBLINGS)),
        None => 0,
    };
    (share.saturating_add(siblings).div_ceil(size.max(1)) + 1).clamp(2, MAX_WINDOW)
}

/// Bounds on a window whatever the pool says: siblings counted, and sub-batches in flight.
const MAX_SIBLINGS: usize = 64;
const MAX_WINDOW: usize = 256;

/// TEI refused this one message (bad input: empty, too long without truncation, an unknown
/// prompt): its words, for a per-row error; anything else is the whole call's failure.
pub fn refused_row(error: &Error) -> Option<&Status> {
    match error {
        Error::Upstream { status, .. } if status.code() == tonic::Code::InvalidArgument => Some(status),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(answers: usize, hits: usize, cached: bool) -> Chunk<()> {
        Chunk { answers: vec![(); answers], admitted: Instant::now(), timing: None, hits, cached }
    }

    #[test]
    fn a_tally_over_sub_batches_says_what_the_whole_call_found() {
        let tally = |chunks: &[Chunk<()>]| {
            let mut tally = CacheTally::default();
            chunks.iter().for_each(|chunk| tally.add(chunk));
            tally
        };
        assert_eq!(tally(&[]).header(), None, "nothing looked up");
        assert_eq!(tally(&[chunk(3, 0, false)]).header(), None, "no cache");
        assert_eq!(tally(&[chunk(3, 0, true), chunk(2, 0, true)]).header(), Some("miss"));
        assert_eq!(tally(&[chunk(3, 3, true), chunk(2, 0, true)]).header(), Some("partial"));
        assert_eq!(tally(&[chunk(3, 3, true), chunk(2, 2, true)]).header(), Some("hit"));
        assert!(tally(&[chunk(3, 0, false)]).ended().metadata().is_empty(), "no trailer without a cache");
        let ended = tally(&[chunk(1, 1, true)]).ended();
        assert_eq!(ended.code(), tonic::Code::Ok);
        assert_eq!(ended.metadata().get(crate::cache::HEADER).unwrap(), "hit");
        let trailers = crate::front::grpc::stream_body::trailers(&ended).unwrap();
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
        assert_eq!(trailers.get(crate::cache::HEADER).unwrap(), "hit");
    }
}
