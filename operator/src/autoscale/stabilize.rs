//! Stabilization, as the HorizontalPodAutoscaler does it: the recommendations of the last while
//! are kept, a step up takes the lowest of those within the scale-up window (a wish must have
//! lasted that long), a step down the highest within the scale-down window (a dip must have).

use std::collections::VecDeque;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// A pool's recent recommendations, oldest first.
#[derive(Clone, Debug, Default)]
pub struct Recommendations(VecDeque<(Timestamp, i32)>);

impl Recommendations {
    /// The replica count from `current`, now that `recommended` is recommended: up to the lowest
    /// recommendation of the scale-up window, down to the highest of the scale-down window, else
    /// unchanged. Remembers `recommended`, and forgets what has left both windows. A pool seen
    /// for the first time (or again after the operator restarted) starts from `current`, as if it
    /// had been recommended just now: a restart must not let a pool drop before a full window.
    pub fn stabilize(
        &mut self,
        now: Timestamp,
        recommended: i32,
        current: i32,
        up_window: Duration,
        down_window: Duration,
    ) -> i32 {
        if self.0.is_empty() {
            self.0.push_back((now, current));
        }
        let in_window = |window| self.0.iter().filter(move |(at, _)| within(*at, now, window)).map(|(_, n)| *n);
        let up = in_window(up_window).fold(recommended, i32::min);
        let down = in_window(down_window).fold(recommended, i32::max);
        self.0.push_back((now, recommended));
        let keep = up_window.max(down_window);
        while self.0.front().is_some_and(|(at, _)| !within(*at, now, keep)) {
            self.0.pop_front();
        }
        current.max(up).min(down)
    }
}

/// Whether `at` lies within the `window` that ends `now` (a window of 0 s holds nothing past).
fn within(at: Timestamp, now: Timestamp, window: Duration) -> bool {
    now.duration_since(at).as_secs_f64() < window.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    /// Records `wishes` (second, replicas) from `current` and returns the count after each.
    fn run(current: i32, up: Duration, down: Duration, wishes: &[(i64, i32)]) -> Vec<i32> {
        let mut history = Recommendations::default();
        let mut current = current;
        wishes
            .iter()
            .map(|(second, wish)| {
                current = history.stabilize(at(*second), *wish, current, up, down);
                current
            })
            .collect()
    }

    #[test]
    fn with_no_scale_up_window_a_step_up_is_immediate() {
        assert_eq!(run(2, Duration::ZERO, 5 * MINUTE, &[(0, 2), (10, 4)]), [2, 4]);
    }

    #[test]
    fn a_dip_must_last_the_scale_down_window() {
        let wishes = [(0, 4), (10, 2), (60, 2), (200, 2), (299, 2), (310, 2)];
        // The wish for 4 at 0 s counts until it is more than 5 minutes old.
        assert_eq!(run(4, Duration::ZERO, 5 * MINUTE, &wishes), [4, 4, 4, 4, 4, 2]);
    }

    #[test]
    fn a_dip_interrupted_by_load_starts_over() {
        let wishes = [(0, 2), (100, 4), (200, 2), (390, 2), (401, 2)];
        assert_eq!(run(4, Duration::ZERO, 5 * MINUTE, &wishes), [4, 4, 4, 4, 2]);
    }

    #[test]
    fn a_scale_up_window_takes_the_lowest_wish_so_a_short_spike_adds_nothing() {
        let up = Duration::from_secs(30);
        assert_eq!(run(2, up, 5 * MINUTE, &[(0, 2), (10, 6), (20, 2), (30, 2)]), [2, 2, 2, 2]);
        // Wanted for the whole window (the wish for 2 at 0 s has left it at 30 s): up to the
        // lowest wish in it.
        assert_eq!(run(2, up, 5 * MINUTE, &[(0, 2), (10, 6), (20, 5), (30, 6), (40, 6)]), [2, 2, 2, 5, 5]);
    }

    #[test]
    fn a_first_look_counts_the_current_count_as_recommended_now() {
        // After a restart a dip waits a full window, and the first wish up is immediate.
        assert_eq!(run(4, Duration::ZERO, 5 * MINUTE, &[(0, 1), (299, 1), (301, 1)]), [4, 4, 1]);
        assert_eq!(run(1, Duration::ZERO, 5 * MINUTE, &[(0, 3)]), [3]);
    }

    #[test]
    fn old_recommendations_are_forgotten() {
        let mut history = Recommendations::default();
        for second in 0..100 {
            history.stabilize(at(second * 10), 3, 3, Duration::ZERO, MINUTE);
        }
        assert!(history.0.len() <= 8, "{}", history.0.len());
    }
}
