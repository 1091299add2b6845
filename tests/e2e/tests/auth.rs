//! API keys on the real control plane: the operator, on nothing but the chart's RBAC, gives the
//! sidecars of a pool with `spec.auth` read access to that pool's one key Secret; the sidecar, on
//! nothing but its ServiceAccount's token, watches that Secret, refuses calls without one of its
//! keys, and takes a key rotated in the Secret without a restart; it cannot read another Secret.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use teifleet_crds::EmbeddingPool;
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::{
    Operator, admin_client, client_for, cluster_tool, eventually, free_port, helm, http_get, install_crd, kubectl,
    log_dir, loopback, test_namespace,
};
use teifleet_proto::v1::{EmbedRequest, embed_client::EmbedClient};
use teifleet_testkit::http::send;
use teifleet_testkit::process::ChildGuard;
use tonic::Code;
use tonic::transport::Channel;

const RELEASE: &str = "auth-e2e";
const OLD_KEY: &str = "search-key-old-0123456789";
const NEW_KEY: &str = "search-key-new-0123456789";

/// The chart's RBAC for the operator, installed as a release of its own without running the
/// operator's pod (the test runs the binary with the release's token); uninstalled when dropped,
/// which also removes its cluster-scoped ClusterRole.
struct ChartRbac {
    namespace: String,
}

impl ChartRbac {
    fn install(namespace: &str) -> Self {
        let (ok, output) = helm(&[
            "install",
            RELEASE,
            "charts/teifleet",
            "-n",
            namespace,
            "--set",
            "replicaCount=0",
            "--skip-crds",
            "--wait",
            "--timeout",
            "60s",
        ]);
        assert!(ok, "helm install failed: {output}");
        Self { namespace: namespace.to_owned() }
    }
}

impl Drop for ChartRbac {
    fn drop(&mut self) {
        let (ok, output) = helm(&["uninstall", RELEASE, "-n", &self.namespace, "--wait"]);
        if !ok {
            eprintln!("helm uninstall {RELEASE}: {output}");
        }
    }
}

fn can_i(kubeconfig: &std::path::Path, args: &[&str]) -> bool {
    let output = cluster_tool("kubectl", kubeconfig, &[&["auth", "can-i"], args].concat());
    String::from_utf8_lossy(&output.stdout).trim() == "yes"
}

async fn create_secret(client: &Client, namespace: &str, name: &str, data: BTreeMap<String, String>) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        string_data: Some(data),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace).create(&PostParams::default(), &secret).await.unwrap();
}

