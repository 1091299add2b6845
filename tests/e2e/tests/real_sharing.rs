//! Several pools on one (fake) GPU of the real node: the node's device plugin offers one L4 shared
//! by time-slicing as 4 `nvidia.com/gpu.shared` (renameByDefault), with GPU Feature Discovery's
//! `nvidia.com/gpu.sharing-strategy=time-slicing` and `nvidia.com/gpu.replicas=4`
//! (tests/cluster/real-node.sh). Four small-model pools, tei-sim as their TEI, all run Ready on it
//! and answer Embed through their Services; a fifth is `InsufficientGPU` naming the share; a model
//! larger than its share gets no pod and says so. The operator runs on the host (the chart on the
//! node is `real_pods.rs`'s subject).
//!
//! Needs the real node and the images (see `real_pods.rs`); without them it says it was skipped.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;
use teifleet_crds::conditions::{self, READY, reasons};
use teifleet_crds::{EmbeddingPool, labels};
use teifleet_e2e::pools::{create_pool, pool_pods, wait_for_ready_reason, wait_until_ready};
use teifleet_e2e::real::{
    NODE, answering_channel, embed, node_of, pool_template, prerequisites, restarts, restricted_namespace,
    service_addr, wait_ready_pods,
};
use teifleet_e2e::{Operator, admin_client, eventually, import_into_real_node, install_crd};

const SHARED: &str = "nvidia.com/gpu.shared";
const POOLS: usize = 4;

#[tokio::test]
async fn four_pools_run_on_one_time_sliced_gpu_and_a_fifth_is_told_the_share_is_taken() {
    let client = admin_client().await;
    let Some(images) = prerequisites(&client).await else { return };
    let node = Api::<Node>::all(client.clone()).get(NODE).await.expect("the real node");
    let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    assert_eq!(allocatable.get(SHARED).map(|q| q.0.as_str()), Some("4"), "one GPU offered as 4 replicas");
    let node_labels = node.metadata.labels.unwrap_or_default();
    assert_eq!(node_labels.get("nvidia.com/gpu.sharing-strategy").map(String::as_str), Some("time-slicing"));
    assert_eq!(node_labels.get("nvidia.com/gpu.replicas").map(String::as_str), Some("4"));
    for name in ["multiplexer", "tei-sim"] {
        import_into_real_node(&images[name].0);
    }
    install_crd(&client).await;
    let ns = restricted_namespace("real-sharing").await;
    let _operator = Operator::start_with(
        "real-sharing",
        &teifleet_e2e::kubeconfig_path(),
        "default",
        &[&format!("--multiplexer-image={}", images["multiplexer"].1)],
    );

    let share = json!({ "type": "nvidia-l4", "sharing": { "strategy": "time-slicing", "replicas": 4, "renameByDefault": true } });
    let pool = |model: &str| {
        json!({
            "model": { "id": model },
            "gpu": share,
            "tei": { "image": images["tei-sim"].1, "extraArgs": ["--fixed-latency=20ms"] },
            "template": pool_template(),
        })
    };
    for n in 0..POOLS {
        create_pool(&client, &ns.name, &format!("small-{n}"), pool("BAAI/bge-small-en-v1.5")).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut on_node = Vec::new();
    for n in 0..POOLS {
        let name = format!("small-{n}");
        let ready = wait_ready_pods(&pods, &labels::pool_selector(&name), 1).await;
        let pool = wait_until_ready(&client, &ns.name, &name).await;
        assert_eq!(pool.status.unwrap().gpu.unwrap().share, "1/4 time-slicing");
        assert_eq!(node_of(&ready[0]), Some(NODE));
        on_node.push(ready[0].clone());
        // Each pool serves through its own Service.
        let channel = answering_channel(service_addr(&client, &ns.name, &name).await).await;
        embed(channel, format!("shared GPU, pool {n}")).await.expect("Embed through the pool's Service");
    }
    // One GPU: the node's four replicas of it, each held by one pool's pod.
    let requested: u32 = on_node
        .iter()
        .flat_map(|pod| pod.spec.clone().unwrap().containers)
        .filter_map(|c| c.resources?.limits?.get(SHARED).and_then(|q| q.0.parse::<u32>().ok()))
        .sum();
    assert_eq!(requested, 4);

    create_pool(&client, &ns.name, "small-4", pool("BAAI/bge-small-en-v1.5")).await;
    let fifth = wait_for_ready_reason(&client, &ns.name, "small-4", "False", reasons::INSUFFICIENT_GPU).await;
    let message = conditions::find(&fifth.status.unwrap().conditions, READY).unwrap().message.clone();
    assert!(
        message.contains("every 1/4 time-slicing share of one nvidia-l4 is taken")
            && message.contains("has a free nvidia.com/gpu.shared")
            && message.contains("Insufficient nvidia.com/gpu.shared"),
        "{message}"
    );

    // A model that needs more than a quarter of an L4 gets no pod, and says so.
    create_pool(&client, &ns.name, "too-big", pool("Qwen/Qwen3-Embedding-8B")).await;
    let too_big = wait_for_ready_reason(&client, &ns.name, "too-big", "False", reasons::INSUFFICIENT_GPU_MEMORY).await;
    let message = conditions::find(&too_big.status.unwrap().conditions, READY).unwrap().message.clone();
    assert!(message.contains("gives 5.6 GiB"), "{message}");
    assert!(pool_pods(&client, &ns.name, "too-big").await.is_empty(), "no pod to crash-loop");

    // Nothing restarted while the GPU was shared.
    eventually("the four pools' pods still Ready, without restarts", Duration::from_secs(10), || async {
        let list = pods.list(&ListParams::default().labels(labels::POOL_LABEL)).await.ok()?.items;
        let running: Vec<&Pod> = list.iter().filter(|p| teifleet_e2e::real::is_ready(p)).collect();
        (running.len() == POOLS && running.iter().all(|p| restarts(p) == 0)).then_some(())
    })
    .await;
    let api = Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name);
    for n in 0..POOLS {
        let status = api.get(&format!("small-{n}")).await.unwrap().status.unwrap();
        assert!(conditions::is_true(&status.conditions, READY));
    }
}
