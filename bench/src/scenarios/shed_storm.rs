//! Scenario 7, shed storm: a CPU-bound backend (the simulator's device spins for each batch's
//! time, like TEI on CPU) shares the machine's 2 cores with the client and the multiplexer.
//! Capacity is what 16 closed-loop clients get going direct. Then 512 closed-loop clients go
//! through the multiplexer, each resending the moment it is refused, over 16 connections and
//! again over 8: every refusal costs CPU the device needed, so goodput holds only if refusals are
//! few (each connection's door holds its calls beyond its share instead) and cheap. Targets:
//! goodput ≥ 0.9 × capacity on both; the multiplexer's CPU per shed is printed next to its CPU
//! per served call. Then the same 512 clients with a 30 s deadline each (what most gRPC clients
//! and load tools set) on 1, 8 and 16 connections: a deadline of many queue timeouts is patient,
//! so they too wait their turn at the door; target goodput ≥ 0.9 × capacity on each, with the
//! refusals per second reported. Last, the same 512 over HTTP/1.1 (TEI's `/embed`, a keep-alive
//! connection per caller, no deadline): an HTTP request without a deadline waits at the same door,
//! target goodput ≥ 0.9 × capacity.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Protocol, Report};

use super::http_overhead::sim_and_http_mux;
use super::{Context, Measurement, Scenario, gpu_model, measure, words};
use crate::procfs::CpuMeter;
use crate::procs::{Device, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target, ratio};
use crate::{Error, Result};

pub const GOODPUT_LIMIT: f64 = 0.9;
/// Clients that keep the device busy going direct: two full batches.
pub const CAPACITY_CLIENTS: usize = 16;
pub const STORM_CLIENTS: usize = 512;
pub const CONNECTIONS: usize = 16;
/// The second storm's connections: fewer, so each carries more callers.
pub const FEWER_CONNECTIONS: usize = 8;
const TOKENS: usize = 16;
/// The deadline storms' callers' deadline: a load tool's or batch client's, 60 queue timeouts.
pub const STORM_DEADLINE: Duration = Duration::from_secs(30);
/// The connections of the deadline storms: one connection carrying every caller, and as many
/// as the other storms.
pub const DEADLINE_CONNECTIONS: [usize; 3] = [1, FEWER_CONNECTIONS, CONNECTIONS];
/// The control beside them: a deadline of three queue timeouts, short of patient, so each call
/// is told at once whether it fits, as every call with a deadline was before the door held them.
pub const SHORT_DEADLINE: Duration = Duration::from_millis(1500);

/// CPU seconds each process spent over one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunCpu {
    pub mux_s: f64,
    pub sim_s: f64,
    /// The load generator (this process).
    pub client_s: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub report: Report,
    pub cpu: RunCpu,
}

impl Run {
    /// Answers other than OK: the refusals.
    pub fn sheds(&self) -> u64 {
        self.report.answered.saturating_sub(self.report.ok)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShedStorm {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub seconds: f64,
    /// Direct, 16 clients, before the multiplexer's runs: the capacity.
    pub capacity: Run,
    /// The same after the storm: the capacity is the mean of both, so a machine whose other load
    /// drifts during the scenario does not tilt the ratio.
    #[serde(default)]
    pub capacity_after: Option<Run>,
    /// Through the multiplexer, 16 clients: nothing shed, so its CPU per served call.
    pub served: Run,
    /// Through the multiplexer, 512 clients resending every refusal.
    pub storm: Run,
    /// The same over [`FEWER_CONNECTIONS`] connections.
    #[serde(default)]
    pub storm_fewer_connections: Option<Run>,
    /// 512 clients with a [`STORM_DEADLINE`] each, resending every refusal, on each of
    /// [`DEADLINE_CONNECTIONS`].
    #[serde(default)]
    pub deadline_storms: Vec<DeadlineStorm>,
    /// The same with a [`SHORT_DEADLINE`] on [`CONNECTIONS`]: told at once, not held.
    #[serde(default)]
    pub short_deadline_storm: Option<Run>,
    /// 512 HTTP/1.1 clients without a deadline, resending every refusal: a connection each.
    #[serde(default)]
    pub http_storm: Option<Run>,
}

/// A storm of callers that set a deadline, on `connections` connections.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadlineStorm {
    pub connections: usize,
    pub run: Run,
}

impl ShedStorm {
    pub fn capacity_rps(&self) -> f64 {
        match &self.capacity_after {
            Some(after) => (self.capacity.report.goodput_rps + after.report.goodput_rps) / 2.0,
            None => self.capacity.report.goodput_rps,
        }
    }

