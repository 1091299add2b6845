//! Pools asking for a share of a GPU against the real API server and scheduler, on kwok nodes
//! labelled as NVIDIA's device plugin and GPU Feature Discovery label shared and MIG GPUs: the
//! API server refuses invalid shares with readable messages; time-sliced replicas fill a node and
//! the next pool is `InsufficientGPU` naming the share; MIG pools land on nodes offering their
//! profile and a profile no node offers is named; a model larger than its share gets no pod.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};
use teifleet_crds::EmbeddingPool;
use teifleet_crds::conditions::{self, READY, reasons};
use teifleet_e2e::pools::{create_pool, deployment, pool_pods, wait_for_ready_reason, wait_until_ready};
use teifleet_e2e::{Operator, TestNamespace, admin_client, eventually, install_crd, kubectl, test_namespace};

async fn setup(prefix: &str) -> (Client, TestNamespace) {
    let client = admin_client().await;
    install_crd(&client).await;
    let ns = test_namespace(prefix).await;
    (client, ns)
}

/// A kwok node with GFD's labels and the device plugin's resources of a shared or MIG GPU;
/// deleted when dropped.
struct SharedNode(String);

impl SharedNode {
    async fn create(client: &Client, name: &str, labels: Value, resources: Value) -> Self {
        let mut all_labels = json!({ "type": "kwok", "kubernetes.io/hostname": name });
        all_labels.as_object_mut().unwrap().extend(labels.as_object().unwrap().clone());
        let mut capacity = json!({ "cpu": "32", "memory": "256Gi", "pods": "110" });
        capacity.as_object_mut().unwrap().extend(resources.as_object().unwrap().clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": { "name": name, "annotations": { "kwok.x-k8s.io/node": "fake" }, "labels": all_labels },
            "spec": { "taints": [{ "key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule" }] },
            "status": { "capacity": capacity, "allocatable": capacity },
        }))
        .unwrap();
        Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.expect("node created");
        Self(name.into())
    }
}

impl Drop for SharedNode {
    fn drop(&mut self) {
        kubectl(&["delete", "node", &self.0, "--wait=false", "--ignore-not-found"]);
    }
}

async fn ready_message(client: &Client, namespace: &str, pool: &str) -> String {
    let pool = Api::<EmbeddingPool>::namespaced(client.clone(), namespace).get(pool).await.unwrap();
    conditions::find(&pool.status.unwrap().conditions, READY).unwrap().message.clone()
}

async fn nodes_of(client: &Client, namespace: &str, pool: &str) -> Vec<String> {
    pool_pods(client, namespace, pool).await.into_iter().filter_map(|pod| pod.spec?.node_name).collect()
}

