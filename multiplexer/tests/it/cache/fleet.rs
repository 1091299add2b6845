//! The cache tests' harness: the multiplexer binary as its own process, its pools (and their
//! `cache:` blocks, the contract under test) in a `--config` YAML file; the TEI simulator on
//! loopback as TEI, whose counters say what TEI did; calls that return the answer with its
//! `x-teifleet-cache` header; the admin port's metrics.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;
use teifleet_proto::v1;
use teifleet_tei_sim::SimHandle;
use teifleet_testkit::process::ChildGuard;
use teifleet_wire::headers::POOL;
use tonic::transport::Channel;

use crate::support::{channel, metric_sum};

/// The answer header naming what the cache did.
pub const CACHE_HEADER: &str = "x-teifleet-cache";
/// The default pool's name in every test.
pub const POOL_NAME: &str = "a";

/// One pool of a configuration.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub name: String,
    pub upstream: SocketAddr,
    /// The `cache:` block's lines (indented under it), or no cache.
    pub cache: Option<Cache>,
    /// Tenants listed (so they get metric series and the tenant label).
    pub tenants: Vec<String>,
}

/// A pool's `cache:` block.
#[derive(Clone, Debug, Default)]
pub struct Cache {
    /// `size`, as written (`1Mi`); none: the default.
    pub size: Option<String>,
    pub shared_across_tenants: bool,
    pub store: Option<Store>,
}

/// A `cache.store:` block.
#[derive(Clone, Debug)]
pub struct Store {
    pub url: String,
    /// `timeout`: the longest allowed (1s) in tests, so that a busy 2-core machine does not make a
    /// store that is up look down (the default 5ms is the product's choice for a pod beside its
    /// store).
    pub timeout: String,
    /// Written to a file named by `passwordFile`; none: no password.
    pub password: Option<String>,
    /// The process's peer key (`--peer-key-file`), which seals the store's entries; none: unsealed.
    pub peer_key: Option<String>,
}

impl Store {
    pub fn at(url: String) -> Self {
        Self { url, timeout: "1s".into(), password: None, peer_key: None }
    }
}

impl PoolConfig {
    /// Pool `name` in front of `sim` with a cache of `size`.
    pub fn cached(name: &str, sim: &SimHandle, size: &str) -> Self {
        Self {
            name: name.into(),
            upstream: sim.addr(),
            cache: Some(Cache { size: Some(size.into()), ..Cache::default() }),
            tenants: Vec::new(),
        }
    }

    pub fn with_store(mut self, store: Store) -> Self {
        self.cache.get_or_insert_with(Cache::default).store = Some(store);
        self
    }

    fn yaml(&self, dir: &std::path::Path) -> String {
        let mut out = format!(
            "- name: {}\n  upstream: http://{}\n  maxInFlight: 32\n  maxQueued: 2048\n  queueTimeout: 30s\n",
            self.name, self.upstream
        );
        if !self.tenants.is_empty() {
            let weights: Vec<String> = self.tenants.iter().map(|t| format!("{t}: 1")).collect();
            out.push_str(&format!("  tenants: {{{}}}\n", weights.join(", ")));
        }
        if let Some(cache) = &self.cache {
            out.push_str("  cache:\n");
            if let Some(size) = &cache.size {
                out.push_str(&format!("    size: {size}\n"));
            }
            out.push_str(&format!("    sharedAcrossTenants: {}\n", cache.shared_across_tenants));
            if let Some(store) = &cache.store {
                out.push_str(&format!("    store:\n      url: {}\n      timeout: {}\n", store.url, store.timeout));
                if let Some(password) = &store.password {
                    let file = dir.join(format!("{}-store-password", self.name));
                    std::fs::write(&file, password).unwrap();
                    out.push_str(&format!("      passwordFile: {}\n", file.display()));
                }
            }
        }
        out
    }
}

/// A multiplexer process with its ports.
pub struct Replica {
    guard: ChildGuard,
    dir: PathBuf,
    pub admin: SocketAddr,
    pub http: SocketAddr,
    /// A key to call with when the replica checks keys.
    probe_key: Option<String>,
    channel: Channel,
}

