//! Pure functions from an EmbeddingPool to the objects the operator maintains for it.
//!
//! Nothing here talks to the API server: every child is a value computed from the pool and the
//! operator's configuration, so each one is covered by golden tests without a cluster.

pub mod activator;
mod cache;
pub(crate) mod deployment;
mod network_policy;
mod pdb;
mod peer_secret;
pub(crate) mod rbac;
mod services;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use teifleet_crds::{EmbeddingPool, labels};

pub use deployment::{deployment_replicas, desired_replicas, tei_image, tei_max_concurrent_requests};

use crate::{Error, Result};

/// Images and ports the operator renders with; set from its command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderConfig {
    /// Repository of TEI's images; the tag is chosen per GPU architecture.
    pub tei_repository: String,
    /// TEI release, e.g. `1.9`.
    pub tei_version: String,
    /// The multiplexer sidecar image.
    pub multiplexer_image: String,
    /// The namespace the operator runs in, whose pods the pools' NetworkPolicies let reach the
    /// sidecars' admin port: the operator reads each pool's admission there. `None` out of a
    /// cluster, where the operator's calls come from a node, which NetworkPolicies never block.
    pub operator_namespace: Option<String>,
    /// Whether each namespace's activator gets its NetworkPolicy (the chart's
    /// `networkPolicy.enabled`). Pools' own policies follow their `spec.networkPolicy`.
    pub activator_network_policy: bool,
    /// How many replicas each namespace's activator runs (`--activator-replicas`, the chart's
    /// `activator.replicas`): two or more keep the pools at zero answered while one restarts.
    pub activator_replicas: i32,
}

impl Default for RenderConfig {
    fn default() -> Self {
        Self {
            tei_repository: "ghcr.io/huggingface/text-embeddings-inference".into(),
            tei_version: "1.9".into(),
            multiplexer_image: format!("ghcr.io/teifleet/multiplexer:{}", env!("CARGO_PKG_VERSION")),
            operator_namespace: None,
            activator_network_policy: true,
            activator_replicas: 2,
        }
    }
}

/// Everything one pool owns.
#[derive(Clone, Debug, PartialEq)]
pub struct Children {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub service: Service,
    pub peers_service: Service,
    pub deployment: Deployment,
    /// Present only when the pool runs more than one replica.
    pub pdb: Option<PodDisruptionBudget>,
    /// Present unless the pool turns it off (`spec.networkPolicy.enabled: false`).
    pub network_policy: Option<NetworkPolicy>,
}

/// Renders every child of `pool`; `autoscaled` is the autoscaler's replica count for a pool with
/// `spec.autoscaling` (see [`deployment_replicas`]). Fails only for a pool without the name,
/// namespace or uid the children's metadata and owner reference are built from; the API server
/// always sets them.
pub fn render(pool: &EmbeddingPool, config: &RenderConfig, autoscaled: Option<i32>) -> Result<Children> {
    let owner = Owner::of(pool)?;
    Ok(Children {
        service_account: rbac::service_account(&owner),
        role: rbac::role(&owner, pool),
        role_binding: rbac::role_binding(&owner),
        service: services::service(&owner, pool),
        peers_service: services::peers_service(&owner, pool),
        deployment: deployment::deployment(&owner, pool, config, autoscaled),
        pdb: pdb::pdb(&owner, pool),
        network_policy: network_policy::network_policy(&owner, pool, config),
    })
}

/// The pool's peer Secret holding `key` (text: the caller encodes the random bytes); see
/// [`teifleet_crds::labels::peer_secret_name`]. Fails as [`render`] does.
pub fn peer_secret(pool: &EmbeddingPool, key: &str) -> Result<Secret> {
    Ok(peer_secret::peer_secret(&Owner::of(pool)?, key))
}

/// The identity every child carries: name, namespace, labels and the controller owner reference
/// that lets the garbage collector remove it with its owner (a pool, or an EmbeddingJob).
pub(crate) struct Owner {
    pub(crate) name: String,
    pub(crate) namespace: String,
    reference: OwnerReference,
    labels: BTreeMap<String, String>,
}

impl Owner {
    fn of(pool: &EmbeddingPool) -> Result<Self> {
        Self::with_labels(pool, |name| {
            BTreeMap::from([
                (labels::NAME_LABEL.into(), "tei".into()),
                (labels::INSTANCE_LABEL.into(), name.to_owned()),
                (labels::COMPONENT_LABEL.into(), "embedding-server".into()),
                (labels::PART_OF_LABEL.into(), "teifleet".into()),
                (labels::MANAGED_BY_LABEL.into(), labels::MANAGER.into()),
                (labels::POOL_LABEL.into(), name.to_owned()),
            ])
        })
    }

    /// The owner `object`, its children labelled with what `labels` gives for its name. Fails for
    /// an object without the name, namespace or uid (the API server always sets them).
    pub(crate) fn with_labels<K: Resource<DynamicType = ()>>(
        object: &K,
        labels: impl FnOnce(&str) -> BTreeMap<String, String>,
    ) -> Result<Self> {
        let meta = object.meta();
        let name = meta.name.clone().ok_or(Error::MissingField("metadata.name"))?;
        let namespace = meta.namespace.clone().ok_or(Error::MissingField("metadata.namespace"))?;
        let reference = object.controller_owner_ref(&()).ok_or(Error::MissingField("metadata.uid"))?;
        let labels = labels(&name);
        Ok(Self { name, namespace, reference, labels })
    }

    /// Labels on every child and pod of the owner.
    pub(crate) fn labels(&self) -> BTreeMap<String, String> {
        self.labels.clone()
    }

    /// The stable label subset that selects the pool's pods.
    fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(labels::POOL_LABEL.into(), self.name.clone())])
    }

    pub(crate) fn meta(&self, name: String) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels()),
            owner_references: Some(vec![self.reference.clone()]),
            ..ObjectMeta::default()
        }
    }
}
