//! The pods the operator renders satisfy the `restricted` Pod Security Standard, checked by the
//! real API server's admission in an enforcing namespace.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use teifleet_crds::{EmbeddingPool, GpuType};
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::{FIELD_MANAGER, Operator, admin_client, install_crd, test_namespace_with_labels};
use teifleet_operator::render::{RenderConfig, render};

fn restricted() -> BTreeMap<String, String> {
    [("pod-security.kubernetes.io/enforce", "restricted"), ("pod-security.kubernetes.io/enforce-version", "latest")]
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .into()
}

#[tokio::test]
async fn rendered_pods_for_every_gpu_type_pass_a_restricted_dry_run() {
    let client = admin_client().await;
    let ns = test_namespace_with_labels("psa", restricted()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };

    for gpu in GpuType::ALL {
        let mut pool: EmbeddingPool = serde_json::from_value(json!({
            "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
            "metadata": { "name": format!("psa-{gpu}"), "namespace": ns.name, "uid": "00000000-0000-4000-8000-000000000000" },
            "spec": { "model": { "id": "BAAI/bge-small-en-v1.5" }, "replicas": 1 },
        }))
        .unwrap();
        pool.spec.gpu.type_ = gpu;
        let children = render(&pool, &RenderConfig::default(), None).unwrap();
        // The ServiceAccount must exist for admission to accept the pod.
        let mut account = children.service_account.clone();
        account.metadata.owner_references = None;
        Api::<ServiceAccount>::namespaced(client.clone(), &ns.name)
            .patch(
                account.metadata.name.as_deref().unwrap(),
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&account),
            )
            .await
            .unwrap();
        let template = children.deployment.spec.unwrap().template;
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("psa-{gpu}")),
                ..template.metadata.unwrap_or_default()
            },
            spec: template.spec,
            ..Pod::default()
        };
        pods.create(&dry_run, &pod).await.unwrap_or_else(|e| panic!("{gpu} pod refused under restricted: {e}"));
    }

    // The namespace really enforces: a pod without a hardened security context is refused.
    let plain: Pod = serde_json::from_value(json!({
        "metadata": { "name": "plain" },
        "spec": { "containers": [{ "name": "c", "image": "busybox" }] },
    }))
    .unwrap();
    let error = pods.create(&dry_run, &plain).await.expect_err("an unhardened pod must be refused");
    assert!(error.to_string().contains("violates PodSecurity \"restricted:latest\""), "{error}");
}

#[tokio::test]
async fn a_pool_in_a_restricted_namespace_gets_its_pods() {
    let client = admin_client().await;
    install_crd(&client).await;
    let ns = test_namespace_with_labels("psa-live", restricted()).await;
    let _operator = Operator::start("psa");
    create_pool(&client, &ns.name, "locked-down", json!({ "gpu": { "type": "nvidia-l4" }, "replicas": 1 })).await;
    wait_until_ready(&client, &ns.name, "locked-down").await;
}
