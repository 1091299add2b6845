//! Support for the end-to-end tests: a client for the local control plane, the operator as a real
//! child process, throwaway namespaces, fake GPU nodes and polling with deadlines.
//!
//! The tests expect `TEIFLEET_KUBECONFIG` (the cluster from `tests/cluster/up.sh`) and
//! `TEIFLEET_OPERATOR_BIN` (a built `teifleet-operator`); `make test-cluster` sets both.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{DeleteParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Api, Client};
pub use teifleet_testkit::http::get as http_get;
pub use teifleet_testkit::kube::TestNamespace;
pub use teifleet_testkit::net::{free_port, loopback};
pub use teifleet_testkit::poll::eventually;
use teifleet_testkit::process::{ChildGuard, OnDrop};

pub mod claims;
pub mod diagnose;
pub mod pools;
pub mod prometheus;
pub mod real;

pub use diagnose::eventually_pods;

pub const FIELD_MANAGER: &str = "teifleet-e2e";

fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run the end-to-end tests with `make test-cluster`, which starts the local control plane"
        )
    })
}

pub fn kubeconfig_path() -> PathBuf {
    PathBuf::from(required_env("TEIFLEET_KUBECONFIG"))
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// Where tests leave logs and generated files (`target/e2e-logs`), created on first use.
pub fn log_dir() -> PathBuf {
    let dir = repo_root().join("target/e2e-logs");
    std::fs::create_dir_all(&dir).expect("log dir");
    dir
}

/// A kubeconfig for the local cluster that authenticates with a ServiceAccount `token`.
pub fn token_kubeconfig(name: &str, token: &str) -> PathBuf {
    let admin = Kubeconfig::read_from(kubeconfig_path()).expect("admin kubeconfig");
    let cluster = admin.clusters[0].cluster.clone().expect("cluster entry");
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "local", "cluster": {
            "server": cluster.server,
            "certificate-authority": cluster.certificate_authority,
        }}],
        "users": [{ "name": name, "user": { "token": token } }],
        "contexts": [{ "name": name, "context": { "cluster": "local", "user": name } }],
        "current-context": name,
    });
    let path = log_dir().join(format!("{name}.kubeconfig"));
    std::fs::write(&path, serde_norway::to_string(&config).expect("kubeconfig serializes"))
        .expect("kubeconfig written");
    path
}

/// A ServiceAccount token from the TokenRequest API.
pub fn service_account_token(namespace: &str, account: &str) -> String {
    let (ok, token) = kubectl(&["create", "token", account, "-n", namespace, "--duration=1h"]);
    assert!(ok, "{token}");
    token.trim().to_owned()
}

/// A client for the local control plane, authenticated as its admin.
pub async fn admin_client() -> Client {
    client_for(&kubeconfig_path()).await
}

pub async fn client_for(kubeconfig: &Path) -> Client {
    teifleet_testkit::kube::client(kubeconfig).await.expect("a client from the kubeconfig")
}

/// Installs (or updates) the checked-in CRD and waits until the API server serves it.
pub async fn install_crd(client: &Client) {
    let crd = repo_root().join("crds/teifleet.dev_embeddingpools.yaml");
    teifleet_testkit::kube::install_crd(client, &crd, FIELD_MANAGER).await.expect("the CRD installs");
}

/// A namespace for one test, labelled as these tests' own; deleted when dropped.
pub async fn test_namespace(prefix: &str) -> TestNamespace {
    test_namespace_with_labels(prefix, BTreeMap::new()).await
}

pub async fn test_namespace_with_labels(prefix: &str, mut labels: BTreeMap<String, String>) -> TestNamespace {
    labels.insert(TEST_NAMESPACE_LABEL.into(), "true".into());
    TestNamespace::create(&kubeconfig_path(), prefix, labels).await.expect("namespace created")
}

/// Marks namespaces made by these tests.
pub const TEST_NAMESPACE_LABEL: &str = "teifleet.dev/e2e";

/// Waits until namespaces of earlier tests are gone, so their teardown is not counted as
/// activity of the test that follows.
pub async fn wait_for_other_test_namespaces_gone(client: &Client, own: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    eventually("earlier test namespaces to finish terminating", Duration::from_secs(120), || {
        let api = api.clone();
        async move {
            let list = api.list(&kube::api::ListParams::default().labels(TEST_NAMESPACE_LABEL)).await.ok()?;
            list.items.iter().all(|ns| ns.metadata.name.as_deref() == Some(own)).then_some(())
        }
    })
    .await;
}

/// Runs one of the cached cluster tools (`kubectl`, `helm`) from the repository root against the
/// cluster of `kubeconfig`.
pub fn cluster_tool(tool: &str, kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let cache = std::env::var("TEIFLEET_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/teifleet"));
    Command::new(cache.join("current").join(tool))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|error| panic!("{tool} runs: {error}"))
}

