//! The product as shipped on the local cluster's real node (`real-0`): what the tests that run
//! the built images in real pods share (`real_pods.rs`, `real_spill.rs`): whether this run has
//! the node and the images, the chart's operator installed on the node, pools pinned to it, their
//! pods and their sidecars' metrics by pod IP, and tei.v1 clients calling through a pool's
//! ClusterIP Service from the host.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_proto::v1::{EmbedRequest, InfoRequest};
use teifleet_testkit::poll::try_eventually;
use teifleet_wire::{ports, tei_health};
use tonic::Code;
use tonic::transport::Channel;

use crate::{
    TestNamespace, built_image, eventually, eventually_pods, helm, http_get, import_into_real_node, install_crd,
    test_namespace_with_labels,
};

pub const NODE: &str = "real-0";
pub const TAINT: &str = "teifleet.dev/real-node";
/// Pod start-up on the node takes seconds; this leaves room for a busy machine.
pub const START: Duration = Duration::from_secs(120);

/// The built images by name (`operator`, `multiplexer`, `tei-sim`): each one's archive and
/// reference.
pub type Images = BTreeMap<&'static str, (PathBuf, String)>;

/// The images, or `None` (the test is then skipped) when this run has no real node or no images.
pub async fn prerequisites(client: &Client) -> Option<Images> {
    let wanted = std::env::var("TEIFLEET_REAL_NODE").ok();
    if wanted.as_deref() == Some("0") {
        eprintln!("skipped: TEIFLEET_REAL_NODE=0 (no real node in this cluster)");
        return None;
    }
    if Api::<Node>::all(client.clone()).get_opt(NODE).await.expect("nodes can be read").is_none() {
        assert_ne!(wanted.as_deref(), Some("1"), "TEIFLEET_REAL_NODE=1 but node {NODE} is not registered");
        eprintln!("skipped: no node {NODE} (start the cluster with make cluster-up)");
        return None;
    }
    let mut images = BTreeMap::new();
    for name in ["operator", "multiplexer", "tei-sim"] {
        let Some(image) = built_image(name) else {
            eprintln!("skipped: no target/images/{name}.tar (make images builds it)");
            return None;
        };
        images.insert(name, image);
    }
    Some(images)
}

/// A test namespace that enforces the `restricted` Pod Security Standard, as the chart's
/// operator and the pools' pods must run under it.
/// What every real-pod test starts with: the images on the real node, the CRD, a restricted
/// namespace named from `prefix` and the chart installed there as `release`; with the images, or
/// `None` (the test skipped, with a line saying why) without the real node or the images.
pub async fn on_the_real_node(client: &Client, prefix: &str, release: &str) -> Option<(TestNamespace, Images)> {
    let images = prerequisites(client).await?;
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    install_crd(client).await;
    let ns = restricted_namespace(prefix).await;
    install_chart(client, &ns.name, release).await;
    Some((ns, images))
}

pub async fn restricted_namespace(prefix: &str) -> TestNamespace {
    test_namespace_with_labels(
        prefix,
        BTreeMap::from([
            ("pod-security.kubernetes.io/enforce".into(), "restricted".into()),
            ("pod-security.kubernetes.io/enforce-version".into(), "latest".into()),
        ]),
    )
    .await
}

/// The chart's name for the operator of release `release` (its Deployment, ServiceAccount and
/// cluster-wide RBAC).
pub fn operator_name(release: &str) -> String {
    format!("{release}-teifleet-operator")
}

/// How long the chart's operator may take to be Ready: the first pod of a run on the real node
/// also waits for containerd to unpack the image, on a machine still busy with the tests before.
const INSTALL: Duration = Duration::from_secs(240);

/// `helm install`s the chart as `release` in `namespace`, its operator on the real node, and
/// waits until the operator's pod is Ready; returns that pod. The wait is the test's, not helm's
/// (`--wait` says only "context deadline exceeded"): one that runs out reports the namespace's
/// pods, their logs and warnings, the kubelet's errors and what the real node holds.
pub async fn install_chart(client: &Client, namespace: &str, release: &str) -> Pod {
    install_chart_with(client, namespace, release, &[]).await
}

