//! A pool's `spec.concurrency` as one replica's admission limits and tenant weights: the one
//! mapping the Kubernetes, file and flag sources share, so a budget means the same wherever it
//! is written. Kubernetes splits the pool's budget over its replicas; a file or flags describe the
//! budget of one multiplexer, split over one.

use std::collections::BTreeMap;

use teifleet_crds::duration::parse_duration;
use teifleet_crds::{ConcurrencySpec, GpuSpec, Shares, SharingStrategy, split_budget};

use crate::admission::{DEFAULT_INGEST_SHARE, Limits, MAX_INGEST_SHARE, MAX_QUERY_RESERVE};

/// One replica's limits under its `share` of the pool's budget. The budget's own checks (the API
/// server makes them for an EmbeddingPool) hold here too, for budgets from a file or flags.
pub fn limits(concurrency: &ConcurrencySpec, share: &Shares) -> Result<Limits, String> {
    if concurrency.max_in_flight < 1 {
        return Err("maxInFlight must be at least 1".into());
    }
    if concurrency.max_queued < 0 {
        return Err("maxQueued must be 0 or more".into());
    }
    let queue_timeout = parse_duration(&concurrency.queue_timeout).map_err(|e| format!("queueTimeout: {e}"))?;
    let ingest_share = percent(concurrency.ingest_share, DEFAULT_INGEST_SHARE, MAX_INGEST_SHARE, "ingestShare")?;
    // Unset: learned from TEI's batch times (`admission/ingest_gate.rs`).
    let query_reserve = concurrency
        .query_reserve
        .map(|reserve| percent(Some(reserve), 0, MAX_QUERY_RESERVE, "queryReserve"))
        .transpose()?;
    let device_time_cap = match concurrency.device_time_cap {
        Some(cap @ 1..=100) => u8::try_from(cap).ok(),
        Some(cap) => return Err(format!("deviceTimeCap must be between 1 and 100 (got {cap})")),
        None => None,
    };
    // The token budget is split like the others: rounded up, so the pool never gets less.
    let tokens = concurrency.max_in_flight_tokens.map(|tokens| {
        let split_over = i64::from(share.split_over.max(1));
        usize::try_from((tokens.max(1) + split_over - 1) / split_over).unwrap_or(usize::MAX)
    });
    let in_flight = usize::try_from(share.in_flight_per_replica).unwrap_or(1).max(1);
    Ok(Limits {
        max_in_flight_tokens: tokens,
        adaptive: concurrency.adaptive,
        ingest_share,
        query_reserve,
        device_time_cap,
        ..Limits::new(in_flight, usize::try_from(share.queued_per_replica).unwrap_or(0), queue_timeout)
    })
}

/// A percent field: `default` when unset, refused beyond `max` (the API server's CEL rule, for
/// budgets from a file or flags).
fn percent(value: Option<i32>, default: u8, max: u8, field: &str) -> Result<u8, String> {
    let Some(value) = value else { return Ok(default) };
    u8::try_from(value)
        .ok()
        .filter(|percent| *percent <= max)
        .ok_or_else(|| format!("{field} must be between 0 and {max} (got {value})"))
}

/// The whole budget as one multiplexer's limits.
pub fn whole(concurrency: &ConcurrencySpec) -> Result<Limits, String> {
    limits(concurrency, &split_budget(concurrency, 0, 1))
}

/// A replica's share of a time-sliced GPU in percent, from the pool's `gpu.sharing`: one of
/// `replicas` turns on the card. None for whole GPUs, MIG (the hardware isolates) and MPS (the
/// device plugin limits each replica's compute to its share already).
pub fn gpu_share(gpu: &GpuSpec) -> Option<u8> {
    let sharing = gpu.sharing.as_ref().filter(|sharing| sharing.strategy == SharingStrategy::TimeSlicing)?;
    let replicas = sharing.replicas.filter(|replicas| *replicas >= 2)?;
    u8::try_from((100 / replicas).max(1)).ok()
}

/// `limits` with a share of a time-sliced GPU (percent, 1 to 100; none: not shared): the cap on
/// TEI time while a neighbour is busy on the device (`crate::admission`).
pub fn with_gpu_share(limits: Limits, share: Option<i64>) -> Result<Limits, String> {
    let gpu_share = match share {
        Some(share @ 1..=100) => u8::try_from(share).ok(),
        Some(share) => return Err(format!("gpuShare must be between 1 and 100 (got {share})")),
        None => None,
    };
    Ok(Limits { gpu_share, ..limits })
}

