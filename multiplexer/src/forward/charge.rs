//! What a call is charged and what it pays back: its cost in the pool's units (inputs, estimated
//! tokens), the wait for its permit (here, or room at a sibling replica), and TEI's timing of its
//! answer fed to the pool's estimates through that permit. Every path (unary, coalesced, stream
//! messages, HTTP batches) uses these.

use crate::admission::{Ask, Cost, Observation, Permit};
use crate::error::{Error, Result};
use crate::forward::pools::Pool;
use crate::forward::siblings::Lease;
use crate::gate::request_meta::RequestMeta;
use crate::vocab::rpc::{Inputs, Rpc};
use crate::vocab::wire::{self, TeiTiming};

/// Where an admitted unary call goes: this replica's TEI under a permit, or a sibling replica of
/// the pool that had room.
pub enum Grant {
    Local(Permit),
    Sibling(Lease),
}

impl Grant {
    /// The local permit, if the call stays here.
    pub fn permit(&self) -> Option<&Permit> {
        match self {
            Self::Local(permit) => Some(permit),
            Self::Sibling(_) => None,
        }
    }
}

/// What a call with `meta` asks of admission for `cost`.
pub fn ask(meta: &RequestMeta, cost: Cost) -> Ask<'_> {
    Ask::new(meta.priority)
        .lane(meta.lane)
        .tenant(meta.tenant.as_deref())
        .deadline(meta.deadline)
        .cost(cost)
        .patient(meta.through_door)
}

/// Waits in `pool`'s queue for room for `cost` here, on this replica's TEI. A call a sibling
/// spilled here waits at most [`spilled_patience`], in line with this replica's own callers, or is
/// refused (for any reason: full, too slow), so the sibling serves it itself.
pub async fn acquire(pool: &Pool, meta: &RequestMeta, cost: Cost) -> Result<Permit> {
    let ask = ask(meta, cost);
    let Some(from) = &meta.spilled_from else {
        return pool
            .admission
            .acquire(ask)
            .await
            .map_err(|source| Error::Admission { pool: pool.spec.name.clone(), source });
    };
    // Boxed: every waiting call's future would otherwise carry this rare wait's timer.
    match Box::pin(tokio::time::timeout(spilled_patience(pool), pool.admission.acquire(ask))).await {
        Ok(Ok(permit)) => Ok(permit),
        Ok(Err(_)) | Err(_) => Err(Error::SpillRefused { pool: pool.spec.name.clone(), from: from.clone() }),
    }
}

/// How long a spilled call may wait here: about two calls' service time, enough for the few a
/// sibling keeps waiting here (`siblings::window_cap`) to be taken in turn, never long enough to
/// matter to this replica's own callers, who it waits in line with.
fn spilled_patience(pool: &Pool) -> std::time::Duration {
    use std::time::Duration;
    let service = pool.admission.mean_service_time().unwrap_or(Duration::from_millis(100));
    (service * 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Room for a unary call's `cost` in the pool: here when there is some, else at a sibling replica
/// with room, else a turn in this replica's queue, taken by whichever of the two frees first.
pub async fn admit(pool: &Pool, meta: &RequestMeta, cost: Cost) -> Result<Grant> {
    let siblings = match &pool.siblings {
        Some(siblings) if meta.spilled_from.is_none() => siblings,
        _ => return acquire(pool, meta, cost).await.map(Grant::Local),
    };
    // The queue here drains through the siblings too: its expected waits and hints count them.
    let slots = siblings.slots();
    pool.admission.set_spill_slots(slots);
    if slots == 0 {
        return acquire(pool, meta, cost).await.map(Grant::Local);
    }
    if let Some(permit) = pool.admission.try_acquire(&ask(meta, cost)) {
        return Ok(Grant::Local(permit));
    }
    let (inputs, share) = (cost.inputs as usize, pool.admission.snapshot().limits.max_in_flight);
    let room = siblings.room();
    if let Some(lease) = siblings.try_lease(inputs, share) {
        return Ok(Grant::Sibling(lease));
    }
    let here = acquire(pool, meta, cost);
    tokio::pin!(here, room);
    loop {
        tokio::select! {
            permit = &mut here => return permit.map(Grant::Local),
            () = &mut room => {
                room.set(siblings.room());
                if let Some(lease) = siblings.try_lease(inputs, share) {
                    return Ok(Grant::Sibling(lease));
                }
            }
        }
    }
}

/// The cost of a call known from its RPC alone, before its body is read: one input, when the pool
/// counts no tokens.
pub fn cost_before_body(pool: &Pool, rpc: &Rpc) -> Option<Cost> {
    (rpc.inputs == Inputs::One && !pool.admission.counts_tokens()).then_some(Cost::ONE)
}

/// What a request message costs: its inputs, and its estimated tokens when the pool counts them.
pub fn cost_of(pool: &Pool, rpc: &Rpc, message: &[u8]) -> Cost {
    let size = size_of(rpc, message);
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

/// The inputs of one request message (what [`cost_of`] counts, without the tokens).
pub fn inputs_of(rpc: &Rpc, message: &[u8]) -> u32 {
    size_of(rpc, message).inputs.max(1)
}

fn size_of(rpc: &Rpc, message: &[u8]) -> wire::RequestSize {
    let per_field = match rpc.inputs {
        Inputs::PerField(field) => Some(field),
        Inputs::One | Inputs::None => None,
    };
    wire::request_size(message, per_field, rpc.text_fields)
}

/// Tells the pool what TEI reported for an answer, through the permit that covered it: an answer
/// to `inputs` of its inputs, or to all of them (`None`).
pub fn observe(permit: Option<&Permit>, timing: Option<TeiTiming>, inputs: Option<u32>) {
    if let (Some(permit), Some(timing)) = (permit, timing) {
        let observation = Observation {
            tei_queue: timing.queue,
            tei_inference: timing.inference,
            chars: timing.compute_chars,
            tokens: timing.compute_tokens,
        };
        permit.observe_answer(observation, inputs.unwrap_or(permit.cost().inputs));
    }
}
