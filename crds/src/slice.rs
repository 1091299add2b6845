//! Defaults that follow the share of a GPU a replica gets, not the whole card: TEI's batch size,
//! the per-replica in-flight cap (and so the adaptive limit's ceiling) and the `tei` container's
//! CPU and memory requests. Whole-GPU pools keep their defaults unchanged.

use crate::EmbeddingPoolSpec;
use crate::sharing::Share;

/// TEI's `--max-batch-tokens` default, sized for a whole GPU.
pub const TEI_DEFAULT_MAX_BATCH_TOKENS: i32 = 16_384;
/// The smallest batch a share gets by default: BERT-style models take 512-token inputs, and a
/// batch should hold two of them.
const MIN_SHARE_BATCH_TOKENS: i32 = 1024;
/// Tokens of a typical embedding input, for the in-flight cap: a replica lets in about one batch
/// of such inputs.
const TYPICAL_INPUT_TOKENS: i32 = 128;
/// The fewest inputs a share's replica lets in by default.
const MIN_SHARE_IN_FLIGHT: i32 = 4;
/// Floors of a share's CPU (millicores) and memory (MiB) requests: TEI tokenizes on the CPU and
/// holds the weights in host memory while it loads them, whatever its slice.
const MIN_SHARE_CPU_MILLIS: u64 = 500;
const MIN_SHARE_MEMORY_MIB: u64 = 2048;

impl EmbeddingPoolSpec {
    /// What each replica takes of a GPU (`None` for `cpu` pools).
    pub fn share(&self) -> Option<Share> {
        Share::of(&self.gpu)
    }

    /// The share of a GPU when it is less than a whole one.
    fn partial_share(&self) -> Option<Share> {
        self.share().filter(Share::is_partial)
    }

    /// TEI's `--max-batch-tokens` as the operator renders it: `tei.maxBatchTokens`, else for a
    /// partial share TEI's default scaled to the share's fraction of the card (rounded down to a
    /// power of two, at least 1024); `None` leaves TEI's own default.
    pub fn max_batch_tokens(&self) -> Option<i32> {
        if let Some(tokens) = self.tei.max_batch_tokens {
            return Some(tokens);
        }
        let (numerator, denominator) = self.partial_share()?.fraction();
        let scaled = i64::from(TEI_DEFAULT_MAX_BATCH_TOKENS) * i64::from(numerator) / i64::from(denominator.max(1));
        let power_of_two = 1i64 << (63 - scaled.max(1).leading_zeros());
        Some(i32::try_from(power_of_two).unwrap_or(TEI_DEFAULT_MAX_BATCH_TOKENS).max(MIN_SHARE_BATCH_TOKENS))
    }

    /// The batch TEI runs with: [`Self::max_batch_tokens`] or TEI's default.
    pub fn max_batch_tokens_or_tei_default(&self) -> i32 {
        self.max_batch_tokens().unwrap_or(TEI_DEFAULT_MAX_BATCH_TOKENS)
    }

    /// The cap on one replica's in-flight share: `concurrency.maxInFlightPerReplica`, else for a
    /// partial share about one batch of typical inputs (its batch tokens over 128, at least 4),
    /// so a slice is not handed a whole card's worth of work. It is also the adaptive limit's
    /// ceiling.
    pub fn in_flight_per_replica_cap(&self) -> Option<i32> {
        if let Some(cap) = self.concurrency.max_in_flight_per_replica {
            return Some(cap);
        }
        self.partial_share()?;
        Some((self.max_batch_tokens_or_tei_default() / TYPICAL_INPUT_TOKENS).max(MIN_SHARE_IN_FLIGHT))
    }

    /// The `tei` container's default CPU and memory requests: the GPU type's, scaled to a
    /// partial share's fraction (at least 500m and 2Gi).
    pub fn default_tei_requests(&self) -> (String, String) {
        let whole = self.gpu.type_.default_tei_requests();
        let Some(share) = self.partial_share() else { return (whole.cpu.to_owned(), whole.memory.to_owned()) };
        let (numerator, denominator) = share.fraction();
        let scale = |value: u64, step: u64, floor: u64| {
            let scaled = (value * u64::from(numerator)).div_ceil(u64::from(denominator.max(1)));
            scaled.div_ceil(step).saturating_mul(step).max(floor)
        };
        let cpu_millis = whole.cpu.parse::<u64>().unwrap_or(1) * 1000;
        let memory_mib = whole.memory.trim_end_matches("Gi").parse::<u64>().unwrap_or(1) * 1024;
        (
            canonical(scale(cpu_millis, 100, MIN_SHARE_CPU_MILLIS), 1000, "", "m"),
            canonical(scale(memory_mib, 256, MIN_SHARE_MEMORY_MIB), 1024, "Gi", "Mi"),
        )
    }
}

