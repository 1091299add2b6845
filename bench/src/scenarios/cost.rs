//! Scenario 5, cost: CPU the multiplexer spends per proxied call against what the simulator (a
//! tonic gRPC server doing the serving) spends per served call, both from `/proc/<pid>/stat` in
//! the same run; instructions per call from callgrind (a count that does not move with the
//! machine's load, kept so regressions show); and resident memory per waiting call with 10,000
//! waiting (from `/proc/<pid>/status`), the backend stalled so they stay: once in the queue, and
//! once at the pool's door (no queue: every call beyond the in-flight limit waits there).

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::LoadConfig;
use teifleet_testkit::http;
use tokio::time::Instant;

use super::{Context, Measurement, Scenario, fast_model, measure, warm_up};
use crate::floor::Stack;
use crate::procfs::CpuMeter;
use crate::procs::{self, HaproxyMode, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target, ratio};
use crate::{Error, Result, admin, callgrind, procfs};

/// CPU per proxied call at most this many times the simulator's per served call.
pub const CPU_RATIO_LIMIT: f64 = 1.0;
/// CPU per proxied call at most this many times HAProxy h2's (the best L7 proxy here).
pub const HAPROXY_RATIO_LIMIT: f64 = 1.0;
pub const RSS_LIMIT_BYTES: f64 = 4096.0;
const QUEUED: usize = 10_000;
/// Calls before anything is counted, in both callgrind runs, so one-time costs (connections,
/// lazy initialisation) cancel out.
const CALLGRIND_WARM_UP: u64 = 20;

fn limits() -> MuxLimits {
    // Nothing waits: the cost of admission without a queue.
    MuxLimits {
        max_in_flight: 64,
        max_queued: 1024,
        queue_timeout: Duration::from_secs(2),
        max_concurrent_streams: 1024,
        coalesce: false,
    }
}

/// CPU of both processes over one open-loop run through the multiplexer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuRun {
    pub rate: f64,
    pub seconds: f64,
    /// OK answers the client got through the multiplexer.
    pub mux_calls: u64,
    /// Calls the simulator answered (its /stats), the same calls seen from behind.
    pub sim_served: u64,
    pub mux_cpu_s: f64,
    pub sim_cpu_s: f64,
    /// The same load through the floor proxy (a bare tonic bytes-proxy, no admission): what one
    /// hop costs on this machine at the least.
    pub floor_calls: u64,
    pub floor_cpu_s: f64,
    /// The same load through the bare h2 proxy (the `h2` crate alone, no hyper or tonic): what a
    /// data path written straight on h2 could spend at the least.
    #[serde(default)]
    pub floor_h2: Option<ProxyCpu>,
    /// The same load through HAProxy as an h2c proxy (one thread): what the best L7 proxy spends;
    /// absent when HAProxy did not run.
    #[serde(default)]
    pub haproxy_h2: Option<ProxyCpu>,
    /// Why there is no HAProxy figure.
    #[serde(default)]
    pub haproxy_missing: Option<String>,
}

/// One proxy's answered calls and CPU seconds over a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProxyCpu {
    pub calls: u64,
    pub cpu_s: f64,
}

impl ProxyCpu {
    pub fn us_per_call(&self) -> f64 {
        ratio(self.cpu_s * 1e6, self.calls as f64)
    }
}

impl CpuRun {
    pub fn floor_us_per_call(&self) -> f64 {
        ratio(self.floor_cpu_s * 1e6, self.floor_calls as f64)
    }

    /// The multiplexer's CPU per call over the floor proxy's.
    pub fn mux_over_floor(&self) -> f64 {
        ratio(self.mux_us_per_call(), self.floor_us_per_call())
    }

    pub fn floor_h2_us_per_call(&self) -> Option<f64> {
        self.floor_h2.map(|h| h.us_per_call())
    }

    pub fn haproxy_h2_us_per_call(&self) -> Option<f64> {
        self.haproxy_h2.map(|h| h.us_per_call())
    }

    /// The multiplexer's CPU per call over HAProxy h2's.
    pub fn mux_over_haproxy_h2(&self) -> Option<f64> {
        self.over_haproxy_h2(self.mux_us_per_call())
    }

    /// `us_per_call` over HAProxy h2's CPU per call.
    pub fn over_haproxy_h2(&self, us_per_call: f64) -> Option<f64> {
        self.haproxy_h2_us_per_call().map(|h| ratio(us_per_call, h))
    }

