//! Scenario 14, overload over HTTP: scenario 2's open-loop Poisson load at 2×, 5× and 10× the
//! backend's measured capacity, sent as TEI's HTTP API (`POST /embed`, a 1 s
//! `x-teifleet-timeout-ms`) to the sidecar's HTTP front and, with the same arrival schedule, as
//! gRPC to the same sidecar, back to back. Targets, as ratios of the same run: goodput over HTTP
//! ≥ 0.97× capacity (scenario 2's bar) and ≥ 0.97× the gRPC goodput at the same load.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Protocol, Report};

use super::http_overhead::sim_and_http_mux;
use super::overload::{Capacity, DEADLINE, GOODPUT_LIMIT, OVERLOADED, measure_capacity, mux_limits};
use super::{Context, Measurement, Scenario, gpu_model, measure};
use crate::Result;
use crate::procs::{Device, MuxLimits, SimModel};
use crate::targets::{Rule, Target, ratio};

/// HTTP goodput over gRPC goodput at the same load, through the same sidecar: the HTTP front
/// must not cost the pool its capacity.
pub const VS_GRPC_LIMIT: f64 = 0.97;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub factor: f64,
    /// gRPC through the sidecar.
    pub grpc: Report,
    /// TEI's HTTP API through the sidecar's HTTP front, the same schedule.
    pub http: Report,
}

