//! Where pools and their limits come from: a static description (flags or a YAML file that is
//! re-read when it changes) or the EmbeddingPools of the namespace, watched in Kubernetes.

pub mod file;
pub mod kubernetes;
