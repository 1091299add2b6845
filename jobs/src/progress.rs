//! What a worker reports as it goes: the plan, and each shard it finishes. A sink takes the
//! worker's running totals after each shard; the file sink is here, and a ConfigMap sink (the
//! operator's view of a job) is one more [`ProgressSink`] implementation.

use std::future::Future;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The whole job's plan, the same for every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub shards: u32,
    /// Input bytes over all shards.
    pub bytes: u64,
    /// Known for Parquet input (from the footers); JSONL rows are counted as shards finish.
    pub rows: Option<u64>,
}

/// One finished shard.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardDone {
    pub shard: u32,
    /// Output rows (one per input row).
    pub rows: u64,
    /// Rows whose `error` is set.
    pub failed: u64,
    /// Input bytes the shard covered.
    pub bytes: u64,
    /// How long the shard took; zero when it was found done (resumed).
    pub seconds: f64,
}

/// One worker's progress: its share of the plan and what it has finished so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerProgress {
    pub worker: u32,
    pub workers: u32,
    pub plan: Plan,
    /// Shards this worker is assigned.
    pub shards_assigned: u32,
    /// Of those, finished (including those found done from an earlier run).
    pub shards_done: u32,
    /// Totals over the finished shards.
    pub rows: u64,
    pub failed: u64,
    pub bytes: u64,
    /// Seconds since this run of the worker started.
    pub seconds: f64,
    /// The shard finished last.
    pub last: Option<ShardDone>,
    /// Whether every assigned shard is done.
    pub finished: bool,
}

impl WorkerProgress {
    /// A worker's progress before any shard.
    pub fn start(worker: u32, workers: u32, plan: Plan, shards_assigned: u32) -> Self {
        Self {
            worker,
            workers,
            plan,
            shards_assigned,
            shards_done: 0,
            rows: 0,
            failed: 0,
            bytes: 0,
            seconds: 0.0,
            last: None,
            finished: shards_assigned == 0,
        }
    }

    /// Adds a finished shard to the totals.
    pub fn record(&mut self, done: ShardDone, seconds_since_start: f64) {
        self.shards_done += 1;
        self.rows += done.rows;
        self.failed += done.failed;
        self.bytes += done.bytes;
        self.seconds = seconds_since_start;
        self.last = Some(done);
        self.finished = self.shards_done >= self.shards_assigned;
    }
}

/// Where progress goes. Called after the plan is made and after every finished shard; a failing
/// sink fails the run (a job whose progress cannot be seen should say so, not run blind).
pub trait ProgressSink: Sync {
    fn report(&self, progress: &WorkerProgress) -> impl Future<Output = Result<()>> + Send;
}

/// No sink: progress goes only to the logs.
impl ProgressSink for () {
    async fn report(&self, _progress: &WorkerProgress) -> Result<()> {
        Ok(())
    }
}

/// An optional sink (the binary's `--progress-file`).
impl<S: ProgressSink> ProgressSink for Option<S> {
    async fn report(&self, progress: &WorkerProgress) -> Result<()> {
        match self {
            Some(sink) => sink.report(progress).await,
            None => Ok(()),
        }
    }
}

/// Writes the worker's progress as one JSON document to a file, replaced whole each time (written
/// beside it, then renamed), so a reader never sees half of one.
#[derive(Debug, Clone)]
pub struct FileSink {
    path: PathBuf,
}

impl FileSink {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }
}

impl ProgressSink for FileSink {
    async fn report(&self, progress: &WorkerProgress) -> Result<()> {
        let error = |source| Error::Progress { path: self.path.clone(), source };
        let json = serde_json::to_vec_pretty(progress).map_err(|e| error(e.into()))?;
        let path = self.path.clone();
        let written = tokio::task::spawn_blocking(move || {
            let mut staging = path.clone().into_os_string();
            staging.push(".tmp");
            std::fs::write(&staging, json)?;
            std::fs::rename(&staging, &path)
        })
        .await;
        written.map_err(std::io::Error::other).and_then(|result| result).map_err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keys_are_camel_case() {
        let done = ShardDone { shard: 3, rows: 10, failed: 1, bytes: 100, seconds: 0.5 };
        let json = serde_json::to_value(done).unwrap();
        assert_eq!(json, serde_json::json!({"shard": 3, "rows": 10, "failed": 1, "bytes": 100, "seconds": 0.5}));
        let plan = serde_json::to_value(Plan { shards: 2, bytes: 5, rows: None }).unwrap();
        assert_eq!(plan, serde_json::json!({"shards": 2, "bytes": 5, "rows": null}));
    }

    #[test]
    fn totals_add_up_and_finish_with_the_last_shard() {
        let mut progress = WorkerProgress::start(1, 2, Plan { shards: 4, bytes: 40, rows: None }, 2);
        assert!(!progress.finished);
        progress.record(ShardDone { shard: 1, rows: 5, failed: 1, bytes: 10, seconds: 1.0 }, 1.0);
        assert!(!progress.finished);
        progress.record(ShardDone { shard: 3, rows: 7, failed: 0, bytes: 10, seconds: 2.0 }, 3.0);
        assert!(progress.finished);
        assert_eq!((progress.shards_done, progress.rows, progress.failed, progress.bytes), (2, 12, 1, 20));
        assert_eq!(progress.last.map(|last| last.shard), Some(3));
        let json = serde_json::to_value(&progress).unwrap();
        assert_eq!(json["shardsAssigned"], 2);
        assert_eq!(json["last"]["shard"], 3);
    }

    #[tokio::test]
    async fn the_file_sink_replaces_the_file_whole() {
        let directory = std::env::temp_dir().join(format!("teifleet-job-progress-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("progress.json");
        let sink = FileSink::new(&path);
        let mut progress = WorkerProgress::start(0, 1, Plan { shards: 1, bytes: 1, rows: Some(3) }, 1);
        sink.report(&progress).await.unwrap();
        progress.record(ShardDone { shard: 0, rows: 3, failed: 0, bytes: 1, seconds: 0.1 }, 0.1);
        sink.report(&progress).await.unwrap();
        let read: WorkerProgress = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(read, progress);
        assert_eq!(std::fs::read_dir(&directory).unwrap().count(), 1, "no staging file left behind");
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
