//! The closed loop: a fixed number of workers, each sending its next request as soon as the
//! previous one is answered (the model of seeds 001 and 004). Latency counts from the send.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{CallSpec, Connection, LoadConfig, LoopOutcome};
use crate::codes;
use crate::report::Answer;
use crate::sink::Sink;

pub(super) async fn run(
    config: &LoadConfig,
    concurrency: usize,
    channels: Vec<Connection>,
    spec: CallSpec,
    sink: Arc<Sink>,
    start: Instant,
) -> LoopOutcome {
    let stop_sending = start + config.duration;
    let next = Arc::new(AtomicU64::new(0));
    // When the last request went out, in microseconds after `start` (0: not yet). The grace
    // period counts from then, or from the end of --duration, whichever comes first.
    let all_sent = Arc::new(AtomicU64::new(0));
    let spec = Arc::new(spec);
    let mut tasks = JoinSet::new();
    for worker in 0..concurrency {
        let channel = channels[worker % channels.len()].clone();
        let (spec, sink, next, all_sent, requests) =
            (spec.clone(), sink.clone(), next.clone(), all_sent.clone(), config.requests);
        tasks.spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= requests || Instant::now() >= stop_sending {
                    break;
                }
                let sent = Instant::now();
                if index + 1 == requests {
                    let micros = u64::try_from(sent.duration_since(start).as_micros()).unwrap_or(u64::MAX);
                    all_sent.store(micros.max(1), Ordering::Relaxed);
                }
                sink.sent.fetch_add(1, Ordering::Relaxed);
                let call = spec.send(&channel, index).await;
                let done = Instant::now();
                let latency = done - sent;
                let in_time = spec.deadline.is_none_or(|d| latency <= d);
                let answer = Answer {
                    latency,
                    response: latency,
                    lateness: None,
                    code: codes::name(call.code),
                    in_time,
                    server: call.server,
                    attempts: call.attempts,
                    hints: call.hints,
                };
                sink.record(&answer, done);
            }
        });
    }
    let grace = config.grace;
    let until = move || match all_sent.load(Ordering::Relaxed) {
        0 => stop_sending + grace,
        micros => (start + Duration::from_micros(micros)).min(stop_sending) + grace,
    };
    let unfinished = drain(&mut tasks, until).await;
    // Workers that were cut off each had one request out.
    LoopOutcome { first_due: start, unfinished, schedule_span: None }
}

/// Waits for `tasks` until `until()` (re-read as tasks finish), then cancels what is left
/// (dropping a call cancels it on the wire) and returns how many were cut off.
pub(super) async fn drain(tasks: &mut JoinSet<()>, until: impl Fn() -> Instant) -> u64 {
    loop {
        // Re-checked at least every 50 ms, since `until` may move earlier while we wait.
        let remaining = until().saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break;
        }
        match tokio::time::timeout(remaining.min(Duration::from_millis(50)), tasks.join_next()).await {
            Ok(Some(_)) | Err(_) => {}
            Ok(None) => return 0,
        }
    }
    let left = tasks.len() as u64;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    left
}
