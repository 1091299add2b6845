//! How the pool-wide budget becomes per-replica shares.
//!
//! Every ready replica's multiplexer gets `ceil(budget / ready)`: rounding up means the pool may
//! admit slightly more than its budget, never less, so a budget smaller than the replica count
//! still gives every replica at least one permit. With no replica ready yet the budget is split
//! over the desired replicas, so the first replicas to become ready do not each take it all.

use crate::ConcurrencySpec;

/// One replica's share of the pool budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shares {
    pub in_flight_per_replica: i32,
    pub queued_per_replica: i32,
    /// The replica count the budget was divided by.
    pub split_over: i32,
}

/// Splits `budget` over `ready` replicas (or `desired` while none is ready).
pub fn split_budget(budget: &ConcurrencySpec, ready: i32, desired: i32) -> Shares {
    let split_over = if ready > 0 { ready } else { desired.max(1) };
    let mut in_flight = div_ceil(budget.max_in_flight.max(1), split_over);
    if let Some(cap) = budget.max_in_flight_per_replica {
        in_flight = in_flight.min(cap.max(1));
    }
    Shares {
        in_flight_per_replica: in_flight,
        queued_per_replica: div_ceil(budget.max_queued.max(0), split_over),
        split_over,
    }
}

fn div_ceil(value: i32, divisor: i32) -> i32 {
    // Both are non-negative and the divisor positive here; i64 keeps large budgets from wrapping.
    ((i64::from(value) + i64::from(divisor) - 1) / i64::from(divisor)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(in_flight: i32, queued: i32, cap: Option<i32>) -> ConcurrencySpec {
        ConcurrencySpec {
            max_in_flight: in_flight,
            max_queued: queued,
            max_in_flight_per_replica: cap,
            ..ConcurrencySpec::default()
        }
    }

    #[test]
    fn no_ready_replica_splits_over_desired() {
        let shares = split_budget(&budget(64, 100, None), 0, 4);
        assert_eq!(shares, Shares { in_flight_per_replica: 16, queued_per_replica: 25, split_over: 4 });
    }

    #[test]
    fn no_ready_and_no_desired_replica_gives_the_whole_budget() {
        let shares = split_budget(&budget(64, 100, None), 0, 0);
        assert_eq!(shares, Shares { in_flight_per_replica: 64, queued_per_replica: 100, split_over: 1 });
    }

    #[test]
    fn one_ready_replica_gets_everything() {
        let shares = split_budget(&budget(10, 7, None), 1, 3);
        assert_eq!(shares, Shares { in_flight_per_replica: 10, queued_per_replica: 7, split_over: 1 });
    }

    #[test]
    fn many_ready_replicas_round_up() {
        let shares = split_budget(&budget(10, 7, None), 3, 3);
        assert_eq!(shares, Shares { in_flight_per_replica: 4, queued_per_replica: 3, split_over: 3 });
    }

    #[test]
    fn budget_smaller_than_replicas_still_gives_one_permit_each() {
        let shares = split_budget(&budget(2, 0, None), 5, 5);
        assert_eq!(shares.in_flight_per_replica, 1);
        assert_eq!(shares.queued_per_replica, 0);
    }

    #[test]
    fn per_replica_cap_bounds_the_share() {
        let shares = split_budget(&budget(100, 10, Some(8)), 2, 2);
        assert_eq!(shares.in_flight_per_replica, 8);
        let uncapped = split_budget(&budget(100, 10, Some(80)), 2, 2);
        assert_eq!(uncapped.in_flight_per_replica, 50);
    }

    #[test]
    fn huge_budgets_do_not_overflow() {
        let shares = split_budget(&budget(i32::MAX, i32::MAX, None), 1, 1);
        assert_eq!(shares.in_flight_per_replica, i32::MAX);
        assert_eq!(shares.queued_per_replica, i32::MAX);
    }
}
