//! `spec.autoscaling` against the real control plane, on kwok's fake GPU nodes. No sidecar runs
//! there to report load, so this drives what needs none: the API server's refusals (one owner of
//! the replicas, `kubectl scale` and the scale subresource included), a new pool at its
//! `minReplicas` with `status.autoscaling` saying why, a steady autoscaled pool that is not
//! rewritten, and a `minReplicas` above the GPUs there are. Load-driven scaling runs on real pods
//! in real_autoscale.rs.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Api, Client};
use serde_json::{Value, json};
use teifleet_crds::EmbeddingPool;
use teifleet_crds::conditions::reasons;
use teifleet_e2e::pools::{create_pool, deployment, pool_pods, wait_for_ready_reason, wait_until_ready};
use teifleet_e2e::{
    FakeNode, Operator, TestNamespace, admin_client, eventually, install_crd, kubeconfig_path, kubectl, log_dir,
    repo_root, test_namespace,
};

/// What the API server says when something other than the autoscaler writes the replicas.
const ONE_OWNER: &str = "spec.autoscaling owns this pool's replicas";

async fn setup(prefix: &str) -> (Client, TestNamespace) {
    let client = admin_client().await;
    install_crd(&client).await;
    let ns = test_namespace(prefix).await;
    (client, ns)
}

/// An A10G pool of 64 in flight, 16 per replica, sized by the autoscaler between 1 and 4. The
/// cluster's standing fake nodes carry no A10G: the test's own node holds all there are.
fn autoscaled() -> Value {
    json!({
        "gpu": { "type": "nvidia-a10g" },
        "replicas": null,
        "concurrency": { "maxInFlight": 64, "maxInFlightPerReplica": 16 },
        "autoscaling": { "minReplicas": 1, "maxReplicas": 4 },
    })
}

#[tokio::test]
async fn invalid_autoscaling_specs_are_refused_with_readable_messages() {
    let (client, ns) = setup("autoscale-crd").await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &ApiResource::erase::<EmbeddingPool>(&()));
    let spec = |patch: Value| {
        let mut spec = json!({ "model": { "id": "BAAI/bge-small-en-v1.5" } });
        let base = autoscaled();
        for (key, value) in base.as_object().unwrap().iter().chain(patch.as_object().unwrap()) {
            spec[key] = value.clone();
        }
        spec.as_object_mut().unwrap().retain(|_, value| !value.is_null());
        spec
    };
    let pool = |name: &str, spec: Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool", "metadata": { "name": name }, "spec": spec,
        }))
        .unwrap()
    };
    let cases = [
        (json!({ "replicas": 2 }), ONE_OWNER),
        (json!({ "concurrency": { "maxInFlight": 64 } }), "spec.autoscaling needs concurrency.maxInFlightPerReplica"),
        (
            json!({ "autoscaling": { "minReplicas": 5, "maxReplicas": 4 } }),
            "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
        ),
        (
            json!({ "autoscaling": { "minReplicas": -1, "maxReplicas": 4 } }),
            "autoscaling.minReplicas must be 0 or more",
        ),
        (
            json!({ "autoscaling": { "maxReplicas": 0, "minReplicas": 0 } }),
            "autoscaling.maxReplicas must be at least 1",
        ),
        (
            json!({ "autoscaling": { "maxReplicas": 4, "targetUtilizationPercent": 5 } }),
            "autoscaling.targetUtilizationPercent must be between 10 and 100",
        ),
        (
            json!({ "autoscaling": { "maxReplicas": 4, "scaleDownStabilization": "soon" } }),
            "autoscaling.scaleDownStabilization must be a duration such as 5m",
        ),
    ];
    for (index, (patch, message)) in cases.into_iter().enumerate() {
        let name = format!("invalid-{index}");
        let error = api
            .create(&PostParams::default(), &pool(&name, spec(patch.clone())))
            .await
            .expect_err(&format!("{patch} must be refused"));
        assert!(error.to_string().contains(message), "{patch}: expected {message:?} in {error}");
    }
    let accepted = api.create(&PostParams::default(), &pool("valid", spec(json!({})))).await.expect("accepted");
    assert_eq!(
        accepted.data["spec"]["autoscaling"],
        json!({ "minReplicas": 1, "maxReplicas": 4, "targetUtilizationPercent": 70, "scaleUpStabilization": "0s",
                "scaleDownStabilization": "5m", "scaleToZeroAfter": "10m", "coldStartHold": "60s" }),
        "the defaults"
    );
}

