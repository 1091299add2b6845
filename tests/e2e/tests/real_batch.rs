//! OpenAI's Batch API as shipped, on the local cluster's real node: the chart with `batch.enabled`
//! runs `teifleet-batch` (files on a claim, API keys for two tenants) beside its operator, and the
//! OpenAI Python SDK, unchanged but for `base_url`, drives it from the host
//! (tests/clients/batch_sdk.py) through the batch Service's ClusterIP:
//!
//! - a 10,000-line file (strings and arrays, 3 invalid lines, 1 line for an unknown model) is
//!   uploaded, a batch created and polled to `completed` while the batch API's pod is deleted
//!   mid-run; both files come back with every `custom_id` exactly once, sampled vectors equal to
//!   what the pool's own `/v1/embeddings` answers, the 4 bad lines in the error file with
//!   OpenAI-shaped errors, and `usage` counted;
//! - the batch is an EmbeddingJob (`kubectl get ejob`) labelled with its owner's tenant;
//! - tenant b gets 404 for tenant a's file and batch, and lists neither;
//! - a second batch cancelled mid-run goes `cancelling` then `cancelled`, its counts match the
//!   lines its partial output and error files hold.
//!
//! Needs the real node and the images (the `job` and `batch` images among them, see
//! `real_pods.rs`); without them it says it was skipped and passes.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use teifleet_crds::{EmbeddingJob, labels};
use teifleet_e2e::claims::{delete_host_volumes, host_claim, open_to_every_user, ready_for_jobs};
use teifleet_e2e::pools::create_pool;
use teifleet_e2e::real::{install_chart_with, is_ready, pool_template, wait_ready_pods};
use teifleet_e2e::{admin_client, eventually, helm, kubectl, repo_root};
use teifleet_wire::ports;

const RELEASE: &str = "tfbatch";
const POOL: &str = "minilm";
/// The pool's model: OpenAI's `model` in every line names it.
const MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// Lines of the first batch, as the issue asks.
const LINES: usize = 10_000;
const CLAIM: &str = "batch-files";
/// The tenants' API keys (the batch API's `batch.auth.secretName` Secret).
const KEY_A: &str = "tenant-a-key-0123456789abcdef";
const KEY_B: &str = "tenant-b-key-0123456789abcdef";
/// The batch API's port (charts/teifleet: `batch.service.port`).
const BATCH_PORT: u16 = 8080;

