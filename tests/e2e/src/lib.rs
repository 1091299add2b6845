//! Support for the end-to-end tests: a client for the local control plane, the operator as a real
//! child process, throwaway namespaces, fake GPU nodes and polling with deadlines.
//!
//! The tests expect `TEIFLEET_KUBECONFIG` (the cluster from `tests/cluster/up.sh`) and
//! `TEIFLEET_OPERATOR_BIN` (a built `teifleet-operator`); `make test-cluster` sets both.
#![forbid(unsafe_code)]

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub mod pools;

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
    std::fs::write(&path, serde_yaml::to_string(&config).expect("kubeconfig serializes")).expect("kubeconfig written");
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

pub async fn client_for(kubeconfig: &std::path::Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig readable");
    let config =
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("kubeconfig valid");
    Client::try_from(config).expect("client")
}

/// Polls `check` every 200 ms until it yields a value, panicking with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Installs (or updates) the checked-in CRD and waits until the API server serves it.
pub async fn install_crd(client: &Client) {
    let path = repo_root().join("crds/teifleet.dev_embeddingpools.yaml");
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&std::fs::read_to_string(&path).expect("CRD file")).expect("CRD parses");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().expect("CRD name");
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&crd)).await.expect("CRD applies");
    eventually("the CRD to be established", Duration::from_secs(30), || {
        let api = api.clone();
        let name = name.clone();
        async move {
            let crd = api.get(&name).await.ok()?;
            let established = crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        }
    })
    .await;
    // The discovery cache of a fresh client may lag the CRD by a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// A namespace that exists for one test and is deleted when dropped.
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    pub async fn create(client: &Client, prefix: &str) -> Self {
        Self::create_with_labels(client, prefix, serde_json::json!({})).await
    }

    pub async fn create_with_labels(client: &Client, prefix: &str, mut labels: serde_json::Value) -> Self {
        labels[TEST_NAMESPACE_LABEL] = serde_json::json!("true");
        let suffix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() % 1_000_000;
        let name = format!("{prefix}-{suffix}");
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": labels }
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace created");
        // Pods need the namespace's default ServiceAccount, made by the controller-manager.
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &name);
        eventually("the default ServiceAccount", Duration::from_secs(30), || {
            let accounts = accounts.clone();
            async move { accounts.get_opt("default").await.ok().flatten() }
        })
        .await;
        Self { name }
    }
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

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("TEIFLEET_KEEP_NAMESPACES").is_none() {
            kubectl(&["delete", "namespace", &self.name, "--wait=false", "--ignore-not-found"]);
        }
    }
}

/// Runs the cluster's kubectl against the local control plane; returns (success, stdout+stderr).
pub fn kubectl(args: &[&str]) -> (bool, String) {
    let cache = std::env::var("TEIFLEET_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/teifleet"));
    let output = Command::new(cache.join("current/kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(args)
        .output()
        .expect("kubectl runs");
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

/// The operator binary running as a child process, as it would in its Deployment.
pub struct Operator {
    child: Child,
    pub admin_port: u16,
    pub log: PathBuf,
}

impl Operator {
    /// Starts the operator with the admin kubeconfig.
    pub fn start(name: &str) -> Self {
        Self::start_with(name, &kubeconfig_path(), "default", &[])
    }

    /// Starts the operator with its own kubeconfig, leader Lease namespace and extra flags.
    pub fn start_with(name: &str, kubeconfig: &std::path::Path, lease_namespace: &str, extra_args: &[&str]) -> Self {
        let admin_port = free_port();
        let log = log_dir().join(format!("operator-{name}.log"));
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let child = Command::new(required_env("TEIFLEET_OPERATOR_BIN"))
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
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log file"))
            .stderr(log_file)
            .spawn()
            .expect("operator starts");
        Self { child, admin_port, log }
    }

    /// Stops the operator with SIGKILL, as a crashed node would: no lease release, no cleanup.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the operator with SIGTERM and waits for it to exit.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill();
        None
    }

    /// The operator's Prometheus metrics text.
    pub async fn metrics(&self) -> Option<String> {
        http_get(self.admin_port, "/metrics").await
    }

    /// The value of one unlabeled metric, or the sum over a metric's label sets.
    pub async fn metric_sum(&self, name: &str) -> Option<f64> {
        let text = self.metrics().await?;
        Some(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter(|l| l.split(['{', ' ']).next() == Some(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.terminate();
        }
    }
}

/// A port nothing listens on right now, for a child process to bind.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// A minimal HTTP/1.0 GET against the operator's admin port.
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
}
