//! The processes only this scenario starts: the multiplexer in `file` mode (the cache is a pool's
//! `cache:` block in its YAML) and a Redis server (Debian's `redis-server`) for the shared tier.
//! Both are killed when dropped, as [`crate::procs`]'s are.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_testkit::http;
use teifleet_testkit::net::{free_port, loopback};
use teifleet_testkit::process::ChildGuard;

use crate::procs::{Bins, Proc};
use crate::{Error, Result};

/// The one pool every multiplexer here serves (requests without routing go to it).
pub const POOL: &str = "bench";

/// A pool's `cache:` block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheConfig {
    /// The local tier's `size` (`64Mi`; `0`: no local tier).
    pub size: String,
    /// The shared tier: `store.url` and `store.timeout`.
    pub store: Option<(String, String)>,
}

/// A pool's admission limits, as the file spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolLimits {
    pub max_in_flight: usize,
    pub max_queued: usize,
    pub queue_timeout_ms: u64,
}

/// The YAML of one pool in front of `upstream`, its cache on when `cache` is given.
pub fn pools_yaml(upstream: &str, limits: PoolLimits, cache: Option<&CacheConfig>) -> String {
    let mut yaml = format!(
        "pools:\n- name: {POOL}\n  upstream: {upstream}\n  maxInFlight: {}\n  maxQueued: {}\n  queueTimeout: {}ms\n",
        limits.max_in_flight, limits.max_queued, limits.queue_timeout_ms
    );
    if let Some(cache) = cache {
        yaml.push_str(&format!("  cache:\n    size: {}\n    ttl: 24h\n", cache.size));
        if let Some((url, timeout)) = &cache.store {
            yaml.push_str(&format!("    store:\n      url: {url}\n      timeout: {timeout}\n"));
        }
    }
    yaml
}

/// A process this scenario started: its gRPC port (Redis: its port) and admin port.
#[derive(Debug)]
pub struct Server {
    guard: ChildGuard,
    pub port: u16,
    pub admin: u16,
}

impl Server {
    pub fn url(&self) -> String {
        crate::procs::url_of(self.port)
    }

    pub fn admin_addr(&self) -> SocketAddr {
        loopback(self.admin)
    }

    pub fn pid(&self) -> u32 {
        self.guard.id()
    }

    /// SIGKILL, as a crashed node would end it.
    pub fn kill(&mut self) {
        tokio::task::block_in_place(|| self.guard.kill());
    }
}

fn log_of(bins: &Bins, name: &str) -> PathBuf {
    bins.logs.join(format!("{name}.log"))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::File { what: "writing", path: path.into(), source })
}

/// The multiplexer in `file` mode serving [`POOL`] in front of `sim`, its configuration beside
/// its log as `<name>.yaml`, with `extra` flags (`--memory-limit` for a large local tier,
/// `--peer-key-file` for replicas sharing a store).
pub async fn start_mux(
    bins: &Bins,
    name: &str,
    sim: &Proc,
    limits: PoolLimits,
    cache: Option<&CacheConfig>,
    extra: &[String],
) -> Result<Server> {
    let config = bins.logs.join(format!("{name}.yaml"));
    write(&config, &pools_yaml(&sim.url(), limits, cache))?;
    let (port, admin) = (free_port()?, free_port()?);
    let mut command = Command::new(bins.path("teifleet-multiplexer"));
    command.args([
        "file".to_owned(),
        format!("--config={}", config.display()),
        format!("--listen=127.0.0.1:{port}"),
        format!("--admin-listen=127.0.0.1:{admin}"),
        "--drain-delay=0s".into(),
        "--max-connections-per-peer=1024".into(),
    ]);
    command.args(extra);
    let mut guard = ChildGuard::spawn_logged(name, command, log_of(bins, name))?;
    let addr = loopback(admin);
    guard.wait_ready(Duration::from_secs(15), || async move { http::get(addr, "/readyz").await.is_some() }).await?;
    Ok(Server { guard, port, admin })
}

/// Debian's `redis-server`, if installed.
pub fn redis_program() -> Option<PathBuf> {
    let candidates = [PathBuf::from("/usr/bin/redis-server"), PathBuf::from("/usr/local/bin/redis-server")];
    candidates.into_iter().find(|p| p.is_file()).or_else(|| {
        let found = Command::new("sh").args(["-c", "command -v redis-server"]).output().ok()?;
        let path = String::from_utf8(found.stdout).ok()?.trim().to_owned();
        (!path.is_empty()).then(|| PathBuf::from(path))
    })
}

/// Why the Redis rows are skipped without it.
pub const REDIS_MISSING: &str = "redis-server is not installed (Debian: apt-get install redis-server)";

/// A Redis server on `port` (0: a free one), nothing persisted, at most `maxmemory` held.
pub async fn start_redis(bins: &Bins, name: &str, port: u16, maxmemory: &str) -> Result<Server> {
    let program = redis_program().ok_or_else(|| Error::Process(REDIS_MISSING.into()))?;
    let port = if port == 0 { free_port()? } else { port };
    let mut command = Command::new(program);
    command.args([
        "--port".to_owned(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--save".into(),
        String::new(),
        "--appendonly".into(),
        "no".into(),
        "--maxmemory".into(),
        maxmemory.into(),
        "--maxmemory-policy".into(),
        "allkeys-lru".into(),
    ]);
    let mut guard = ChildGuard::spawn_logged(name, command, log_of(bins, name))?;
    let ready = || async move { tokio::net::TcpStream::connect(loopback(port)).await.is_ok() };
    guard.wait_ready(Duration::from_secs(10), ready).await?;
    Ok(Server { guard, port, admin: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_block_is_written_only_when_on() {
        let limits = PoolLimits { max_in_flight: 32, max_queued: 64, queue_timeout_ms: 500 };
        let off = pools_yaml("http://127.0.0.1:1", limits, None);
        assert!(off.contains("maxInFlight: 32") && off.contains("queueTimeout: 500ms") && !off.contains("cache"));
        let on = CacheConfig { size: "1Mi".into(), store: Some(("redis://127.0.0.1:2/0".into(), "5ms".into())) };
        let yaml = pools_yaml("http://127.0.0.1:1", limits, Some(&on));
        assert!(yaml.contains("  cache:\n    size: 1Mi\n"), "{yaml}");
        assert!(yaml.contains("    store:\n      url: redis://127.0.0.1:2/0\n      timeout: 5ms\n"), "{yaml}");
    }
}
