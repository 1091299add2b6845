//! The operator against the real control plane: rendering lands on the right GPU nodes, status is
//! honest, budgets change live, garbage collection, crash recovery and quiet resyncs.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event, Node, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use teifleet_crds::EmbeddingPool;
use teifleet_crds::conditions::reasons;
use teifleet_e2e::pools::{create_pool, deployment, pool_pods, wait_for_ready_reason, wait_until_ready};
use teifleet_e2e::{FakeNode, Operator, TestNamespace, admin_client, eventually, install_crd, kubectl, test_namespace};

async fn setup(prefix: &str) -> (Client, TestNamespace) {
    let client = admin_client().await;
    install_crd(&client).await;
    let ns = test_namespace(prefix).await;
    (client, ns)
}

async fn node_product(client: &Client, node: &str) -> Option<String> {
    let node = Api::<Node>::all(client.clone()).get(node).await.ok()?;
    node.labels().get("nvidia.com/gpu.product").cloned()
}

#[tokio::test]
async fn pool_becomes_a_gpu_scheduled_deployment_with_its_sidecar() {
    let (client, ns) = setup("render").await;
    let _operator = Operator::start("render");

    create_pool(&client, &ns.name, "l4-pool", json!({ "gpu": { "type": "nvidia-l4" }, "replicas": 2 })).await;
    create_pool(&client, &ns.name, "h100-pool", json!({ "gpu": { "type": "nvidia-h100-80gb" }, "replicas": 1 })).await;

    for (pool, tag, product) in
        [("l4-pool", "89-1.9-grpc", "NVIDIA-L4"), ("h100-pool", "hopper-1.9-grpc", "NVIDIA-H100-80GB-HBM3")]
    {
        let ready = wait_until_ready(&client, &ns.name, pool).await;
        let deployment = deployment(&client, &ns.name, pool).await;
        let pod_spec = deployment.spec.unwrap().template.spec.unwrap();
        let tei = &pod_spec.containers[0];
        assert_eq!(tei.name, "tei");
        assert_eq!(tei.image.as_deref(), Some(format!("ghcr.io/huggingface/text-embeddings-inference:{tag}").as_str()));
        let limits = tei.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["nvidia.com/gpu"].0, "1");
        let sidecar = &pod_spec.containers[1];
        assert_eq!(sidecar.name, "multiplexer");
        let env = sidecar.env.as_ref().unwrap();
        assert!(env.iter().any(|e| e.name == "TEIFLEET_POOL" && e.value.as_deref() == Some(pool)));
        assert!(sidecar.ports.as_ref().unwrap().iter().any(|p| p.container_port == 50051));

        // Pods run only on nodes of the requested GPU product.
        let pods = pool_pods(&client, &ns.name, pool).await;
        assert_eq!(pods.len(), usize::try_from(ready.spec.replicas.unwrap()).unwrap());
        for pod in pods {
            let node = pod.spec.unwrap().node_name.expect("pod scheduled");
            assert_eq!(node_product(&client, &node).await.as_deref(), Some(product), "{pool} pod on {node}");
        }

        // Everything else the pool owns exists and is owned by it.
        let owner_uid = ready.uid().unwrap();
        let owned_by_pool = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
            refs.iter().any(|r| r.uid == owner_uid && r.controller == Some(true))
        };
        let services = Api::<Service>::namespaced(client.clone(), &ns.name);
        for name in [pool.to_owned(), format!("{pool}-peers")] {
            let service = services.get(&name).await.expect("service exists");
            assert!(owned_by_pool(service.owner_references()));
        }
        let peers = services.get(&format!("{pool}-peers")).await.unwrap();
        assert_eq!(peers.spec.unwrap().cluster_ip.as_deref(), Some("None"));
        let account = format!("{pool}-multiplexer");
        assert!(owned_by_pool(
            Api::<ServiceAccount>::namespaced(client.clone(), &ns.name).get(&account).await.unwrap().owner_references()
        ));
        assert!(owned_by_pool(
            Api::<Role>::namespaced(client.clone(), &ns.name).get(&account).await.unwrap().owner_references()
        ));
        assert!(owned_by_pool(
            Api::<RoleBinding>::namespaced(client.clone(), &ns.name).get(&account).await.unwrap().owner_references()
        ));
        let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns.name).get_opt(pool).await.unwrap();
        assert_eq!(
            pdb.is_some(),
            ready.spec.replicas.unwrap() > 1,
            "{pool}: PodDisruptionBudget only above one replica"
        );
    }

    // `kubectl get` shows the printer columns.
    let (ok, table) = kubectl(&["get", "epool", "-n", &ns.name]);
    assert!(ok, "{table}");
    for column in
        ["MODEL", "GPU", "REPLICAS", "READY", "STATUS", "IN-FLIGHT", "AGE", "nvidia-h100-80gb", "AllReplicasReady"]
    {
        assert!(table.contains(column), "{column} missing in {table}");
    }
}

