//! Parts 3 and 4: the shared tier. Two replicas (each a simulator behind its own multiplexer)
//! sharing one Redis: what replica 1 embedded is a hit at replica 2. Then one replica under open
//! load while its Redis is killed (SIGKILL) and later started again on the same port (empty).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::zipf::Zipf;
use tokio::time::Instant;

use super::drive::{self, Phase, Pick, Schedule};
use super::hits::{DISTINCT, EXPONENT};
use super::procs::{self, CacheConfig, Server};
use super::texts::Space;
use super::{Context, DEADLINE, DIMENSIONS, metric};
use crate::procs::SimModel;
use crate::targets::ratio;
use crate::{Error, Result};

/// The store's timeout: the contract's default.
pub const STORE_TIMEOUT_MS: u64 = 5;
/// Part 4's local tier: about 150 answers (the hottest), so repeats past them are the store's.
pub const OUTAGE_LOCAL_SIZE: &str = "256Ki";
/// Part 4's rate, × part 1's capacity.
pub const OUTAGE_LOAD: f64 = 0.5;
/// Part 3's replica 2 hits ÷ texts, at least.
pub const SHARED_LIMIT: f64 = 0.95;
const REDIS_MEMORY: &str = "256mb";
const SEED: u64 = 44;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedTier {
    pub texts: u64,
    /// Every text once through replica 1, then through replica 2.
    pub first: Phase,
    pub second: Phase,
    /// Replica 2's store hits over its pass (`teifleet_cache_inputs_total{result="hit_store"}`).
    pub second_store_hits: f64,
}

impl SharedTier {
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.second.hits as f64, self.texts as f64)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outage {
    pub rate: f64,
    pub phase_s: f64,
    pub local_size: String,
    pub store_timeout_ms: u64,
    /// The store up, killed, started again: the calls scheduled in each third of the load.
    pub up: Phase,
    pub down: Phase,
    pub after: Phase,
    /// Store hits in each third (the metric read at each boundary).
    pub store_hits: [f64; 3],
    /// Store errors over the load, and `teifleet_cache_store_up` at its end.
    pub store_errors: f64,
    pub store_up_at_end: f64,
    /// From the restart to the first store hit, when one came (metric polled every 100 ms).
    pub first_store_hit_after_s: Option<f64>,
}

impl Outage {
    pub fn failed(&self) -> u64 {
        self.up.failed_total() + self.down.failed_total() + self.after.failed_total()
    }

    /// The down phase's p99 may exceed the up phase's by the store timeout.
    pub fn p99_allowed_ms(&self) -> f64 {
        self.up.p99_ms + self.store_timeout_ms as f64
    }
}

fn store_config(redis: &Server, size: &str) -> CacheConfig {
    CacheConfig {
        size: size.into(),
        store: Some((format!("redis://127.0.0.1:{}/0", redis.port), format!("{STORE_TIMEOUT_MS}ms"))),
    }
}

async fn replica(
    ctx: &Context,
    name: &str,
    model: &SimModel,
    config: &CacheConfig,
    peer_key: &Path,
) -> Result<(crate::procs::Proc, Server)> {
    let sim =
        crate::procs::start_sim_with(&ctx.bins, &format!("{name}-sim"), model, &[format!("--dimensions={DIMENSIONS}")])
            .await?;
    // The pool's peer key, the same file for every replica as the operator gives them: it seals
    // what goes to the store.
    let extra = [format!("--peer-key-file={}", peer_key.display())];
    let mux =
        procs::start_mux(&ctx.bins, &format!("{name}-mux"), &sim, super::hits::limits(), Some(config), &extra).await?;
    Ok((sim, mux))
}

/// Part 3.
pub async fn shared(ctx: &Context, redis: &Server, peer_key: &Path) -> Result<SharedTier> {
    let model = super::reindex::backend();
    let config = store_config(redis, super::hits::LOCAL_SIZE);
    let (_sim1, mux1) = replica(ctx, "cache-replica1", &model, &config, peer_key).await?;
    let (_sim2, mux2) = replica(ctx, "cache-replica2", &model, &config, peer_key).await?;
    let texts = ctx.pick(1_000u64, 4_000);
    let every: Pick = Arc::new(|i| i);
    ctx.say(&format!("cache: {texts} texts through replica 1, then replica 2, one Redis"));
    let ch1 = drive::channels(&mux1.url(), 2).await?;
    let (answers, took) =
        drive::closed(&ch1, Space::Shared, every.clone(), 16, texts, Duration::from_secs(120), DEADLINE).await;
    let first = Phase::of(&answers, Space::Shared, took);
    // The store's writes go out after the answers.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ch2 = drive::channels(&mux2.url(), 2).await?;
    let before = metric(&mux2, "teifleet_cache_inputs_total", &[("result", "hit_store")]).await;
    let (answers, took) =
        drive::closed(&ch2, Space::Shared, every, 16, texts, Duration::from_secs(120), DEADLINE).await;
    let second = Phase::of(&answers, Space::Shared, took);
    let after = metric(&mux2, "teifleet_cache_inputs_total", &[("result", "hit_store")]).await;
    ctx.say(&format!("cache: replica 2 answered {} of {texts} from the cache", second.hits));
    Ok(SharedTier { texts, first, second, second_store_hits: after - before })
}