    pub fn mux_us_per_call(&self) -> f64 {
        ratio(self.mux_cpu_s * 1e6, self.mux_calls as f64)
    }

    pub fn sim_us_per_call(&self) -> f64 {
        ratio(self.sim_cpu_s * 1e6, self.sim_served as f64)
    }

    pub fn ratio(&self) -> f64 {
        ratio(self.mux_us_per_call(), self.sim_us_per_call())
    }
}

/// Two callgrind runs of the multiplexer: `calls` calls, and none over the same time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instructions {
    pub calls: u64,
    pub warm_up_calls: u64,
    /// Instructions of the run with the calls.
    pub measured: u64,
    /// Instructions of the run without them (same start, warm-up, idle time and exit).
    pub baseline: u64,
    /// How long the calls took under valgrind; the baseline idled as long.
    pub seconds: f64,
}

impl Instructions {
    pub fn per_call(&self) -> f64 {
        ratio(self.measured.saturating_sub(self.baseline) as f64, self.calls as f64)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    pub limits: MuxLimits,
    pub clients: usize,
    pub idle_bytes: u64,
    pub loaded_bytes: u64,
    /// Waiting calls (queued, or held at the door), from the multiplexer's `/metrics`.
    pub queued: u64,
}

impl Memory {
    pub fn per_queued(&self) -> f64 {
        ratio(self.loaded_bytes.saturating_sub(self.idle_bytes) as f64, self.queued as f64)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub cpu: CpuRun,
    pub instructions: Option<Instructions>,
    /// Why there is no instruction count.
    pub instructions_missing: Option<String>,
    pub memory: Memory,
    /// The same with the calls waiting at the pool's door instead of in its queue.
    #[serde(default)]
    pub memory_held: Option<Memory>,
}

impl Measurement for Cost {
    const KEY: &'static str = "cost";
    const TITLE: &'static str = "Cost: CPU and instructions per call, memory per queued call";

