//! The autoscaler as a whole, driven look by look (every 10 s, as the controller does) through
//! the scenarios it exists for.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use teifleet_crds::{AutoscalingStatus, HeldCalls, SidecarAdmission};

use super::policy::tests::pool;
use super::recommend::tests::report;
use super::*;

/// A pool under the autoscaler, its replicas ready as soon as asked for unless told otherwise.
struct Sim {
    autoscaler: Autoscaler,
    policy: Policy,
    second: i64,
    status: Option<AutoscalingStatus>,
    /// What the pool ran before the autoscaler's first look.
    running: i32,
    desired: i32,
    last_call: i64,
}

impl Sim {
    fn new(budget: i32, share: i32, autoscaling: Value, running: i32) -> Self {
        Self {
            autoscaler: Autoscaler::default(),
            policy: Policy::of(&pool(budget, share, autoscaling)).unwrap(),
            second: 0,
            status: None,
            running,
            desired: running,
            last_call: 0,
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + self.second).unwrap()
    }

    /// The sidecars of `ready` replicas carrying `in_use` inputs, each up to its share in flight
    /// and the rest queued.
    fn reports(&mut self, ready: i32, in_use: u32) -> Vec<SidecarAdmission> {
        if in_use > 0 {
            self.last_call = self.second;
        }
        let share = self.policy.share as u32;
        let ready = ready.max(0) as u32;
        let idle = Some((self.second - self.last_call) as f64);
        (0..ready)
            .map(|i| {
                let mine = in_use / ready + u32::from(i < in_use % ready);
                SidecarAdmission { idle_seconds: idle, ..report(share, mine.min(share), mine.saturating_sub(share)) }
            })
            .collect()
    }

    /// One look with `in_use` inputs spread over the replicas, all of them ready and placed.
    fn look(&mut self, in_use: u32) -> Decision {
        let ready = self.desired;
        let reports = self.reports(ready, in_use);
        self.look_at(ready, &reports, None, Placement { placed: ready, gpu_short: false })
    }

    fn look_at(
        &mut self,
        ready: i32,
        reports: &[SidecarAdmission],
        held: Option<&HeldCalls>,
        placement: Placement,
    ) -> Decision {
        let previous = self.status.clone();
        let seen = Observed {
            recorded: previous.as_ref().map(|shown| shown.desired_replicas).or(Some(self.running)),
            ready,
            placement,
            reports,
            held,
            previous: previous.as_ref(),
        };
        let decision = self.autoscaler.decide("uid", &self.policy, &seen, self.now());
        self.status = Some(decision.status.clone());
        self.desired = decision.desired;
        self.second += INTERVAL.as_secs() as i64;
        decision
    }

    /// Looks for `seconds` at a steady `in_use`; returns the decisions.
    fn run(&mut self, seconds: i64, in_use: u32) -> Vec<Decision> {
        let until = self.second + seconds;
        std::iter::from_fn(|| (self.second < until).then(|| self.look(in_use))).collect()
    }
}

fn counts(decisions: &[Decision]) -> Vec<i32> {
    decisions.iter().map(|decision| decision.desired).collect()
}

fn notes(decisions: &[Decision]) -> Vec<String> {
    decisions.iter().flat_map(Decision::events).filter_map(|event| event.note).collect()
}

/// 2 replicas of 16 at 140% of their budget: 45 inputs in flight or queued.
const TWICE_THE_TARGET_ON_2: u32 = 45;

#[test]
fn a_step_up_starts_at_the_first_look_and_reaches_what_the_load_needs() {
    let mut sim = Sim::new(256, 16, json!({ "maxReplicas": 8 }), 2);
    // 70% of 2 × 16: at the target.
    assert_eq!(counts(&sim.run(60, 22)), [2; 6]);
    let step = sim.run(60, TWICE_THE_TARGET_ON_2);
    assert!(step[0].desired > 2, "the first look after the step adds replicas: {:?}", counts(&step));
    // The average over the last 30 s catches up within it: 45 on 4 replicas is 70%.
    assert_eq!(counts(&step)[3..], [4, 4, 4]);
    let ups = notes(&step);
    assert!(ups.iter().all(|note| note.starts_with("Scaled up from ")), "{ups:?}");
    assert!(ups.last().unwrap().starts_with("Scaled up from 3 to 4: "), "{ups:?}");
    assert!(ups.last().unwrap().contains("% of the in-flight budget in use at target 70%"), "{ups:?}");
    let status = step.last().unwrap().status.clone();
    assert_eq!((status.desired_replicas, status.recommended_replicas), (4, 4));
    assert!(status.last_scale_time.is_some());
}

