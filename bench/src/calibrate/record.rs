//! The profile document `teifleet-calibrate profile` writes: the simulator's device model (the
//! `format` and `sim` keys, read by `tei-sim --profile`, see tools/tei-sim/src/profile.rs) and
//! everything needed to judge it: what TEI, which machine under what load, the fits and their
//! error, the batches seen and the calls' timings per concurrency and input length. Fields are
//! documented in tools/tei-sim/profiles/README.md.

use serde::Serialize;
use teifleet_tei_sim::profile::DeviceModel;

use crate::fit::{Fit, Point};

#[derive(Debug, Serialize)]
pub struct Document {
    pub format: u32,
    pub name: String,
    pub about: &'static str,
    pub sim: DeviceModel,
    pub recorded: Recorded,
    pub fit: FitReport,
    pub batches: Vec<BatchPoint>,
    pub cells: Vec<Cell>,
    pub queue: QueueFinding,
}

#[derive(Debug, Serialize)]
pub struct Recorded {
    /// UTC, when the measurement started.
    pub date: String,
    pub command: String,
    /// What TEI's Info answered.
    pub tei_version: String,
    pub tei_sha: Option<String>,
    /// `git rev-parse HEAD` of the TEI source the binary was built from, when found.
    pub tei_source_commit: Option<String>,
    pub model_id: String,
    pub model_dtype: String,
    pub max_input_length: u32,
    pub max_batch_tokens: u32,
    pub max_batch_requests: Option<u32>,
    pub max_concurrent_requests: u32,
    pub machine: Machine,
    /// /proc/loadavg's 1-minute average before and after the sweep: the machine was shared.
    pub load_before: f64,
    pub load_after: f64,
    pub repeats: usize,
    pub calls_per_cell: usize,
}

#[derive(Debug, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
}

#[derive(Debug, Serialize)]
pub struct FitReport {
    /// The model `sim` carries: "three_terms" or "two_terms".
    pub chosen: &'static str,
    pub why: String,
    pub three_terms: Fit,
    pub two_terms: Fit,
    pub points: usize,
}

/// Batches of `requests` inputs of `tokens_per_request` tokens: how many were seen over all
/// repeats and their median inference time, against the chosen fit's prediction.
#[derive(Debug, Serialize)]
pub struct BatchPoint {
    pub requests: usize,
    pub tokens_per_request: usize,
    pub tokens: usize,
    pub seen: usize,
    pub inference_us_median: f64,
    pub predicted_us: f64,
}

impl BatchPoint {
    pub fn point(&self) -> Point {
        Point { requests: self.requests, tokens: self.tokens, time_us: self.inference_us_median }
    }
}

/// One closed-loop run shape: `concurrency` callers sending inputs of `tokens_per_request` tokens.
/// Each figure is the median over the repeats of that repeat's figure.
#[derive(Debug, Default, Serialize)]
pub struct Cell {
    pub concurrency: usize,
    pub tokens_per_request: usize,
    pub calls: usize,
    pub calls_per_s: f64,
    /// Requests per batch TEI formed: mean and largest.
    pub batch_size_mean: f64,
    pub batch_size_max: usize,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub tei_total_us_p50: f64,
    pub tokenization_us_p50: f64,
    pub queue_us_p50: f64,
    pub inference_us_p50: f64,
    /// TEI's CPU time (user + system, /proc) per batch: above the inference time when TEI's
    /// matrix products use more than one core.
    pub tei_cpu_us_per_batch: f64,
    /// TEI's CPU time over the summed inference time of its batches: about how many cores a
    /// forward pass kept busy (1 for a single thread, up to nproc).
    pub tei_cpu_per_inference: f64,
    pub load_1m: f64,
}

/// What TEI's queue did: the largest batch formed, and how batches fill with callers.
#[derive(Debug, Serialize)]
pub struct QueueFinding {
    pub max_batch_seen: usize,
    pub summary: String,
}