/// [`install_chart`] with more `helm install` arguments (`--set` values); the operator's pod.
pub async fn install_chart_with(client: &Client, namespace: &str, release: &str, values: &[&str]) -> Pod {
    // A run that failed half-way left the release's cluster-wide RBAC behind its deleted
    // namespace; helm refuses to adopt it into a release in another namespace.
    let operator = operator_name(release);
    let _ = Api::<ClusterRole>::all(client.clone()).delete(&operator, &DeleteParams::default()).await;
    let _ = Api::<ClusterRoleBinding>::all(client.clone()).delete(&operator, &DeleteParams::default()).await;
    let node_selector = format!(r#"nodeSelector={{"kubernetes.io/hostname":"{NODE}"}}"#);
    let tolerations = format!(r#"tolerations=[{{"key":"{TAINT}","operator":"Exists","effect":"NoSchedule"}}]"#);
    let mut args = vec!["install", release, "charts/teifleet", "-n", namespace];
    args.extend(["--set-json", &node_selector, "--set-json", &tolerations]);
    args.extend(["--set", "leaderElection.leaseDuration=5s"]);
    args.extend(values);
    let (ok, output) = helm(&args);
    assert!(ok, "helm install failed: {output}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    // The operator's pod alone: the release may run the batch API's beside it.
    let selector = format!("app.kubernetes.io/name=teifleet-operator,app.kubernetes.io/instance={release}");
    let ready = try_eventually(&format!("the operator's pod ({selector}) Ready"), INSTALL, || async {
        let list = pods.list(&ListParams::default().labels(&selector)).await.ok()?.items;
        let live: Vec<Pod> = list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        (live.len() == 1 && is_ready(&live[0])).then(|| live[0].clone())
    })
    .await;
    match ready {
        Ok(pod) => pod,
        Err(error) => panic!("{error}\n{}{}", crate::diagnose::report(&pods).await, node_report(client).await),
    }
}

/// `spec.template` of a pool whose pods run on the real node, with small CPU and memory
/// requests for the `tei` container (the node has the machine's few cores).
pub fn pool_template() -> Value {
    json!({
        "nodeSelector": { "kubernetes.io/hostname": NODE },
        "tolerations": [{ "key": TAINT, "operator": "Exists", "effect": "NoSchedule" }],
        "resources": { "requests": { "cpu": "100m", "memory": "64Mi" } },
    })
}

pub fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn restarts(pod: &Pod) -> i32 {
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
    statuses.iter().map(|s| s.restart_count).sum()
}

pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

pub fn ip_of(pod: &Pod) -> IpAddr {
    pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()).expect("a running pod has an IP").parse().expect("an IP")
}

/// Waits until `count` pods match `selector`, all Ready and none being deleted.
pub async fn wait_ready_pods(pods: &Api<Pod>, selector: &str, count: usize) -> Vec<Pod> {
    eventually_pods(pods, &format!("{count} Ready pod(s) {selector}"), START, || async {
        let list = pods.list(&ListParams::default().labels(selector)).await.ok()?.items;
        let live: Vec<Pod> = list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        (live.len() == count && live.iter().all(is_ready)).then_some(live)
    })
    .await
}

/// The Prometheus text of a pool pod's sidecar (`/metrics` on its admin port).
pub async fn sidecar_metrics(pod_ip: IpAddr) -> Option<String> {
    http_get(SocketAddr::new(pod_ip, ports::MULTIPLEXER_ADMIN), "/metrics").await
}

/// The Prometheus text of a pool pod's TEI, which listens on the pod's loopback only: what its
/// sidecar relays on its admin port (`/upstream/metrics`).
pub async fn tei_metrics(pod_ip: IpAddr) -> Option<String> {
    http_get(SocketAddr::new(pod_ip, ports::MULTIPLEXER_ADMIN), tei_health::METRICS_PATH).await
}

/// The share of `pool`'s in-flight budget the sidecar on `pod_ip` applies.
pub async fn limit_in_flight(pod_ip: IpAddr, pool: &str) -> Option<f64> {
    let text = sidecar_metrics(pod_ip).await?;
    teifleet_testkit::prom::value(&text, &format!("teifleet_limit_in_flight{{pool=\"{pool}\"}}"))
}

/// Calls the sidecar on `pod_ip` counted as its own (taken from its clients, spills out included).
pub async fn requests_total(pod_ip: IpAddr) -> Option<f64> {
    Some(teifleet_testkit::prom::sum(&sidecar_metrics(pod_ip).await?, "teifleet_requests_total"))
}

/// The address of `pool`'s ClusterIP Service, gRPC port.
pub async fn service_addr(client: &Client, namespace: &str, pool: &str) -> SocketAddr {
    let service = Api::<Service>::namespaced(client.clone(), namespace).get(pool).await.expect("the pool's Service");
    let ip: IpAddr = service.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP").parse().expect("an IP");
    SocketAddr::new(ip, ports::MULTIPLEXER_GRPC)
}

/// A channel to `service` once it answers `tei.v1` Info (kube-proxy's rules may lag the pods).
pub async fn answering_channel(service: SocketAddr) -> Channel {
    eventually("the pool's Service answering Info", Duration::from_secs(30), || async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{service}"))
            .ok()?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .ok()?;
        InfoClient::new(channel.clone()).info(InfoRequest {}).await.ok().map(|_| channel)
    })
    .await
}

/// One HTTP/2 connection to `service` (a ClusterIP Service pins it to one pod), with a 10 s
/// deadline on every call.
pub async fn connect(service: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{service}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("gRPC connects through the ClusterIP")
}

/// One `tei.v1` Embed call of `text`.
pub async fn embed(channel: Channel, text: String) -> Result<(), tonic::Status> {
    let answer = EmbedClient::new(channel).embed(EmbedRequest { inputs: text, ..Default::default() }).await?;
    assert!(!answer.into_inner().embeddings.is_empty(), "an embedding");
    Ok(())
}

/// What one client saw under load.
#[derive(Default)]
pub struct Tally {
    pub ok: u32,
    pub failed: BTreeMap<String, u32>,
    pub retries: u32,
    /// The most attempts one call needed.
    pub most_attempts: u32,
    /// From the first failed attempt to the last.
    pub failing_for: Duration,
    first_failure: Option<Instant>,
}

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} OK, failed {:?}, {} retries, at most {} attempts for one call, failing for {:?}",
            self.ok, self.failed, self.retries, self.most_attempts, self.failing_for
        )
    }
}

