//! `spec.cache`: the pool's embedding cache (docs/caching.md). Each input of an embedding call is
//! looked up by its content (the model TEI reports, the call's options, the text's bytes, and
//! the caller's tenant unless the cache is shared); only the misses go to TEI.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::gpu_memory::quantity_bytes;

/// What the local tier holds per replica unless `size` says otherwise.
pub const DEFAULT_SIZE: &str = "256Mi";
/// How long an entry lives unless `ttl` says otherwise: a day, as a nightly re-index needs.
pub const DEFAULT_TTL: &str = "24h";
/// How long a call waits for the shared store before going to TEI without it.
pub const DEFAULT_STORE_TIMEOUT: &str = "5ms";
/// The most `size` may say: a sidecar's local tier, not a cache server.
pub const MAX_SIZE: &str = "64Gi";
/// The environment variable the sidecar reads the store's password from: the operator fills it
/// from `store.passwordSecret`, so the sidecar never reads that Secret itself.
pub const STORE_PASSWORD_ENV: &str = "TEIFLEET_CACHE_STORE_PASSWORD";

/// The sidecar's memory budget as a share of its memory limit, in percent: the multiplexer's
/// `--memory-budget-fraction` default, which the operator leaves as it is.
pub const SIDECAR_BUDGET_PERCENT: u64 = 50;
/// The share of that budget, in percent, that holders past 64 KiB may fill together (the
/// multiplexer's `admission::memory::LARGE_SHARE_PERCENT`): the local tier is one of them.
pub const SIDECAR_LARGE_SHARE_PERCENT: u64 = 75;

/// Go's duration syntax, the API's everywhere, and above zero.
const POSITIVE_DURATION: &str =
    r"self.matches('^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) > duration('0s')";
/// A store's timeout: longer than a second costs a call more than the store saves it (the
/// sidecar refuses it too).
const STORE_TIMEOUT: &str = r"self.matches('^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) > duration('0s') && duration(self) <= duration('1s')";

/// The pool's embedding cache. Present: on (unless `enabled: false`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.enabled || !has(self.size) || self.size != '0' || has(self.store)").message("cache.size 0 (no local tier) needs cache.store: the cache would keep nothing"))]
pub struct CacheSpec {
    /// Off keeps the block but caches nothing.
    #[serde(default = "yes")]
    pub enabled: bool,

    /// Bytes each replica's local tier holds at most (answers and keys), a whole number with `k`,
    /// `M`, `G`, `Ki`, `Mi` or `Gi`, at most `64Gi`, such as `256Mi` (default); `0`: no local
    /// tier, the store alone (which `store` must then name). Charged to the
    /// sidecar's memory budget: the operator grows the sidecar's memory request by it, and its
    /// memory limit (and `--memory-limit`) so that the calls keep the budget they had (by 8/3 of
    /// it: the budget is half the limit, and the tier fills at most three quarters of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^(0|[1-9][0-9]*(k|M|G|Ki|Mi|Gi)?)$') && quantity(self).compareTo(quantity('64Gi')) <= 0").message("cache.size must be 0 or a whole number with k, M, G, Ki, Mi or Gi, at most 64Gi, such as 256Mi (0: no local tier)"))]
    pub size: Option<String>,

    /// How long an entry lives, a duration such as `24h` (default) or `30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(POSITIVE_DURATION).message("cache.ttl must be a duration above zero such as 30m or 24h"))]
    pub ttl: Option<String>,

    /// One cache for every tenant: a text one tenant embedded is a hit for another. Off (the
    /// default), each tenant has its own entries, so no answer crosses tenants.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_across_tenants: bool,

    /// A Redis-protocol store (Redis, Valkey) the pool's replicas share: a text embedded at one
    /// replica is a hit at every other. A cache, never a dependency: a slow or down store costs a
    /// call at most `timeout`, then the call goes to TEI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<CacheStoreSpec>,
}

/// The shared tier.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.username) || has(self.passwordSecret)").message("cache.store.username needs cache.store.passwordSecret: a user logs in with a password"))]
pub struct CacheStoreSpec {
    /// `redis://host:port/db`, or `rediss://` for TLS (the system's trusted roots). No password
    /// in the URL: it would be in the pod's spec; use `passwordSecret`.
    #[schemars(length(max = 512))]
    #[x_kube(validation = Rule::new(r"self.matches('^rediss?://([-a-zA-Z0-9.]+|\\[[0-9a-fA-F:.]+\\])(:[0-9]{1,5})?(/[0-9]+)?$')").message("cache.store.url must be redis://host[:port][/db] or rediss://... (no user or password: use passwordSecret)"))]
    pub url: String,