/// A directory of its own for each replica of the test process.
fn scratch() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("teifleet-cache-it-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Replica {
    /// The binary with `pools` (the first the default), API keys `keys` (tenant, key) if any,
    /// started and its cache in use for every cached pool.
    pub async fn start(pools: &[PoolConfig], keys: &[(&str, &str)]) -> Self {
        Self::start_with(pools, keys, &[]).await
    }

    /// The same, with the binary's flags `extra` beside the harness's own.
    pub async fn start_with(pools: &[PoolConfig], keys: &[(&str, &str)], extra: &[&str]) -> Self {
        let dir = scratch();
        let mut config = String::new();
        if !keys.is_empty() {
            let lines: Vec<String> = keys.iter().map(|(tenant, key)| format!("{tenant}: {key}\n")).collect();
            std::fs::write(dir.join("keys.yaml"), lines.concat()).unwrap();
            config.push_str("auth: {keysFile: keys.yaml}\n");
        }
        config.push_str("pools:\n");
        for pool in pools {
            config.push_str(&pool.yaml(&dir));
        }
        let path = dir.join("pools.yaml");
        std::fs::write(&path, &config).unwrap();

        let mut command = Command::new(env!("CARGO_BIN_EXE_teifleet-multiplexer"));
        command.arg("file").arg("--config").arg(&path);
        let peer_key = pools.iter().find_map(|p| p.cache.as_ref()?.store.as_ref()?.peer_key.clone());
        if let Some(peer_key) = peer_key {
            let file = dir.join("peer-key");
            std::fs::write(&file, peer_key).unwrap();
            command.arg("--peer-key-file").arg(file);
        }
        command
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
            .args(["--log-format", "json", "--drain-delay", "0s"])
            .args(extra)
            .env("RUST_BACKTRACE", "1")
            .env_remove("TEIFLEET_CACHE_STORE_PASSWORD")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut guard = ChildGuard::spawn("teifleet-multiplexer", command).expect("the binary starts");
        let log = dir.join("multiplexer.log");
        let mut lines = BufReader::new(guard.child_mut().stderr.take().unwrap()).lines();
        let mut seen = Vec::new();
        let serving = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!("the multiplexer exited before serving, with {config}\nlogged:\n{}", seen.join("\n"))
            };
            seen.push(line.clone());
            if line.contains("multiplexer serving") {
                break line;
            }
        };
        // Kept in a file (for a failing test's reader), and drained so the process never blocks.
        std::fs::write(&log, seen.join("\n") + "\n").unwrap();
        let keep = log.clone();
        std::thread::spawn(move || {
            use std::io::Write as _;
            let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(keep) else { return };
            for line in lines.map_while(Result::ok) {
                if line.contains("panicked") {
                    eprintln!("a panic in the multiplexer: {line}");
                }
                let _ = writeln!(file, "{line}");
            }
        });
        let serving: Value = serde_json::from_str(&serving).expect("JSON logs");
        let addr = |key: &str| serving[key].as_str().and_then(|a| a.parse().ok()).expect("an address");
        let grpc = addr("grpc_addr");
        let replica = Self {
            admin: addr("admin_addr"),
            http: addr("http_addr"),
            probe_key: keys.first().map(|(_, key)| (*key).to_owned()),
            channel: channel(grpc).await,
            guard,
            dir,
        };
        for pool in pools.iter().filter(|p| p.cache.is_some()) {
            replica.wait_for_cache(&pool.name).await;
        }
        replica
    }

    /// Waits until `pool`'s cache is in use (it is bypassed until the sidecar has read TEI's
    /// Info): a probe text, its own to this replica, is asked until it comes back a hit.
    async fn wait_for_cache(&self, pool: &str) {
        let probe = format!("cache probe of {} for {pool}", self.dir.display());
        let request = v1::EmbedRequest { inputs: probe, ..Default::default() };
        let key = self.probe_key.clone();
        teifleet_testkit::poll::eventually("the cache in use", Duration::from_secs(30), || {
            let call = self.embed_as(pool, key.as_deref(), request.clone());
            async move { call.await.ok().filter(|(_, cache)| cache.as_deref() == Some("hit")) }
        })
        .await;
    }

    pub fn alive(&mut self) -> bool {
        self.guard.exit_status().is_none()
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A tei.v1 Embed to the default pool: the answer and its `x-teifleet-cache`.
    pub async fn embed(&self, request: v1::EmbedRequest) -> Result<(v1::EmbedResponse, Option<String>), tonic::Status> {
        self.embed_as(POOL_NAME, None, request).await
    }

    /// A tei.v1 Embed to `pool` with API key `key` if given.
    pub async fn embed_as(
        &self,
        pool: &str,
        key: Option<&str>,
        request: v1::EmbedRequest,
    ) -> Result<(v1::EmbedResponse, Option<String>), tonic::Status> {
        let mut request = tonic::Request::new(request);
        request.metadata_mut().insert(POOL, pool.parse().unwrap());
        if let Some(key) = key {
            request.metadata_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
        }
        let answer = v1::embed_client::EmbedClient::new(self.channel()).embed(request).await?;
        let cache = header(answer.metadata());
        Ok((answer.into_inner(), cache))
    }

    /// The Prometheus text of the admin port.
    pub async fn metrics(&self) -> String {
        teifleet_testkit::http::get(self.admin, "/metrics").await.expect("the admin port serves /metrics")
    }

    /// The sum of `name`'s series carrying `labels`.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_sum(&self.metrics().await, name, labels)
    }

    /// `teifleet_cache_inputs_total` of the default pool with `result`.
    pub async fn inputs(&self, result: &str) -> f64 {
        self.metric("teifleet_cache_inputs_total", &[("pool", POOL_NAME), ("result", result)]).await
    }

    /// `teifleet_cache_local_bytes` of the default pool.
    pub async fn local_bytes(&self) -> f64 {
        self.metric("teifleet_cache_local_bytes", &[("pool", POOL_NAME)]).await
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.guard.kill();
        if !std::thread::panicking() {
            std::fs::remove_dir_all(&self.dir).ok();
        } else {
            eprintln!("the multiplexer's log and config are kept in {}", self.dir.display());
        }
    }
}