#[tokio::test]
async fn an_autoscaled_pool_starts_at_its_minimum_owns_its_replicas_and_stays_quiet() {
    let (client, ns) = setup("autoscale").await;
    teifleet_e2e::wait_for_other_test_namespaces_gone(&client, &ns.name).await;
    // GPUs for two replicas.
    let _node = FakeNode::create(&client, "e2e-autoscale-a10g", "NVIDIA-A10G", 2).await;
    let operator = Operator::start_with("autoscale", &kubeconfig_path(), "default", &["--resync-interval=500ms"]);
    create_pool(&client, &ns.name, "elastic", autoscaled()).await;

    // At minReplicas, saying why: kwok's pods run no sidecar to report a load.
    let api = Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name);
    let pool = eventually("the autoscaler's status", Duration::from_secs(60), || async {
        let pool = api.get("elastic").await.ok()?;
        let autoscaling = pool.status.as_ref()?.autoscaling.as_ref()?;
        (autoscaling.message == "no sidecar reported its load").then_some(pool)
    })
    .await;
    let autoscaling = pool.status.unwrap().autoscaling.unwrap();
    assert_eq!((autoscaling.desired_replicas, autoscaling.recommended_replicas), (1, 1));
    assert_eq!(autoscaling.last_scale_time, None, "starting at minReplicas is no scaling");
    assert_eq!(autoscaling.last_call_time, None, "only a pool that may scale to zero counts calls");
    let pool = wait_until_ready(&client, &ns.name, "elastic").await;
    assert_eq!(pool.spec.replicas, None);
    assert_eq!(deployment(&client, &ns.name, "elastic").await.spec.unwrap().replicas, Some(1));
    let metrics = operator.metrics().await.unwrap();
    let desired = format!("teifleet_pool_desired_replicas{{namespace=\"{}\",pool=\"elastic\"}} 1", ns.name);
    assert!(metrics.contains(&desired), "{desired} missing in\n{metrics}");

    // One owner: the scale subresource (what kubectl scale and an HPA use) is refused.
    let error = api
        .patch_scale("elastic", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "replicas": 3 } })))
        .await
        .expect_err("the scale subresource must be refused while spec.autoscaling is set");
    assert!(error.to_string().contains(ONE_OWNER), "{error}");
    let (ok, output) = kubectl(&["scale", "epool/elastic", "-n", &ns.name, "--replicas=3"]);
    assert!(!ok && output.contains(ONE_OWNER), "{output}");
    println!("kubectl scale on an autoscaled pool: {}", output.trim());
    assert_eq!(deployment(&client, &ns.name, "elastic").await.spec.unwrap().replicas, Some(1));

    // Steady: looked at every 500 ms, written never.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reconciles_before = operator.metric_sum("teifleet_operator_reconciliations_total").await.unwrap();
    let writes_before = operator.metric_sum("teifleet_operator_status_writes_total").await.unwrap();
    let version_before = api.get("elastic").await.unwrap().metadata.resource_version;
    // Looked at four times (two seconds at 500 ms on an idle machine), however long a busy one takes.
    eventually("four looks at the steady pool", Duration::from_secs(60), || async {
        let reconciles = operator.metric_sum("teifleet_operator_reconciliations_total").await?;
        (reconciles >= reconciles_before + 4.0).then_some(())
    })
    .await;
    let writes_after = operator.metric_sum("teifleet_operator_status_writes_total").await.unwrap();
    assert_eq!(writes_before, writes_after, "no status write for a steady autoscaled pool");
    assert_eq!(api.get("elastic").await.unwrap().metadata.resource_version, version_before);

    // minReplicas 3 with GPUs for 2: asked for all the same, one pod waits, InsufficientGPU.
    api.patch(
        "elastic",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "autoscaling": { "minReplicas": 3 } } })),
    )
    .await
    .unwrap();
    let short = wait_for_ready_reason(&client, &ns.name, "elastic", "False", reasons::INSUFFICIENT_GPU).await;
    let autoscaling = short.status.unwrap().autoscaling.unwrap();
    assert_eq!(autoscaling.desired_replicas, 3);
    assert!(autoscaling.message.starts_with("no sidecar reported its load"), "{}", autoscaling.message);
    assert!(autoscaling.last_scale_time.is_some());
    assert_eq!(deployment(&client, &ns.name, "elastic").await.spec.unwrap().replicas, Some(3));
    assert_eq!(pool_pods(&client, &ns.name, "elastic").await.len(), 3);
    let events = eventually("the ScaledUp event", Duration::from_secs(30), || async {
        let events = Api::<Event>::namespaced(client.clone(), &ns.name)
            .list(&ListParams::default().fields("involvedObject.name=elastic"))
            .await
            .ok()?;
        events.items.iter().any(|event| event.reason.as_deref() == Some("ScaledUp")).then_some(events.items)
    })
    .await;
    let scaled = events.iter().find(|event| event.reason.as_deref() == Some("ScaledUp")).unwrap();
    assert_eq!(
        scaled.message.as_deref(),
        Some("Scaled up from 1 to 3: no sidecar reported its load; minReplicas is 3"),
        "{scaled:?}"
    );
    let reasons_seen: BTreeSet<_> = events.iter().filter_map(|event| event.reason.clone()).collect();
    assert!(reasons_seen.contains(reasons::INSUFFICIENT_GPU), "{reasons_seen:?}");

    // Sized by hand again: spec.replicas is accepted and the autoscaler's status goes.
    api.patch(
        "elastic",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "autoscaling": null, "replicas": 2 } })),
    )
    .await
    .expect("spec.replicas is accepted without spec.autoscaling");
    let by_hand = wait_until_ready(&client, &ns.name, "elastic").await;
    assert_eq!(by_hand.status.unwrap().autoscaling, None);
    assert_eq!(deployment(&client, &ns.name, "elastic").await.spec.unwrap().replicas, Some(2));
}

