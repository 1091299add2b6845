//! Replicas the scheduler cannot place for lack of GPUs add no capacity, and asking for them again
//! at every look would only churn pods. So when some of the pool's pods wait for GPUs the
//! autoscaler stops at what the cluster placed (its ceiling), holds there for [`RETRY_AFTER`],
//! then tries one more; a try that gets placed earns the next one at once, so a pool catches up
//! quickly with GPUs that appeared (a node added), one replica per look.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// How long the autoscaler stays at what fits before it tries one more replica.
pub const RETRY_AFTER: Duration = Duration::from_secs(5 * 60);

/// The most replicas the autoscaler asks for while GPUs are short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ceiling {
    pub replicas: i32,
    pub since: Timestamp,
    /// The ceiling was raised by a try (not set from a shortage): if that replica gets placed,
    /// the next try follows at once.
    pub tried: bool,
    /// The ceiling has held the pool below what it wants, and that was said (once an episode).
    pub warned: bool,
}

/// What the cluster shows of the pool's pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Pods bound to a node (those being deleted included: a replacement takes their GPU).
    pub placed: i32,
    /// Some pods are unschedulable for lack of the pool's GPU (`status::unschedulable`).
    pub gpu_short: bool,
}

/// The replicas the autoscaler may ask for when it wants `wanted`; updates `ceiling`, and says
/// whether the ceiling just began to hold the pool below what it wants (the moment to warn).
pub fn cap(ceiling: &mut Option<Ceiling>, wanted: i32, placement: Placement, min: i32, now: Timestamp) -> (i32, bool) {
    if placement.gpu_short && wanted > placement.placed {
        // What fits; minReplicas is asked for all the same (its pods wait for GPUs, which a
        // cluster autoscaler may add).
        let fits = placement.placed.max(min);
        match ceiling {
            Some(held) if held.replicas == fits => held.tried = false,
            Some(held) => *held = Ceiling { replicas: fits, since: now, tried: false, warned: held.warned },
            None => *ceiling = Some(Ceiling { replicas: fits, since: now, tried: false, warned: false }),
        }
    }
    let Some(held) = ceiling else { return (wanted, false) };
    if wanted <= held.replicas && !placement.gpu_short {
        // Everything wanted fits: the episode is over.
        *ceiling = None;
        return (wanted, false);
    }
    let tried_and_placed = held.tried && !placement.gpu_short && placement.placed >= held.replicas;
    let due = now.duration_since(held.since).as_secs_f64() >= RETRY_AFTER.as_secs_f64();
    if wanted > held.replicas && (tried_and_placed || due) {
        *held = Ceiling { replicas: held.replicas + 1, since: now, tried: true, ..*held };
    }
    let capped = wanted > held.replicas;
    let began = capped && !held.warned;
    held.warned |= capped;
    (held.replicas.min(wanted), began)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    fn short(placed: i32) -> Placement {
        Placement { placed, gpu_short: true }
    }

    fn fine(placed: i32) -> Placement {
        Placement { placed, gpu_short: false }
    }

    #[test]
    fn without_a_shortage_nothing_is_capped() {
        let mut ceiling = None;
        assert_eq!(cap(&mut ceiling, 4, fine(2), 1, at(0)), (4, false));
        // Pods waiting for GPUs while the pool wants no more than is placed (a rollout replacing
        // a pod whose GPU is not free yet): no ceiling.
        assert_eq!(cap(&mut ceiling, 4, short(4), 1, at(0)), (4, false));
        assert_eq!(ceiling, None);
    }

    #[test]
    fn a_shortage_stops_at_what_is_placed_warns_once_and_tries_one_more_later() {
        let mut ceiling = None;
        // 4 wanted, 2 placed, the others unschedulable for lack of GPUs.
        assert_eq!(cap(&mut ceiling, 4, short(2), 1, at(0)), (2, true), "stops at what fits, and warns");
        // The pods that did not fit are gone: no shortage shows, the ceiling holds.
        assert_eq!(cap(&mut ceiling, 4, fine(2), 1, at(10)), (2, false), "warned only when it began");
        assert_eq!(cap(&mut ceiling, 4, fine(2), 1, at(299)), (2, false));
        assert_eq!(cap(&mut ceiling, 4, fine(2), 1, at(300)), (3, false), "one more after 5 minutes");
        // It does not fit either: back to what is placed, for another 5 minutes, no new warning.
        assert_eq!(cap(&mut ceiling, 4, short(2), 1, at(305)), (2, false));
        assert_eq!(cap(&mut ceiling, 4, fine(2), 1, at(600)), (2, false));
        assert_eq!(cap(&mut ceiling, 4, fine(2), 1, at(605)), (3, false));
    }

    #[test]
    fn a_try_that_is_placed_earns_the_next_at_once() {
        let mut ceiling = None;
        cap(&mut ceiling, 5, short(2), 1, at(0));
        assert_eq!(cap(&mut ceiling, 5, fine(2), 1, at(300)).0, 3);
        assert_eq!(cap(&mut ceiling, 5, fine(2), 1, at(310)).0, 3, "the try is not placed yet");
        assert_eq!(cap(&mut ceiling, 5, fine(3), 1, at(320)).0, 4, "placed: GPUs appeared, try the next");
        assert_eq!(cap(&mut ceiling, 5, fine(4), 1, at(330)).0, 5);
        assert_eq!(cap(&mut ceiling, 5, fine(5), 1, at(340)), (5, false));
        assert_eq!(ceiling, None, "everything wanted is placed: the ceiling is gone");
        assert_eq!(cap(&mut ceiling, 6, fine(5), 1, at(350)), (6, false));
    }

    #[test]
    fn needing_no_more_than_fits_ends_the_episode() {
        let mut ceiling = None;
        cap(&mut ceiling, 4, short(2), 1, at(0));
        assert_eq!(cap(&mut ceiling, 2, fine(2), 1, at(10)), (2, false));
        assert_eq!(ceiling, None);
        // Load returns and the GPUs are still short: a new episode, a new warning.
        assert_eq!(cap(&mut ceiling, 4, short(2), 1, at(20)), (2, true));
    }

    #[test]
    fn min_replicas_is_asked_for_even_when_it_does_not_fit() {
        let mut ceiling = None;
        assert_eq!(cap(&mut ceiling, 3, short(1), 3, at(0)), (3, false), "min 3: its pods wait for GPUs");
        assert_eq!(cap(&mut ceiling, 5, short(1), 3, at(10)), (3, true), "but nothing above it");
    }
}
