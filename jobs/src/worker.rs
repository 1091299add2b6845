//! One worker of an EmbeddingJob: plans the whole job, takes its share of the shards, skips those
//! whose part exists, does the rest in order, and reports progress after each.

use std::fmt;
use std::time::Instant;

use crate::embed::PoolClient;
use crate::output::existing::finished_part;
use crate::output::part_path;
use crate::plan::JobPlan;
use crate::progress::{ProgressSink, ShardDone, WorkerProgress};
use crate::settings::{Fields, InputFormat};
use crate::shard::ShardRunner;
use crate::store::Store;
use crate::{Error, Result};

/// What the job's flags say about the work, beyond where it is read, written and sent.
#[derive(Debug, Clone)]
pub struct JobSettings {
    pub format: InputFormat,
    pub fields: Fields,
    /// This worker's index (the Indexed Job's completion index), below `workers`.
    pub worker: u32,
    pub workers: u32,
    /// JSONL shard size.
    pub shard_bytes: u64,
    pub rows_per_call: usize,
    pub calls_in_flight: usize,
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            format: InputFormat::Jsonl,
            fields: Fields::default(),
            worker: 0,
            workers: 1,
            shard_bytes: 8 << 20,
            rows_per_call: 512,
            calls_in_flight: 4,
        }
    }
}

/// A worker, ready to run.
#[derive(Debug)]
pub struct Worker {
    settings: JobSettings,
    input: Store,
    output: Store,
    pool: PoolClient,
}

/// What a run did, for the closing line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub worker: u32,
    pub workers: u32,
    /// Shards assigned to this worker (all now done).
    pub shards: u32,
    /// Of those, found done by an earlier run.
    pub resumed: u32,
    /// Rows over all its shards, and of those, rows with an error.
    pub rows: u64,
    pub failed: u64,
    /// Rows embedded by this run (not resumed), and how long the run took.
    pub rows_this_run: u64,
    pub seconds: f64,
}

impl Summary {
    pub fn rows_per_second(&self) -> f64 {
        if self.seconds > 0.0 { self.rows_this_run as f64 / self.seconds } else { 0.0 }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "worker {}/{}: {} shards ({} already done), {} rows, {} failed, {:.0} rows/s",
            self.worker,
            self.workers,
            self.shards,
            self.resumed,
            self.rows,
            self.failed,
            self.rows_per_second()
        )
    }
}

impl Worker {
    pub fn new(settings: JobSettings, input: Store, output: Store, pool: PoolClient) -> Result<Self> {
        if settings.workers == 0 {
            return Err(Error::flag("workers", "must be at least 1"));
        }
        if settings.worker >= settings.workers {
            let reason = format!("{} is not below --workers {}", settings.worker, settings.workers);
            return Err(Error::flag("worker", reason));
        }
        if settings.rows_per_call == 0 {
            return Err(Error::flag("rows-per-call", "must be at least 1"));
        }
        if settings.calls_in_flight == 0 {
            return Err(Error::flag("calls-in-flight", "must be at least 1"));
        }
        Ok(Self { settings, input, output, pool })
    }

    /// Does this worker's shards. Returns once all are done; the first shard that fails ends the
    /// run (the parts already written stay, so a rerun resumes after them).
    pub async fn run(&self, progress_sink: &impl ProgressSink) -> Result<Summary> {
        let started = Instant::now();
        let settings = &self.settings;
        let plan = JobPlan::make(&self.input, settings.format, &settings.fields, settings.shard_bytes).await?;
        let assigned: Vec<_> = plan.for_worker(settings.worker, settings.workers).collect();
        let assigned_count = u32::try_from(assigned.len()).unwrap_or(u32::MAX);
        let mut progress = WorkerProgress::start(settings.worker, settings.workers, plan.summary(), assigned_count);
        tracing::info!(
            shards = plan.shards.len() as u64,
            assigned = assigned.len() as u64,
            worker = settings.worker,
            workers = settings.workers,
            "planned"
        );
        progress_sink.report(&progress).await?;

        let runner = ShardRunner {
            input: &self.input,
            output: &self.output,
            pool: &self.pool,
            fields: &settings.fields,
            rows_per_call: settings.rows_per_call,
            calls_in_flight: settings.calls_in_flight,
        };
        // Learnt from the first answer (or the flag) only when a shard needs embedding, so a
        // worker whose shards are all done never calls the pool.
        let mut dimensions = self.pool.settings().options.dimensions.map(|d| d as usize);
        let (mut resumed, mut rows_this_run) = (0u32, 0u64);
        for shard in assigned {
            let shard_started = Instant::now();
            let path = part_path(self.output.root(), shard.number);
            let (counts, was_done) = match finished_part(&self.output, &path, &shard.source(&self.input)).await? {
                Some(counts) => (counts, true),
                None => {
                    let known = match dimensions {
                        Some(known) => known,
                        None => *dimensions.insert(self.pool.probe_dimensions().await?),
                    };
                    (runner.run(shard, known).await?, false)
                }
            };
            let seconds = if was_done { 0.0 } else { shard_started.elapsed().as_secs_f64() };
            let done = ShardDone {
                shard: shard.number,
                rows: counts.rows,
                failed: counts.failed,
                bytes: shard.bytes(),
                seconds,
            };
            if was_done {
                resumed += 1;
            } else {
                rows_this_run += counts.rows;
            }
            progress.record(done, started.elapsed().as_secs_f64());
            tracing::info!(
                shard = shard.number,
                rows = counts.rows,
                failed = counts.failed,
                resumed = was_done,
                seconds,
                done = progress.shards_done,
                of = progress.shards_assigned,
                "shard done"
            );
            progress_sink.report(&progress).await?;
        }
        Ok(Summary {
            worker: settings.worker,
            workers: settings.workers,
            shards: progress.shards_assigned,
            resumed,
            rows: progress.rows,
            failed: progress.failed,
            rows_this_run,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}
