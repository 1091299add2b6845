//! A batch of HTTP inputs as `tei.v1` unary calls through the gRPC front's own routing,
//! admission, deadline and accounting: one `Call` per HTTP request, one permit per chunk of at
//! most TEI's max client batch size (charged the chunk's inputs at once), the chunk's calls sent
//! concurrently, the answers returned in input order.

use std::borrow::Cow;

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use http::{HeaderMap, HeaderName, HeaderValue};
use prost::Message;
use teifleet_wire::headers::{CARRIED_TO_PEERS, GRPC_TIMEOUT, TIMEOUT_MS};
use tokio::time::Instant;
use tonic::Request;
use tonic::metadata::MetadataMap;

use super::error::HttpError;
use crate::admission::Cost;
use crate::call::Protocol;
use crate::forward::{Forwarder, acquire, cost_of, observe, timing};
use crate::pools::Pool;
use crate::request_meta::RequestMeta;
use crate::rpc::{self, Admit, Rpc};
use crate::{Error, Result};

/// Chunks waiting for or holding a permit at once: the next chunk queues while one runs, so a
/// long batch keeps TEI busy without flooding the queue it is admitted through.
const CHUNKS_AT_ONCE: usize = 2;

/// The table's row for `path`.
pub fn row(path: &str) -> &'static Rpc {
    rpc::find(path).unwrap_or_else(|| panic!("{path} is a row of rpc::RPCS"))
}

/// Sends each request as one unary call of `rpc` and decodes the answers, in order. `per_permit`
/// requests share one permit.
pub async fn unary_all<Req: Message, Resp: Message + Default>(
    forwarder: &Forwarder,
    rpc: &'static Rpc,
    headers: &HeaderMap,
    requests: &[Req],
    per_permit: usize,
) -> Result<Vec<Resp>, HttpError> {
    let messages: Vec<Bytes> = requests.iter().map(|r| Bytes::from(r.encode_to_vec())).collect();
    let answers = run(forwarder, rpc, headers, &messages, per_permit).await?;
    answers
        .iter()
        .map(|answer| Resp::decode(answer.as_ref()).map_err(|e| HttpError::Undecodable(e.to_string())))
        .collect()
}

/// Routes, admits and forwards `messages` as one request of `rpc`.
pub async fn run(
    forwarder: &Forwarder,
    rpc: &'static Rpc,
    headers: &HeaderMap,
    messages: &[Bytes],
    per_permit: usize,
) -> Result<Vec<Bytes>, HttpError> {
    let headers = with_timeout(headers).map_err(HttpError::Call)?;
    let mut call = forwarder.call(rpc, Protocol::Http);
    let (meta, pool) = match forwarder.route(&mut call, &headers) {
        Ok(routed) => routed,
        Err(error) => {
            call.fail(error.clone());
            return Err(HttpError::Call(error));
        }
    };
    let carried = carried_to(&pool, &headers);
    // Owned chunks (Bytes clones are cheap): a closure over borrowed slices makes the future
    // higher-ranked over their lifetime, which axum's handlers cannot prove Send.
    let (pool, meta, carried) = (&pool, &meta, &carried);
    let chunks = futures::stream::iter(messages.chunks(per_permit.max(1)).map(<[Bytes]>::to_vec))
        .map(|chunk| run_chunk(forwarder, pool, meta, carried, rpc, chunk))
        .buffered(CHUNKS_AT_ONCE);
    let result: Result<Vec<(Vec<Bytes>, Instant)>> = chunks.try_collect().await;
    match result {
        Ok(done) => {
            if let Some((_, admitted)) = done.first()
                && rpc.admit == Admit::Permit
            {
                call.admitted_at(*admitted);
            }
            let answers: Vec<Bytes> = done.into_iter().flat_map(|(answers, _)| answers).collect();
            call.observe(answers.last().and_then(|answer| timing(rpc, answer)));
            call.succeed();
            Ok(answers)
        }
        Err(error) => {
            call.fail(error.clone());
            Err(HttpError::Call(error))
        }
    }
}

/// The caller's headers with its `x-teifleet-timeout-ms` as the `grpc-timeout` the routing reads,
/// so both fronts share one deadline path.
fn with_timeout(headers: &HeaderMap) -> Result<Cow<'_, HeaderMap>> {
    let Some(value) = headers.get(TIMEOUT_MS) else { return Ok(Cow::Borrowed(headers)) };
    let invalid =
        || Error::InvalidMetadata { header: TIMEOUT_MS, reason: "expected 1 to 99999999 milliseconds".into() };
    let millis: u32 = value.to_str().ok().and_then(|v| v.trim().parse().ok()).ok_or_else(invalid)?;
    if millis == 0 || millis > 99_999_999 {
        return Err(invalid());
    }
    let mut headers = headers.clone();
    headers.insert(GRPC_TIMEOUT, HeaderValue::from_str(&format!("{millis}m")).map_err(|_| invalid())?);
    Ok(Cow::Owned(headers))
}

/// The caller's headers that go along when `pool` is another pool's sidecar (its key, priority,
/// tenant and routing), so that sidecar decides as it would for the caller itself.
fn carried_to(pool: &Pool, headers: &HeaderMap) -> MetadataMap {
    let mut carried = HeaderMap::new();
    if pool.spec.remote {
        for name in CARRIED_TO_PEERS {
            for value in headers.get_all(name) {
                carried.append(HeaderName::from_static(name), value.clone());
            }
        }
    }
    MetadataMap::from_headers(carried)
}

/// One chunk: one permit for all its inputs, its calls in flight together, within the deadline.
async fn run_chunk(
    forwarder: &Forwarder,
    pool: &Pool,
    meta: &RequestMeta,
    carried: &MetadataMap,
    rpc: &'static Rpc,
    chunk: Vec<Bytes>,
) -> Result<(Vec<Bytes>, Instant)> {
    let permit = match rpc.admit {
        Admit::Permit => {
            let cost = chunk.iter().map(|message| cost_of(pool, rpc, message)).fold(
                Cost { inputs: 0, tokens: 0 },
                |sum, one| Cost {
                    inputs: sum.inputs.saturating_add(one.inputs),
                    tokens: sum.tokens.saturating_add(one.tokens),
                },
            );
            Some(acquire(pool, meta, cost).await?)
        }
        Admit::Free => None,
    };
    let admitted = Instant::now();
    let calls = chunk.into_iter().map(|message| {
        let request = Request::from_parts(carried.clone(), tonic::Extensions::default(), message);
        let request = forwarder.outgoing(request, meta, pool);
        forwarder.upstream_unary(pool, rpc, request)
    });
    let all = futures::future::try_join_all(calls);
    let responses = match meta.deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, all).await.unwrap_or_else(|_| {
            Err(Error::DeadlineAtUpstream { pool: pool.spec.name.clone(), waited: admitted.elapsed() })
        })?,
        None => all.await?,
    };
    let answers: Vec<Bytes> = responses.into_iter().map(tonic::Response::into_inner).collect();
    for answer in &answers {
        observe(permit.as_ref(), timing(rpc, answer));
    }
    drop(permit);
    Ok((answers, admitted))
}
