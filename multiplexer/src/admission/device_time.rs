//! How much of TEI's time one replica may keep it busy: a pool's `deviceTimeCap`.
//!
//! A time-sliced GPU gives its turns to whichever process has work and isolates nothing, so a
//! pool flooding its TEI runs batch after batch and every neighbour's call waits for one of them
//! (scenario 17 measured the light pools' p99 at 2.1–2.4× beside such a flood, with each sidecar
//! bounding what is in flight). Bounding in-flight calls bounds each batch, not how often batches
//! come. This bounds how often: a credit of TEI time grows at the cap's rate (25 % of every
//! second for a cap of 25) and shrinks while any of this replica's calls is in flight; while it
//! is below zero no call is let in, so the device goes quiet for the neighbours until the credit
//! is back. The credit holds at most [`BURST`], so a quiet pool's occasional run of calls passes
//! untouched and a pool cannot save up idle time for a long flood later.
//!
//! Under an explicit cap the time counted is wall time with calls in flight, as the sidecar sees
//! it: it includes a batch's wait for a neighbour's turn, so a capped pool gets somewhat less than
//! its cap of the device while neighbours are busy. Under a GPU share only the pool's own device
//! time is counted (wall time in flight times its batches' minimum over their actual time, see
//! `contention`): a light pool whose every call waits behind a flood spends most of its time in
//! flight waiting, and holding it for that would cap the one the share protects. Queued calls are let in by a timer when the credit is back
//! (no permit may come back to dispatch them), and still leave at their deadline or the queue
//! timeout; while the cap binds, the queue's expected wait is taken at the cap's pace (the inputs
//! TEI answered per busy second, times the cap), so a call that pace cannot serve in time is
//! refused at once.

use std::time::Duration;

use tokio::time::Instant;

/// The most TEI time a replica saves up while idle.
pub(super) const BURST: Duration = Duration::from_millis(50);
/// The shortest wait for the credit to come back.
const TICK: Duration = Duration::from_millis(1);

/// The weight of each busy period in the moving mean of inputs served per busy second.
const PACE_WEIGHT: f64 = 0.2;

#[derive(Debug, Default)]
pub(super) struct DeviceTime {
    /// TEI time this replica may still use, in seconds: below zero, what it has overdrawn.
    credit: f64,
    /// The share of wall time in flight charged against the credit: 1 under an explicit cap; under
    /// a GPU share, the part that was this replica's own work on the device (see `contention`).
    charge: f64,
    /// When `credit` was last brought up to date; none while there is no cap.
    updated: Option<Instant>,
    /// The busy period running now (calls of this replica in flight, TEI busy with them): when
    /// it began, and the inputs answered in it so far. Kept only under a cap.
    period: Option<(Instant, usize)>,
    /// Inputs answered per second of TEI time, a moving mean over busy periods: what the queue
    /// drains at, times the cap, while the cap binds.
    inputs_per_busy_second: Option<f64>,
}

/// A cap in percent as the share of each second it allows.
fn rate(cap: Option<u8>) -> Option<f64> {
    cap.filter(|cap| *cap < 100).map(|cap| f64::from(cap) / 100.0)
}

impl DeviceTime {
    /// The credit at `now` under `rate`, without recording it.
    fn credit_at(&self, rate: f64, now: Instant) -> f64 {
        let Some(updated) = self.updated else { return BURST.as_secs_f64() };
        let elapsed = now.saturating_duration_since(updated).as_secs_f64();
        let spent = if self.period.is_some() { elapsed * self.charge } else { 0.0 };
        (self.credit + elapsed * rate - spent).min(BURST.as_secs_f64())
    }

    /// `inputs` of a call were answered (or given up) in the busy period running now.
    pub fn answered(&mut self, inputs: usize) {
        if let Some((_, answered)) = &mut self.period {
            *answered += inputs;
        }
    }

    /// Calls of this replica are in flight (`busy`) or none are, from `now` on, under `cap`, each
    /// second in flight charged `charge` of a second (at most 1).
    /// Without a cap nothing is kept: nothing is owed, and a cap set later starts from a full
    /// burst and learns its pace anew.
    pub fn set_busy(&mut self, busy: bool, cap: Option<u8>, charge: f64, now: Instant) {
        let Some(rate) = rate(cap) else {
            self.updated = None;
            self.period = None;
            return;
        };
        self.credit = self.credit_at(rate, now);
        self.updated = Some(now);
        self.charge = charge.clamp(f64::MIN_POSITIVE, 1.0);
        match (self.period, busy) {
            (None, true) => self.period = Some((now, 0)),
            (Some((began, answered)), false) => {
                self.period = None;
                let seconds = now.saturating_duration_since(began).as_secs_f64();
                if seconds > 0.0 && answered > 0 {
                    let pace = answered as f64 / seconds;
                    self.inputs_per_busy_second = Some(match self.inputs_per_busy_second {
                        Some(mean) => mean * (1.0 - PACE_WEIGHT) + pace * PACE_WEIGHT,
                        None => pace,
                    });
                }
            }
            _ => {}
        }
    }