impl Tally {
    fn failure(&mut self) {
        let first = *self.first_failure.get_or_insert_with(Instant::now);
        self.failing_for = first.elapsed();
    }

    /// What several clients saw together (`failing_for`: the longest any one failed).
    pub fn add(&mut self, other: Tally) {
        self.ok += other.ok;
        for (code, count) in other.failed {
            *self.failed.entry(code).or_default() += count;
        }
        self.retries += other.retries;
        self.most_attempts = self.most_attempts.max(other.most_attempts);
        self.failing_for = self.failing_for.max(other.failing_for);
    }
}

/// Calls Embed one after another until `stop`; with `retry`, a call answered UNAVAILABLE is tried
/// again (100 ms apart, for at most 60 s) and counts as failed only when every attempt was.
pub async fn steady_load(channel: Channel, stop: Arc<AtomicBool>, retry: bool) -> Tally {
    let mut tally = Tally::default();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let mut attempts = 0;
        let result = loop {
            attempts += 1;
            match embed(channel.clone(), format!("steady {n}")).await {
                Err(status) if retry && status.code() == Code::Unavailable && attempts < 600 => {
                    tally.failure();
                    tally.retries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                result => break result,
            }
        };
        tally.most_attempts = tally.most_attempts.max(attempts);
        match result {
            Ok(()) => tally.ok += 1,
            Err(status) => {
                tally.failure();
                *tally.failed.entry(format!("{:?}", status.code())).or_default() += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tally
}

/// The real node's conditions that are not as they should be, and every pod bound to it with its
/// CPU and memory requests: a pod that never becomes Ready is often one the node has no room for.
pub async fn node_report(client: &Client) -> String {
    let mut out = String::new();
    match Api::<Node>::all(client.clone()).get_opt(NODE).await {
        Ok(Some(node)) => {
            let status = node.status.unwrap_or_default();
            for condition in status.conditions.iter().flatten() {
                let healthy = if condition.type_ == "Ready" { "True" } else { "False" };
                if condition.status != healthy {
                    let message = condition.message.as_deref().unwrap_or("");
                    out.push_str(&format!("node {NODE} {} {}: {message}\n", condition.type_, condition.status));
                }
            }
            let allocatable = status.allocatable.unwrap_or_default();
            let quantity = |name: &str| allocatable.get(name).map_or("?", |q| q.0.as_str()).to_owned();
            out.push_str(&format!("node {NODE} allocatable: cpu {}, memory {}\n", quantity("cpu"), quantity("memory")));
        }
        Ok(None) => out.push_str(&format!("node {NODE} is not registered\n")),
        Err(error) => out.push_str(&format!("node {NODE} unreadable: {error}\n")),
    }
    let bound = ListParams::default().fields(&format!("spec.nodeName={NODE}"));
    if let Ok(list) = Api::<Pod>::all(client.clone()).list(&bound).await {
        for pod in list.items {
            let requests: Vec<String> = pod
                .spec
                .iter()
                .flat_map(|spec| spec.containers.iter())
                .filter_map(|c| c.resources.as_ref()?.requests.as_ref())
                .flat_map(|r| r.iter().map(|(k, v)| format!("{k} {}", v.0)))
                .collect();
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            out.push_str(&format!(
                "on {NODE}: {}/{} {phase} requests [{}]\n",
                pod.metadata.namespace.unwrap_or_default(),
                pod.metadata.name.unwrap_or_default(),
                requests.join(", ")
            ));
        }
    }
    out
}