#[test]
fn a_dip_must_last_the_scale_down_window() {
    let mut sim = Sim::new(256, 16, json!({ "maxReplicas": 8 }), 4);
    assert_eq!(counts(&sim.run(120, TWICE_THE_TARGET_ON_2)), [4; 12]);
    // Load falls to 20: 2 replicas are enough (20 / 11.2), but only after 5 minutes of it.
    let dip = sim.run(330, 20);
    let held: Vec<i32> = counts(&dip)[..30].to_vec();
    assert_eq!(held, [4; 30], "4 for the whole scale-down window");
    assert_eq!(dip.last().unwrap().desired, 2);
    let message = &dip[25].status.message;
    assert!(message.contains("keeping 4, recommended within the last 5m (scaleDownStabilization)"), "{message}");
    assert_eq!(dip[25].status.recommended_replicas, 2);
    // Down as the window lets go of each older recommendation (the average fell over 30 s).
    assert!(notes(&dip).iter().all(|note| note.starts_with("Scaled down from ")), "{:?}", notes(&dip));

    // A dip cut short by load keeps every replica.
    let mut sim = Sim::new(256, 16, json!({ "maxReplicas": 8 }), 4);
    sim.run(120, TWICE_THE_TARGET_ON_2);
    for _ in 0..5 {
        assert_eq!(counts(&sim.run(200, 20)), [4; 20]);
        assert_eq!(counts(&sim.run(30, TWICE_THE_TARGET_ON_2)), [4; 3]);
    }
}

#[test]
fn a_noisy_steady_load_makes_no_change_and_no_status_change() {
    // 4 replicas of 20 at 70% carry 56; the load swings 15% either way from one look to the next.
    let mut sim = Sim::new(400, 20, json!({ "maxReplicas": 8 }), 4);
    let first = sim.look(56);
    let swings = [15, -15, 10, -15, 15, -10, 5, -15, 15, -5, 15, -15];
    for look in 0..180 {
        let swing = f64::from(swings[look % swings.len()]) / 100.0;
        let decision = sim.look((56.0 * (1.0 + swing)).round() as u32);
        assert_eq!(decision.desired, 4, "look {look}");
        assert_eq!(decision.status, first.status, "look {look}: the status would be rewritten");
        assert!(decision.events().is_empty());
    }
    assert_eq!(first.status.recommended_replicas, 4);
    assert!(first.status.message.contains("within 10% of target 70%"), "{}", first.status.message);
}

#[test]
fn a_short_spike_adds_nothing_with_a_scale_up_window() {
    let mut sim = Sim::new(256, 16, json!({ "maxReplicas": 8, "scaleUpStabilization": "1m" }), 2);
    sim.run(60, 22);
    assert_eq!(counts(&sim.run(30, 90)), [2; 3], "a 30 s spike");
    let waiting = sim.status.clone().unwrap().message;
    assert!(waiting.contains("until") && waiting.contains("(scaleUpStabilization)"), "{waiting}");
    sim.run(60, 22);
    // Sustained for the whole minute: up to the lowest wish in it.
    let sustained = counts(&sim.run(90, 90));
    assert_eq!(sustained[..5], [2; 5]);
    assert!(*sustained.last().unwrap() > 2, "{sustained:?}");
}

