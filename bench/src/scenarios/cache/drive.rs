//! The scenario's own load loops (the shared generator does not read the cache's answer header
//! nor keep the vectors): unary `Embed` calls, open loop (Poisson arrivals, latency from the
//! scheduled time, so no coordinated omission) or closed loop, each call's latency, code,
//! `x-teifleet-cache` header and a hash of its vector kept; [`Phase`] summarises them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::zipf::uniform;
use teifleet_proto::v1::EmbedRequest;
use teifleet_proto::v1::embed_client::EmbedClient;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::texts::{Space, text};
use crate::{Error, Result};

/// The answer header the cache sets.
pub const HEADER: &str = "x-teifleet-cache";

/// Which text request `index` asks for: its id in `space`.
pub type Pick = Arc<dyn Fn(u64) -> u64 + Send + Sync>;

/// What the cache header said.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tag {
    Hit,
    Miss,
    Partial,
    /// No header (a failed call, or a call the cache did not see).
    Absent,
}

impl Tag {
    fn of(value: Option<&str>) -> Self {
        match value {
            Some("hit") => Self::Hit,
            Some("miss") => Self::Miss,
            Some("partial") => Self::Partial,
            _ => Self::Absent,
        }
    }
}

/// One call.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    pub id: u64,
    /// Scheduled (open loop) or sent (closed loop), seconds from the load's start.
    pub at_s: f64,
    pub latency_us: u64,
    /// `None`: OK.
    pub code: Option<tonic::Code>,
    pub tag: Tag,
    /// FNV-1a of the vector's f32 bits (0 for a failed call).
    pub vector: u64,
}

