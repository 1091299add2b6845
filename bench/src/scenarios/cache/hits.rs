//! Part 1: Zipf query traffic at twice the pool's capacity, the cache off and on.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::zipf::Zipf;
use teifleet_proto::v1::EmbedRequest;
use teifleet_proto::v1::embed_client::EmbedClient;

use super::drive::{self, Answer, Beside, Phase, Pick, Schedule, vector_hash};
use super::procs::{self, CacheConfig, PoolLimits};
use super::texts::{Space, text};
use super::{Context, DEADLINE, DIMENSIONS, metric};
use crate::procs::{Device, Proc, SimModel};
use crate::targets::ratio;
use crate::{Error, Result};

/// Zipf's exponent and the distinct texts it draws from.
pub const EXPONENT: f64 = 1.1;
pub const DISTINCT: usize = 1_000_000;
/// The open loop's rate, × capacity.
pub const OFFERED: f64 = 2.0;
/// The hot phase: texts among the hottest this many, at the capacity's rate.
pub const HOT: u64 = 100;
/// Texts of the on phase checked against direct calls to the simulator.
pub const DIRECT_SAMPLE: usize = 64;
const CONNECTIONS: usize = 4;
/// The on phase's first seconds, after which the cache is warm: until then most calls miss and the
/// pool is past its capacity (measured while the cache was looked up after the pool's door, hits
/// waited there too, 20 to 100 ms in that first second).
pub const WARM_S: f64 = 2.0;
const SEED: u64 = 22;
/// After every this many calls of the on and hot phases, one call of a hot text to the memo floor
/// ([`crate::floor::memo`]): a bare tonic server answering from memory, interleaved so that it and
/// the cache's hits meet the machine in the same seconds.
pub const FLOOR_EVERY: u64 = 3;

/// A GPU-like TEI: batches of 16, 20 ms a batch plus 20 µs a word (about 33 ms for 16 texts of
/// 40 words: about 490 texts/s). Slow enough that twice its capacity, mostly answered from the
/// cache, is a load 2 cores offer and serve beside the load generator.
pub fn backend() -> SimModel {
    SimModel {
        max_concurrent_requests: 512,
        max_batch_requests: Some(16),
        fixed_latency: Duration::from_millis(20),
        per_token_latency: Duration::from_micros(20),
        device: Device::Sleep,
    }
}

/// Two batches in flight, four queued, a 500 ms queue timeout (scenario 2's shape).
pub fn limits() -> PoolLimits {
    PoolLimits { max_in_flight: 32, max_queued: 64, queue_timeout_ms: 500 }
}

/// The local tier of parts 1 and 3: 64 MiB holds about 40,000 answers of 384 dimensions.
pub const LOCAL_SIZE: &str = "64Mi";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hits {
    pub backend: SimModel,
    pub limits: PoolLimits,
    pub local_size: String,
    /// Closed loop through the multiplexer with the cache off.
    pub capacity: Phase,
    pub capacity_callers: usize,
    pub offered_rps: f64,
    /// Open loop at [`OFFERED`] × capacity, the cache on (cold at the start).
    pub on: Phase,
    /// The same schedule's first seconds with the cache off (for the record).
    pub off: Phase,
    /// The on phase's calls scheduled after its first [`WARM_S`] seconds.
    #[serde(default)]
    pub warm: Phase,
    /// Only the [`HOT`] hottest texts, at the capacity's rate, the cache on.
    pub hot: Phase,
    /// The memo floor's calls interleaved with the on phase's and with the hot phase's (none when
    /// `teifleet-floor-proxy` is not built).
    #[serde(default)]
    pub floor_on: Option<Phase>,
    #[serde(default)]
    pub floor_hot: Option<Phase>,
    /// Texts checked against direct calls to the simulator, and those whose answer differed
    /// from the vector every answer was checked against.
    pub direct_checked: u64,
    pub direct_wrong: u64,
    /// The cache's counts over the on phase (`teifleet_cache_inputs_total` by result).
    pub inputs: Vec<(String, f64)>,
}

impl Hits {
    pub fn capacity_rps(&self) -> f64 {
        self.capacity.goodput_rps()
    }

    pub fn goodput_ratio(&self) -> f64 {
        ratio(self.on.goodput_rps(), self.capacity_rps())
    }

