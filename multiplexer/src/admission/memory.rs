//! One memory budget per process, for every byte held before or outside a pool's admission:
//! request bodies being read (HTTP and gRPC), calls waiting at a door or held by the activator,
//! answers being assembled by the HTTP front. Each holder takes a [`Charge`] that grows as its
//! bytes arrive and gives them back when dropped; a new request that finds no room is refused at
//! once, with a retry hint, before its body is read.
//!
//! Why one budget and not bounds per request: every per-request bound held, and their sum still
//! killed the sidecar (a hundred bodies of 1.9 MB each, each within `payloadLimit`). The budget is
//! a fraction of the container's memory limit, so the rest covers the process's baseline (its
//! code, connections, pools' state) and the allocator's slack.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::IntGauge;

/// Where the container's limit is read from, cgroup v2 first.
const CGROUP_V2_MAX: &str = "/sys/fs/cgroup/memory.max";
const CGROUP_V1_LIMIT: &str = "/sys/fs/cgroup/memory/memory.limit_in_bytes";
/// cgroup v1 writes "no limit" as a number near `i64::MAX` (rounded to pages): anything above
/// this is none.
const NO_LIMIT_ABOVE: u64 = 1 << 60;
/// The limit assumed when neither the flag nor the cgroup gives one: the sidecar's own (the
/// operator renders 256Mi), so a process run without a limit budgets as the sidecar does.
pub const DEFAULT_LIMIT: u64 = 256 * 1024 * 1024;

/// Bytes one holder may take from the whole budget; past them it may take only up to
/// [`LARGE_SHARE_PERCENT`] of the budget. The rest is kept for small requests, so a flood of large
/// bodies (each within `payloadLimit`) cannot starve the ordinary callers beside it.
pub const SMALL_HOLDER: u64 = 64 * 1024;
/// The share of the budget that holders past [`SMALL_HOLDER`] may fill together.
pub const LARGE_SHARE_PERCENT: u64 = 75;

/// How long a caller refused for memory is told to wait: bodies being read finish (or hit the
/// body timeout) within seconds, not milliseconds.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the bytes are held for: the `use` label of `teifleet_memory_charged_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Request bodies being read or held until their call ends: HTTP bodies (with the copies the
    /// HTTP front makes of them), gRPC messages as buffered.
    RequestBodies,
    /// Calls waiting at a pool's door.
    Door,
    /// Answers the HTTP front assembles before it sends them.
    Answers,
    /// The embedding cache's local tier (`crate::cache`): one holder, grown and shrunk with its
    /// entries, so it never holds more than a large holder's share.
    Cache,
}

impl Use {
    // The activator's held calls are request bodies (charged by the fronts) held longer, and are
    // counted as such; how many it holds is capped per pool (`crate::activator`).
    pub const ALL: [Use; 4] = [Use::RequestBodies, Use::Door, Use::Answers, Use::Cache];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequestBodies => "request_bodies",
            Self::Door => "door",
            Self::Answers => "answers",
            Self::Cache => "cache",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The settings, declared once as the binary's flags.
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct MemorySettings {
    /// The container's memory limit in bytes (`256Mi`, `1Gi`, `500M`, `268435456`). Default: the
    /// cgroup's (`memory.max`, or v1's `memory.limit_in_bytes`), else 256Mi.
    #[arg(long, value_parser = parse_bytes)]
    pub memory_limit: Option<u64>,
    /// The share of the memory limit that requests may hold before admission (bodies being read,
    /// calls held, answers assembled); the rest is the process's baseline and the allocator's.
    #[arg(long, default_value_t = 0.5, value_parser = parse_fraction)]
    pub memory_budget_fraction: f64,
}

impl Default for MemorySettings {
    fn default() -> Self {
        crate::vocab::flags::defaults()
    }
}

impl MemorySettings {
    /// The limit this process runs under: the flag's, the cgroup's, or [`DEFAULT_LIMIT`].
    pub fn limit(&self) -> u64 {
        self.memory_limit.or_else(cgroup_limit).unwrap_or(DEFAULT_LIMIT)
    }