/// FNV-1a over a vector's bits: equal vectors, equal hashes.
pub fn vector_hash(v: &[f32]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for x in v {
        for b in x.to_bits().to_le_bytes() {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// The vector the simulator gives `text` (`tei-sim --dimensions` [`super::DIMENSIONS`]); checked
/// against direct calls to the simulator by [`super::hits`].
pub fn expected_hash(space: Space, id: u64) -> u64 {
    vector_hash(&teifleet_tei_sim::embedding_for(&text(space, id), super::DIMENSIONS))
}

/// `connections` HTTP/2 connections to `url`.
pub async fn channels(url: &str, connections: usize) -> Result<Vec<Channel>> {
    let channels = teifleet_load::connect(url, connections).await?;
    if channels.is_empty() {
        return Err(Error::Process(format!("no connection to {url}")));
    }
    Ok(channels)
}

/// One unary Embed of text `id` of `space`.
async fn call(channel: Channel, space: Space, id: u64, deadline: Duration) -> (Option<tonic::Code>, Tag, u64) {
    let mut request =
        tonic::Request::new(EmbedRequest { inputs: text(space, id), truncate: true, ..Default::default() });
    request.set_timeout(deadline);
    match EmbedClient::new(channel).embed(request).await {
        Ok(answer) => {
            let tag = Tag::of(answer.metadata().get(HEADER).and_then(|v| v.to_str().ok()));
            (None, tag, vector_hash(&answer.get_ref().embeddings))
        }
        Err(status) => (Some(status.code()), Tag::of(status.metadata().get(HEADER).and_then(|v| v.to_str().ok())), 0),
    }
}

/// An open loop's schedule: Poisson arrivals at `rate` for `duration`, at most `max` calls, each
/// bounded by `deadline`; `seed` draws the gaps.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub rate: f64,
    pub duration: Duration,
    pub max: u64,
    pub seed: u64,
    pub deadline: Duration,
}

/// Calls sent beside an open loop to another server (the memo floor, [`crate::floor::memo`]):
/// after every `every` calls of the schedule one more, so both meet the machine in the same
/// seconds; call i of them asks for text `pick(i)`.
#[derive(Clone)]
pub struct Beside {
    pub channels: Vec<Channel>,
    pub every: u64,
    pub pick: Pick,
}

/// An open loop on `schedule`, request i asking for text `pick(i)` of `space`, spread over
/// `channels` in turn; waits for every answer.
pub async fn open(channels: &[Channel], space: Space, pick: Pick, schedule: Schedule) -> Vec<Answer> {
    open_beside(channels, space, pick, schedule, None).await.0
}

/// [`open`], with `beside`'s calls interleaved (their answers second; none without it). The
/// schedule's own calls keep their rate and texts: the arrivals are drawn at the sum of both
/// rates and every `every + 1`-th goes beside.
pub async fn open_beside(
    channels: &[Channel],
    space: Space,
    pick: Pick,
    schedule: Schedule,
    beside: Option<Beside>,
) -> (Vec<Answer>, Vec<Answer>) {
    let Schedule { rate, duration, max, seed, deadline } = schedule;
    let channels = channels.to_vec();
    let handle = tokio::runtime::Handle::current();
    let start = Instant::now();
    let every = beside.as_ref().map(|b| b.every.max(1));
    let all_rate = every.map_or(rate, |every| rate * (1.0 + 1.0 / every as f64));
    // The dispatcher is a plain thread, as the shared generator's: the OS wakes it within tens of
    // microseconds of each due time, where the async timer's 1 ms ticks would make every call up
    // to a millisecond late, and that lateness would be counted in the latency of the hits.
    let dispatcher = tokio::task::spawn_blocking(move || {
        let mut due = 0.0f64;
        let (mut tasks, mut beside_tasks) = (Vec::new(), Vec::new());
        let (mut own, mut other) = (0u64, 0u64);
        for i in 0.. {
            // Exponential gaps: -ln(1 - u) / rate.
            due += -(1.0 - uniform(seed, i)).ln() / all_rate;
            if due >= duration.as_secs_f64() || own >= max {
                break;
            }
            let at = start + Duration::from_secs_f64(due);
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            let at_s = due;
            let to_beside = every.is_some_and(|every| i % (every + 1) == every);
            let (channel, id, list) = match (&beside, to_beside) {
                (Some(b), true) => {
                    other += 1;
                    (
                        b.channels[(other - 1) as usize % b.channels.len()].clone(),
                        (b.pick)(other - 1),
                        &mut beside_tasks,
                    )
                }
                _ => {
                    own += 1;
                    (channels[(own - 1) as usize % channels.len()].clone(), pick(own - 1), &mut tasks)
                }
            };
            list.push(handle.spawn(async move {
                let (code, tag, vector) = call(channel, space, id, deadline).await;
                Answer { id, at_s, latency_us: at.elapsed().as_micros() as u64, code, tag, vector }
            }));
        }
        (tasks, beside_tasks)
    });
    let (tasks, beside_tasks) = match dispatcher.await {
        Ok(tasks) => tasks,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    let mut out = (Vec::with_capacity(tasks.len()), Vec::with_capacity(beside_tasks.len()));
    for task in tasks {
        if let Ok(answer) = task.await {
            out.0.push(answer);
        }
    }
    for task in beside_tasks {
        if let Ok(answer) = task.await {
            out.1.push(answer);
        }
    }
    out
}

/// A closed loop: `concurrency` callers over `channels`, request i asking for text `pick(i)`,
/// until `requests` are sent or `duration` has passed. Returns the answers and the seconds from
/// the first send to the last answer.
pub async fn closed(
    channels: &[Channel],
    space: Space,
    pick: Pick,
    concurrency: usize,
    requests: u64,
    duration: Duration,
    deadline: Duration,
) -> (Vec<Answer>, f64) {
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::with_capacity(concurrency);
    for w in 0..concurrency {
        let channel = channels[w % channels.len()].clone();
        let (next, pick) = (next.clone(), pick.clone());
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests || start.elapsed() >= duration {
                    return out;
                }
                let id = pick(i);
                let sent = Instant::now();
                let (code, tag, vector) = call(channel.clone(), space, id, deadline).await;
                let at_s = sent.duration_since(start).as_secs_f64();
                out.push(Answer { id, at_s, latency_us: sent.elapsed().as_micros() as u64, code, tag, vector });
            }
        }));
    }
    let mut out = Vec::new();
    for worker in workers {
        if let Ok(answers) = worker.await {
            out.extend(answers);
        }
    }
    (out, start.elapsed().as_secs_f64())
}

/// A percentile of latencies in µs, in ms (NaN when there are none).
pub fn percentile_ms(latencies_us: &mut [u64], q: f64) -> f64 {
    if latencies_us.is_empty() {
        return f64::NAN;
    }
    latencies_us.sort_unstable();
    let rank = ((q * latencies_us.len() as f64).ceil() as usize).clamp(1, latencies_us.len());
    latencies_us[rank - 1] as f64 / 1e3
}

