//! The gRPC side: admission, the path of one request through tokenizer, queue and device, and the
//! five TEI services built on it (one file each).

mod embed;
mod health;
mod info;
mod predict;
mod rerank;
mod stream;
mod tokenize;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use teifleet_proto::v1::{Metadata, TruncationDirection};
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::time::Instant;
use tonic::{Response, Status};

pub(crate) use health::health_service;

use crate::batcher::Entry;
use crate::config::Fault;
use crate::metrics::FailureKind;
use crate::state::State;
use crate::stats::Counters;
use crate::tokenizer::{self, SPECIAL_TOKENS_PER_SEQUENCE, Word};

/// TEI's wording, so clients that match on it behave the same against the simulator.
const OVERLOADED: &str = "Model is overloaded";
const UNHEALTHY: &str = "Model is not healthy (simulated fault)";
const SHUTTING_DOWN: &str = "Simulator is shutting down";

/// Implements every TEI service over the shared state.
#[derive(Clone, Debug)]
pub(crate) struct Sim {
    state: Arc<State>,
}

impl Sim {
    pub(crate) fn new(state: Arc<State>) -> Self {
        Self { state }
    }

    /// Counts the call and refuses it at once while the `fail` fault is on.
    fn receive(&self, inference: bool) -> Result<Instant, Status> {
        let received = Instant::now();
        self.state.counters.received();
        if inference {
            self.state.metrics.request_count.inc();
        }
        match self.state.fault() {
            Fault::Fail => Err(Status::unavailable(UNHEALTHY)),
            Fault::None | Fault::Stall => Ok(received),
        }
    }

    /// Unary admission: no free slot means overloaded, now.
    fn try_admit(&self) -> Result<Slot, Status> {
        match self.state.slots.clone().try_acquire_owned() {
            Ok(permit) => Ok(Slot::new(permit, &self.state.counters)),
            Err(_) => {
                self.state.counters.refused_overloaded();
                Err(Status::resource_exhausted(OVERLOADED))
            }
        }
    }

    /// Streaming admission: wait for a slot.
    async fn admit(&self) -> Result<Slot, Status> {
        tokio::select! {
            permit = self.state.slots.clone().acquire_owned() => match permit {
                Ok(permit) => Ok(Slot::new(permit, &self.state.counters)),
                Err(_) => Err(Status::unavailable(SHUTTING_DOWN)),
            },
            () = self.state.shutdown.cancelled() => Err(Status::unavailable(SHUTTING_DOWN)),
        }
    }

    fn record<T>(&self, result: &Result<T, Status>, inference: bool) {
        match result {
            Ok(_) => {
                self.state.counters.completed();
                if inference {
                    self.state.metrics.request_success.inc();
                }
            }
            Err(status) if inference => self.state.metrics.failure(FailureKind::of(status.code())),
            Err(_) => {}
        }
    }

    /// A unary inference call: admitted only if a slot is free, the slot held until `f` answers.
    async fn unary<Req, Resp, F, Fut>(&self, request: Req, f: F) -> Result<Response<Resp>, Status>
    where
        F: FnOnce(Admitted, Req) -> Fut,
        Fut: Future<Output = Result<Resp, Status>>,
    {
        let result = async {
            let received = self.receive(true)?;
            let slot = self.try_admit()?;
            f(Admitted { sim: self.clone(), _slot: slot, received }, request).await
        }
        .await;
        self.record(&result, true);
        result.map(Response::new)
    }

    /// A call that needs neither a slot nor the device (Info, Tokenize, Decode).
    fn direct<Resp>(&self, f: impl FnOnce() -> Result<Resp, Status>) -> Result<Response<Resp>, Status> {
        let result = self.receive(false).and_then(|_| f());
        self.record(&result, false);
        result.map(Response::new)
    }
}

/// An admission slot; releasing it (on drop) is what lets the next request in.
#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    counters: Arc<Counters>,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, counters: &Arc<Counters>) -> Self {
        counters.admitted();
        Self { _permit: permit, counters: Arc::clone(counters) }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counters.released();
    }
}

/// A request that holds a slot; dropping it (when the answer is built, or the caller leaves)
/// releases the slot.
#[derive(Debug)]
pub(crate) struct Admitted {
    sim: Sim,
    _slot: Slot,
    received: Instant,
}

/// One input after tokenization and truncation.
#[derive(Debug)]
pub(crate) struct Sequence {
    /// The text the model saw: the input, or the kept part of it when truncated.
    pub(crate) text: String,
    /// The kept words, with offsets into `text`.
    pub(crate) words: Vec<Word>,
}

/// The device's answer to one request: its tokenized inputs and where the time went.
#[derive(Debug)]
pub(crate) struct Inference {
    pub(crate) sequences: Vec<Sequence>,
    pub(crate) metadata: Metadata,
}

