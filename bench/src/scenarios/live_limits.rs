//! Scenario 6, live limit change latency: on the local control plane, the time from patching an
//! EmbeddingPool's `spec.concurrency.maxInFlight` to the sidecar enforcing the new share (its
//! `teifleet_limit_in_flight` gauge, set when the admission limits change), over 20 edits. The
//! path measured: API server → operator reconcile → status.admission → sidecar's watch.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;
use teifleet_crds::EmbeddingPool;
use tokio::time::Instant;

use super::procs::{self, Proc};
use super::{Context, fast_model, http};
use crate::results::Section;
use crate::summary::Latencies;
use crate::targets::{Rule, Target};
use crate::{Error, Result};

const KEY: &str = "live-limits";
const TITLE: &str = "6. Live limit change latency (local control plane)";
const SCENARIO: &str = "6 live limits";
const LIMIT_MS: f64 = 2000.0;
const POOL: &str = "bench";

fn planned() -> Target {
    Target::new(SCENARIO, "edit → enforced p99", None, Rule::AtMost, LIMIT_MS, "ms")
}

pub async fn run(ctx: &Context) -> Section {
    let Some(kubeconfig) = ctx.kubeconfig.clone() else {
        let why = "no local control plane: run through `make bench` (starts one) or pass --kubeconfig";
        return Section {
            key: KEY.into(),
            title: TITLE.into(),
            markdown: format!("Not measured: {why}."),
            targets: vec![planned().note_if_not_passed(why)],
            ..Section::default()
        };
    };
    match measure_all(ctx, &kubeconfig).await {
        Ok(section) => section,
        Err(e) => super::failed_section(KEY, TITLE, &e, vec![planned()]),
    }
}

async fn client(kubeconfig: &Path) -> Result<Client> {
    let file = Kubeconfig::read_from(kubeconfig).map_err(|e| Error::Process(format!("kubeconfig: {e}")))?;
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Process(format!("kubeconfig: {e}")))?;
    Ok(Client::try_from(config)?)
}

/// Polls `check` every 100 ms until it yields, for at most `timeout`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(Error::Process(format!("timed out after {timeout:?} waiting for {what}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn install_crd(ctx: &Context, client: &Client) -> Result<()> {
    let path = ctx.repo_root.join("crds/teifleet.dev_embeddingpools.yaml");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::File { what: "reading", path, source })?;
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&text).map_err(|e| Error::Process(format!("CRD file: {e}")))?;
    let name = crd.metadata.name.clone().unwrap_or_default();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(&name, &PatchParams::apply("teifleet-bench").force(), &Patch::Apply(&crd)).await?;
    eventually("the CRD to be established", Duration::from_secs(30), || {
        let (api, name) = (api.clone(), name.clone());
        async move {
            let crd = api.get(&name).await.ok()?;
            crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        }
    })
    .await?;
    // A fresh client's discovery may lag the CRD by a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

async fn limit_in_flight(sidecar: &Proc) -> Option<f64> {
    let text = http::get(sidecar.admin, "/metrics").await?;
    let series = format!("teifleet_limit_in_flight{{pool=\"{POOL}\"}}");
    text.lines().find_map(|line| line.strip_prefix(&series)?.trim().parse().ok())
}

/// Deletes the namespace when dropped (best effort, in the background).
struct NamespaceGuard(Api<Namespace>, String);

impl Drop for NamespaceGuard {
    fn drop(&mut self) {
        let (api, name) = (self.0.clone(), self.1.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            });
        }
    }
}

