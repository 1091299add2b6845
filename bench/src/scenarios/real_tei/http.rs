//! Row 5 of the real-TEI scenario: the auto-batching proxy's table (a Rust proxy that batches
//! single-input `POST /embed` calls for TEI; its README measures 20,000 calls from 2,048 closed-loop
//! callers against TEI direct and through it). The same load here: single-input `POST /embed` of
//! 20 tokens from 2,048 callers over HTTP/1.1 (a connection each), direct to TEI's HTTP router,
//! and through the sidecar's HTTP front in front of TEI's gRPC router, in interleaved rounds.
//! Throughput and p99, each a ratio of the same run.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Protocol};

use super::{HTTP_P99_LIMIT, HTTP_THROUGHPUT_LIMIT, Run, TEI_BATCH, TEI_MAX_CONCURRENT, TOKENS, round_ratio};
use crate::Result;
use crate::procs::{self, MuxLimits, Proc, RealTeiCache};
use crate::scenarios::{Context, interleaved, measure, words};
use crate::targets::{Rule, Target};

pub const CALLERS: usize = 2048;
/// The auto-batching proxy's table's calls per run; fewer here when this CPU TEI would take more
/// than about 30 s for them.
pub const MOST_CALLS: u64 = 20_000;
/// Seconds of TEI's capacity one run's calls are sized to (full mode).
const RUN_SECONDS: f64 = 30.0;

const P99: &str = "HTTP p99 through ÷ direct, 2,048 callers";
const THROUGHPUT: &str = "HTTP texts/s through ÷ direct, 2,048 callers";

/// The sidecar with the HTTP front: TEI's batch in flight, every caller room to wait.
pub fn limits() -> MuxLimits {
    MuxLimits {
        max_in_flight: TEI_BATCH,
        max_queued: 2 * CALLERS,
        queue_timeout: Duration::from_secs(120),
        max_concurrent_streams: 256,
        coalesce: false,
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HttpStorm {
    pub limits: MuxLimits,
    pub callers: usize,
    pub calls_per_run: u64,
    pub direct: Vec<Run>,
    pub through: Vec<Run>,
}

impl HttpStorm {
    pub fn p99_ratio(&self) -> f64 {
        round_ratio(&self.direct, &self.through, |r| r.p99_ms)
    }

    pub fn throughput_ratio(&self) -> f64 {
        round_ratio(&self.direct, &self.through, |r| r.ok_per_s)
    }

    pub fn targets(&self, scenario: &str) -> Vec<Target> {
        let median = |side: &[Run], f: fn(&Run) -> f64| crate::targets::median(&side.iter().map(f).collect::<Vec<_>>());
        let note = format!(
            "direct: {:.0} texts/s, p50 {:.0} ms, p99 {:.0} ms ({}); through: {:.0} texts/s, p50 {:.0} ms, p99 {:.0} \
             ms ({}). With every caller waiting its turn in one FIFO queue, the p99 is about the time the queue \
             ahead takes to drain (callers ÷ throughput) on either side; only batching several inputs into one TEI \
             call, or refusing what cannot be served in time, makes it smaller",
            median(&self.direct, |r| r.ok_per_s),
            median(&self.direct, |r| r.p50_ms),
            median(&self.direct, |r| r.p99_ms),
            self.direct.first().map(Run::codes_text).unwrap_or_default(),
            median(&self.through, |r| r.ok_per_s),
            median(&self.through, |r| r.p50_ms),
            median(&self.through, |r| r.p99_ms),
            self.through.first().map(Run::codes_text).unwrap_or_default(),
        );
        vec![
            Target::at_most(scenario, P99, self.p99_ratio(), HTTP_P99_LIMIT, "×").note_if_not_passed(note.clone()),
            Target::at_least(scenario, THROUGHPUT, self.throughput_ratio(), HTTP_THROUGHPUT_LIMIT, "×")
                .note_if_not_passed(note),
        ]
    }
}

/// Row 5's targets, unmeasured.
pub fn planned(scenario: &str) -> Vec<Target> {
    vec![
        Target::new(scenario, P99, None, Rule::AtMost, HTTP_P99_LIMIT, "×"),
        Target::new(scenario, THROUGHPUT, None, Rule::AtLeast, HTTP_THROUGHPUT_LIMIT, "×"),
    ]
}

/// Calls per run: whole waves of the callers (one call each), about [`RUN_SECONDS`] of
/// `capacity` (quick: one wave), at most the auto-batching proxy's 20,000 and at least one wave,
/// so every caller is in the storm: a CPU TEI serves tens to hundreds of texts a second, where
/// the table's GPU served thousands.
pub fn calls_per_run(quick: bool, capacity_per_s: f64) -> u64 {
    let wave = CALLERS as u64;
    if quick || !capacity_per_s.is_finite() {
        return wave;
    }
    let waves = ((capacity_per_s * RUN_SECONDS) / wave as f64).round().max(1.0) as u64;
    (waves * wave).min(MOST_CALLS)
}

fn config(target: &str, calls: u64) -> LoadConfig {
    LoadConfig {
        protocol: Protocol::Http,
        inputs: words(TOKENS),
        duration: Duration::from_secs(150),
        // Counted from the wave's last send, which is its first moment: the whole wave drains in
        // the grace (over 60 s through the sidecar on 2 busy cores, where 63 calls were cut off).
        grace: Duration::from_secs(180),
        ..LoadConfig::closed(target, CALLERS, calls)
    }
}

pub async fn measure_row(ctx: &Context, cache: &RealTeiCache, tei: &Proc, capacity_per_s: f64) -> Result<HttpStorm> {
    ctx.say("real tei 5: starting TEI's HTTP router");
    let direct_tei =
        procs::start_real_tei(&ctx.bins, "real-tei-http", &cache.http_router(), cache, TEI_MAX_CONCURRENT).await?;
    let port = procs::pick_port()?;
    let limits = limits();
    let extra = [format!("--http-listen=127.0.0.1:{port}")];
    let _mux = procs::start_mux_wide(&ctx.bins, "real-tei-http-mux", tei, &limits, 2 * CALLERS, &extra).await?;
    let targets = [direct_tei.url(), procs::url_of(port)];
    for target in &targets {
        measure(LoadConfig { protocol: Protocol::Http, inputs: words(TOKENS), ..LoadConfig::closed(target, 16, 200) })
            .await?;
    }
    let calls = calls_per_run(ctx.quick, capacity_per_s);
    // One round a side: a wave of 2,048 calls is tens of seconds of this TEI.
    let rounds = 1;
    ctx.say(&format!("real tei 5: {calls} single-input POST /embed from {CALLERS} callers, {rounds} rounds per side"));
    let mut sides = interleaved(&targets, rounds, |t| config(t, calls)).await?.into_iter();
    let (direct, through) = (sides.next().unwrap_or_default(), sides.next().unwrap_or_default());
    let result = HttpStorm {
        limits,
        callers: CALLERS,
        calls_per_run: calls,
        direct: direct.iter().map(Run::from).collect(),
        through: through.iter().map(Run::from).collect(),
    };
    ctx.say(&format!(
        "real tei 5: p99 through ÷ direct {:.3}, texts/s through ÷ direct {:.3}",
        result.p99_ratio(),
        result.throughput_ratio()
    ));
    Ok(result)
}
