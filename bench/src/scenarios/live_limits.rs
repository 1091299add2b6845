//! Scenario 6, live limit change latency: on the local control plane, the time from patching an
//! EmbeddingPool's `spec.concurrency.maxInFlight` to the sidecar enforcing the new share (its
//! `teifleet_limit_in_flight` gauge, set when the admission limits change), over 20 edits. The
//! path measured: API server → operator reconcile → status.admission → sidecar's watch.

use std::path::Path;
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;
use teifleet_crds::EmbeddingPool;
use teifleet_load::summary::{Latencies, Summary};
use tokio::time::Instant;

use super::{Context, Measurement, Scenario, fast_model};
use crate::procs::{self, Proc};
use crate::targets::{Rule, Target};
use crate::{Error, Result, admin};
use teifleet_testkit::kube::{TestNamespace, client, install_crd};
use teifleet_testkit::poll::try_eventually;

pub const LIMIT_MS: f64 = 2000.0;
const POOL: &str = "bench";
const TARGET: &str = "edit → enforced p99";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LiveLimits {
    /// Each edit, ms from the patch to the sidecar's new limit.
    pub edits_ms: Vec<f64>,
    pub summary: Summary,
}

impl Measurement for LiveLimits {
    const KEY: &'static str = "live-limits";
    const TITLE: &'static str = "Live limit change latency (local control plane)";

    async fn run(ctx: &Context) -> Result<Self> {
        let Some(kubeconfig) = ctx.kubeconfig.clone() else {
            return Err(Error::Process(
                "no local control plane: run through `make bench` (starts one) or pass --kubeconfig".into(),
            ));
        };
        if !ctx.bins.path("teifleet-operator").is_file() {
            return Err(Error::Process("teifleet-operator is not built".into()));
        }
        measure_edits(ctx, &kubeconfig).await
    }

    fn targets(&self) -> Vec<Target> {
        vec![
            Target::at_most(&Scenario::LiveLimits.label(), TARGET, self.summary.p99_ms, LIMIT_MS, "ms")
                .note_if_not_passed("the operator's reconcile or the sidecar's watch is slow to see the change"),
        ]
    }

    fn planned_targets() -> Vec<Target> {
        vec![Target::new(&Scenario::LiveLimits.label(), TARGET, None, Rule::AtMost, LIMIT_MS, "ms")]
    }
}

async fn limit_in_flight(sidecar: &Proc) -> Option<f64> {
    admin::metric_value(sidecar.admin_addr(), &format!("teifleet_limit_in_flight{{pool=\"{POOL}\"}}")).await
}

async fn measure_edits(ctx: &Context, kubeconfig: &Path) -> Result<LiveLimits> {
    let client = client(kubeconfig).await?;
    install_crd(&client, &ctx.repo_root.join("crds/teifleet.dev_embeddingpools.yaml"), "teifleet-bench").await?;
    let namespace = TestNamespace::create(kubeconfig, "bench", Default::default()).await?;
    let ns = namespace.name.clone();

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
    try_eventually("the pool's status.admission", Duration::from_secs(90), || {
        let pools = pools.clone();
        async move { pools.get(POOL).await.ok()?.status?.admission.filter(|a| a.in_flight_per_replica == 4).map(|_| ()) }
    })
    .await?;

    let sim = procs::start_sim(&ctx.bins, "live-sim", &fast_model()).await?;
    let sidecar = procs::start_sidecar(&ctx.bins, &sim, kubeconfig, &ns, POOL).await?;
    try_eventually("the sidecar's first limit", Duration::from_secs(30), || async {
        (limit_in_flight(&sidecar).await? == 4.0).then_some(())
    })
    .await?;

    let edits = ctx.pick(8, 20);
    ctx.say(&format!("live limits: {edits} budget edits"));
    let mut latencies = Latencies::new();
    let mut edits_ms = Vec::new();
    for i in 0..edits {
        // One replica, so its share is the whole budget; alternate between two values.
        let value = if i % 2 == 0 { 8 } else { 4 };
        let started = Instant::now();
        let patch = Patch::Merge(json!({ "spec": { "concurrency": { "maxInFlight": value } } }));
        pools.patch(POOL, &PatchParams::default(), &patch).await?;
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
        edits_ms.push(took.as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(LiveLimits { edits_ms, summary: latencies.summary() })
}
