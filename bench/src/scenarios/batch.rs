//! Scenario 23, batch (issue 47: OpenAI's Batch API on the pool): what a batch of 50,000
//! `/v1/embeddings` requests costs the pool. The pool is scenario 20's (3 replicas, each a
//! simulated GPU behind its own multiplexer with `--sibling`s, the same backend and limits), its
//! HTTP fronts on; the batch runs as `teifleet-batch` runs it: an EmbeddingJob of `--input-format
//! openai-batch` whose real `teifleet-job run` workers (3, worker *w* to replica *w*'s HTTP front,
//! as a Service spreads pods' connections) send each line's `body` to `/v1/embeddings` on the
//! `ingest` lane, `--calls-in-flight` at its default, and write the output and error files.
//!
//! First the pool's capacity C as scenario 20 measures it (balanced closed-loop unary Embeds of
//! the same texts); then the batch: requests ÷ the seconds from the workers' start to the last
//! one's exit, against C; the output files read back: every `custom_id` once with status 200 and
//! one 384-dimension vector.
//!
//! **What it leaves out.** The batch API's own part (the upload, the EmbeddingJob, the polling)
//! is a few calls per batch; it runs in the real-node test (`tests/e2e/tests/real_batch.rs`),
//! which needs a cluster. Here is the part that scales with the batch.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::Report;
use tokio::time::Instant;

use super::adaptive::require_flag;
use super::job::{self, DIMENSIONS, REPLICAS, TOKENS, WORKERS};
use super::setup::sibling_pool_serving_http;
use super::{Context, Measurement, Scenario};
use crate::admin::{self, SimStats};
use crate::procs::{self, JobWorker, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target, ratio};
use crate::{Error, Result};

/// The requests of the batch: the 50,000 (quick: 10,000).
pub const FULL_REQUESTS: u64 = 50_000;
pub const QUICK_REQUESTS: u64 = 10_000;
/// The batch's requests/s, at least this × the pool's capacity.
pub const RATE_LIMIT: f64 = 0.9;
/// `model` in every line, and the workers' `--model`.
pub const MODEL: &str = "BAAI/bge-small-en-v1.5";

/// What the output and error files hold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchOutput {
    /// Output files (`part-NNNNNN.jsonl`) and lines over them.
    pub parts: u64,
    pub lines: u64,
    /// Lines in the error files.
    pub errors: u64,
    /// Requests (`req-<i>`) answered exactly once, status 200, one vector of the model's size.
    pub once: u64,
    pub missing: u64,
    /// Lines beyond the first of a custom_id seen more than once.
    pub repeated: u64,
    /// Lines answered but not as wanted (another status, no vector, a foreign custom_id).
    pub malformed: u64,
    pub unreadable: Option<String>,
}

impl BatchOutput {
    pub fn wrong(&self) -> u64 {
        self.missing + self.repeated + self.malformed + self.errors + u64::from(self.unreadable.is_some())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub replicas: usize,
    pub workers: u32,
    pub requests: u64,
    pub file_bytes: u64,
    /// The pool's capacity: balanced closed-loop unary load over the replicas.
    pub capacity: Report,
    pub capacity_callers: usize,
    /// From the first worker's start to the last one's exit.
    pub seconds: f64,
    /// Each worker's last log line (its summary, or why it failed).
    pub worker_lines: Vec<String>,
    /// Each replica's simulator over the batch, replica 1 first.
    pub sims: Vec<SimStats>,
    pub output: BatchOutput,
}

const RATE: &str = "50,000-request batch: requests/s ÷ the pool's capacity";
const WRONG: &str = "batch: requests not answered exactly once with a vector";

impl Batch {
    pub fn capacity_rps(&self) -> f64 {
        self.capacity.goodput_rps
    }

    pub fn requests_per_s(&self) -> f64 {
        ratio(self.output.once as f64, self.seconds)
    }

    pub fn rate_ratio(&self) -> f64 {
        ratio(self.requests_per_s(), self.capacity_rps())
    }
}

impl Measurement for Batch {
    const KEY: &'static str = "batch";
    const TITLE: &'static str = "OpenAI batch: 50,000 /v1/embeddings requests through a pool of 3";

