//! Static configuration: pools described in YAML, re-read whenever the file changes so limits can
//! be changed live without Kubernetes; API keys likewise, from a file of their own.
//!
//! ```yaml
//! default: bge            # the pool requests without routing metadata go to (default: the first)
//! auth:                   # optional: every call needs one of these API keys (see `crate::gate::auth`)
//!   keysFile: keys.yaml   # tenant: key(s), as a Secret's stringData; relative to this file
//!   maxPriority: {search: critical}   # identified tenants get `standard` at most unless listed
//!   lane: {indexer: ingest}           # the lane a tenant's calls take when they name none
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
//!     ingestShare: 10     # percent of admissions the ingest lane keeps under query overload (0-50, default 10)
//!     queryReserve: 0     # percent of TEI's next batch ingest leaves to queries while they come (0-50; unset: learned)
//!     cache:              # the embedding cache, as `spec.cache` has it (`crate::cache`)
//!       size: 256Mi
//!       store: {url: "redis://127.0.0.1:6379/0", passwordFile: store-password}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use teifleet_crds::{CacheSpec, CacheStoreSpec, ConcurrencySpec, LaneName, PriorityCeiling, TenantWeight};
use tokio_util::sync::CancellationToken;

use super::budget;
use crate::cache::CacheSettings;
use crate::forward::pools::{PoolSpec, PoolTable};
use crate::gate::auth::{Gate, Grant, KeyRing, Policy, ceiling, lane};
use crate::vocab::SetupError;

type Result<T> = std::result::Result<T, SetupError>;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    default: Option<String>,
    auth: Option<FileAuth>,
    pools: Vec<FilePool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileAuth {
    keys_file: PathBuf,
    /// The highest priority a tenant's calls may ask for (`crate::gate::auth`).
    #[serde(default)]
    max_priority: BTreeMap<String, PriorityCeiling>,
    /// The lane a tenant's calls take when they name none (`crate::gate::auth`).
    #[serde(default)]
    lane: BTreeMap<String, LaneName>,
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
    /// The ingest lane's floor, in percent of admissions.
    ingest_share: Option<u8>,
    /// Percent of TEI's next batch ingest leaves to queries while they come; unset: learned.
    query_reserve: Option<u8>,
    /// Percent of the time calls may keep TEI busy while more queue.
    device_time_cap: Option<u8>,
    /// Percent of a time-sliced GPU that is this pool's share: its cap on TEI time while a
    /// neighbour is busy on the device.
    gpu_share: Option<u8>,
    /// The embedding cache (`crate::cache`), as `spec.cache` has it.
    cache: Option<FileCache>,
}

/// `spec.cache`, with the store's password in a file rather than a Secret.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileCache {
    #[serde(default = "yes")]
    enabled: bool,
    size: Option<String>,
    ttl: Option<String>,
    #[serde(default)]
    shared_across_tenants: bool,
    store: Option<FileStore>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileStore {
    url: String,
    username: Option<String>,
    timeout: Option<String>,
    /// A file holding the store's password (relative to the configuration file).
    password_file: Option<PathBuf>,
}

fn yes() -> bool {
    true
}

/// The settings of `pool`'s cache, its password read from beside the configuration in `dir`.
fn cache_of(cache: FileCache, model: Option<&str>, dir: &Path) -> std::result::Result<Option<CacheSettings>, String> {
    let password = match cache.store.as_ref().and_then(|store| store.password_file.as_ref()) {
        Some(file) => {
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cache.store.passwordFile {}: {e}", path.display()))?;
            Some(text.trim_end_matches(['\r', '\n']).to_owned())
        }
        None => None,
    };
    let spec = CacheSpec {
        enabled: cache.enabled,
        size: cache.size,
        ttl: cache.ttl,
        shared_across_tenants: cache.shared_across_tenants,
        store: cache.store.map(|store| CacheStoreSpec {
            url: store.url,
            password_secret: None,
            username: store.username,
            timeout: store.timeout,
        }),
    };
    crate::cache::settings::from_spec(&spec, format!("model={}", model.unwrap_or("")), password)
}

/// A parsed configuration: the default pool's name, every pool, and where the API keys are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    pub default: String,
    pub pools: Vec<PoolSpec>,
    /// The file of API keys; none: calls need no key. Relative to the configuration file once
    /// [`load`]ed.
    pub keys_file: Option<PathBuf>,
    /// What identified tenants are granted: priority ceilings and lanes.
    pub grants: BTreeMap<String, Grant>,
}

pub fn parse(text: &str) -> Result<Loaded> {
    parse_in(text, Path::new("."))
}

