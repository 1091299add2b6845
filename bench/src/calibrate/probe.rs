//! Drives `tei.v1.Embed/Embed` at a fixed concurrency with one input, and keeps what TEI says
//! about each call: its Metadata's token count and tokenization, queue and inference times.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use teifleet_proto::v1::EmbedRequest;
use teifleet_proto::v1::embed_client::EmbedClient;
use tonic::transport::Channel;

/// What one call took, by TEI's clock and by the caller's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallSample {
    /// Tokens of the input, special tokens included (TEI's `compute_tokens`).
    pub tokens: u32,
    pub tokenization: Duration,
    pub queue: Duration,
    /// The whole batch's device time: every call of one batch reports the same value.
    pub inference: Duration,
    /// TEI's total, from receiving the call to its answer.
    pub total: Duration,
    /// Send to answer, at the caller.
    pub latency: Duration,
}

/// A text of real words that `tokens` BERT word pieces encode, special tokens included: each
/// word is one piece of MiniLM's vocabulary, and [CLS] and [SEP] are added.
pub fn text(tokens: usize) -> String {
    teifleet_load::inputs::text(tokens.saturating_sub(2).max(1))
}

/// `calls` calls from `concurrency` callers, each sending its next call when its last is
/// answered (closed loop), over one HTTP/2 connection as TEI's clients multiplex them. Returns
/// the samples and the wall time of the whole run.
pub async fn drive(
    channel: &Channel,
    text: &str,
    concurrency: usize,
    calls: usize,
) -> anyhow::Result<(Vec<CallSample>, Duration)> {
    let text: Arc<str> = text.into();
    let started = Instant::now();
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..concurrency {
        // Calls spread evenly, the first callers taking the remainder.
        let share = calls / concurrency + usize::from(caller < calls % concurrency);
        let mut client = EmbedClient::new(channel.clone());
        let text = Arc::clone(&text);
        callers.spawn(async move {
            let mut samples = Vec::with_capacity(share);
            for _ in 0..share {
                samples.push(call(&mut client, &text).await?);
            }
            anyhow::Ok(samples)
        });
    }
    let mut samples = Vec::with_capacity(calls);
    while let Some(done) = callers.join_next().await {
        samples.extend(done??);
    }
    Ok((samples, started.elapsed()))
}

async fn call(client: &mut EmbedClient<Channel>, text: &str) -> anyhow::Result<CallSample> {
    let request = EmbedRequest { inputs: text.to_owned(), truncate: true, ..EmbedRequest::default() };
    let sent = Instant::now();
    let answer = client.embed(request).await.context("Embed")?.into_inner();
    let latency = sent.elapsed();
    let m = answer.metadata.context("an Embed answer without Metadata")?;
    Ok(CallSample {
        tokens: m.compute_tokens,
        tokenization: Duration::from_nanos(m.tokenization_time_ns),
        queue: Duration::from_nanos(m.queue_time_ns),
        inference: Duration::from_nanos(m.inference_time_ns),
        total: Duration::from_nanos(m.total_time_ns),
        latency,
    })
}

/// The batches a run's calls went in, as sizes: TEI gives every call of a batch the batch's
/// measured inference time, to the nanosecond, so calls sharing one value shared a batch.
pub fn batches(samples: &[CallSample]) -> Vec<(usize, Duration)> {
    let mut by_time: std::collections::BTreeMap<Duration, usize> = std::collections::BTreeMap::new();
    for s in samples {
        *by_time.entry(s.inference).or_default() += 1;
    }
    by_time.into_iter().map(|(time, size)| (size, time)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(inference_us: u64) -> CallSample {
        let d = Duration::from_micros(inference_us);
        CallSample { tokens: 10, tokenization: d, queue: d, inference: d, total: d, latency: d }
    }

    #[test]
    fn calls_sharing_an_inference_time_shared_a_batch() {
        let samples = [sample(5), sample(7), sample(5), sample(5), sample(9), sample(7)];
        let us = Duration::from_micros;
        assert_eq!(batches(&samples), vec![(3, us(5)), (2, us(7)), (1, us(9))]);
    }

    #[test]
    fn texts_are_real_words_of_the_asked_token_count() {
        assert_eq!(text(8).split_whitespace().count(), 6);
        assert_eq!(text(256).split_whitespace().count(), 254);
        assert!(text(32).split_whitespace().all(|w| w.chars().all(|c| c.is_ascii_lowercase())));
    }
}