impl Admitted {
    pub(crate) fn dimensions(&self) -> usize {
        self.sim.state.config.dimensions
    }

    pub(crate) fn max_client_batch_size(&self) -> usize {
        self.sim.state.config.max_client_batch_size
    }

    /// Tokenizes `inputs`, queues them as one request and waits for the device to run its batch.
    ///
    /// Each input is limited to `max_batch_tokens` tokens (the simulator's only length limit):
    /// longer inputs are refused with `INVALID_ARGUMENT` unless `truncate` is set, in which case
    /// they are cut to `max_batch_tokens` tokens from the side `direction` names.
    pub(crate) async fn infer(
        &self,
        inputs: &[&str],
        truncate: bool,
        direction: TruncationDirection,
    ) -> Result<Inference, Status> {
        let state = &self.sim.state;
        self.wait_out_stall().await?;
        if inputs.iter().any(|i| i.is_empty()) {
            return Err(Status::invalid_argument("`inputs` cannot be empty"));
        }

        let tokenization_started = Instant::now();
        let max_tokens = state.config.max_batch_tokens;
        let mut sequences = Vec::with_capacity(inputs.len());
        for input in inputs {
            sequences.push(tokenize(input, max_tokens, truncate, direction)?);
        }
        let tokens: usize = sequences.iter().map(|s| s.words.len() + SPECIAL_TOKENS_PER_SEQUENCE).sum();
        // Clamped to 1ns so a timing is never reported as absent on a very fast machine.
        let tokenization_time = tokenization_started.elapsed().max(Duration::from_nanos(1));
        state.metrics.input_length.observe(tokens as f64);

        let (reply, answer) = oneshot::channel();
        let entry = Entry { tokens, enqueued: Instant::now(), reply };
        state.queue.send(entry).map_err(|_| Status::unavailable(SHUTTING_DOWN))?;
        let run = answer.await.map_err(|_| Status::unavailable(SHUTTING_DOWN))?;

        let total_time = self.received.elapsed();
        state.metrics.observe_timings(tokenization_time, run.queue_time, run.inference_time, total_time);
        let metadata = Metadata {
            compute_chars: saturate(inputs.iter().map(|i| i.chars().count()).sum()),
            compute_tokens: saturate(tokens),
            total_time_ns: nanos(total_time),
            tokenization_time_ns: nanos(tokenization_time),
            queue_time_ns: nanos(run.queue_time),
            inference_time_ns: nanos(run.inference_time),
        };
        Ok(Inference { sequences, metadata })
    }

    /// Holds the request (and its slot) while the `stall` fault is on.
    async fn wait_out_stall(&self) -> Result<(), Status> {
        let state = &self.sim.state;
        let mut fault = state.fault.subscribe();
        let fault = tokio::select! {
            f = fault.wait_for(|f| *f != Fault::Stall) => f.map(|f| *f).unwrap_or(Fault::None),
            () = state.shutdown.cancelled() => return Err(Status::unavailable(SHUTTING_DOWN)),
        };
        match fault {
            Fault::Fail => Err(Status::unavailable(UNHEALTHY)),
            Fault::None | Fault::Stall => Ok(()),
        }
    }
}

fn tokenize(
    input: &str,
    max_tokens: usize,
    truncate: bool,
    direction: TruncationDirection,
) -> Result<Sequence, Status> {
    let words = tokenizer::words(input);
    let tokens = words.len() + SPECIAL_TOKENS_PER_SEQUENCE;
    if tokens <= max_tokens {
        return Ok(Sequence { text: input.to_owned(), words });
    }
    if !truncate {
        return Err(Status::invalid_argument(format!(
            "`inputs` must have less than {max_tokens} tokens. Given: {tokens}"
        )));
    }
    let keep = max_tokens.saturating_sub(SPECIAL_TOKENS_PER_SEQUENCE);
    let kept = match direction {
        TruncationDirection::Right => &words[..keep],
        TruncationDirection::Left => &words[words.len() - keep..],
    };
    let (Some(first), Some(last)) = (kept.first(), kept.last()) else {
        return Ok(Sequence { text: String::new(), words: Vec::new() });
    };
    let text = input[first.start..last.stop].to_owned();
    Ok(Sequence { words: tokenizer::words(&text), text })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_input_is_refused_or_truncated() {
        let input = "a b c d e f";
        assert!(tokenize(input, 8, false, TruncationDirection::Right).is_ok());
        assert_eq!(
            tokenize(input, 5, false, TruncationDirection::Right).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let right = tokenize(input, 5, true, TruncationDirection::Right).unwrap();
        assert_eq!((right.text.as_str(), right.words.len()), ("a b c", 3));
        let left = tokenize(input, 5, true, TruncationDirection::Left).unwrap();
        assert_eq!(left.text, "d e f");
        let none = tokenize(input, 2, true, TruncationDirection::Left).unwrap();
        assert!(none.words.is_empty());
    }
}
