//! The product as shipped, in real pods on the local cluster's real node (`real-0`): the chart
//! installs the operator image as a pod in a namespace that enforces the `restricted` Pod Security
//! Standard; the operator turns an EmbeddingPool into TEI pods (the tei-sim image standing in for
//! TEI) with the multiplexer image as their sidecar; the real kubelet runs them and probes them; a
//! client on the host calls the pool's ClusterIP Service through kube-proxy, over gRPC and HTTP;
//! TEI, listening on its pod's loopback only, refuses everyone else, on the host and in other pods.
//! A real Prometheus, with docs/operating.md's scrape jobs and the shipped alert rules, scrapes the
//! operator and the sidecars through Kubernetes service discovery and raises no alert.
//!
//! Needs the real node (`make test-cluster` starts it) and the images in `target/images`
//! (`make images`, or `make test-cluster`, which builds them from the debug binaries when missing).
//! Without either the test says it was skipped and passes.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use teifleet_crds::{EmbeddingPool, labels};
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::prometheus::{Prometheus, check_healthy_pool};
use teifleet_e2e::real::{
    NODE, START, TAINT, Tally, answering_channel, connect, embed, install_chart, ip_of, is_ready, limit_in_flight,
    node_of, operator_name, pool_template, prerequisites, requests_total, restarts, restricted_namespace, service_addr,
    steady_load, wait_ready_pods,
};
use teifleet_e2e::{admin_client, eventually, eventually_pods, helm, http_get, import_into_real_node, install_crd};
use teifleet_proto::v1::InfoRequest;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_wire::{ports, tei_health};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tonic::Code;

const RELEASE: &str = "tfreal";
const POOL: &str = "real";
const MODEL: &str = "BAAI/bge-small-en-v1.5";

/// How a TCP connection attempt to `addr` ended: within 5 s, so a dropped SYN reads as `TimedOut`.
async fn connect_outcome(addr: SocketAddr) -> Result<(), ErrorKind> {
    match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error.kind()),
        Err(_) => Err(ErrorKind::TimedOut),
    }
}

/// `POST path` with a JSON body over HTTP/1.0: the status and the body.
async fn post_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> (u16, String) {
    let body = body.to_string();
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        let head = format!(
            "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP answer");
        (head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status"), body.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(10), exchange).await.expect("an answer within 10 s")
}

/// A pod on the real node running the multiplexer image in static mode with `upstream` as its
/// TEI: a tei.v1 client inside the cluster network (the images have no shell to run one in), whose
/// `/upstream/healthz` says whether it reached `upstream` and, if not, why.
fn client_pod(name: &str, image: &str, upstream: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app.kubernetes.io/name": "real-pods-client" } },
        "spec": {
            "nodeSelector": { "kubernetes.io/hostname": NODE },
            "tolerations": [{ "key": TAINT, "operator": "Exists", "effect": "NoSchedule" }],
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 1000,
                "seccompProfile": { "type": "RuntimeDefault" },
            },
            "containers": [{
                "name": "client",
                "image": image,
                "args": [
                    "static".to_owned(),
                    format!("--upstream={upstream}"),
                    "--max-in-flight=4".to_owned(),
                    format!("--listen=0.0.0.0:{}", ports::MULTIPLEXER_GRPC),
                    format!("--admin-listen=0.0.0.0:{}", ports::MULTIPLEXER_ADMIN),
                ],
                "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } },
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": { "drop": ["ALL"] },
                    "readOnlyRootFilesystem": true,
                },
            }],
        },
    }))
    .unwrap()
}

/// What a client pod's `/upstream/healthz` answers once it has one.
async fn upstream_health_seen_by(pods: &Api<Pod>, name: &str) -> teifleet_testkit::http::Response {
    eventually_pods(pods, &format!("{name} running and answering {}", tei_health::PATH), START, || async {
        let pod = pods.get(name).await.ok()?;
        let ip: IpAddr = pod.status?.pod_ip?.parse().ok()?;
        teifleet_testkit::http::request(SocketAddr::new(ip, ports::MULTIPLEXER_ADMIN), "GET", tei_health::PATH).await
    })
    .await
}

