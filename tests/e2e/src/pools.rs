//! Helpers for creating EmbeddingPools and waiting on what the operator does with them.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use teifleet_crds::conditions::{self, READY};
use teifleet_crds::{EmbeddingPool, labels};

use crate::eventually;

/// Creates a pool from a JSON spec merged over a small valid default.
pub async fn create_pool(client: &Client, namespace: &str, name: &str, spec: Value) -> EmbeddingPool {
    let mut full = json!({ "model": { "id": "BAAI/bge-small-en-v1.5" }, "replicas": 1 });
    merge(&mut full, spec);
    let pool: EmbeddingPool = serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1",
        "kind": "EmbeddingPool",
        "metadata": { "name": name, "namespace": namespace },
        "spec": full,
    }))
    .expect("pool fixture");
    Api::<EmbeddingPool>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pool)
        .await
        .expect("pool created")
}

fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (base, patch) => *base = patch,
    }
}

/// Waits until the pool reports `Ready` with the given reason, for its current generation.
pub async fn wait_for_ready_reason(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &str,
    reason: &str,
) -> EmbeddingPool {
    let api = Api::<EmbeddingPool>::namespaced(client.clone(), namespace);
    eventually(&format!("{namespace}/{name} to report Ready={status} ({reason})"), Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let pool = api.get(name).await.ok()?;
            let current = pool.status.as_ref()?;
            let ready = conditions::find(&current.conditions, READY)?;
            let fresh = current.observed_generation == pool.metadata.generation
                && ready.observed_generation == pool.metadata.generation;
            (fresh && ready.status == status && ready.reason == reason).then_some(pool)
        }
    })
    .await
}

pub async fn wait_until_ready(client: &Client, namespace: &str, name: &str) -> EmbeddingPool {
    wait_for_ready_reason(client, namespace, name, "True", conditions::reasons::ALL_REPLICAS_READY).await
}

pub async fn deployment(client: &Client, namespace: &str, name: &str) -> Deployment {
    let api = Api::<Deployment>::namespaced(client.clone(), namespace);
    eventually(&format!("Deployment {namespace}/{name}"), Duration::from_secs(30), || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok().flatten() }
    })
    .await
}

pub async fn pool_pods(client: &Client, namespace: &str, pool: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&labels::pool_selector(pool)))
        .await
        .expect("pods listed")
        .items
}