    pub fn off_ratio(&self) -> f64 {
        ratio(self.off.goodput_rps(), self.capacity_rps())
    }
}

pub async fn run(ctx: &Context) -> Result<Hits> {
    let zipf = Arc::new(Zipf::new(EXPONENT, DISTINCT)?);
    let sim = crate::procs::start_sim_with(&ctx.bins, "cache-sim", &backend(), &[format!("--dimensions={DIMENSIONS}")])
        .await?;
    let limits = limits();
    let off = procs::start_mux(&ctx.bins, "cache-mux-off", &sim, limits, None, &[]).await?;
    let config = CacheConfig { size: LOCAL_SIZE.into(), store: None };
    let on = procs::start_mux(&ctx.bins, "cache-mux-on", &sim, limits, Some(&config), &[]).await?;
    let (off_ch, on_ch) =
        (drive::channels(&off.url(), CONNECTIONS).await?, drive::channels(&on.url(), CONNECTIONS).await?);
    let floor = match ctx.features.floor_proxy {
        true => Some(procs_floor(ctx, &sim).await?),
        false => None,
    };
    let hot: Pick = Arc::new(|i| (teifleet_load::zipf::uniform(SEED + 2, i) * HOT as f64) as u64 % HOT);
    let beside = match &floor {
        Some((_, channels)) => {
            // Every hot text once, so the floor answers each from memory from then on.
            let all_hot: Pick = Arc::new(|i| i);
            drive::closed(channels, Space::Queries, all_hot, 4, HOT, Duration::from_secs(10), DEADLINE).await;
            let pick: Pick = Arc::new(|i| (teifleet_load::zipf::uniform(SEED + 4, i) * HOT as f64) as u64 % HOT);
            Some(Beside { channels: channels.clone(), every: FLOOR_EVERY, pick })
        }
        None => None,
    };
    // Warm-up on texts the measured loads never ask for.
    let warm: Pick = Arc::new(|i| i);
    for channels in [&off_ch, &on_ch] {
        drive::closed(channels, Space::Shared, warm.clone(), 16, 400, Duration::from_secs(10), DEADLINE).await;
    }

    let picks = |seed: u64| -> Pick {
        let zipf = zipf.clone();
        Arc::new(move |i| zipf.draw(seed, i) as u64)
    };
    // TEI's share full and as many waiting: none refused, so the closed loop measures service, not
    // refusals.
    let callers = limits.max_in_flight + limits.max_queued / 2;
    let seconds = ctx.pick(5, 10);
    ctx.say(&format!("cache: capacity, closed loop of {callers} through the multiplexer with the cache off"));
    let (answers, took) = drive::closed(
        &off_ch,
        Space::Queries,
        picks(SEED + 1),
        callers,
        100_000,
        Duration::from_secs(seconds),
        DEADLINE,
    )
    .await;
    let capacity = Phase::of(&answers, Space::Queries, took);
    let cap = capacity.goodput_rps();
    if cap.is_nan() || cap <= 0.0 {
        return Err(Error::Process(format!("the pool served nothing with the cache off: {}", capacity.codes())));
    }
    let rate = OFFERED * cap;
    let seconds = Duration::from_secs(ctx.pick(10, 30));
    let max = (rate * seconds.as_secs_f64()) as u64 + 1;
    ctx.say(&format!("cache: capacity {cap:.0}/s; open loop at {rate:.0}/s for {} s, the cache on", seconds.as_secs()));
    let before = inputs(&on).await;
    let (answers, floor_answers) = drive::open_beside(
        &on_ch,
        Space::Queries,
        picks(SEED),
        Schedule { rate, duration: seconds, max, seed: SEED, deadline: DEADLINE },
        beside.clone(),
    )
    .await;
    let floor_on = beside.as_ref().map(|_| Phase::of(&floor_answers, Space::Queries, seconds.as_secs_f64()));
    let on_phase = Phase::of(&answers, Space::Queries, seconds.as_secs_f64());
    let on_ids = answers_ids(&answers);
    let warm: Vec<Answer> = answers.iter().filter(|a| a.at_s >= WARM_S).copied().collect();
    let warm = Phase::of(&warm, Space::Queries, seconds.as_secs_f64() - WARM_S);
    let after = inputs(&on).await;
    let counts = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.iter().find(|(b, _)| b == k).map_or(0.0, |(_, b)| *b)))
        .collect();
    ctx.say(&format!(
        "cache: on: {:.0}/s OK ({}), {} hits, hit p99 {:.2} ms",
        on_phase.goodput_rps(),
        on_phase.codes(),
        on_phase.hits,
        on_phase.hit_p99_ms
    ));

    let off_seconds = Duration::from_secs(ctx.pick(5, 10));
    ctx.say(&format!("cache: the same schedule for {} s, the cache off", off_seconds.as_secs()));
    let answers = drive::open(
        &off_ch,
        Space::Queries,
        picks(SEED),
        Schedule { rate, duration: off_seconds, max, seed: SEED, deadline: DEADLINE },
    )
    .await;
    let off_phase = Phase::of(&answers, Space::Queries, off_seconds.as_secs_f64());

    let hot_seconds = Duration::from_secs(ctx.pick(3, 5));
    ctx.say(&format!("cache: the {HOT} hottest texts at {cap:.0}/s for {} s, the cache on", hot_seconds.as_secs()));
    let (answers, floor_answers) = drive::open_beside(
        &on_ch,
        Space::Queries,
        hot,
        Schedule { rate: cap, duration: hot_seconds, max, seed: SEED + 3, deadline: DEADLINE },
        beside.clone(),
    )
    .await;
    let hot_phase = Phase::of(&answers, Space::Queries, hot_seconds.as_secs_f64());
    let floor_hot = beside.as_ref().map(|_| Phase::of(&floor_answers, Space::Queries, hot_seconds.as_secs_f64()));

    let (direct_checked, direct_wrong) = direct_check(&sim, &on_ids).await?;
    Ok(Hits {
        backend: backend(),
        limits,
        local_size: LOCAL_SIZE.into(),
        capacity,
        capacity_callers: callers,
        offered_rps: rate,
        on: on_phase,
        warm,
        off: off_phase,
        hot: hot_phase,
        floor_on,
        floor_hot,
        direct_checked,
        direct_wrong,
        inputs: counts,
    })
}