#[tokio::test]
async fn the_hpa_example_of_the_docs_is_accepted_by_the_api_server() {
    let (_client, ns) = setup("autoscale-hpa").await;
    let docs = std::fs::read_to_string(repo_root().join("docs/operating.md")).expect("docs/operating.md");
    let hpa = docs
        .split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .find(|block| block.contains("kind: HorizontalPodAutoscaler"))
        .expect("an HPA example in docs/operating.md");
    // The example names its own namespace; the test's replaces it.
    let hpa = hpa.replace("namespace: ml", &format!("namespace: {}", ns.name));
    let file = log_dir().join("operating-hpa.yaml");
    std::fs::write(&file, hpa).unwrap();
    let (ok, output) = kubectl(&["apply", "--dry-run=server", "-f", file.to_str().unwrap()]);
    assert!(ok && output.contains("created (server dry run)"), "{output}");
}

#[tokio::test]
async fn a_pool_that_may_scale_to_zero_starts_at_zero() {
    let (client, ns) = setup("autoscale-zero").await;
    let _operator = Operator::start("autoscale-zero");
    let mut spec = autoscaled();
    spec["autoscaling"]["minReplicas"] = json!(0);
    create_pool(&client, &ns.name, "sleeper", spec).await;
    let pool = wait_for_ready_reason(&client, &ns.name, "sleeper", "True", reasons::SCALED_TO_ZERO).await;
    let autoscaling = pool.status.unwrap().autoscaling.unwrap();
    assert_eq!((autoscaling.desired_replicas, autoscaling.recommended_replicas), (0, 0));
    assert_eq!(autoscaling.message, "scaled to zero, and no call held at the activator");
    assert_eq!(deployment(&client, &ns.name, "sleeper").await.spec.unwrap().replicas, Some(0));
    assert!(pool_pods(&client, &ns.name, "sleeper").await.is_empty());
}
