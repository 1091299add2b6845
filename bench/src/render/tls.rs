//! The section of the TLS scenario (16 TLS cost), from its typed result.

use std::fmt::Write as _;

use super::Render;
use super::table::{Table, figure, text};
use super::words::{backend, limits, us};
use crate::scenarios::tls::{ADDED_LIMIT_US, CPU_RATIO_LIMIT, CaseResult, TlsCost};
use crate::targets::number;

fn handshakes(c: &CaseResult) -> String {
    let h = c.handshakes;
    format!("{} ({} resumed)", h.full + h.resumed, h.resumed)
}

impl Render for TlsCost {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "One simulator ({}) behind two multiplexers in static mode ({}, admission never waits), started with \
             the same flags but for `--tls-cert`/`--tls-key` on one of them (rustls, ring, ALPN h2, TLS 1.3 tickets \
             and a session cache; a certificate for 127.0.0.1 from a CA made for the run, which the client alone \
             trusts). Closed loop, one call at a time; each case runs {} rounds back to back, the order rotating \
             each round. *Long-lived connection*: each round's calls share one HTTP/2 connection, opened (and, in \
             TLS, handshaken) before its first call, so the calls pay only record encryption; *a new connection per \
             call*: each call opens its own connection and closes it after, the TLS side resuming the round's \
             session (a TLS 1.3 ticket: no certificate is sent or checked, one key exchange), so the TCP, TLS and \
             HTTP/2 set-up are in its latency. p50 and p99 are medians over rounds; *added* is the median of each \
             round's difference. CPU per call is each multiplexer's utime + stime (`/proc/<pid>/stat`) over all of \
             a case's rounds ÷ the OK calls it served: each process serves only its own side, and enough calls are \
             made that `/proc`'s 10 ms ticks are a few percent of it. Targets: TLS adds ≤ {} µs to Info's p50, and \
             CPU per call with TLS ≤ {}× plaintext, over long-lived connections.\n",
            backend(&self.backend),
            limits(&self.limits),
            self.rounds,
            number(ADDED_LIMIT_US),
            number(CPU_RATIO_LIMIT)
        );
        let mut table = Table::new(
            out,
            &[
                text("case"),
                figure("calls/round"),
                figure("plaintext p50"),
                figure("TLS p50"),
                figure("TLS added"),
                figure("plaintext p99"),
                figure("TLS p99"),
                figure("CPU/call plaintext"),
                figure("CPU/call TLS"),
                figure("TLS ÷ plaintext CPU"),
                figure("TLS handshakes"),
            ],
        );
        for c in &self.cases {
            table.row(&[
                &c.case.label(),
                &c.calls_per_round,
                &format!("{} ms", number(CaseResult::p50_ms(&c.plain))),
                &format!("{} ms", number(CaseResult::p50_ms(&c.tls))),
                &us(c.added_us()),
                &format!("{} ms", number(CaseResult::p99_ms(&c.plain))),
                &format!("{} ms", number(CaseResult::p99_ms(&c.tls))),
                &format!("{:.0} µs", c.plain_cpu.us_per_call()),
                &format!("{:.0} µs", c.tls_cpu.us_per_call()),
                &format!("{}×", number(c.cpu_ratio())),
                &handshakes(c),
            ]);
        }
        let _ = writeln!(
            out,
            "\nThe client is this run's `teifleet-load` (rustls, ring, one client configuration per round, so its \
             session store lets later connections resume) on the same cores, so *added* holds the client's \
             encryption as well as the sidecar's; the CPU columns are the sidecar's alone."
        );
    }
}

#[cfg(test)]
mod tests {
    use teifleet_load::report::Handshakes;

    use super::*;
    use crate::scenarios::cost::ProxyCpu;
    use crate::scenarios::tls::{Case, TOKENS};
    use crate::scenarios::{Sample, fast_model, unhurried_limits};

    #[test]
    fn the_section_shows_both_sides_the_difference_and_the_cpu_ratio() {
        let side = |p50_ms| vec![Sample { p50_ms, p99_ms: p50_ms * 2.0, ..Sample::default() }];
        let case = |case, plain, tls, handshakes| CaseResult {
            case,
            calls_per_round: 1000,
            plain: side(plain),
            tls: side(tls),
            plain_cpu: ProxyCpu { calls: 1000, cpu_s: 0.1 },
            tls_cpu: ProxyCpu { calls: 1000, cpu_s: 0.12 },
            handshakes,
        };
        let r = TlsCost {
            backend: fast_model(),
            limits: unhurried_limits(),
            rounds: 1,
            cases: vec![
                case(Case::Info, 0.2, 0.225, Handshakes { full: 1, resumed: 0 }),
                case(Case::Embed { tokens: TOKENS }, 1.2, 1.22, Handshakes { full: 1, resumed: 0 }),
                case(Case::InfoPerCall, 0.5, 0.9, Handshakes { full: 1, resumed: 1000 }),
            ],
        };
        let text = r.body();
        assert!(
            text.contains(
                "| Info, long-lived connection | 1000 | 0.200 ms | 0.225 ms | +25 µs | 0.400 ms | 0.450 ms | 100 µs | \
                 120 µs | 1.20× | 1 (0 resumed) |"
            ),
            "{text}"
        );
        assert!(text.contains("| Info, a new connection per call | 1000 | 0.500 ms | 0.900 ms | +400 µs |"), "{text}");
        assert!(text.contains("| 1001 (1000 resumed) |"), "{text}");
        assert!(text.contains("TLS adds ≤ 50.0 µs to Info's p50"), "{text}");
    }
}