#[tokio::test]
async fn insufficient_gpu_is_reported_and_clears_when_capacity_arrives() {
    let (client, ns) = setup("gpu").await;
    let _operator = Operator::start("gpu");

    // Two replicas of two A100s each, and no A100 node at all yet.
    create_pool(&client, &ns.name, "a100", json!({ "gpu": { "type": "nvidia-a100-80gb", "count": 2 }, "replicas": 2 }))
        .await;
    let pool = wait_for_ready_reason(&client, &ns.name, "a100", "False", reasons::INSUFFICIENT_GPU).await;
    let ready = teifleet_crds::conditions::find(&pool.status.as_ref().unwrap().conditions, "Ready").unwrap().clone();
    assert!(ready.message.contains("nvidia-a100-80gb"), "{}", ready.message);
    assert!(
        ready
            .message
            .contains("no node carries nvidia.com/gpu.product in [NVIDIA-A100-SXM4-80GB, NVIDIA-A100-80GB-PCIe]"),
        "{}",
        ready.message
    );
    assert!(teifleet_crds::conditions::is_true(&pool.status.unwrap().conditions, "Degraded"));
    let (ok, table) = kubectl(&["get", "epool", "a100", "-n", &ns.name]);
    assert!(ok && table.contains("InsufficientGPU"), "{table}");

    // One node with room for a single replica: the real scheduler still leaves one Pending.
    let _first = FakeNode::create(&client, "e2e-a100-0", "NVIDIA-A100-SXM4-80GB", 2).await;
    eventually("one replica scheduled on the new node", Duration::from_secs(30), || async {
        let pods = pool_pods(&client, &ns.name, "a100").await;
        let placed =
            pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("e2e-a100-0")).count();
        (placed == 1).then_some(())
    })
    .await;
    wait_for_ready_reason(&client, &ns.name, "a100", "False", reasons::INSUFFICIENT_GPU).await;
    // Now the product exists and its GPUs are taken: the message says so.
    let pools = Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name);
    eventually("InsufficientGPU to say the GPUs are taken", Duration::from_secs(30), || async {
        let pool = pools.get("a100").await.ok()?;
        let ready = teifleet_crds::conditions::find(&pool.status?.conditions, "Ready")?.clone();
        (ready.reason == reasons::INSUFFICIENT_GPU && ready.message.contains("all nvidia-a100-80gb GPUs are taken"))
            .then_some(())
    })
    .await;

    // Enough capacity clears the condition.
    let _second = FakeNode::create(&client, "e2e-a100-1", "NVIDIA-A100-80GB-PCIe", 4).await;
    wait_until_ready(&client, &ns.name, "a100").await;

    // The events are published after the status they report is written: looked for until they
    // are there (a CI run listed them the moment the pool was Ready and found AllReplicasReady
    // not yet recorded).
    let events = Api::<Event>::namespaced(client.clone(), &ns.name);
    let reasons_seen = || async {
        let listed = events.list(&ListParams::default().fields("involvedObject.name=a100")).await.ok()?;
        Some(listed.items.iter().filter_map(|e| e.reason.clone()).collect::<BTreeSet<_>>())
    };
    eventually("InsufficientGPU and AllReplicasReady published", Duration::from_secs(30), || async {
        let seen = reasons_seen().await?;
        (seen.contains(reasons::INSUFFICIENT_GPU) && seen.contains(reasons::ALL_REPLICAS_READY)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn concurrency_edits_apply_live_and_kubectl_scale_works() {
    let (client, ns) = setup("budget").await;
    let _operator = Operator::start("budget");
    create_pool(
        &client,
        &ns.name,
        "cpu",
        json!({ "gpu": { "type": "cpu" }, "replicas": 2, "concurrency": { "maxInFlight": 10, "maxQueued": 20 } }),
    )
    .await;
    let pool = wait_until_ready(&client, &ns.name, "cpu").await;
    let admission = pool.status.unwrap().admission.unwrap();
    assert_eq!((admission.in_flight_per_replica, admission.queued_per_replica), (5, 10));
    let pods_before: BTreeSet<String> =
        pool_pods(&client, &ns.name, "cpu").await.iter().map(|p| p.name_any()).collect();

    let api = Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name);
    let edited = Instant::now();
    api.patch(
        "cpu",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "concurrency": { "maxInFlight": 40 } } })),
    )
    .await
    .unwrap();
    eventually("the new share in status", Duration::from_secs(10), || async {
        let pool = api.get("cpu").await.ok()?;
        (pool.status?.admission?.in_flight_per_replica == 20).then_some(())
    })
    .await;
    println!("budget edit reached status in {:?}", edited.elapsed());
    let pods_after: BTreeSet<String> = pool_pods(&client, &ns.name, "cpu").await.iter().map(|p| p.name_any()).collect();
    assert_eq!(pods_before, pods_after, "a budget edit must not restart pods");

    let (ok, output) = kubectl(&["scale", "epool/cpu", "-n", &ns.name, "--replicas=4"]);
    assert!(ok, "{output}");
    let scaled = wait_until_ready(&client, &ns.name, "cpu").await;
    let status = scaled.status.unwrap();
    assert_eq!((status.replicas, status.ready_replicas), (4, 4));
    assert_eq!(status.admission.unwrap().in_flight_per_replica, 10);
    assert_eq!(deployment(&client, &ns.name, "cpu").await.spec.unwrap().replicas, Some(4));
    let (ok, output) =
        kubectl(&["get", "epool/cpu", "-n", &ns.name, "--subresource=scale", "-o", "jsonpath={.status.selector}"]);
    assert!(ok && output.contains("teifleet.dev/pool=cpu"), "{output}");
}