    /// The budget: the fraction of the limit.
    pub fn budget(&self) -> u64 {
        (self.limit() as f64 * self.memory_budget_fraction) as u64
    }
}

/// The container's memory limit as its cgroup states it, if it states one.
pub fn cgroup_limit() -> Option<u64> {
    let read = |path| std::fs::read_to_string(path).ok();
    let limit = read(CGROUP_V2_MAX).or_else(|| read(CGROUP_V1_LIMIT))?;
    limit.trim().parse::<u64>().ok().filter(|bytes| *bytes < NO_LIMIT_ABOVE)
}

/// Bytes as Kubernetes quantities spell them (`256Mi`, `1Gi`, `512M`, `64Ki`, `1k`) or a plain count.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("{text:?} is not a byte count such as 256Mi"))?;
    let scale: u64 = match unit {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (use Ki, Mi, Gi, k, M or G)")),
    };
    number.checked_mul(scale).filter(|bytes| *bytes > 0).ok_or_else(|| format!("{text:?} is out of range"))
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    let fraction: f64 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
    if fraction > 0.0 && fraction <= 1.0 { Ok(fraction) } else { Err("a fraction above 0 and at most 1".into()) }
}

/// A request that would take the process past its budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the sidecar's memory budget is spent ({charged} of {budget} bytes held for requests); retry shortly")]
pub struct OverBudget {
    pub charged: u64,
    pub budget: u64,
}

impl OverBudget {
    pub fn retry_after(&self) -> Duration {
        RETRY_AFTER
    }
}

/// The process's budget and what is charged to it, by use.
pub struct MemoryBudget {
    budget: u64,
    charged: AtomicU64,
    by_use: [AtomicU64; Use::ALL.len()],
    /// `teifleet_memory_charged_bytes{use}`, in [`Use::ALL`]'s order; none in unit tests.
    gauges: Option<[IntGauge; Use::ALL.len()]>,
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget").field("budget", &self.budget).field("charged", &self.charged()).finish()
    }
}

impl MemoryBudget {
    pub fn new(budget: u64, gauges: Option<[IntGauge; Use::ALL.len()]>) -> Arc<Self> {
        Arc::new(Self { budget, charged: AtomicU64::new(0), by_use: Default::default(), gauges })
    }

    /// A budget no request can spend (for tests and tools that build fronts by hand).
    pub fn unbounded() -> Arc<Self> {
        Self::new(u64::MAX, None)
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn charged(&self) -> u64 {
        self.charged.load(Ordering::Relaxed)
    }

    pub fn charged_for(&self, what: Use) -> u64 {
        self.by_use[what.index()].load(Ordering::Relaxed)
    }

    /// Whether `bytes` more would fit now (a new request checks before it takes anything).
    pub fn has_room(&self, bytes: u64) -> Result<(), OverBudget> {
        let charged = self.charged();
        match charged.saturating_add(bytes) <= self.budget {
            true => Ok(()),
            false => Err(OverBudget { charged, budget: self.budget }),
        }
    }

    /// Charges `bytes` for `what`, or refuses them whole.
    pub fn charge(self: &Arc<Self>, what: Use, bytes: u64) -> Result<Charge, OverBudget> {
        self.take(what, bytes, bytes)?;
        Ok(Charge { budget: self.clone(), what, bytes: AtomicU64::new(bytes) })
    }

    /// Takes `bytes` for a holder that will hold `holding` in all.
    fn take(&self, what: Use, bytes: u64, holding: u64) -> Result<(), OverBudget> {
        let budget = match holding > SMALL_HOLDER {
            true => (u128::from(self.budget) * u128::from(LARGE_SHARE_PERCENT) / 100) as u64,
            false => self.budget,
        };
        self.charged
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |charged| {
                charged.checked_add(bytes).filter(|total| *total <= budget)
            })
            .map_err(|charged| OverBudget { charged, budget })?;
        self.by_use[what.index()].fetch_add(bytes, Ordering::Relaxed);
        self.show(what);
        Ok(())
    }

    fn give_back(&self, what: Use, bytes: u64) {
        self.charged.fetch_sub(bytes, Ordering::AcqRel);
        self.by_use[what.index()].fetch_sub(bytes, Ordering::Relaxed);
        self.show(what);
    }

