//! What the load asks for, before stabilization and bounds.
//!
//! The load is what the pool's sidecars have in flight and queued, summed: each sidecar counts
//! every input it admitted or holds, which TEI's own queue gauge does not show under load
//! (TEI issue #880), and which GPU utilization, high as soon as a batch runs, says little about.
//! It is averaged over the readings of the last [`LOAD_WINDOW`]: one reading is one instant's
//! count, as noisy at a steady load as the arrivals themselves, and the HPA's own CPU signal is
//! an average over its metrics window too. Against it, each replica's in-flight limit in force
//! (`maxInFlightPerReplica`, or an adaptive pool's limit) at the target utilization gives the
//! replicas needed, as the HPA computes them: ceil(load / (limit × target)), unless that is
//! within [`TOLERANCE`] of the replicas the pool has (ready or starting), which it then keeps.

use std::collections::VecDeque;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use teifleet_crds::SidecarAdmission;

use super::{Observed, Policy};

/// The readings the load is averaged over.
pub const LOAD_WINDOW: Duration = Duration::from_secs(30);

/// A reading taken this soon after the one before replaces it: reconciles that watch events
/// bring close together read the same reports, and must not weigh one moment twice.
const SAME_MOMENT: Duration = Duration::from_secs(5);

/// How far from the target utilization (as a fraction of it) the pool may be before the
/// recommendation moves: 10%, the HPA's default.
pub const TOLERANCE: f64 = 0.1;

/// One look at the pool's load: what its sidecars reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    pub at: Timestamp,
    /// Inputs in flight and queued, summed over the sidecars that answered.
    pub load: f64,
    /// Their in-flight limits in force, summed.
    pub capacity: f64,
    pub reporting: usize,
}

impl Reading {
    /// What `reports` say at `now`; `None` when no sidecar answered (an unknown load is not an
    /// idle one).
    pub fn of(policy: &Policy, reports: &[SidecarAdmission], now: Timestamp) -> Option<Self> {
        if reports.is_empty() {
            return None;
        }
        // The limit in force: the share (maxInFlightPerReplica within the budget bound) or an
        // adaptive sidecar's own, never above the share however a sidecar reports it.
        let limit = |r: &SidecarAdmission| f64::from(r.effective_in_flight.clamp(1, policy.share.max(1) as u32));
        Some(Self {
            at: now,
            load: reports.iter().map(|r| f64::from(r.in_flight) + f64::from(r.queued)).sum(),
            capacity: reports.iter().map(limit).sum(),
            reporting: reports.len(),
        })
    }
}

/// The recent readings of a pool, oldest first.
#[derive(Clone, Debug, Default)]
pub struct Readings(VecDeque<Reading>);

/// The load over the recent readings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    /// Inputs in flight and queued, on average.
    pub in_use: f64,
    /// One replica's in-flight limit, on average.
    pub per_replica: f64,
    /// `in_use` over the limits of the sidecars that reported (1.0 is full).
    pub utilization: f64,
}

impl Readings {
    /// Adds `reading`, and forgets the readings it makes older than [`LOAD_WINDOW`].
    pub fn add(&mut self, reading: Reading) {
        if self.0.back().is_some_and(|last| age(last.at, reading.at) < SAME_MOMENT.as_secs_f64()) {
            self.0.pop_back();
        }
        self.0.push_back(reading);
        while self.0.front().is_some_and(|first| age(first.at, reading.at) >= LOAD_WINDOW.as_secs_f64()) {
            self.0.pop_front();
        }
    }

    /// The average load; `None` before any reading.
    pub fn load(&self) -> Option<Load> {
        let count = self.0.len() as f64;
        let load: f64 = self.0.iter().map(|r| r.load).sum();
        let capacity: f64 = self.0.iter().map(|r| r.capacity).sum();
        let reporting: usize = self.0.iter().map(|r| r.reporting).sum();
        (reporting > 0).then(|| Load {
            in_use: load / count,
            per_replica: capacity / reporting as f64,
            utilization: load / capacity.max(1.0),
        })
    }
}

fn age(then: Timestamp, now: Timestamp) -> f64 {
    now.duration_since(then).as_secs_f64()
}

/// Why the load asks for what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No replica is ready yet (the pool is starting, or its pods wait): nothing to measure.
    Starting,
    /// Replicas are ready but none of their sidecars answered.
    NoReports,
    WithinTolerance,
    Load,
    /// Calls are refused while the pool is at or above its target: one more than is ready.
    Refusals,
    /// Calls wait at the activator for a pool at zero.
    Held,
    /// Nothing in flight or queued; one replica stays until the pool may scale to zero.
    Idle,
    IdleToZero,
    AtZero,
}