impl Row {
    pub fn http_vs_grpc(&self) -> f64 {
        ratio(self.http.goodput_rps, self.grpc.goodput_rps)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HttpOverload {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub capacity: Capacity,
    pub seconds_per_point: u64,
    pub rows: Vec<Row>,
}

/// Why HTTP fell short: refusals that took long (connections opened under load, or CPU), or
/// answers that missed the deadline.
fn http_note(row: &Row) -> String {
    let (h, g) = (&row.http, &row.grpc);
    format!(
        "over HTTP {:.1}% of calls were refused or late (shed p99 {:.1} ms, OK p99 {:.0} ms) against {:.1}% over gRPC \
         (shed p99 {:.1} ms, OK p99 {:.0} ms). HTTP/1.1 holds a connection per call in flight, so a burst opens \
         connections while it is being refused, and each request costs the HTTP front JSON work the gRPC path \
         does not do; the per-point JSON files (connections, codes, lateness) and a CPU profile of the \
         multiplexer at this load tell which of the two took the goodput",
        h.failed_fraction() * 100.0,
        h.response_failed.p99_ms,
        h.latency_ok.p99_ms,
        g.failed_fraction() * 100.0,
        g.response_failed.p99_ms,
        g.latency_ok.p99_ms
    )
}

impl Measurement for HttpOverload {
    const KEY: &'static str = "http-overload";
    const TITLE: &'static str = "HTTP overload: goodput at 2× to 10× capacity over HTTP vs gRPC, one sidecar";

    async fn run(ctx: &Context) -> Result<Self> {
        let backend = gpu_model(512, Device::Sleep);
        let limits = mux_limits();
        let (sim, mux, http) = sim_and_http_mux(ctx, "http-overload", &backend, &limits, 8).await?;
        ctx.say("http overload: measuring the backend's capacity");
        let capacity = measure_capacity(ctx, &sim, 16, 64).await?;
        ctx.say(&format!("http overload: capacity {:.1} req/s, batch {:.2} ms", capacity.rps, capacity.batch_ms));

        let duration = ctx.pick(Duration::from_secs(3), Duration::from_secs(15));
        let mut rows = Vec::new();
        for (i, factor) in OVERLOADED.iter().enumerate() {
            let rate = factor * capacity.rps;
            let config = |target: String, protocol: Protocol| LoadConfig {
                protocol,
                connections: 8,
                deadline: Some(DEADLINE),
                grace: Duration::from_secs(5),
                seed: 200 + i as u64,
                ..LoadConfig::open(target, rate, duration)
            };
            ctx.say(&format!("http overload: {factor}× = {rate:.0} req/s over gRPC"));
            let grpc = measure(config(mux.url(), Protocol::Grpc)).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            ctx.say(&format!("http overload: {factor}× = {rate:.0} req/s over HTTP"));
            let over_http = measure(config(http.clone(), Protocol::Http)).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            rows.push(Row { factor: *factor, grpc, http: over_http });
        }
        Ok(HttpOverload { backend, limits, capacity, seconds_per_point: duration.as_secs(), rows })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::HttpOverload.label();
        let mut targets = Vec::new();
        for row in &self.rows {
            let f = row.factor;
            targets.push(
                Target::at_least(
                    &scenario,
                    &format!("HTTP goodput at {f}×"),
                    row.http.goodput_rps / self.capacity.rps,
                    GOODPUT_LIMIT,
                    "× capacity",
                )
                .note_if_not_passed(http_note(row)),
            );
            targets.push(
                Target::at_least(
                    &scenario,
                    &format!("HTTP ÷ gRPC goodput at {f}×"),
                    row.http_vs_grpc(),
                    VS_GRPC_LIMIT,
                    "×",
                )
                .note_if_not_passed(http_note(row)),
            );
            targets.push(Target::info(
                &scenario,
                &format!("HTTP shed p99 at {f}×"),
                Some(row.http.response_failed.p99_ms),
                "ms",
            ));
        }
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::HttpOverload.label();
        let mut targets = Vec::new();
        for f in OVERLOADED {
            targets.push(Target::new(
                &scenario,
                &format!("HTTP goodput at {f}×"),
                None,
                Rule::AtLeast,
                GOODPUT_LIMIT,
                "× capacity",
            ));
            targets.push(Target::new(
                &scenario,
                &format!("HTTP ÷ gRPC goodput at {f}×"),
                None,
                Rule::AtLeast,
                VS_GRPC_LIMIT,
                "×",
            ));
        }
        targets
    }
}

/// The admitted-latency bound of scenario 2, for the section's text.
pub fn admitted_limit_ms(r: &HttpOverload) -> f64 {
    r.limits.queue_timeout.as_secs_f64() * 1e3 + 2.0 * r.capacity.batch_ms
}

#[cfg(test)]
mod tests {
    use teifleet_load::summary::Summary;

    use super::*;
    use crate::targets::Verdict;

    fn report(goodput_rps: f64) -> Report {
        Report { goodput_rps, response_failed: Summary { p99_ms: 0.8, ..Summary::default() }, ..Report::default() }
    }

    #[test]
    fn http_goodput_is_judged_against_capacity_and_against_grpc_in_the_same_run() {
        let result = HttpOverload {
            backend: gpu_model(512, Device::Sleep),
            limits: mux_limits(),
            capacity: Capacity { rps: 300.0, batch_ms: 24.0, concurrency: 64 },
            seconds_per_point: 3,
            rows: vec![
                Row { factor: 2.0, grpc: report(300.0), http: report(297.0) },
                Row { factor: 5.0, grpc: report(300.0), http: report(270.0) },
            ],
        };
        let targets = result.targets();
        let verdicts: Vec<(String, Verdict)> = targets.iter().map(|t| (t.name.clone(), t.verdict)).collect();
        assert_eq!(verdicts[0], ("HTTP goodput at 2×".into(), Verdict::Pass));
        assert_eq!(verdicts[1], ("HTTP ÷ gRPC goodput at 2×".into(), Verdict::Pass));
        assert_eq!(verdicts[2].1, Verdict::Info);
        assert_eq!(verdicts[3], ("HTTP goodput at 5×".into(), Verdict::Fail));
        assert_eq!(verdicts[4], ("HTTP ÷ gRPC goodput at 5×".into(), Verdict::Fail));
        assert!(targets[3].note.contains("over HTTP"), "{}", targets[3].note);
        assert_eq!(admitted_limit_ms(&result), 548.0);
        assert_eq!(HttpOverload::planned_targets().len(), 2 * OVERLOADED.len());
    }
}