#[tokio::test]
async fn deleting_the_pool_removes_everything_it_created() {
    let (client, ns) = setup("gc").await;
    let _operator = Operator::start("gc");
    create_pool(&client, &ns.name, "doomed", json!({ "gpu": { "type": "cpu" }, "replicas": 2 })).await;
    wait_until_ready(&client, &ns.name, "doomed").await;
    assert!(
        Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns.name).get_opt("doomed").await.unwrap().is_some()
    );

    Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name)
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    eventually("every child to be garbage collected", Duration::from_secs(60), || async {
        let ns = ns.name.as_str();
        let lp = ListParams::default().labels("teifleet.dev/pool=doomed");
        let left = Api::<Deployment>::namespaced(client.clone(), ns).list(&lp).await.ok()?.items.len()
            + Api::<Service>::namespaced(client.clone(), ns).list(&lp).await.ok()?.items.len()
            + Api::<ServiceAccount>::namespaced(client.clone(), ns).list(&lp).await.ok()?.items.len()
            + Api::<Role>::namespaced(client.clone(), ns).list(&lp).await.ok()?.items.len()
            + Api::<RoleBinding>::namespaced(client.clone(), ns).list(&lp).await.ok()?.items.len()
            + Api::<PodDisruptionBudget>::namespaced(client.clone(), ns).list(&lp).await.ok()?.items.len()
            + Api::<ReplicaSet>::namespaced(client.clone(), ns).list(&lp).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn killed_operator_restarts_and_converges_without_duplicates() {
    let (client, ns) = setup("crash").await;
    // The pools exist before the operator starts, so the kill lands in the middle of its work.
    for name in ["a", "b", "c"] {
        create_pool(&client, &ns.name, name, json!({ "gpu": { "type": "cpu" }, "replicas": 2 })).await;
    }
    let mut first = Operator::start("crash-1");
    eventually("the first operator to start applying", Duration::from_secs(20), || async {
        let n = Api::<ServiceAccount>::namespaced(client.clone(), &ns.name)
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=teifleet-operator"))
            .await
            .ok()?
            .items
            .len();
        (n > 0).then_some(())
    })
    .await;
    first.kill();

    let second = Operator::start("crash-2");
    for name in ["a", "b", "c"] {
        wait_until_ready(&client, &ns.name, name).await;
    }
    assert!(second.log_text().contains("became leader"));
    let lp = ListParams::default().labels("app.kubernetes.io/managed-by=teifleet-operator");
    let count = |n: usize, what: &str| assert_eq!(n, 3, "expected exactly one {what} per pool");
    count(Api::<Deployment>::namespaced(client.clone(), &ns.name).list(&lp).await.unwrap().items.len(), "Deployment");
    count(
        Api::<ReplicaSet>::namespaced(client.clone(), &ns.name).list(&ListParams::default()).await.unwrap().items.len(),
        "ReplicaSet",
    );
    count(
        Api::<ServiceAccount>::namespaced(client.clone(), &ns.name).list(&lp).await.unwrap().items.len(),
        "ServiceAccount",
    );
    count(
        Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns.name).list(&lp).await.unwrap().items.len(),
        "PodDisruptionBudget",
    );
    assert_eq!(Api::<Service>::namespaced(client.clone(), &ns.name).list(&lp).await.unwrap().items.len(), 6);
    for name in ["a", "b", "c"] {
        assert_eq!(pool_pods(&client, &ns.name, name).await.len(), 2, "pool {name} has exactly its replicas");
    }
}

/// resourceVersions of the pool and everything it owns.
async fn versions(client: &Client, ns: &str, pool: &str) -> Vec<(String, String)> {
    let lp = ListParams::default().labels(&format!("teifleet.dev/pool={pool}"));
    let mut all = Vec::new();
    let pool_obj = Api::<EmbeddingPool>::namespaced(client.clone(), ns).get(pool).await.unwrap();
    all.push(("EmbeddingPool".to_owned(), pool_obj.resource_version().unwrap()));
    macro_rules! collect {
        ($($kind:ty),*) => {$(
            for item in Api::<$kind>::namespaced(client.clone(), ns).list(&lp).await.unwrap().items {
                all.push((format!("{}/{}", stringify!($kind), item.name_any()), item.resource_version().unwrap()));
            }
        )*};
    }
    collect!(Deployment, Service, ServiceAccount, Role, RoleBinding, PodDisruptionBudget);
    all
}

#[tokio::test]
async fn resync_of_a_steady_pool_makes_no_writes() {
    let (client, ns) = setup("steady").await;
    teifleet_e2e::wait_for_other_test_namespaces_gone(&client, &ns.name).await;
    let operator =
        Operator::start_with("steady", &teifleet_e2e::kubeconfig_path(), "default", &["--resync-interval=500ms"]);
    create_pool(&client, &ns.name, "calm", json!({ "gpu": { "type": "nvidia-l4" }, "replicas": 2 })).await;
    wait_until_ready(&client, &ns.name, "calm").await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let before = versions(&client, &ns.name, "calm").await;
    let reconciles_before = operator.metric_sum("teifleet_operator_reconciliations_total").await.unwrap();
    let writes_before = operator.metric_sum("teifleet_operator_status_writes_total").await.unwrap();
    // Four resyncs (two seconds at 500 ms on an idle machine), however long a busy one takes.
    eventually("four resyncs of the steady pool", Duration::from_secs(60), || async {
        let reconciles = operator.metric_sum("teifleet_operator_reconciliations_total").await?;
        (reconciles >= reconciles_before + 4.0).then_some(())
    })
    .await;
    let after = versions(&client, &ns.name, "calm").await;
    let writes_after = operator.metric_sum("teifleet_operator_status_writes_total").await.unwrap();

    assert_eq!(writes_before, writes_after, "no status write for a steady pool");
    assert_eq!(before, after, "no object changed during steady resyncs");
}

#[tokio::test]
async fn only_one_operator_leads_and_a_standby_takes_over() {
    let client = admin_client().await;
    install_crd(&client).await;
    let mut first = Operator::start("leader-a");
    eventually("a leader", Duration::from_secs(20), || async {
        (first.metric_sum("teifleet_operator_leader").await? == 1.0).then_some(())
    })
    .await;
    let second = Operator::start("leader-b");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(second.metric_sum("teifleet_operator_leader").await, Some(0.0), "the standby must not lead");
    assert!(!second.log_text().contains("controller running"));

    let exit = first.terminate().expect("leader exits on SIGTERM");
    assert!(exit.success(), "graceful shutdown exits 0");
    assert!(first.log_text().contains("released the leader lease"));
    eventually("the standby to take over", Duration::from_secs(10), || async {
        (second.metric_sum("teifleet_operator_leader").await? == 1.0).then_some(())
    })
    .await;
}