    pub fn goodput_ratio(&self) -> f64 {
        ratio(self.storm.report.goodput_rps, self.capacity_rps())
    }

    pub fn fewer_connections_goodput_ratio(&self) -> Option<f64> {
        Some(ratio(self.storm_fewer_connections.as_ref()?.report.goodput_rps, self.capacity_rps()))
    }

    /// The multiplexer's CPU per served call, µs, from the run without sheds.
    pub fn mux_us_per_served(&self) -> f64 {
        ratio(self.served.cpu.mux_s * 1e6, self.served.report.ok as f64)
    }

    /// The multiplexer's CPU per refusal, µs: the storm's CPU less what its served calls cost at
    /// the served rate, over the refusals.
    pub fn mux_us_per_shed(&self) -> f64 {
        let serving = self.storm.report.ok as f64 * self.mux_us_per_served();
        ratio(self.storm.cpu.mux_s * 1e6 - serving, self.storm.sheds() as f64)
    }

    /// The client's CPU per answer in the storm, µs: what each refusal costs the other side.
    pub fn client_us_per_answer(&self) -> f64 {
        ratio(self.storm.cpu.client_s * 1e6, self.storm.report.answered as f64)
    }

    pub fn deadline_goodput_ratio(&self, storm: &DeadlineStorm) -> f64 {
        ratio(storm.run.report.goodput_rps, self.capacity_rps())
    }

    /// The share of CPU the simulator lost in the storm against the run without sheds.
    pub fn device_cpu_lost(&self) -> f64 {
        1.0 - ratio(self.storm.cpu.sim_s, self.served.cpu.sim_s)
    }
}

fn goodput_name() -> String {
    format!("goodput at c={STORM_CLIENTS} on {CONNECTIONS} connections, resending ÷ capacity")
}

fn fewer_name() -> String {
    format!("goodput at c={STORM_CLIENTS} on {FEWER_CONNECTIONS} connections, resending ÷ capacity")
}

fn http_name() -> String {
    format!("goodput at c={STORM_CLIENTS} over HTTP/1.1, resending ÷ capacity")
}

fn deadline_name(connections: usize) -> String {
    let deadline = STORM_DEADLINE.as_secs();
    format!("goodput at c={STORM_CLIENTS}, {deadline} s deadline, on {connections} connections, resending ÷ capacity")
}

fn deadline_refusals_name(connections: usize) -> String {
    let deadline = STORM_DEADLINE.as_secs();
    format!("refusals per second at c={STORM_CLIENTS}, {deadline} s deadline, on {connections} connections")
}

pub fn limits() -> MuxLimits {
    // Two batches in flight keep the device busy; a queue of one more round, so nearly every
    // call beyond that is refused at once.
    MuxLimits {
        max_in_flight: 16,
        max_queued: 16,
        queue_timeout: Duration::from_millis(500),
        max_concurrent_streams: 1024,
        coalesce: false,
    }
}

/// One closed-loop run: what it sends, over which protocol, and for how long.
struct ClosedRun<'a> {
    target: &'a str,
    protocol: Protocol,
    clients: usize,
    connections: usize,
    deadline: Option<Duration>,
}

async fn closed_run(run: ClosedRun<'_>, duration: Duration, meter: &[u32]) -> Result<Run> {
    let ClosedRun { target, protocol, clients, connections, deadline } = run;
    let config = LoadConfig {
        protocol,
        connections,
        deadline,
        inputs: words(TOKENS),
        duration,
        grace: Duration::from_secs(5),
        // Bounded by time; the count is a backstop far above what a run can send.
        ..LoadConfig::closed(target, clients, 10_000_000)
    };
    let cpu = CpuMeter::start(meter)?;
    let report = measure(config).await?;
    let spent = cpu.stop()?;
    if report.ok == 0 {
        return Err(Error::Process(format!("no call succeeded at {target}")));
    }
    Ok(Run { report, cpu: RunCpu { mux_s: spent[0], sim_s: spent[1], client_s: spent[2] } })
}

