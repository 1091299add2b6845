//! The local cluster's real node (tests/cluster/real-node.sh): a kubelet and kube-proxy on
//! containerd whose GPUs come from teifleet-fake-gpu-plugin over the kubelet's device-plugin API.
//! Scheduling, admission and device allocation are Kubernetes' own; pods really run, and Services
//! really route through kube-proxy's iptables rules.
//!
//! `make test-cluster` starts the node (TEIFLEET_REAL_NODE=1). With TEIFLEET_REAL_NODE=0, or unset
//! on a cluster without the node, these tests say they were skipped and pass.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use teifleet_e2e::{
    admin_client, built_image, eventually, eventually_pods, http_get, import_into_real_node, test_namespace,
};
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_proto::v1::{EmbedRequest, InfoRequest};

const NODE: &str = "real-0";
const TAINT: &str = "teifleet.dev/real-node";
const GPU: &str = "nvidia.com/gpu";
/// What tests/cluster/real-node.sh gives the node.
const GPUS: &str = "2";
const PRODUCT: &str = "NVIDIA-L4";
/// Built by tests/cluster/node-images.sh and imported into the node's containerd.
const ECHO_IMAGE: &str = "teifleet.local/echo:1";
const PAUSE_IMAGE: &str = "teifleet.local/pause:1";
/// Pod start-up on the node takes about a second; this leaves room for a busy machine.
const START: Duration = Duration::from_secs(60);

/// The real node, or `None` (the test is then skipped) when this run has none.
async fn real_node(client: &Client) -> Option<Node> {
    let wanted = std::env::var("TEIFLEET_REAL_NODE").ok();
    if wanted.as_deref() == Some("0") {
        eprintln!("skipped: TEIFLEET_REAL_NODE=0 (no real node in this cluster)");
        return None;
    }
    let node = Api::<Node>::all(client.clone()).get_opt(NODE).await.expect("nodes can be read");
    if node.is_none() {
        assert_ne!(
            wanted.as_deref(),
            Some("1"),
            "TEIFLEET_REAL_NODE=1 but node {NODE} is not registered: see the cluster's logs/kubelet.log"
        );
        eprintln!("skipped: no node {NODE} (start the cluster with make cluster-up)");
    }
    node
}

/// A pod for the real node: it selects and tolerates the node, and never pulls (no registry is
/// reachable; the images are imported).
fn pod(name: &str, image: &str, gpus: u32, labels: serde_json::Value) -> Pod {
    let mut container = json!({
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "securityContext": { "allowPrivilegeEscalation": false },
    });
    if gpus > 0 {
        container["resources"] = json!({ "limits": { GPU: gpus.to_string() } });
    }
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels },
        "spec": {
            "nodeSelector": { TAINT: "true" },
            "tolerations": [{ "key": TAINT, "operator": "Exists", "effect": "NoSchedule" }],
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }))
    .expect("a valid pod")
}

async fn create(pods: &Api<Pod>, pod: &Pod) {
    pods.create(&PostParams::default(), pod).await.expect("pod created");
}

/// Waits for the pod to run on the real node; returns its IP.
async fn wait_running(pods: &Api<Pod>, name: &str) -> IpAddr {
    let pod = eventually_pods(pods, &format!("pod {name} Running on {NODE}"), START, || async {
        let pod = pods.get(name).await.ok()?;
        let status = pod.status.as_ref()?;
        (status.phase.as_deref() == Some("Running")).then_some(pod)
    })
    .await;
    assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(NODE), "pod {name}'s node");
    pod.status.and_then(|s| s.pod_ip).expect("a running pod has an IP").parse().expect("an IP address")
}

/// Waits until the scheduler gives up on the pod; returns its message.
async fn wait_unschedulable(pods: &Api<Pod>, name: &str) -> String {
    eventually(&format!("pod {name} Unschedulable"), Duration::from_secs(30), || async {
        let pod = pods.get(name).await.ok()?;
        let conditions = pod.status?.conditions?;
        let scheduled = conditions.into_iter().find(|c| c.type_ == "PodScheduled")?;
        (scheduled.status == "False" && scheduled.reason.as_deref() == Some("Unschedulable"))
            .then(|| scheduled.message.unwrap_or_default())
    })
    .await
}

