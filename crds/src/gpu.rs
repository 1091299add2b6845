//! The GPU catalogue: how a well-known GPU type maps to nodes and to TEI image builds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The GPU Feature Discovery label the scheduler matches GPU types against.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// The extended resource NVIDIA's device plugin advertises.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// A well-known accelerator (or `cpu`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuType {
    #[serde(rename = "nvidia-t4")]
    NvidiaT4,
    #[serde(rename = "nvidia-a10g")]
    NvidiaA10g,
    #[default]
    #[serde(rename = "nvidia-l4")]
    NvidiaL4,
    #[serde(rename = "nvidia-l40s")]
    NvidiaL40s,
    #[serde(rename = "nvidia-a100-40gb")]
    NvidiaA100_40gb,
    #[serde(rename = "nvidia-a100-80gb")]
    NvidiaA100_80gb,
    #[serde(rename = "nvidia-h100-80gb")]
    NvidiaH100_80gb,
    #[serde(rename = "nvidia-h200")]
    NvidiaH200,
    #[serde(rename = "cpu")]
    Cpu,
}

/// The CUDA architectures TEI publishes separate images for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeiArchitecture {
    Cpu,
    Turing,
    Ampere80,
    Ampere86,
    Ada89,
    Hopper,
}

impl TeiArchitecture {
    /// The tag prefix of TEI's images for this architecture (`<prefix><version>-grpc`).
    pub fn tag_prefix(self) -> &'static str {
        match self {
            Self::Cpu => "cpu-",
            Self::Turing => "turing-",
            Self::Ampere80 => "",
            Self::Ampere86 => "86-",
            Self::Ada89 => "89-",
            Self::Hopper => "hopper-",
        }
    }
}

impl GpuType {
    pub const ALL: [GpuType; 9] = [
        Self::NvidiaT4,
        Self::NvidiaA10g,
        Self::NvidiaL4,
        Self::NvidiaL40s,
        Self::NvidiaA100_40gb,
        Self::NvidiaA100_80gb,
        Self::NvidiaH100_80gb,
        Self::NvidiaH200,
        Self::Cpu,
    ];

    /// The name used in the API (`nvidia-l4`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NvidiaT4 => "nvidia-t4",
            Self::NvidiaA10g => "nvidia-a10g",
            Self::NvidiaL4 => "nvidia-l4",
            Self::NvidiaL40s => "nvidia-l40s",
            Self::NvidiaA100_40gb => "nvidia-a100-40gb",
            Self::NvidiaA100_80gb => "nvidia-a100-80gb",
            Self::NvidiaH100_80gb => "nvidia-h100-80gb",
            Self::NvidiaH200 => "nvidia-h200",
            Self::Cpu => "cpu",
        }
    }

    pub fn is_gpu(self) -> bool {
        self != Self::Cpu
    }

    pub fn architecture(self) -> TeiArchitecture {
        match self {
            Self::Cpu => TeiArchitecture::Cpu,
            Self::NvidiaT4 => TeiArchitecture::Turing,
            Self::NvidiaA100_40gb | Self::NvidiaA100_80gb => TeiArchitecture::Ampere80,
            Self::NvidiaA10g => TeiArchitecture::Ampere86,
            Self::NvidiaL4 | Self::NvidiaL40s => TeiArchitecture::Ada89,
            Self::NvidiaH100_80gb | Self::NvidiaH200 => TeiArchitecture::Hopper,
        }
    }

    /// Values of `nvidia.com/gpu.product` that GPU Feature Discovery reports for this type. One
    /// type covers its SXM and PCIe boards, which report different product strings.
    pub fn node_products(self) -> &'static [&'static str] {
        match self {
            Self::Cpu => &[],
            Self::NvidiaT4 => &["Tesla-T4"],
            Self::NvidiaA10g => &["NVIDIA-A10G"],
            Self::NvidiaL4 => &["NVIDIA-L4"],
            Self::NvidiaL40s => &["NVIDIA-L40S"],
            Self::NvidiaA100_40gb => &["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"],
            Self::NvidiaA100_80gb => &["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"],
            Self::NvidiaH100_80gb => &["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"],
            Self::NvidiaH200 => &["NVIDIA-H200", "NVIDIA-H200-NVL"],
        }
    }
}