    async fn run(ctx: &Context) -> Result<Self> {
        require_flag(&ctx.bins, "--peer-key-file", " (no peer key for spills)")?;
        let program = procs::job_program(&ctx.bins, &ctx.repo_root)?;
        let requests = ctx.pick(QUICK_REQUESTS, FULL_REQUESTS);
        let dir = ctx.bins.logs.join("batch");
        let _ = std::fs::remove_dir_all(&dir);
        create_dir(&dir)?;
        let dir = std::fs::canonicalize(&dir).map_err(|source| Error::File { what: "reading", path: dir, source })?;
        let file = dir.join("requests.jsonl");
        let file_bytes = write_requests(&file, requests)?;
        let result = measure_batch(ctx, &program, &dir, &file, requests).await;
        let _ = std::fs::remove_dir_all(&dir);
        let (capacity, capacity_callers, seconds, worker_lines, sims, output) = result?;
        Ok(Batch {
            backend: job::backend(),
            limits: job::limits(),
            replicas: REPLICAS,
            workers: WORKERS,
            requests,
            file_bytes,
            capacity,
            capacity_callers,
            seconds,
            worker_lines,
            sims,
            output,
        })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Batch.label();
        let per_replica = self.sims.iter().map(|s| s.completed.to_string()).collect::<Vec<_>>().join(" / ");
        let o = &self.output;
        vec![
            Target::at_least(&scenario, RATE, self.rate_ratio(), RATE_LIMIT, "×").note_if_not_passed(format!(
                "the batch's {} requests took {:.1} s: {:.0}/s against the pool's {:.0} texts/s; the replicas' TEIs \
                 completed {per_replica} (replica 1 first). Each line is one HTTP call of its own: the workers keep \
                 {} lines in flight each, and every answer is a JSON array of {DIMENSIONS} floats the sidecar writes \
                 and the worker copies into the output file; the workers said: {}",
                self.requests,
                self.seconds,
                self.requests_per_s(),
                self.capacity_rps(),
                teifleet_job::cli::BATCH_LINES_IN_FLIGHT,
                self.worker_lines.join(" | ")
            )),
            Target::at_most(&scenario, WRONG, o.wrong() as f64, 0.0, "requests").note_if_not_passed(format!(
                "{} output files, {} lines: {} answered once, {} missing, {} repeated, {} malformed, {} in the error \
                 files{}; the workers said: {}",
                o.parts,
                o.lines,
                o.once,
                o.missing,
                o.repeated,
                o.malformed,
                o.errors,
                o.unreadable.as_ref().map(|u| format!(", unreadable: {u}")).unwrap_or_default(),
                self.worker_lines.join(" | ")
            )),
            Target::info(
                &scenario,
                "pool capacity: balanced unary over the 3 replicas",
                Some(self.capacity_rps()),
                "texts/s",
            ),
            Target::info(&scenario, "batch", Some(self.requests_per_s()), "requests/s"),
        ]
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Batch.label();
        vec![
            Target::new(&scenario, RATE, None, Rule::AtLeast, RATE_LIMIT, "×"),
            Target::new(&scenario, WRONG, None, Rule::AtMost, 0.0, "requests"),
        ]
    }
}

type Measured = (Report, usize, f64, Vec<String>, Vec<SimStats>, BatchOutput);

async fn measure_batch(ctx: &Context, program: &Path, dir: &Path, file: &Path, requests: u64) -> Result<Measured> {
    let key = procs::write_peer_key(&ctx.bins, "batch")?;
    let sim_extra = [format!("--dimensions={DIMENSIONS}")];
    let mux_extra = [format!("--peer-key-file={}", key.display())];
    ctx.say(&format!("batch: starting {REPLICAS} replicas with siblings and HTTP fronts"));
    let (sims, muxes, http) =
        sibling_pool_serving_http(ctx, "batch", REPLICAS, &job::backend(), &sim_extra, &job::limits(), &mux_extra)
            .await?;
    let urls: Vec<String> = muxes.iter().map(Proc::url).collect();
    let (capacity, capacity_callers) = job::pool_capacity(ctx, "batch", &urls).await?;
    ctx.say(&format!("batch: capacity {:.0} texts/s; the batch, {requests} requests", capacity.goodput_rps));
    tokio::time::sleep(Duration::from_secs(1)).await;
    for sim in &sims {
        admin::reset_sim_stats(sim.admin_addr()).await;
    }
    let out = dir.join("out");
    create_dir(&out)?;
    let started = Instant::now();
    let mut workers = (0..WORKERS)
        .map(|w| {
            let args = worker_args(file, &out, &urls, &http, w);
            procs::start_job_worker(&ctx.bins, &format!("batch-w{w}"), program, &args)
        })
        .collect::<Result<Vec<JobWorker>>>()?;
    for worker in &mut workers {
        worker.exited().await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let lines = workers.iter().map(JobWorker::last_line).collect();
    let mut stats = Vec::with_capacity(sims.len());
    for sim in &sims {
        let read = admin::sim_stats(sim.admin_addr()).await;
        stats.push(read.ok_or_else(|| Error::Process("the simulator's /stats did not answer".into()))?);
    }
    let output = tokio::task::block_in_place(|| read_output(&out, requests));
    ctx.say(&format!("batch: {:.1} s, {} requests answered once", seconds, output.once));
    Ok((capacity, capacity_callers, seconds, lines, stats, output))
}

/// Worker `w`'s flags: the product's defaults but where the run is (its files, its replica).
fn worker_args(file: &Path, out: &Path, grpc: &[String], http: &[String], w: u32) -> Vec<String> {
    let replica = w as usize % http.len();
    vec![
        format!("--pool-url={}", grpc[replica]),
        "--pool=default".into(),
        format!("--pool-http-url={}", http[replica]),
        format!("--model={MODEL}"),
        format!("--input=file://{}", file.display()),
        "--input-format=openai-batch".into(),
        format!("--output=file://{}/", out.display()),
        format!("--worker={w}"),
        format!("--workers={WORKERS}"),
        format!("--shard-bytes={}", shard_bytes(file)),
        "--lane=ingest".into(),
    ]
}

/// `--shard-bytes` as `teifleet-batch` sets it for the file's EmbeddingJob.
pub fn shard_bytes(file: &Path) -> u64 {
    let bytes = std::fs::metadata(file).map_or(0, |m| m.len());
    teifleet_batch::batches::job::shard_bytes(bytes, WORKERS as i32)
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::File { what: "creating", path: dir.to_owned(), source })
}

/// `requests` lines of OpenAI's batch format, `req-<i>` each embedding one 16-word text (the
/// capacity's texts); returns the file's size.
fn write_requests(path: &Path, requests: u64) -> Result<u64> {
    let broken = |source| Error::File { what: "writing", path: path.to_owned(), source };
    let file = std::fs::File::create(path).map_err(broken)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    for i in 0..requests {
        let input = teifleet_load::inputs::query(i as usize, TOKENS);
        let line = serde_json::json!({
            "custom_id": format!("req-{i}"),
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": input},
        });
        writeln!(out, "{line}").map_err(broken)?;
    }
    out.flush().map_err(broken)?;
    Ok(std::fs::metadata(path).map_err(broken)?.len())
}

/// The output and error files under `dir`, tallied against `req-0 .. req-<requests-1>`.
fn read_output(dir: &Path, requests: u64) -> BatchOutput {
    match tally(dir, requests) {
        Ok(output) => output,
        Err(why) => BatchOutput { unreadable: Some(why), missing: requests, ..BatchOutput::default() },
    }
}

/// One output line, as far as the tally reads it.
#[derive(Deserialize)]
struct OutputLine {
    custom_id: Option<String>,
    response: Option<Response>,
}

#[derive(Deserialize)]
struct Response {
    status_code: u16,
    body: Body,
}

#[derive(Deserialize)]
struct Body {
    data: Vec<Embedding>,
}

#[derive(Deserialize)]
struct Embedding {
    embedding: Vec<f32>,
}

fn tally(dir: &Path, requests: u64) -> std::result::Result<BatchOutput, String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("part-") && name.ends_with(".jsonl"))
        .collect();
    names.sort();
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    let mut output = BatchOutput::default();
    for name in names {
        let path = dir.join(&name);
        let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let errors_file = name.ends_with(".errors.jsonl");
        output.parts += u64::from(!errors_file);
        for line in std::io::BufReader::new(file).lines() {
            let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
            if errors_file {
                output.errors += u64::from(!line.trim().is_empty());
                continue;
            }
            output.lines += 1;
            let parsed: Option<OutputLine> = serde_json::from_str(&line).ok();
            let index = parsed.as_ref().and_then(|l| l.custom_id.as_deref()?.strip_prefix("req-")?.parse::<u64>().ok());
            let good = parsed.as_ref().and_then(|l| l.response.as_ref()).is_some_and(|r| {
                r.status_code == 200 && r.body.data.len() == 1 && r.body.data[0].embedding.len() == DIMENSIONS
            });
            match index.filter(|i| *i < requests) {
                Some(i) if good => *seen.entry(i).or_default() += 1,
                _ => output.malformed += 1,
            }
        }
    }
    output.once = seen.values().filter(|n| **n == 1).count() as u64;
    output.repeated = seen.values().map(|n| u64::from(n.saturating_sub(1))).sum();
    output.missing = requests - seen.len() as u64;
    Ok(output)
}

