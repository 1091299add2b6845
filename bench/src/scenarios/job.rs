//! Scenario 20, job (issue 33: an embedding job's throughput through a pool): a pool of 3 replicas
//! as scenario 18 starts them (each a simulated GPU behind its own multiplexer in static mode,
//! naming the others with `--sibling`, the same `--peer-key-file`), and the real `teifleet-job run`
//! binary as the job's workers: a generated JSONL corpus (distinct ids, 16-word texts) read from a
//! file, Parquet parts written to a directory, EmbedArrow calls on the `ingest` lane, worker *w* of
//! 3 dialing replica *w*'s multiplexer (as a Service spreads pods' connections) whose sidecar spreads
//! each call's sub-batches over the pool.
//!
//! First the pool's capacity C: balanced closed-loop unary Embeds over the 3 replicas (scenario
//! 18's reference). Then three runs:
//!
//! 1. the job alone: rows ÷ the seconds from the workers' start to the last one's exit, against C;
//!    the output read back (every id exactly once, with a vector);
//! 2. open-loop Poisson queries (unary Embeds, 1 s deadline, no lane header) at 0.5 C over the
//!    replicas alone, then the same schedule beside the job (started a margin earlier, stopped once
//!    the queries are answered): their p99 beside ÷ alone; the job's rows/s meanwhile (the
//!    simulators' completed count over the schedule, less the queries answered OK), and what
//!    replica 1's sidecar learned of its TEI's batches and the places it left the job
//!    (`scenarios::learned`), as info;
//! 3. the job again into an empty directory, worker 0 killed (SIGKILL) at 40% of run 1's time and
//!    restarted at once with the same flags (an Indexed Job's replacement pod): every id exactly
//!    once, and the rows the simulators embedded beyond those written (less each worker start's
//!    one-text dimension probe) at most one shard's rows per killed worker; time lost = those rows
//!    ÷ run 1's rows/s.
//!
//! **Why these numbers.** The backend is scenario 2's GPU-like model with batches of 32 and a
//! 10 ms fixed cost (20 ms + 20 µs/token and batches of 8 serve 1,000 texts/s over 3 replicas,
//! 1,000 s for a million rows): 10 ms + 32 × 16 × 20 µs ≈ 20 ms a batch of 32, about 1,580
//! texts/s a replica, 4,700 over the pool (4,000 to 4,100 measured: the sleeping device's
//! millisecond ticks round each batch up); each replica lets in two batches (maxInFlight 64), so
//! TEI always has the next batch ready. The devices sleep, so the capacity is theirs, not the 2
//! cores': at that rate the sidecars and simulators spend under a core (scenario 5's ~63 µs per
//! call each), which leaves the job's worker and the load generator room. A million rows then take
//! about 4 minutes per job run (the full scenario about 9), 100,000 (quick) about 25 s. Shards are 4 MiB
//! (full) or 512 KiB (quick): about 40,000 or 5,000 rows, 8 to 9 shards per worker, so a kill
//! lands mid-shard and a shard is a small part of the job.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use arrow_array::{Array as _, StringArray};
use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};
use tokio::time::Instant;

use super::adaptive::require_flag;
use super::learned::{Learned, during};
use super::overload::DEADLINE;
use super::setup::sibling_pool;
use super::{Context, Measurement, Scenario, gpu_model, measure, words};
use crate::admin::{self, SimStats};
use crate::procs::{self, Device, JobWorker, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target, ratio};
use crate::{Error, Result};

/// Replicas of the pool.
pub const REPLICAS: usize = 3;
/// The job's workers (`--workers`), worker w to replica w's multiplexer.
pub const WORKERS: u32 = 3;
/// Words per text.
pub const TOKENS: usize = 16;
/// The simulators' vector length (scenario 18's, a small model's): a million rows' vectors are
/// 1.5 GB of f32 in the Parquet parts.
pub const DIMENSIONS: usize = 384;
/// The job's rows/s, at least this × the pool's capacity.
pub const RATE_LIMIT: f64 = 0.9;
/// The queries' rate beside the job, × capacity.
pub const QUERY_FACTOR: f64 = 0.5;
/// The queries' p99 beside the job, at most this × alone.
pub const P99_LIMIT: f64 = 1.3;
/// Rows embedded twice after a kill, at most this many shards' rows per killed worker.
pub const REDONE_LIMIT: f64 = 1.0;
/// `--rows-per-call` and `--calls-in-flight`: the worker's defaults, said explicitly.
pub const ROWS_PER_CALL: usize = 512;
pub const CALLS_IN_FLIGHT: usize = 4;
/// Requests per TEI batch.
pub const BATCH: usize = 32;
/// Closed-loop callers of the capacity load per replica: two shares each.
const CAPACITY_CALLERS_PER_REPLICA: usize = 128;
const CAPACITY_CONNECTIONS_PER_REPLICA: usize = 2;
const QUERY_CONNECTIONS: usize = 6;
const QUERY_SEED: u64 = 200;
/// The job starts this long before the queries, so they meet it at its steady state.
pub const JOB_MARGIN: Duration = Duration::from_secs(2);
/// Run 3's kill, as a share of run 1's time.
pub const KILL_AT: f64 = 0.4;
/// The job's rows/s beside the queries, at least this × capacity. The replicas run with the
/// default query reserve, learned from TEI's batch times: this backend's batch time grows with the
/// batch (10 ms fixed, 10 ms more for a full one), so batches the job fills make every query wait
/// longer, and the reserve keeps what the queries' p99 needs. A fixed `--query-reserve` measured
/// quick before it (the queries' p99 beside the job ÷ alone, the job's rows/s beside them ÷
/// capacity): 0 1.63× and 0.48×; 25% 1.32–1.33× and 0.37×; 33% 1.24× and 0.31×; 40% 1.20× and 0.28×.
pub const BESIDE_RATE_LIMIT: f64 = 0.4;
/// The pool's name in static mode (`--pool`'s default).
const POOL: &str = "default";