#[test]
fn an_idle_pool_scales_to_zero_after_the_idle_time_and_held_calls_wake_it() {
    let mut sim = Sim::new(256, 16, json!({ "minReplicas": 0, "maxReplicas": 4, "scaleToZeroAfter": "10m" }), 1);
    sim.run(30, 5);
    let idle = sim.run(590, 0);
    assert_eq!(counts(&idle), vec![1; idle.len()], "one replica until 10 minutes without a call");
    let waiting = &idle[5].status.message;
    assert_eq!(waiting, "nothing in flight or queued; the pool scales to zero after 10m without a call");
    let gone = sim.look(0);
    assert_eq!(gone.desired, 0, "no call for 10 minutes: zero, without waiting for scaleDownStabilization");
    assert_eq!(notes(std::slice::from_ref(&gone)), ["Scaled down from 1 to 0: no call for 10m (scaleToZeroAfter)"]);
    let last_call = gone.status.last_call_time.clone().unwrap();
    // The calls came at 0, 10 and 20 s: shown to the minute, from the first.
    assert_eq!(last_call, Timestamp::from_second(1_800_000_000).unwrap().to_string());

    // At zero: no sidecar, nothing held.
    // The activator has had no call since it started, with the pool.
    let quiet = |sim: &Sim| HeldCalls { pool: "bge".into(), held: 0, idle_seconds: sim.second as f64 };
    let asleep = sim.look_at(0, &[], Some(&quiet(&sim)), Placement::default());
    assert_eq!(asleep.status.message, "scaled to zero, and no call held at the activator");
    assert_eq!(asleep.status.last_call_time.as_deref(), Some(last_call.as_str()));
    for _ in 0..30 {
        assert_eq!(sim.look_at(0, &[], Some(&quiet(&sim)), Placement::default()).status, asleep.status);
    }
    // A call arrives at the activator: a replica at once.
    let calling = HeldCalls { held: 1, idle_seconds: 0.0, ..quiet(&sim) };
    let woken = sim.look_at(0, &[], Some(&calling), Placement::default());
    assert_eq!(woken.desired, 1);
    assert_eq!(
        notes(std::slice::from_ref(&woken)),
        ["Scaled up from 0 to 1: 1 call(s) held at the activator while no replica is ready"]
    );
    assert_ne!(woken.status.last_call_time, Some(last_call), "the call moved lastCallTime");
    // It starts (60 s, not ready): held calls keep it, and do not ask for more.
    for _ in 0..6 {
        let starting = sim.look_at(0, &[], Some(&calling), Placement { placed: 1, gpu_short: false });
        assert_eq!(starting.desired, 1);
    }
    // Many calls held while at zero ask for what carries them.
    let mut cold = Sim::new(256, 16, json!({ "minReplicas": 0, "maxReplicas": 8 }), 0);
    let crowd = HeldCalls { pool: "bge".into(), held: 40, idle_seconds: 0.0 };
    assert_eq!(cold.look_at(0, &[], Some(&crowd), Placement::default()).desired, 4);
}

#[test]
fn min_replicas_1_never_goes_to_zero_and_an_unknown_idle_time_is_not_idle() {
    let mut sim = Sim::new(256, 16, json!({ "minReplicas": 1, "maxReplicas": 4, "scaleToZeroAfter": "1m" }), 1);
    assert_eq!(counts(&sim.run(600, 0)), [1; 60]);

    let mut sim = Sim::new(256, 16, json!({ "minReplicas": 0, "maxReplicas": 4, "scaleToZeroAfter": "1m" }), 1);
    let silent = SidecarAdmission { idle_seconds: None, ..report(16, 0, 0) };
    for _ in 0..60 {
        let placed = Placement { placed: 1, gpu_short: false };
        assert_eq!(sim.look_at(1, std::slice::from_ref(&silent), None, placed).desired, 1);
    }
}

#[test]
fn a_pool_waits_for_every_activator_pods_word_before_going_to_zero() {
    let mut sim = Sim::new(256, 16, json!({ "minReplicas": 0, "maxReplicas": 4, "scaleToZeroAfter": "1m" }), 1);
    sim.run(10, 5);
    let placed = Placement { placed: 1, gpu_short: false };
    let quiet = report(16, 0, 0);
    let sidecar = |sim: &Sim| SidecarAdmission { idle_seconds: Some(sim.second as f64), ..quiet.clone() };
    // Two activator pods: one answered, idle long enough; the other did not (`held_over`: NaN).
    let unheard = HeldCalls { pool: "bge".into(), held: 0, idle_seconds: f64::NAN };
    let mut kept = Vec::new();
    for _ in 0..30 {
        let idle = sidecar(&sim);
        kept.push(sim.look_at(1, std::slice::from_ref(&idle), Some(&unheard), placed));
    }
    assert_eq!(counts(&kept), [1; 30], "no pod's last call is taken for long ago");
    let shown = kept[0].status.last_call_time.clone();
    assert!(kept.iter().all(|d| d.status.last_call_time == shown), "nor for just now: lastCallTime stays");
    // Both answer, neither had a call for a minute: zero.
    let heard = HeldCalls { idle_seconds: 600.0, ..unheard };
    let idle = sidecar(&sim);
    assert_eq!(sim.look_at(1, std::slice::from_ref(&idle), Some(&heard), placed).desired, 0);
}