#[tokio::test]
async fn invalid_shares_are_refused_with_readable_messages() {
    let (client, ns) = setup("sharing-cel").await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &ApiResource::erase::<EmbeddingPool>(&()));
    let cases = [
        (
            json!({ "type": "cpu", "count": 0, "sharing": { "strategy": "mps", "replicas": 2 } }),
            "gpu.sharing needs a GPU type: a cpu pool has no GPU to share",
        ),
        (
            json!({ "type": "nvidia-l4", "count": 2, "sharing": { "strategy": "time-slicing", "replicas": 4 } }),
            "gpu.sharing gives each replica one share of one GPU: leave gpu.count at 1",
        ),
        (
            json!({ "type": "nvidia-l4", "sharing": { "strategy": "time-slicing" } }),
            "gpu.sharing.strategy time-slicing and mps need replicas",
        ),
        (
            json!({ "type": "nvidia-l4", "sharing": { "strategy": "mps", "replicas": 1 } }),
            "gpu.sharing.replicas must be between 2 and 64",
        ),
        (
            json!({ "type": "nvidia-l4", "sharing": { "strategy": "time-slicing", "replicas": 4, "profile": "1g.10gb" } }),
            "gpu.sharing.profile is for strategy mig only",
        ),
        (
            json!({ "type": "nvidia-l4", "sharing": { "strategy": "mig", "profile": "1g.10gb" } }),
            "gpu.sharing.strategy mig needs a GPU with MIG: nvidia-a100-40gb, nvidia-a100-80gb, nvidia-h100-80gb or nvidia-h200",
        ),
        (
            json!({ "type": "nvidia-h100-80gb", "sharing": { "strategy": "mig" } }),
            "gpu.sharing.strategy mig needs a profile such as 1g.10gb",
        ),
        (
            json!({ "type": "nvidia-h100-80gb", "sharing": { "strategy": "mig", "profile": "1g.5gb" } }),
            "gpu.sharing.profile must be a MIG profile of nvidia-h100-80gb: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb or 7g.80gb",
        ),
        (
            json!({ "type": "nvidia-h200", "sharing": { "strategy": "mig", "profile": "half" } }),
            "gpu.sharing.profile must be a MIG profile such as 1g.10gb, 2g.20gb or 3g.40gb",
        ),
        (
            json!({ "type": "nvidia-a100-80gb", "sharing": { "strategy": "mig", "profile": "1g.10gb", "replicas": 7 } }),
            "gpu.sharing.replicas and renameByDefault are for time-slicing and mps",
        ),
        (json!({ "type": "nvidia-l4", "sharing": { "strategy": "whole" } }), "Unsupported value: \"whole\""),
    ];
    for (index, (gpu, message)) in cases.into_iter().enumerate() {
        let name = format!("invalid-{index}");
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1",
            "kind": "EmbeddingPool",
            "metadata": { "name": name },
            "spec": { "model": { "id": "BAAI/bge-small-en-v1.5" }, "gpu": gpu },
        }))
        .unwrap();
        let error = api.create(&PostParams::default(), &object).await.expect_err(&format!("{gpu} must be refused"));
        assert!(error.to_string().contains(message), "{gpu}: expected {message:?} in {error}");
    }
    let memory: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool", "metadata": { "name": "memory" },
        "spec": { "model": { "id": "m", "gpuMemory": "0" } },
    }))
    .unwrap();
    let error = api.create(&PostParams::default(), &memory).await.expect_err("a zero need is refused");
    assert!(error.to_string().contains("model.gpuMemory must be a positive quantity such as 3Gi"), "{error}");

    // The valid shapes of every mode are accepted.
    for (index, gpu) in [
        json!({ "type": "nvidia-l4", "sharing": { "strategy": "time-slicing", "replicas": 4 } }),
        json!({ "type": "nvidia-h100-80gb", "sharing": { "strategy": "mps", "replicas": 7, "renameByDefault": true } }),
        json!({ "type": "nvidia-a100-40gb", "sharing": { "strategy": "mig", "profile": "1g.5gb" } }),
        json!({ "type": "nvidia-h200", "sharing": { "strategy": "mig", "profile": "7g.141gb" } }),
    ]
    .into_iter()
    .enumerate()
    {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool", "metadata": { "name": format!("valid-{index}") },
            "spec": { "model": { "id": "BAAI/bge-small-en-v1.5", "gpuMemory": "1536Mi" }, "gpu": gpu },
        }))
        .unwrap();
        api.create(&PostParams::default(), &object).await.unwrap_or_else(|e| panic!("{gpu} accepted: {e}"));
    }
}

