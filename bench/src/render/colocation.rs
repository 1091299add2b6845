//! The section of scenario 17, GPU co-location, from its typed result.

use std::fmt::Write as _;

use teifleet_load::Report;
use teifleet_load::render::codes;

use super::Render;
use super::table::{Table, figure, text};
use super::words::{backend, limits};
use crate::scenarios::colocation::{self, Colocation, DeviceUse, share};
use crate::targets::{number, ratio};

impl Render for Colocation {
    fn write(&self, out: &mut String) {
        let share_rps = self.capacity.rps / colocation::POOLS as f64;
        let _ = writeln!(
            out,
            "{} pools share one simulated GPU: their simulators take turns on one device (`tei-sim --shared-device`, \
             a lock file), as the TEIs of pods given time-sliced replicas of one card do. Backend of each: {}; \
             **the shared device's capacity {:.1} req/s**, a pool's share a quarter of it ({:.1} req/s). Each pool's \
             multiplexer: {}, a quarter of a device batch, as the operator sizes a slice's budget. Pool A sends {}× its \
             share over 8 connections while B, C and D send {}× theirs over 2 each, open loop (Poisson), {:.0} s, 1 s \
             deadline, all at once; B, C and D first without A, the same schedules, and A alone. With the static \
             limit, then the adaptive one (the share as ceiling), uncapped; both again with every pool's GPU share \
             at {} % (`--gpu-share`, the sidecar's default from `gpu.sharing.replicas`: a cap on TEI time while TEI's \
             batch times say a neighbour is busy, none while the device is quiet); the static limit with A's \
             `deviceTimeCap` at its share instead (the cap always on); then the same four loads straight to the \
             simulators. Latency columns are of all answers.\n",
            colocation::POOLS,
            backend(&self.backend),
            self.capacity.rps,
            share_rps,
            limits(&self.limits),
            colocation::FLOOD_FACTOR,
            colocation::LIGHT_FACTOR,
            self.seconds,
            colocation::DEVICE_TIME_CAP
        );
        let mut table = Table::new(
            out,
            &[
                text("run"),
                text("pool"),
                figure("offered/s"),
                figure("sent"),
                figure("OK in time"),
                figure("÷ sent"),
                figure("p50"),
                figure("p99"),
                figure("p99 ÷ without A"),
                figure("device busy"),
                figure("calls a batch"),
                text("codes"),
            ],
        );
        let mut row = |run: &str, pool: &str, x: &Report, alone: Option<&Report>, device: Option<&DeviceUse>| {
            let against = alone.map_or("".to_owned(), |a| format!("{:.2}×", ratio(x.latency.p99_ms, a.latency.p99_ms)));
            let (busy, batch) = device.map_or((String::new(), String::new()), |d| {
                (format!("{:.1} %", 100.0 * d.busy_share), format!("{:.2}", d.calls_per_batch))
            });
            table.row(&[
                &run,
                &pool,
                &format!("{:.0}", x.offered_rps.unwrap_or(f64::NAN)),
                &x.sent,
                &x.ok_in_time,
                &format!("{:.3}", share(x)),
                &format!("{} ms", number(x.latency.p50_ms)),
                &format!("{} ms", number(x.latency.p99_ms)),
                &against,
                &busy,
                &batch,
                &codes(x),
            ]);
        };
        let light = ["B", "C", "D"];
        for mode in &self.modes {
            let limit = if mode.adaptive { "adaptive" } else { "static" };
            let name = match (mode.cap, mode.share) {
                (Some(cap), _) => format!("{limit}, A capped {cap} %"),
                (None, Some(share)) => format!("{limit}, share {share} %"),
                (None, None) => limit.to_owned(),
            };
            for (pool, alone) in light.iter().zip(&mode.alone) {
                row(&format!("{name}, without A"), pool, alone, None, None);
            }
            if let Some(flood_alone) = &mode.flood_alone {
                row(&format!("{name}, A alone"), "A", flood_alone, None, None);
            }
            let flooding = format!("{name}, A flooding");
            let device = |n: usize| mode.shared.device.get(n);
            row(&flooding, "A", &mode.shared.flood, None, device(0));
            for (n, ((pool, shared), alone)) in light.iter().zip(&mode.shared.light).zip(&mode.alone).enumerate() {
                row(&flooding, pool, shared, Some(alone), device(n + 1));
            }
        }
        let device = |n: usize| self.direct.device.get(n);
        row("direct to TEI, A flooding", "A", &self.direct.flood, None, device(0));
        for (n, (pool, shared)) in light.iter().zip(&self.direct.light).enumerate() {
            row("direct to TEI, A flooding", pool, shared, None, device(n + 1));
        }
        for mode in &self.modes {
            let alone = match self.flood_alone_ratio(mode).filter(|_| mode.cap.is_some() || mode.share.is_some()) {
                Some(alone) => format!(" A alone got {alone:.3}× the calls it got alone uncapped."),
                None => String::new(),
            };
            let device = match mode.shared.device.split_first() {
                Some((flood, light)) => format!(
                    " Beside them A's batches held the device {:.1} % of the time, the light pools' {:.1} % together.",
                    100.0 * flood.busy_share,
                    100.0 * light.iter().map(|d| d.busy_share).sum::<f64>()
                ),
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "\n{}: the worst light pool kept {:.3} of its calls and its p99 was {:.2}× its p99 without A.{alone}{device}",
                capitalized(&mode.name()),
                mode.worst_light_share(),
                mode.worst_p99_ratio()
            );
        }
    }
}

