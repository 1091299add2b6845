//! The local control plane side of the live-limit scenario: a client from a kubeconfig, the
//! EmbeddingPool CRD applied and established, and a namespace of its own removed afterwards.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;
use tokio::time::Instant;

use crate::{Error, Result};

pub async fn client(kubeconfig: &Path) -> Result<Client> {
    let file = Kubeconfig::read_from(kubeconfig).map_err(|e| Error::Process(format!("kubeconfig: {e}")))?;
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Process(format!("kubeconfig: {e}")))?;
    Ok(Client::try_from(config)?)
}

/// Polls `check` every 100 ms until it yields, for at most `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
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

/// Applies the CRD checked in at `crd_file` and waits until the API server serves it.
pub async fn install_crd(client: &Client, crd_file: &Path) -> Result<()> {
    let text = std::fs::read_to_string(crd_file).map_err(|source| Error::File {
        what: "reading",
        path: crd_file.into(),
        source,
    })?;
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

/// A namespace of this run's own; deleted (best effort, in the background) when dropped.
pub struct TempNamespace {
    api: Api<Namespace>,
    pub name: String,
}

impl TempNamespace {
    /// Creates `<prefix>-<suffix>` and waits for its default ServiceAccount (pods need it).
    pub async fn create(client: &Client, prefix: &str) -> Result<Self> {
        let suffix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() % 1_000_000)
            .unwrap_or(0);
        let name = format!("{prefix}-{suffix}");
        let api: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } }))?;
        api.create(&PostParams::default(), &namespace).await?;
        let guard = Self { api, name: name.clone() };
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        eventually("the default ServiceAccount", Duration::from_secs(30), || {
            let accounts = accounts.clone();
            async move { accounts.get_opt("default").await.ok().flatten() }
        })
        .await?;
        Ok(guard)
    }
}

impl Drop for TempNamespace {
    fn drop(&mut self) {
        let (api, name) = (self.api.clone(), self.name.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            });
        }
    }
}