/// A load's calls, summarised.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    pub sent: u64,
    pub ok: u64,
    /// Failed calls by gRPC code.
    pub failed: BTreeMap<String, u64>,
    /// OK calls by the cache header.
    pub hits: u64,
    pub misses: u64,
    pub partial: u64,
    pub absent: u64,
    /// The window goodput is over: the open loop's schedule, the closed loop's whole run.
    pub seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub hit_p50_ms: f64,
    pub hit_p99_ms: f64,
    pub miss_p50_ms: f64,
    pub miss_p99_ms: f64,
    /// OK answers whose vector was checked against the simulator's, and those that differed.
    pub checked: u64,
    pub wrong: u64,
}

impl Phase {
    /// Summarises `answers` (texts of `space`) over a window of `seconds`, each OK answer's vector
    /// checked against the simulator's for its text.
    pub fn of(answers: &[Answer], space: Space, seconds: f64) -> Self {
        let mut phase = Self { seconds, sent: answers.len() as u64, ..Self::default() };
        let (mut all, mut hits, mut misses) = (Vec::new(), Vec::new(), Vec::new());
        let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
        for a in answers {
            let Some(code) = a.code else {
                phase.ok += 1;
                all.push(a.latency_us);
                match a.tag {
                    Tag::Hit => {
                        phase.hits += 1;
                        hits.push(a.latency_us);
                    }
                    Tag::Miss => {
                        phase.misses += 1;
                        misses.push(a.latency_us);
                    }
                    Tag::Partial => phase.partial += 1,
                    Tag::Absent => phase.absent += 1,
                }
                let want = *expected.entry(a.id).or_insert_with(|| expected_hash(space, a.id));
                phase.checked += 1;
                phase.wrong += u64::from(a.vector != want);
                continue;
            };
            *phase.failed.entry(format!("{code:?}")).or_default() += 1;
        }
        phase.p50_ms = percentile_ms(&mut all, 0.5);
        phase.p99_ms = percentile_ms(&mut all, 0.99);
        phase.hit_p50_ms = percentile_ms(&mut hits, 0.5);
        phase.hit_p99_ms = percentile_ms(&mut hits, 0.99);
        phase.miss_p50_ms = percentile_ms(&mut misses, 0.5);
        phase.miss_p99_ms = percentile_ms(&mut misses, 0.99);
        phase
    }

    pub fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }

    /// OK answers per second of the window.
    pub fn goodput_rps(&self) -> f64 {
        crate::targets::ratio(self.ok as f64, self.seconds)
    }

    /// Hits ÷ OK answers.
    pub fn hit_ratio(&self) -> f64 {
        crate::targets::ratio(self.hits as f64, self.ok as f64)
    }

    /// `OK 9,812, Unavailable 3`.
    pub fn codes(&self) -> String {
        let mut parts = vec![format!("OK {}", self.ok)];
        parts.extend(self.failed.iter().map(|(code, n)| format!("{code} {n}")));
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(id: u64, latency_us: u64, tag: Tag, right: bool) -> Answer {
        let vector = if right { expected_hash(Space::Queries, id) } else { 1 };
        Answer { id, at_s: 0.0, latency_us, code: None, tag, vector }
    }

    #[test]
    fn phases_split_latency_by_the_header_and_check_every_vector() {
        let mut answers: Vec<Answer> = (0..100).map(|i| answer(i % 7, 100 + i, Tag::Hit, true)).collect();
        answers.push(answer(3, 40_000, Tag::Miss, false));
        answers.push(Answer { code: Some(tonic::Code::ResourceExhausted), ..answer(4, 5, Tag::Absent, true) });
        let phase = Phase::of(&answers, Space::Queries, 2.0);
        assert_eq!((phase.sent, phase.ok, phase.hits, phase.misses), (102, 101, 100, 1));
        assert_eq!((phase.checked, phase.wrong), (101, 1));
        assert_eq!(phase.failed_total(), 1);
        assert_eq!(phase.codes(), "OK 101, ResourceExhausted 1");
        assert!((phase.hit_p99_ms - 0.198).abs() < 1e-9, "{}", phase.hit_p99_ms);
        assert_eq!(phase.miss_p99_ms, 40.0);
        assert_eq!(phase.goodput_rps(), 50.5);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let mut v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile_ms(&mut v, 0.99), 0.99);
        assert_eq!(percentile_ms(&mut v, 0.5), 0.5);
        assert!(percentile_ms(&mut [], 0.5).is_nan());
        assert_eq!(Tag::of(Some("hit")), Tag::Hit);
        assert_eq!(Tag::of(None), Tag::Absent);
    }
}