/// What the load asks for, and why, with the numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    pub replicas: i32,
    pub reason: Reason,
    pub why: String,
}

impl Recommendation {
    fn new(replicas: i32, reason: Reason, why: impl Into<String>) -> Self {
        Self { replicas, reason, why: why.into() }
    }

    /// Leaving zero for held calls and going to zero after `scaleToZeroAfter` without a call
    /// skip the stabilization windows: a call is waiting, or the idle time was the window.
    pub fn skips_windows(&self) -> bool {
        matches!(self.reason, Reason::Held | Reason::IdleToZero)
    }
}

/// What the pool, now at `current` replicas, needs for what `seen` shows and the `load` of the
/// recent readings.
pub fn recommend(policy: &Policy, current: i32, seen: &Observed<'_>, load: Option<Load>) -> Recommendation {
    if seen.ready == 0 {
        return without_a_ready_replica(policy, current, seen.held.map_or(0, |held| held.held));
    }
    let target_percent = policy.target_percent;
    let Some(load) = load.filter(|_| !seen.reports.is_empty()) else {
        return Recommendation::new(current, Reason::NoReports, "no sidecar reported its load");
    };
    if idle_long_enough(policy, seen) {
        let after = &policy.spelled.scale_to_zero_after;
        return Recommendation::new(0, Reason::IdleToZero, format!("no call for {after} (scaleToZeroAfter)"));
    }

    // Against the replicas asked for, ready or not: one still starting is already on its way.
    let needed = load.in_use / (load.per_replica.max(1.0) * policy.target());
    let utilization = load.in_use / (load.per_replica.max(1.0) * f64::from(current.max(1)));
    let percent = (utilization * 100.0).round();
    let mut recommendation = if (needed / f64::from(current.max(1)) - 1.0).abs() <= TOLERANCE {
        Recommendation::new(
            current,
            Reason::WithinTolerance,
            format!(
                "{percent}% of the in-flight budget in use, within {}% of target {target_percent}%",
                TOLERANCE * 100.0
            ),
        )
    } else if needed_replicas(needed) < current && shrunk_with_headroom(needed) >= current {
        Recommendation::new(
            current,
            Reason::WithinTolerance,
            format!(
                "{percent}% of the in-flight budget in use at target {target_percent}%: one replica fewer would run \
                 within {}% of the target, where the longer waits of fewer replicas would push it over",
                TOLERANCE * 100.0
            ),
        )
    } else if needed_replicas(needed) < current {
        Recommendation::new(
            shrunk_with_headroom(needed),
            Reason::Load,
            format!("{percent}% of the in-flight budget in use at target {target_percent}%"),
        )
    } else {
        Recommendation::new(
            needed_replicas(needed),
            Reason::Load,
            format!("{percent}% of the in-flight budget in use at target {target_percent}%"),
        )
    };
    if recommendation.replicas == 0 {
        let mut why = "nothing in flight or queued".to_owned();
        if policy.min == 0 {
            why.push_str(&format!(
                "; the pool scales to zero after {} without a call",
                policy.spelled.scale_to_zero_after
            ));
        }
        recommendation = Recommendation::new(1, Reason::Idle, why);
    }
    let refused: f64 = seen.reports.iter().map(|r| r.refused_per_second).sum();
    if refused > 0.0 && load.utilization >= policy.target() && recommendation.replicas <= seen.ready {
        // The rate covers the last minute: counted against what is ready, so replicas still
        // starting are not asked for again.
        recommendation = Recommendation::new(
            seen.ready + 1,
            Reason::Refusals,
            format!(
                "{refused:.2} calls/s refused at {}% of the ready replicas' in-flight budget in use: one replica \
                 more than the {} ready",
                (load.utilization * 100.0).round(),
                seen.ready
            ),
        );
    }
    recommendation
}

/// At zero, or starting: nothing to measure but the calls the activator holds.
fn without_a_ready_replica(policy: &Policy, current: i32, held: u32) -> Recommendation {
    let for_held = replicas_for(f64::from(held), f64::from(policy.share), policy.target());
    let held_text = format!("{held} call(s) held at the activator while no replica is ready");
    match (current, held) {
        (0, 0) => Recommendation::new(0, Reason::AtZero, "scaled to zero, and no call held at the activator"),
        (0, _) => Recommendation::new(for_held.max(1), Reason::Held, held_text),
        (_, 0) => Recommendation::new(current, Reason::Starting, "no replica ready yet"),
        _ => Recommendation::new(current.max(for_held), Reason::Starting, format!("no replica ready yet; {held_text}")),
    }
}

