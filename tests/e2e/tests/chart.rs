//! The Helm chart installs, and the operator works using nothing but the chart ServiceAccount's
//! token: proof that the chart's RBAC is sufficient.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::{Operator, admin_client, cluster_tool, eventually, helm, install_crd, kubectl, test_namespace};

const RELEASE_NAMESPACE: &str = "teifleet-system";

#[tokio::test]
async fn chart_installs_and_the_operator_runs_on_its_serviceaccount_alone() {
    let client = admin_client().await;
    install_crd(&client).await;
    let _ = helm(&["uninstall", "teifleet", "-n", RELEASE_NAMESPACE, "--wait"]);

    let (ok, output) = helm(&[
        "install",
        "teifleet",
        "charts/teifleet",
        "-n",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "90s",
    ]);
    assert!(ok, "helm install failed: {output}");
    let (ok, output) = kubectl(&[
        "get",
        "deployment/teifleet-operator",
        "-n",
        RELEASE_NAMESPACE,
        "-o",
        "jsonpath={.status.readyReplicas}",
    ]);
    assert!(ok && output.trim() == "1", "the chart's operator Deployment is ready: {output}");

    // The pod kwok runs is only a stand-in: run the real binary with the chart's identity.
    let (ok, token) = kubectl(&["create", "token", "teifleet-operator", "-n", RELEASE_NAMESPACE, "--duration=1h"]);
    assert!(ok, "{token}");
    let kubeconfig = teifleet_e2e::token_kubeconfig("chart-operator", token.trim());
    let can_i = cluster_tool("kubectl", &kubeconfig, &["auth", "can-i", "list", "secrets", "-A"]);
    let (ok, output) = (can_i.status.success(), String::from_utf8_lossy(&can_i.stdout));
    assert!(!ok && output.trim() == "no", "the chart must not let the operator read Secrets: {output}");
    let can_create = cluster_tool("kubectl", &kubeconfig, &["auth", "can-i", "create", "secrets", "-n", "default"]);
    assert!(can_create.status.success(), "it creates each pool's peer Secret, and does nothing else with Secrets");

    let ns = test_namespace("chart").await;
    // The operator watches every namespace: earlier tests' pools must be gone with theirs before
    // it starts, or their teardown shows in its log.
    teifleet_e2e::wait_for_other_test_namespaces_gone(&client, &ns.name).await;
    let operator = Operator::start_with("chart", &kubeconfig, RELEASE_NAMESPACE, &["--lease-name=teifleet-operator"]);
    create_pool(&client, &ns.name, "rbac", json!({ "gpu": { "type": "nvidia-l4" }, "replicas": 2 })).await;
    wait_until_ready(&client, &ns.name, "rbac").await;

    // Events and the Lease were written with the chart's permissions too.
    let events = Api::<Event>::namespaced(client.clone(), &ns.name);
    eventually("an event from the operator", Duration::from_secs(10), || async {
        let list = events.list(&ListParams::default().fields("involvedObject.name=rbac")).await.ok()?;
        (!list.items.is_empty()).then_some(())
    })
    .await;
    let lease = Api::<Lease>::namespaced(client.clone(), RELEASE_NAMESPACE).get("teifleet-operator").await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("chart"));
    assert_eq!(
        operator.metric_sum("teifleet_operator_reconcile_errors_total").await,
        Some(0.0),
        "{}",
        operator.log_text()
    );
    assert!(!operator.log_text().contains("forbidden"), "{}", operator.log_text());

    drop(operator);
    let (ok, output) = helm(&["uninstall", "teifleet", "-n", RELEASE_NAMESPACE, "--wait"]);
    assert!(ok, "{output}");
}