#[test]
fn gpus_that_run_out_stop_the_pool_at_what_fits_with_one_warning_and_a_try_every_5_minutes() {
    let mut sim = Sim::new(64, 16, json!({ "minReplicas": 1, "maxReplicas": 4 }), 2);
    sim.run(60, 22);
    // The load doubles; there are GPUs for 2 replicas only.
    let load = TWICE_THE_TARGET_ON_2;
    let mut decisions = Vec::new();
    let mut warnings = 0;
    for _ in 0..70 {
        // Replicas beyond 2 are created and stay unschedulable.
        let asked = sim.desired;
        let placement = Placement { placed: asked.min(2), gpu_short: asked > 2 };
        let reports = sim.reports(asked.min(2), load);
        let decision = sim.look_at(asked.min(2), &reports, None, placement);
        warnings += decision.events().iter().filter(|event| event.type_ == EventType::Warning).count();
        decisions.push(decision);
    }
    let counts = counts(&decisions);
    assert_eq!(warnings, 1, "warned when the ceiling began, not at every look: {counts:?}");
    assert!(counts.iter().all(|n| *n <= 3), "never the 4 the load asks for: {counts:?}");
    // After the first try: 2, with a try of 3 every 5 minutes that does not fit.
    let tries = counts.windows(2).filter(|pair| pair[0] == 2 && pair[1] == 3).count();
    assert!((2..=3).contains(&tries), "{counts:?}");
    let capped = decisions.iter().find(|d| d.desired == 2 && d.status.message.contains("InsufficientGPU")).unwrap();
    assert!(capped.status.message.contains("2 of 4: InsufficientGPU"), "{}", capped.status.message);
    let warning = decisions.iter().find_map(|d| d.gpu_warning.clone()).unwrap();
    assert!(
        warning.starts_with("InsufficientGPU: the autoscaler holds the pool at 2 replica(s) of the 4"),
        "{warning}"
    );

    // A node with GPUs appears: a try is placed, and the next follows at once.
    let mut grown = Vec::new();
    for _ in 0..40 {
        let asked = sim.desired;
        let reports = sim.reports(asked, load);
        grown.push(sim.look_at(asked, &reports, None, Placement { placed: asked, gpu_short: false }).desired);
    }
    let first_four = grown.iter().position(|n| *n == 4).expect("reaches 4 once the GPUs are there");
    assert!(first_four <= 32, "{grown:?}");
    assert_eq!(grown.last(), Some(&4));
}

#[test]
fn the_budget_bounds_the_pool_and_the_message_says_so() {
    // 64 in flight, 16 per replica: a fifth replica adds no capacity.
    let mut sim = Sim::new(64, 16, json!({ "maxReplicas": 8 }), 4);
    let flooded = sim.run(60, 200);
    assert_eq!(counts(&flooded), [4; 6]);
    let status = &flooded.last().unwrap().status;
    assert!(status.recommended_replicas > 4);
    assert!(
        status.message.contains(
            "4 replicas take the whole budget (maxInFlight 64 over maxInFlightPerReplica 16): more add no capacity"
        ),
        "{}",
        status.message
    );
}

#[test]
fn min_and_max_replicas_clamp_and_say_so() {
    let mut sim = Sim::new(1024, 16, json!({ "minReplicas": 2, "maxReplicas": 3 }), 2);
    let idle = sim.run(60, 0);
    assert_eq!(counts(&idle), [2; 6]);
    assert!(idle[5].status.message.ends_with("; minReplicas is 2"), "{}", idle[5].status.message);
    let flooded = sim.run(60, 500);
    assert_eq!(*counts(&flooded).last().unwrap(), 3);
    assert!(flooded[5].status.message.ends_with("; maxReplicas is 3"), "{}", flooded[5].status.message);

    // A pool below its new minimum rises at once; one above its new maximum falls at once.
    let mut below = Sim::new(1024, 16, json!({ "minReplicas": 3, "maxReplicas": 5 }), 1);
    assert_eq!(below.look(0).desired, 3);
    let mut above = Sim::new(1024, 16, json!({ "minReplicas": 1, "maxReplicas": 2 }), 6);
    assert_eq!(above.look(200).desired, 2);
}