fn capitalized(name: &str) -> String {
    let mut chars = name.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use teifleet_load::summary::Summary;

    use super::*;
    use crate::scenarios::colocation::{Mode, Side, shared_gpu, slice_limits};
    use crate::scenarios::overload::Capacity;

    fn report(sent: u64, ok_in_time: u64, p99_ms: f64) -> Report {
        Report { sent, ok_in_time, latency: Summary { p99_ms, ..Summary::default() }, ..Report::default() }
    }

    #[test]
    fn every_pool_of_every_run_has_a_row_and_the_light_ones_their_ratio() {
        let mode = |adaptive, share, flood_ok| Mode {
            adaptive,
            cap: None,
            share,
            alone: vec![report(100, 100, 5.0); 3],
            flood_alone: Some(report(5000, flood_ok, 50.0)),
            shared: Side {
                flood: report(5000, 900, 900.0),
                light: vec![report(100, 99, 7.5); 3],
                device: [0.25, 0.12, 0.13, 0.12]
                    .map(|busy_share| DeviceUse { busy_share, calls_per_batch: 1.5 })
                    .to_vec(),
            },
        };
        let r = Colocation {
            backend: shared_gpu(),
            limits: slice_limits(),
            capacity: Capacity { rps: 900.0, batch_ms: 8.4, concurrency: 64 },
            seconds: 4.0,
            modes: vec![mode(false, None, 2000), mode(true, None, 2000), mode(false, Some(25), 1900)],
            direct: Side { flood: report(5000, 900, 990.0), light: vec![report(100, 30, 990.0); 3], device: vec![] },
        };
        let body = r.body();
        assert_eq!(body.matches("| static, A flooding |").count(), 4, "{body}");
        assert_eq!(body.matches("| adaptive, without A |").count(), 3, "{body}");
        assert_eq!(body.matches("| direct to TEI, A flooding |").count(), 4, "{body}");
        assert_eq!(body.matches("| static, share 25 %, A alone |").count(), 1, "{body}");
        assert_eq!(body.matches("| 1.50× |").count(), 9, "{body}");
        assert!(body.contains("A alone got 0.950× the calls it got alone uncapped."), "{body}");
        assert!(
            body.contains("Static limit: the worst light pool kept 0.990 of its calls and its p99 was 1.50×"),
            "{body}"
        );
        assert!(
            body.contains("A's batches held the device 25.0 % of the time, the light pools' 37.0 % together."),
            "{body}"
        );
        assert_eq!(body.matches("| 25.0 % | 1.50 |").count(), 3, "A's row in each run: {body}");
        assert_eq!(body.matches("| 12.0 % | 1.50 |").count(), 6, "{body}");
    }
}
