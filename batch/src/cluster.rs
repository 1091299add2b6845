//! What the server asks of Kubernetes, behind a trait so the HTTP API is tested without a cluster:
//! find the pool serving a model, and create, read, list and cancel the batches' EmbeddingJobs.
//! [`KubeCluster`] is the real one, in the server's namespace.

use futures::future::BoxFuture;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use teifleet_crds::{EmbeddingJob, EmbeddingPool};

use crate::Result;

/// Label on every batch's job: the batch id.
pub const BATCH_LABEL: &str = "teifleet.dev/batch";
/// Label on every batch's job: the tenant that created it.
pub const TENANT_LABEL: &str = "teifleet.dev/tenant";
pub const INPUT_FILE_ANNOTATION: &str = "teifleet.dev/batch-input-file";
pub const ENDPOINT_ANNOTATION: &str = "teifleet.dev/batch-endpoint";
pub const COMPLETION_WINDOW_ANNOTATION: &str = "teifleet.dev/batch-completion-window";
/// The batch's metadata, a JSON object.
pub const METADATA_ANNOTATION: &str = "teifleet.dev/batch-metadata";
/// Requests in the input file.
pub const REQUESTS_ANNOTATION: &str = "teifleet.dev/batch-requests";
/// Set on cancel (unix seconds), with `spec.suspend: true`.
pub const CANCELLING_AT_ANNOTATION: &str = "teifleet.dev/batch-cancelling-at";

/// The server's field manager on the API server.
const MANAGER: &str = "teifleet-batch";

/// The cluster operations the API needs.
pub trait Cluster: Send + Sync + 'static {
    /// The name of an EmbeddingPool whose `spec.model.id` is `model` (the first by name if several).
    fn pool_for_model<'a>(&'a self, model: &'a str) -> BoxFuture<'a, Result<Option<String>>>;
    fn create_job<'a>(&'a self, job: &'a EmbeddingJob) -> BoxFuture<'a, Result<EmbeddingJob>>;
    fn get_job<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<EmbeddingJob>>>;
    /// Every batch job of `tenant`.
    fn list_jobs<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<Vec<EmbeddingJob>>>;
    /// Suspends the job and records when the cancel was asked.
    fn cancel_job<'a>(&'a self, name: &'a str, at: i64) -> BoxFuture<'a, Result<EmbeddingJob>>;
}

/// The API server, in one namespace.
#[derive(Clone)]
pub struct KubeCluster {
    jobs: Api<EmbeddingJob>,
    pools: Api<EmbeddingPool>,
}

impl KubeCluster {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self { jobs: Api::namespaced(client.clone(), namespace), pools: Api::namespaced(client, namespace) }
    }
}

impl Cluster for KubeCluster {
    fn pool_for_model<'a>(&'a self, model: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(async move {
            let pools = self.pools.list(&ListParams::default()).await?;
            let mut names: Vec<String> = pools
                .items
                .into_iter()
                .filter(|pool| pool.spec.model.id == model)
                .filter_map(|pool| pool.metadata.name)
                .collect();
            names.sort();
            Ok(names.into_iter().next())
        })
    }

    fn create_job<'a>(&'a self, job: &'a EmbeddingJob) -> BoxFuture<'a, Result<EmbeddingJob>> {
        Box::pin(async move {
            let params = PostParams { field_manager: Some(MANAGER.to_owned()), ..PostParams::default() };
            Ok(self.jobs.create(&params, job).await?)
        })
    }

    fn get_job<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<EmbeddingJob>>> {
        Box::pin(async move { Ok(self.jobs.get_opt(name).await?) })
    }

    fn list_jobs<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<Vec<EmbeddingJob>>> {
        Box::pin(async move {
            let selector = format!("{TENANT_LABEL}={tenant},{BATCH_LABEL}");
            Ok(self.jobs.list(&ListParams::default().labels(&selector)).await?.items)
        })
    }

    fn cancel_job<'a>(&'a self, name: &'a str, at: i64) -> BoxFuture<'a, Result<EmbeddingJob>> {
        Box::pin(async move {
            let patch = json!({
                "metadata": { "annotations": { CANCELLING_AT_ANNOTATION: at.to_string() } },
                "spec": { "suspend": true },
            });
            let params = PatchParams { field_manager: Some(MANAGER.to_owned()), ..PatchParams::default() };
            Ok(self.jobs.patch(name, &params, &Patch::Merge(&patch)).await?)
        })
    }
}
