//! Whether a pool's model fits the GPU memory its share gives: the need as declared
//! (`spec.model.gpuMemory`) or estimated for models the catalogue knows (weights by dtype, TEI's
//! batch buffers for `maxBatchTokens`, the CUDA runtime), against the share's memory. A model that
//! does not fit would be OOM-killed at its first batch, or crowd out its neighbours on a
//! time-sliced GPU, so the operator starts no pod for it and says why.

use crate::sharing::{MIB, Share};
use crate::{Dtype, EmbeddingPoolSpec};

/// A model the estimate knows: its parameters and hidden width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownModel {
    /// The Hugging Face id, matched without regard to case.
    pub id: &'static str,
    /// Parameters, in millions.
    pub parameters_millions: u64,
    /// Width of the hidden states.
    pub hidden: u64,
}

const fn known(id: &'static str, parameters_millions: u64, hidden: u64) -> KnownModel {
    KnownModel { id, parameters_millions, hidden }
}

/// Parameter counts from the models' cards and configurations.
pub const KNOWN_MODELS: &[KnownModel] = &[
    known("BAAI/bge-small-en-v1.5", 33, 384),
    known("BAAI/bge-base-en-v1.5", 109, 768),
    known("BAAI/bge-large-en-v1.5", 335, 1024),
    known("BAAI/bge-m3", 568, 1024),
    known("BAAI/bge-reranker-base", 278, 768),
    known("BAAI/bge-reranker-large", 560, 1024),
    known("BAAI/bge-reranker-v2-m3", 568, 1024),
    known("sentence-transformers/all-MiniLM-L6-v2", 23, 384),
    known("sentence-transformers/all-mpnet-base-v2", 109, 768),
    known("intfloat/e5-small-v2", 33, 384),
    known("intfloat/e5-base-v2", 109, 768),
    known("intfloat/e5-large-v2", 335, 1024),
    known("intfloat/multilingual-e5-large", 560, 1024),
    known("intfloat/e5-mistral-7b-instruct", 7_111, 4096),
    known("thenlper/gte-base", 109, 768),
    known("thenlper/gte-large", 335, 1024),
    known("Alibaba-NLP/gte-Qwen2-1.5B-instruct", 1_776, 1536),
    known("Alibaba-NLP/gte-Qwen2-7B-instruct", 7_613, 3584),
    known("nomic-ai/nomic-embed-text-v1.5", 137, 768),
    known("mixedbread-ai/mxbai-embed-large-v1", 335, 1024),
    known("Snowflake/snowflake-arctic-embed-m", 109, 768),
    known("Snowflake/snowflake-arctic-embed-l", 335, 1024),
    known("jinaai/jina-embeddings-v2-base-en", 137, 768),
    known("naver/splade-cocondenser-ensembledistil", 110, 768),
    known("Qwen/Qwen3-Embedding-0.6B", 596, 1024),
    known("Qwen/Qwen3-Embedding-4B", 4_022, 2560),
    known("Qwen/Qwen3-Embedding-8B", 7_568, 4096),
];

/// Hidden-width vectors one token holds at the widest point of a layer (its input, Q, K and V,
/// the attention output and the MLP's 4× intermediate, with room for gated MLPs): TEI runs a
/// whole batch through one layer at a time, so one layer's activations are what a batch adds.
const ACTIVATION_VECTORS_PER_TOKEN: u64 = 16;
/// The CUDA context, cuBLAS workspaces and the allocator's slack every TEI process holds.
const CUDA_RUNTIME_MIB: u64 = 512;

/// How much GPU memory the model needs, and where the figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// `spec.model.gpuMemory`.
    Declared { mib: u64 },
    /// From the catalogue.
    Estimated { mib: u64, weights_mib: u64, buffers_mib: u64, batch_tokens: i32, dtype: &'static str },
}

impl Need {
    pub fn mib(&self) -> u64 {
        match self {
            Self::Declared { mib } | Self::Estimated { mib, .. } => *mib,
        }
    }

