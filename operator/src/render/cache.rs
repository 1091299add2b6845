//! What `spec.cache` changes in the pool's pods: the sidecar's memory, grown by what the local
//! tier holds, and the store's password handed to the sidecar by the kubelet. Everything else
//! the sidecar reads from the pool itself, live, so editing the TTL, the store's address or its
//! timeout restarts no pod.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ResourceRequirements, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use teifleet_crds::cache::{STORE_PASSWORD_ENV, sidecar_limit_growth};
use teifleet_crds::{EmbeddingPool, gpu_memory::quantity_bytes};

/// The limit the sidecar assumes when its container has none (the multiplexer's
/// `admission::memory::DEFAULT_LIMIT`, and the operator's own default limit).
const SIDECAR_DEFAULT_LIMIT: u64 = 256 << 20;
const MI: u64 = 1 << 20;

/// The bytes the pool's local tier holds at most: 0 without a cache, off, or with `size: 0`.
fn local_bytes(pool: &EmbeddingPool) -> u64 {
    pool.spec.cache.as_ref().and_then(|cache| cache.local_bytes()).unwrap_or(0)
}

/// Grows the sidecar's memory for the local tier: the request by what the tier holds when full,
/// the limit so that the budget calls had stays theirs (`sidecar_limit_growth`). Returns the
/// `--memory-limit` flag the sidecar then needs, in the same bytes as its container's limit:
/// without a limit in the container (a user who names only a memory request) the sidecar would
/// budget from its default 256Mi, which the tier would fill.
pub(super) fn grow_sidecar_memory(pool: &EmbeddingPool, resources: &mut ResourceRequirements) -> Option<String> {
    let bytes = local_bytes(pool);
    if bytes == 0 {
        return None;
    }
    if let Some(request) = resources.requests.as_mut().and_then(|requests| requests.get_mut("memory")) {
        // A request the API server would not take is left for it to refuse.
        if let Some(grown) = grown(request, bytes) {
            *request = grown;
        }
    }
    let growth = sidecar_limit_growth(bytes);
    match resources.limits.as_mut().and_then(|limits| limits.get_mut("memory")) {
        Some(limit) => {
            *limit = grown(limit, growth)?;
            Some(format!("--memory-limit={}", limit.0))
        }
        None => Some(format!("--memory-limit={}", mebibytes(SIDECAR_DEFAULT_LIMIT.saturating_add(growth)))),
    }
}

/// `quantity` plus `bytes`, rounded up to a whole MiB.
fn grown(quantity: &Quantity, bytes: u64) -> Option<Quantity> {
    let now = quantity_bytes(&quantity.0)?.ceil() as u64;
    Some(Quantity(mebibytes(now.saturating_add(bytes))))
}

/// Bytes as a quantity the multiplexer's `--memory-limit` parses too: whole GiB or MiB, rounded up.
fn mebibytes(bytes: u64) -> String {
    let mib = bytes.div_ceil(MI);
    match mib % 1024 {
        0 => format!("{}Gi", mib / 1024),
        _ => format!("{mib}Mi"),
    }
}

/// The store's password for the sidecar, from `store.passwordSecret`: the kubelet reads the
/// Secret, so the sidecar's role grants it nothing. Optional: a missing Secret or key starts the
/// sidecar without a password rather than keeping the pod from starting, as the cache is never
/// a dependency of the pool's calls.
pub(super) fn store_password_env(pool: &EmbeddingPool) -> Option<EnvVar> {
    let cache = pool.spec.cache.as_ref().filter(|cache| cache.enabled)?;
    let secret = cache.store.as_ref()?.password_secret.as_ref()?;
    Some(EnvVar {
        name: STORE_PASSWORD_ENV.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.name.clone(),
                key: secret.key.clone(),
                optional: Some(true),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_rounded_up_to_whole_mebibytes() {
        assert_eq!(mebibytes(256 << 20), "256Mi");
        assert_eq!(mebibytes(1 << 30), "1Gi");
        assert_eq!(mebibytes((1 << 30) + 1), "1025Mi");
        assert_eq!(mebibytes(1), "1Mi");
        assert_eq!(grown(&Quantity("512M".into()), 0), Some(Quantity("489Mi".into())));
        assert_eq!(grown(&Quantity("1.5Gi".into()), 512 << 20), Some(Quantity("2Gi".into())));
        assert_eq!(grown(&Quantity("lots".into()), 1), None);
    }
}
