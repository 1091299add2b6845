//! The Helm chart installs, and the operator works using nothing but the chart ServiceAccount's
//! token: proof that the chart's RBAC is sufficient. The batch API (`batch.enabled`), rendered
//! without a cluster: least privilege and a restricted pod, for either store.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde::Deserialize as _;
use serde_json::{Value, json};
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

/// `helm template` of the chart as `make chart-check` renders it, with `set` on top; no cluster.
fn template(set: &[&str]) -> Result<Vec<Value>, String> {
    let cache = std::env::var("TEIFLEET_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/teifleet"));
    let mut command = Command::new(cache.join("current/helm"));
    command.args([
        "template",
        "teifleet",
        "charts/teifleet",
        "--namespace",
        RELEASE_NAMESPACE,
        "--kube-version",
        "1.33.0",
    ]);
    for value in set {
        command.args(["--set", value]);
    }
    let output = command.current_dir(teifleet_e2e::repo_root()).output().expect("helm runs");
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let text = String::from_utf8(output.stdout).expect("helm prints UTF-8");
    Ok(serde_norway::Deserializer::from_str(&text)
        .map(|document| Value::deserialize(document).expect("helm prints YAML"))
        .filter(|object| !object.is_null())
        .collect())
}

/// The objects of the batch API, by kind.
fn batch_objects(objects: &[Value]) -> Vec<(&str, &Value)> {
    objects
        .iter()
        .filter(|object| object["metadata"]["labels"]["app.kubernetes.io/name"] == "teifleet-batch")
        .map(|object| (object["kind"].as_str().unwrap(), object))
        .collect()
}

fn one<'a>(objects: &[(&str, &'a Value)], kind: &str) -> &'a Value {
    let found: Vec<_> = objects.iter().filter(|(k, _)| *k == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    found[0].1
}

const PVC_STORE: [&str; 4] = [
    "batch.enabled=true",
    "batch.store.pvc.claimName=batch-files",
    "batch.store.pvc.path=openai/",
    "batch.auth.secretName=batch-keys",
];

#[test]
fn the_batch_api_is_off_unless_enabled_and_needs_one_store() {
    assert!(batch_objects(&template(&[]).unwrap()).is_empty(), "batch.enabled is false by default");
    let refused = |set: &[&str]| template(set).expect_err(&format!("{set:?} is refused"));
    assert!(refused(&["batch.enabled=true"]).contains("batch.enabled needs a store"));
    assert!(
        refused(&["batch.enabled=true", "batch.store.pvc.claimName=a", "batch.store.s3.bucket=bbb"])
            .contains("not both")
    );
    let plain_http = [
        "batch.enabled=true",
        "batch.store.s3.bucket=batches",
        "batch.store.s3.endpoint=http://minio.storage.svc:9000",
        "batch.store.s3.credentialsSecret=minio",
    ];
    assert!(refused(&plain_http).contains("set batch.store.s3.allowHttp=true"));
    assert!(
        refused(&["batch.enabled=true", "batch.store.pvc.claimName=a", "batch.store.pvc.path=../x"]).contains("path")
    );
}