/// The replicas that carry `load` at `target` with `per_replica` each.
fn replicas_for(load: f64, per_replica: f64, target: f64) -> i32 {
    needed_replicas(load / (per_replica.max(1.0) * target))
}

/// The replicas to shrink to for `needed`: enough that they run at most `1 - TOLERANCE` of the
/// target. The load counted is calls in flight and queued, and it is not the same on fewer
/// replicas: each takes a larger share of the calls, so each call waits longer and more are in
/// flight at once. A pool shrunk to exactly the target reads over it at once and grows back (seen
/// on the real node: 5 → 4 → 5 → 4 at a steady load needing 4.3); the headroom is the tolerance
/// a step up would need to cross anyway.
fn shrunk_with_headroom(needed: f64) -> i32 {
    needed_replicas(needed / (1.0 - TOLERANCE))
}

/// Whole replicas for `needed`; a hair under a whole number rounds down, so that exactly the
/// target needs no extra replica for floating-point noise.
fn needed_replicas(needed: f64) -> i32 {
    (needed - 1e-9).ceil().max(0.0) as i32
}

/// Whether the pool may go to zero: it may (`minReplicas: 0`), every ready sidecar answered and
/// has had no call for `scaleToZeroAfter`, nothing is in flight or queued, and no activator pod
/// has had a call for it for as long either (the held calls' idle time is the shortest of every
/// pod's, and unknown, NaN, when one of them did not say: then the pool stays).
fn idle_long_enough(policy: &Policy, seen: &Observed<'_>) -> bool {
    let after = policy.scale_to_zero_after.as_secs_f64();
    policy.min == 0
        && seen.reports.len() >= usize::try_from(seen.ready).unwrap_or(usize::MAX)
        && seen
            .reports
            .iter()
            .all(|r| r.in_flight == 0 && r.queued == 0 && r.idle_seconds.is_some_and(|idle| idle >= after))
        && seen.held.is_none_or(|held| held.held == 0 && !held.idle_seconds.is_nan() && held.idle_seconds >= after)
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;
    use teifleet_crds::HeldCalls;

    use super::super::policy::tests::pool;
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    /// A static sidecar's report: `in_flight` and `queued` of a limit of `limit`.
    pub(in crate::autoscale) fn report(limit: u32, in_flight: u32, queued: u32) -> SidecarAdmission {
        SidecarAdmission {
            pool: "bge".into(),
            effective_in_flight: limit,
            max_in_flight: limit,
            adaptive: false,
            in_flight,
            queued,
            standing_queue: false,
            refused_per_second: 0.0,
            spilled_per_second: 0.0,
            idle_seconds: Some(0.0),
            tls: None,
        }
    }

    fn policy(autoscaling: serde_json::Value) -> Policy {
        Policy::of(&pool(256, 16, autoscaling)).unwrap()
    }

    fn seen<'a>(ready: i32, reports: &'a [SidecarAdmission], held: Option<&'a HeldCalls>) -> Observed<'a> {
        Observed { ready, reports, held, ..Observed::default() }
    }

    /// The recommendation for one reading of `reports` on `current` replicas, all ready.
    fn once(policy: &Policy, current: i32, reports: &[SidecarAdmission]) -> Recommendation {
        let load = Reading::of(policy, reports, at(0)).map(|reading| {
            let mut readings = Readings::default();
            readings.add(reading);
            readings.load().unwrap()
        });
        recommend(policy, current, &seen(current, reports, None), load)
    }

    #[test]
    fn the_load_over_each_replicas_limit_at_the_target_gives_the_replicas() {
        let policy = policy(json!({ "maxReplicas": 16 }));
        // 2 replicas of 16, 45 in flight or queued: 140% of the budget in use at target 70%.
        let busy = once(&policy, 2, &[report(16, 16, 7), report(16, 16, 6)]);
        assert_eq!((busy.replicas, busy.reason), (5, Reason::Load), "45 / (16 × 0.7) = 4.02");
        assert_eq!(busy.why, "141% of the in-flight budget in use at target 70%");
        // Exactly at the target: no extra replica for rounding.
        assert_eq!(replicas_for(44.8, 16.0, 0.7), 4);
        assert_eq!(replicas_for(0.0, 16.0, 0.7), 0);
        // Quiet: fewer.
        let quiet = once(&policy, 4, &[report(16, 2, 0), report(16, 3, 0), report(16, 1, 0), report(16, 2, 0)]);
        assert_eq!((quiet.replicas, quiet.reason), (1, Reason::Load));
    }

    #[test]
    fn within_the_tolerance_the_count_stays() {
        let policy = policy(json!({ "maxReplicas": 16 }));
        // 4 × 16 at 70% is 44.8: 41 to 49 in use stays within 10% of the target.
        for in_use in [41, 44, 45, 49] {
            let reports: Vec<_> = (0..4).map(|i| report(16, in_use / 4 + u32::from(i < in_use % 4), 0)).collect();
            let recommendation = once(&policy, 4, &reports);
            assert_eq!((recommendation.replicas, recommendation.reason), (4, Reason::WithinTolerance), "{in_use}");
        }
        let reports: Vec<_> = (0..4).map(|_| report(16, 13, 0)).collect();
        assert_eq!(once(&policy, 4, &reports).replicas, 5, "52 in use is 16% over: one more");
    }

    #[test]
    fn a_step_down_keeps_headroom_below_the_target() {
        let policy = policy(json!({ "maxReplicas": 16 }));
        // 5 × 16 at 70% is 56. 42 in use needs 3.75 replicas: 4 would run at 94% of the target,
        // and the longer waits on 4 would push it over, so the count stays.
        let reports: Vec<_> = (0..5).map(|i| report(16, 8 + u32::from(i < 2), 0)).collect();
        let stays = once(&policy, 5, &reports);
        assert_eq!((stays.replicas, stays.reason), (5, Reason::WithinTolerance));
        assert!(stays.why.contains("one replica fewer would run within 10% of the target"), "{}", stays.why);
        // 35 in use needs 3.1: 4 run at 78% of the target, with the headroom.
        let reports: Vec<_> = (0..5).map(|_| report(16, 7, 0)).collect();
        let shrinks = once(&policy, 5, &reports);
        assert_eq!((shrinks.replicas, shrinks.reason), (4, Reason::Load));
        // 40 in use needs 3.57: 4 would run at 89% of the target; the headroom asks for 4 too.
        assert_eq!(shrunk_with_headroom(40.0 / 11.2), 4);
        assert_eq!(shrunk_with_headroom(0.0), 0);
    }

    #[test]
    fn an_adaptive_pools_limits_are_its_capacity() {
        let policy = policy(json!({ "maxReplicas": 16 }));
        // TEI is slow: the sidecars found 8 of their 16, and are full.
        let adaptive = |in_flight| SidecarAdmission { adaptive: true, ..report(8, in_flight, 0) };
        let slow = once(&policy, 2, &[adaptive(8), adaptive(8)]);
        assert_eq!((slow.replicas, slow.why.as_str()), (3, "100% of the in-flight budget in use at target 70%"));
        // A limit reported above the share counts as the share.
        assert_eq!(Reading::of(&policy, &[report(64, 0, 0)], at(0)).unwrap().capacity, 16.0);
    }

    #[test]
    fn refusals_at_a_high_utilization_add_one_over_what_is_ready() {
        let policy = policy(json!({ "maxReplicas": 16 }));
        let refusing = |in_flight| SidecarAdmission { refused_per_second: 1.5, ..report(16, in_flight, 0) };
        // Within the tolerance, but calls are refused: one more.
        let full = once(&policy, 2, &[refusing(11), refusing(12)]);
        assert_eq!((full.replicas, full.reason), (3, Reason::Refusals));
        assert_eq!(
            full.why,
            "3.00 calls/s refused at 72% of the ready replicas' in-flight budget in use: one replica more than the 2 ready"
        );
        // Refusals at a low utilization (a token budget, a slow client) are no reason to grow.
        assert_eq!(once(&policy, 2, &[refusing(2), refusing(2)]).reason, Reason::Load);
        // The replica asked for is still starting: 3 wanted, 2 ready, not a fourth.
        let reports = [refusing(11), refusing(12)];
        let load = {
            let mut readings = Readings::default();
            readings.add(Reading::of(&policy, &reports, at(0)).unwrap());
            readings.load()
        };
        assert_eq!(recommend(&policy, 3, &seen(2, &reports, None), load).replicas, 3);
    }

    #[test]
    fn readings_are_averaged_over_the_window_and_a_repeat_replaces_the_last() {
        let policy = policy(json!({ "maxReplicas": 16 }));
        let mut readings = Readings::default();
        for (second, in_flight) in [(0, 100), (10, 10), (20, 20), (30, 30), (32, 90)] {
            readings.add(Reading::of(&policy, &[report(16, in_flight, 0)], at(second)).unwrap());
        }
        // 0 s has left the window; 32 s replaced 30 s.
        let load = readings.load().unwrap();
        assert_eq!(load.in_use, (10.0 + 20.0 + 90.0) / 3.0);
        assert_eq!(load.per_replica, 16.0);
        assert_eq!(Readings::default().load(), None);
    }

    #[test]
    fn without_a_ready_replica_or_a_report_the_count_stays() {
        let policy = policy(json!({ "maxReplicas": 16 }));
        let starting = recommend(&policy, 3, &seen(0, &[], None), None);
        assert_eq!((starting.replicas, starting.reason), (3, Reason::Starting));
        let silent = recommend(&policy, 3, &seen(2, &[], None), None);
        assert_eq!(
            (silent.replicas, silent.reason, silent.why.as_str()),
            (3, Reason::NoReports, "no sidecar reported its load")
        );
    }

    #[test]
    fn held_calls_wake_a_pool_at_zero_with_replicas_for_them() {
        let policy = policy(json!({ "minReplicas": 0, "maxReplicas": 16 }));
        let held = |held| HeldCalls { pool: "bge".into(), held, idle_seconds: 0.0 };
        let one = held(1);
        let woken = recommend(&policy, 0, &seen(0, &[], Some(&one)), None);
        assert_eq!((woken.replicas, woken.reason), (1, Reason::Held));
        assert_eq!(woken.why, "1 call(s) held at the activator while no replica is ready");
        assert!(woken.skips_windows());
        // 40 held need 40 / (16 × 0.7) = 3.6 replicas.
        let many = held(40);
        assert_eq!(recommend(&policy, 0, &seen(0, &[], Some(&many)), None).replicas, 4);
        // Starting already: no fewer than asked for.
        assert_eq!(recommend(&policy, 2, &seen(0, &[], Some(&one)), None).replicas, 2);
        assert_eq!(recommend(&policy, 2, &seen(0, &[], Some(&many)), None).replicas, 4);
        let none = held(0);
        let asleep = recommend(&policy, 0, &seen(0, &[], Some(&none)), None);
        assert_eq!((asleep.replicas, asleep.reason), (0, Reason::AtZero));
    }

    #[test]
    fn zero_only_when_every_sidecar_and_the_activator_have_been_idle_long_enough() {
        let policy = policy(json!({ "minReplicas": 0, "maxReplicas": 16, "scaleToZeroAfter": "10m" }));
        let idle = |seconds| SidecarAdmission { idle_seconds: seconds, ..report(16, 0, 0) };
        let load = Some(Load { in_use: 0.0, per_replica: 16.0, utilization: 0.0 });
        let both = [idle(Some(600.0)), idle(Some(900.0))];
        let gone = recommend(&policy, 2, &seen(2, &both, None), load);
        assert_eq!(
            (gone.replicas, gone.reason, gone.why.as_str()),
            (0, Reason::IdleToZero, "no call for 10m (scaleToZeroAfter)")
        );

        let waiting = recommend(&policy, 2, &seen(2, &[idle(Some(600.0)), idle(Some(30.0))], None), load);
        assert_eq!((waiting.replicas, waiting.reason), (1, Reason::Idle));
        assert_eq!(waiting.why, "nothing in flight or queued; the pool scales to zero after 10m without a call");
        assert_eq!(
            recommend(&policy, 2, &seen(2, &[idle(Some(900.0)), idle(None)], None), load).replicas,
            1,
            "unknown"
        );
        assert_eq!(recommend(&policy, 2, &seen(3, &both, None), load).replicas, 1, "a ready sidecar did not answer");
        let recent = HeldCalls { pool: "bge".into(), held: 0, idle_seconds: 20.0 };
        assert_eq!(recommend(&policy, 2, &seen(2, &both, Some(&recent)), load).replicas, 1, "the activator had a call");
        let quiet = HeldCalls { idle_seconds: 3600.0, ..recent };
        assert_eq!(recommend(&policy, 2, &seen(2, &both, Some(&quiet)), load).replicas, 0);
        let unheard = HeldCalls { idle_seconds: f64::NAN, ..quiet.clone() };
        assert_eq!(
            recommend(&policy, 2, &seen(2, &both, Some(&unheard)), load).replicas,
            1,
            "an activator pod that did not say when it last had a call"
        );

        let kept = Policy { min: 1, ..policy };
        let one = recommend(&kept, 2, &seen(2, &both, None), load);
        assert_eq!(
            (one.replicas, one.why.as_str()),
            (1, "nothing in flight or queued"),
            "minReplicas 1 never goes to zero"
        );
    }
}