/// A result for the tests of the targets and the renderer.
#[cfg(test)]
pub(crate) mod example {
    use super::*;

    /// 50,000 requests in `seconds` against a capacity of 4,000/s.
    pub(crate) fn result(seconds: f64, missing: u64) -> Batch {
        Batch {
            backend: job::backend(),
            limits: job::limits(),
            replicas: 3,
            workers: 3,
            requests: 50_000,
            file_bytes: 7_000_000,
            capacity: Report { ok: 40_000, goodput_rps: 4_000.0, ..Report::default() },
            capacity_callers: 384,
            seconds,
            worker_lines: vec!["worker 0/3: 6 shards (0 already done), 16667 rows, 0 failed, 1300 rows/s".into()],
            sims: vec![SimStats { completed: 16_667, ..SimStats::default() }],
            output: BatchOutput {
                parts: 18,
                lines: 50_000 - missing,
                once: 50_000 - missing,
                missing,
                ..BatchOutput::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::example::result;
    use super::*;
    use crate::targets::Verdict;

    #[test]
    fn the_batch_is_judged_against_capacity_and_on_every_request() {
        let t = result(13.0, 0).targets();
        assert_eq!(t.len(), 4);
        assert!((t[0].measured.unwrap() - 50_000.0 / 13.0 / 4_000.0).abs() < 1e-9);
        assert_eq!((t[0].verdict, t[1].verdict), (Verdict::Pass, Verdict::Pass));
        let t = result(20.0, 3).targets();
        assert_eq!((t[0].verdict, t[1].verdict), (Verdict::Fail, Verdict::Fail));
        assert!(t[1].note.contains("3 missing"), "{}", t[1].note);
        assert_eq!(Batch::planned_targets().len(), 2);
    }

    #[test]
    fn the_tally_finds_missing_repeated_and_malformed_lines() {
        let dir = std::env::temp_dir().join(format!("teifleet-bench-batch-tally-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let vector = vec![0.5f32; DIMENSIONS];
        let ok = |id: &str| {
            serde_json::json!({"custom_id": id, "response": {"status_code": 200, "body": {"data": [{"embedding": vector}]}}})
                .to_string()
        };
        let lines = [ok("req-0"), ok("req-1"), ok("req-1"), ok("other"), "not json".to_owned()].join("\n");
        std::fs::write(dir.join("part-000000.jsonl"), lines).unwrap();
        std::fs::write(dir.join("part-000000.errors.jsonl"), "{\"custom_id\":\"req-3\"}\n").unwrap();
        let output = read_output(&dir, 4);
        assert_eq!((output.parts, output.lines, output.errors), (1, 5, 1));
        // req-0 once, req-1 twice, req-2 and req-3 missing, two malformed lines.
        assert_eq!((output.once, output.repeated, output.missing, output.malformed), (1, 1, 2, 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_requests_file_is_openais_batch_format() {
        let path = std::env::temp_dir().join(format!("teifleet-bench-batch-file-{}", std::process::id()));
        let bytes = write_requests(&path, 3).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(bytes, text.len() as u64);
        let line: serde_json::Value = serde_json::from_str(text.lines().nth(2).unwrap()).unwrap();
        assert_eq!((line["custom_id"].as_str(), line["url"].as_str()), (Some("req-2"), Some("/v1/embeddings")));
        assert_eq!(line["body"]["model"], MODEL);
        std::fs::remove_file(path).unwrap();
    }
}
