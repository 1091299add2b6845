//! The operator's view of a job: each worker merges the plan and every shard it finishes into the
//! job's progress ConfigMap (`<job>-progress`, made by the operator, which its Role lets the
//! workers get and patch by name), one data key per shard, so workers never overwrite each other
//! and a shard reported twice (found done by a restarted worker) is one key.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use teifleet_crds::job::{PROGRESS_PLAN_KEY, progress_shard_key};

use crate::progress::{ProgressSink, ShardDone, WorkerProgress};
use crate::{Error, Result};

/// Merges progress into one ConfigMap.
#[derive(Clone)]
pub struct ConfigMapSink {
    api: Api<ConfigMap>,
    name: String,
}

impl std::fmt::Debug for ConfigMapSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigMapSink").field("name", &self.name).finish()
    }
}

impl ConfigMapSink {
    /// The ConfigMap `name` in `namespace`, through the pod's own service account.
    pub async fn in_cluster(namespace: &str, name: &str) -> Result<Self> {
        let client = kube::Client::try_default().await.map_err(|source| Error::ProgressConfigMap {
            name: name.to_owned(),
            message: format!("no Kubernetes client in this pod: {source}"),
        })?;
        Ok(Self::new(Api::namespaced(client, namespace), name))
    }

    pub fn new(api: Api<ConfigMap>, name: &str) -> Self {
        Self { api, name: name.to_owned() }
    }
}

/// The data keys one report merges: the plan, and the shard just finished.
pub fn data(progress: &WorkerProgress) -> serde_json::Map<String, serde_json::Value> {
    let mut data = serde_json::Map::new();
    data.insert(PROGRESS_PLAN_KEY.to_owned(), json!(json!(progress.plan).to_string()));
    if let Some(ShardDone { shard, .. }) = progress.last {
        data.insert(progress_shard_key(shard), json!(json!(progress.last).to_string()));
    }
    data
}

impl ProgressSink for ConfigMapSink {
    async fn report(&self, progress: &WorkerProgress) -> Result<()> {
        let patch = Patch::Merge(json!({ "data": data(progress) }));
        self.api
            .patch(&self.name, &PatchParams::default(), &patch)
            .await
            .map(drop)
            .map_err(|source| Error::ProgressConfigMap { name: self.name.clone(), message: source.to_string() })
    }
}

/// Both sinks the binary may have: a file and the ConfigMap.
#[derive(Debug, Default)]
pub struct Sinks {
    pub file: Option<crate::progress::FileSink>,
    pub config_map: Option<ConfigMapSink>,
}

impl ProgressSink for Sinks {
    async fn report(&self, progress: &WorkerProgress) -> Result<()> {
        self.file.report(progress).await?;
        self.config_map.report(progress).await
    }
}

#[cfg(test)]
mod tests {
    use teifleet_crds::job::{ProgressPlan, ShardProgress};

    use super::*;
    use crate::progress::Plan;

    #[test]
    fn a_report_is_the_plan_and_the_last_shard_as_the_operator_reads_them() {
        let mut progress = WorkerProgress::start(1, 2, Plan { shards: 4, bytes: 40, rows: None }, 2);
        let first = data(&progress);
        assert_eq!(first.len(), 1, "before any shard: the plan only");
        progress.record(ShardDone { shard: 3, rows: 7, failed: 1, bytes: 10, seconds: 2.0 }, 2.0);
        let data = data(&progress);
        let plan: ProgressPlan = serde_json::from_str(data["plan"].as_str().unwrap()).unwrap();
        assert_eq!((plan.shards, plan.bytes, plan.rows), (4, 40, None));
        let shard: ShardProgress = serde_json::from_str(data["shard-000003"].as_str().unwrap()).unwrap();
        assert_eq!((shard.shard, shard.rows, shard.failed, shard.bytes), (3, 7, 1, 10));
    }
}