    /// The store's password (with `username`, its user's), from a key of a Secret in the pool's
    /// namespace. The operator hands it to the sidecar as an environment variable the kubelet
    /// fills in, so the sidecar never reads that Secret; a missing Secret or key starts the
    /// sidecar without a password, and the store then serves it only if it asks for none.
    /// Pointing it at another Secret or key rolls the pods; a changed password in the same
    /// Secret reaches them when they next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<CacheStoreSecret>,

    /// The store's ACL user, when it has one besides `default` (needs `passwordSecret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^[!-~]+$')").message("cache.store.username must be printable characters without spaces"))]
    pub username: Option<String>,

    /// The most a call waits for the store, e.g. `5ms` (default), at most `1s`; past it the call
    /// goes on to TEI without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(STORE_TIMEOUT).message("cache.store.timeout must be a duration above zero and at most 1s, such as 5ms"))]
    pub timeout: Option<String>,
}

/// The key of a Secret in the pool's namespace that holds the store's password.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CacheStoreSecret {
    /// The Secret.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("cache.store.passwordSecret.name must name a Secret in the pool's namespace (lowercase letters, digits, '-' and '.')"))]
    pub name: String,

    /// The data key holding the password.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$') && self != '.' && self != '..'").message("cache.store.passwordSecret.key must be a Secret data key (letters, digits, '-', '_' and '.')"))]
    pub key: String,
}

/// How much the sidecar's memory limit grows for a local tier of `bytes`, so that the calls keep
/// every byte of the budget they had without it: the tier counts against the large holders'
/// share of the budget, so the budget grows by `bytes` over that share, and the limit by that
/// over the budget's share of the limit (`bytes` × 8/3 at 50% and 75%, rounded up).
pub fn sidecar_limit_growth(bytes: u64) -> u64 {
    let scale = 100 * 100;
    let share = u128::from(SIDECAR_LARGE_SHARE_PERCENT * SIDECAR_BUDGET_PERCENT);
    let growth = (u128::from(bytes) * scale).div_ceil(share);
    u64::try_from(growth).unwrap_or(u64::MAX)
}

impl CacheSpec {
    /// The local tier's bytes as the sidecar budgets them: `size` (default [`DEFAULT_SIZE`]), or 0
    /// with the cache off. `None` only for a size the API server would have refused.
    pub fn local_bytes(&self) -> Option<u64> {
        if !self.enabled {
            return Some(0);
        }
        let bytes = quantity_bytes(self.size.as_deref().unwrap_or(DEFAULT_SIZE))?;
        let max = quantity_bytes(MAX_SIZE)?;
        (bytes <= max).then_some(bytes.round() as u64)
    }
}

fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt as _;
    use serde_json::{Value, json};

    use super::*;
    use crate::EmbeddingPool;

    /// `spec.cache`'s schema, as the API server gets it.
    fn cache_schema() -> Value {
        let crd = serde_json::to_value(EmbeddingPool::crd()).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["cache"].clone()
    }

    /// Each CEL rule with its message.
    fn rules(schema: &Value) -> Vec<(String, String)> {
        let rules = schema["x-kubernetes-validations"].as_array().cloned().unwrap_or_default();
        rules
            .iter()
            .map(|rule| (rule["rule"].as_str().unwrap().into(), rule["message"].as_str().unwrap().into()))
            .collect()
    }

    fn cache(value: Value) -> CacheSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn every_field_is_validated_by_the_api_server_with_a_message_naming_it() {
        let schema = cache_schema();
        let properties = &schema["properties"];
        let store = &properties["store"];
        let secret = &store["properties"]["passwordSecret"];
        for (field, schema) in [
            ("cache.size", &properties["size"]),
            ("cache.ttl", &properties["ttl"]),
            ("cache.store.url", &store["properties"]["url"]),
            ("cache.store.timeout", &store["properties"]["timeout"]),
            ("cache.store.username", &store["properties"]["username"]),
            ("cache.store.passwordSecret.name", &secret["properties"]["name"]),
            ("cache.store.passwordSecret.key", &secret["properties"]["key"]),
            ("cache.store.username", store),
            ("cache.size", &schema),
        ] {
            let rules = rules(schema);
            assert_eq!(rules.len(), 1, "{field}: {rules:?}");
            assert!(rules[0].1.starts_with(&format!("{field} ")), "{field}: {rules:?}");
            // Strings are bounded, so the API server can price each rule before running it.
            if schema["type"] == "string" {
                assert!(schema["maxLength"].as_u64().is_some_and(|max| max <= 512), "{field}: {schema}");
            }
        }
        assert!(rules(&properties["size"])[0].0.contains(&format!("compareTo(quantity('{MAX_SIZE}')) <= 0")));
        assert!(rules(&schema)[0].0.contains("has(self.store)"), "size 0 needs a store");
        let timeout = &rules(&store["properties"]["timeout"])[0].0;
        assert!(timeout.contains("duration(self) <= duration('1s')"), "{timeout}");
        assert!(rules(&properties["ttl"])[0].0.contains("duration(self) > duration('0s')"));
        assert_eq!(store["required"], json!(["url"]));
        assert_eq!(secret["required"], json!(["key", "name"]));
        assert_eq!(properties["enabled"]["default"], true);
    }

    #[test]
    fn the_url_rule_admits_no_credentials() {
        // The rule's host part: letters, digits, '-', '.', or a bracketed IPv6 address. No '@', so
        // no `user:password@` can sit in the pod's spec.
        let schema = cache_schema();
        let (rule, message) = rules(&schema["properties"]["store"]["properties"]["url"]).remove(0);
        assert!(rule.starts_with("self.matches('^rediss?://("), "{rule}");
        assert!(!rule.contains('@'), "{rule}");
        assert!(message.contains("passwordSecret"), "{message}");
    }

    #[test]
    fn present_means_on_with_the_documented_defaults() {
        let on = cache(json!({}));
        assert_eq!(on, CacheSpec { enabled: true, size: None, ttl: None, shared_across_tenants: false, store: None });
        assert_eq!(on.local_bytes(), Some(256 << 20), "{DEFAULT_SIZE}");
        assert_eq!(cache(json!({ "size": "64Mi" })).local_bytes(), Some(64 << 20));
        assert_eq!(cache(json!({ "size": "1G" })).local_bytes(), Some(1_000_000_000));
        assert_eq!(cache(json!({ "size": "0" })).local_bytes(), Some(0), "no local tier");
        assert_eq!(cache(json!({ "enabled": false, "size": "1Gi" })).local_bytes(), Some(0), "off holds nothing");
        assert_eq!(cache(json!({ "size": "65Gi" })).local_bytes(), None, "past {MAX_SIZE}: the API server refuses it");
        assert_eq!(cache(json!({ "size": "lots" })).local_bytes(), None);
        // Written back, unset fields stay unset.
        assert_eq!(serde_json::to_value(&on).unwrap(), json!({ "enabled": true }));
    }

    #[test]
    fn the_limit_grows_so_the_calls_keep_their_budget() {
        for bytes in [0, 1, 64 << 10, 256 << 20, 3 << 29, 64 << 30] {
            let growth = sidecar_limit_growth(bytes);
            // What the multiplexer derives from a limit: its budget, and what large holders may
            // fill of it together.
            let budget = |limit: u64| limit * SIDECAR_BUDGET_PERCENT / 100;
            let large = |limit: u64| budget(limit) * SIDECAR_LARGE_SHARE_PERCENT / 100;
            let limit = 256 << 20;
            // (Each of the multiplexer's two roundings down loses at most a byte.)
            assert!(
                large(limit + growth) + 2 >= large(limit) + bytes,
                "{bytes}: the tier full, bodies keep their room"
            );
            assert!(budget(limit + growth) + 1 >= budget(limit) + bytes, "{bytes}");
            assert!(growth <= bytes * 8 / 3 + 1, "{bytes}: no more than that");
        }
        assert_eq!(sidecar_limit_growth(3 << 20), 8 << 20);
    }

    #[test]
    fn a_store_parses_with_its_password_secret() {
        let spec = cache(json!({
            "sharedAcrossTenants": true,
            "store": { "url": "rediss://cache.ml:6380/2", "username": "teifleet", "timeout": "10ms",
                       "passwordSecret": { "name": "cache-auth", "key": "password" } },
        }));
        assert!(spec.shared_across_tenants);
        let store = spec.store.unwrap();
        assert_eq!(store.password_secret, Some(CacheStoreSecret { name: "cache-auth".into(), key: "password".into() }));
        assert_eq!(store.username.as_deref(), Some("teifleet"));
    }
}