/// [`parse`], with files the configuration names found relative to `dir`.
fn parse_in(text: &str, dir: &Path) -> Result<Loaded> {
    let config: FileConfig = serde_norway::from_str(text).map_err(|e| SetupError::Config(e.to_string()))?;
    let first = config.pools.first().ok_or_else(|| SetupError::Config("no pools configured".into()))?;
    let default = config.default.clone().unwrap_or_else(|| first.name.clone());
    let mut pools = Vec::new();
    for pool in config.pools {
        let invalid = |reason: String| SetupError::Config(format!("pool {}: {reason}", pool.name));
        let count =
            |value: usize, field: &str| i32::try_from(value).map_err(|_| invalid(format!("{field} is too large")));
        let concurrency = ConcurrencySpec {
            max_in_flight: count(pool.max_in_flight, "maxInFlight")?,
            max_queued: count(pool.max_queued, "maxQueued")?,
            queue_timeout: pool.queue_timeout.clone(),
            max_in_flight_tokens: pool.max_in_flight_tokens.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            adaptive: pool.adaptive,
            ingest_share: pool.ingest_share.map(i32::from),
            query_reserve: pool.query_reserve.map(i32::from),
            device_time_cap: pool.device_time_cap.map(i32::from),
            tenants: pool
                .tenants
                .iter()
                .map(|(name, &weight)| TenantWeight {
                    name: name.clone(),
                    weight: i32::try_from(weight).unwrap_or(i32::MAX),
                    max_priority: None,
                    lane: None,
                })
                .collect(),
            ..ConcurrencySpec::default()
        };
        let limits = budget::whole(&concurrency)
            .and_then(|limits| budget::with_gpu_share(limits, pool.gpu_share.map(i64::from)))
            .map_err(invalid)?;
        let cache = match pool.cache {
            Some(cache) => cache_of(cache, pool.model.as_deref(), dir).map_err(invalid)?,
            None => None,
        };
        pools.push(PoolSpec {
            cache,
            name: pool.name,
            model: pool.model,
            upstream: pool.upstream,
            limits: Some(limits),
            tenants: budget::tenants(&concurrency),
            remote: pool.remote,
            coalesce: pool.coalesce,
        });
    }
    if !pools.iter().any(|p| p.name == default) {
        return Err(SetupError::Config(format!("default pool {default:?} is not among the pools")));
    }
    let (keys_file, grants) = match config.auth {
        Some(auth) => {
            let mut grants: BTreeMap<String, Grant> = BTreeMap::new();
            for (tenant, priority) in auth.max_priority {
                grants.entry(tenant).or_default().max_priority = Some(ceiling(priority));
            }
            for (tenant, spelled) in auth.lane {
                grants.entry(tenant).or_default().lane = Some(lane(spelled));
            }
            (Some(auth.keys_file), grants)
        }
        None => (None, BTreeMap::new()),
    };
    Ok(Loaded { default, pools, keys_file, grants })
}

pub fn load(path: &Path) -> Result<Loaded> {
    let text = std::fs::read_to_string(path).map_err(|e| SetupError::Config(format!("{}: {e}", path.display())))?;
    parse_at(&text, path)
}

/// [`parse`], with the keys file found beside the configuration file at `path`.
fn parse_at(text: &str, path: &Path) -> Result<Loaded> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut loaded = parse_in(text, dir)?;
    loaded.keys_file = loaded.keys_file.map(|file| dir.join(file));
    Ok(loaded)
}

