//! The open loop: every send time is computed before the run; a dispatcher sends each request
//! when it is due, whether or not earlier ones were answered, and latency counts from the due
//! time, so a stalled server cannot hide its stall by slowing the generator down (no coordinated
//! omission). How late the dispatcher itself was is recorded as well.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{CallSpec, Connection, LoadConfig, LoopOutcome};
use crate::arrivals::{self, Arrivals};
use crate::codes;
use crate::report::Answer;
use crate::sink::Sink;

pub(super) async fn run(
    config: &LoadConfig,
    rate: f64,
    kind: Arrivals,
    channels: Vec<Connection>,
    spec: CallSpec,
    sink: Arc<Sink>,
    start: Instant,
) -> LoopOutcome {
    let schedule = arrivals::schedule(kind, rate, config.requests, config.duration, config.seed);
    let span = schedule.last().map(|last| *last + Duration::from_secs_f64(1.0 / rate));
    let spec = Arc::new(spec);
    let handle = tokio::runtime::Handle::current();
    let dispatch_schedule = schedule.clone();
    // The dispatcher is a plain thread: the OS sleeps it to within tens of microseconds of each
    // due time, where the async timer's 1 ms ticks would make every send up to 1 ms late.
    let dispatcher = tokio::task::spawn_blocking(move || {
        let mut tasks = JoinSet::new();
        for (index, offset) in dispatch_schedule.iter().enumerate() {
            let due = start + *offset;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let index = index as u64;
            let channel = channels[usize::try_from(index).unwrap_or(0) % channels.len()].clone();
            let (spec, sink) = (spec.clone(), sink.clone());
            tasks.spawn_on(
                async move {
                    // Taken inside the task, so spawn delays count as lateness too.
                    let sent = Instant::now();
                    sink.sent.fetch_add(1, Ordering::Relaxed);
                    let call = spec.send(&channel, index).await;
                    let done = Instant::now();
                    let latency = done - due;
                    let in_time = spec.deadline.is_none_or(|d| latency <= d);
                    let answer = Answer {
                        latency,
                        response: done - sent,
                        lateness: Some(sent.saturating_duration_since(due)),
                        code: codes::name(call.code),
                        in_time,
                        server: call.server,
                        attempts: call.attempts,
                        hints: call.hints,
                    };
                    sink.record(&answer, done);
                },
                &handle,
            );
            // Reap finished tasks as we go so a long run does not hold every result.
            while tasks.try_join_next().is_some() {}
        }
        tasks
    });
    let mut tasks = match dispatcher.await {
        Ok(tasks) => tasks,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    let last_due = start + schedule.last().copied().unwrap_or_default();
    let until = last_due.max(Instant::now()) + config.grace;
    let unfinished = super::closed::drain(&mut tasks, move || until).await;
    LoopOutcome { first_due: start, unfinished, schedule_span: span }
}
