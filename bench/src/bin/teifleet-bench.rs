//! `teifleet-bench`: the `make bench` scenario runner. Runs the scenarios (direct to the backend
//! vs through the multiplexer, in one run), prints PASS/FAIL per target and writes
//! `<out>/<date>.md`, `<date>.json` and SVG plots. FAILs are results, not errors: the exit code
//! is non-zero only when the run itself could not be done.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Parser;
use teifleet_bench::procs::Bins;
use teifleet_bench::results::{self, Machine, Results, Section};
use teifleet_bench::scenarios::{Context, Scenario};
use teifleet_bench::{render, targets};
use tokio::time::Instant;

/// Runs teifleet's benchmark scenarios against the stated targets (see docs/benchmarks.md).
#[derive(Debug, Parser)]
#[command(name = "teifleet-bench", version)]
struct Args {
    /// Fewer requests and shorter runs (a few minutes), same scenarios.
    #[arg(long)]
    quick: bool,
    /// Where results and plots are written.
    #[arg(long, default_value = "bench/results", value_name = "DIR")]
    out: PathBuf,
    /// Where the built tei-sim, teifleet-multiplexer, teifleet-floor-proxy and teifleet-operator are.
    #[arg(long, default_value = "target/release", value_name = "DIR")]
    bin_dir: PathBuf,
    /// Local control plane for the live-limit scenario (tests/cluster/up.sh); skipped without it.
    #[arg(long, env = "TEIFLEET_BENCH_KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Run only these scenarios, by number or name, e.g. 1,5,shed-storm.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    only: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut wanted = Vec::new();
    for name in &args.only {
        match Scenario::parse(name) {
            Some(s) => wanted.push(s),
            None => bail!("--only: no scenario {name:?} (1-{} or a name such as shed-storm)", Scenario::ALL.len()),
        }
    }
    let repo_root = std::env::current_dir().context("current directory")?;
    let date = results::today();
    let bins = Bins { dir: args.bin_dir.clone(), logs: repo_root.join("target/bench-logs") };
    bins.check()?;
    let ctx = Context {
        features: bins.features(),
        bins,
        quick: args.quick,
        kubeconfig: args.kubeconfig.clone(),
        repo_root,
        started: Instant::now(),
    };
    ctx.say(&format!("features of this build: {:?}", ctx.features));
    // run.sh reads it before it boots the control plane, whose start-up is not other work.
    let load_before = std::env::var("TEIFLEET_BENCH_LOAD_BEFORE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .or_else(results::load_average);

    let mut sections = Vec::new();
    for scenario in Scenario::ALL.into_iter().filter(|s| wanted.is_empty() || wanted.contains(s)) {
        ctx.say(&format!("scenario {}", scenario.title()));
        sections.push(Section::run(&ctx, scenario).await);
    }

    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let results = Results {
        date: date.clone(),
        mode: if args.quick { "quick" } else { "full" }.into(),
        machine: Machine::this(),
        commit,
        duration_s: ctx.started.elapsed().as_secs_f64(),
        features: ctx.features,
        load_before,
        build: std::fs::read_to_string(args.bin_dir.join("BUILD")).unwrap_or_default().trim().replace('\n', "; "),
        sections,
    };
    let written = render::write(&results, &args.out, &date)?;
    let all = results.targets();
    let (pass, fail, skip) = targets::tally(&all);
    println!("\n{}", render::summary_table(&all));
    println!("{pass} PASS, {fail} FAIL, {skip} SKIP in {:.0} s", results.duration_s);
    for path in written {
        println!("wrote {}", path.display());
    }
    Ok(())
}
