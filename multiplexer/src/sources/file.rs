//! Static configuration: pools described in YAML, re-read whenever the file changes so limits can
//! be changed live without Kubernetes.
//!
//! ```yaml
//! default: bge            # the pool requests without routing metadata go to (default: the first)
//! pools:
//!   - name: bge
//!     upstream: http://127.0.0.1:8080
//!     model: BAAI/bge-small-en-v1.5
//!     maxInFlight: 8
//!     maxQueued: 32
//!     queueTimeout: 2s
//!     coalesce: true      # identical calls in flight share one upstream call (default false)
//!     maxInFlightTokens: 16384   # optional token budget
//!     adaptive: true      # the in-flight limit finds itself below maxInFlight
//!     tenants: {search: 3, batch: 1}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use teifleet_crds::duration::parse_duration;
use tokio_util::sync::CancellationToken;

use crate::SetupError;
use crate::admission::Limits;
use crate::pools::{PoolSpec, PoolTable};

type Result<T> = std::result::Result<T, SetupError>;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    default: Option<String>,
    pools: Vec<FilePool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FilePool {
    name: String,
    upstream: String,
    model: Option<String>,
    max_in_flight: usize,
    max_queued: usize,
    queue_timeout: String,
    /// The upstream is another teifleet multiplexer (requests carry the hop marker).
    #[serde(default)]
    remote: bool,
    /// Identical unary inference calls in flight share one upstream call.
    #[serde(default)]
    coalesce: bool,
    /// Estimated tokens allowed in flight.
    max_in_flight_tokens: Option<usize>,
    /// The in-flight limit finds itself, with `maxInFlight` as its ceiling.
    #[serde(default)]
    adaptive: bool,
    /// Tenant weights by name.
    #[serde(default)]
    tenants: BTreeMap<String, u32>,
}

/// A parsed configuration: the default pool's name and every pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    pub default: String,
    pub pools: Vec<PoolSpec>,
}

pub fn parse(text: &str) -> Result<Loaded> {
    let config: FileConfig = serde_yaml::from_str(text).map_err(|e| SetupError::Config(e.to_string()))?;
    let first = config.pools.first().ok_or_else(|| SetupError::Config("no pools configured".into()))?;
    let default = config.default.clone().unwrap_or_else(|| first.name.clone());
    let mut pools = Vec::new();
    for pool in config.pools {
        if pool.max_in_flight < 1 {
            return Err(SetupError::Config(format!("pool {}: maxInFlight must be at least 1", pool.name)));
        }
        let queue_timeout = parse_duration(&pool.queue_timeout)
            .map_err(|e| SetupError::Config(format!("pool {}: queueTimeout: {e}", pool.name)))?;
        pools.push(PoolSpec {
            name: pool.name,
            model: pool.model,
            upstream: pool.upstream,
            limits: Some(Limits {
                max_in_flight_tokens: pool.max_in_flight_tokens,
                adaptive: pool.adaptive,
                ..Limits::new(pool.max_in_flight, pool.max_queued, queue_timeout)
            }),
            remote: pool.remote,
            coalesce: pool.coalesce,
            tenants: pool.tenants,
        });
    }
    if !pools.iter().any(|p| p.name == default) {
        return Err(SetupError::Config(format!("default pool {default:?} is not among the pools")));
    }
    Ok(Loaded { default, pools })
}

pub fn load(path: &Path) -> Result<Loaded> {
    let text = std::fs::read_to_string(path).map_err(|e| SetupError::Config(format!("{}: {e}", path.display())))?;
    parse(&text)
}

/// Re-reads `path` every `interval` and applies changes to `table` until `stop`. A broken edit is
/// logged and ignored: the last good configuration stays in force.
pub async fn watch(path: PathBuf, table: Arc<PoolTable>, interval: Duration, stop: CancellationToken) {
    let mut last = std::fs::read_to_string(&path).ok();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        if last.as_deref() == Some(text.as_str()) {
            continue;
        }
        last = Some(text.clone());
        match parse(&text).and_then(|loaded| table.sync(loaded.pools)) {
            Ok(()) => tracing::info!(path = %path.display(), "configuration reloaded"),
            Err(error) => tracing::warn!(path = %path.display(), %error, "ignoring invalid configuration"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pools_and_defaults_to_the_first() {
        let loaded = parse(
            "pools:\n- {name: a, upstream: 'http://127.0.0.1:1', maxInFlight: 2, maxQueued: 3, queueTimeout: 1m30s}\n",
        )
        .unwrap();
        assert_eq!(loaded.default, "a");
        assert_eq!(loaded.pools[0].limits.unwrap().queue_timeout, Duration::from_secs(90));
        assert!(!loaded.pools[0].coalesce, "coalescing is off unless asked for");
        let loaded =
            parse("pools:\n- {name: a, upstream: u, maxInFlight: 2, maxQueued: 3, queueTimeout: 1s, coalesce: true}\n")
                .unwrap();
        assert!(loaded.pools[0].coalesce);
    }

    #[test]
    fn refuses_bad_configuration_with_the_reason() {
        let bad = [
            ("pools: []", "no pools"),
            ("pools:\n- {name: a, upstream: u, maxInFlight: 0, maxQueued: 1, queueTimeout: 1s}", "maxInFlight"),
            ("pools:\n- {name: a, upstream: u, maxInFlight: 1, maxQueued: 1, queueTimeout: soon}", "queueTimeout"),
            ("default: b\npools:\n- {name: a, upstream: u, maxInFlight: 1, maxQueued: 1, queueTimeout: 1s}", "default"),
            ("pools:\n- {name: a, upstream: u, maxInFlight: 1, maxQueued: 1, queueTimeout: 1s, typo: 1}", "typo"),
        ];
        for (text, reason) in bad {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(reason), "{text}: {error}");
        }
    }
}