/// The keys in `path`: a YAML map from tenant name to its key (or keys, one per line), the shape
/// of a Secret's `stringData`. Unusable entries are logged and skipped.
pub fn load_keys(path: &Path) -> Result<KeyRing> {
    let unreadable = |e: &dyn std::fmt::Display| SetupError::Config(format!("API keys in {}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| unreadable(&e))?;
    let entries: BTreeMap<String, String> = serde_norway::from_str(&text).map_err(|e| unreadable(&e))?;
    let (ring, problems) = KeyRing::parse(entries.iter().map(|(tenant, keys)| (tenant.as_str(), keys.as_bytes())));
    for problem in problems {
        tracing::warn!(path = %path.display(), problem, "API key entry skipped");
    }
    tracing::info!(path = %path.display(), keys = ring.len(), "API keys loaded");
    Ok(ring)
}

/// What the gate enforces for a configuration whose keys are in `keys_file`.
pub fn policy(keys_file: Option<&Path>) -> Result<Policy> {
    keys_file.map_or(Ok(Policy::Off), |path| load_keys(path).map(Policy::Keys))
}

/// Re-reads `path` (and its keys file) every `interval` and applies changes to `table` (and
/// `gate`) until `stop`. A broken edit is logged and ignored: the last good configuration, and
/// the last good keys, stay in force.
pub async fn watch(path: PathBuf, table: Arc<PoolTable>, gate: Arc<Gate>, interval: Duration, stop: CancellationToken) {
    let mut last = std::fs::read_to_string(&path).ok();
    let mut keys_file = last.as_deref().and_then(|text| parse_at(text, &path).ok()).and_then(|l| l.keys_file);
    let mut last_keys = keys_file.as_deref().and_then(|file| std::fs::read_to_string(file).ok());
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        if let Ok(text) = std::fs::read_to_string(&path)
            && last.as_deref() != Some(text.as_str())
        {
            last = Some(text.clone());
            let applied = parse_at(&text, &path).and_then(|loaded| {
                table.sync(loaded.pools)?;
                gate.set_grants(loaded.grants);
                Ok(loaded.keys_file)
            });
            match applied {
                Ok(file) => {
                    tracing::info!(path = %path.display(), "configuration reloaded");
                    if file != keys_file {
                        // Keys just turned on refuse every call until they are read: never open.
                        gate.set(if file.is_some() { Policy::Waiting } else { Policy::Off });
                        (keys_file, last_keys) = (file, None);
                    }
                }
                Err(error) => tracing::warn!(path = %path.display(), %error, "ignoring invalid configuration"),
            }
        }
        let Some(file) = &keys_file else { continue };
        let text = std::fs::read_to_string(file).ok();
        if text.is_none() || text == last_keys {
            continue;
        }
        last_keys = text;
        match load_keys(file) {
            Ok(ring) => gate.set(Policy::Keys(ring)),
            Err(error) => tracing::warn!(%error, "ignoring invalid API keys; the keys in force stay (none at first)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_may_have_a_cache_and_a_store_with_its_password_beside_the_file() {
        let dir = std::env::temp_dir().join(format!("teifleet-file-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pw"), "secret\n").unwrap();
        let pool = "pools:\n- {name: a, upstream: u, model: m, maxInFlight: 2, maxQueued: 3, queueTimeout: 1s, ";
        let text =
            format!("{pool}cache: {{size: 1Mi, ttl: 1h, store: {{url: 'redis://r:6379/0', passwordFile: pw}}}}}}\n");
        let loaded = parse_in(&text, &dir).unwrap();
        let cache = loaded.pools[0].cache.clone().expect("a cache");
        assert_eq!((cache.size, cache.ttl), (1 << 20, Duration::from_secs(3600)));
        assert_eq!(cache.store.unwrap().password.as_deref(), Some("secret"));
        assert!(parse(&format!("{pool}cache: {{size: lots}}}}\n")).is_err(), "a size that is none");
        assert!(parse(&format!("{pool}cache: {{store: {{url: 'redis://r', passwordFile: missing}}}}}}\n")).is_err());
        assert!(parse(&format!("{pool}cache: {{enabled: false}}}}\n")).unwrap().pools[0].cache.is_none());
        std::fs::remove_dir_all(dir).ok();
    }

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
        assert_eq!(loaded.pools[0].limits.unwrap().ingest_share, 10, "the ingest floor's default");
        let loaded = parse(
            "pools:\n- {name: a, upstream: u, maxInFlight: 2, maxQueued: 3, queueTimeout: 1s, ingestShare: 25}\n",
        )
        .unwrap();
        assert_eq!(loaded.pools[0].limits.unwrap().ingest_share, 25);
    }

    #[test]
    fn refuses_bad_configuration_with_the_reason() {
        let bad = [
            ("pools: []", "no pools"),
            ("pools:\n- {name: a, upstream: u, maxInFlight: 0, maxQueued: 1, queueTimeout: 1s}", "maxInFlight"),
            ("pools:\n- {name: a, upstream: u, maxInFlight: 1, maxQueued: 1, queueTimeout: soon}", "queueTimeout"),
            ("default: b\npools:\n- {name: a, upstream: u, maxInFlight: 1, maxQueued: 1, queueTimeout: 1s}", "default"),
            ("pools:\n- {name: a, upstream: u, maxInFlight: 1, maxQueued: 1, queueTimeout: 1s, typo: 1}", "typo"),
            (
                "pools:\n- {name: a, upstream: u, maxInFlight: 1, maxQueued: 1, queueTimeout: 1s, ingestShare: 51}",
                "ingestShare",
            ),
            (
                "auth: {keys: k}\npools:\n- {name: a, upstream: u, maxInFlight: 1, maxQueued: 1, queueTimeout: 1s}",
                "keys",
            ),
        ];
        for (text, reason) in bad {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(reason), "{text}: {error}");
        }
    }

    #[test]
    fn the_keys_file_lies_beside_the_configuration_and_holds_a_secrets_string_data() {
        let dir = std::env::temp_dir().join(format!("teifleet-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = "search: search-key-0123456789\nbatch: |\n  batch-key-0123456789\n  batch-key-new-0123456789\n";
        std::fs::write(dir.join("keys.yaml"), keys).unwrap();
        let config = "auth: {keysFile: keys.yaml}\npools:\n- {name: a, upstream: u, maxInFlight: 1, maxQueued: 1, queueTimeout: 1s}";
        std::fs::write(dir.join("pools.yaml"), config).unwrap();

        let loaded = load(&dir.join("pools.yaml")).unwrap();
        assert_eq!(loaded.keys_file, Some(dir.join("keys.yaml")));
        assert!(matches!(policy(loaded.keys_file.as_deref()).unwrap(), Policy::Keys(ring) if ring.len() == 3));
        assert!(matches!(policy(None).unwrap(), Policy::Off));
        let missing = load_keys(&dir.join("gone.yaml")).unwrap_err().to_string();
        assert!(missing.contains("gone.yaml"), "{missing}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
