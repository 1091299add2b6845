//! What a simulator is started with, and the faults it can be told to play.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::SimError;

/// How a simulator listens, admits, batches and answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// gRPC address; port 0 picks an ephemeral port (see [`crate::SimHandle::addr`]).
    pub listen: SocketAddr,
    /// Admin HTTP address (stats, faults, metrics); `None` serves no admin port.
    pub admin_listen: Option<SocketAddr>,
    /// Slots shared by all inference requests, as TEI's `--max-concurrent-requests`.
    pub max_concurrent_requests: usize,
    /// Token budget of one device batch, as TEI's `--max-batch-tokens`; also the largest single input.
    pub max_batch_tokens: usize,
    /// Optional cap on requests per device batch, as TEI's `--max-batch-requests`.
    pub max_batch_requests: Option<usize>,
    /// Largest number of texts in one Rerank call, as TEI's `--max-client-batch-size`.
    pub max_client_batch_size: usize,
    /// Device time of every batch regardless of its size.
    pub fixed_latency: Duration,
    /// Device time added per request (sequence) in the batch: what a CPU TEI spends on each
    /// sequence beyond its tokens (padding, pooling), measured by `teifleet-calibrate`.
    pub per_request_latency: Duration,
    /// Device time added per token in the batch.
    pub per_token_latency: Duration,
    /// How the device spends a batch's device time: asleep, or busy on a CPU thread.
    pub device: Device,
    /// The batch prepared while the device runs stops taking requests once it has one, as TEI's
    /// does (it waits in a one-slot channel); off, it fills up to the budgets until the device is
    /// free. Set by profiles measured on TEI.
    pub freeze_next_batch: bool,
    /// Length of the embeddings the model returns.
    pub dimensions: usize,
    /// Reported by Info.
    pub model_id: String,
    /// A lock file shared with co-located simulators: their batches take turns on one device,
    /// as the TEIs of pods sharing one GPU do. `None`: a device of its own.
    pub shared_device: Option<std::path::PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            admin_listen: None,
            max_concurrent_requests: 512,
            max_batch_tokens: 16384,
            max_batch_requests: None,
            max_client_batch_size: 32,
            fixed_latency: Duration::from_millis(2),
            per_request_latency: Duration::ZERO,
            per_token_latency: Duration::from_micros(20),
            device: Device::Sleep,
            freeze_next_batch: false,
            dimensions: 384,
            model_id: "teifleet/sim-embedding".to_owned(),
            shared_device: None,
        }
    }
}

impl SimConfig {
    /// Refuses values that would make the batcher or the admission semaphore misbehave.
    pub(crate) fn validate(&self) -> Result<(), SimError> {
        let invalid = |why: &str| Err(SimError::InvalidConfig(why.to_owned()));
        if self.max_batch_tokens == 0 {
            return invalid("max_batch_tokens must be at least 1");
        }
        if self.max_batch_requests == Some(0) {
            return invalid("max_batch_requests must be at least 1 when set");
        }
        if self.dimensions == 0 {
            return invalid("dimensions must be at least 1");
        }
        if self.max_concurrent_requests > tokio::sync::Semaphore::MAX_PERMITS {
            return invalid("max_concurrent_requests is too large");
        }
        Ok(())
    }
}

/// A misbehaviour the simulator plays until cleared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    /// Healthy.
    #[default]
    None,
    /// Every RPC answers `UNAVAILABLE` at once and health reports `NOT_SERVING`.
    Fail,
    /// Admitted inference requests hang, holding their slots, until cleared or cancelled.
    Stall,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Fail => "fail",
            Self::Stall => "stall",
        })
    }
}

impl FromStr for Fault {
    type Err = SimError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "clear" => Ok(Self::None),
            "fail" => Ok(Self::Fail),
            "stall" => Ok(Self::Stall),
            _ => Err(SimError::UnknownFault(s.to_owned())),
        }
    }
}

/// What the simulated device does for the device time of a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// Waits on a timer, costing no CPU: a GPU, whose work does not compete with the host's.
    #[default]
    Sleep,
    /// Spends the device time as CPU time of one thread outside the async runtime, as TEI on a CPU
    /// does. When the CPU is shared, a batch takes longer in wall time, so whatever else runs on
    /// the machine (the client, the multiplexer) slows the device down.
    Spin,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Sleep => "sleep",
            Self::Spin => "spin",
        })
    }
}

impl FromStr for Device {
    type Err = SimError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sleep" => Ok(Self::Sleep),
            "spin" => Ok(Self::Spin),
            _ => Err(SimError::UnknownDevice(s.to_owned())),
        }
    }
}