#[tokio::test]
async fn four_time_sliced_pools_share_one_gpu_and_a_fifth_is_told_the_share_is_taken() {
    let (client, ns) = setup("sharing-ts").await;
    let _operator = Operator::start("sharing-ts");
    // One L4 offered as 4 replicas of nvidia.com/gpu (renameByDefault: false, so GFD marks the
    // product -SHARED and whole-GPU pools stay off it).
    let _node = SharedNode::create(
        &client,
        "e2e-l4-shared",
        json!({ "nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.count": "1",
                "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4" }),
        json!({ "nvidia.com/gpu": "4" }),
    )
    .await;
    let sharing = json!({ "type": "nvidia-l4", "sharing": { "strategy": "time-slicing", "replicas": 4 } });
    for n in 0..4 {
        create_pool(&client, &ns.name, &format!("small-{n}"), json!({ "gpu": sharing })).await;
    }
    for n in 0..4 {
        let pool = format!("small-{n}");
        let ready = wait_until_ready(&client, &ns.name, &pool).await;
        assert_eq!(nodes_of(&client, &ns.name, &pool).await, ["e2e-l4-shared"], "{pool} on the shared node");
        let gpu = ready.status.unwrap().gpu.unwrap();
        assert_eq!((gpu.share.as_str(), gpu.resource.as_str()), ("1/4 time-slicing", "nvidia.com/gpu: 1"));
        // The slice's defaults: a quarter of TEI's batch and of the L4's requests.
        let spec = deployment(&client, &ns.name, &pool).await.spec.unwrap().template.spec.unwrap();
        let tei = &spec.containers[0];
        assert!(tei.args.as_ref().unwrap().contains(&"--max-batch-tokens=4096".to_owned()), "{:?}", tei.args);
        let requests = tei.resources.as_ref().unwrap().requests.clone().unwrap();
        assert_eq!((requests["cpu"].0.as_str(), requests["memory"].0.as_str()), ("500m", "2Gi"));
    }

    create_pool(&client, &ns.name, "small-4", json!({ "gpu": sharing })).await;
    wait_for_ready_reason(&client, &ns.name, "small-4", "False", reasons::INSUFFICIENT_GPU).await;
    let message = ready_message(&client, &ns.name, "small-4").await;
    assert!(
        message.contains(
            "every 1/4 time-slicing share of one nvidia-l4 is taken: no node with nvidia.com/gpu.product in \
             [NVIDIA-L4, NVIDIA-L4-SHARED], nvidia.com/gpu.sharing-strategy=time-slicing, nvidia.com/gpu.replicas=4 \
             has a free nvidia.com/gpu"
        ),
        "{message}"
    );
    assert!(message.contains("Insufficient nvidia.com/gpu"), "the scheduler's own words: {message}");

    // `kubectl get` shows the share.
    let (ok, table) = kubectl(&["get", "epool", "-n", &ns.name]);
    assert!(ok && table.contains("SHARE") && table.contains("1/4 time-slicing"), "{table}");
}

#[tokio::test]
async fn mig_pools_land_on_nodes_offering_their_profile_and_a_missing_profile_is_named() {
    let (client, ns) = setup("sharing-mig").await;
    let _operator = Operator::start("sharing-mig");
    // An H100 under the mixed strategy, cut into seven 1g.10gb instances.
    let _node = SharedNode::create(
        &client,
        "e2e-h100-mig",
        json!({ "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/mig-1g.10gb.memory": "9856" }),
        json!({ "nvidia.com/mig-1g.10gb": "7" }),
    )
    .await;
    let mig =
        |profile: &str| json!({ "type": "nvidia-h100-80gb", "sharing": { "strategy": "mig", "profile": profile } });
    create_pool(&client, &ns.name, "on-mig", json!({ "gpu": mig("1g.10gb"), "replicas": 3 })).await;
    create_pool(&client, &ns.name, "no-profile", json!({ "gpu": mig("3g.40gb") })).await;

    let ready = wait_until_ready(&client, &ns.name, "on-mig").await;
    assert_eq!(nodes_of(&client, &ns.name, "on-mig").await, ["e2e-h100-mig"; 3]);
    assert_eq!(ready.status.unwrap().gpu.unwrap().share, "mig 1g.10gb");
    let spec = deployment(&client, &ns.name, "on-mig").await.spec.unwrap().template.spec.unwrap();
    let limits = spec.containers[0].resources.as_ref().unwrap().limits.clone().unwrap();
    assert_eq!(limits.get("nvidia.com/mig-1g.10gb").map(|q| q.0.as_str()), Some("1"));
    assert!(!limits.contains_key("nvidia.com/gpu"), "{limits:?}");
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("ghcr.io/huggingface/text-embeddings-inference:hopper-1.9-grpc")
    );

    wait_for_ready_reason(&client, &ns.name, "no-profile", "False", reasons::INSUFFICIENT_GPU).await;
    let message = ready_message(&client, &ns.name, "no-profile").await;
    assert!(
        message.contains(
            "no node offers a MIG 3g.40gb instance of one nvidia-h100-80gb (nvidia.com/mig-3g.40gb): none carries"
        ),
        "{message}"
    );

    // The node's instances run out: the eighth replica is told the 1g.10gb instances are taken.
    Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name)
        .patch("on-mig", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "replicas": 8 } })))
        .await
        .unwrap();
    wait_for_ready_reason(&client, &ns.name, "on-mig", "False", reasons::INSUFFICIENT_GPU).await;
    let message = ready_message(&client, &ns.name, "on-mig").await;
    assert!(message.contains("every MIG 1g.10gb instance of one nvidia-h100-80gb is taken"), "{message}");
    assert!(message.contains("Insufficient nvidia.com/mig-1g.10gb"), "{message}");
}