async fn create_service(client: &Client, namespace: &str, name: &str, ports: serde_json::Value) -> IpAddr {
    let service: Service = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "selector": { "app": name }, "ports": ports },
    }))
    .expect("a valid Service");
    let service =
        Api::<Service>::namespaced(client.clone(), namespace).create(&PostParams::default(), &service).await.unwrap();
    service.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP").parse().expect("an IP address")
}

/// A GET that answers 200 with `expected`, retried while kube-proxy or the server catch up.
async fn wait_http(what: &str, addr: SocketAddr, path: &str, expected: &str) {
    let body = eventually(what, Duration::from_secs(30), || http_get(addr, path)).await;
    assert_eq!(body.trim_end(), expected, "GET http://{addr}{path}");
}

#[tokio::test]
async fn the_real_node_is_ready_with_gpus_from_its_device_plugin_and_tainted() {
    let client = admin_client().await;
    let Some(node) = real_node(&client).await else { return };
    let status = node.status.clone().expect("node status");
    let ready = status.conditions.unwrap_or_default().into_iter().find(|c| c.type_ == "Ready");
    assert_eq!(ready.map(|c| c.status).as_deref(), Some("True"), "{NODE} is Ready");
    // The kubelet reports what the device plugin registered.
    assert_eq!(status.capacity.as_ref().map(|c| c[GPU].0.as_str()), Some(GPUS), "capacity");
    assert_eq!(status.allocatable.as_ref().map(|c| c[GPU].0.as_str()), Some(GPUS), "allocatable");
    let info = status.node_info.expect("node info");
    assert_eq!(info.kubelet_version, "v1.33.13");
    assert!(info.container_runtime_version.starts_with("containerd://"), "{}", info.container_runtime_version);
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("nvidia.com/gpu.product").map(String::as_str), Some(PRODUCT));
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(taints.iter().any(|t| t.key == TAINT && t.effect == "NoSchedule"), "{taints:?}");

    // Pods that do not tolerate the taint (every other test's) never land on the node.
    let ns = test_namespace("real-taint").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut intruder = pod("intruder", PAUSE_IMAGE, 0, json!({}));
    let spec = intruder.spec.as_mut().unwrap();
    spec.tolerations = None;
    spec.node_selector = Some(BTreeMap::from([("kubernetes.io/hostname".into(), NODE.into())]));
    create(&pods, &intruder).await;
    let message = wait_unschedulable(&pods, "intruder").await;
    assert!(message.contains(&format!("untolerated taint {{{TAINT}: true}}")), "{message}");
}

