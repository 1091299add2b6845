//! One worker of an EmbeddingJob: plans the whole job, takes its share of the shards, skips those
//! whose part exists, does the rest in order, and reports progress after each.

use std::fmt;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::embed::PoolClient;
use crate::embed::sizing::{DEFAULT_MAX_MESSAGE_BYTES, MIN_MAX_MESSAGE_BYTES};
use crate::openai_batch::{self, BatchClient};
use crate::output::existing::finished_part;
use crate::output::part_path;
use crate::output::writer::PartCounts;
use crate::plan::{JobPlan, Shard};
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
    /// The largest gRPC message the pool takes and sends: calls are cut to fit it both ways.
    pub max_message_bytes: u64,
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
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
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
    /// The pool's HTTP port, for openai-batch input.
    batch: Option<BatchClient>,
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
    /// Rows embedded by this run (not resumed), the EmbedArrow calls it made for them (retries
    /// and split halves included), and how long it took.
    pub rows_this_run: u64,
    pub calls: u64,
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
            "worker {}/{}: {} shards ({} already done), {} rows, {} failed, {} calls, {:.0} rows/s",
            self.worker,
            self.workers,
            self.shards,
            self.resumed,
            self.rows,
            self.failed,
            self.calls,
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
        if settings.max_message_bytes < MIN_MAX_MESSAGE_BYTES {
            let reason = format!("{} is below the least taken, {MIN_MAX_MESSAGE_BYTES}", settings.max_message_bytes);
            return Err(Error::flag("max-message-bytes", reason));
        }
        Ok(Self { settings, input, output, pool, batch: None })
    }

    /// The client of the pool's HTTP port, which openai-batch input is sent through.
    pub fn with_batch_client(mut self, batch: BatchClient) -> Self {
        self.batch = Some(batch);
        self
    }

    /// Does this worker's shards. Returns once all are done; the first shard that fails ends the
    /// run (the parts already written stay, so a rerun resumes after them).
    pub async fn run(&self, progress_sink: &impl ProgressSink) -> Result<Summary> {
        self.run_until(progress_sink, &CancellationToken::new()).await
    }

    /// [`Worker::run`] until `stop` is cancelled (SIGTERM): then the shard in progress is dropped
    /// while its calls are out, or finished and recorded if it is already being written (so a
    /// part on the store is always in the progress too), and no further shard is begun.
    pub async fn run_until(&self, progress_sink: &impl ProgressSink, stop: &CancellationToken) -> Result<Summary> {
        let started = Instant::now();
        let settings = &self.settings;
        if settings.format == InputFormat::OpenaiBatch && self.batch.is_none() {
            return Err(Error::flag("pool-http-url", "needed (with --model) for --input-format=openai-batch"));
        }
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
            max_message_bytes: settings.max_message_bytes,
        };
        let calls_before = self.calls();
        // Learnt from the first answer (or the flag) only when a shard needs embedding, so a
        // worker whose shards are all done never calls the pool.
        let mut dimensions = self.pool.settings().options.dimensions.map(|d| d as usize);
        let (mut resumed, mut rows_this_run) = (0u32, 0u64);
        for shard in assigned {
            if stop.is_cancelled() {
                return Err(Error::Stopped { shard: shard.number });
            }
            let shard_started = Instant::now();
            let (counts, was_done) = match self.finished(shard).await? {
                Some(counts) => (counts, true),
                None if settings.format == InputFormat::OpenaiBatch => {
                    let batch = self.batch.as_ref().expect("checked above");
                    let calls_in_flight = settings.calls_in_flight;
                    (
                        openai_batch::run_shard(&self.input, &self.output, shard, batch, calls_in_flight, stop).await?,
                        false,
                    )
                }
                None => {
                    let known = match dimensions {
                        Some(known) => known,
                        None => *dimensions.insert(self.pool.probe_dimensions().await?),
                    };
                    (runner.run(shard, known, stop).await?, false)
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
            calls: self.calls() - calls_before,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// The counts of a shard an earlier run finished, read from its output; `None` when it is
    /// to be done.
    async fn finished(&self, shard: &Shard) -> Result<Option<PartCounts>> {
        if self.settings.format == InputFormat::OpenaiBatch {
            return openai_batch::finished_shard(&self.input, &self.output, shard).await;
        }
        let path = part_path(self.output.root(), shard.number);
        finished_part(&self.output, &path, &shard.source(&self.input)).await
    }

    /// Calls made to the pool, on either path.
    fn calls(&self) -> u64 {
        self.pool.calls() + self.batch.as_ref().map_or(0, BatchClient::calls)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use arrow_array::{ArrayRef, StringArray};
    use arrow_schema::DataType;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{ObjectStore, ObjectStoreExt as _};

    use super::*;
    use crate::input::RowText;
    use crate::output::columns::assemble;
    use crate::output::part_schema;
    use crate::output::writer::PartWriter;
    use crate::settings::{Dtype, PoolSettings};

    const LINES: usize = 40;

    /// A worker over in-memory stores whose pool cannot be reached: any shard it does not skip
    /// fails within a second.
    async fn worker(input: &Store, output: &Store) -> Worker {
        let pool =
            PoolSettings { retry_budget: Duration::from_millis(300), ..PoolSettings::new("http://127.0.0.1:9", "bge") };
        let settings = JobSettings { shard_bytes: 200, ..JobSettings::default() };
        Worker::new(settings, input.clone(), output.clone(), PoolClient::new(pool).unwrap()).unwrap()
    }

    async fn stores() -> (Store, Store) {
        let input_objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let corpus: String = (0..LINES).map(|i| format!("{{\"id\": {i}, \"text\": \"row {i}\"}}\n")).collect();
        input_objects.put(&Path::from("in/corpus.jsonl"), corpus.into_bytes().into()).await.unwrap();
        let input = Store::new(input_objects, Path::from("in"), true, "s3://in/");
        let output = Store::new(Arc::new(InMemory::new()), Path::from("out"), true, "s3://out/");
        (input, output)
    }

    /// Writes a part for `shard` of one failed row per `rows`, from `source`.
    async fn write_part(output: &Store, shard: u32, rows: usize, source: &str) {
        let schema = part_schema(&DataType::Utf8, Dtype::F32, 4);
        let ids: ArrayRef = Arc::new(StringArray::from(vec![Some("x"); rows]));
        let texts = vec![RowText::Failed("written earlier".into()); rows];
        let batch = assemble(&schema, Dtype::F32, 4, ids, &texts, None).unwrap();
        let path = part_path(output.root(), shard);
        let mut writer = PartWriter::new(schema, output.url_of(&path)).unwrap();
        writer.write(&batch).unwrap();
        writer.finish(output, &path, source).await.unwrap();
    }

    #[tokio::test]
    async fn shards_whose_parts_exist_are_skipped_with_their_counts() {
        let (input, output) = stores().await;
        let plan = JobPlan::make(&input, InputFormat::Jsonl, &Fields::default(), 200).await.unwrap();
        assert!(plan.shards.len() > 3, "{} shards", plan.shards.len());
        for shard in &plan.shards {
            write_part(&output, shard.number, shard.number as usize + 1, &shard.source(&input)).await;
        }
        let summary = worker(&input, &output).await.run(&()).await.expect("no shard needs the pool");
        let shards = plan.shards.len() as u32;
        assert_eq!((summary.shards, summary.resumed, summary.rows_this_run), (shards, shards, 0));
        let rows: u64 = (1..=u64::from(shards)).sum();
        assert_eq!((summary.rows, summary.failed), (rows, rows), "the counts come from the parts' footers");
    }

    #[tokio::test]
    async fn a_missing_or_unreadable_part_is_redone() {
        let (input, output) = stores().await;
        let plan = JobPlan::make(&input, InputFormat::Jsonl, &Fields::default(), 200).await.unwrap();
        for shard in &plan.shards[1..] {
            write_part(&output, shard.number, 1, &shard.source(&input)).await;
        }
        // Shard 0 has no part: the worker goes to the pool for it (and fails: it is unreachable).
        let error = worker(&input, &output).await.run(&()).await.unwrap_err().to_string();
        assert!(error.starts_with("pool bge: "), "{error}");

        let garbage = part_path(output.root(), 0);
        output.objects().put(&garbage, b"not parquet".to_vec().into()).await.unwrap();
        let error = worker(&input, &output).await.run(&()).await.unwrap_err().to_string();
        assert!(error.starts_with("pool bge: "), "an unreadable part is redone, not trusted: {error}");
    }

    #[tokio::test]
    async fn a_part_from_other_input_stops_the_run() {
        let (input, output) = stores().await;
        write_part(&output, 0, 1, "s3://elsewhere/corpus.jsonl#bytes=0-200").await;
        let error = worker(&input, &output).await.run(&()).await.unwrap_err().to_string();
        assert_eq!(
            error,
            "s3://out/out/part-000000.parquet was written from s3://elsewhere/corpus.jsonl#bytes=0-200, \
             not s3://in/in/corpus.jsonl#bytes=0-200: write this job to an empty --output"
        );
    }

    #[tokio::test]
    async fn openai_batch_shards_whose_output_exists_are_skipped_with_their_counts() {
        use crate::openai_batch::BatchSettings;
        use crate::openai_batch::output::{errors_path, output_path};
        let (input, output) = stores().await;
        let batch_worker = |input: &Store, output: &Store| {
            let settings = JobSettings { format: InputFormat::OpenaiBatch, shard_bytes: 200, ..JobSettings::default() };
            let pool = PoolClient::new(PoolSettings::new("http://127.0.0.1:9", "bge")).unwrap();
            Worker::new(settings, input.clone(), output.clone(), pool).unwrap()
        };
        let error = batch_worker(&input, &output).run(&()).await.unwrap_err().to_string();
        assert_eq!(error, "--pool-http-url: needed (with --model) for --input-format=openai-batch");

        let plan = JobPlan::make(&input, InputFormat::OpenaiBatch, &Fields::default(), 200).await.unwrap();
        for shard in &plan.shards {
            let errors = "{}\n".repeat(shard.number as usize % 2);
            output.objects().put(&errors_path(output.root(), shard.number), errors.into_bytes().into()).await.unwrap();
            output.objects().put(&output_path(output.root(), shard.number), b"".to_vec().into()).await.unwrap();
        }
        let client = BatchClient::new(BatchSettings::new("http://127.0.0.1:9", "bge")).unwrap();
        let summary = batch_worker(&input, &output).with_batch_client(client).run(&()).await.expect("nothing sent");
        let shards = plan.shards.len() as u32;
        assert_eq!((summary.shards, summary.resumed, summary.calls), (shards, shards, 0));
        assert_eq!(summary.rows, LINES as u64, "rows are the input's lines");
        assert_eq!(summary.failed, u64::from(shards / 2), "failed rows are the errors files' lines");
    }

    #[test]
    fn flags_out_of_range_are_refused() {
        let settings = |worker, workers| JobSettings { worker, workers, ..JobSettings::default() };
        let store = Store::new(Arc::new(InMemory::new()), Path::from("x"), true, "s3://x/");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _entered = runtime.enter();
        let pool = || PoolClient::new(PoolSettings::new("http://127.0.0.1:9", "bge")).unwrap();
        let refused = |settings| Worker::new(settings, store.clone(), store.clone(), pool()).unwrap_err().to_string();
        assert_eq!(refused(settings(2, 2)), "--worker: 2 is not below --workers 2");
        assert_eq!(refused(settings(0, 0)), "--workers: must be at least 1");
        assert_eq!(
            refused(JobSettings { rows_per_call: 0, ..JobSettings::default() }),
            "--rows-per-call: must be at least 1"
        );
        assert_eq!(
            refused(JobSettings { max_message_bytes: 1000, ..JobSettings::default() }),
            "--max-message-bytes: 1000 is below the least taken, 262144"
        );
    }
}
