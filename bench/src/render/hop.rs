//! The sections of the scenarios that measure what one hop adds to a call (1 overhead, 8 streams),
//! and scenario 1's plot.

use std::fmt::Write as _;

use super::Render;
use super::plots::{Chart, Plots, Series};
use super::table::{Table, figure, text};
use super::words::{backend, limits, ms, us};
use crate::Result;
use crate::floor::Stack;
use crate::procs::{Device, HaproxyMode};
use crate::scenarios::overhead::{self, Case, CaseResult, Overhead};
use crate::scenarios::streams::Streams;
use crate::scenarios::{Sample, median_of};
use crate::targets::number;

impl Render for Overhead {
    fn write(&self, out: &mut String) {
        let floor_ran = self.cases.iter().any(|c| !c.floor.is_empty());
        let _ = writeln!(
            out,
            "Closed loop, one HTTP/2 connection. Each case runs {} rounds back to back: direct to the simulator, \
             through the multiplexer{}, the order rotating each round; p50 and p99 are medians over rounds, and \
             *added* is the median of each round's difference, so drift on the machine cancels. Backend: {}. \
             Multiplexer: static mode, {} (admission never waits).{}\n",
            self.rounds,
            if floor_ran { " and through the floor proxies" } else { "" },
            backend(&self.backend),
            limits(&self.limits),
            if floor_ran {
                " Floors: `teifleet-floor-proxy`, forwarding every unary call on one upstream HTTP/2 connection with no \
                 admission, routing or metrics, built on tonic (raw message bytes through tonic's server and client, \
                 the multiplexer's stack: *floor*) and on the `h2` crate alone (frames relayed as they come, no hyper \
                 or tonic: *h2 floor*): what one hop costs on this machine before any work of the multiplexer's, on \
                 its stack and on the least of that stack."
            } else {
                " The floor proxy was not built, so there are no floor columns."
            }
        );
        let mut table = Table::new(
            out,
            &[
                text("case"),
                figure("calls/round"),
                figure("direct p50"),
                figure("mux p50"),
                figure("added"),
                figure("floor added"),
                figure("mux ÷ floor"),
                figure("h2 floor added"),
                figure("HAProxy TCP added"),
                figure("HAProxy h2 added"),
                figure("mux ÷ HAProxy h2"),
                figure("direct p99"),
                figure("mux p99"),
                figure("device p50"),
            ],
        );
        let times = |v: Option<f64>| v.map_or("—".into(), |v| format!("{}×", number(v)));
        for c in &self.cases {
            table.row(&[
                &c.case.label(),
                &c.calls_per_round,
                &format!("{} ms", ms(CaseResult::p50_ms(&c.direct))),
                &format!("{} ms", ms(CaseResult::p50_ms(&c.mux))),
                &us(c.added_us()),
                &c.floor_added_us().map_or("—".into(), us),
                &times(c.vs_floor()),
                &c.floor_h2_added_us().map_or("—".into(), us),
                &c.haproxy_added_us(HaproxyMode::Tcp).map_or("—".into(), us),
                &c.haproxy_added_us(HaproxyMode::H2).map_or("—".into(), us),
                &times(c.vs_haproxy_h2()),
                &format!("{} ms", ms(CaseResult::p99_ms(&c.direct))),
                &format!("{} ms", ms(CaseResult::p99_ms(&c.mux))),
                &c.device_ms().map_or("—".into(), |d| format!("{} ms", ms(d))),
            ]);
        }
        let targeted: Vec<&CaseResult> = self
            .cases
            .iter()
            .filter(|c| {
                matches!(c.case, overhead::Case::Info | overhead::Case::Single { tokens: overhead::TARGET_TOKENS })
            })
            .collect();
        if floor_ran && !targeted.is_empty() {
            let parts: Vec<String> = targeted
                .iter()
                .map(|c| {
                    format!(
                        "{}: the h2 floor adds {}, the tonic floor {}, the multiplexer {} ({}× the tonic floor)",
                        c.case.target_name(),
                        c.floor_h2_added_us().map_or("n/a".into(), us),
                        c.floor_added_us().map_or("n/a".into(), us),
                        us(c.added_us()),
                        c.vs_floor().map_or("n/a".into(), number)
                    )
                })
                .collect();
            let _ = writeln!(out, "\n**The floor this machine allows** for one gRPC hop: {}.", parts.join("; "));
        }
        let haproxy_ran = self.cases.iter().any(|c| !c.floors.haproxy_h2.is_empty());
        if haproxy_ran && !targeted.is_empty() {
            let parts: Vec<String> = targeted
                .iter()
                .map(|c| {
                    format!(
                        "{}: HAProxy TCP adds {}, HAProxy h2 {}, the h2 floor {} ({}× HAProxy h2), the multiplexer {} \
                         ({}× HAProxy h2)",
                        c.case.target_name(),
                        c.haproxy_added_us(HaproxyMode::Tcp).map_or("n/a".into(), us),
                        c.haproxy_added_us(HaproxyMode::H2).map_or("n/a".into(), us),
                        c.floor_h2_added_us().map_or("n/a".into(), us),
                        c.floor_h2_added_us().and_then(|h2| c.over_haproxy_h2(h2)).map_or("n/a".into(), number),
                        us(c.added_us()),
                        c.vs_haproxy_h2().map_or("n/a".into(), number)
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "\n**HAProxy on the same machine** (one thread, as the multiplexer): in `mode tcp` it splices bytes \
                 between two connections without parsing HTTP/2, the physical floor of one extra hop; as an h2c proxy \
                 (`proto h2` on both sides, one pooled upstream connection) it decodes and re-encodes every frame, \
                 what the best L7 proxy costs here. {}.",
                parts.join("; ")
            );
        } else if let Some(why) = &self.haproxy_missing {
            let _ = writeln!(out, "\nNo HAProxy columns: {why}.");
        }
        let _ = writeln!(
            out,
            "\nThe tei-manager benchmarks (RTX GPU) for comparison: +12.5% to +20% single, +7.5% to +18% concurrent, \
             +12% to +15% streaming."
        );
        if self.backend.device == Device::Sleep {
            let _ = writeln!(
                out,
                "\nThis run's simulator has no `--device spin`, so the device sleeps and rounds each batch up to a \
                 1 ms timer tick; a closed loop phase-locks to the ticks, which can hide or inflate a hop's \
                 microseconds. Only the Info row (no device time) is judged."
            );
        }
    }

    /// Single-call p50 against input size, each side a line.
    fn plots(&self, plots: &mut Plots<'_>) -> Result<()> {
        let singles: Vec<&CaseResult> = self.cases.iter().filter(|c| matches!(c.case, Case::Single { .. })).collect();
        let tokens = |c: &CaseResult| match c.case {
            Case::Single { tokens } => tokens as f64,
            Case::Info | Case::Concurrent { .. } => f64::NAN,
        };
        let line = |name: &str, side: fn(&CaseResult) -> &[Sample]| Series {
            name: name.into(),
            points: singles.iter().map(|c| (tokens(c), CaseResult::p50_ms(side(c)))).collect(),
        };
        let mut series = vec![line("direct", |c| &c.direct), line("multiplexer", |c| &c.mux)];
        if singles.iter().all(|c| !c.floor.is_empty()) {
            series.push(line(Stack::Tonic.label(), |c| &c.floor));
        }
        if singles.iter().all(|c| !c.floors.floor_h2.is_empty()) {
            series.push(line(Stack::H2.label(), |c| &c.floors.floor_h2));
        }
        if singles.iter().all(|c| !c.floors.haproxy_tcp.is_empty() && !c.floors.haproxy_h2.is_empty()) {
            series.push(line("HAProxy TCP", |c| &c.floors.haproxy_tcp));
            series.push(line("HAProxy h2", |c| &c.floors.haproxy_h2));
        }
        let chart = Chart {
            title: "Single-request p50 latency, ~1 ms backend",
            x_label: "input tokens",
            y_label: "p50 latency (ms)",
            log_y: false,
            log_x: true,
        };
        plots.draw("overhead", chart, series)
    }
}

impl Render for Streams {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Closed loop, one HTTP/2 connection, one EmbedStream call at a time carrying N messages of {} tokens, all \
             sent at once; the call is the request, timed until its last answer. {} interleaved rounds direct, \
             through the multiplexer ({}, one permit per message) and through scenario 1's floors (the bare h2 proxy, \
             HAProxy TCP and h2c); medians over rounds. Backend: {}.\n",
            self.tokens,
            self.rounds,
            limits(&self.limits),
            backend(&self.backend)
        );
        let mut table = Table::new(
            out,
            &[
                figure("messages"),
                figure("calls/round"),
                text("through"),
                figure("direct p50"),
                figure("p50"),
                figure("added"),
                figure("added %"),
                figure("direct p99"),
                figure("p99"),
            ],
        );
        for c in &self.cases {
            let direct_p50 = c.direct_p50_ms();
            for (label, side) in c.proxies() {
                let p50 = median_of(side, |s| s.p50_ms);
                table.row(&[
                    &c.messages,
                    &c.calls_per_round,
                    &label,
                    &format!("{} ms", ms(direct_p50)),
                    &format!("{} ms", ms(p50)),
                    &us((p50 - direct_p50) * 1e3),
                    &format!("{:+.1}%", c.added_percent_by(side).unwrap_or(f64::NAN)),
                    &format!("{} ms", ms(median_of(&c.direct, |s| s.p99_ms))),
                    &format!("{} ms", ms(median_of(side, |s| s.p99_ms))),
                ]);
            }
        }
    }
}
