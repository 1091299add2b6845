//! A test's footing on a Kubernetes cluster: a client from a kubeconfig, the CRD installed and
//! served, and namespaces that exist for one test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::poll::try_eventually;
use crate::{Error, Result};

/// Set to keep test namespaces after the test, to look at what it left.
pub const KEEP_NAMESPACES_ENV: &str = "TEIFLEET_KEEP_NAMESPACES";

/// A client for the cluster and user of `kubeconfig`'s current context.
pub async fn client(kubeconfig: &Path) -> Result<Client> {
    let invalid = |message: String| Error::Invalid { what: format!("kubeconfig {}", kubeconfig.display()), message };
    let file = Kubeconfig::read_from(kubeconfig).map_err(|e| invalid(e.to_string()))?;
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(e.to_string()))?;
    Client::try_from(config).map_err(Error::Kube)
}

/// Applies (server-side, as `field_manager`) the CRD in `crd_file` and waits until the API server
/// serves it.
pub async fn install_crd(client: &Client, crd_file: &Path, field_manager: &str) -> Result<()> {
    let text = std::fs::read_to_string(crd_file).map_err(|source| Error::File { path: crd_file.into(), source })?;
    let crd: CustomResourceDefinition = serde_norway::from_str(&text)
        .map_err(|e| Error::Invalid { what: format!("CRD {}", crd_file.display()), message: e.to_string() })?;
    let name = crd.metadata.name.clone().unwrap_or_default();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(&name, &PatchParams::apply(field_manager).force(), &Patch::Apply(&crd)).await?;
    try_eventually(&format!("the CRD {name} to be established"), Duration::from_secs(30), || {
        let (api, name) = (api.clone(), name.clone());
        async move {
            let crd = api.get(&name).await.ok()?;
            crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        }
    })
    .await?;
    // A fresh client's discovery may lag an established CRD by a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

/// A namespace that exists for one test, deleted when dropped (unless [`KEEP_NAMESPACES_ENV`] is
/// set).
#[derive(Debug)]
pub struct TestNamespace {
    pub name: String,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    /// Creates `<prefix>-<suffix>` with `labels`, as the user of `kubeconfig`, and waits for its
    /// default ServiceAccount, which pods need (the controller-manager makes it).
    pub async fn create(kubeconfig: &Path, prefix: &str, labels: BTreeMap<String, String>) -> Result<Self> {
        let client = client(kubeconfig).await?;
        let suffix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_millis() % 1_000_000)
            .unwrap_or_default();
        let name = format!("{prefix}-{suffix}");
        let namespace = Namespace {
            metadata: ObjectMeta { name: Some(name.clone()), labels: Some(labels), ..Default::default() },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
        let guard = Self { name: name.clone(), kubeconfig: kubeconfig.to_owned() };
        let accounts: Api<ServiceAccount> = Api::namespaced(client, &name);
        try_eventually(&format!("the default ServiceAccount of {name}"), Duration::from_secs(30), || {
            let accounts = accounts.clone();
            async move { accounts.get_opt("default").await.ok().flatten() }
        })
        .await?;
        Ok(guard)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os(KEEP_NAMESPACES_ENV).is_some() {
            return;
        }
        // The test's runtime may be finishing, and a kube client dies with the runtime it was made
        // in, so the deletion gets a thread, a runtime and a client of its own. Not waiting for
        // the namespace to go: its finalizers can take a while.
        let (name, kubeconfig) = (self.name.clone(), self.kubeconfig.clone());
        let deletion = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                let client = client(&kubeconfig).await.ok()?;
                Api::<Namespace>::all(client).delete(&name, &DeleteParams::background()).await.ok()
            })
        });
        let _ = deletion.join();
    }
}