/// The `x-teifleet-cache` value in gRPC metadata.
pub fn header(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    metadata.get(CACHE_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// TEI's work: inference calls (and stream messages) the simulator admitted, refused ones after
/// admission (an empty input, one too long) included.
pub fn work(sim: &SimHandle) -> u64 {
    sim.stats().requests_admitted
}

/// Parses a Kubernetes-style quantity in bytes (`64Mi`, `256Ki`, `1000`).
pub fn bytes(size: &str) -> f64 {
    let units = [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)];
    for (suffix, unit) in units {
        if let Some(n) = size.strip_suffix(suffix) {
            return (n.parse::<u64>().unwrap() * unit) as f64;
        }
    }
    size.parse::<u64>().unwrap() as f64
}

/// One HTTP request with `headers` on its own connection: status, the cache header, the body.
pub async fn http(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Option<String>, Value) {
    let answer = crate::http_front::request(addr, "POST", path, headers, body.to_string().as_bytes()).await;
    let cache = answer.header(CACHE_HEADER).map(str::to_owned);
    (answer.status, cache, answer.body)
}

/// The f32 vector in a JSON array.
pub fn vector(value: &Value) -> Vec<f32> {
    value.as_array().unwrap_or_else(|| panic!("a vector: {value}")).iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Texts of `words` words each, distinct by `tag` and index.
pub fn texts(tag: &str, n: usize, words: usize) -> Vec<String> {
    const WORDS: [&str; 8] = ["harbor", "lantern", "meadow", "quartz", "ripple", "saddle", "thimble", "violet"];
    (0..n)
        .map(|i| {
            let mut text = format!("{tag} {i}");
            for w in 1..words {
                text.push(' ');
                text.push_str(WORDS[(i * 31 + w * 7) % WORDS.len()]);
            }
            text
        })
        .collect()
}
