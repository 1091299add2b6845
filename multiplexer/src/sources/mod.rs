//! Where pools, their limits and the API keys come from: a static description (flags or a YAML
//! file that is re-read when it changes, with a keys file beside it) or the EmbeddingPools of the
//! namespace and the one Secret of keys the own pool names, watched in Kubernetes; and the own
//! pool's other replicas, where its calls spill (flags, or its EndpointSlices); and the certificate
//! set of TLS (files, or the Secret `spec.tls` names); and the pool's peer key, which proves a
//! spill is a sibling's (a file, or the Secret the operator creates for the pool).

pub mod activator;
pub mod budget;
pub mod file;
pub mod kubernetes;
pub mod peer;
pub mod secret;
pub mod siblings;
pub mod tls_files;
pub mod tls_secret;