/// Runs kubectl as the local control plane's admin; returns (success, stdout+stderr).
pub fn kubectl(args: &[&str]) -> (bool, String) {
    as_admin("kubectl", args)
}

/// Runs helm as the local control plane's admin; returns (success, stdout+stderr).
pub fn helm(args: &[&str]) -> (bool, String) {
    as_admin("helm", args)
}

fn as_admin(tool: &str, args: &[&str]) -> (bool, String) {
    let output = cluster_tool(tool, &kubeconfig_path(), args);
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// A fake GPU node kwok keeps Ready; deleted when dropped.
pub struct FakeNode {
    pub name: String,
}

impl FakeNode {
    pub async fn create(client: &Client, name: &str, product: &str, gpus: u32) -> Self {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "annotations": { "kwok.x-k8s.io/node": "fake" },
                "labels": { "type": "kwok", "kubernetes.io/hostname": name, "nvidia.com/gpu.product": product },
            },
            "spec": { "taints": [{ "key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule" }] },
            "status": {
                "capacity": { "cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string() },
                "allocatable": { "cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string() },
            },
        }))
        .unwrap();
        Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.expect("node created");
        Self { name: name.into() }
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        kubectl(&["delete", "node", &self.name, "--wait=false", "--ignore-not-found"]);
    }
}

/// Deletes a fake node now (for tests that must see it gone before they continue).
pub async fn delete_node(client: &Client, name: &str) {
    let _ = Api::<Node>::all(client.clone()).delete(name, &DeleteParams::default()).await;
}

/// The operator binary running as a child process, as it would in its Deployment; stopped with
/// SIGTERM when dropped, so a leader releases its lease for the next test.
pub struct Operator {
    process: ChildGuard,
    pub admin_port: u16,
}

impl Operator {
    /// Starts the operator with the admin kubeconfig.
    pub fn start(name: &str) -> Self {
        Self::start_with(name, &kubeconfig_path(), "default", &[])
    }

    /// Starts the operator with its own kubeconfig, leader Lease namespace and extra flags.
    pub fn start_with(name: &str, kubeconfig: &Path, lease_namespace: &str, extra_args: &[&str]) -> Self {
        let admin_port = free_port().expect("a free port");
        let mut command = Command::new(required_env("TEIFLEET_OPERATOR_BIN"));
        command
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,teifleet_operator=debug")
            .args([
                &format!("--admin-listen=127.0.0.1:{admin_port}"),
                "--log-format=pretty",
                &format!("--lease-namespace={lease_namespace}"),
                "--lease-duration=3s",
                "--identity",
                name,
            ])
            .args(extra_args);
        let log = log_dir().join(format!("operator-{name}.log"));
        let process = ChildGuard::spawn_logged(format!("operator {name}"), command, log)
            .expect("operator starts")
            .on_drop(OnDrop::Terminate(STOP_GRACE));
        Self { process, admin_port }
    }

    /// Stops the operator with SIGKILL, as a crashed node would: no lease release, no cleanup.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Stops the operator with SIGTERM and waits for it to exit.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.process.terminate(STOP_GRACE)
    }

    /// The operator's Prometheus metrics text.
    pub async fn metrics(&self) -> Option<String> {
        http_get(loopback(self.admin_port), "/metrics").await
    }

    /// The value of one unlabeled metric, or the sum over a metric's label sets.
    pub async fn metric_sum(&self, name: &str) -> Option<f64> {
        Some(teifleet_testkit::prom::sum(&self.metrics().await?, name))
    }

    pub fn log_text(&self) -> String {
        self.process.log_text()
    }
}

/// How long a stopped operator gets to release its lease and exit.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// One image `make images` (or `make test-cluster`, from the debug binaries) wrote to
/// `target/images`: its archive and its reference, or `None` when it has not been built.
pub fn built_image(name: &str) -> Option<(PathBuf, String)> {
    let dir = repo_root().join("target/images");
    let list = std::fs::read_to_string(dir.join("images.txt")).ok()?;
    let reference = list.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next() == Some(name)).then(|| fields.next().map(str::to_owned)).flatten()
    })?;
    let tar = dir.join(format!("{name}.tar"));
    tar.exists().then_some((tar, reference))
}

/// Imports an image archive into the real node's containerd (no registry is reachable from the
/// node) with tests/cluster/import-images.sh, which `make demo` uses too.
pub fn import_into_real_node(tar: &Path) {
    let cluster_dir = kubeconfig_path().parent().expect("the cluster directory").to_owned();
    let import = Command::new(repo_root().join("tests/cluster/import-images.sh"))
        .arg(tar)
        .env("TEIFLEET_CLUSTER_DIR", cluster_dir)
        .output()
        .expect("tests/cluster/import-images.sh runs");
    assert!(
        import.status.success(),
        "tests/cluster/import-images.sh {}: {}",
        tar.display(),
        String::from_utf8_lossy(&import.stderr)
    );
}