impl GpuType {
    /// The GPU's memory in MiB as `nvidia-smi` reports it (and GFD's `nvidia.com/gpu.memory`
    /// label), for the smaller board where SXM and PCIe differ. `None` for `cpu`.
    pub fn memory_mib(self) -> Option<u64> {
        Some(match self {
            Self::Cpu => return None,
            Self::NvidiaT4 => 15_360,
            Self::NvidiaA10g => 23_028,
            Self::NvidiaL4 => 23_034,
            Self::NvidiaL40s => 46_068,
            Self::NvidiaA100_40gb => 40_960,
            Self::NvidiaA100_80gb => 81_920,
            Self::NvidiaH100_80gb => 81_559,
            Self::NvidiaH200 => 143_771,
        })
    }
}

/// Default requests of the `tei` container, per replica. On a GPU node the host CPU tokenizes and
/// batches and host memory holds the weights while they load; the sizes leave room on the
/// smallest common node of each GPU (in the comments) for the sidecar and the node's daemons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TeiRequests {
    /// Kubernetes CPU quantity, e.g. `2`.
    pub cpu: &'static str,
    /// Kubernetes memory quantity, e.g. `8Gi`.
    pub memory: &'static str,
}

impl GpuType {
    /// The `tei` container's CPU and memory requests when `spec.template.resources` names neither.
    pub fn default_tei_requests(self) -> TeiRequests {
        let (cpu, memory) = match self {
            // TEI on CPU does the inference itself: give it whole cores.
            Self::Cpu => ("2", "4Gi"),
            // g4dn.xlarge: 4 vCPU, 16 GiB.
            Self::NvidiaT4 => ("2", "6Gi"),
            // g5.xlarge: 4 vCPU, 16 GiB.
            Self::NvidiaA10g => ("2", "8Gi"),
            // g6.xlarge, g2-standard-4: 4 vCPU, 16 GiB.
            Self::NvidiaL4 => ("2", "8Gi"),
            // g6e.xlarge: 4 vCPU, 32 GiB.
            Self::NvidiaL40s => ("3", "16Gi"),
            // a2-highgpu-1g: 12 vCPU, 85 GB.
            Self::NvidiaA100_40gb => ("4", "16Gi"),
            // a2-ultragpu-1g: 12 vCPU, 170 GB.
            Self::NvidiaA100_80gb => ("4", "24Gi"),
            // p5.48xlarge, a3-highgpu-8g: 24-26 vCPU and over 230 GB per GPU.
            Self::NvidiaH100_80gb => ("8", "32Gi"),
            // p5e/p5en.48xlarge: 24 vCPU and 256 GiB per GPU.
            Self::NvidiaH200 => ("8", "48Gi"),
        };
        TeiRequests { cpu, memory }
    }
}

impl std::fmt::Display for GpuType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_names_match_as_str() {
        for gpu in GpuType::ALL {
            let json = serde_json::to_value(gpu).unwrap();
            assert_eq!(json, serde_json::Value::String(gpu.as_str().to_owned()));
            let back: GpuType = serde_json::from_value(json).unwrap();
            assert_eq!(back, gpu);
        }
    }

    #[test]
    fn bigger_gpus_get_at_least_the_requests_of_smaller_ones() {
        let gib = |memory: &str| memory.trim_end_matches("Gi").parse::<u32>().unwrap();
        let cpu = |cpu: &str| cpu.parse::<u32>().unwrap();
        let order = [
            GpuType::NvidiaT4,
            GpuType::NvidiaL4,
            GpuType::NvidiaL40s,
            GpuType::NvidiaA100_80gb,
            GpuType::NvidiaH100_80gb,
            GpuType::NvidiaH200,
        ];
        for pair in order.windows(2) {
            let (small, large) = (pair[0].default_tei_requests(), pair[1].default_tei_requests());
            assert!(cpu(small.cpu) <= cpu(large.cpu), "{} vs {}", pair[0], pair[1]);
            assert!(gib(small.memory) < gib(large.memory), "{} vs {}", pair[0], pair[1]);
        }
        for gpu in GpuType::ALL {
            let requests = gpu.default_tei_requests();
            assert!(cpu(requests.cpu) >= 1 && gib(requests.memory) >= 1, "{gpu}: {requests:?}");
        }
    }

    #[test]
    fn every_gpu_type_has_node_products_and_cpu_has_none() {
        for gpu in GpuType::ALL {
            assert_eq!(gpu.is_gpu(), !gpu.node_products().is_empty(), "{gpu}");
        }
    }
}
