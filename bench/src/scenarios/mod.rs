//! The `make bench` scenarios. Each one starts its own backend (the simulator) and multiplexer as
//! separate processes, measures the same traffic direct and through the multiplexer in one run,
//! and returns a [`Section`] with its tables, plots and target verdicts.

pub mod burst;
pub mod cost;
pub mod http;
pub mod live_limits;
pub mod overhead;
pub mod overload;
pub mod procs;
pub mod slo;

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::Result;
use crate::load::{self, LoadConfig};
use crate::report::Report;
use crate::results::Section;
use crate::targets::Target;
use procs::{Bins, SimModel};

/// What every scenario gets.
#[derive(Clone, Debug)]
pub struct Context {
    pub bins: Bins,
    /// Quick mode: fewer requests and shorter runs, same scenarios.
    pub quick: bool,
    /// Where plots go (next to the results files).
    pub out_dir: PathBuf,
    /// File name prefix of plots, e.g. `2026-01-31`.
    pub stem: String,
    /// The local control plane for scenario 6; without it that scenario is skipped.
    pub kubeconfig: Option<PathBuf>,
    pub repo_root: PathBuf,
    pub started: Instant,
}

impl Context {
    /// A progress line on stderr (the run is long; people want to see where it is).
    pub fn say(&self, message: &str) {
        eprintln!("[bench {:>6.1}s] {message}", self.started.elapsed().as_secs_f64());
    }

    /// `quick` or `full` value.
    pub fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick { quick } else { full }
    }

    pub fn plot_path(&self, name: &str) -> (PathBuf, String) {
        let file = format!("{}-{name}.svg", self.stem);
        (self.out_dir.join(&file), file)
    }
}

/// The GPU-like backend of the overload, burst and SLO scenarios: TEI batching at most 8 requests
/// per device batch, 20 ms per batch plus 20 µs per token (a small embedding model on a modest
/// GPU, slowed so that 10× its capacity is still a load this 2-core machine can offer).
pub fn gpu_model(max_concurrent_requests: usize) -> SimModel {
    SimModel {
        max_concurrent_requests,
        max_batch_requests: Some(8),
        fixed_latency: Duration::from_millis(20),
        per_token_latency: Duration::from_micros(20),
    }
}

/// The fast backend of the overhead and cost scenarios: about 1 ms per call (the simulated
/// device's timer ticks in milliseconds, so a batch takes at least ~1 ms).
pub fn fast_model() -> SimModel {
    SimModel {
        max_concurrent_requests: 512,
        max_batch_requests: None,
        fixed_latency: Duration::ZERO,
        per_token_latency: Duration::from_micros(1),
    }
}

/// Runs one load, quietly.
pub async fn measure(config: LoadConfig) -> Result<Report> {
    load::run(&LoadConfig { progress: false, ..config }).await
}

/// A short closed-loop warm-up so connections, allocators and the simulator's batcher are warm
/// before anything is measured.
pub async fn warm_up(target: &str, connections: usize) -> Result<()> {
    let config = LoadConfig { connections, ..LoadConfig::closed(target, 4, 200) };
    measure(config).await.map(|_| ())
}

/// A scenario that could not run still gets a section saying why, and SKIPs for its targets.
pub fn failed_section(key: &str, title: &str, error: &crate::Error, targets: Vec<Target>) -> Section {
    Section {
        key: key.into(),
        title: title.into(),
        markdown: format!("Not measured: {error}"),
        targets: targets.into_iter().map(|t| t.note_if_not_passed(format!("not measured: {error}"))).collect(),
        ..Section::default()
    }
}

/// Milliseconds with a sensible number of digits, for tables.
pub fn ms(v: f64) -> String {
    crate::targets::number(v)
}
