//! A pool's `spec.cache` (or a configuration file's `cache:`) as the settings the cache runs with.

use std::time::Duration;

use teifleet_crds::CacheSpec;
use teifleet_crds::cache::{DEFAULT_SIZE, DEFAULT_STORE_TIMEOUT, DEFAULT_TTL};

use crate::admission::memory::parse_bytes;
use crate::cache::{CacheSettings, StoreSettings};

/// The environment variable the kubelet puts the store's password in (from the Secret
/// `spec.cache.store.passwordSecret` names): the sidecar never reads Secrets for it.
pub use teifleet_crds::cache::STORE_PASSWORD_ENV as PASSWORD_ENV;

/// The most a call may wait for the store: beyond this it costs more than it saves.
const LONGEST_STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// The settings `spec` asks for (`None` when it turns the cache off); `model_args` is what the
/// pool asks of its model beyond TEI's Info, `password` the store's.
pub fn from_spec(
    spec: &CacheSpec,
    model_args: String,
    password: Option<String>,
) -> Result<Option<CacheSettings>, String> {
    if !spec.enabled {
        return Ok(None);
    }
    let size = match spec.size.as_deref().unwrap_or(DEFAULT_SIZE).trim() {
        "0" => 0,
        size => parse_bytes(size).map_err(|e| format!("cache.size: {e}"))?,
    };
    let ttl = duration(spec.ttl.as_deref().unwrap_or(DEFAULT_TTL), "cache.ttl")?;
    if ttl.is_zero() {
        return Err("cache.ttl must be more than 0".into());
    }
    let store = match &spec.store {
        Some(store) => {
            let timeout = duration(store.timeout.as_deref().unwrap_or(DEFAULT_STORE_TIMEOUT), "cache.store.timeout")?;
            if timeout.is_zero() || timeout > LONGEST_STORE_TIMEOUT {
                return Err(format!("cache.store.timeout must be more than 0 and at most {LONGEST_STORE_TIMEOUT:?}"));
            }
            if !(store.url.starts_with("redis://") || store.url.starts_with("rediss://")) {
                return Err(format!("cache.store.url {:?} must start with redis:// or rediss://", store.url));
            }
            Some(StoreSettings { url: store.url.clone(), username: store.username.clone(), password, timeout })
        }
        None => None,
    };
    if size == 0 && store.is_none() {
        return Err("cache: size 0 and no store leaves nothing to keep answers in".into());
    }
    Ok(Some(CacheSettings { size, ttl, shared_across_tenants: spec.shared_across_tenants, model_args, store }))
}

fn duration(text: &str, field: &str) -> Result<Duration, String> {
    teifleet_wire::duration::parse(text).map_err(|e| format!("{field}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use teifleet_crds::CacheStoreSpec;

    fn spec() -> CacheSpec {
        CacheSpec { enabled: true, size: None, ttl: None, shared_across_tenants: false, store: None }
    }

    #[test]
    fn defaults() {
        let settings = from_spec(&spec(), String::new(), None).unwrap().unwrap();
        assert_eq!(settings.size, 256 << 20);
        assert_eq!(settings.ttl, Duration::from_secs(24 * 3600));
        assert!(settings.store.is_none());
    }

    #[test]
    fn off_is_none() {
        assert_eq!(from_spec(&CacheSpec { enabled: false, ..spec() }, String::new(), None), Ok(None));
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let store = |url: &str, timeout: &str| CacheStoreSpec {
            url: url.into(),
            password_secret: None,
            username: None,
            timeout: Some(timeout.into()),
        };
        for bad in [
            CacheSpec { size: Some("lots".into()), ..spec() },
            CacheSpec { ttl: Some("0s".into()), ..spec() },
            CacheSpec { size: Some("0".into()), ..spec() },
            CacheSpec { store: Some(store("http://x", "5ms")), ..spec() },
            CacheSpec { store: Some(store("redis://x", "10s")), ..spec() },
        ] {
            assert!(from_spec(&bad, String::new(), None).is_err(), "{bad:?}");
        }
        let good = CacheSpec { size: Some("0".into()), store: Some(store("redis://x:6379/0", "3ms")), ..spec() };
        let settings = from_spec(&good, String::new(), Some("pw".into())).unwrap().unwrap();
        assert_eq!(settings.store.unwrap().password.as_deref(), Some("pw"));
    }
}