async fn measure_all(ctx: &Context, kubeconfig: &Path) -> Result<Section> {
    let client = client(kubeconfig).await?;
    install_crd(ctx, &client).await?;
    let suffix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() % 1_000_000)
        .unwrap_or(0);
    let ns = format!("bench-{suffix}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } }))?;
    namespaces.create(&PostParams::default(), &namespace).await?;
    let _guard = NamespaceGuard(namespaces, ns.clone());
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    eventually("the default ServiceAccount", Duration::from_secs(30), || {
        let accounts = accounts.clone();
        async move { accounts.get_opt("default").await.ok().flatten() }
    })
    .await?;

    let _operator = procs::start_operator(&ctx.bins, kubeconfig, &ns).await?;
    let pools: Api<EmbeddingPool> = Api::namespaced(client.clone(), &ns);
    let pool: EmbeddingPool = serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1",
        "kind": "EmbeddingPool",
        "metadata": { "name": POOL, "namespace": ns },
        "spec": { "model": { "id": "BAAI/bge-small-en-v1.5" }, "gpu": { "type": "cpu" }, "replicas": 1,
                  "concurrency": { "maxInFlight": 4, "maxQueued": 16 } },
    }))?;
    pools.create(&PostParams::default(), &pool).await?;
    ctx.say("live limits: waiting for the pool's first budget");
    eventually("the pool's status.admission", Duration::from_secs(90), || {
        let pools = pools.clone();
        async move { pools.get(POOL).await.ok()?.status?.admission.filter(|a| a.in_flight_per_replica == 4).map(|_| ()) }
    })
    .await?;

    let sim = procs::start_sim(&ctx.bins, "live-sim", &fast_model()).await?;
    let sidecar = procs::start_sidecar(&ctx.bins, &sim, kubeconfig, &ns, POOL).await?;
    eventually("the sidecar's first limit", Duration::from_secs(30), || async {
        (limit_in_flight(&sidecar).await? == 4.0).then_some(())
    })
    .await?;

    let edits = ctx.pick(8, 20);
    ctx.say(&format!("live limits: {edits} budget edits"));
    let mut latencies = Latencies::new();
    let mut samples = Vec::new();
    for i in 0..edits {
        // One replica, so its share is the whole budget; alternate between two values.
        let value = if i % 2 == 0 { 8 } else { 4 };
        let started = Instant::now();
        pools
            .patch(
                POOL,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "concurrency": { "maxInFlight": value } } })),
            )
            .await?;
        let deadline = started + Duration::from_secs(30);
        loop {
            if limit_in_flight(&sidecar).await == Some(f64::from(value)) {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Process(format!("edit {i} to {value} not enforced within 30 s")));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let took = started.elapsed();
        latencies.record(took);
        samples.push(took.as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let summary = latencies.summary();
    let mut markdown = String::new();
    let _ = writeln!(
        markdown,
        "Local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok fake nodes, v1.33), the \
         operator binary, a one-replica pool (`gpu.type: cpu`), and the multiplexer in Kubernetes mode as its \
         sidecar (admin kubeconfig; RBAC does not change the path's timing) in front of the simulator. Each edit \
         is a merge patch of `spec.concurrency.maxInFlight` (alternating 8 and 4); the clock runs from sending the \
         patch until the sidecar's `/metrics` (polled every ~2 ms) shows the new `teifleet_limit_in_flight`.\n"
    );
    let _ = writeln!(markdown, "| edits | p50 | p99 | max | mean |");
    let _ = writeln!(markdown, "| ---: | ---: | ---: | ---: | ---: |");
    let _ = writeln!(
        markdown,
        "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
        summary.count, summary.p50_ms, summary.p99_ms, summary.max_ms, summary.mean_ms
    );
    let list: Vec<String> = samples.iter().map(|s| format!("{s:.0}")).collect();
    let _ = writeln!(markdown, "\nEach edit (ms): {}.", list.join(", "));
    let target = Target::at_most(SCENARIO, "edit → enforced p99", summary.p99_ms, LIMIT_MS, "ms")
        .note_if_not_passed("the operator's reconcile or the sidecar's watch is slow to see the change");
    Ok(Section {
        key: KEY.into(),
        title: TITLE.into(),
        markdown,
        data: json!({ "edits_ms": samples, "summary": summary }),
        targets: vec![target],
        plots: vec![],
    })
}
