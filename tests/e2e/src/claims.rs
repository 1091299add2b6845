//! Storage the real-node tests hand to pods: the EmbeddingJob CRD, and PersistentVolumeClaims bound
//! to hostPath volumes under a directory of this machine (the real node's kubelet runs here), so a
//! test writes what pods read and reads what they wrote directly.

use std::path::Path;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::real::{Images, NODE, prerequisites, restricted_namespace};
use crate::{TestNamespace, built_image, import_into_real_node, install_crd, repo_root};

/// What every real-node test of EmbeddingJobs starts with: the images (the base ones and
/// `more`, such as `job`) imported into the real node, both CRDs, a restricted namespace named
/// from `prefix`; `None` (the test skipped, with a line saying why) without the node or an image.
pub async fn ready_for_jobs(client: &Client, more: &[&'static str], prefix: &str) -> Option<(TestNamespace, Images)> {
    let mut images = prerequisites(client).await?;
    for name in more {
        let Some(image) = built_image(name) else {
            eprintln!("skipped: no target/images/{name}.tar (make images builds it)");
            return None;
        };
        images.insert(name, image);
    }
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    install_crd(client).await;
    install_job_crd(client).await;
    Some((restricted_namespace(prefix).await, images))
}

/// Installs the EmbeddingJob CRD (the pool's is `install_crd`).
pub async fn install_job_crd(client: &Client) {
    let crd = repo_root().join("crds/teifleet.dev_embeddingjobs.yaml");
    teifleet_testkit::kube::install_crd(client, &crd, "teifleet-e2e").await.expect("the job CRD installs");
}

/// The pods run as their images' non-root users: the host directories must let them read and write.
pub fn open_to_every_user(dir: &Path) {
    let status = std::process::Command::new("chmod").args(["-R", "a+rwX"]).arg(dir).status().unwrap();
    assert!(status.success());
}

/// The cluster-wide volume behind claim `claim` of `namespace`.
pub fn pv_name(namespace: &str, claim: &str) -> String {
    format!("{namespace}-{claim}")
}

/// A claim `name` bound to a hostPath volume at `dir` on the real node.
pub async fn host_claim(client: &Client, namespace: &str, name: &str, dir: &Path) {
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": { "name": pv_name(namespace, name) },
        "spec": {
            "capacity": { "storage": "1Gi" },
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": { "path": dir.display().to_string(), "type": "Directory" },
            "claimRef": { "namespace": namespace, "name": name },
            "nodeAffinity": { "required": { "nodeSelectorTerms": [{ "matchExpressions": [
                { "key": "kubernetes.io/hostname", "operator": "In", "values": [NODE] }
            ] }] } },
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": pv_name(namespace, name),
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
}

/// Deletes the volumes behind `claims` (their namespace's deletion takes the claims, not the
/// cluster-wide volumes).
pub async fn delete_host_volumes(client: &Client, namespace: &str, claims: &[&str]) {
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    for name in claims {
        let _ = Api::<PersistentVolume>::all(client.clone()).delete(&pv_name(namespace, name), &now).await;
    }
}