/// Part 4: `capacity` is part 1's, for the same backend.
pub async fn outage(ctx: &Context, mut redis: Server, peer_key: &Path, capacity: f64) -> Result<Outage> {
    let config = store_config(&redis, OUTAGE_LOCAL_SIZE);
    let (_sim, mux) = replica(ctx, "cache-outage", &super::hits::backend(), &config, peer_key).await?;
    let channels = drive::channels(&mux.url(), 4).await?;
    let zipf = Arc::new(Zipf::new(EXPONENT, DISTINCT)?);
    let pick: Pick = Arc::new(move |i| zipf.draw(SEED, i) as u64);
    let rate = OUTAGE_LOAD * capacity;
    let phase = Duration::from_secs(ctx.pick(5, 15));
    ctx.say(&format!(
        "cache: open loop at {rate:.0}/s for {} s; Redis killed at {} s, started again at {} s",
        3 * phase.as_secs(),
        phase.as_secs(),
        2 * phase.as_secs()
    ));
    let hits = |mux: &Server| {
        let admin = mux.admin_addr();
        async move {
            crate::admin::metric_sum_matching(admin, "teifleet_cache_inputs_total", &[("result", "hit_store")])
                .await
                .unwrap_or(f64::NAN)
        }
    };
    let errors_before = metric(&mux, "teifleet_cache_store_errors_total", &[]).await;
    let start = Instant::now();
    let load = drive::open(
        &channels,
        Space::Queries,
        pick,
        Schedule { rate, duration: 3 * phase, max: u64::MAX, seed: SEED, deadline: DEADLINE },
    );
    let bins = ctx.bins.clone();
    let port = redis.port;
    let monitor = async {
        let h0 = hits(&mux).await;
        tokio::time::sleep_until(start + phase).await;
        let h1 = hits(&mux).await;
        redis.kill();
        tokio::time::sleep_until(start + 2 * phase).await;
        let h2 = hits(&mux).await;
        let restarted = procs::start_redis(&bins, "cache-redis-again", port, REDIS_MEMORY).await;
        let restart_at = Instant::now();
        let mut first_hit = None;
        while start.elapsed() < 3 * phase {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if first_hit.is_none() && hits(&mux).await > h2 {
                first_hit = Some(restart_at.elapsed().as_secs_f64());
            }
        }
        (h0, h1, h2, restarted, first_hit)
    };
    let (answers, (h0, h1, h2, restarted, first_hit)) = tokio::join!(load, monitor);
    let _redis = restarted?;
    let h3 = hits(&mux).await;
    let errors = metric(&mux, "teifleet_cache_store_errors_total", &[]).await - errors_before;
    let store_up = metric(&mux, "teifleet_cache_store_up", &[]).await;
    let third = |k: f64| -> Vec<drive::Answer> {
        let s = phase.as_secs_f64();
        answers.iter().filter(|a| a.at_s >= k * s && a.at_s < (k + 1.0) * s).copied().collect()
    };
    let s = phase.as_secs_f64();
    let out = Outage {
        rate,
        phase_s: s,
        local_size: OUTAGE_LOCAL_SIZE.into(),
        store_timeout_ms: STORE_TIMEOUT_MS,
        up: Phase::of(&third(0.0), Space::Queries, s),
        down: Phase::of(&third(1.0), Space::Queries, s),
        after: Phase::of(&third(2.0), Space::Queries, s),
        store_hits: [h1 - h0, h2 - h1, h3 - h2],
        store_errors: errors,
        store_up_at_end: store_up,
        first_store_hit_after_s: first_hit,
    };
    if out.up.sent == 0 {
        return Err(Error::Process("the outage load sent nothing".into()));
    }
    ctx.say(&format!(
        "cache: p99 {:.1} ms up, {:.1} ms down, {:.1} ms after; {} failed; store hits {:?}",
        out.up.p99_ms,
        out.down.p99_ms,
        out.after.p99_ms,
        out.failed(),
        out.store_hits
    ));
    Ok(out)
}

/// The Redis of parts 3 and 4.
pub async fn start_redis(ctx: &Context) -> Result<Server> {
    procs::start_redis(&ctx.bins, "cache-redis", 0, REDIS_MEMORY).await
}