/// The memo floor in front of `sim`, and its connections (as many as the multiplexer's).
async fn procs_floor(ctx: &Context, sim: &Proc) -> Result<(Proc, Vec<tonic::transport::Channel>)> {
    let floor = crate::procs::start_floor(&ctx.bins, "cache-floor-memo", sim, crate::floor::Stack::Memo).await?;
    let channels = drive::channels(&floor.url(), CONNECTIONS).await?;
    Ok((floor, channels))
}

fn answers_ids(answers: &[Answer]) -> Vec<u64> {
    let mut ids: Vec<u64> = answers.iter().filter(|a| a.code.is_none()).map(|a| a.id).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The cache's counts by result at `mux`.
async fn inputs(mux: &procs::Server) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for result in ["hit_local", "hit_store", "miss", "bypass"] {
        out.push((result.to_owned(), metric(mux, "teifleet_cache_inputs_total", &[("result", result)]).await));
    }
    out
}

/// Up to [`DIRECT_SAMPLE`] of `ids` (and a few never asked) embedded directly by the simulator:
/// its answers against the vectors every answer through the multiplexer was checked against.
/// Returns (checked, differing).
pub async fn direct_check(sim: &Proc, ids: &[u64]) -> Result<(u64, u64)> {
    let channel = drive::channels(&sim.url(), 1).await?.remove(0);
    let step = (ids.len() / DIRECT_SAMPLE).max(1);
    let (mut checked, mut wrong) = (0, 0);
    for id in ids.iter().step_by(step).take(DIRECT_SAMPLE) {
        let request = EmbedRequest { inputs: text(Space::Queries, *id), truncate: true, ..Default::default() };
        let answer = EmbedClient::new(channel.clone())
            .embed(request)
            .await
            .map_err(|s| Error::Process(format!("the simulator refused a direct call: {s}")))?;
        checked += 1;
        wrong += u64::from(vector_hash(&answer.get_ref().embeddings) != drive::expected_hash(Space::Queries, *id));
    }
    Ok((checked, wrong))
}
