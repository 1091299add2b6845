//! An in-memory cluster: pools by model, jobs created, read, listed and cancelled as the API server
//! would (a merge patch for cancel), and a way for a test to play the operator (set a status).

use std::sync::Mutex;

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use teifleet_batch::Result;
use teifleet_batch::cluster::{CANCELLING_AT_ANNOTATION, Cluster, TENANT_LABEL};
use teifleet_crds::{EmbeddingJob, EmbeddingJobStatus};

pub struct FakeCluster {
    pools: Vec<(String, String)>,
    pub jobs: Mutex<Vec<EmbeddingJob>>,
}

impl FakeCluster {
    pub fn new(pools: &[(&str, &str)]) -> Self {
        Self {
            pools: pools.iter().map(|(n, m)| (n.to_string(), m.to_string())).collect(),
            jobs: Mutex::new(Vec::new()),
        }
    }

    pub fn job(&self, name: &str) -> Option<EmbeddingJob> {
        self.jobs.lock().unwrap().iter().find(|job| job.metadata.name.as_deref() == Some(name)).cloned()
    }

    /// The operator's part: a job's status.
    pub fn set_status(&self, name: &str, status: EmbeddingJobStatus) {
        let mut jobs = self.jobs.lock().unwrap();
        let job = jobs.iter_mut().find(|job| job.metadata.name.as_deref() == Some(name)).expect("the job");
        job.status = Some(status);
    }
}

impl Cluster for FakeCluster {
    fn pool_for_model<'a>(&'a self, model: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(async move { Ok(self.pools.iter().find(|(_, m)| m == model).map(|(name, _)| name.clone())) })
    }

    fn create_job<'a>(&'a self, job: &'a EmbeddingJob) -> BoxFuture<'a, Result<EmbeddingJob>> {
        Box::pin(async move {
            let mut created = job.clone();
            created.metadata.namespace = Some("ml".into());
            created.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
            let mut jobs = self.jobs.lock().unwrap();
            assert!(jobs.iter().all(|j| j.metadata.name != created.metadata.name), "names are unique");
            jobs.push(created.clone());
            Ok(created)
        })
    }

    fn get_job<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<EmbeddingJob>>> {
        Box::pin(async move { Ok(self.job(name)) })
    }

    fn list_jobs<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<Vec<EmbeddingJob>>> {
        Box::pin(async move {
            let jobs = self.jobs.lock().unwrap();
            Ok(jobs
                .iter()
                .filter(|job| {
                    job.metadata.labels.as_ref().and_then(|l| l.get(TENANT_LABEL)).is_some_and(|t| t == tenant)
                })
                .cloned()
                .collect())
        })
    }

    fn cancel_job<'a>(&'a self, name: &'a str, at: i64) -> BoxFuture<'a, Result<EmbeddingJob>> {
        Box::pin(async move {
            let mut jobs = self.jobs.lock().unwrap();
            let job = jobs.iter_mut().find(|job| job.metadata.name.as_deref() == Some(name)).expect("the job");
            job.metadata.annotations.get_or_insert_default().insert(CANCELLING_AT_ANNOTATION.into(), at.to_string());
            job.spec.suspend = true;
            Ok(job.clone())
        })
    }
}
