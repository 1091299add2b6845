//! What a call is charged and what it pays back: its cost in the pool's units (inputs, estimated
//! tokens), the wait for its permit, and TEI's timing of its answer fed to the pool's estimates
//! through that permit. Every path (unary, coalesced, stream messages, HTTP batches) uses these.

use crate::admission::{Ask, Cost, Observation, Permit};
use crate::pools::Pool;
use crate::request_meta::RequestMeta;
use crate::rpc::{Inputs, Rpc};
use crate::wire::{self, TeiTiming};
use crate::{Error, Result};

/// Waits in `pool`'s queue for room for `cost`.
pub async fn acquire(pool: &Pool, meta: &RequestMeta, cost: Cost) -> Result<Permit> {
    let ask = Ask::new(meta.priority).tenant(meta.tenant.as_deref()).deadline(meta.deadline).cost(cost);
    pool.admission.acquire(ask).await.map_err(|source| Error::Admission { pool: pool.spec.name.clone(), source })
}

/// The cost of a call known from its RPC alone, before its body is read: one input, when the pool
/// counts no tokens.
pub fn cost_before_body(pool: &Pool, rpc: &Rpc) -> Option<Cost> {
    (rpc.inputs == Inputs::One && !pool.admission.counts_tokens()).then_some(Cost::ONE)
}

/// What a request message costs: its inputs, and its estimated tokens when the pool counts them.
pub fn cost_of(pool: &Pool, rpc: &Rpc, message: &[u8]) -> Cost {
    let per_field = match rpc.inputs {
        Inputs::PerField(field) => Some(field),
        Inputs::One | Inputs::None => None,
    };
    let size = wire::request_size(message, per_field, rpc.text_fields);
    let inputs = size.inputs.max(1);
    let tokens =
        if pool.admission.counts_tokens() { pool.admission.estimate_tokens(size.text_bytes, inputs) } else { 0 };
    Cost { inputs, tokens }
}

/// What several messages sent under one permit cost together.
pub fn cost_of_all<'a>(pool: &Pool, rpc: &Rpc, messages: impl IntoIterator<Item = &'a [u8]>) -> Cost {
    messages.into_iter().map(|message| cost_of(pool, rpc, message)).fold(Cost { inputs: 0, tokens: 0 }, |sum, one| {
        Cost { inputs: sum.inputs.saturating_add(one.inputs), tokens: sum.tokens.saturating_add(one.tokens) }
    })
}

/// TEI's timing in an answer of `rpc`, for RPCs whose answers carry it.
pub fn timing(rpc: &Rpc, message: &[u8]) -> Option<TeiTiming> {
    if rpc.timed { wire::tei_timing(message) } else { None }
}

/// Tells the pool what TEI reported for an answer, through the permit that covered it.
pub fn observe(permit: Option<&Permit>, timing: Option<TeiTiming>) {
    if let (Some(permit), Some(timing)) = (permit, timing) {
        permit.observe(Observation {
            tei_queue: timing.queue,
            tei_inference: timing.inference,
            chars: timing.compute_chars,
            tokens: timing.compute_tokens,
        });
    }
}