/// `--shard-bytes`: about 5,000 rows (quick) or 40,000 (full), 8 or 9 shards per worker.
fn shard_bytes(ctx: &Context) -> u64 {
    ctx.pick(512 << 10, 4 << 20)
}

/// The backend: scenario 2's GPU-like model with batches of 32 and a 10 ms fixed cost.
pub fn backend() -> SimModel {
    SimModel {
        max_batch_requests: Some(BATCH),
        fixed_latency: Duration::from_millis(10),
        ..gpu_model(512, Device::Sleep)
    }
}

/// Every replica's limits: two batches in flight and a queue of eight batches for the queries
/// (scenario 2's shape). The job's calls carry no deadline, so their sub-batches are the patient
/// kind of ingest, queued however full the queue is and never refused for load: each worker keeps
/// 4 EmbedArrow calls in flight, each a window of sub-batches over the pool (`forward/bulk.rs`),
/// about 900 inputs a replica at once. Before the worker stopped sending a deadline, each
/// sub-batch was held to the 500 ms queue timeout like a query, one refused failed its whole
/// 512-row call, and the worker sent all 512 rows again: measured quick with a queue of 256,
/// 186,000 rows embedded for 100,000 written, the job at 0.54× capacity.
pub fn limits() -> MuxLimits {
    MuxLimits {
        max_in_flight: 2 * BATCH,
        max_queued: 8 * BATCH,
        queue_timeout: Duration::from_millis(500),
        max_concurrent_streams: 1024,
        coalesce: false,
    }
}

/// What the output directory holds, read back from its Parquet parts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputCheck {
    pub parts: u64,
    /// Rows over every part.
    pub rows: u64,
    /// Ids of the corpus found exactly once, with a vector.
    pub once: u64,
    /// Ids of the corpus not found at all.
    pub missing: u64,
    /// Rows beyond the first of an id found more than once.
    pub repeated: u64,
    /// Rows whose id is not one of the corpus's.
    pub foreign: u64,
    /// Rows carrying an error instead of a vector.
    pub failed: u64,
    /// The most rows in one part: one shard's rows.
    pub largest_part: u64,
    /// Why the parts could not be read, if they could not.
    pub unreadable: Option<String>,
}

impl OutputCheck {
    /// Ids not written exactly once with a vector, plus rows that should not be there.
    pub fn wrong(&self) -> u64 {
        self.missing + self.repeated + self.foreign + self.failed + u64::from(self.unreadable.is_some())
    }

    /// The tally of `ids` (each row's id as written, and whether it failed) against a corpus of
    /// ids `0..rows`.
    fn tally(rows: u64, found: impl IntoIterator<Item = (Option<String>, bool)>) -> Self {
        // Per id of the corpus: its rows, and whether any of them failed.
        let mut seen = vec![(0u32, false); rows as usize];
        let mut check = Self::default();
        for (id, failed) in found {
            check.rows += 1;
            check.failed += u64::from(failed);
            match id.and_then(|id| id.parse::<usize>().ok()).and_then(|i| seen.get_mut(i)) {
                Some(entry) => *entry = (entry.0 + 1, entry.1 || failed),
                None => check.foreign += 1,
            }
        }
        check.missing = seen.iter().filter(|(n, _)| *n == 0).count() as u64;
        check.repeated = seen.iter().map(|(n, _)| u64::from(n.saturating_sub(1))).sum();
        check.once = seen.iter().filter(|&&(n, failed)| n == 1 && !failed).count() as u64;
        check
    }
}

/// One run of the job to its end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRun {
    /// From the first worker's start to the last one's exit.
    pub seconds: f64,
    /// Each worker process's last log line (its summary, or why it failed), restarts included.
    pub workers: Vec<String>,
    /// Worker processes started (each embeds one probe text to learn the vectors' length).
    pub starts: u32,
    /// Workers killed mid-job, and when.
    pub kills: u32,
    pub killed_at_s: Option<f64>,
    /// Each replica's simulator over the run (counters reset before it), replica 1 first.
    pub sims: Vec<SimStats>,
    pub output: OutputCheck,
}

impl JobRun {
    /// Rows written once with a vector, per second of the job.
    pub fn rows_per_s(&self) -> f64 {
        ratio(self.output.once as f64, self.seconds)
    }

    /// Rows the simulators embedded, the workers' probes included.
    pub fn embedded(&self) -> u64 {
        self.sims.iter().map(|s| s.completed).sum()
    }

    /// Rows embedded beyond the ones written and the probes: work a killed worker lost.
    pub fn redone(&self) -> u64 {
        self.embedded().saturating_sub(self.output.rows + u64::from(self.starts))
    }
}