    async fn run(ctx: &Context) -> Result<Self> {
        let backend = fast_model();
        let sim = procs::start_sim(&ctx.bins, "cost-sim", &backend).await?;
        let limits = limits();
        let cpu = cpu_per_call(ctx, &sim, &limits).await?;
        let (instructions, instructions_missing) = if ctx.features.valgrind {
            match instructions_per_call(ctx, &sim, &limits).await {
                Ok(i) => (Some(i), None),
                Err(e) => (None, Some(e.to_string())),
            }
        } else {
            (None, Some("valgrind is not installed".to_owned()))
        };
        drop(sim);
        let memory = rss_per_waiting(ctx, Waiting::Queued).await?;
        let memory_held = Some(rss_per_waiting(ctx, Waiting::AtTheDoor).await?);
        Ok(Cost { backend, limits, cpu, instructions, instructions_missing, memory, memory_held })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Cost.label();
        let cpu = &self.cpu;
        let instructions = Target::info(
            &scenario,
            "instructions per call (callgrind)",
            self.instructions.as_ref().map(Instructions::per_call),
            "",
        );
        let haproxy = |target: Target| match (&cpu.haproxy_missing, target.measured) {
            (Some(why), None) => target.skip_because(why.clone()),
            _ => target,
        };
        let instructions = match &self.instructions_missing {
            Some(why) => Target { note: format!("not measured: {why}"), ..instructions },
            None => instructions,
        };
        let mut targets = vec![
            Target::at_most(
                &scenario,
                "CPU per proxied call ÷ simulator's per served call",
                cpu.ratio(),
                CPU_RATIO_LIMIT,
                "×",
            )
            .note_if_not_passed(format!(
                "the multiplexer spends {:.0} µs per call where the simulator, one tonic server that also batches \
                 and computes the embedding, spends {:.0} µs; a bare proxy on the h2 crate (the multiplexer's own \
                 HTTP/2 stack, server and client) spends {} under the same load, so the multiplexer's own work \
                 (the key check, routing, admission, metrics, the load report) is the rest",
                cpu.mux_us_per_call(),
                cpu.sim_us_per_call(),
                cpu.floor_h2_us_per_call().map_or("n/a (not built)".into(), |us| format!("{us:.0} µs")),
            )),
            Target::info(&scenario, "multiplexer CPU per call", Some(cpu.mux_us_per_call()), "µs"),
            Target::info(&scenario, "simulator CPU per served call", Some(cpu.sim_us_per_call()), "µs"),
            Target::info(
                &scenario,
                &format!("{} CPU per call", Stack::Tonic.label()),
                Some(cpu.floor_us_per_call()),
                "µs",
            ),
            Target::info(&scenario, "multiplexer ÷ floor, CPU per call", Some(cpu.mux_over_floor()), "×"),
            Target::info(&scenario, &format!("{} CPU per call", Stack::H2.label()), cpu.floor_h2_us_per_call(), "µs"),
            haproxy(Target::info(&scenario, "HAProxy h2 CPU per call", cpu.haproxy_h2_us_per_call(), "µs")),
            haproxy(
                Target::new(
                    &scenario,
                    "multiplexer ÷ HAProxy h2, CPU per call",
                    cpu.mux_over_haproxy_h2(),
                    Rule::AtMost,
                    HAPROXY_RATIO_LIMIT,
                    "×",
                )
                .note_if_not_passed(vs_haproxy_note(cpu)),
            ),
            haproxy(Target::info(
                &scenario,
                &format!("{} ÷ HAProxy h2, CPU per call", Stack::Tonic.label()),
                cpu.over_haproxy_h2(cpu.floor_us_per_call()),
                "×",
            )),
            haproxy(Target::info(
                &scenario,
                &format!("{} ÷ HAProxy h2, CPU per call", Stack::H2.label()),
                cpu.floor_h2_us_per_call().and_then(|h2| cpu.over_haproxy_h2(h2)),
                "×",
            )),
            instructions,
            Target::at_most(&scenario, "RSS per queued request", self.memory.per_queued(), RSS_LIMIT_BYTES, "bytes")
                .note_if_not_passed(
                    "a queued call holds its headers, its unread message, its stream's state in h2, its task \
                     and the multiplexer's call future; heap profiling (valgrind massif, 3,000 queued calls \
                     on 16 connections) put h2's share at about 2.4 KB a call: its receive buffer's slab, \
                     sized at the burst's peak and never shrunk (1.36 KB), its stream store (0.45 KB) and the \
                     header map (0.62 KB); the multiplexer's call future is about 1.3 KB in a debug build (2.2 KB while \
                     async fns held their arguments twice)",
                ),
        ];
        if let Some(held) = &self.memory_held {
            targets.push(Target::at_most(
                &scenario,
                "RSS per request held at the door",
                held.per_queued(),
                RSS_LIMIT_BYTES,
                "bytes",
            ));
        }
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Cost.label();
        vec![
            Target::new(
                &scenario,
                "CPU per proxied call ÷ simulator's per served call",
                None,
                Rule::AtMost,
                CPU_RATIO_LIMIT,
                "×",
            ),
            Target::new(
                &scenario,
                "multiplexer ÷ HAProxy h2, CPU per call",
                None,
                Rule::AtMost,
                HAPROXY_RATIO_LIMIT,
                "×",
            ),
            Target::new(&scenario, "RSS per queued request", None, Rule::AtMost, RSS_LIMIT_BYTES, "bytes"),
            Target::new(&scenario, "RSS per request held at the door", None, Rule::AtMost, RSS_LIMIT_BYTES, "bytes"),
        ]
    }
}

async fn cpu_per_call(ctx: &Context, sim: &Proc, limits: &MuxLimits) -> Result<CpuRun> {
    let mux = procs::start_mux(&ctx.bins, "cost-mux", sim, limits).await?;
    warm_up(&mux.url(), 4).await?;
    let rate = 1000.0;
    let duration = ctx.pick(Duration::from_secs(4), Duration::from_secs(15));
    ctx.say(&format!("cost: CPU of the multiplexer and the simulator at {rate} req/s for {} s", duration.as_secs()));
    admin::reset_sim_stats(sim.admin_addr())
        .await
        .ok_or_else(|| Error::Process("could not reset the simulator".into()))?;
    let meter = CpuMeter::start(&[mux.pid(), sim.pid()])?;
    let report = measure(LoadConfig { connections: 4, ..LoadConfig::open(mux.url(), rate, duration) }).await?;
    let spent = meter.stop()?;
    let stats = admin::sim_stats(sim.admin_addr()).await.ok_or_else(|| Error::Process("no simulator /stats".into()))?;
    drop(mux);
    let floor = proxy_cpu(ctx, sim, rate, duration, Stack::Tonic).await?;
    let floor_h2 = proxy_cpu(ctx, sim, rate, duration, Stack::H2).await?;
    let (haproxy_h2, haproxy_missing) = match haproxy_h2_cpu(ctx, sim, rate, duration).await {
        Ok(cpu) => (Some(cpu), None),
        Err(why) => (None, Some(why)),
    };
    if report.ok == 0 {
        return Err(Error::Process("no request succeeded through the multiplexer".into()));
    }
    Ok(CpuRun {
        rate,
        seconds: duration.as_secs_f64(),
        mux_calls: report.ok,
        sim_served: stats.completed,
        mux_cpu_s: spent[0],
        sim_cpu_s: spent[1],
        floor_calls: floor.calls,
        floor_cpu_s: floor.cpu_s,
        floor_h2: Some(floor_h2),
        haproxy_h2,
        haproxy_missing,
    })
}

/// HAProxy h2's CPU over the same load, or why it did not run (not installed, did not start):
/// never an error of the scenario.
async fn haproxy_h2_cpu(ctx: &Context, sim: &Proc, rate: f64, duration: Duration) -> Result<ProxyCpu, String> {
    if !ctx.features.haproxy {
        return Err(procs::HAPROXY_MISSING.into());
    }
    let run = async {
        let proxy = procs::start_haproxy(&ctx.bins, "cost-haproxy-h2", sim, HaproxyMode::H2).await?;
        warm_up(&proxy.url(), 4).await?;
        let meter = CpuMeter::start(&[proxy.pid()])?;
        let report = measure(LoadConfig { connections: 4, ..LoadConfig::open(proxy.url(), rate, duration) }).await?;
        let spent = meter.stop()?;
        Ok::<_, Error>(ProxyCpu { calls: report.ok, cpu_s: spent[0] })
    };
    match run.await {
        Ok(cpu) if cpu.calls > 0 => Ok(cpu),
        Ok(_) => Err("no request succeeded through HAProxy h2".into()),
        Err(e) => Err(format!("HAProxy h2: {e}")),
    }
}

/// A floor proxy's CPU over the same load: its answered calls and CPU seconds.
async fn proxy_cpu(ctx: &Context, sim: &Proc, rate: f64, duration: Duration, stack: Stack) -> Result<ProxyCpu> {
    let floor = procs::start_floor(&ctx.bins, &format!("cost-floor-{}", stack.flag()), sim, stack).await?;
    warm_up(&floor.url(), 4).await?;
    let meter = CpuMeter::start(&[floor.pid()])?;
    let report = measure(LoadConfig { connections: 4, ..LoadConfig::open(floor.url(), rate, duration) }).await?;
    let spent = meter.stop()?;
    Ok(ProxyCpu { calls: report.ok, cpu_s: spent[0] })
}

/// Why the multiplexer spends more than HAProxy h2, from the floors of the same run.
fn vs_haproxy_note(cpu: &CpuRun) -> String {
    let ratio_to_haproxy =
        |us: Option<f64>| us.and_then(|us| cpu.over_haproxy_h2(us)).map_or("n/a".into(), |r| format!("{r:.2}×"));
    let floor_h2 = cpu.floor_h2_us_per_call();
    format!(
        "the multiplexer spends {:.0} µs per call; under the same load a bare tonic proxy spends {:.0} µs ({} \
         HAProxy h2's) and a bare proxy on the h2 crate alone {} ({}). The multiplexer's unary calls are on h2 \
         directly on both sides, so the {} above the h2 floor are its own work per call (the key check, \
         routing, admission, metrics, the load report, the call's accounting); the h2 floor's ratio is the \
         least a data path on h2 could reach here",
        cpu.mux_us_per_call(),
        cpu.floor_us_per_call(),
        ratio_to_haproxy(Some(cpu.floor_us_per_call())),
        floor_h2.map_or("n/a".into(), |us| format!("{us:.0} µs")),
        ratio_to_haproxy(floor_h2),
        floor_h2.map_or("n/a".into(), |us| format!("{:.0} µs", cpu.mux_us_per_call() - us)),
    )
}

/// Runs the multiplexer under callgrind twice, with `calls` calls and with none over the same
/// time, and divides the difference.
async fn instructions_per_call(ctx: &Context, sim: &Proc, limits: &MuxLimits) -> Result<Instructions> {
    let calls = ctx.pick(1000, 3000);
    let logs = &ctx.bins.logs;
    ctx.say(&format!("cost: instructions of {calls} calls through the multiplexer under callgrind"));
    let (measured, seconds) =
        callgrind_run(ctx, sim, limits, &logs.join("callgrind.calls.out"), Work::Calls(calls)).await?;
    ctx.say(&format!("cost: the same multiplexer under callgrind, idle for {seconds:.1} s"));
    let (baseline, _) =
        callgrind_run(ctx, sim, limits, &logs.join("callgrind.baseline.out"), Work::Idle(seconds)).await?;
    Ok(Instructions { calls, warm_up_calls: CALLGRIND_WARM_UP, measured, baseline, seconds })
}

enum Work {
    Calls(u64),
    Idle(f64),
}

/// One multiplexer under callgrind: warm-up calls, then the work, then SIGTERM so callgrind
/// writes its counts. Returns the total and how long the work took.
async fn callgrind_run(ctx: &Context, sim: &Proc, limits: &MuxLimits, out: &Path, work: Work) -> Result<(u64, f64)> {
    let _ = std::fs::remove_file(out);
    let name = out.file_stem().and_then(|s| s.to_str()).unwrap_or("callgrind");
    let mux = procs::start_mux_callgrind(&ctx.bins, name, sim, limits, out).await?;
    let closed = |calls| LoadConfig { duration: Duration::from_secs(600), ..LoadConfig::closed(mux.url(), 1, calls) };
    measure(closed(CALLGRIND_WARM_UP)).await?;
    let started = Instant::now();
    match work {
        Work::Calls(calls) => {
            let report = measure(closed(calls)).await?;
            if report.ok != calls {
                return Err(Error::Process(format!(
                    "{} of {calls} calls succeeded under callgrind ({})",
                    report.ok,
                    teifleet_load::render::codes(&report)
                )));
            }
        }
        Work::Idle(seconds) => tokio::time::sleep(Duration::from_secs_f64(seconds)).await,
    }
    let seconds = started.elapsed().as_secs_f64();
    if !mux.terminate(Duration::from_secs(60)) {
        return Err(Error::Process("the multiplexer did not exit under callgrind within 60 s of SIGTERM".into()));
    }
    Ok((callgrind::read_total(out)?, seconds))
}

/// Where the calls of the memory measurement wait.
#[derive(Clone, Copy)]
enum Waiting {
    Queued,
    AtTheDoor,
}

impl Waiting {
    fn metric(self) -> &'static str {
        match self {
            Self::Queued => "teifleet_queued",
            Self::AtTheDoor => "teifleet_held_at_door",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Queued => "queued requests",
            Self::AtTheDoor => "requests held at the door",
        }
    }
}

async fn rss_per_waiting(ctx: &Context, waiting: Waiting) -> Result<Memory> {
    let sim = procs::start_sim(&ctx.bins, "rss-sim", &fast_model()).await?;
    let limits = MuxLimits {
        max_in_flight: 4,
        max_queued: match waiting {
            Waiting::Queued => QUEUED + 100,
            Waiting::AtTheDoor => 0,
        },
        queue_timeout: Duration::from_secs(120),
        max_concurrent_streams: 1024,
        coalesce: false,
    };
    let mux = procs::start_mux(&ctx.bins, "rss-mux", &sim, &limits).await?;
    warm_up(&mux.url(), 4).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = procfs::rss_bytes(mux.pid())?;
    http::post(sim.admin_addr(), "/fault/stall")
        .await
        .ok_or_else(|| Error::Process("could not stall the simulator".into()))?;

    ctx.say(&format!("cost: RSS of the multiplexer with {QUEUED} {}", waiting.label()));
    let clients = QUEUED + limits.max_in_flight;
    let config = LoadConfig {
        connections: 16,
        duration: Duration::from_secs(60),
        grace: Duration::from_secs(60),
        ..LoadConfig::closed(mux.url(), clients, clients as u64)
    };
    let load = tokio::spawn(async move { measure(config).await });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut queued = 0.0;
    while Instant::now() < deadline {
        queued = admin::metric_sum(mux.admin_addr(), waiting.metric()).await.unwrap_or(queued);
        if queued >= QUEUED as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let allocations settle, then read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let loaded = procfs::rss_bytes(mux.pid())?;
    http::post(sim.admin_addr(), "/fault/clear").await;
    let report = load.await.map_err(|e| Error::Process(format!("load task: {e}")))??;
    if queued < 1.0 {
        return Err(Error::Process(format!(
            "no {} at the multiplexer (codes: {})",
            waiting.label(),
            teifleet_load::render::codes(&report)
        )));
    }
    Ok(Memory { limits, clients, idle_bytes: idle, loaded_bytes: loaded, queued: queued as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::Verdict;

    fn cost(instructions: Option<Instructions>) -> Cost {
        Cost {
            backend: fast_model(),
            limits: limits(),
            cpu: CpuRun {
                rate: 1000.0,
                seconds: 10.0,
                mux_calls: 10_000,
                sim_served: 10_000,
                mux_cpu_s: 1.5,
                sim_cpu_s: 1.2,
                floor_calls: 10_000,
                floor_cpu_s: 1.25,
                floor_h2: Some(ProxyCpu { calls: 10_000, cpu_s: 0.6 }),
                haproxy_h2: Some(ProxyCpu { calls: 10_000, cpu_s: 0.5 }),
                haproxy_missing: None,
            },
            instructions_missing: instructions.is_none().then(|| "valgrind is not installed".into()),
            instructions,
            memory: Memory {
                limits: limits(),
                clients: 10,
                idle_bytes: 10_000_000,
                loaded_bytes: 40_000_000,
                queued: 10_000,
            },
            memory_held: Some(Memory {
                limits: limits(),
                clients: 10,
                idle_bytes: 10_000_000,
                loaded_bytes: 30_000_000,
                queued: 10_000,
            }),
        }
    }

    #[test]
    fn cpu_is_judged_as_a_ratio_and_instructions_are_reported() {
        let i =
            Instructions { calls: 1000, warm_up_calls: 20, measured: 600_000_000, baseline: 400_000_000, seconds: 5.0 };
        assert_eq!(i.per_call(), 200_000.0);
        let targets = cost(Some(i)).targets();
        let find = |n: &str| targets.iter().find(|t| t.name.starts_with(n)).unwrap();
        let cpu = find("CPU per proxied call");
        assert!((cpu.measured.unwrap() - 1.25).abs() < 1e-9);
        assert_eq!(cpu.verdict, Verdict::Fail);
        assert!(cpu.note.contains("150 µs") && cpu.note.contains("120 µs"), "{}", cpu.note);
        assert_eq!(find("instructions").verdict, Verdict::Info);
        assert_eq!(find("instructions").measured, Some(200_000.0));
        assert_eq!(find("HAProxy h2 CPU per call").measured, Some(50.0));
        let vs_haproxy = find("multiplexer ÷ HAProxy h2");
        assert_eq!((vs_haproxy.measured, vs_haproxy.verdict), (Some(3.0), Verdict::Fail));
        // The note names both floors with their ratios, so a FAIL says what the stack costs.
        assert!(
            vs_haproxy.note.contains("125 µs (2.50×") && vs_haproxy.note.contains("60 µs (1.20×)"),
            "{}",
            vs_haproxy.note
        );
        assert_eq!(find("floor (bare h2 proxy) ÷ HAProxy h2").measured, Some(1.2));
        let held = find("RSS per request held");
        assert_eq!((held.measured, held.verdict), (Some(2000.0), Verdict::Pass));
        let rss = find("RSS");
        assert_eq!((rss.measured, rss.verdict), (Some(3000.0), Verdict::Pass));
    }

    #[test]
    fn a_missing_instruction_count_says_why() {
        let targets = cost(None).targets();
        let instructions = targets.iter().find(|t| t.name.starts_with("instructions")).unwrap();
        assert_eq!(instructions.measured, None);
        assert!(instructions.note.contains("valgrind"));
    }

    #[test]
    fn without_haproxy_its_cpu_rows_skip_with_the_reason() {
        let mut c = cost(None);
        (c.cpu.haproxy_h2, c.cpu.haproxy_missing) = (None, Some("haproxy is not installed".into()));
        let targets = c.targets();
        for name in ["HAProxy h2 CPU per call", "multiplexer ÷ HAProxy h2, CPU per call"] {
            let row = targets.iter().find(|t| t.name == name).unwrap();
            assert_eq!(row.verdict, crate::targets::Verdict::Skip, "{name}");
            assert!(row.note.contains("not installed"), "{}", row.note);
        }
    }
}