#[tokio::test]
async fn gpu_pods_run_until_the_nodes_gpus_are_taken_and_each_gets_its_own_device() {
    let client = admin_client().await;
    if real_node(&client).await.is_none() {
        return;
    }
    let ns = test_namespace("real-gpu").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    // Two pods take the node's two GPUs; the kubelet asks the plugin to allocate them, and the
    // plugin's answer (NVIDIA_VISIBLE_DEVICES) reaches each container.
    create(&pods, &pod("gpu-a", ECHO_IMAGE, 1, json!({}))).await;
    create(&pods, &pod("gpu-b", ECHO_IMAGE, 1, json!({}))).await;
    let mut devices = Vec::new();
    for name in ["gpu-a", "gpu-b"] {
        let ip = wait_running(&pods, name).await;
        let visible = eventually(&format!("{name} answering on {ip}:8080"), Duration::from_secs(30), || {
            http_get(SocketAddr::new(ip, 8080), "/env/NVIDIA_VISIBLE_DEVICES")
        })
        .await;
        devices.push(visible.trim_end().to_owned());
    }
    assert!(devices.iter().all(|d| d.starts_with("fake-gpu-")), "{devices:?}");
    assert_ne!(devices[0], devices[1], "each pod has its own GPU");

    // The node is full: one more GPU waits, and so does a pod asking for more GPUs than exist.
    create(&pods, &pod("gpu-c", PAUSE_IMAGE, 1, json!({}))).await;
    create(&pods, &pod("too-many", PAUSE_IMAGE, 3, json!({}))).await;
    for name in ["gpu-c", "too-many"] {
        let message = wait_unschedulable(&pods, name).await;
        assert!(message.contains("Insufficient nvidia.com/gpu"), "{name}: {message}");
    }

    // A GPU given back goes to the pod that waited for it.
    pods.delete("gpu-a", &DeleteParams::default()).await.expect("gpu-a deleted");
    wait_running(&pods, "gpu-c").await;
    let too_many = pods.get("too-many").await.unwrap();
    assert_eq!(too_many.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
}

#[tokio::test]
async fn a_cluster_ip_service_reaches_a_pod_through_kube_proxy_and_pods_reach_the_api_server() {
    let client = admin_client().await;
    if real_node(&client).await.is_none() {
        return;
    }
    let ns = test_namespace("real-svc").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&pods, &pod("web", ECHO_IMAGE, 0, json!({ "app": "web" }))).await;
    let service_ip = create_service(&client, &ns.name, "web", json!([{ "port": 80, "targetPort": 8080 }])).await;
    wait_running(&pods, "web").await;

    // From the host, through kube-proxy's rules for the ClusterIP.
    let service = SocketAddr::new(service_ip, 80);
    wait_http("the web Service answering from the host", service, "/", "echo web").await;

    // From the pod, the API server through the `kubernetes` Service (the API server listens on the
    // node's address, where the Service's endpoints point).
    let kubernetes = Api::<Service>::namespaced(client.clone(), "default").get("kubernetes").await.unwrap();
    let api_ip = kubernetes.spec.and_then(|s| s.cluster_ip).expect("the kubernetes Service's IP");
    wait_http("the pod reaching the API server", service, &format!("/connect/{api_ip}:443"), "connected").await;
}

#[tokio::test]
async fn the_tei_sim_image_serves_tei_grpc_through_a_service() {
    let client = admin_client().await;
    if real_node(&client).await.is_none() {
        return;
    }
    let Some((tar, reference)) = built_image("tei-sim") else {
        eprintln!("skipped: no target/images/tei-sim.tar (make images builds it)");
        return;
    };
    // No registry is reachable: the image goes into the node's containerd.
    import_into_real_node(&tar);

    let ns = test_namespace("real-tei").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    // Shaped like a TEI pod: TEI's arguments, one GPU; the image listens on TEI's port 80.
    let mut tei = pod("tei", &reference, 1, json!({ "app": "tei" }));
    tei.spec.as_mut().unwrap().containers[0].args = Some(vec!["--model-id".into(), "BAAI/bge-small-en-v1.5".into()]);
    create(&pods, &tei).await;
    let service_ip = create_service(
        &client,
        &ns.name,
        "tei",
        json!([{ "name": "grpc", "port": 50051, "targetPort": 80 }, { "name": "metrics", "port": 9000 }]),
    )
    .await;
    wait_running(&pods, "tei").await;
    wait_http("the simulator's health through the Service", SocketAddr::new(service_ip, 9000), "/healthz", "ok").await;

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{service_ip}:50051"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("gRPC connects through the ClusterIP");
    let info = InfoClient::new(channel.clone()).info(InfoRequest {}).await.expect("tei.v1.Info/Info").into_inner();
    assert_eq!(info.model_id, "BAAI/bge-small-en-v1.5");
    let embedded = EmbedClient::new(channel)
        .embed(EmbedRequest { inputs: "a real node".into(), ..Default::default() })
        .await
        .expect("tei.v1.Embed/Embed")
        .into_inner();
    assert!(!embedded.embeddings.is_empty());
}
