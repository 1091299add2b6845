//! teifleet's operator: reconciles each EmbeddingPool into a TEI Deployment with the multiplexer
//! sidecar, its Services, the sidecar's RBAC and a PodDisruptionBudget, and each EmbeddingJob into
//! an Indexed Job of `teifleet-job` workers, and reports honest status.
#![deny(warnings, rust_2018_idioms)]
#![forbid(unsafe_code)]

pub mod activator;
pub mod admin;
pub mod autoscale;
pub mod controller;
pub mod jobs;
pub mod leader;
pub mod metrics;
pub mod peer_secret;
pub mod render;
pub mod sidecars;
pub mod status;
pub mod watch_health;

/// Everything that can go wrong inside the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),

    #[error("the object has no {0}")]
    MissingField(&'static str),

    #[error("the EmbeddingJob's {field} is invalid: {message}")]
    InvalidJob { field: &'static str, message: String },

    #[error("lost the leader lease: {0}")]
    LostLease(String),

    #[error("the operating system gave no random bytes for a pool's peer key: {0}")]
    Random(String),
}

impl Error {
    /// The API server refused a write because the namespace is being deleted.
    pub fn is_namespace_terminating(&self) -> bool {
        matches!(self, Self::Kube(error) if namespace_terminating(error))
    }

    /// A short, bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube(kube::Error::Api(status)) if status.code == 403 => "forbidden",
            Self::Kube(kube::Error::Api(status)) if status.code == 409 => "conflict",
            Self::Kube(_) => "kube",
            Self::MissingField(_) => "missing_field",
            Self::InvalidJob { .. } => "invalid_job",
            Self::LostLease(_) => "lost_lease",
            Self::Random(_) => "random",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether the API server refused a write because the namespace is being deleted.
pub fn namespace_terminating(error: &kube::Error) -> bool {
    let kube::Error::Api(status) = error else { return false };
    let causes = status.details.as_ref().map(|details| details.causes.as_slice()).unwrap_or_default();
    status.code == 403 && causes.iter().any(|cause| cause.reason == "NamespaceTerminating")
}

#[cfg(test)]
mod tests {
    use kube::core::Status;
    use serde_json::json;

    use super::*;

    #[test]
    fn a_write_refused_in_a_terminating_namespace_is_told_apart() {
        let refused = |reason: &str| {
            let status: Status = serde_json::from_value(json!({
                "status": "Failure", "code": 403, "reason": "Forbidden", "message": "refused",
                "details": { "name": "x", "kind": "serviceaccounts", "causes": [{ "reason": reason }] },
            }))
            .unwrap();
            Error::Kube(kube::Error::Api(Box::new(status)))
        };
        assert!(refused("NamespaceTerminating").is_namespace_terminating());
        assert!(!refused("FieldValueInvalid").is_namespace_terminating());
        assert!(!Error::MissingField("x").is_namespace_terminating());
    }
}