#[test]
fn the_batch_api_holds_rights_on_jobs_and_pools_alone_in_its_namespace_and_runs_restricted() {
    let objects = template(&PVC_STORE).unwrap();
    let batch = batch_objects(&objects);
    let mut kinds: Vec<&str> = batch.iter().map(|(kind, _)| *kind).collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["Deployment", "NetworkPolicy", "Role", "RoleBinding", "Service", "ServiceAccount"]);
    for (kind, object) in &batch {
        assert_eq!(object["metadata"]["name"], "teifleet-batch", "{kind}");
        assert_eq!(object["metadata"]["namespace"], RELEASE_NAMESPACE, "{kind}");
    }

    // Exactly these rules: what a batch is (an EmbeddingJob) and finding its model's pool.
    assert_eq!(
        one(&batch, "Role")["rules"],
        json!([
            { "apiGroups": ["teifleet.dev"], "resources": ["embeddingjobs"],
              "verbs": ["get", "list", "watch", "create", "patch", "delete"] },
            { "apiGroups": ["teifleet.dev"], "resources": ["embeddingpools"], "verbs": ["get", "list"] },
        ])
    );
    let binding = one(&batch, "RoleBinding");
    assert_eq!(
        binding["roleRef"],
        json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "teifleet-batch" })
    );
    assert_eq!(
        binding["subjects"],
        json!([{ "kind": "ServiceAccount", "name": "teifleet-batch", "namespace": RELEASE_NAMESPACE }])
    );
    // Nothing cluster-wide names the server's account.
    for object in &objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        if kind == "ClusterRoleBinding" || kind == "RoleBinding" && object["metadata"]["name"] != "teifleet-batch" {
            let subjects = object["subjects"].as_array().cloned().unwrap_or_default();
            assert!(!subjects.iter().any(|subject| subject["name"] == "teifleet-batch"), "{object}");
        }
    }

    let deployment = one(&batch, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "teifleet-batch");
    assert_eq!(
        pod["securityContext"],
        json!({ "runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                "seccompProfile": { "type": "RuntimeDefault" } })
    );
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let server = &containers[0];
    assert_eq!(
        server["securityContext"],
        json!({ "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true,
                "capabilities": { "drop": ["ALL"] }, "seccompProfile": { "type": "RuntimeDefault" } })
    );
    let version = std::fs::read_to_string(teifleet_e2e::repo_root().join("charts/teifleet/Chart.yaml")).unwrap();
    let version = version.lines().find_map(|line| line.strip_prefix("appVersion: ")).unwrap().trim_matches('"');
    assert_eq!(server["image"], format!("ghcr.io/teifleet/batch:{version}"));
    assert_eq!(server["ports"], json!([{ "name": "http", "containerPort": 8080, "protocol": "TCP" }]));
    assert_eq!(
        server["args"],
        json!([
            "--listen=0.0.0.0:8080",
            "--namespace=$(POD_NAMESPACE)",
            "--store=file:///data/batch/openai/",
            "--store-pvc-claim=batch-files",
            "--store-pvc-path=openai",
            "--api-keys-dir=/var/run/teifleet/api-keys",
            "--workers=2",
            "--log-format=json",
        ])
    );
    let mounts: Vec<(&str, &str)> = server["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap()))
        .collect();
    assert_eq!(mounts, [("store", "/data/batch"), ("api-keys", "/var/run/teifleet/api-keys"), ("tmp", "/tmp")]);
    let volumes = pod["volumes"].as_array().unwrap();
    assert_eq!(volumes[0]["persistentVolumeClaim"]["claimName"], "batch-files");
    assert_eq!(volumes[1]["secret"], json!({ "secretName": "batch-keys", "defaultMode": 0o440 }));
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate", "one claim, mounted by one pod at a time");
    assert_eq!(pod.get("nodeSelector"), None);
    assert_eq!(pod.get("tolerations"), None);
    let service = one(&batch, "Service");
    assert_eq!(
        service["spec"]["ports"],
        json!([{ "name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP" }])
    );
    let policy = one(&batch, "NetworkPolicy");
    assert_eq!(policy["spec"]["ingress"], json!([{ "ports": [{ "port": 8080, "protocol": "TCP" }] }]));
}

#[test]
fn the_batch_api_on_s3_takes_the_buckets_flags_and_the_workers_credentials() {
    let objects = template(&[
        "batch.enabled=true",
        "batch.store.s3.bucket=batches",
        "batch.store.s3.key=openai",
        "batch.store.s3.endpoint=http://minio.storage.svc:9000",
        "batch.store.s3.credentialsSecret=minio",
        "batch.store.s3.allowHttp=true",
        "batch.workers=4",
    ])
    .unwrap();
    let batch = batch_objects(&objects);
    let server = &one(&batch, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        server["args"],
        json!([
            "--listen=0.0.0.0:8080",
            "--namespace=$(POD_NAMESPACE)",
            "--store=s3://batches/openai/",
            "--store-s3-endpoint=http://minio.storage.svc:9000",
            "--store-s3-region=us-east-1",
            "--store-s3-allow-http",
            "--store-s3-credentials-secret=minio",
            "--workers=4",
            "--log-format=json",
        ])
    );
    let secret_env: Vec<(&str, &str, &str)> = server["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|env| {
            let key = &env["valueFrom"]["secretKeyRef"];
            Some((env["name"].as_str()?, key["name"].as_str()?, key["key"].as_str()?))
        })
        .collect();
    assert_eq!(
        secret_env,
        [
            ("TEIFLEET_STORE_S3_ACCESS_KEY_ID", "minio", "accessKeyId"),
            ("TEIFLEET_STORE_S3_SECRET_ACCESS_KEY", "minio", "secretAccessKey")
        ]
    );
    let mounts: Vec<&str> =
        server["volumeMounts"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(mounts, ["tmp"], "no claim, no keys");
    // Out: DNS, the API server and the bucket's port.
    let egress = &one(&batch, "NetworkPolicy")["spec"]["egress"];
    assert_eq!(egress.as_array().unwrap().len(), 3);
    assert_eq!(egress[2], json!({ "ports": [{ "port": 9000, "protocol": "TCP" }] }));
}

#[test]
fn the_batch_api_runs_where_the_operator_runs_unless_told_otherwise() {
    let placed = |set: &[&str]| {
        let objects = template(&[&PVC_STORE[..], set].concat()).unwrap();
        let pod = one(&batch_objects(&objects), "Deployment")["spec"]["template"]["spec"].clone();
        (pod["nodeSelector"].clone(), pod["tolerations"].clone())
    };
    let operators = ["nodeSelector.pool=system", "tolerations[0].key=system", "tolerations[0].operator=Exists"];
    assert_eq!(placed(&operators), (json!({ "pool": "system" }), json!([{ "key": "system", "operator": "Exists" }])));
    let own = [&operators[..], &["batch.nodeSelector.pool=api", "batch.tolerations[0].key=api"]].concat();
    assert_eq!(placed(&own), (json!({ "pool": "api" }), json!([{ "key": "api" }])));
}

#[test]
fn the_batch_workers_go_where_batch_job_template_says() {
    let args = |set: &[&str]| {
        let objects = template(&[&PVC_STORE[..], set].concat()).unwrap();
        let container =
            one(&batch_objects(&objects), "Deployment")["spec"]["template"]["spec"]["containers"][0].clone();
        container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert!(!args(&[]).iter().any(|a| a.starts_with("--job-template")), "no template: none passed");
    let placed = args(&["batch.jobTemplate.nodeSelector.pool=cpu", "batch.jobTemplate.tolerations[0].key=spot"]);
    let flag = placed.iter().find_map(|a| a.strip_prefix("--job-template=")).expect("--job-template passed");
    let template: serde_json::Value = serde_json::from_str(flag).unwrap();
    assert_eq!(template, json!({ "nodeSelector": { "pool": "cpu" }, "tolerations": [{ "key": "spot" }] }));
}

#[test]
fn the_batch_workers_call_keyed_pools_with_batch_pool_key_secret() {
    let args = |set: &[&str]| {
        let objects = template(&[&PVC_STORE[..], set].concat()).unwrap();
        let container =
            one(&batch_objects(&objects), "Deployment")["spec"]["template"]["spec"]["containers"][0].clone();
        container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert!(!args(&[]).iter().any(|a| a.starts_with("--job-api-key-secret")), "no Secret: none passed");
    let keyed = args(&["batch.poolKeySecret.name=pool-key", "batch.poolKeySecret.key=token"]);
    assert!(keyed.contains(&"--job-api-key-secret=pool-key".to_owned()), "{keyed:?}");
    assert!(keyed.contains(&"--job-api-key-secret-key=token".to_owned()), "{keyed:?}");
}
