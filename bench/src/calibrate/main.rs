//! `teifleet-calibrate`: measures a real TEI so the simulator can replay it.
//!
//! `profile` starts TEI's gRPC router, drives Embed at concurrencies 1..8 with inputs of several
//! lengths, reads TEI's own timing Metadata of every answer, infers the batches TEI formed (calls
//! of one batch share its inference time to the nanosecond), fits batch time = fixed +
//! per request + per token, and writes a profile for `tei-sim --profile`.
//!
//! `compare` runs the same closed-loop load against real TEI and against `tei-sim --profile` and
//! prints throughput and latency side by side.
#![forbid(unsafe_code)]

mod fit;
mod probe;
mod record;
mod server;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use teifleet_proto::v1::InfoRequest;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_tei_sim::Device;
use teifleet_tei_sim::profile::{DeviceModel, PROFILE_FORMAT, Profile};

use crate::probe::CallSample;
use crate::record::{BatchPoint, Cell, Document, FitReport, Machine, QueueFinding, Recorded};
use crate::server::Server;

#[derive(Debug, Parser)]
#[command(name = "teifleet-calibrate")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure a real TEI and write a profile.
    Profile(ProfileArgs),
    /// Same closed-loop load against real TEI and against tei-sim --profile.
    Compare(CompareArgs),
}

#[derive(Debug, clap::Args)]
struct Common {
    /// Where real-tei.sh put TEI [default: ${TEIFLEET_CACHE:-$HOME/.cache/teifleet}/real-tei].
    #[arg(long, value_name = "DIR")]
    tei: Option<PathBuf>,
    /// The model under <tei>/models.
    #[arg(long, default_value = "all-MiniLM-L6-v2")]
    model: String,
    /// Where server logs go.
    #[arg(long, default_value = "target/calibrate")]
    logs: PathBuf,
    /// Runs of each measurement; figures are their medians.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

#[derive(Debug, clap::Args)]
struct ProfileArgs {
    #[command(flatten)]
    common: Common,
    /// The profile's name; written to tools/tei-sim/profiles/<name>.json unless --out is given.
    #[arg(long, default_value = "minilm-l6-cpu")]
    name: String,
    #[arg(long)]
    out: Option<PathBuf>,
    /// Callers at once.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,8")]
    concurrency: Vec<usize>,
    /// Input lengths in tokens, [CLS] and [SEP] included.
    #[arg(long, value_delimiter = ',', default_value = "8,32,128,256")]
    tokens: Vec<usize>,
    /// Calls per concurrency and length, per repeat.
    #[arg(long, default_value_t = 48)]
    calls: usize,
}

#[derive(Debug, clap::Args)]
struct CompareArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value = "tools/tei-sim/profiles/minilm-l6-cpu.json")]
    profile: PathBuf,
    /// The simulator binary (build it with cargo build --release -p teifleet-tei-sim).
    #[arg(long, default_value = "target/release/tei-sim")]
    sim: PathBuf,
    /// Closed-loop callers of each run.
    #[arg(long, value_delimiter = ',', default_value = "64,8")]
    callers: Vec<usize>,
    /// Words per input (TEI adds [CLS] and [SEP]).
    #[arg(long, default_value_t = 20)]
    words: usize,
    /// Length of each run.
    #[arg(long, default_value = "8s", value_parser = teifleet_runtime::duration::parse_flag)]
    duration: Duration,
    /// JSON of every run.
    #[arg(long, default_value = "target/calibrate/compare.json")]
    out: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Command::Profile(p) => profile(p).await,
        Command::Compare(c) => compare(c).await,
    }
}

fn tei_dir(common: &Common) -> PathBuf {
    common.tei.clone().unwrap_or_else(|| {
        let cache = std::env::var_os("TEIFLEET_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/teifleet"));
        cache.join("real-tei")
    })
}