#[test]
fn without_reports_the_count_stays_and_the_status_is_not_rewritten() {
    let mut sim = Sim::new(64, 16, json!({ "minReplicas": 1, "maxReplicas": 4 }), 3);
    let placed = Placement { placed: 3, gpu_short: false };
    let first = sim.look_at(3, &[], None, placed);
    assert_eq!((first.desired, first.status.message.as_str()), (3, "no sidecar reported its load"));
    for _ in 0..60 {
        assert_eq!(sim.look_at(3, &[], None, placed), Decision { scaled_from: None, ..first.clone() });
    }
}

#[test]
fn a_restarted_operator_keeps_the_count_for_a_full_window_and_the_message() {
    let mut sim = Sim::new(256, 16, json!({ "maxReplicas": 8 }), 4);
    sim.run(60, TWICE_THE_TARGET_ON_2);
    let before = sim.status.clone().unwrap();
    // The operator restarts: a new autoscaler, the status as it was written.
    sim.autoscaler = Autoscaler::default();
    let again = sim.look(TWICE_THE_TARGET_ON_2);
    assert_eq!(again.status, before, "the same decision, the same status: no write");
    assert_eq!(counts(&sim.run(280, 5)), [4; 28], "a dip after a restart waits a full window too");
}

#[test]
fn a_pool_is_forgotten_after_an_hour_unseen() {
    let autoscaler = Autoscaler::default();
    let policy = Policy::of(&pool(64, 16, json!({ "maxReplicas": 4 }))).unwrap();
    let seen = Observed { recorded: Some(2), ..Observed::default() };
    let at = |second: i64| Timestamp::from_second(1_800_000_000 + second).unwrap();
    autoscaler.decide("gone", &policy, &seen, at(0));
    autoscaler.decide("kept", &policy, &seen, at(3000));
    autoscaler.decide("kept", &policy, &seen, at(3700));
    let pools = autoscaler.0.lock().unwrap();
    assert!(pools.contains_key("kept") && !pools.contains_key("gone"));
}

#[test]
fn what_the_controller_sees_is_counted_from_the_pods_and_the_status() {
    let pod = |ready: bool,
               node: Option<&str>,
               deleting: bool,
               unschedulable: Option<&str>|
     -> k8s_openapi::api::core::v1::Pod {
        let mut conditions = vec![json!({ "type": "Ready", "status": if ready { "True" } else { "False" } })];
        if let Some(message) = unschedulable {
            conditions.push(
                json!({ "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message }),
            );
        }
        serde_json::from_value(json!({
            "metadata": { "name": "p", "deletionTimestamp": deleting.then_some("2027-01-15T08:00:00Z") },
            "spec": { "containers": [], "nodeName": node },
            "status": { "conditions": conditions },
        }))
        .unwrap()
    };
    let mut gpu_pool = pool(64, 16, json!({ "maxReplicas": 4 }));
    gpu_pool.spec.gpu.type_ = teifleet_crds::GpuType::NvidiaL4;
    let pods = [
        pod(true, Some("l4-0"), false, None),
        pod(false, Some("l4-0"), false, None),
        pod(true, Some("l4-1"), true, None),
        pod(false, None, false, Some("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")),
    ];
    let seen = Observed::new(&gpu_pool, &pods, &[], None);
    assert_eq!(seen.ready, 1, "ready and not being deleted");
    assert_eq!(seen.placement, Placement { placed: 3, gpu_short: true }, "a pod being deleted still holds its GPU");
    assert_eq!(seen.recorded, None, "a new pool: the autoscaler starts at minReplicas");

    let other = [pod(false, None, false, Some("0/3 nodes are available: 3 Insufficient cpu."))];
    assert!(!Observed::new(&gpu_pool, &other, &[], None).placement.gpu_short, "short of CPU, not of GPUs");

    gpu_pool.status = Some(teifleet_crds::EmbeddingPoolStatus { replicas: 2, ..Default::default() });
    assert_eq!(Observed::new(&gpu_pool, &[], &[], None).recorded, Some(2), "sized by hand until now: what it runs");
    let decided = AutoscalingStatus { desired_replicas: 3, ..AutoscalingStatus::default() };
    gpu_pool.status.as_mut().unwrap().autoscaling = Some(decided);
    assert_eq!(Observed::new(&gpu_pool, &[], &[], None).recorded, Some(3));
}