/// A quantity as the API server writes it back (`2Gi`, not `2048Mi`; `1`, not `1000m`), so the
/// rendered pod template reads the same as the stored one.
fn canonical(amount: u64, per_unit: u64, unit: &str, small_unit: &str) -> String {
    match amount % per_unit {
        0 => format!("{}{unit}", amount / per_unit),
        _ => format!("{amount}{small_unit}"),
    }
}

#[cfg(test)]
mod tests {
    use crate::sharing::{GpuSharing, SharingStrategy};
    use crate::{EmbeddingPoolSpec, GpuSpec, GpuType};

    fn pool(gpu: GpuType, sharing: Option<GpuSharing>) -> EmbeddingPoolSpec {
        let mut spec: EmbeddingPoolSpec =
            serde_json::from_value(serde_json::json!({ "model": { "id": "m" } })).unwrap();
        spec.gpu = GpuSpec { type_: gpu, count: 1, sharing };
        spec
    }

    fn replicas(n: i32) -> Option<GpuSharing> {
        Some(GpuSharing { strategy: SharingStrategy::Mps, replicas: Some(n), profile: None, rename_by_default: true })
    }

    fn mig(profile: &str) -> Option<GpuSharing> {
        Some(GpuSharing {
            strategy: SharingStrategy::Mig,
            replicas: None,
            profile: Some(profile.into()),
            rename_by_default: false,
        })
    }

    #[test]
    fn whole_gpus_keep_teis_defaults() {
        let spec = pool(GpuType::NvidiaL4, None);
        assert_eq!(spec.max_batch_tokens(), None);
        assert_eq!(spec.in_flight_per_replica_cap(), None);
        assert_eq!(spec.default_tei_requests(), ("2".to_owned(), "8Gi".to_owned()));
    }

    #[test]
    fn a_quarter_of_an_l4_gets_a_quarter_of_the_batch_and_the_requests() {
        let spec = pool(GpuType::NvidiaL4, replicas(4));
        assert_eq!(spec.max_batch_tokens(), Some(4096));
        assert_eq!(spec.in_flight_per_replica_cap(), Some(32));
        assert_eq!(spec.default_tei_requests(), ("500m".to_owned(), "2Gi".to_owned()));
    }

    #[test]
    fn mig_slices_scale_by_their_compute_slices() {
        let one = pool(GpuType::NvidiaH100_80gb, mig("1g.10gb"));
        assert_eq!(one.max_batch_tokens(), Some(2048));
        assert_eq!(one.in_flight_per_replica_cap(), Some(16));
        assert_eq!(one.default_tei_requests(), ("1200m".to_owned(), "4864Mi".to_owned()));
        let three = pool(GpuType::NvidiaH100_80gb, mig("3g.40gb"));
        assert_eq!(three.max_batch_tokens(), Some(4096));
        let seven = pool(GpuType::NvidiaH100_80gb, mig("7g.80gb"));
        assert_eq!(seven.max_batch_tokens(), Some(16_384));
    }

    #[test]
    fn tiny_shares_keep_their_floors_and_explicit_settings_win() {
        let mut spec = pool(GpuType::NvidiaT4, replicas(64));
        assert_eq!(spec.max_batch_tokens(), Some(1024));
        assert_eq!(spec.in_flight_per_replica_cap(), Some(8));
        assert_eq!(spec.default_tei_requests(), ("500m".to_owned(), "2Gi".to_owned()));
        spec.tei.max_batch_tokens = Some(8192);
        spec.concurrency.max_in_flight_per_replica = Some(3);
        assert_eq!((spec.max_batch_tokens(), spec.in_flight_per_replica_cap()), (Some(8192), Some(3)));
    }
}
