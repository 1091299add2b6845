//! The times `status.autoscaling` shows. They move only when what they stand for does: the
//! status of a steady pool is not rewritten because a clock advanced.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::Observed;

/// `lastCallTime` moves only for a call that arrived this long after the one shown. A busy pool
/// then writes it once a minute; an idle pool's stays put, though the reports it is computed from
/// are up to one look old (now − idle seconds at the time of the report drifts by that much).
const LAST_CALL_RESOLUTION: Duration = Duration::from_secs(60);

/// The shortest time any sidecar or the activator has been without a call.
pub fn idle_seconds(seen: &Observed<'_>) -> Option<f64> {
    let sidecars = seen.reports.iter().filter_map(|report| report.idle_seconds);
    let activator = seen.held.map(|held| held.idle_seconds);
    sidecars.chain(activator).filter(|idle| idle.is_finite() && *idle >= 0.0).reduce(f64::min)
}

/// When a call last arrived (`lastCallTime`), given what was shown and the time since the last
/// call.
pub fn last_call(shown: Option<&str>, idle: Option<f64>, now: Timestamp) -> Option<String> {
    let Some(idle) = idle else { return shown.map(str::to_owned) };
    // Whole seconds: `now` is, and a status needs no finer.
    let call = Timestamp::from_second(now.as_second().saturating_sub(idle.round() as i64)).unwrap_or(now);
    match shown.and_then(|text| text.parse::<Timestamp>().ok()) {
        Some(at) if call.duration_since(at).as_secs_f64() < LAST_CALL_RESOLUTION.as_secs_f64() => {
            shown.map(str::to_owned)
        }
        _ => Some(call.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    #[test]
    fn the_last_call_moves_only_for_a_later_call_not_for_a_clock_or_an_old_report() {
        assert_eq!(last_call(None, None, at(100)), None);
        let first = last_call(None, Some(30.4), at(100)).unwrap();
        assert_eq!(first, at(70).to_string());
        assert_eq!(first, "2027-01-15T08:01:10Z");
        // An idle pool, its reports up to a look old: the same call seen a few seconds apart.
        assert_eq!(last_call(Some(&first), Some(35.0), at(110)), Some(first.clone()));
        assert_eq!(last_call(Some(&first), Some(20.0), at(110)), Some(first.clone()), "50 s later: not yet");
        // No report: what the status shows stays.
        assert_eq!(last_call(Some(&first), None, at(500)), Some(first.clone()));
        // A call a minute or more after the one shown.
        assert_eq!(last_call(Some(&first), Some(0.0), at(130)), Some(at(130).to_string()));
        // What a person wrote, or garbage: replaced.
        assert_eq!(last_call(Some("yesterday"), Some(0.0), at(130)), Some(at(130).to_string()));
    }
}
