//! A share of one GPU per replica, as NVIDIA's device plugin offers it: time-slicing and MPS (each
//! GPU advertised as N replicas of `nvidia.com/gpu`, or of `nvidia.com/gpu.shared` when renamed)
//! and MIG profiles under the mixed strategy (`nvidia.com/mig-1g.10gb`, ...). What a share gives
//! a replica (memory, a fraction of the card's compute) and which node labels offer it.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::gpu::{GPU_PRODUCT_LABEL, GPU_RESOURCE, GpuType};

/// The resource the device plugin advertises shared GPUs as with `renameByDefault: true`.
pub const SHARED_RESOURCE: &str = "nvidia.com/gpu.shared";
/// GPU Feature Discovery's label of a node's sharing strategy (`time-slicing`, `mps`, `none`).
pub const SHARING_STRATEGY_LABEL: &str = "nvidia.com/gpu.sharing-strategy";
/// GPU Feature Discovery's label of how many replicas each GPU is offered as.
pub const REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";
/// GPU Feature Discovery's label of a node's MIG strategy (`single`, `mixed`).
pub const MIG_STRATEGY_LABEL: &str = "nvidia.com/mig.strategy";
/// GPU Feature Discovery appends this to the product label of GPUs shared without renaming, so
/// pools asking for whole GPUs never land on a replica of one.
pub const SHARED_PRODUCT_SUFFIX: &str = "-SHARED";
/// Compute slices (GPCs) MIG divides every GPU of the catalogue into: `1g` is one seventh.
pub const MIG_SLICES: u32 = 7;

/// How the cluster shares a GPU between pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharingStrategy {
    /// The device plugin's time-slicing: replicas take turns on the whole GPU, and nothing
    /// divides its memory, so each replica must keep within its share of it.
    #[serde(rename = "time-slicing")]
    TimeSlicing,
    /// The device plugin's MPS: replicas run at once, each limited to its share of the memory
    /// and of the compute.
    #[serde(rename = "mps")]
    Mps,
    /// A MIG instance of a fixed profile, isolated in hardware, under the mixed strategy.
    #[serde(rename = "mig")]
    Mig,
}

impl SharingStrategy {
    /// The API's spelling, which is also GFD's `nvidia.com/gpu.sharing-strategy` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TimeSlicing => "time-slicing",
            Self::Mps => "mps",
            Self::Mig => "mig",
        }
    }
}

/// A share of one GPU per replica instead of whole GPUs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.strategy != 'mig' || has(self.profile)").message("gpu.sharing.strategy mig needs a profile such as 1g.10gb"))]
#[x_kube(validation = Rule::new("self.strategy != 'mig' || (!has(self.replicas) && !(has(self.renameByDefault) && self.renameByDefault))").message("gpu.sharing.replicas and renameByDefault are for time-slicing and mps: a MIG profile is a resource of its own"))]
#[x_kube(validation = Rule::new("self.strategy == 'mig' || has(self.replicas)").message("gpu.sharing.strategy time-slicing and mps need replicas: how many replicas the device plugin offers each GPU as (nvidia.com/gpu.replicas)"))]
#[x_kube(validation = Rule::new("self.strategy == 'mig' || !has(self.profile)").message("gpu.sharing.profile is for strategy mig only"))]
pub struct GpuSharing {
    /// `time-slicing` or `mps` (the device plugin's sharing config, GFD's
    /// `nvidia.com/gpu.sharing-strategy`), or `mig` (MIG under the mixed strategy).
    pub strategy: SharingStrategy,

    /// time-slicing and mps: how many replicas the device plugin offers each GPU as (its
    /// sharing config's `replicas`, GFD's `nvidia.com/gpu.replicas`). Each replica of the pool
    /// takes one, and gets the GPU's memory divided by this many. Pods go to nodes whose label
    /// says exactly this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 2 && self <= 64").message("gpu.sharing.replicas must be between 2 and 64"))]
    pub replicas: Option<i32>,

    /// mig: the MIG profile each replica takes, e.g. `1g.10gb` (resource
    /// `nvidia.com/mig-1g.10gb`); one of the profiles of `gpu.type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(r"self.matches('^[1-7]g\\.[0-9]+gb$')").message("gpu.sharing.profile must be a MIG profile such as 1g.10gb, 2g.20gb or 3g.40gb"))]
    pub profile: Option<String>,

    /// time-slicing and mps: the device plugin renames the shared resource to
    /// `nvidia.com/gpu.shared` (its sharing config's `renameByDefault: true`). Off: the
    /// replicas are `nvidia.com/gpu`, and GFD marks the product `<product>-SHARED`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rename_by_default: bool,
}