impl Measurement for ShedStorm {
    const KEY: &'static str = "shed-storm";
    const TITLE: &'static str = "Shed storm: 512 clients resending every refusal at a CPU-bound backend";

    async fn run(ctx: &Context) -> Result<Self> {
        let backend = gpu_model(512, Device::Spin).supported(ctx.features);
        let limits = limits();
        let (sim, mux, http) = sim_and_http_mux(ctx, "storm", &backend, &limits, CONNECTIONS).await?;
        let meter = [mux.pid(), sim.pid(), std::process::id()];
        let duration = ctx.pick(Duration::from_secs(5), Duration::from_secs(20));
        let run_with = |target: &Proc, clients: usize, connections: usize, deadline: Option<Duration>| {
            let target = target.url();
            async move {
                let run = ClosedRun { target: &target, protocol: Protocol::Grpc, clients, connections, deadline };
                closed_run(run, duration, &meter).await
            }
        };
        let run_on = |target: &Proc, clients: usize, connections: usize| run_with(target, clients, connections, None);
        let run = |target: &Proc, clients: usize| run_on(target, clients, CONNECTIONS);
        ctx.say(&format!("shed storm: capacity, {CAPACITY_CLIENTS} clients direct"));
        let capacity = run(&sim, CAPACITY_CLIENTS).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!("shed storm: {CAPACITY_CLIENTS} clients through the multiplexer"));
        let served = run(&mux, CAPACITY_CLIENTS).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!("shed storm: {STORM_CLIENTS} clients through the multiplexer, resending every refusal"));
        let storm = run(&mux, STORM_CLIENTS).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!("shed storm: the same over {FEWER_CONNECTIONS} connections"));
        let storm_fewer_connections = Some(run_on(&mux, STORM_CLIENTS, FEWER_CONNECTIONS).await?);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut deadline_storms = Vec::new();
        for connections in DEADLINE_CONNECTIONS {
            let deadline = STORM_DEADLINE.as_secs();
            ctx.say(&format!(
                "shed storm: {STORM_CLIENTS} clients with a {deadline} s deadline on {connections} connections"
            ));
            let run = run_with(&mux, STORM_CLIENTS, connections, Some(STORM_DEADLINE)).await?;
            deadline_storms.push(DeadlineStorm { connections, run });
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let short = SHORT_DEADLINE.as_millis();
        ctx.say(&format!(
            "shed storm: the same with a {short} ms deadline on {CONNECTIONS} connections (told at once)"
        ));
        let short_deadline_storm = Some(run_with(&mux, STORM_CLIENTS, CONNECTIONS, Some(SHORT_DEADLINE)).await?);
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!("shed storm: {STORM_CLIENTS} HTTP/1.1 clients without a deadline, resending every refusal"));
        let over_http = ClosedRun {
            target: &http,
            protocol: Protocol::Http,
            clients: STORM_CLIENTS,
            connections: 1,
            deadline: None,
        };
        let http_storm = Some(closed_run(over_http, duration, &meter).await?);
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctx.say(&format!("shed storm: capacity again, {CAPACITY_CLIENTS} clients direct"));
        let capacity_after = Some(run(&sim, CAPACITY_CLIENTS).await?);
        let seconds = duration.as_secs_f64();
        Ok(ShedStorm {
            backend,
            limits,
            seconds,
            capacity,
            capacity_after,
            served,
            storm,
            storm_fewer_connections,
            deadline_storms,
            short_deadline_storm,
            http_storm,
        })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::ShedStorm.label();
        let spinning = |target: Target| {
            if self.backend.device == Device::Sleep {
                target.skip_because(
                    "the simulator has no --device spin yet: a sleeping device does not compete for CPU, which is \
                     what this scenario measures",
                )
            } else {
                target
            }
        };
        let goodput =
            spinning(Target::at_least(&scenario, &goodput_name(), self.goodput_ratio(), GOODPUT_LIMIT, "× capacity"));
        let fewer = self.fewer_connections_goodput_ratio().map(|measured| {
            spinning(Target::at_least(&scenario, &fewer_name(), measured, GOODPUT_LIMIT, "× capacity"))
        });
        let goodput = goodput.note_if_not_passed(format!(
            "the simulator (its spinning device and its gRPC server) got {:.0}% less CPU than while serving 16 \
             clients. Over the storm the multiplexer used {:.2} CPU s ({:.0} µs per refusal, {:.0} µs per served \
             call) and the client {:.2} CPU s ({:.0} µs per answer) for {} refusals in {:.0} s. Whichever is larger \
             is what to cut: a cheaper refusal in the multiplexer, or fewer refusals to pay for at all (each \
             connection's door holds its calls beyond its share; refusals past it are calls that waited out the \
             queue timeout there), or clients honouring grpc-retry-pushback-ms",
            self.device_cpu_lost() * 100.0,
            self.storm.cpu.mux_s,
            self.mux_us_per_shed(),
            self.mux_us_per_served(),
            self.storm.cpu.client_s,
            self.client_us_per_answer(),
            self.storm.sheds(),
            self.seconds
        ));
        let mut targets = vec![goodput];
        targets.extend(fewer);
        for storm in &self.deadline_storms {
            let measured = self.deadline_goodput_ratio(storm);
            let name = deadline_name(storm.connections);
            targets.push(spinning(Target::at_least(&scenario, &name, measured, GOODPUT_LIMIT, "× capacity")));
            let refusals = storm.run.sheds() as f64 / self.seconds;
            targets.push(Target::info(&scenario, &deadline_refusals_name(storm.connections), Some(refusals), "/s"));
        }
        if let Some(short) = &self.short_deadline_storm {
            let name = format!(
                "refusals per second at c={STORM_CLIENTS}, {} ms deadline (told at once), on {CONNECTIONS} connections",
                SHORT_DEADLINE.as_millis()
            );
            targets.push(Target::info(&scenario, &name, Some(short.sheds() as f64 / self.seconds), "/s"));
            let name = format!("goodput at c={STORM_CLIENTS}, {} ms deadline, ÷ capacity", SHORT_DEADLINE.as_millis());
            targets.push(Target::info(
                &scenario,
                &name,
                Some(ratio(short.report.goodput_rps, self.capacity_rps())),
                "×",
            ));
        }
        if let Some(http) = &self.http_storm {
            let measured = ratio(http.report.goodput_rps, self.capacity_rps());
            targets.push(
                spinning(Target::at_least(&scenario, &http_name(), measured, GOODPUT_LIMIT, "× capacity"))
                    .note_if_not_passed(format!(
                        "{} of {} HTTP answers were refusals ({:.0} a second): an HTTP request without a deadline \
                         should wait at the pool's door as a gRPC call does",
                        http.sheds(),
                        http.report.answered,
                        http.sheds() as f64 / self.seconds
                    )),
            );
        }
        targets.extend([
            // No refusal at all: nothing to divide.
            Target::info(
                &scenario,
                "multiplexer CPU per shed",
                Some(self.mux_us_per_shed()).filter(|us| us.is_finite()),
                "µs",
            ),
            Target::info(&scenario, "multiplexer CPU per served call", Some(self.mux_us_per_served()), "µs"),
            Target::info(&scenario, "client CPU per answer in the storm", Some(self.client_us_per_answer()), "µs"),
        ]);
        targets
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::ShedStorm.label();
        let deadlines = DEADLINE_CONNECTIONS.map(deadline_name);
        [goodput_name(), fewer_name()]
            .iter()
            .chain(&deadlines)
            .chain(&[http_name()])
            .map(|name| Target::new(&scenario, name, None, Rule::AtLeast, GOODPUT_LIMIT, "× capacity"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::Verdict;

    fn run(ok: u64, answered: u64, goodput_rps: f64, mux_s: f64) -> Run {
        let report = Report { ok, answered, sent: answered, goodput_rps, ..Report::default() };
        Run { report, cpu: RunCpu { mux_s, sim_s: 1.0, client_s: 1.0 } }
    }

    #[test]
    fn shed_cost_is_what_the_storm_spent_beyond_serving() {
        let storm = ShedStorm {
            backend: gpu_model(512, Device::Spin),
            limits: limits(),
            seconds: 10.0,
            capacity: run(3000, 3000, 320.0, 0.0),
            capacity_after: Some(run(3000, 3000, 280.0, 0.0)),
            // 3000 served for 0.6 s: 200 µs each.
            served: run(3000, 3000, 300.0, 0.6),
            // 2800 served (0.56 s) and 100,000 refused with 5.56 s in all: 50 µs per refusal.
            storm: run(2800, 102_800, 280.0, 5.56),
            storm_fewer_connections: Some(run(2500, 2600, 250.0, 0.6)),
            deadline_storms: Vec::new(),
            short_deadline_storm: None,
            http_storm: None,
        };
        assert!((storm.mux_us_per_served() - 200.0).abs() < 1e-6);
        assert!((storm.mux_us_per_shed() - 50.0).abs() < 1e-6, "{}", storm.mux_us_per_shed());
        let targets = storm.targets();
        assert!((targets[0].measured.unwrap() - 0.9333).abs() < 1e-3);
        assert_eq!(targets[0].verdict, Verdict::Pass);
        assert!((targets[1].measured.unwrap() - 0.8333).abs() < 1e-3);
        assert_eq!(targets[1].verdict, Verdict::Fail, "8 connections: 250 of 300");
        assert_eq!(targets[2].verdict, Verdict::Info);
        let sleeping = ShedStorm { backend: gpu_model(512, Device::Sleep), ..storm };
        assert_eq!(sleeping.targets()[0].verdict, Verdict::Skip);
        assert_eq!(sleeping.targets()[1].verdict, Verdict::Skip);
    }

    #[test]
    fn each_deadline_storm_is_judged_and_its_refusals_reported() {
        let deadline_storms = vec![
            DeadlineStorm { connections: 1, run: run(2900, 2900, 290.0, 0.6) },
            DeadlineStorm { connections: 16, run: run(2000, 52_000, 200.0, 3.0) },
        ];
        let storm = ShedStorm {
            backend: gpu_model(512, Device::Spin),
            limits: limits(),
            seconds: 10.0,
            capacity: run(3000, 3000, 300.0, 0.0),
            capacity_after: None,
            served: run(3000, 3000, 300.0, 0.6),
            storm: run(2800, 2800, 280.0, 0.6),
            storm_fewer_connections: None,
            deadline_storms,
            short_deadline_storm: Some(run(1500, 60_000, 150.0, 4.0)),
            // 270 OK/s of 300, and 4,000 refusals in 10 s.
            http_storm: Some(run(2700, 6700, 270.0, 1.0)),
        };
        let targets = storm.targets();
        let named = |name: String| targets.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(named(deadline_name(1)).verdict, Verdict::Pass, "290 of 300");
        assert_eq!(named(deadline_name(16)).verdict, Verdict::Fail, "200 of 300");
        assert_eq!(named(deadline_refusals_name(1)).measured, Some(0.0));
        assert_eq!(named(deadline_refusals_name(16)).measured, Some(5000.0), "50,000 refusals in 10 s");
        let told_at_once = targets.iter().find(|t| t.name.contains("1500 ms deadline (told at once)")).unwrap();
        assert_eq!(told_at_once.measured, Some(5850.0), "58,500 refusals in 10 s");
        let http = named(http_name());
        assert_eq!((http.verdict, http.measured), (Verdict::Pass, Some(0.9)));
        let refused = ShedStorm { http_storm: Some(run(2000, 42_000, 200.0, 3.0)), ..storm };
        let http = refused.targets().into_iter().find(|t| t.name == http_name()).unwrap();
        assert_eq!(http.verdict, Verdict::Fail);
        assert!(http.note.contains("40000 of 42000 HTTP answers were refusals"), "{}", http.note);
    }
}
