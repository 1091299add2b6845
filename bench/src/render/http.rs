//! The sections of the HTTP scenarios (13 HTTP overhead, 14 HTTP overload), from their typed
//! results.

use std::fmt::Write as _;

use teifleet_load::render::codes;

use super::Render;
use super::table::{Table, figure, text};
use super::words::{backend, limits, us};
use crate::procs::Device;
use crate::scenarios::http_overhead::{self, CaseResult, HttpOverhead};
use crate::scenarios::http_overload::{self, HttpOverload};
use crate::scenarios::overload::DEADLINE;
use crate::targets::number;

impl Render for HttpOverhead {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Closed loop. Each case runs {} rounds back to back, the order rotating each round: gRPC direct to the \
             simulator (one HTTP/2 connection), gRPC through the multiplexer, and TEI's HTTP API through the \
             multiplexer's HTTP front (`POST /embed` with `truncate: true`, or `GET /info`; HTTP/1.1 keep-alive, a \
             connection per call in flight; the JSON answer read whole, not parsed). The simulator, like TEI's gRPC \
             image, serves no HTTP, so *added* is over gRPC direct: what an HTTP client pays over a gRPC client of \
             TEI itself, JSON included, and also the two client stacks' difference (an HTTP/1.1 request alone on its \
             connection; a gRPC call through tonic's channel, sharing one HTTP/2 connection), so the judged figure is \
             *HTTP ÷ gRPC*: the p50 an HTTP client of the pool waits over a gRPC client's, through the same sidecar \
             (each round's ratio, median over rounds). p50 and p99 are medians over rounds; *added* is the median \
             of each round's difference. Backend: {}. Multiplexer: static mode, {} (admission never waits).\n",
            self.rounds,
            backend(&self.backend),
            limits(&self.limits)
        );
        let mut table = Table::new(
            out,
            &[
                text("case"),
                figure("calls/round"),
                figure("direct p50"),
                figure("gRPC p50"),
                figure("HTTP p50"),
                figure("gRPC added"),
                figure("HTTP added"),
                figure("HTTP ÷ gRPC"),
                figure("gRPC p99"),
                figure("HTTP p99"),
            ],
        );
        for c in &self.cases {
            table.row(&[
                &http_overhead::label(c.case),
                &c.calls_per_round,
                &format!("{} ms", number(CaseResult::p50_ms(&c.direct))),
                &format!("{} ms", number(CaseResult::p50_ms(&c.grpc))),
                &format!("{} ms", number(CaseResult::p50_ms(&c.http))),
                &us(c.grpc_added_us()),
                &us(c.http_added_us()),
                &format!("{}×", number(c.http_vs_grpc())),
                &format!("{} ms", number(CaseResult::p99_ms(&c.grpc))),
                &format!("{} ms", number(CaseResult::p99_ms(&c.http))),
            ]);
        }
        if self.backend.device == Device::Sleep {
            let _ = writeln!(
                out,
                "\nThis run's simulator has no `--device spin`, so the device sleeps and rounds each batch up to a \
                 1 ms timer tick; only the Info row (no device time) is judged."
            );
        }
    }
}

impl Render for HttpOverload {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Backend: {}. Inputs of 16 tokens. **Measured capacity: {:.1} req/s** (closed loop, {} in flight, gRPC \
             direct); batch time p50 {} ms.\n\n\
             Multiplexer: {}, its HTTP front on a port of its own. Load: open loop, Poisson, {} s per point, every \
             request with a {} s deadline (`grpc-timeout`, or `x-teifleet-timeout-ms` over HTTP); at each load the \
             same schedule (seed) over gRPC (8 HTTP/2 connections) and then over HTTP (HTTP/1.1, a connection per \
             call in flight), through the same sidecar. HTTP answers are counted under the gRPC code their status \
             stands for (429 as `RESOURCE_EXHAUSTED`, 504 as `DEADLINE_EXCEEDED`). Goodput counts OK answers within \
             the deadline. For reference, scenario 2's bound on an admitted call is {:.1} ms.\n",
            backend(&self.backend),
            self.capacity.rps,
            self.capacity.concurrency,
            number(self.capacity.batch_ms),
            limits(&self.limits),
            self.seconds_per_point,
            DEADLINE.as_secs(),
            http_overload::admitted_limit_ms(self)
        );
        let mut table = Table::new(
            out,
            &[
                figure("load"),
                text("protocol"),
                figure("offered/s"),
                figure("goodput/capacity"),
                figure("HTTP ÷ gRPC goodput"),
                figure("OK p50"),
                figure("OK p99"),
                figure("shed"),
                figure("shed p99 (sent→)"),
                text("codes"),
            ],
        );
        for row in &self.rows {
            for (name, x) in [("gRPC", &row.grpc), ("HTTP", &row.http)] {
                let versus = if name == "HTTP" { format!("{}×", number(row.http_vs_grpc())) } else { "—".into() };
                table.row(&[
                    &format!("{}×", row.factor),
                    &name,
                    &format!("{:.0}", x.offered_rps.unwrap_or(0.0)),
                    &format!("{:.3}", x.goodput_rps / self.capacity.rps),
                    &versus,
                    &format!("{} ms", number(x.latency_ok.p50_ms)),
                    &format!("{} ms", number(x.latency_ok.p99_ms)),
                    &format!("{:.1}%", x.failed_fraction() * 100.0),
                    &format!("{} ms", number(x.response_failed.p99_ms)),
                    &codes(x),
                ]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use teifleet_load::Report;

    use super::*;
    use crate::scenarios::http_overhead::Case;
    use crate::scenarios::overload::{Capacity, mux_limits};
    use crate::scenarios::{Sample, fast_model, gpu_model, http_overload::Row, unhurried_limits};

    #[test]
    fn the_sections_show_each_side_and_the_ratios() {
        let side = |p50_ms| vec![Sample { p50_ms, ..Sample::default() }];
        let overhead_result = HttpOverhead {
            backend: fast_model(),
            limits: unhurried_limits(),
            rounds: 1,
            cases: vec![CaseResult {
                case: Case::Info,
                calls_per_round: 10,
                direct: side(0.1),
                grpc: side(0.2),
                http: side(0.3),
            }],
        };
        let text = overhead_result.body();
        assert!(
            text.contains(
                "| Info / GET /info (no device time) | 10 | 0.100 ms | 0.200 ms | 0.300 ms | +100 µs | +200 µs | 1.50× |"
            ),
            "{text}"
        );
        let report = |goodput_rps| Report { goodput_rps, ..Report::default() };
        let overload_result = HttpOverload {
            backend: gpu_model(512, Device::Sleep),
            limits: mux_limits(),
            capacity: Capacity { rps: 100.0, batch_ms: 24.0, concurrency: 64 },
            seconds_per_point: 3,
            rows: vec![Row { factor: 2.0, grpc: report(100.0), http: report(98.0) }],
        };
        let text = overload_result.body();
        assert!(text.contains("| 2× | HTTP | 0 | 0.980 | 0.980× |"), "{text}");
        assert!(text.contains("| 2× | gRPC | 0 | 1.000 | — |"), "{text}");
    }
}