#[tokio::test]
async fn the_openai_sdk_runs_batches_through_a_pool_across_a_restart_and_a_cancel() {
    let client = admin_client().await;
    let Some((ns, images)) = ready_for_jobs(&client, &["job", "batch"], "real-batch").await else { return };
    let namespace = ns.name.clone();

    let host = std::env::temp_dir().join(format!("teifleet-e2e-batch-{}", std::process::id()));
    std::fs::create_dir_all(&host).unwrap();
    open_to_every_user(&host);
    host_claim(&client, &namespace, CLAIM, &host).await;
    let keys: Secret = serde_json::from_value(json!({
        "metadata": { "name": "batch-keys" },
        "stringData": { "a": KEY_A, "b": KEY_B },
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &namespace).create(&PostParams::default(), &keys).await.unwrap();

    // The batches' workers run on the real node, as the pool's pods do.
    let job_template = format!("batch.jobTemplate={}", pool_template());
    let batch_values = [
        "--set-json",
        &job_template,
        "--set",
        "batch.enabled=true",
        "--set",
        &format!("batch.store.pvc.claimName={CLAIM}"),
        "--set",
        "batch.auth.secretName=batch-keys",
    ];
    install_chart_with(&client, &namespace, RELEASE, &batch_values).await;

    let tei_sim = &images["tei-sim"].1;
    create_pool(
        &client,
        &namespace,
        POOL,
        json!({
            "model": { "id": MODEL },
            "replicas": 2,
            "gpu": { "type": "cpu" },
            "tei": { "image": tei_sim, "extraArgs": ["--fixed-latency=10ms", "--dimensions=384"] },
            "concurrency": { "maxInFlight": 32, "maxInFlightPerReplica": 16, "maxQueued": 256 },
            "template": pool_template(),
        }),
    )
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    wait_ready_pods(&pods, &labels::pool_selector(POOL), 2).await;
    let batch_selector = format!("app.kubernetes.io/name=teifleet-batch,app.kubernetes.io/instance={RELEASE}");
    wait_ready_pods(&pods, &batch_selector, 1).await;

    let base_url = format!("http://{}:{BATCH_PORT}/v1", cluster_ip(&client, &namespace, &batch_service()).await);
    let pool_url = format!("http://{}:{}/v1", cluster_ip(&client, &namespace, POOL).await, ports::MULTIPLEXER_HTTP);
    let sdk = Sdk::new(&base_url, &pool_url, &client, &namespace);

    // The first batch, with the batch API's pod deleted while it runs.
    let lines = LINES.to_string();
    let created = sdk.run("create", KEY_A, &["--lines", &lines, "--model", MODEL, "--bad"]).await;
    let (batch_id, file_id) = (created["batch_id"].as_str().unwrap(), created["file_id"].as_str().unwrap());
    sdk.run("wait", KEY_A, &["--batch-id", batch_id, "--until", "running", "--timeout", "300"]).await;
    let server = pods.list(&ListParams::default().labels(&batch_selector)).await.unwrap().items.remove(0);
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    pods.delete(server.metadata.name.as_deref().unwrap(), &now).await.unwrap();
    println!("deleted the batch API's pod {:?} mid-batch", server.metadata.name);
    eventually("a new batch API pod Ready", Duration::from_secs(120), || async {
        let list = pods.list(&ListParams::default().labels(&batch_selector)).await.ok()?.items;
        list.iter().any(|p| p.metadata.name != server.metadata.name && is_ready(p)).then_some(())
    })
    .await;
    let waited = sdk.run("wait", KEY_A, &["--batch-id", batch_id, "--until", "completed", "--timeout", "600"]).await;
    println!("first batch: {waited}");
    let checked =
        sdk.run("check", KEY_A, &["--batch-id", batch_id, "--lines", &lines, "--model", MODEL, "--bad"]).await;
    println!("first batch's files: {checked}");

    // The batch is an EmbeddingJob its owner's tenant is written on.
    let jobs = Api::<EmbeddingJob>::namespaced(client.clone(), &namespace);
    let listed = jobs.list(&ListParams::default().labels(&format!("teifleet.dev/batch={batch_id}"))).await.unwrap();
    assert_eq!(listed.items.len(), 1, "one EmbeddingJob per batch");
    let job_labels = listed.items[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(job_labels.get("teifleet.dev/tenant").map(String::as_str), Some("a"), "{job_labels:?}");
    let (ok, table) = kubectl(&["get", "ejob", "-n", &namespace]);
    assert!(ok && table.contains(POOL), "kubectl get ejob: {table}");

    // Tenant b sees nothing of tenant a's.
    sdk.run("isolation", KEY_B, &["--file-id", file_id, "--batch-id", batch_id]).await;

    // A second batch, cancelled once some of it is done.
    let created = sdk.run("create", KEY_A, &["--lines", &lines, "--model", MODEL]).await;
    let batch_id = created["batch_id"].as_str().unwrap();
    sdk.run("wait", KEY_A, &["--batch-id", batch_id, "--until", "running", "--timeout", "300"]).await;
    let cancelled = sdk.run("cancel", KEY_A, &["--batch-id", batch_id]).await;
    let waited = sdk.run("wait", KEY_A, &["--batch-id", batch_id, "--until", "cancelled", "--timeout", "300"]).await;
    println!("cancelled batch: {cancelled} then {waited}");
    let seen: Vec<&str> = waited["seen"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(
        cancelled["status"] == "cancelling" || seen.contains(&"cancelling"),
        "cancelling before cancelled: {cancelled} {seen:?}"
    );
    let checked =
        sdk.run("check", KEY_A, &["--batch-id", batch_id, "--lines", &lines, "--model", MODEL, "--partial"]).await;
    println!("cancelled batch's files: {checked}");
    let done = checked["outputs"].as_u64().unwrap() + checked["errors"].as_u64().unwrap();
    assert!(done < LINES as u64, "the cancel stopped the batch before its end: {checked}");

    let (ok, out) = helm(&["uninstall", RELEASE, "-n", &namespace, "--wait", "--timeout", "60s"]);
    assert!(ok, "{out}");
    delete_host_volumes(&client, &namespace, &[CLAIM]).await;
    std::fs::remove_dir_all(&host).ok();
}

/// The chart's name for the batch API's Service.
fn batch_service() -> String {
    format!("{RELEASE}-teifleet-batch")
}

async fn cluster_ip(client: &Client, namespace: &str, service: &str) -> IpAddr {
    let service = Api::<Service>::namespaced(client.clone(), namespace).get(service).await.expect("the Service");
    service.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP").parse().expect("an IP")
}

/// tests/clients/batch_sdk.py in the client libraries' venv (tests/clients/venv.sh makes it).
struct Sdk {
    python: PathBuf,
    base_url: String,
    pool_url: String,
    client: Client,
    namespace: String,
}

impl Sdk {
    fn new(base_url: &str, pool_url: &str, client: &Client, namespace: &str) -> Self {
        let venv =
            Command::new(repo_root().join("tests/clients/venv.sh")).output().expect("tests/clients/venv.sh runs");
        assert!(venv.status.success(), "the client venv: {}", String::from_utf8_lossy(&venv.stderr));
        let python = PathBuf::from(String::from_utf8(venv.stdout).unwrap().trim());
        let (client, namespace) = (client.clone(), namespace.to_owned());
        Self { python, base_url: base_url.to_owned(), pool_url: pool_url.to_owned(), client, namespace }
    }

    /// [`Sdk::try_run`], or a panic with the step's words, the namespace's pods (their logs and
    /// warnings) and its EmbeddingJobs' status.
    async fn run(&self, step: &str, key: &str, args: &[&str]) -> Value {
        match self.try_run(step, key, args) {
            Ok(value) => value,
            Err(said) => {
                let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace);
                let jobs = Api::<EmbeddingJob>::namespaced(self.client.clone(), &self.namespace);
                let statuses: Vec<String> = jobs.list(&ListParams::default()).await.map_or_else(
                    |e| vec![format!("cannot list EmbeddingJobs: {e}")],
                    |list| list.items.iter().map(|j| format!("{:?}: {:?}", j.metadata.name, j.status)).collect(),
                );
                panic!("{said}\nEmbeddingJobs: {statuses:#?}\n{}", teifleet_e2e::diagnose::report(&pods).await)
            }
        }
    }

    /// One step of batch_sdk.py as the holder of `key`; its JSON line, or what it said.
    fn try_run(&self, step: &str, key: &str, args: &[&str]) -> Result<Value, String> {
        let output = Command::new(&self.python)
            .arg(repo_root().join("tests/clients/batch_sdk.py"))
            .args([step, "--base-url", &self.base_url, "--api-key", key, "--pool-url", &self.pool_url])
            .args(args)
            .output()
            .expect("python runs");
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        if !output.status.success() {
            return Err(format!("batch_sdk.py {step} {args:?} failed:\n{stdout}\n{stderr}"));
        }
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).map_err(|e| format!("batch_sdk.py {step}: {e}: {stdout}"))
    }
}