/// Queries beside the job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Beside {
    pub queries: Report,
    /// From the queries' start to their last answer.
    pub seconds: f64,
    /// Rows the simulators completed meanwhile, queries answered OK excluded.
    pub job_rows: f64,
    /// What replica 1's sidecar learned of its TEI's batches and how it let the job in, meanwhile.
    #[serde(default)]
    pub learned: Learned,
}

impl Beside {
    pub fn job_rows_per_s(&self) -> f64 {
        ratio(self.job_rows, self.seconds)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub replicas: usize,
    pub workers: u32,
    /// Rows of the corpus, and its size.
    pub rows: u64,
    pub corpus_bytes: u64,
    pub shard_bytes: u64,
    pub rows_per_call: usize,
    pub calls_in_flight: usize,
    /// The pool's capacity: balanced closed-loop unary load over the replicas.
    pub capacity: Report,
    pub capacity_callers: usize,
    /// Run 1.
    pub alone: JobRun,
    /// Run 2: the queries alone, then beside the job.
    pub queries_alone: Report,
    pub beside: Beside,
    /// Run 3.
    pub killed: JobRun,
}

const RATE: &str = "job alone: rows/s ÷ the pool's capacity";
const ALONE_WRONG: &str = "job alone: ids not written exactly once with a vector";
const P99: &str = "query p99 beside the job ÷ alone, queries at 0.5× capacity";
const BESIDE_RATE: &str = "job beside queries at 0.5× capacity: rows/s ÷ capacity";
const KILLED_WRONG: &str = "worker killed and restarted: ids not written exactly once with a vector";
const REDONE: &str = "worker killed and restarted: rows embedded twice ÷ one shard's rows per kill";

impl Job {
    pub fn capacity_rps(&self) -> f64 {
        self.capacity.goodput_rps
    }

    pub fn rate_ratio(&self) -> f64 {
        ratio(self.alone.rows_per_s(), self.capacity_rps())
    }

    pub fn p99_ratio(&self) -> f64 {
        ratio(self.beside.queries.latency.p99_ms, self.queries_alone.latency.p99_ms)
    }

    pub fn beside_rate_ratio(&self) -> f64 {
        ratio(self.beside.job_rows_per_s(), self.capacity_rps())
    }

    /// By replica 1's learned line, how many times the batch the queries fill alone a batch must
    /// take for the job to get [`BESIDE_RATE_LIMIT`] × capacity beside them: the least the
    /// queries' latency grows for that share, however the places are handed out. Each batch holds
    /// what arrives while the one before runs (TEI's first-come batches), so at `rate` inputs a
    /// second a replica's batches settle at `rate × T(b) = b`, `T` the line; both lanes together
    /// need the larger `b`. `None` without a learned line, infinite where no batch of at most
    /// [`BATCH`] carries both.
    pub fn least_batch_ratio(&self) -> Option<f64> {
        let (fixed, per_input) = (self.beside.learned.fixed_ms? / 1e3, self.beside.learned.per_input_ms? / 1e3);
        let per_replica = self.capacity_rps() / REPLICAS as f64;
        let settles_at = |rate: f64| match rate * per_input < 1.0 {
            true => Some(rate * fixed / (1.0 - rate * per_input)).filter(|b| *b <= BATCH as f64),
            false => None,
        };
        let time = |inputs: f64| fixed + per_input * inputs;
        let alone = settles_at(QUERY_FACTOR * per_replica)?;
        Some(match settles_at((QUERY_FACTOR + BESIDE_RATE_LIMIT) * per_replica) {
            Some(both) => ratio(time(both), time(alone)),
            None => f64::INFINITY,
        })
    }

    /// One shard's rows: run 1's largest part.
    pub fn shard_rows(&self) -> u64 {
        self.alone.output.largest_part.max(self.killed.output.largest_part)
    }

    /// [`Self::least_batch_ratio`] in words, for the notes of the two targets it joins.
    fn least_batch_text(&self) -> String {
        match self.least_batch_ratio() {
            Some(least) => format!(
                "By replica 1's learned line ({}), a job at {BESIDE_RATE_LIMIT}× capacity beside these queries needs \
                 batches {least:.2}× as long as theirs alone: their latency grows about that much for that share \
                 whatever admits them, so the two targets at once hold only where that is within {P99_LIMIT}×",
                self.beside.learned.line_text()
            ),
            None => "No batch-time line was learned (replica 1's metrics).".to_owned(),
        }
    }

    /// Run 3's rows embedded twice, in shards per killed worker (NaN without a kill).
    pub fn redone_shards(&self) -> f64 {
        if self.killed.kills == 0 {
            return f64::NAN;
        }
        ratio(self.killed.redone() as f64, self.shard_rows() as f64 * f64::from(self.killed.kills))
    }

    /// Run 3's time lost: its redone rows at run 1's pace.
    pub fn seconds_lost(&self) -> f64 {
        ratio(self.killed.redone() as f64, self.alone.rows_per_s())
    }
}

impl Measurement for Job {
    const KEY: &'static str = "job";
    const TITLE: &'static str =
        "Embedding job: a million rows through a pool of 3, beside queries, and a worker killed";