async fn profile(args: ProfileArgs) -> anyhow::Result<()> {
    if args.common.repeats == 0 || args.calls == 0 || args.concurrency.contains(&0) || args.tokens.is_empty() {
        bail!("--repeats, --calls and every --concurrency must be at least 1, and --tokens not empty");
    }
    std::fs::create_dir_all(&args.common.logs)?;
    let date = command_output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_default();
    let load_before = load_1m();
    let tei = tei_dir(&args.common);
    let server = Server::real_tei(&tei, &args.common.model, &args.common.logs).await?;
    let channel = server.channel().await?;
    let info = InfoClient::new(channel.clone()).info(InfoRequest {}).await?.into_inner();
    eprintln!("real TEI {} ({:?}) serving {} on {}", info.version, info.sha, info.model_id, server.url());

    // Warm-up: the first calls of each length pay for allocations the rest do not.
    for &tokens in &args.tokens {
        probe::drive(&channel, &probe::text(tokens), 4, 16).await?;
    }

    let mut runs: Vec<Run> = Vec::new();
    for repeat in 1..=args.common.repeats {
        for &tokens in &args.tokens {
            let text = probe::text(tokens);
            for &k in &args.concurrency {
                let load_1m = load_1m();
                let cpu_before = server.pid().and_then(server::cpu_time);
                let (samples, wall) = probe::drive(&channel, &text, k, args.calls).await?;
                let cpu = cpu_before.zip(server.pid().and_then(server::cpu_time)).map(|(a, b)| b.saturating_sub(a));
                let run = Run { concurrency: k, samples, wall, cpu, load_1m };
                eprintln!("repeat {repeat} tokens {tokens} k {k}: {}", run.line());
                runs.push(run);
            }
        }
    }
    let load_after = load_1m();
    server.stop().await;

    let mut batches = batch_points(&runs);
    let points: Vec<_> = batches.iter().map(BatchPoint::point).collect();
    let three = fit::three_terms(&points).context("too few batch shapes to fit three terms")?;
    let two = fit::two_terms(&points).context("too few batch shapes to fit")?;
    // The per-request term earns its place when it removes a fifth of the two-term fit's error.
    let per_request_matters = three.per_request_us > 0.0 && three.rms_relative_error < 0.8 * two.rms_relative_error;
    let (chosen, model) = if per_request_matters { ("three_terms", three) } else { ("two_terms", two) };
    let why = format!(
        "relative RMS error {:.1}% with the per-request term, {:.1}% without",
        100.0 * three.rms_relative_error,
        100.0 * two.rms_relative_error
    );
    for b in &mut batches {
        b.predicted_us = model.predict(b.requests, b.tokens);
    }
    let cells = cells(&runs);
    let max_batch_seen = batches.iter().map(|b| b.requests).max().unwrap_or(0);
    let document = Document {
        format: PROFILE_FORMAT,
        name: args.name.clone(),
        about: "written by teifleet-calibrate profile (bench/src/calibrate); fields: tools/tei-sim/profiles/README.md",
        sim: DeviceModel {
            fixed_latency_us: round(model.fixed_us),
            per_request_latency_us: round(model.per_request_us),
            per_token_latency_us: round(model.per_token_us),
            max_batch_requests: info.max_batch_requests.map(|n| n as usize),
            max_batch_tokens: Some(info.max_batch_tokens as usize),
            // A CPU TEI's forward pass takes the host's CPU: a busy machine slows it down.
            device: Device::Spin,
            // TEI's router hands each prepared batch to the backend through a one-slot channel
            // as soon as it holds a request (core/src/infer.rs, mpsc::channel(1)): later arrivals
            // wait for the batch after it. `compare` shows what it changes.
            freeze_next_batch: true,
        },
        recorded: Recorded {
            date,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            tei_version: info.version.clone(),
            tei_sha: info.sha.clone(),
            tei_source_commit: command_output(
                "git",
                &["-C", &tei.join("src/tei").to_string_lossy(), "rev-parse", "HEAD"],
            ),
            model_id: info.model_id.clone(),
            model_dtype: info.model_dtype.clone(),
            max_input_length: info.max_input_length,
            max_batch_tokens: info.max_batch_tokens,
            max_batch_requests: info.max_batch_requests,
            max_concurrent_requests: info.max_concurrent_requests,
            machine: machine(),
            load_before,
            load_after,
            repeats: args.common.repeats,
            calls_per_cell: args.calls,
        },
        fit: FitReport { chosen, why, three_terms: three, two_terms: two, points: points.len() },
        queue: QueueFinding { max_batch_seen, summary: queue_summary(&cells, max_batch_seen) },
        batches,
        cells,
    };
    let text = serde_json::to_string_pretty(&document)? + "\n";
    // What the simulator will read must parse: refuse to write a profile it would refuse.
    Profile::parse(&text).map_err(|why| anyhow::anyhow!("the profile written would be refused: {why}"))?;
    let out = args.out.unwrap_or_else(|| PathBuf::from(format!("tools/tei-sim/profiles/{}.json", args.name)));
    std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("{}\nfit: {:?}\nwrote {}", document.fit.why, model, out.display());
    Ok(())
}

