//! What the embedding-job tests run against: a TEI simulator and a multiplexer in front of it,
//! both real gRPC servers on 127.0.0.1 (as multiplexer/tests/it/support sets them up), and files
//! in a scratch directory.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use teifleet_job::embed::PoolClient;
use teifleet_job::settings::PoolSettings;
use teifleet_job::store::{S3Settings, Store, StoreRole};
use teifleet_job::worker::{JobSettings, Worker};
use teifleet_multiplexer::admission::Limits;
use teifleet_multiplexer::forward::pools::{PoolSpec, PoolTable};
use teifleet_multiplexer::report::metrics::Metrics;
use teifleet_multiplexer::run::server::{self, Running, Settings};
use teifleet_proto::v1::{self, embed_client::EmbedClient};
use teifleet_tei_sim::{SimConfig, SimHandle};

pub const POOL: &str = "pool-a";
pub const MODEL: &str = "teifleet/sim-embedding";

/// A simulator, configured on top of the defaults.
pub async fn sim(configure: impl FnOnce(&mut SimConfig)) -> SimHandle {
    let mut config = SimConfig::default();
    configure(&mut config);
    teifleet_tei_sim::start(config).await.expect("simulator starts")
}

/// A multiplexer serving one pool, `POOL`, in front of `upstream`, on gRPC and (for the
/// openai-batch tests) on HTTP.
pub async fn mux(upstream: SocketAddr) -> Running {
    let spec = PoolSpec {
        name: POOL.into(),
        model: Some(MODEL.into()),
        upstream: format!("http://{upstream}"),
        limits: Some(Limits::new(64, 1024, Duration::from_secs(30))),
        remote: false,
        coalesce: false,
        cache: None,
        tenants: Default::default(),
    };
    let metrics = Metrics::new();
    let table = Arc::new(PoolTable::new(POOL, metrics.clone()));
    table.sync(vec![spec]).expect("pool valid");
    let settings = Settings {
        health_interval: Duration::from_millis(100),
        http_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        ..Settings::default()
    };
    server::start(settings, table, metrics).await.expect("multiplexer starts")
}

/// A simulator and a multiplexer in front of it.
pub struct Pool {
    pub sim: SimHandle,
    pub mux: Running,
}

impl Pool {
    pub async fn start(configure: impl FnOnce(&mut SimConfig)) -> Self {
        let sim = sim(configure).await;
        let mux = mux(sim.addr()).await;
        Self { sim, mux }
    }

    pub fn settings(&self) -> PoolSettings {
        PoolSettings::new(format!("http://{}", self.mux.grpc_addr), POOL)
    }

    /// `http://host:port` of the multiplexer's HTTP port (TEI's and OpenAI's routes).
    #[allow(dead_code)] // only the openai-batch tests call the HTTP port
    pub fn http_url(&self) -> String {
        format!("http://{}", self.mux.http_addr.expect("the HTTP front listens"))
    }

    /// What tei.v1's Embed answers for `text` through the multiplexer (normalized, as the job
    /// asks by default).
    pub async fn tei_embed(&self, text: &str) -> Vec<f32> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.mux.grpc_addr))
            .unwrap()
            .connect()
            .await
            .expect("connects");
        let mut request =
            tonic::Request::new(v1::EmbedRequest { inputs: text.into(), normalize: Some(true), ..Default::default() });
        request.metadata_mut().insert(teifleet_wire::headers::POOL, POOL.parse().unwrap());
        EmbedClient::new(channel).embed(request).await.expect("Embed answers").into_inner().embeddings
    }
}

/// A worker reading `input` and writing `output` (file:// URLs), sending to `pool`.
pub fn worker(settings: JobSettings, pool: PoolSettings, input: &str, output: &str) -> Worker {
    let input = Store::open(StoreRole::Input, input, &S3Settings::default()).expect("input opens");
    let output = Store::open(StoreRole::Output, output, &S3Settings::default()).expect("output opens");
    Worker::new(settings, input, output, PoolClient::new(pool).expect("pool client")).expect("valid worker")
}

/// A scratch directory of its own for a test, emptied first.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("teifleet-job-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.0.join(relative)
    }

    /// `file://` URL of a path in it; directories end in `/`.
    pub fn url(&self, relative: &str) -> String {
        format!("file://{}", self.path(relative).display())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The part files in `directory`, by name (staging files and anything else left out).
pub fn parts(directory: &Path) -> Vec<PathBuf> {
    let mut parts: Vec<PathBuf> = match std::fs::read_dir(directory) {
        Ok(entries) => entries
            .map(|entry| entry.unwrap().path())
            .filter(|path| {
                let name = path.file_name().unwrap().to_string_lossy();
                name.starts_with("part-") && name.ends_with(".parquet")
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    parts.sort();
    parts
}

/// Every batch of a Parquet file.
pub fn read_parquet(path: &Path) -> Vec<RecordBatch> {
    let file = std::fs::File::open(path).unwrap();
    ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap().map(Result::unwrap).collect()
}