    async fn run(ctx: &Context) -> Result<Self> {
        require_flag(&ctx.bins, "--peer-key-file", " (no peer key for spills)")?;
        require_flag(&ctx.bins, "--ingest-share", " (no lanes)")?;
        let program = procs::job_program(&ctx.bins, &ctx.repo_root)?;
        let (backend, limits) = (backend(), limits());
        let rows = ctx.pick(100_000u64, 1_000_000);
        let shard_bytes = shard_bytes(ctx);
        let dir = ctx.bins.logs.join("job");
        let _ = std::fs::remove_dir_all(&dir);
        create_dir(&dir)?;
        // The workers take file:// URLs, which name absolute paths.
        let dir = std::fs::canonicalize(&dir).map_err(|source| Error::File { what: "reading", path: dir, source })?;
        let corpus = dir.join("corpus.jsonl");
        ctx.say(&format!("job: writing a corpus of {rows} rows"));
        let corpus_bytes = write_corpus(&corpus, rows)?;
        let result = measure_job(ctx, &program, &dir, &corpus, rows).await;
        let _ = std::fs::remove_dir_all(&dir);
        let (capacity, capacity_callers, alone, queries_alone, beside, killed) = result?;
        Ok(Job {
            backend,
            limits,
            replicas: REPLICAS,
            workers: WORKERS,
            rows,
            corpus_bytes,
            shard_bytes,
            rows_per_call: ROWS_PER_CALL,
            calls_in_flight: CALLS_IN_FLIGHT,
            capacity,
            capacity_callers,
            alone,
            queries_alone,
            beside,
            killed,
        })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Job.label();
        let per_replica =
            |run: &JobRun| run.sims.iter().map(|s| s.completed.to_string()).collect::<Vec<_>>().join(" / ");
        let wrong = |run: &JobRun| {
            let o = &run.output;
            format!(
                "{} parts, {} rows: {} ids once with a vector, {} missing, {} repeated rows, {} foreign ids, {} \
                 failed rows{}; the workers said: {}",
                o.parts,
                o.rows,
                o.once,
                o.missing,
                o.repeated,
                o.foreign,
                o.failed,
                o.unreadable.as_ref().map(|u| format!(", unreadable: {u}")).unwrap_or_default(),
                run.workers.join(" | ")
            )
        };
        vec![
            Target::at_least(&scenario, RATE, self.rate_ratio(), RATE_LIMIT, "×").note_if_not_passed(format!(
                "the job wrote {:.0} rows/s against the pool's {:.0} texts/s; the replicas' TEIs completed {} rows \
                 (replica 1 first) in {:.1} s. The workers must keep every replica's share full: {} calls of {} rows \
                 in flight per worker, each spread by its sidecar over the siblings with room, and a worker between \
                 shards (reading the next, writing the last part) leaves the pool to the others",
                self.alone.rows_per_s(),
                self.capacity_rps(),
                per_replica(&self.alone),
                self.alone.seconds,
                self.calls_in_flight,
                self.rows_per_call
            )),
            Target::at_most(&scenario, ALONE_WRONG, self.alone.output.wrong() as f64, 0.0, "ids")
                .note_if_not_passed(wrong(&self.alone)),
            Target::at_most(&scenario, P99, self.p99_ratio(), P99_LIMIT, "×").note_if_not_passed(format!(
                "the queries' p99 was {:.1} ms beside the job and {:.1} ms alone (p50 {:.1} and {:.1} ms; TEI's queue \
                 p99 {:.1} and {:.1} ms); {} of {} queries answered OK ({}), {:.0}/s, {:.3} of the capacity, while \
                 the job got {:.0} rows/s. A query beside the job waits for the rest of TEI's running batch and \
                 then its own, both filled by the job: alone, the same queries ride batches about half as full, and \
                 this backend's batch time grows with the batch ({} ms fixed, {} µs a token). Ingest waits for the \
                 last quarter of each batch before it fills the next (`admission/ingest_gate.rs`) and leaves the \
                 places of TEI's next batch its learned batch-time curve keeps for queries \
                 (`admission/batch_curve.rs`, its TARGET): a query over the TEI queue p99 either arrived after \
                 the places were taken or found the next batch full; a lower TARGET shortens the batches beside \
                 queries, at that cost in the job's rows/s. {}",
                self.beside.queries.latency.p99_ms,
                self.queries_alone.latency.p99_ms,
                self.beside.queries.latency.p50_ms,
                self.queries_alone.latency.p50_ms,
                self.beside.queries.tei_queue.map_or(f64::NAN, |s| s.p99_ms),
                self.queries_alone.tei_queue.map_or(f64::NAN, |s| s.p99_ms),
                self.beside.queries.ok,
                self.beside.queries.sent,
                teifleet_load::render::codes(&self.beside.queries),
                self.beside.queries.goodput_rps,
                ratio(self.beside.queries.goodput_rps, self.capacity_rps()),
                self.beside.job_rows_per_s(),
                backend().fixed_latency.as_millis(),
                backend().per_token_latency.as_micros(),
                self.least_batch_text(),
            )),
            Target::at_least(&scenario, BESIDE_RATE, self.beside_rate_ratio(), BESIDE_RATE_LIMIT, "×")
                .note_if_not_passed(format!(
                    "the job got {:.0} rows/s beside the queries ({:.0}/s answered OK) against the pool's {:.0} \
                     texts/s: the learned reserve kept more of each batch for queries than they took, or the \
                     job's sub-batches did not fit the places left (`admission/ingest_gate.rs`). {}",
                    self.beside.job_rows_per_s(),
                    self.beside.queries.goodput_rps,
                    self.capacity_rps(),
                    self.least_batch_text(),
                )),
            Target::at_most(&scenario, KILLED_WRONG, self.killed.output.wrong() as f64, 0.0, "ids")
                .note_if_not_passed(wrong(&self.killed)),
            Target::at_most(&scenario, REDONE, self.redone_shards(), REDONE_LIMIT, "shards").note_if_not_passed(
                if self.killed.kills == 0 {
                    "no worker was killed: worker 0 had exited before the kill".to_owned()
                } else {
                    format!(
                        "the simulators embedded {} rows for {} written and {} probes: {} redone against a shard of {} \
                         rows; a restarted worker should redo only the shard its predecessor was on",
                        self.killed.embedded(),
                        self.killed.output.rows,
                        self.killed.starts,
                        self.killed.redone(),
                        self.shard_rows()
                    )
                },
            ),
            Target::info(
                &scenario,
                "pool capacity: balanced unary over the 3 replicas",
                Some(self.capacity_rps()),
                "texts/s",
            ),
            Target::info(&scenario, "job alone", Some(self.alone.rows_per_s()), "rows/s"),
            self.beside
                .learned
                .places_row(&scenario, "replica 1: the job's places in TEI's next batch beside the queries, median"),
            Target::info(
                &scenario,
                "replica 1's learned line: the least batch-time ratio (beside ÷ alone) a job at 0.4× capacity needs",
                self.least_batch_ratio(),
                "×",
            ),
            Target::info(
                &scenario,
                "query p50 beside the job ÷ alone",
                Some(ratio(self.beside.queries.latency.p50_ms, self.queries_alone.latency.p50_ms)),
                "×",
            ),
            Target::info(
                &scenario,
                "worker killed: time lost (redone rows ÷ rows/s alone)",
                Some(self.seconds_lost()),
                "s",
            ),
            Target::info(&scenario, "worker killed: the job's rows/s", Some(self.killed.rows_per_s()), "rows/s"),
        ]
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Job.label();
        vec![
            Target::new(&scenario, RATE, None, Rule::AtLeast, RATE_LIMIT, "×"),
            Target::new(&scenario, ALONE_WRONG, None, Rule::AtMost, 0.0, "ids"),
            Target::new(&scenario, P99, None, Rule::AtMost, P99_LIMIT, "×"),
            Target::new(&scenario, BESIDE_RATE, None, Rule::AtLeast, BESIDE_RATE_LIMIT, "×"),
            Target::new(&scenario, KILLED_WRONG, None, Rule::AtMost, 0.0, "ids"),
            Target::new(&scenario, REDONE, None, Rule::AtMost, REDONE_LIMIT, "shards"),
        ]
    }
}

type Measured = (Report, usize, JobRun, Report, Beside, JobRun);

/// The pool, its capacity and the three runs.
async fn measure_job(ctx: &Context, program: &Path, dir: &Path, corpus: &Path, rows: u64) -> Result<Measured> {
    let key = procs::write_peer_key(&ctx.bins, "job")?;
    let sim_extra = [format!("--dimensions={DIMENSIONS}")];
    let mux_extra = [format!("--peer-key-file={}", key.display())];
    ctx.say(&format!("job: starting {REPLICAS} replicas with siblings"));
    let (sims, muxes) = sibling_pool(ctx, "job", REPLICAS, &backend(), &sim_extra, &limits(), &mux_extra).await?;
    let urls: Vec<String> = muxes.iter().map(Proc::url).collect();

    let (capacity, capacity_callers) = pool_capacity(ctx, "job", &urls).await?;
    let c = capacity.goodput_rps;
    ctx.say(&format!("job: capacity {c:.0} texts/s"));
    let job = JobFlags { program, corpus, urls: &urls, shard_bytes: shard_bytes(ctx) };

    ctx.say(&format!("job: run 1, {WORKERS} workers, {rows} rows, alone"));
    let alone = job_run(ctx, &job, &sims, &dir.join("out-alone"), rows, None).await?;
    ctx.say(&format!("job: {:.0} rows/s alone ({:.3}× capacity)", alone.rows_per_s(), ratio(alone.rows_per_s(), c)));

    let seconds = ctx.pick(Duration::from_secs(5), Duration::from_secs(15));
    let rate = QUERY_FACTOR * c;
    ctx.say(&format!("job: run 2, queries at {rate:.0}/s alone"));
    let queries_alone = measure(queries(&urls, rate, seconds)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    ctx.say("job: the same queries beside the job");
    let beside = beside(ctx, &job, &sims, muxes[0].admin_addr(), &dir.join("out-beside"), &urls, rate, seconds).await?;
    ctx.say(&format!(
        "job: query p99 {:.1} ms alone, {:.1} ms beside the job; the job {:.0} rows/s; replica 1: {}",
        queries_alone.latency.p99_ms,
        beside.queries.latency.p99_ms,
        beside.job_rows_per_s(),
        beside.learned.text()
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;

    let kill_at = Duration::from_secs_f64(KILL_AT * alone.seconds);
    ctx.say(&format!("job: run 3, worker 0 killed at {:.1} s and restarted", kill_at.as_secs_f64()));
    let killed = job_run(ctx, &job, &sims, &dir.join("out-killed"), rows, Some(kill_at)).await?;
    ctx.say(&format!("job: {} rows redone, {} ids wrong", killed.redone(), killed.output.wrong()));
    Ok((capacity, capacity_callers, alone, queries_alone, beside, killed))
}

/// The pool's capacity C: balanced closed-loop unary Embeds of the job's texts over the replicas
/// (`urls`, replica 1 first), two shares of callers each; with the callers it took.
pub async fn pool_capacity(ctx: &Context, scenario: &str, urls: &[String]) -> Result<(Report, usize)> {
    let capacity_callers = CAPACITY_CALLERS_PER_REPLICA * urls.len();
    ctx.say(&format!("{scenario}: the pool's capacity, {capacity_callers} closed-loop callers over the replicas"));
    let capacity = measure(LoadConfig {
        more_targets: urls[1..].to_vec(),
        connections: CAPACITY_CONNECTIONS_PER_REPLICA * urls.len(),
        duration: Duration::from_secs(ctx.pick(5, 10)),
        inputs: words(TOKENS),
        grace: Duration::from_secs(10),
        ..LoadConfig::closed(urls[0].clone(), capacity_callers, 100_000_000)
    })
    .await?;
    Ok((capacity, capacity_callers))
}

/// What every worker of a run is started with, but its output and index.
struct JobFlags<'a> {
    program: &'a Path,
    corpus: &'a Path,
    urls: &'a [String],
    shard_bytes: u64,
}

impl JobFlags<'_> {
    fn args(&self, worker: u32, out: &Path) -> Vec<String> {
        vec![
            format!("--pool-url={}", self.urls[worker as usize % self.urls.len()]),
            format!("--pool={POOL}"),
            format!("--input=file://{}", self.corpus.display()),
            "--input-format=jsonl".into(),
            format!("--output=file://{}/", out.display()),
            format!("--worker={worker}"),
            format!("--workers={WORKERS}"),
            format!("--shard-bytes={}", self.shard_bytes),
            format!("--rows-per-call={ROWS_PER_CALL}"),
            format!("--calls-in-flight={CALLS_IN_FLIGHT}"),
            "--lane=ingest".into(),
        ]
    }

    fn start(&self, ctx: &Context, worker: u32, out: &Path, name: &str) -> Result<JobWorker> {
        procs::start_job_worker(&ctx.bins, name, self.program, &self.args(worker, out))
    }

    fn start_all(&self, ctx: &Context, out: &Path, run: &str) -> Result<Vec<JobWorker>> {
        (0..WORKERS).map(|w| self.start(ctx, w, out, &format!("job-{run}-w{w}"))).collect()
    }
}

/// The job to its end into `out` (emptied first), with every simulator's counters reset before;
/// with `kill_at`, worker 0 is killed then and restarted at once.
async fn job_run(
    ctx: &Context,
    job: &JobFlags<'_>,
    sims: &[Proc],
    out: &Path,
    rows: u64,
    kill_at: Option<Duration>,
) -> Result<JobRun> {
    let _ = std::fs::remove_dir_all(out);
    create_dir(out)?;
    for sim in sims {
        admin::reset_sim_stats(sim.admin_addr()).await;
    }
    let run = out.file_name().and_then(|n| n.to_str()).unwrap_or("run").trim_start_matches("out-").to_owned();
    let started = Instant::now();
    let mut workers = job.start_all(ctx, out, &run)?;
    let mut starts = WORKERS;
    let (mut kills, mut killed_at_s) = (0, None);
    let mut lines = Vec::new();
    if let Some(kill_at) = kill_at {
        tokio::time::sleep_until(started + kill_at).await;
        if workers[0].exit_status().is_none() {
            workers[0].kill();
            killed_at_s = Some(started.elapsed().as_secs_f64());
            kills = 1;
            ctx.say(&format!("job: worker 0 (pid {}) killed; restarting it", workers[0].pid()));
            lines.push(format!("killed: {}", workers[0].last_line()));
            workers[0] = job.start(ctx, 0, out, &format!("job-{run}-w0-restarted"))?;
            starts += 1;
        }
    }
    for worker in &mut workers {
        worker.exited().await;
    }
    let seconds = started.elapsed().as_secs_f64();
    lines.extend(workers.iter().map(JobWorker::last_line));
    let mut stats = Vec::with_capacity(sims.len());
    for sim in sims {
        let read = admin::sim_stats(sim.admin_addr()).await;
        stats.push(read.ok_or_else(|| Error::Process("the simulator's /stats did not answer".into()))?);
    }
    let output = tokio::task::block_in_place(|| read_output(out, rows));
    let _ = std::fs::remove_dir_all(out);
    Ok(JobRun { seconds, workers: lines, starts, kills, killed_at_s, sims: stats, output })
}

/// Open-loop Poisson queries over the replicas, 1 s deadline, no lane header.
fn queries(urls: &[String], rate: f64, duration: Duration) -> LoadConfig {
    LoadConfig {
        more_targets: urls[1..].to_vec(),
        connections: QUERY_CONNECTIONS,
        deadline: Some(DEADLINE),
        grace: Duration::from_secs(3),
        inputs: words(TOKENS),
        seed: QUERY_SEED,
        ..LoadConfig::open(urls[0].clone(), rate, duration)
    }
}

/// Rows the simulators completed so far.
async fn completed(sims: &[Proc]) -> Result<u64> {
    let mut sum = 0;
    for sim in sims {
        let stats = admin::sim_stats(sim.admin_addr()).await;
        sum += stats.ok_or_else(|| Error::Process("the simulator's /stats did not answer".into()))?.completed;
    }
    Ok(sum)
}

/// The queries beside the job (started [`JOB_MARGIN`] earlier, killed once they are answered),
/// with what the sidecar at `admin` learned meanwhile.
#[allow(clippy::too_many_arguments)]
async fn beside(
    ctx: &Context,
    job: &JobFlags<'_>,
    sims: &[Proc],
    admin: std::net::SocketAddr,
    out: &Path,
    urls: &[String],
    rate: f64,
    duration: Duration,
) -> Result<Beside> {
    let _ = std::fs::remove_dir_all(out);
    create_dir(out)?;
    let mut workers = job.start_all(ctx, out, "beside")?;
    tokio::time::sleep(JOB_MARGIN).await;
    let before = completed(sims).await?;
    let started = Instant::now();
    let (queries, learned) = during(admin, measure(queries(urls, rate, duration))).await;
    let seconds = started.elapsed().as_secs_f64();
    let after = completed(sims).await;
    for worker in &mut workers {
        worker.kill();
    }
    let _ = std::fs::remove_dir_all(out);
    let queries = queries?;
    let job_rows = after?.saturating_sub(before).saturating_sub(queries.ok) as f64;
    Ok(Beside { queries, seconds, job_rows, learned })
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::File { what: "creating", path: dir.to_owned(), source })
}

/// `rows` JSONL lines, `{"id":i,"text":"q<i> ..."}` with 16-word texts; returns its size.
fn write_corpus(path: &Path, rows: u64) -> Result<u64> {
    let broken = |source| Error::File { what: "writing", path: path.to_owned(), source };
    let file = std::fs::File::create(path).map_err(broken)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    for i in 0..rows {
        let text = teifleet_load::inputs::query(i as usize, TOKENS);
        let line = serde_json::json!({"id": i, "text": text});
        writeln!(out, "{line}").map_err(broken)?;
    }
    out.flush().map_err(broken)?;
    Ok(std::fs::metadata(path).map_err(broken)?.len())
}

/// Reads every `part-*.parquet` under `dir` (ids and errors only) and tallies the ids against a
/// corpus of `rows`.
fn read_output(dir: &Path, rows: u64) -> OutputCheck {
    match read_parts(dir) {
        Ok((found, sizes)) => {
            let mut check = OutputCheck::tally(rows, found);
            check.parts = sizes.len() as u64;
            check.largest_part = sizes.values().copied().max().unwrap_or(0);
            check
        }
        Err(why) => OutputCheck { unreadable: Some(why), missing: rows, ..OutputCheck::default() },
    }
}

type Found = (Vec<(Option<String>, bool)>, BTreeMap<String, u64>);

fn read_parts(dir: &Path) -> std::result::Result<Found, String> {
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("part-") && name.ends_with(".parquet"))
        .collect();
    names.sort();
    let (mut found, mut sizes) = (Vec::new(), BTreeMap::new());
    for name in names {
        let path = dir.join(&name);
        let why = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let file = std::fs::File::open(&path).map_err(|e| why(&e))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| why(&e))?;
        let fields = builder.schema().fields();
        let index = |column: &str| fields.iter().position(|f| f.name() == column);
        let (Some(id), Some(error)) = (index("id"), index("error")) else {
            return Err(why(&"no `id` or `error` column"));
        };
        let mask = ProjectionMask::roots(builder.parquet_schema(), [id, error]);
        let reader = builder.with_projection(mask).build().map_err(|e| why(&e))?;
        let mut part_rows = 0;
        for batch in reader {
            let batch = batch.map_err(|e| why(&e))?;
            let string = |column: &str| batch.column_by_name(column)?.as_any().downcast_ref::<StringArray>().cloned();
            let (Some(ids), Some(errors)) = (string("id"), string("error")) else {
                return Err(why(&"`id` or `error` is not Utf8"));
            };
            for row in 0..batch.num_rows() {
                let id = ids.is_valid(row).then(|| ids.value(row).to_owned());
                found.push((id, errors.is_valid(row)));
            }
            part_rows += batch.num_rows() as u64;
        }
        sizes.insert(name, part_rows);
    }
    Ok((found, sizes))
}