    /// How the figure was reached, for messages.
    pub fn explain(&self) -> String {
        match self {
            Self::Declared { .. } => "declared in spec.model.gpuMemory".to_owned(),
            Self::Estimated { weights_mib, buffers_mib, batch_tokens, dtype, .. } => format!(
                "estimated: {} of weights in {dtype}, {} of batch buffers for {batch_tokens} tokens, {} of CUDA runtime",
                gib(*weights_mib),
                gib(*buffers_mib),
                gib(CUDA_RUNTIME_MIB)
            ),
        }
    }
}

/// The model's need, declared or estimated; `None` when neither is possible (a model the
/// catalogue does not know, without `gpuMemory`).
pub fn need(spec: &EmbeddingPoolSpec) -> Option<Need> {
    if let Some(declared) = &spec.model.gpu_memory {
        return quantity_bytes(&declared.0).map(|bytes| Need::Declared { mib: (bytes / MIB as f64).ceil() as u64 });
    }
    let model = KNOWN_MODELS.iter().find(|known| known.id.eq_ignore_ascii_case(spec.model.id.trim()))?;
    // TEI loads weights in float16 on a GPU unless told otherwise.
    let (dtype, bytes) = match spec.model.dtype.unwrap_or(Dtype::Float16) {
        Dtype::Float16 => ("float16", 2),
        Dtype::Bfloat16 => ("bfloat16", 2),
        Dtype::Float32 => ("float32", 4),
    };
    let batch_tokens = spec.max_batch_tokens_or_tei_default();
    let weights_mib = (model.parameters_millions * 1_000_000 * bytes).div_ceil(MIB);
    let tokens = u64::try_from(batch_tokens).unwrap_or(0);
    let buffers_mib = (tokens * model.hidden * bytes * ACTIVATION_VECTORS_PER_TOKEN).div_ceil(MIB);
    Some(Need::Estimated {
        mib: weights_mib + buffers_mib + CUDA_RUNTIME_MIB,
        weights_mib,
        buffers_mib,
        batch_tokens,
        dtype,
    })
}

/// A model that needs more GPU memory than its share gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub need: Need,
    pub share_mib: u64,
    pub message: String,
}

/// `Some` when the pool's model does not fit its share: the message names both figures and
/// what to change.
pub fn shortfall(spec: &EmbeddingPoolSpec) -> Option<Shortfall> {
    let share = Share::of(&spec.gpu)?;
    let share_mib = share.memory_mib(spec.gpu.type_)?;
    let need = need(spec)?;
    if need.mib() <= share_mib {
        return None;
    }
    let message = format!(
        "{} needs {} of GPU memory ({}) but {} gives {}: ask for a larger share (fewer replicas per GPU, a larger MIG profile or whole GPUs){}",
        spec.model.id,
        gib(need.mib()),
        need.explain(),
        share.describe(spec.gpu.type_),
        gib(share_mib),
        match need {
            Need::Estimated { .. } =>
                ", lower tei.maxBatchTokens, or declare the measured need in spec.model.gpuMemory",
            Need::Declared { .. } => "",
        },
    );
    Some(Shortfall { need, share_mib, message })
}

/// MiB in GiB with one decimal: `5.6 GiB`.
pub fn gib(mib: u64) -> String {
    format!("{:.1} GiB", mib as f64 / 1024.0)
}