/// One MIG profile of one GPU type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigProfile {
    /// As NVIDIA names it: `1g.10gb`.
    pub name: &'static str,
    /// Compute slices of the seven.
    pub slices: u32,
    /// The nominal memory in the profile's name, in GB (10^9 bytes).
    pub memory_gb: u32,
}

const fn mig(name: &'static str, slices: u32, memory_gb: u32) -> MigProfile {
    MigProfile { name, slices, memory_gb }
}

const A100_40GB: [MigProfile; 6] = [
    mig("1g.5gb", 1, 5),
    mig("1g.10gb", 1, 10),
    mig("2g.10gb", 2, 10),
    mig("3g.20gb", 3, 20),
    mig("4g.20gb", 4, 20),
    mig("7g.40gb", 7, 40),
];
// The A100 80GB and the H100 80GB offer the same profiles.
const GPU_80GB: [MigProfile; 6] = [
    mig("1g.10gb", 1, 10),
    mig("1g.20gb", 1, 20),
    mig("2g.20gb", 2, 20),
    mig("3g.40gb", 3, 40),
    mig("4g.40gb", 4, 40),
    mig("7g.80gb", 7, 80),
];
const H200: [MigProfile; 6] = [
    mig("1g.18gb", 1, 18),
    mig("1g.35gb", 1, 35),
    mig("2g.35gb", 2, 35),
    mig("3g.71gb", 3, 71),
    mig("4g.71gb", 4, 71),
    mig("7g.141gb", 7, 141),
];

impl GpuType {
    /// The MIG profiles of this GPU (NVIDIA's MIG user guide; the `+me` media-extension variants
    /// are left out, as their resource names are not valid Kubernetes names). Empty: no MIG.
    pub fn mig_profiles(self) -> &'static [MigProfile] {
        match self {
            Self::NvidiaA100_40gb => &A100_40GB,
            Self::NvidiaA100_80gb | Self::NvidiaH100_80gb => &GPU_80GB,
            Self::NvidiaH200 => &H200,
            _ => &[],
        }
    }

    /// This GPU's MIG profile called `name`.
    pub fn mig_profile(self, name: &str) -> Option<MigProfile> {
        self.mig_profiles().iter().copied().find(|profile| profile.name == name)
    }
}

/// What one replica of a GPU pool takes, resolved from `spec.gpu`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Share {
    /// `count` whole GPUs, as `nvidia.com/gpu`.
    Whole { count: u32 },
    /// One of the `replicas` the device plugin offers each GPU as.
    Replica { strategy: SharingStrategy, replicas: u32, renamed: bool },
    /// One MIG instance. `profile` is `None` when the GPU type has no profile of that name
    /// (the API server refuses such a pool; an old object may still carry one).
    Mig { name: String, profile: Option<MigProfile> },
}

