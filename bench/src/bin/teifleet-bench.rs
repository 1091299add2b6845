//! `teifleet-bench`: the `make bench` scenario runner. Runs scenarios 1–6 (direct to the backend
//! vs through the multiplexer, in one run), prints PASS/FAIL per target and writes
//! `<out>/<date>.md`, `<date>.json` and SVG plots. FAILs are results, not errors: the exit code
//! is non-zero only when the run itself could not be done.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use teifleet_bench::results::{self, Machine, Results};
use teifleet_bench::scenarios::{self, Context, procs::Bins};
use teifleet_bench::targets;
use tokio::time::Instant;

/// Runs teifleet's benchmark scenarios against the stated targets (see bench/README.md).
#[derive(Debug, Parser)]
#[command(name = "teifleet-bench", version)]
struct Args {
    /// Fewer requests and shorter runs (under 3 minutes), same scenarios.
    #[arg(long)]
    quick: bool,
    /// Where results and plots are written.
    #[arg(long, default_value = "bench/results", value_name = "DIR")]
    out: PathBuf,
    /// Where the built tei-sim, teifleet-multiplexer and teifleet-operator binaries are.
    #[arg(long, default_value = "target/release", value_name = "DIR")]
    bin_dir: PathBuf,
    /// Local control plane for scenario 6 (tests/cluster/up.sh); skipped without it.
    #[arg(long, env = "TEIFLEET_BENCH_KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Run only these scenarios, e.g. 1,2,5.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    only: Vec<u8>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let repo_root = std::env::current_dir().context("current directory")?;
    let date = results::today();
    let ctx = Context {
        bins: Bins { dir: args.bin_dir.clone(), logs: repo_root.join("target/bench-logs") },
        quick: args.quick,
        out_dir: args.out.clone(),
        stem: date.clone(),
        kubeconfig: args.kubeconfig.clone(),
        repo_root: repo_root.clone(),
        started: Instant::now(),
    };
    ctx.bins.check()?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let wanted = |n: u8| args.only.is_empty() || args.only.contains(&n);

    let mut sections = Vec::new();
    if wanted(1) {
        sections.push(scenarios::overhead::run(&ctx).await);
    }
    if wanted(2) {
        sections.push(scenarios::overload::run(&ctx).await);
    }
    if wanted(3) {
        sections.push(scenarios::burst::run(&ctx).await);
    }
    if wanted(4) {
        sections.push(scenarios::slo::run(&ctx).await);
    }
    if wanted(5) {
        sections.push(scenarios::cost::run(&ctx).await);
    }
    if wanted(6) {
        sections.push(scenarios::live_limits::run(&ctx).await);
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
        sections,
    };
    let written = results::write(&results, &args.out, &date)?;
    let all = results.targets();
    let (pass, fail, skip) = targets::tally(&all);
    println!("\n{}", results::summary_table(&all));
    println!("{pass} PASS, {fail} FAIL, {skip} SKIP in {:.0} s", results.duration_s);
    for path in written {
        println!("wrote {}", path.display());
    }
    Ok(())
}