/// A Kubernetes quantity in bytes (`3Gi`, `2500M`, `1.5Gi`, `1e9`); `None` if it is not one.
pub fn quantity_bytes(quantity: &str) -> Option<f64> {
    let quantity = quantity.trim();
    let suffixes: [(&str, f64); 12] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let (number, scale) = suffixes
        .iter()
        .find_map(|(suffix, scale)| quantity.strip_suffix(suffix).map(|number| (number, *scale)))
        .unwrap_or((quantity, 1.0));
    let value: f64 = number.parse().ok()?;
    (value.is_finite() && value >= 0.0).then_some(value * scale)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::sharing::{GpuSharing, SharingStrategy};
    use crate::{GpuSpec, GpuType, ModelSpec};

    fn pool(model: &str, gpu: GpuType, sharing: Option<GpuSharing>) -> EmbeddingPoolSpec {
        let json = serde_json::json!({ "model": { "id": model } });
        let mut spec: EmbeddingPoolSpec = serde_json::from_value(json).unwrap();
        spec.gpu = GpuSpec { type_: gpu, count: 1, sharing };
        spec
    }

    fn time_sliced(replicas: i32) -> Option<GpuSharing> {
        Some(GpuSharing {
            strategy: SharingStrategy::TimeSlicing,
            replicas: Some(replicas),
            profile: None,
            rename_by_default: false,
        })
    }

    #[test]
    fn a_small_model_fits_a_quarter_of_an_l4() {
        let spec = pool("BAAI/bge-small-en-v1.5", GpuType::NvidiaL4, time_sliced(4));
        let need = need(&spec).unwrap();
        // 33M parameters in float16 (63 MiB), 4096 tokens (the quarter's default) x 384 x 2 bytes
        // x 16 (48 MiB), 512 MiB of runtime.
        assert_eq!(need.mib(), 63 + 48 + 512, "{need:?}");
        assert_eq!(shortfall(&spec), None);
    }

    #[test]
    fn an_8b_model_does_not_fit_a_quarter_of_an_l4_and_the_message_says_by_how_much() {
        let spec = pool("Qwen/Qwen3-Embedding-8B", GpuType::NvidiaL4, time_sliced(4));
        let shortfall = shortfall(&spec).unwrap();
        assert_eq!(shortfall.share_mib, 23_034 / 4);
        assert!(shortfall.need.mib() > 14 * 1024, "{:?}", shortfall.need);
        assert_eq!(
            shortfall.message,
            "Qwen/Qwen3-Embedding-8B needs 15.1 GiB of GPU memory (estimated: 14.1 GiB of weights in float16, 0.5 GiB of batch \
             buffers for 4096 tokens, 0.5 GiB of CUDA runtime) but a 1/4 time-slicing share of one nvidia-l4 gives 5.6 GiB: \
             ask for a larger share (fewer replicas per GPU, a larger MIG profile or whole GPUs), lower tei.maxBatchTokens, \
             or declare the measured need in spec.model.gpuMemory"
        );
        // A whole L4 holds it.
        assert_eq!(super::shortfall(&pool("Qwen/Qwen3-Embedding-8B", GpuType::NvidiaL4, None)), None);
    }

    #[test]
    fn a_declared_need_wins_over_the_estimate() {
        let mut spec = pool("BAAI/bge-small-en-v1.5", GpuType::NvidiaH100_80gb, None);
        spec.gpu.sharing = Some(GpuSharing {
            strategy: SharingStrategy::Mig,
            replicas: None,
            profile: Some("1g.10gb".into()),
            rename_by_default: false,
        });
        spec.model = ModelSpec { gpu_memory: Some(Quantity("12Gi".into())), ..spec.model };
        let shortfall = shortfall(&spec).unwrap();
        assert_eq!(shortfall.need, Need::Declared { mib: 12 * 1024 });
        assert!(shortfall.message.contains("needs 12.0 GiB of GPU memory (declared in spec.model.gpuMemory) but a MIG 1g.10gb instance of one nvidia-h100-80gb gives 9.3 GiB"), "{}", shortfall.message);
    }

    #[test]
    fn unknown_models_without_a_declared_need_are_not_judged() {
        assert_eq!(need(&pool("my-org/private-model", GpuType::NvidiaL4, time_sliced(8))), None);
        assert_eq!(shortfall(&pool("my-org/private-model", GpuType::NvidiaL4, time_sliced(8))), None);
    }

    #[test]
    fn quantities_parse_as_kubernetes_spells_them() {
        assert_eq!(quantity_bytes("3Gi"), Some(3.0 * 1024f64.powi(3)));
        assert_eq!(quantity_bytes("1.5Gi"), Some(1.5 * 1024f64.powi(3)));
        assert_eq!(quantity_bytes("2500M"), Some(2.5e9));
        assert_eq!(quantity_bytes("1e9"), Some(1e9));
        assert_eq!(quantity_bytes("8GB"), None);
    }
}