    fn show(&self, what: Use) {
        if let Some(gauges) = &self.gauges {
            let bytes = self.by_use[what.index()].load(Ordering::Relaxed);
            gauges[what.index()].set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }
}

/// Bytes charged to the budget for one holder; grows as its bytes arrive, all given back when
/// dropped. Shared (`&self`) so a body and the call that reads it can both reach it.
pub struct Charge {
    budget: Arc<MemoryBudget>,
    what: Use,
    bytes: AtomicU64,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge").field("use", &self.what).field("bytes", &self.bytes()).finish()
    }
}

impl Charge {
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Charges `more` bytes too, or refuses them (what was charged stays).
    pub fn grow(&self, more: u64) -> Result<(), OverBudget> {
        self.budget.take(self.what, more, self.bytes().saturating_add(more))?;
        self.bytes.fetch_add(more, Ordering::Relaxed);
        Ok(())
    }

    /// Gives back up to `less` bytes (a stream's message passed on).
    pub fn shrink(&self, less: u64) {
        let given = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bytes| Some(bytes.saturating_sub(less)))
            .map_or(0, |before| before.min(less));
        self.budget.give_back(self.what, given);
    }

    /// Charges exactly `bytes` from now: grows or shrinks to it.
    pub fn set(&self, bytes: u64) -> Result<(), OverBudget> {
        let now = self.bytes();
        if bytes > now {
            return self.grow(bytes - now);
        }
        self.shrink(now - bytes);
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let bytes = *self.bytes.get_mut();
        self.budget.give_back(self.what, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator grows a sidecar's memory limit for its cache from these two figures
    /// (`teifleet_crds::cache::sidecar_limit_growth`): they must stay the binary's defaults.
    #[test]
    fn the_operator_sizes_caches_with_these_defaults() {
        let defaults: MemorySettings = crate::vocab::flags::defaults();
        assert_eq!(
            (defaults.memory_budget_fraction * 100.0).round() as u64,
            teifleet_crds::cache::SIDECAR_BUDGET_PERCENT
        );
        assert_eq!(LARGE_SHARE_PERCENT, teifleet_crds::cache::SIDECAR_LARGE_SHARE_PERCENT);
    }

    #[test]
    fn quantities_parse_as_kubernetes_spells_them() {
        assert_eq!(parse_bytes("256Mi"), Ok(256 << 20));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("500M"), Ok(500_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("0").is_err());
        assert!(parse_fraction("0").is_err() && parse_fraction("1.5").is_err());
        let settings = MemorySettings { memory_limit: Some(256 << 20), memory_budget_fraction: 0.5 };
        assert_eq!(settings.budget(), 128 << 20);
    }

    #[test]
    fn a_charge_is_refused_whole_and_given_back_when_dropped() {
        let budget = MemoryBudget::new(1000, None);
        let body = budget.charge(Use::RequestBodies, 600).unwrap();
        assert_eq!(budget.charge(Use::Door, 500).unwrap_err(), OverBudget { charged: 600, budget: 1000 });
        body.grow(300).unwrap();
        assert!(body.grow(200).is_err(), "past the budget");
        assert_eq!((body.bytes(), budget.charged_for(Use::RequestBodies)), (900, 900));
        body.shrink(10_000);
        assert_eq!(budget.charged(), 0, "never below nothing");
        body.set(400).unwrap();
        let door = budget.charge(Use::Door, 100).unwrap();
        assert!(budget.has_room(600).is_err() && budget.has_room(500).is_ok());
        drop((body, door));
        assert_eq!(budget.charged(), 0);

        let budget = MemoryBudget::new(4 * SMALL_HOLDER * 4, None);
        let large = budget.charge(Use::RequestBodies, SMALL_HOLDER * 12).unwrap();
        assert!(large.grow(1).is_err(), "large holders fill three quarters at most");
        let small = budget.charge(Use::RequestBodies, SMALL_HOLDER).unwrap();
        assert!(small.grow(1).is_err(), "past small, the same share");
        let _more: Vec<Charge> = (0..3).map(|_| budget.charge(Use::Door, SMALL_HOLDER).unwrap()).collect();
        assert_eq!(budget.charged(), budget.budget(), "small holders fill the rest");
    }
}
