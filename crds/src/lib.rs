//! The `EmbeddingPool` and `EmbeddingJob` APIs (`teifleet.dev/v1alpha1`): Rust types that generate the
//! CRD schemas and their CEL validation, the GPU catalogue, condition helpers and the pool budget
//! arithmetic.
//!
//! This crate does no I/O; the operator and the multiplexer both build on it.
#![deny(warnings, rust_2018_idioms)]
#![forbid(unsafe_code)]

pub mod autoscaling;
pub mod budget;
pub mod cache;
pub mod conditions;
pub mod duration;
pub mod effective;
pub mod gpu;
pub mod gpu_memory;
pub mod job;
pub mod labels;
mod pool;
pub mod sharing;
mod slice;

pub use autoscaling::{AutoscalingSpec, AutoscalingStatus};
pub use budget::{Shares, split_budget};
pub use cache::{CacheSpec, CacheStoreSpec};
pub use effective::{
    ActivatorReport, CertificateSummary, EffectiveLimits, HeldCalls, PoolDemand, SidecarAdmission, SidecarTls,
};
pub use gpu::GpuType;
pub use job::{
    ApiKeySecret, EmbeddingJob, EmbeddingJobSpec, EmbeddingJobStatus, EmbeddingOptions, InputFormat, InputSpec,
    OutputSpec, PoolRef, PvcStore, S3Store, StoreSpec, VectorDtype, WorkerPodOverrides,
};
pub use pool::*;
pub use sharing::{GpuSharing, Share, SharingStrategy};

/// The API group every teifleet resource lives in.
pub const GROUP: &str = "teifleet.dev";