/// Tenant weights by name; tenants not listed weigh 1.
pub fn tenants(concurrency: &ConcurrencySpec) -> BTreeMap<String, u32> {
    let weight = |weight: i32| u32::try_from(weight).unwrap_or(1).max(1);
    concurrency.tenants.iter().map(|t| (t.name.clone(), weight(t.weight))).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use teifleet_crds::TenantWeight;

    use super::*;

    #[test]
    fn a_budget_split_over_replicas_rounds_every_share_up() {
        let concurrency = ConcurrencySpec {
            max_in_flight: 10,
            max_queued: 5,
            queue_timeout: "1500ms".into(),
            max_in_flight_tokens: Some(1001),
            ..ConcurrencySpec::default()
        };
        let limits = limits(&concurrency, &split_budget(&concurrency, 0, 3)).unwrap();
        assert_eq!((limits.max_in_flight, limits.max_queued), (4, 2));
        assert_eq!(limits.max_in_flight_tokens, Some(334));
        assert_eq!(limits.queue_timeout, Duration::from_millis(1500));
        let whole = whole(&concurrency).unwrap();
        assert_eq!((whole.max_in_flight, whole.max_queued, whole.max_in_flight_tokens), (10, 5, Some(1001)));
    }

    #[test]
    fn a_budget_the_api_server_would_refuse_is_refused_here_too() {
        let zero = ConcurrencySpec { max_in_flight: 0, ..ConcurrencySpec::default() };
        assert!(whole(&zero).unwrap_err().contains("maxInFlight"));
        let never = ConcurrencySpec { queue_timeout: "soon".into(), ..ConcurrencySpec::default() };
        assert!(whole(&never).unwrap_err().contains("queueTimeout"));
        let greedy = ConcurrencySpec { ingest_share: Some(60), ..ConcurrencySpec::default() };
        assert!(whole(&greedy).unwrap_err().contains("ingestShare"));
    }

    #[test]
    fn the_ingest_floor_defaults_to_a_tenth() {
        assert_eq!(whole(&ConcurrencySpec::default()).unwrap().ingest_share, 10);
        let none = ConcurrencySpec { ingest_share: Some(0), ..ConcurrencySpec::default() };
        assert_eq!(whole(&none).unwrap().ingest_share, 0);
        assert_eq!(whole(&ConcurrencySpec::default()).unwrap().query_reserve, None, "learned by default");
        let reserve = ConcurrencySpec { query_reserve: Some(25), ..ConcurrencySpec::default() };
        assert_eq!(whole(&reserve).unwrap().query_reserve, Some(25));
        let none = ConcurrencySpec { query_reserve: Some(0), ..ConcurrencySpec::default() };
        assert_eq!(whole(&none).unwrap().query_reserve, Some(0), "0 said explicitly: ingest takes every place");
        let greedy = ConcurrencySpec { query_reserve: Some(51), ..ConcurrencySpec::default() };
        assert!(whole(&greedy).unwrap_err().contains("queryReserve must be between 0 and 50"));
    }

    #[test]
    fn the_device_time_cap_is_unset_by_default_and_a_percent_when_set() {
        assert_eq!(whole(&ConcurrencySpec::default()).unwrap().device_time_cap, None);
        let quarter = ConcurrencySpec { device_time_cap: Some(25), ..ConcurrencySpec::default() };
        assert_eq!(whole(&quarter).unwrap().device_time_cap, Some(25));
        for wrong in [0, 101, -5] {
            let cap = ConcurrencySpec { device_time_cap: Some(wrong), ..ConcurrencySpec::default() };
            assert!(whole(&cap).unwrap_err().contains("deviceTimeCap must be between 1 and 100"), "{wrong}");
        }
    }

    #[test]
    fn a_time_sliced_gpu_gives_each_replica_its_share_and_nothing_else_does() {
        let gpu = |sharing: serde_json::Value| -> GpuSpec {
            serde_json::from_value(serde_json::json!({ "type": "nvidia-l4", "sharing": sharing })).unwrap()
        };
        assert_eq!(gpu_share(&gpu(serde_json::json!({ "strategy": "time-slicing", "replicas": 4 }))), Some(25));
        assert_eq!(gpu_share(&gpu(serde_json::json!({ "strategy": "time-slicing", "replicas": 3 }))), Some(33));
        assert_eq!(gpu_share(&gpu(serde_json::json!({ "strategy": "mps", "replicas": 4 }))), None);
        assert_eq!(gpu_share(&gpu(serde_json::json!({ "strategy": "mig", "profile": "1g.10gb" }))), None);
        assert_eq!(gpu_share(&GpuSpec::default()), None);
        let limits = whole(&ConcurrencySpec::default()).unwrap();
        assert_eq!(with_gpu_share(limits, Some(25)).unwrap().gpu_share, Some(25));
        assert_eq!(with_gpu_share(limits, None).unwrap().gpu_share, None);
        for wrong in [0, 101] {
            assert!(with_gpu_share(limits, Some(wrong)).unwrap_err().contains("gpuShare must be between 1 and 100"));
        }
    }

    #[test]
    fn tenants_weigh_at_least_one() {
        let concurrency = ConcurrencySpec {
            tenants: vec![
                TenantWeight { name: "search".into(), weight: 3, max_priority: None, lane: None },
                TenantWeight { name: "x".into(), weight: 0, max_priority: None, lane: None },
            ],
            ..ConcurrencySpec::default()
        };
        assert_eq!(tenants(&concurrency), BTreeMap::from([("search".into(), 3), ("x".into(), 1)]));
    }
}