/// A result for the tests of the targets and the renderer.
#[cfg(test)]
pub(crate) mod example {
    use teifleet_load::summary::Summary;

    use super::*;

    fn stats(completed: u64) -> SimStats {
        SimStats { completed, ..SimStats::default() }
    }

    fn report(ok: u64, goodput_rps: f64, p50_ms: f64, p99_ms: f64) -> Report {
        Report {
            sent: ok,
            answered: ok,
            ok,
            ok_in_time: ok,
            goodput_rps,
            latency: Summary { p50_ms, p99_ms, ..Summary::default() },
            ..Report::default()
        }
    }

    fn output(rows: u64, missing: u64) -> OutputCheck {
        OutputCheck {
            parts: 20,
            rows: rows - missing,
            once: rows - missing,
            missing,
            largest_part: 5_000,
            ..OutputCheck::default()
        }
    }

    /// 100,000 rows, capacity 4,000/s; run 1 in `alone_s`; queries' p99 30 ms alone and
    /// `beside_p99_ms` beside; run 3 embedding `redone` rows twice.
    pub(crate) fn result(alone_s: f64, beside_p99_ms: f64, redone: u64) -> Job {
        let run = |seconds: f64, starts: u32, kills: u32, extra: u64| JobRun {
            seconds,
            workers: vec!["worker 0/3: 7 shards (0 already done), 35000 rows, 0 failed, 1400 rows/s".into()],
            starts,
            kills,
            killed_at_s: (kills > 0).then_some(10.0),
            sims: vec![stats(33_334 + u64::from(starts) + extra), stats(33_333), stats(33_333)],
            output: output(100_000, 0),
        };
        Job {
            backend: backend(),
            limits: limits(),
            replicas: 3,
            workers: 3,
            rows: 100_000,
            corpus_bytes: 10_000_000,
            shard_bytes: 512 << 10,
            rows_per_call: ROWS_PER_CALL,
            calls_in_flight: CALLS_IN_FLIGHT,
            capacity: report(20_000, 4_000.0, 40.0, 60.0),
            capacity_callers: 384,
            alone: run(alone_s, 3, 0, 0),
            queries_alone: report(10_000, 2_000.0, 25.0, 30.0),
            beside: Beside {
                queries: report(10_000, 2_000.0, 28.0, beside_p99_ms),
                seconds: 5.0,
                job_rows: 9_000.0,
                learned: Learned::default(),
            },
            killed: run(30.0, 4, 1, redone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::example::result;
    use super::*;
    use crate::targets::Verdict;

    #[test]
    fn the_least_batch_ratio_follows_the_learned_line() {
        let mut job = result(26.0, 36.0, 2_500);
        assert_eq!(job.least_batch_ratio(), None, "no line learned");
        // Capacity 4,000/s over 3 replicas: queries 667/s a replica settle in batches of 8.47
        // (12.71 ms), queries and a job at 0.4× in batches of 19.48 (16.23 ms).
        job.beside.learned.fixed_ms = Some(10.0);
        job.beside.learned.per_input_ms = Some(0.32);
        let least = job.least_batch_ratio().unwrap();
        assert!((least - 1.27706).abs() < 1e-4, "{least}");
        // A device too slow for both lanes at once.
        job.beside.learned.per_input_ms = Some(0.9);
        assert_eq!(job.least_batch_ratio(), Some(f64::INFINITY));
    }

    #[test]
    fn the_job_is_judged_against_capacity_queries_against_themselves_and_a_kill_in_shards() {
        let t = result(26.0, 36.0, 2_500).targets();
        assert_eq!(t.len(), 13);
        // 100,000 rows in 26 s against 4,000/s.
        assert!((t[0].measured.unwrap() - 100_000.0 / 26.0 / 4_000.0).abs() < 1e-9);
        assert_eq!(t[0].verdict, Verdict::Pass);
        assert_eq!((t[1].measured, t[1].verdict), (Some(0.0), Verdict::Pass));
        assert!((t[2].measured.unwrap() - 1.2).abs() < 1e-9);
        assert_eq!(t[2].verdict, Verdict::Pass);
        // 9,000 rows in the 5 s of queries: 1,800/s of 4,000.
        assert!((t[3].measured.unwrap() - 0.45).abs() < 1e-9);
        assert_eq!(t[3].verdict, Verdict::Pass);
        assert_eq!((t[4].measured, t[4].verdict), (Some(0.0), Verdict::Pass));
        // 2,500 rows redone of a 5,000-row shard, one kill.
        assert!((t[5].measured.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(t[5].verdict, Verdict::Pass);
        assert!((t[6].measured.unwrap() - 4_000.0).abs() < 1e-9);
        // 2,500 rows at 100,000 / 26 rows/s.
        assert!((t[11].measured.unwrap() - 2_500.0 * 26.0 / 100_000.0).abs() < 1e-9);
        assert_eq!(Job::planned_targets().len(), 6);
    }

    #[test]
    fn a_slow_job_a_slow_query_tail_and_a_kill_that_redoes_too_much_fail() {
        let t = result(40.0, 45.0, 6_000).targets();
        assert_eq!(t[0].verdict, Verdict::Fail);
        assert!(t[0].note.contains("2500 rows/s against the pool's 4000"), "{}", t[0].note);
        assert_eq!(t[2].verdict, Verdict::Fail);
        assert!(
            t[2].note.contains("(10 ms fixed, 20 µs a token)") && t[2].note.contains("learned batch-time curve"),
            "{}",
            t[2].note
        );
        assert_eq!(t[5].verdict, Verdict::Fail);
        assert!(t[5].note.contains("6000 redone against a shard of 5000"), "{}", t[5].note);
    }

    #[test]
    fn ids_are_tallied_once_missing_repeated_or_foreign() {
        let found = [("0", false), ("1", false), ("1", false), ("3", true), ("x", false), ("9", false)]
            .map(|(id, failed)| (Some(id.to_owned()), failed));
        let check = OutputCheck::tally(4, found.into_iter().chain([(None, true)]));
        assert_eq!((check.rows, check.failed, check.foreign), (7, 2, 3));
        // 0 and 3 once (3 failed), 1 twice, 2 missing.
        assert_eq!((check.once, check.missing, check.repeated), (1, 1, 1));
        assert_eq!(check.wrong(), 1 + 1 + 3 + 2);
    }

    #[test]
    fn the_corpus_is_one_json_object_per_line_with_distinct_ids() {
        let path = std::env::temp_dir().join(format!("teifleet-bench-job-corpus-{}", std::process::id()));
        let bytes = write_corpus(&path, 3).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(bytes, text.len() as u64);
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[2]["id"], 2);
        assert_eq!(lines[2]["text"].as_str().unwrap().split(' ').count(), TOKENS);
        std::fs::remove_file(path).unwrap();
    }
}