    /// Whether the cap is holding this replica back at `now`: its credit has run below half a
    /// burst, so its queue drains at the cap's pace rather than its in-flight limit's.
    pub fn binding(&self, cap: Option<u8>, now: Instant) -> bool {
        rate(cap).is_some_and(|rate| self.credit_at(rate, now) < BURST.as_secs_f64() / 2.0)
    }

    /// How long `inputs` take to be let through while `cap` binds: at the cap's share of each
    /// second (of charged time), at the pace TEI answered this replica's inputs in its busy
    /// periods. None until a busy period has been seen.
    pub fn drain_time(&self, inputs: usize, cap: Option<u8>) -> Option<Duration> {
        let rate = rate(cap)?;
        let pace = self.inputs_per_busy_second.filter(|pace| *pace > 0.0)?;
        let charge = if self.charge > 0.0 { self.charge } else { 1.0 };
        Some(Duration::from_secs_f64(inputs as f64 * charge / (pace * rate)))
    }

    /// When calls may go in flight again under `cap`, if not now.
    pub fn closed_until(&self, cap: Option<u8>, now: Instant) -> Option<Instant> {
        let rate = rate(cap)?;
        let credit = self.credit_at(rate, now);
        if credit >= 0.0 {
            return None;
        }
        // While calls are still in flight the credit keeps falling: the moment is re-checked then.
        // At least a tick of tokio's timer (1 ms), so a credit a rounding error below zero never
        // wakes a timer for the instant it was armed in.
        Some(now + Duration::from_secs_f64(-credit / rate).max(TICK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Busy `busy_ms`, then idle until the gate opens, `rounds` times: the busy share of the time.
    fn duty_cycle(cap: u8, busy_ms: u32, rounds: usize) -> f64 {
        let mut device = DeviceTime::default();
        let start = Instant::now();
        let mut now = start;
        let mut busy = Duration::ZERO;
        for _ in 0..rounds {
            if let Some(opens) = device.closed_until(Some(cap), now) {
                now = opens;
            }
            device.set_busy(true, Some(cap), 1.0, now);
            now += busy_ms * MS;
            busy += busy_ms * MS;
            device.set_busy(false, Some(cap), 1.0, now);
        }
        busy.as_secs_f64() / (now - start).as_secs_f64()
    }

    #[test]
    fn a_pool_busy_without_pause_is_held_to_its_cap() {
        for cap in [10, 25, 50] {
            let share = duty_cycle(cap, 4, 2_000);
            let expected = f64::from(cap) / 100.0;
            assert!((share - expected).abs() < 0.01, "cap {cap}: busy {share:.3} of the time");
        }
    }

    #[test]
    fn a_quiet_pool_passes_untouched_and_saves_up_at_most_a_burst() {
        let mut device = DeviceTime::default();
        let mut now = Instant::now();
        let cap = Some(25);
        // Idle for a minute: the credit is one burst, not fifteen seconds.
        device.set_busy(false, cap, 1.0, now);
        now += Duration::from_secs(60);
        device.set_busy(true, cap, 1.0, now);
        assert_eq!(device.closed_until(cap, now + BURST - MS), None, "a burst of TEI time goes at once");
        // Busy 80 ms: 20 ms earned meanwhile, 10 ms overdrawn.
        let after = now + 80 * MS;
        let opens = device.closed_until(cap, after).expect("overdrawn once busy past the burst");
        // 10 ms overdrawn at 25 % a second: 40 ms, while still busy (re-checked then).
        let wait = (opens - after).as_secs_f64();
        assert!((wait - 0.040).abs() < 1e-6, "{wait}");
    }

    #[test]
    fn the_queue_drains_at_the_pace_of_busy_periods_times_the_cap() {
        let mut device = DeviceTime::default();
        let cap = Some(25);
        let mut now = Instant::now();
        assert_eq!(device.drain_time(10, cap), None, "nothing seen yet");
        // Two inputs answered in each 4 ms busy period: 500 a busy second, 125 a second at 25 %.
        for _ in 0..10 {
            device.set_busy(true, cap, 1.0, now);
            now += 4 * MS;
            device.answered(1);
            device.answered(1);
            device.set_busy(false, cap, 1.0, now);
            now += 20 * MS;
        }
        let drain = device.drain_time(125, cap).unwrap().as_secs_f64();
        assert!((drain - 1.0).abs() < 1e-6, "{drain}");
        assert_eq!(device.drain_time(125, None), None, "no cap, no pace of its own");
    }

    #[test]
    fn without_a_cap_or_at_100_the_gate_never_closes() {
        for cap in [None, Some(100)] {
            let mut device = DeviceTime::default();
            let now = Instant::now();
            device.set_busy(true, cap, 1.0, now);
            assert_eq!(device.closed_until(cap, now + Duration::from_secs(10)), None);
        }
    }

    #[test]
    fn a_cap_set_on_a_busy_pool_starts_from_a_full_burst() {
        let mut device = DeviceTime::default();
        let now = Instant::now();
        device.set_busy(true, None, 1.0, now);
        let later = now + Duration::from_secs(5);
        device.set_busy(true, Some(25), 1.0, later);
        assert_eq!(device.closed_until(Some(25), later + BURST / 2), None, "the uncapped past is not owed");
    }
}