/// Runs `action` while two clients call Embed through the Service, one without retries and one
/// retrying UNAVAILABLE; returns what each saw.
async fn under_load(service: SocketAddr, action: impl std::future::Future<Output = ()>) -> (Tally, Tally) {
    let stop = Arc::new(AtomicBool::new(false));
    let plain = tokio::spawn(steady_load(connect(service).await, stop.clone(), false));
    let retrying = tokio::spawn(steady_load(connect(service).await, stop.clone(), true));
    tokio::time::sleep(Duration::from_secs(1)).await;
    action.await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    (plain.await.unwrap(), retrying.await.unwrap())
}

#[tokio::test]
async fn the_chart_operator_and_a_pool_run_as_real_pods_and_serve_through_kube_proxy() {
    let client = admin_client().await;
    let Some(images) = prerequisites(&client).await else { return };
    let started = Instant::now();

    // No registry is reachable: the images go into the node's containerd.
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    let imported = started.elapsed();
    install_crd(&client).await;

    // 1. The chart, in a namespace that enforces the restricted Pod Security Standard.
    let ns = restricted_namespace("real-pods").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    // The namespace really enforces it: a pod that breaks the standard is refused.
    let loose: Pod = serde_json::from_value(json!({
        "metadata": { "name": "loose" },
        "spec": { "containers": [{ "name": "main", "image": "teifleet.local/pause:1" }] },
    }))
    .unwrap();
    let refused = pods.create(&PostParams::default(), &loose).await.expect_err("a pod breaking `restricted`");
    assert!(refused.to_string().contains("violates PodSecurity \"restricted"), "{refused}");

    let operator = install_chart(&client, &ns.name, RELEASE).await;
    let operator_ready = started.elapsed();
    assert_eq!(node_of(&operator), Some(NODE), "the operator runs on the real node");
    let spec = operator.spec.as_ref().unwrap();
    assert_eq!(spec.service_account_name, Some(operator_name(RELEASE)), "the chart's ServiceAccount");
    assert_eq!(spec.containers[0].image.as_deref(), Some(images["operator"].1.as_str()), "the built image");
    assert_eq!(restarts(&operator), 0);

    // 2. A pool on the real node's fake L4 GPUs, tei-sim as TEI; the operator's default multiplexer
    // image is the one imported.
    let created = Instant::now();
    create_pool(
        &client,
        &ns.name,
        POOL,
        json!({
            "model": { "id": MODEL },
            "gpu": { "type": "nvidia-l4" },
            "replicas": 2,
            // Each call holds its permit long enough for a burst to meet the budget.
            "tei": { "image": images["tei-sim"].1, "extraArgs": ["--fixed-latency=100ms"] },
            "concurrency": { "maxInFlight": 2, "maxQueued": 0 },
            "template": pool_template(),
        }),
    )
    .await;
    let selector = labels::pool_selector(POOL);
    let pool_pods = wait_ready_pods(&pods, &selector, 2).await;
    let pods_ready = created.elapsed();
    wait_until_ready(&client, &ns.name, POOL).await;
    for pod in &pool_pods {
        let name = pod.metadata.name.as_deref().unwrap();
        assert_eq!(node_of(pod), Some(NODE), "{name} runs on the real node");
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("real-multiplexer"), "{name}'s identity");
        let image = |container: &str| spec.containers.iter().find(|c| c.name == container)?.image.clone();
        assert_eq!(image("tei"), Some(images["tei-sim"].1.clone()), "{name}");
        assert_eq!(image("multiplexer"), Some(images["multiplexer"].1.clone()), "{name}");
        assert_eq!(restarts(pod), 0, "{name}");
    }
    // The sidecars found their pool with their own ServiceAccount: each has its share, 2 over 2.
    for pod in &pool_pods {
        let ip = ip_of(pod);
        eventually(&format!("the sidecar on {ip} applying its share"), Duration::from_secs(30), || async {
            (limit_in_flight(ip, POOL).await? == 1.0).then_some(())
        })
        .await;
    }
    // A real Prometheus scraping this namespace's pods through Kubernetes service discovery, with
    // docs/operating.md's scrape jobs and the shipped alert rules; it scrapes while steps 3 and 4
    // call the pool, and is read after them.
    let prometheus = Prometheus::scraping("real-pods", &ns.name).await;

    // 3. Stock tei.v1 calls from the host, through the pool's ClusterIP Service and kube-proxy.
    let service = service_addr(&client, &ns.name, POOL).await;
    let service_ip = service.ip();
    let channel = answering_channel(service).await;
    let info = InfoClient::new(channel.clone()).info(InfoRequest {}).await.expect("tei.v1.Info/Info").into_inner();
    assert_eq!(info.model_id, MODEL);
    embed(channel.clone(), "a real pod".into()).await.expect("tei.v1.Embed/Embed");

    // A burst beyond the budget (2 in flight, no queue) on one connection: the calls beyond it wait
    // at the pool's door and go in as calls finish, instead of most being refused at once (before
    // the door, 22 of 24 were); one still waiting when the queue timeout passes is refused.
    let burst: Vec<_> = (0..24).map(|i| tokio::spawn(embed(channel.clone(), format!("burst {i}")))).collect();
    let (mut ok, mut exhausted) = (0, 0);
    for call in burst {
        match call.await.unwrap() {
            Ok(()) => ok += 1,
            Err(status) if status.code() == Code::ResourceExhausted => exhausted += 1,
            Err(status) => panic!("a burst call failed otherwise: {status:?}"),
        }
    }
    println!("burst of 24 over a budget of 2: {ok} OK, {exhausted} RESOURCE_EXHAUSTED");
    assert!(ok > exhausted, "{ok} OK, {exhausted} RESOURCE_EXHAUSTED");

    // TEI's HTTP API through the same Service, on its `http` port.
    let http = SocketAddr::new(service_ip, ports::MULTIPLEXER_HTTP);
    let (status, body) = post_json(http, "/embed", &json!({ "inputs": ["a real pod", "over HTTP"] })).await;
    assert_eq!(status, 200, "POST /embed through the Service: {body}");
    let vectors: Vec<Vec<f32>> = serde_json::from_str(&body).expect("TEI's /embed answer: one vector per input");
    assert_eq!(vectors.len(), 2, "{body}");
    assert!(vectors.iter().all(|v| !v.is_empty()), "{body}");

    // 4. No way around the multiplexer: TEI listens on its pod's loopback, so its ports refuse
    // connections from the host and from other pods, while the sidecar's take them.
    let target = ip_of(&pool_pods[0]);
    for port in [ports::TEI_GRPC, ports::TEI_METRICS] {
        let outcome = connect_outcome(SocketAddr::new(target, port)).await;
        assert_eq!(outcome, Err(ErrorKind::ConnectionRefused), "TEI's port {port} from the host");
    }
    for port in [ports::MULTIPLEXER_GRPC, ports::MULTIPLEXER_HTTP, ports::MULTIPLEXER_ADMIN] {
        assert_eq!(connect_outcome(SocketAddr::new(target, port)).await, Ok(()), "the sidecar's port {port}");
    }
    // The kubelet probes TEI through the sidecar; it is what made the pods Ready above.
    let tei_health_body = http_get(SocketAddr::new(target, ports::MULTIPLEXER_ADMIN), tei_health::PATH).await;
    assert_eq!(tei_health_body.as_deref(), Some("TEI serving\n"));
    // TEI's own metrics, out of reach on its loopback port, are relayed by the sidecar.
    let tei_metrics = http_get(SocketAddr::new(target, ports::MULTIPLEXER_ADMIN), tei_health::METRICS_PATH).await;
    assert!(tei_metrics.as_deref().is_some_and(|m| m.contains("te_request_count")), "{tei_metrics:?}");
    // From another pod: one client dialling TEI's port directly, one dialling the sidecar's.
    let direct = "client-to-tei";
    let through = "client-to-sidecar";
    for (name, port) in [(direct, ports::TEI_GRPC), (through, ports::MULTIPLEXER_GRPC)] {
        let upstream = format!("http://{}", SocketAddr::new(target, port));
        pods.create(&PostParams::default(), &client_pod(name, &images["multiplexer"].1, &upstream))
            .await
            .expect("a client pod in the restricted namespace");
    }
    let refused = upstream_health_seen_by(&pods, direct).await;
    println!("a pod dialling TEI's port {}: {refused:?}", ports::TEI_GRPC);
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.body.contains("Connection refused"), "{refused:?}");
    let served = upstream_health_seen_by(&pods, through).await;
    assert_eq!(served.status, 200, "the same pod network reaches the sidecar: {served:?}");
    for name in [direct, through] {
        pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
            .await
            .expect("client pod deleted");
    }
    // Where NetworkPolicies are enforced, the pool's own closes every other port too.
    let policy = Api::<NetworkPolicy>::namespaced(client.clone(), &ns.name).get(POOL).await.expect("the pool's policy");
    let owner = policy.metadata.owner_references.unwrap_or_default();
    assert!(owner.iter().any(|o| o.kind == "EmbeddingPool" && o.name == POOL), "owned by the pool: {owner:?}");

    // What Prometheus makes of the serving pool: every target up, the sidecars' and the
    // operator's series with the pool's labels, the shipped rules loaded and healthy, no alert.
    if let Some(prometheus) = prometheus {
        let checked = Instant::now();
        let pool_pod_names: Vec<String> = pool_pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
        let operator_pod = operator.metadata.name.as_deref().expect("the operator's pod name");
        check_healthy_pool(&prometheus, &ns.name, POOL, operator_pod, &pool_pod_names).await;
        println!("Prometheus checks passed in {:?}", checked.elapsed());
    }

    // 5. A budget edit reaches the running sidecars within seconds, without restarting a pod.
    Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name)
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "concurrency": { "maxInFlight": 12, "maxQueued": 32 } } })),
        )
        .await
        .expect("the budget patched");
    let edited = Instant::now();
    for pod in &pool_pods {
        let ip = ip_of(pod);
        eventually(&format!("the new share at the sidecar on {ip}"), Duration::from_secs(30), || async {
            (limit_in_flight(ip, POOL).await? == 6.0).then_some(())
        })
        .await;
    }
    let edit_applied = edited.elapsed();
    for pod in &pool_pods {
        let name = pod.metadata.name.as_deref().unwrap();
        let now = pods.get(name).await.expect("the same pod still runs");
        assert_eq!(now.metadata.uid, pod.metadata.uid, "{name}");
        assert_eq!(restarts(&now), 0, "{name} restarted");
    }

    // 5b. Adaptive: each sidecar finds its own limit under its share, and the operator, asking the
    // sidecars' admin ports from its pod, writes the pool-wide summary into status.
    Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name)
        .patch(POOL, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "concurrency": { "adaptive": true } } })))
        .await
        .expect("adaptive switched on");
    let pools = Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name);
    // The operator asks at once on the edit, and again every refresh (30 s) for adaptive pools,
    // so a sidecar that had not switched yet at the first ask is counted at the next.
    // Without load the limits stay where an adaptive limit starts, a quarter of the share (6 / 4,
    // rounded down), so the summary shows the sidecars' adaptive limits, not their shares.
    let effective = eventually("status.admission.effective: both sidecars' adaptive limits", START, || async {
        let pool = pools.get(POOL).await.ok()?;
        let effective = pool.status?.admission?.effective?;
        (effective.replicas_reporting == 2 && effective.max_in_flight < 6).then_some(effective)
    })
    .await;
    println!("status.admission.effective with adaptive limits: {effective:?}");
    assert_eq!(
        (effective.total_in_flight, effective.min_in_flight, effective.max_in_flight, effective.standing_queues),
        (2, 1, 1, 0),
        "{effective:?}"
    );

    // 6. A pod deleted under steady load, then a rollout under load: one client without retries,
    // one retrying UNAVAILABLE. The victim is a pod the load reaches (its sidecar counts the calls).
    let (plain, retrying) = under_load(service, async {
        let mut served = Vec::new();
        for pod in &pool_pods {
            served.push((requests_total(ip_of(pod)).await.unwrap_or(0.0), pod.metadata.name.clone().unwrap()));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (count, pod) in &mut served {
            let now = pods.get(pod).await.expect("pool pod");
            *count = requests_total(ip_of(&now)).await.unwrap_or(0.0) - *count;
        }
        served.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (count, victim) = served.pop().unwrap();
        assert!(count > 0.0, "the load reaches a pool pod: {served:?}");
        pods.delete(&victim, &DeleteParams::default()).await.expect("pod deleted");
        let deleted = Instant::now();
        eventually(&format!("{victim} gone"), START, || async {
            pods.get_opt(&victim).await.ok()?.is_none().then_some(())
        })
        .await;
        let gone = deleted.elapsed();
        wait_ready_pods(&pods, &selector, 2).await;
        println!(
            "deleted {victim} (serving the load): gone after {gone:?}, replacement Ready after {:?}",
            deleted.elapsed()
        );
    })
    .await;
    println!("pod deleted under load: without retries {plain:?}; retrying UNAVAILABLE {retrying:?}");
    assert!(plain.ok > 0 && retrying.ok > 0, "{plain:?} {retrying:?}");
    assert!(retrying.failed.is_empty(), "a client retrying UNAVAILABLE loses none: {retrying:?}");

    let before: Vec<_> = pods.list(&ListParams::default().labels(&selector)).await.unwrap().items;
    let (plain, retrying) = under_load(service, async {
        // A new TEI argument changes the pod template: the Deployment replaces the pods one by one.
        Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name)
            .patch(
                POOL,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "tei": { "extraArgs": ["--fixed-latency=50ms"] } } })),
            )
            .await
            .expect("the pool patched");
        let rolled = Instant::now();
        eventually("the rollout replacing both pods", START, || async {
            let list = pods.list(&ListParams::default().labels(&selector)).await.ok()?.items;
            let fresh = list.iter().all(|p| before.iter().all(|b| b.metadata.uid != p.metadata.uid));
            (fresh && list.len() == 2 && list.iter().all(is_ready)).then_some(())
        })
        .await;
        println!("rollout of 2 pods done in {:?}", rolled.elapsed());
    })
    .await;
    println!("rollout under load: without retries {plain:?}; retrying UNAVAILABLE {retrying:?}");
    assert!(plain.ok > 0 && retrying.ok > 0, "{plain:?} {retrying:?}");
    assert!(retrying.failed.is_empty(), "a client retrying UNAVAILABLE loses none: {retrying:?}");

    // 7. Deleting the pool removes everything it made.
    Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name)
        .delete(POOL, &DeleteParams::default())
        .await
        .expect("pool deleted");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns.name);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns.name);
    eventually("the pool's Deployment, Service, NetworkPolicy, ServiceAccount and pods gone", START, || async {
        let gone = deployments.get_opt(POOL).await.ok()?.is_none()
            && services.get_opt(POOL).await.ok()?.is_none()
            && policies.get_opt(POOL).await.ok()?.is_none()
            && accounts.get_opt("real-multiplexer").await.ok()?.is_none()
            && pods.list(&ListParams::default().labels(&selector)).await.ok()?.items.is_empty();
        gone.then_some(())
    })
    .await;
    let operator_now = pods.get(operator.metadata.name.as_deref().unwrap()).await.expect("the operator still runs");
    assert_eq!(restarts(&operator_now), 0, "the operator restarted");

    let (ok, output) = helm(&["uninstall", RELEASE, "-n", &ns.name, "--wait", "--timeout", "60s"]);
    assert!(ok, "{output}");
    println!(
        "timings: images imported in {imported:?}; operator Ready {operator_ready:?} after the start; \
         pool pods Ready {pods_ready:?} after the pool was created; budget edit at both sidecars in \
         {edit_applied:?}; whole test {:?}",
        started.elapsed()
    );
}