/// A node-affinity requirement: label, operator, values.
pub type NodeRequirement = (String, &'static str, Vec<String>);

impl Share {
    /// The share `spec.gpu` asks for, `None` for `cpu` pools.
    pub fn of(gpu: &crate::GpuSpec) -> Option<Self> {
        if !gpu.type_.is_gpu() {
            return None;
        }
        Some(match &gpu.sharing {
            None => Self::Whole { count: u32::try_from(gpu.count).unwrap_or(1).max(1) },
            Some(sharing) if sharing.strategy == SharingStrategy::Mig => {
                let name = sharing.profile.clone().unwrap_or_default();
                Self::Mig { profile: gpu.type_.mig_profile(&name), name }
            }
            Some(sharing) => Self::Replica {
                strategy: sharing.strategy,
                replicas: u32::try_from(sharing.replicas.unwrap_or(2)).unwrap_or(2).max(2),
                renamed: sharing.rename_by_default,
            },
        })
    }

    /// The extended resource each replica requests.
    pub fn resource(&self) -> String {
        match self {
            Self::Whole { .. } | Self::Replica { renamed: false, .. } => GPU_RESOURCE.to_owned(),
            Self::Replica { renamed: true, .. } => SHARED_RESOURCE.to_owned(),
            Self::Mig { name, .. } => format!("nvidia.com/mig-{name}"),
        }
    }

    /// How many of [`Self::resource`] each replica requests.
    pub fn resource_count(&self) -> u32 {
        match self {
            Self::Whole { count } => *count,
            _ => 1,
        }
    }

    /// The part of one GPU's compute a replica gets, as (numerator, denominator).
    pub fn fraction(&self) -> (u32, u32) {
        match self {
            Self::Whole { count } => (*count, 1),
            Self::Replica { replicas, .. } => (1, *replicas),
            Self::Mig { profile, .. } => (profile.map_or(1, |p| p.slices), MIG_SLICES),
        }
    }

    /// Whether a replica gets less than one whole GPU.
    pub fn is_partial(&self) -> bool {
        !matches!(self, Self::Whole { .. })
    }

    /// GPU memory a replica gets, in MiB: the profile's nominal memory for MIG, the GPU's memory
    /// over the replicas for time-slicing and MPS, all of it times the count for whole GPUs.
    pub fn memory_mib(&self, gpu: GpuType) -> Option<u64> {
        let card = gpu.memory_mib()?;
        Some(match self {
            Self::Whole { count } => card * u64::from(*count),
            Self::Replica { replicas, .. } => card / u64::from(*replicas),
            // GB in the name are 10^9 bytes.
            Self::Mig { profile, .. } => u64::from(profile.as_ref()?.memory_gb) * 1_000_000_000 / MIB,
        })
    }

    /// Short, for the printer column: `1 GPU`, `1/4 time-slicing`, `mig 1g.10gb`.
    pub fn short(&self) -> String {
        match self {
            Self::Whole { count: 1 } => "1 GPU".to_owned(),
            Self::Whole { count } => format!("{count} GPUs"),
            Self::Replica { strategy, replicas, .. } => format!("1/{replicas} {}", strategy.as_str()),
            Self::Mig { name, .. } => format!("mig {name}"),
        }
    }

    /// In words, naming the GPU: `a 1/4 time-slicing share of one nvidia-l4`.
    pub fn describe(&self, gpu: GpuType) -> String {
        match self {
            Self::Whole { count: 1 } => format!("one whole {gpu}"),
            Self::Whole { count } => format!("{count} whole {gpu} GPUs"),
            Self::Replica { strategy, replicas, .. } => {
                format!("a 1/{replicas} {} share of one {gpu}", strategy.as_str())
            }
            Self::Mig { name, .. } => format!("a MIG {name} instance of one {gpu}"),
        }
    }

    /// The node labels a replica's node must carry, beyond what the pool's template adds: the
    /// product (and `<product>-SHARED` where GFD marks replicas so), and the sharing labels.
    pub fn node_requirements(&self, gpu: GpuType) -> Vec<NodeRequirement> {
        let products: Vec<String> = gpu.node_products().iter().map(|p| (*p).to_owned()).collect();
        match self {
            Self::Whole { .. } => vec![(GPU_PRODUCT_LABEL.into(), "In", products)],
            Self::Replica { strategy, replicas, renamed } => {
                let products = match renamed {
                    true => products,
                    false => products.iter().flat_map(|p| [p.clone(), format!("{p}{SHARED_PRODUCT_SUFFIX}")]).collect(),
                };
                vec![
                    (GPU_PRODUCT_LABEL.into(), "In", products),
                    (SHARING_STRATEGY_LABEL.into(), "In", vec![strategy.as_str().to_owned()]),
                    (REPLICAS_LABEL.into(), "In", vec![replicas.to_string()]),
                ]
            }
            Self::Mig { name, .. } => vec![
                (GPU_PRODUCT_LABEL.into(), "In", products),
                (MIG_STRATEGY_LABEL.into(), "In", vec!["mixed".to_owned()]),
                // GFD counts each profile a node offers; a node offering none has no label.
                (format!("nvidia.com/mig-{name}.count"), "Exists", Vec::new()),
            ],
        }
    }

    /// The requirements as `label=value` text, for messages.
    pub fn describe_nodes(&self, gpu: GpuType) -> String {
        self.node_requirements(gpu)
            .iter()
            .map(|(label, operator, values)| match *operator {
                "Exists" => label.clone(),
                _ if values.len() == 1 => format!("{label}={}", values[0]),
                _ => format!("{label} in [{}]", values.join(", ")),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub(crate) const MIB: u64 = 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuSpec;

    fn spec(gpu: GpuType, sharing: Option<GpuSharing>) -> GpuSpec {
        GpuSpec { type_: gpu, count: 1, sharing }
    }

    fn replicas(strategy: SharingStrategy, replicas: i32, renamed: bool) -> Option<GpuSharing> {
        Some(GpuSharing { strategy, replicas: Some(replicas), profile: None, rename_by_default: renamed })
    }

    fn profile(name: &str) -> Option<GpuSharing> {
        Some(GpuSharing {
            strategy: SharingStrategy::Mig,
            replicas: None,
            profile: Some(name.into()),
            rename_by_default: false,
        })
    }

    #[test]
    fn each_mode_requests_the_resource_the_device_plugin_advertises() {
        let l4 = GpuType::NvidiaL4;
        let cases = [
            (spec(l4, None), "nvidia.com/gpu", "1 GPU"),
            (spec(l4, replicas(SharingStrategy::TimeSlicing, 4, false)), "nvidia.com/gpu", "1/4 time-slicing"),
            (spec(l4, replicas(SharingStrategy::Mps, 4, true)), "nvidia.com/gpu.shared", "1/4 mps"),
            (spec(GpuType::NvidiaH100_80gb, profile("1g.10gb")), "nvidia.com/mig-1g.10gb", "mig 1g.10gb"),
        ];
        for (gpu, resource, short) in cases {
            let share = Share::of(&gpu).unwrap();
            assert_eq!(
                (share.resource().as_str(), share.short().as_str(), share.resource_count()),
                (resource, short, 1)
            );
        }
        assert_eq!(Share::of(&spec(GpuType::Cpu, None)), None);
    }

    #[test]
    fn memory_of_a_share() {
        let l4 = GpuType::NvidiaL4;
        let quarter = Share::of(&spec(l4, replicas(SharingStrategy::TimeSlicing, 4, false))).unwrap();
        assert_eq!(quarter.memory_mib(l4), Some(23_034 / 4));
        let h100 = GpuType::NvidiaH100_80gb;
        let mig = Share::of(&spec(h100, profile("1g.10gb"))).unwrap();
        assert_eq!(mig.memory_mib(h100), Some(9_536), "10 GB, not 10 GiB");
        assert_eq!(mig.fraction(), (1, 7));
        let unknown = Share::of(&spec(h100, profile("1g.5gb"))).unwrap();
        assert_eq!(unknown.memory_mib(h100), None, "1g.5gb is an A100 40GB profile");
    }

    #[test]
    fn replicas_shared_without_renaming_select_the_shared_product_too() {
        let l4 = GpuType::NvidiaL4;
        let replicated = Share::of(&spec(l4, replicas(SharingStrategy::TimeSlicing, 4, false))).unwrap();
        assert_eq!(
            replicated.describe_nodes(l4),
            "nvidia.com/gpu.product in [NVIDIA-L4, NVIDIA-L4-SHARED], nvidia.com/gpu.sharing-strategy=time-slicing, nvidia.com/gpu.replicas=4"
        );
        let renamed = Share::of(&spec(l4, replicas(SharingStrategy::Mps, 4, true))).unwrap();
        assert_eq!(
            renamed.describe_nodes(l4),
            "nvidia.com/gpu.product=NVIDIA-L4, nvidia.com/gpu.sharing-strategy=mps, nvidia.com/gpu.replicas=4"
        );
        let h100 = GpuType::NvidiaH100_80gb;
        let mig = Share::of(&spec(h100, profile("1g.10gb"))).unwrap();
        assert_eq!(
            mig.describe_nodes(h100),
            "nvidia.com/gpu.product in [NVIDIA-H100-80GB-HBM3, NVIDIA-H100-PCIe], nvidia.com/mig.strategy=mixed, nvidia.com/mig-1g.10gb.count"
        );
    }

    #[test]
    fn mig_profiles_are_named_after_their_slices_and_memory() {
        for gpu in GpuType::ALL {
            for profile in gpu.mig_profiles() {
                assert_eq!(profile.name, format!("{}g.{}gb", profile.slices, profile.memory_gb), "{gpu}");
                assert!(profile.slices <= MIG_SLICES);
                assert!(u64::from(profile.memory_gb) * 1_000_000_000 / MIB <= gpu.memory_mib().unwrap(), "{gpu}");
            }
        }
    }
}

#[cfg(test)]
mod schema_tests {
    use kube::CustomResourceExt as _;

    use crate::{EmbeddingPool, GpuType};

    /// The API server checks MIG profiles with CEL rules written out by hand in `GpuSpec`; they
    /// must list exactly the catalogue's profiles of each type.
    #[test]
    fn the_cel_rules_list_each_types_mig_profiles_as_the_catalogue_does() {
        let crd = serde_json::to_string(&EmbeddingPool::crd()).unwrap();
        for gpu in GpuType::ALL.into_iter().filter(|gpu| !gpu.mig_profiles().is_empty()) {
            let quoted: Vec<String> = gpu.mig_profiles().iter().map(|p| format!("'{}'", p.name)).collect();
            let rule = format!("self.type != '{gpu}' || self.sharing.profile in [{}]", quoted.join(", "));
            assert!(crd.contains(&rule), "no rule {rule}");
            let names: Vec<&str> = gpu.mig_profiles().iter().map(|p| p.name).collect();
            let (last, rest) = names.split_last().unwrap();
            let message = format!("must be a MIG profile of {gpu}: {} or {last}", rest.join(", "));
            assert!(crd.contains(&message), "no message {message}");
        }
    }
}