/// One closed-loop run of one cell in one repeat.
struct Run {
    concurrency: usize,
    samples: Vec<CallSample>,
    wall: Duration,
    cpu: Option<Duration>,
    load_1m: f64,
}

impl Run {
    fn tokens(&self) -> usize {
        median(self.samples.iter().map(|s| f64::from(s.tokens)).collect()).round() as usize
    }

    fn line(&self) -> String {
        let sizes: Vec<usize> = probe::batches(&self.samples).iter().map(|b| b.0).collect();
        let mean = sizes.iter().sum::<usize>() as f64 / sizes.len().max(1) as f64;
        let inference = median(self.samples.iter().map(|s| us(s.inference)).collect());
        format!(
            "{} tokens, {:.0} calls/s, batch mean {mean:.2}, inference p50 {inference:.0} us, load {:.2}",
            self.tokens(),
            self.samples.len() as f64 / self.wall.as_secs_f64(),
            self.load_1m
        )
    }
}

/// Median inference time per (requests, tokens per request) over every batch of every run.
fn batch_points(runs: &[Run]) -> Vec<BatchPoint> {
    let mut seen: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for run in runs {
        let tokens = run.tokens();
        for (size, time) in probe::batches(&run.samples) {
            seen.entry((size, tokens)).or_default().push(us(time));
        }
    }
    seen.into_iter()
        // A shape seen once or twice is too noisy on a shared machine to weigh like the others.
        .filter(|(_, times)| times.len() >= 3)
        .map(|((requests, tokens_per_request), times)| BatchPoint {
            requests,
            tokens_per_request,
            tokens: requests * tokens_per_request,
            seen: times.len(),
            inference_us_median: round(median(times)),
            predicted_us: 0.0,
        })
        .collect()
}

