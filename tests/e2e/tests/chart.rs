//! The Helm chart installs, and the operator works using nothing but the chart ServiceAccount's
//! token: proof that the chart's RBAC is sufficient.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::{
    Operator, TestNamespace, admin_client, eventually, install_crd, kubeconfig_path, kubectl, repo_root,
};

const RELEASE_NAMESPACE: &str = "teifleet-system";

fn helm(args: &[&str]) -> (bool, String) {
    let cache = std::env::var("TEIFLEET_CACHE")
        .unwrap_or_else(|_| format!("{}/.cache/teifleet", std::env::var("HOME").unwrap_or_default()));
    let output = Command::new(format!("{cache}/current/helm"))
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("helm runs");
    (
        output.status.success(),
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)),
    )
}

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
    let (ok, output) = Command::new(format!("{}/.cache/teifleet/current/kubectl", std::env::var("HOME").unwrap()))
        .args(["--kubeconfig", kubeconfig.to_str().unwrap(), "auth", "can-i", "list", "secrets", "-A"])
        .output()
        .map(|o| (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned()))
        .unwrap();
    assert!(!ok && output.trim() == "no", "the chart must not grant Secrets: {output}");

    let operator = Operator::start_with("chart", &kubeconfig, RELEASE_NAMESPACE, &["--lease-name=teifleet-operator"]);
    let ns = TestNamespace::create(&client, "chart").await;
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
