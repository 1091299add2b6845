//! The simulated device and the queue in front of it, shaped like TEI's router: admitted requests
//! queue in arrival order, the next batch is kept prepared (up to the token and request budgets)
//! while the current one runs, and the device runs one batch at a time.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Device;
use crate::metrics::Metrics;
use crate::shared_device::SharedDevice;
use crate::stats::Counters;

/// One admitted request waiting for the device.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) tokens: usize,
    pub(crate) enqueued: Instant,
    pub(crate) reply: oneshot::Sender<DeviceRun>,
}

/// What the device reports back to each request of a batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceRun {
    /// From enqueue to the start of the request's batch.
    pub(crate) queue_time: Duration,
    /// Measured device time of the whole batch.
    pub(crate) inference_time: Duration,
}

/// How much slower than configured the device runs right now, as a throttled or shared GPU
/// would: 1.0 is as configured, 2.0 takes twice the device time per batch (half the capacity).
#[derive(Debug)]
pub(crate) struct Slowdown(std::sync::atomic::AtomicU64);

impl Default for Slowdown {
    fn default() -> Self {
        Self(std::sync::atomic::AtomicU64::new(1.0f64.to_bits()))
    }
}

impl Slowdown {
    pub(crate) fn get(&self) -> f64 {
        f64::from_bits(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub(crate) fn set(&self, factor: f64) {
        self.0.store(factor.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchLimits {
    pub(crate) max_tokens: usize,
    pub(crate) max_requests: usize,
    pub(crate) fixed_latency: Duration,
    pub(crate) per_request_latency: Duration,
    pub(crate) per_token_latency: Duration,
    pub(crate) device: Device,
    pub(crate) freeze_next: bool,
}

impl BatchLimits {
    pub(crate) fn new(config: &crate::SimConfig) -> Self {
        Self {
            max_tokens: config.max_batch_tokens,
            max_requests: config.max_batch_requests.unwrap_or(usize::MAX),
            fixed_latency: config.fixed_latency,
            per_request_latency: config.per_request_latency,
            per_token_latency: config.per_token_latency,
            device: config.device,
            freeze_next: config.freeze_next_batch,
        }
    }

    /// The device time of a batch of `requests` sequences holding `tokens` tokens in all.
    fn device_time(&self, requests: usize, tokens: usize) -> Duration {
        let requests = u32::try_from(requests).unwrap_or(u32::MAX);
        let tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
        self.fixed_latency
            .saturating_add(self.per_request_latency.saturating_mul(requests))
            .saturating_add(self.per_token_latency.saturating_mul(tokens))
    }
}

#[derive(Debug, Default)]
struct Batch {
    entries: Vec<Entry>,
    tokens: usize,
}

impl Batch {
    /// Drops requests whose caller went away, so the device never spends time on them.
    fn prune(&mut self) {
        self.entries.retain(|e| !e.reply.is_closed());
        self.tokens = self.entries.iter().map(|e| e.tokens).sum();
    }

    /// Fills the prepared batch, unless it is frozen: TEI hands the batch it prepares to the
    /// device's one-slot channel as soon as it holds anything, and later arrivals wait for the
    /// batch after it.
    fn top_up(&mut self, queue: &mut VecDeque<Entry>, limits: &BatchLimits) {
        if !limits.freeze_next || self.entries.is_empty() {
            self.fill(queue, limits);
        }
    }

    /// Moves queued requests in, in order, while they fit. A request larger than the token budget
    /// (only possible for multi-sequence calls) still runs, alone, rather than blocking the queue.
    fn fill(&mut self, queue: &mut VecDeque<Entry>, limits: &BatchLimits) {
        while let Some(front) = queue.front() {
            if front.reply.is_closed() {
                queue.pop_front();
                continue;
            }
            let fits = self.entries.len() < limits.max_requests && self.tokens + front.tokens <= limits.max_tokens;
            if !(self.entries.is_empty() || fits) {
                break;
            }
            if let Some(entry) = queue.pop_front() {
                self.tokens += entry.tokens;
                self.entries.push(entry);
            }
        }
    }
}

struct Running {
    batch: Batch,
    started: Instant,
    work: DeviceWork,
}

/// The device busy with one batch.
enum DeviceWork {
    /// Done at this instant.
    Timer(Instant),
    /// Done when the thread burning the batch's CPU time returns.
    Cpu(JoinHandle<()>),
    /// Done when the thread that waited for the shared device and ran the batch on it returns
    /// how long it waited.
    Shared(JoinHandle<Duration>),
}

impl DeviceWork {
    fn start(
        device: Device,
        shared: Option<&Arc<SharedDevice>>,
        device_time: Duration,
        started: Instant,
        shutdown: &CancellationToken,
    ) -> Self {
        let shutdown = shutdown.clone();
        match (device, shared) {
            (Device::Sleep, None) => Self::Timer(started + device_time),
            // A blocking-pool thread, so the spinning never holds up the runtime's workers.
            (Device::Spin, None) => Self::Cpu(tokio::task::spawn_blocking(move || burn_cpu(device_time, &shutdown))),
            (device, Some(shared)) => {
                let shared = Arc::clone(shared);
                Self::Shared(tokio::task::spawn_blocking(move || {
                    shared.hold(|| match device {
                        Device::Sleep => std::thread::sleep(device_time),
                        Device::Spin => burn_cpu(device_time, &shutdown),
                    })
                }))
            }
        }
    }
}

/// Keeps this thread busy until it has used `cpu_time` of CPU, or until shutdown. Counting the
/// thread's own CPU time, not wall time, is what makes a shared CPU slow the device down.
fn burn_cpu(cpu_time: Duration, shutdown: &CancellationToken) {
    let wall = std::time::Instant::now();
    let thread = cpu_time::ThreadTime::try_now().ok();
    // Without a per-thread CPU clock, wall time is the closest stand-in.
    let spent = || thread.as_ref().and_then(|t| t.try_elapsed().ok()).unwrap_or_else(|| wall.elapsed());
    while spent() < cpu_time && !shutdown.is_cancelled() {
        for _ in 0..256 {
            std::hint::spin_loop();
        }
    }
}

/// Starts the queue task; it ends when `shutdown` fires or every sender is gone, dropping the
/// waiting requests' reply channels so their callers learn the device is gone.
pub(crate) fn spawn(
    limits: BatchLimits,
    shared: Option<Arc<SharedDevice>>,
    slowdown: Arc<Slowdown>,
    metrics: Metrics,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
) -> mpsc::UnboundedSender<Entry> {
    // Unbounded is safe: only requests holding an admission slot are ever sent.
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(rx, limits, shared, slowdown, metrics, counters, shutdown));
    tx
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Entry>,
    limits: BatchLimits,
    shared: Option<Arc<SharedDevice>>,
    slowdown: Arc<Slowdown>,
    metrics: Metrics,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
) {
    let mut queue = VecDeque::new();
    let mut next = Batch::default();
    let mut running: Option<Running> = None;
    loop {
        next.top_up(&mut queue, &limits);
        if running.is_none() {
            next.prune();
            next.top_up(&mut queue, &limits);
            if !next.entries.is_empty() {
                let batch = std::mem::take(&mut next);
                let started = Instant::now();
                let device_time = limits.device_time(batch.entries.len(), batch.tokens).mul_f64(slowdown.get());
                let work = DeviceWork::start(limits.device, shared.as_ref(), device_time, started, &shutdown);
                running = Some(Running { batch, started, work });
                next.top_up(&mut queue, &limits);
            }
        }
        metrics.queue_size.set(gauge(queue.len() + next.entries.len()));
        metrics.batch_next_size.set(gauge(next.entries.len()));
        metrics.batch_next_tokens.set(gauge(next.tokens));

        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            waited = device_done(running.as_mut().map(|r| &mut r.work)) => {
                if let Some(done) = running.take() {
                    finish(done, waited, &counters);
                }
            }
            entry = rx.recv() => match entry {
                Some(entry) => queue.push_back(entry),
                None => break,
            },
        }
    }
}

/// Completes when the running batch is done, with how long it waited for a shared device.
async fn device_done(work: Option<&mut DeviceWork>) -> Duration {
    match work {
        Some(DeviceWork::Timer(deadline)) => tokio::time::sleep_until(*deadline).await,
        // A panicked burner has still finished with the batch; its callers get their answers.
        Some(DeviceWork::Cpu(thread)) => {
            let _ = thread.await;
        }
        Some(DeviceWork::Shared(thread)) => return thread.await.unwrap_or_default(),
        None => std::future::pending().await,
    }
    Duration::ZERO
}

fn finish(done: Running, waited_for_device: Duration, counters: &Counters) {
    // The callers see the whole batch, as TEI measures it; the device was busy with it only once
    // this simulator had it.
    let inference_time = done.started.elapsed();
    counters.batch_run(inference_time.saturating_sub(waited_for_device));
    for entry in done.batch.entries {
        let queue_time = done.started.saturating_duration_since(entry.enqueued);
        // A caller that left while its batch ran simply gets nothing.
        let _ = entry.reply.send(DeviceRun { queue_time, inference_time });
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_tokens: usize, max_requests: usize) -> BatchLimits {
        BatchLimits {
            max_tokens,
            max_requests,
            fixed_latency: Duration::from_millis(1),
            per_request_latency: Duration::ZERO,
            per_token_latency: Duration::from_micros(1),
            device: Device::Sleep,
            freeze_next: false,
        }
    }

    fn entry(tokens: usize) -> (Entry, oneshot::Receiver<DeviceRun>) {
        let (reply, rx) = oneshot::channel();
        (Entry { tokens, enqueued: Instant::now(), reply }, rx)
    }

    #[test]
    fn fill_respects_budgets_and_skips_gone_callers() {
        let mut queue = VecDeque::new();
        let mut keep = Vec::new();
        for tokens in [4, 4, 4, 4] {
            let (e, rx) = entry(tokens);
            queue.push_back(e);
            keep.push(rx);
        }
        drop(keep.remove(0));
        let mut batch = Batch::default();
        batch.fill(&mut queue, &limits(10, 8));
        assert_eq!((batch.entries.len(), batch.tokens), (2, 8));
        assert_eq!(queue.len(), 1);

        let mut batch = Batch::default();
        batch.fill(&mut queue, &limits(10, 8));
        assert_eq!(batch.entries.len(), 1);
    }

    #[test]
    fn oversized_request_runs_alone() {
        let (big, _rx1) = entry(50);
        let (small, _rx2) = entry(1);
        let mut queue = VecDeque::from([big, small]);
        let mut batch = Batch::default();
        batch.fill(&mut queue, &limits(10, 8));
        assert_eq!((batch.entries.len(), batch.tokens), (1, 50));
    }

    #[test]
    fn request_cap_limits_batch() {
        let mut queue = VecDeque::new();
        let mut keep = Vec::new();
        for _ in 0..5 {
            let (e, rx) = entry(1);
            queue.push_back(e);
            keep.push(rx);
        }
        let mut batch = Batch::default();
        batch.fill(&mut queue, &limits(100, 3));
        assert_eq!(batch.entries.len(), 3);
    }

    #[test]
    fn device_time_grows_with_tokens() {
        let l = limits(10, 1);
        assert_eq!(l.device_time(1, 0), Duration::from_millis(1));
        assert_eq!(l.device_time(1, 1000), Duration::from_millis(2));
    }

    #[test]
    fn a_frozen_prepared_batch_takes_no_later_arrivals() {
        let mut keep = Vec::new();
        let mut queue = VecDeque::new();
        let (first, rx) = entry(4);
        queue.push_back(first);
        keep.push(rx);
        let frozen = BatchLimits { freeze_next: true, ..limits(100, 4) };
        let mut next = Batch::default();
        next.top_up(&mut queue, &frozen);
        for _ in 0..3 {
            let (e, rx) = entry(4);
            queue.push_back(e);
            keep.push(rx);
        }
        next.top_up(&mut queue, &frozen);
        assert_eq!((next.entries.len(), queue.len()), (1, 3));
        // The simulator's default keeps filling it while the device runs.
        next.top_up(&mut queue, &limits(100, 4));
        assert_eq!((next.entries.len(), queue.len()), (4, 0));
    }

    /// A calibrated profile's model: fixed + per request + per token, as measured on TEI.
    fn profiled() -> BatchLimits {
        let profile = crate::profile::Profile::parse(
            r#"{"format": 1, "sim": {"fixed_latency_us": 3000, "per_request_latency_us": 500,
                "per_token_latency_us": 40, "max_batch_requests": 4, "max_batch_tokens": null,
                "device": "sleep"}}"#,
        )
        .unwrap();
        let mut config = crate::SimConfig::default();
        profile.sim.apply(&mut config);
        BatchLimits::new(&config)
    }

    #[test]
    fn a_profiles_batch_time_is_fixed_plus_per_request_plus_per_token() {
        let l = profiled();
        assert_eq!(l.max_requests, 4);
        // 3 ms + 4 × 0.5 ms + 88 × 40 µs
        assert_eq!(l.device_time(4, 88), Duration::from_micros(3000 + 2000 + 3520));
    }

    #[tokio::test]
    async fn the_batcher_waits_a_profiles_batch_time() {
        let shutdown = CancellationToken::new();
        let counters = Arc::new(Counters::default());
        let metrics = Metrics::new(Arc::clone(&counters)).unwrap();
        let tx = spawn(profiled(), None, Arc::default(), metrics, counters, shutdown.clone());
        // The first request starts alone (this test's runtime has one thread: the yield lets the
        // batcher take it); the two sent while it runs wait and then run together.
        let (a, a_rx) = entry(22);
        tx.send(a).unwrap();
        tokio::task::yield_now().await;
        let (b, b_rx) = entry(22);
        let (c, c_rx) = entry(22);
        tx.send(b).unwrap();
        tx.send(c).unwrap();
        let (a, b, c) = (a_rx.await.unwrap(), b_rx.await.unwrap(), c_rx.await.unwrap());
        shutdown.cancel();
        // Timers never fire early, so each batch took at least the profile's time for it.
        assert!(a.inference_time >= Duration::from_micros(3000 + 500 + 22 * 40), "{a:?}");
        assert_eq!(b.inference_time, c.inference_time, "one batch");
        assert!(b.inference_time >= Duration::from_micros(3000 + 2 * 500 + 44 * 40), "{b:?}");
    }
}