/// Per (concurrency, length): the median over repeats of each repeat's figures.
fn cells(runs: &[Run]) -> Vec<Cell> {
    let mut by_cell: BTreeMap<(usize, usize), Vec<&Run>> = BTreeMap::new();
    for run in runs {
        by_cell.entry((run.tokens(), run.concurrency)).or_default().push(run);
    }
    by_cell
        .into_iter()
        .map(|((tokens, concurrency), runs)| {
            let each = |f: &dyn Fn(&Run) -> f64| round(median(runs.iter().map(|r| f(r)).collect()));
            let p = |q: f64, f: fn(&CallSample) -> Duration| {
                move |r: &Run| quantile(r.samples.iter().map(|s| us(f(s))).collect(), q)
            };
            let sizes = |r: &Run| probe::batches(&r.samples).into_iter().map(|b| b.0).collect::<Vec<_>>();
            Cell {
                concurrency,
                tokens_per_request: tokens,
                calls: runs.iter().map(|r| r.samples.len()).sum::<usize>() / runs.len().max(1),
                calls_per_s: each(&|r| r.samples.len() as f64 / r.wall.as_secs_f64()),
                batch_size_mean: each(&|r| {
                    let s = sizes(r);
                    s.iter().sum::<usize>() as f64 / s.len().max(1) as f64
                }),
                batch_size_max: runs.iter().flat_map(|r| sizes(r)).max().unwrap_or(0),
                latency_us_p50: each(&p(0.5, |s| s.latency)),
                latency_us_p99: each(&p(0.99, |s| s.latency)),
                tei_total_us_p50: each(&p(0.5, |s| s.total)),
                tokenization_us_p50: each(&p(0.5, |s| s.tokenization)),
                queue_us_p50: each(&p(0.5, |s| s.queue)),
                inference_us_p50: each(&p(0.5, |s| s.inference)),
                tei_cpu_per_inference: each(&|r| {
                    let inference: f64 = probe::batches(&r.samples).iter().map(|b| us(b.1)).sum();
                    r.cpu.map_or(f64::NAN, |cpu| (100.0 * us(cpu) / inference).round() / 100.0)
                }),
                tei_cpu_us_per_batch: each(&|r| {
                    r.cpu.map_or(f64::NAN, |cpu| us(cpu) / probe::batches(&r.samples).len().max(1) as f64)
                }),
                load_1m: each(&|r| r.load_1m),
            }
        })
        .collect()
}

fn queue_summary(cells: &[Cell], max_batch_seen: usize) -> String {
    let at = |k: usize| {
        let sizes: Vec<String> =
            cells.iter().filter(|c| c.concurrency == k).map(|c| format!("{:.2}", c.batch_size_mean)).collect();
        format!("{k} callers: {}", sizes.join("/"))
    };
    let ks: std::collections::BTreeSet<usize> = cells.iter().map(|c| c.concurrency).collect();
    let by_k: Vec<String> = ks.into_iter().map(at).collect();
    format!(
        "largest batch formed: {max_batch_seen} requests. Mean batch size by callers (per input length, shortest first): {}. \
         Calls beyond a batch wait in TEI's queue for the batches ahead (queue_us_p50 per cell).",
        by_k.join("; ")
    )
}

/// The servers `compare` measures: real TEI, the simulator with the profile, the simulator with
/// the profile but its own batching (the prepared batch filling while the device runs), and with
/// the profile's batch times slept instead of spun (no CPU taken from the client).
const TARGETS: [(&str, Option<&str>); 4] = [
    ("real TEI", None),
    ("tei-sim --profile", Some("")),
    ("tei-sim --profile, next batch filling", Some("--freeze-next-batch=false")),
    ("tei-sim --profile --device=sleep", Some("--device=sleep")),
];

async fn compare(args: CompareArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.common.logs)?;
    let profile = std::fs::canonicalize(&args.profile).with_context(|| args.profile.display().to_string())?;
    Profile::load(&profile)?;
    // All up at once, idle but for the one measured, so that the repeats of each can interleave:
    // a shared machine's load drifts, and interleaving spreads the drift over all of them.
    let mut servers = Vec::new();
    for (name, sim_flag) in TARGETS {
        let server = match sim_flag {
            None => Server::real_tei(&tei_dir(&args.common), &args.common.model, &args.common.logs).await?,
            Some(flag) => {
                let mut sim_args = vec![format!("--profile={}", profile.display())];
                sim_args.extend((!flag.is_empty()).then(|| flag.to_owned()));
                Server::sim(&args.sim, &sim_args, &args.common.logs).await?
            }
        };
        // Warm-up, not counted.
        run_load(&server.url(), 8, args.words, Duration::from_secs(2)).await?;
        servers.push((name, server));
    }
    let mut rows = Vec::new();
    for &callers in &args.callers {
        for repeat in 1..=args.common.repeats {
            for (name, server) in &servers {
                let load_1m = load_1m();
                let report = run_load(&server.url(), callers, args.words, args.duration).await?;
                let row = CompareRow::new(name, callers, repeat, load_1m, &report);
                eprintln!("{row:?}");
                rows.push(row);
            }
        }
    }
    for (_, server) in servers {
        server.stop().await;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&rows)? + "\n")?;
    print!("{}", compare_table(&rows, &args.callers));
    Ok(())
}