#[tokio::test]
async fn a_model_larger_than_its_share_gets_no_pod_and_says_why_until_it_fits() {
    let (client, ns) = setup("sharing-memory").await;
    let _operator = Operator::start("sharing-memory");
    let quarter = json!({ "type": "nvidia-l4", "sharing": { "strategy": "time-slicing", "replicas": 4 } });
    create_pool(
        &client,
        &ns.name,
        "too-big",
        json!({ "model": { "id": "Qwen/Qwen3-Embedding-8B" }, "gpu": quarter, "replicas": 2 }),
    )
    .await;
    let pool = wait_for_ready_reason(&client, &ns.name, "too-big", "False", reasons::INSUFFICIENT_GPU_MEMORY).await;
    let status = pool.status.unwrap();
    let ready = conditions::find(&status.conditions, READY).unwrap();
    assert!(
        ready.message.starts_with("Qwen/Qwen3-Embedding-8B needs 15.1 GiB of GPU memory (estimated: ")
            && ready.message.contains("but a 1/4 time-slicing share of one nvidia-l4 gives 5.6 GiB"),
        "{}",
        ready.message
    );
    assert!(conditions::is_true(&status.conditions, "Degraded"));
    assert_eq!(deployment(&client, &ns.name, "too-big").await.spec.unwrap().replicas, Some(0));
    assert!(pool_pods(&client, &ns.name, "too-big").await.is_empty(), "no pod that would OOM-loop");

    // A declared need is checked the same way, for a model the catalogue does not know.
    create_pool(
        &client,
        &ns.name,
        "declared",
        json!({ "model": { "id": "my-org/private-embedder", "gpuMemory": "6Gi" }, "gpu": quarter }),
    )
    .await;
    wait_for_ready_reason(&client, &ns.name, "declared", "False", reasons::INSUFFICIENT_GPU_MEMORY).await;
    assert!(
        ready_message(&client, &ns.name, "declared")
            .await
            .contains("needs 6.0 GiB of GPU memory (declared in spec.model.gpuMemory)")
    );

    // On whole L4s it fits, and its pods are created and run (kwok's L4 nodes).
    Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name)
        .patch("too-big", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "gpu": { "sharing": null } } })))
        .await
        .unwrap();
    wait_until_ready(&client, &ns.name, "too-big").await;
    let placed: BTreeMap<String, usize> =
        nodes_of(&client, &ns.name, "too-big").await.into_iter().fold(BTreeMap::new(), |mut m, n| {
            *m.entry(n).or_default() += 1;
            m
        });
    assert_eq!(placed.values().sum::<usize>(), 2, "{placed:?}");
    eventually("the pool's status to show a whole GPU", Duration::from_secs(30), || async {
        let pool = Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name).get("too-big").await.ok()?;
        (pool.status?.gpu?.share == "1 GPU").then_some(())
    })
    .await;
}
