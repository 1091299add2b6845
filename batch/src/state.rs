//! The state every handler reaches: the store, the keys, the cluster, the limits and what each
//! batch's job gets.

use std::sync::Arc;
use std::time::Duration;

use teifleet_crds::job::WorkerPodOverrides;
use tokio::sync::Semaphore;

use crate::auth::Keys;
use crate::cluster::Cluster;
use crate::store::FileStore;

/// OpenAI's limits, and how many uploads run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest upload, in bytes (OpenAI's Batch API: 200 MB).
    pub max_file_bytes: u64,
    /// Most requests (non-blank lines) in one batch input file (OpenAI's: 50,000).
    pub max_requests: u64,
    /// Uploads streamed at once; one more is answered 429. Also how many batch creations read
    /// their input file at once (more wait their turn).
    pub max_uploads: usize,
    /// Longest an upload may send nothing before it is dropped: a stalled client does not keep
    /// its place (one of `max_uploads`) for ever.
    pub upload_idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_file_bytes: 200_000_000, max_requests: 50_000, max_uploads: 4, upload_idle: Duration::from_secs(60) }
    }
}

/// Where a batch's job reads its input and writes its parts: the server's own store, as a job's
/// spec names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobStore {
    /// A claim, and the directory in it the server's `--store` points at.
    Pvc { claim: String, path: String },
    /// A bucket, and the key prefix the server's `--store` points at.
    S3 { bucket: String, key: String, endpoint: String, region: String, credentials_secret: String, allow_http: bool },
}

/// What every batch's EmbeddingJob gets.
#[derive(Debug, Clone, PartialEq)]
pub struct JobDefaults {
    pub store: JobStore,
    pub workers: i32,
    /// The Secret (name, data key) holding an API key for pools with `spec.auth`: the jobs'
    /// workers call the pool with it. None: pools without keys.
    pub api_key_secret: Option<(String, String)>,
    /// The jobs' `spec.template` (`--job-template`): where their worker pods run.
    pub template: Option<WorkerPodOverrides>,
}

/// Everything a request handler reaches.
pub struct Inner {
    pub store: FileStore,
    pub keys: Keys,
    pub cluster: Arc<dyn Cluster>,
    pub limits: Limits,
    pub jobs: JobDefaults,
    /// Upload places: one per upload in progress.
    pub uploads: Arc<Semaphore>,
    /// Places for batch creations reading their input file (each holds a line buffer of up to
    /// 16 MiB and its custom ids' digests).
    pub scans: Arc<Semaphore>,
}

/// The handlers' shared state.
#[derive(Clone)]
pub struct AppState(pub Arc<Inner>);

impl AppState {
    pub fn new(store: FileStore, keys: Keys, cluster: Arc<dyn Cluster>, limits: Limits, jobs: JobDefaults) -> Self {
        let uploads = Arc::new(Semaphore::new(limits.max_uploads));
        let scans = Arc::new(Semaphore::new(limits.max_uploads));
        Self(Arc::new(Inner { store, keys, cluster, limits, jobs, uploads, scans }))
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}