async fn run_load(
    url: &str,
    callers: usize,
    words: usize,
    duration: Duration,
) -> anyhow::Result<teifleet_load::Report> {
    let config = teifleet_load::LoadConfig {
        duration,
        inputs: teifleet_load::inputs::Inputs::Words(teifleet_load::inputs::Tokens::Fixed(words)),
        grace: Duration::from_secs(30),
        ..teifleet_load::LoadConfig::closed(url, callers, u64::MAX / 2)
    };
    let report = teifleet_load::run(&config).await?;
    if report.ok < report.answered || report.ok == 0 {
        bail!("{callers} callers against {url}: {} of {} answers OK ({:?})", report.ok, report.answered, report.codes);
    }
    Ok(report)
}

#[derive(Debug, serde::Serialize)]
struct CompareRow {
    target: &'static str,
    callers: usize,
    repeat: usize,
    load_1m: f64,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    tei_queue_p50_ms: f64,
    tei_inference_p50_ms: f64,
}

impl CompareRow {
    fn new(target: &'static str, callers: usize, repeat: usize, load_1m: f64, r: &teifleet_load::Report) -> Self {
        Self {
            target,
            callers,
            repeat,
            load_1m,
            rps: r.throughput_rps,
            p50_ms: r.latency_ok.p50_ms,
            p99_ms: r.latency_ok.p99_ms,
            tei_queue_p50_ms: r.tei_queue.as_ref().map_or(f64::NAN, |s| s.p50_ms),
            tei_inference_p50_ms: r.tei_inference.as_ref().map_or(f64::NAN, |s| s.p50_ms),
        }
    }
}

/// Markdown: per caller count, the median of the repeats for each target, and sim/real ratios.
fn compare_table(rows: &[CompareRow], callers: &[usize]) -> String {
    let mut out = String::from(
        "| callers | server | req/s | p50 ms | p99 ms | TEI queue p50 ms | TEI inference p50 ms | load (1 min) |\n\
         |---:|---|---:|---:|---:|---:|---:|---|\n",
    );
    for &k in callers {
        let med = |target: &str, f: fn(&CompareRow) -> f64| {
            median(rows.iter().filter(|r| r.target == target && r.callers == k).map(f).collect())
        };
        let mut figures = Vec::new();
        for (target, _) in TARGETS {
            let loads: Vec<String> = rows
                .iter()
                .filter(|r| r.target == target && r.callers == k)
                .map(|r| format!("{:.1}", r.load_1m))
                .collect();
            let f = [
                med(target, |r| r.rps),
                med(target, |r| r.p50_ms),
                med(target, |r| r.p99_ms),
                med(target, |r| r.tei_queue_p50_ms),
                med(target, |r| r.tei_inference_p50_ms),
            ];
            out.push_str(&format!(
                "| {k} | {target} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {} |\n",
                f[0],
                f[1],
                f[2],
                f[3],
                f[4],
                loads.join(", ")
            ));
            figures.push(f);
        }
        for (sim, (target, _)) in TARGETS.iter().enumerate().skip(1) {
            let r: Vec<String> = (0..5).map(|i| format!("{:.2}", figures[sim][i] / figures[0][i])).collect();
            out.push_str(&format!(
                "| {k} | **{target} / real** | {} | {} | {} | {} | {} | |\n",
                r[0], r[1], r[2], r[3], r[4]
            ));
        }
    }
    out
}

fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_owned()))
        .unwrap_or_default();
    Machine {
        nproc: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        cpu_model,
        kernel: command_output("uname", &["-r"]).unwrap_or_default(),
    }
}

fn load_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|l| l.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn median(values: Vec<f64>) -> f64 {
    quantile(values, 0.5)
}

/// Nearest-rank quantile; NaN for no values.
fn quantile(mut values: Vec<f64>, q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}