async fn embed(channel: Channel, key: Option<&str>) -> Result<(), Code> {
    let mut request = tonic::Request::new(EmbedRequest { inputs: "with a key".into(), ..Default::default() });
    if let Some(key) = key {
        request.metadata_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    EmbedClient::new(channel).embed(request).await.map(|_| ()).map_err(|status| status.code())
}

#[tokio::test]
async fn a_pools_sidecar_checks_keys_from_its_one_secret_and_takes_rotations_live() {
    let client = admin_client().await;
    install_crd(&client).await;
    let ns = test_namespace("auth").await;
    let _chart = ChartRbac::install(&ns.name);

    // The API server refuses a Secret name that is not one, in words.
    let bad: EmbeddingPool = serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1", "kind": "EmbeddingPool",
        "metadata": { "name": "bad" },
        "spec": { "model": { "id": "m" }, "auth": { "secretName": "Keys_For_Search" } },
    }))
    .unwrap();
    let refused = Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name).create(&PostParams::default(), &bad).await;
    let message = refused.expect_err("an invalid secretName is refused").to_string();
    assert!(message.contains("auth.secretName must name a Secret in the pool's namespace"), "{message}");

    let operator_account = format!("{RELEASE}-teifleet-operator");
    let token = teifleet_e2e::service_account_token(&ns.name, &operator_account);
    let operator_kubeconfig = teifleet_e2e::token_kubeconfig("auth-operator", &token);
    assert!(!can_i(&operator_kubeconfig, &["get", "secrets", "-n", &ns.name]), "the operator reads no Secret");
    let lease = format!("--lease-name={operator_account}");
    let operator = Operator::start_with("auth", &operator_kubeconfig, &ns.name, &[&lease]);

    create_secret(&client, &ns.name, "search-keys", [("search".to_owned(), OLD_KEY.to_owned())].into()).await;
    create_secret(&client, &ns.name, "unrelated", [("password".to_owned(), "hunter2".to_owned())].into()).await;
    create_pool(
        &client,
        &ns.name,
        "keyed",
        json!({ "gpu": { "type": "cpu" }, "auth": { "secretName": "search-keys" },
                "concurrency": { "maxInFlight": 4, "tenants": [{ "name": "search" }] } }),
    )
    .await;
    wait_until_ready(&client, &ns.name, "keyed").await;
    let role = Api::<Role>::namespaced(client.clone(), &ns.name).get("keyed-multiplexer").await.unwrap();
    let rules = role.rules.unwrap_or_default();
    let secret_rules: Vec<_> =
        rules.iter().filter(|rule| rule.resources.as_deref() == Some(&["secrets".to_owned()][..])).collect();
    assert_eq!(secret_rules.len(), 1, "the chart's escalate and bind let the operator grant it: {rules:?}");
    // The pool's keys, beside its peer Secret (the operator's, by teifleet_crds::labels::peer_secret_name).
    let named = ["keyed-teifleet-peer".to_owned(), "search-keys".to_owned()];
    assert_eq!(secret_rules[0].resource_names.as_deref(), Some(&named[..]));
    assert!(!operator.log_text().contains("forbidden"), "{}", operator.log_text());

    // The sidecar's identity reads that one Secret, by name or by a watch on its name, and no other.
    let token = teifleet_e2e::service_account_token(&ns.name, "keyed-multiplexer");
    let sidecar_kubeconfig = teifleet_e2e::token_kubeconfig("keyed-multiplexer", &token);
    assert!(can_i(&sidecar_kubeconfig, &["get", "secret/search-keys", "-n", &ns.name]));
    assert!(!can_i(&sidecar_kubeconfig, &["get", "secret/unrelated", "-n", &ns.name]));
    let as_sidecar = Api::<Secret>::namespaced(client_for(&sidecar_kubeconfig).await, &ns.name);
    assert!(as_sidecar.get("unrelated").await.is_err(), "another Secret is forbidden");
    assert!(as_sidecar.list(&ListParams::default()).await.is_err(), "listing every Secret is forbidden");
    let named = ListParams::default().fields("metadata.name=search-keys");
    assert_eq!(as_sidecar.list(&named).await.expect("a list on its name is allowed").items.len(), 1);
    let watch = as_sidecar.watch(&kube::api::WatchParams::default().fields("metadata.name=search-keys"), "0").await;
    assert!(watch.is_ok(), "a watch on its name is allowed: {:?}", watch.err());
    let unrelated = ListParams::default().fields("metadata.name=unrelated");
    assert!(as_sidecar.list(&unrelated).await.is_err(), "a list on another name is forbidden");

    let sim = teifleet_tei_sim::start(teifleet_tei_sim::SimConfig::default()).await.unwrap();
    let (grpc, http, admin) = (free_port().unwrap(), free_port().unwrap(), free_port().unwrap());
    let mut command = Command::new(
        std::env::var("TEIFLEET_MULTIPLEXER_BIN").expect("TEIFLEET_MULTIPLEXER_BIN (make test-cluster sets it)"),
    );
    command
        .env("KUBECONFIG", &sidecar_kubeconfig)
        .env("TEIFLEET_POOL", "keyed")
        .env("TEIFLEET_NAMESPACE", &ns.name)
        .env("TEIFLEET_POD_NAME", "keyed-0")
        .args([
            "kubernetes".into(),
            format!("--listen=127.0.0.1:{grpc}"),
            format!("--http-listen=127.0.0.1:{http}"),
            format!("--admin-listen=127.0.0.1:{admin}"),
            format!("--upstream=http://{}", sim.addr()),
            "--log-format=pretty".into(),
        ]);
    let mut sidecar = ChildGuard::spawn_logged("the sidecar", command, log_dir().join("multiplexer-keyed.log"))
        .expect("multiplexer starts");
    sidecar
        .wait_ready(Duration::from_secs(30), || async { http_get(loopback(admin), "/readyz").await.is_some() })
        .await
        .expect("the sidecar becomes ready");
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc}")).unwrap().connect().await.unwrap();
    eventually("the keys from the Secret in force", Duration::from_secs(10), || async {
        embed(channel.clone(), Some(OLD_KEY)).await.ok()
    })
    .await;
    assert_eq!(embed(channel.clone(), None).await, Err(Code::Unauthenticated));
    assert_eq!(embed(channel.clone(), Some(NEW_KEY)).await, Err(Code::Unauthenticated));
    let openai = json!({ "input": "hello", "model": "m" }).to_string();
    let bearer = |key: &str| format!("Bearer {key}");
    let answer = send(loopback(http), "POST", "/v1/embeddings", &[("authorization", &bearer(OLD_KEY))], &openai).await;
    assert_eq!(answer.map(|a| a.status), Some(200));
    let answer = send(loopback(http), "POST", "/v1/embeddings", &[("authorization", &bearer(NEW_KEY))], &openai).await;
    assert_eq!(answer.map(|a| a.status), Some(401));

    // Rotation: the new key replaces the old one in the Secret; the sidecar follows, no restart.
    let edited = Instant::now();
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .patch("search-keys", &PatchParams::default(), &Patch::Merge(json!({ "stringData": { "search": NEW_KEY } })))
        .await
        .unwrap();
    eventually("the rotated key accepted", Duration::from_secs(10), || async {
        embed(channel.clone(), Some(NEW_KEY)).await.ok()
    })
    .await;
    println!("a key rotated in the Secret was in force at the sidecar after {:?}", edited.elapsed());
    assert_eq!(embed(channel.clone(), Some(OLD_KEY)).await, Err(Code::Unauthenticated), "the old key is gone");
    assert!(sidecar.exit_status().is_none(), "the same process throughout: no restart");

    let metrics = http_get(loopback(admin), "/metrics").await.unwrap();
    let refused = teifleet_testkit::prom::sum(&metrics, "teifleet_auth_failures_total");
    assert!(refused >= 4.0, "every refusal counted: {refused}\n{metrics}");
    let served = "teifleet_tenant_requests_total{outcome=\"ok\",pool=\"keyed\",tenant=\"search\"}";
    assert!(teifleet_testkit::prom::value(&metrics, served).unwrap_or(0.0) >= 3.0, "the key named the tenant");
    assert!(
        !sidecar.log_text().contains(OLD_KEY) && !sidecar.log_text().contains(NEW_KEY),
        "no key in the sidecar's log"
    );
    drop(operator);
    let (ok, _) = kubectl(&["delete", "epool/keyed", "-n", &ns.name, "--wait=false"]);
    assert!(ok);
}
