//! One run's report as people read it: a short table on a terminal, or Markdown for a file.

use std::fmt::Write as _;

use crate::report::{Report, RunInfo};
use crate::summary::Summary;

fn describe(info: &RunInfo) -> String {
    let mut s = match (info.mode.as_str(), info.rate, info.concurrency) {
        ("open", Some(rate), _) => {
            format!("open loop, {} {rate:.1}/s", info.arrivals.as_deref().unwrap_or("poisson"))
        }
        (_, _, Some(c)) => format!("closed loop, concurrency {c}"),
        (mode, _, _) => mode.to_owned(),
    };
    if info.protocol == "http" {
        s.push_str(", HTTP/1.1 (TEI's HTTP API)");
    } else if info.connection_per_call {
        s.push_str(", a new connection per call");
    } else {
        let _ = write!(s, ", {} connection{}", info.connections, if info.connections == 1 { "" } else { "s" });
    }
    let _ = write!(s, ", {}", info.call);
    if info.inputs != "none" {
        let _ = write!(s, ", {}", info.inputs);
    }
    if let Some(d) = info.deadline_ms {
        let _ = write!(s, ", deadline {d:.0} ms");
    }
    if let Some(p) = &info.priority {
        let _ = write!(s, ", priority {p}");
    }
    if let Some(t) = &info.tenant {
        let _ = write!(s, ", tenant {t}");
    }
    if let Some(p) = &info.pool {
        let _ = write!(s, ", pool {p}");
    }
    if let Some(l) = &info.lane {
        let _ = write!(s, ", lane {l}");
    }
    if let Some(r) = &info.retry {
        let _ = write!(s, ", {r}");
    }
    s
}

/// `attempts 1234 · OK at attempt 1: 6, 2: 40, … · hints 1228 (p50 62 ms)`, for runs that retried.
fn retry_line(report: &Report) -> Option<String> {
    let r = report.retries.as_ref()?;
    let by: Vec<String> = r.ok_by_attempt.iter().enumerate().map(|(i, n)| format!("{}: {n}", i + 1)).collect();
    let by = if by.is_empty() { "none".into() } else { by.join(", ") };
    let hints = if r.hint.count > 0 {
        format!(" · hints {} (p50 {:.0} ms, p99 {:.0} ms)", r.hint.count, r.hint.p50_ms, r.hint.p99_ms)
    } else {
        " · no hints".into()
    };
    Some(format!("attempts {} · OK at attempt {by}{hints}", r.attempts))
}

/// `handshakes 101: 1 full, 100 resumed`, for runs in TLS.
fn tls_line(report: &Report) -> Option<String> {
    let h = report.tls?;
    Some(format!("handshakes {}: {} full, {} resumed", h.full + h.resumed, h.full, h.resumed))
}

/// Codes, most frequent first (`OK 412 · RESOURCE_EXHAUSTED 588`).
pub fn codes(report: &Report) -> String {
    let mut codes: Vec<(&String, &u64)> = report.codes.iter().collect();
    codes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let parts: Vec<String> = codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
    if parts.is_empty() { "none".into() } else { parts.join(" · ") }
}

fn rows(report: &Report) -> Vec<(&'static str, Summary)> {
    let mut rows = vec![("all answers", report.latency)];
    if report.latency_failed.count > 0 {
        rows.push(("OK", report.latency_ok));
        rows.push(("failed", report.latency_failed));
        if report.lateness.is_some() {
            rows.push(("failed, sent→", report.response_failed));
        }
    }
    if let Some(l) = report.lateness {
        rows.push(("send lateness", l));
    }
    if let Some(q) = report.tei_queue {
        rows.push(("TEI queue", q));
    }
    if let Some(i) = report.tei_inference {
        rows.push(("TEI inference", i));
    }
    rows
}

/// The terminal table.
pub fn human(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "target      {}  ({})", report.info.target, describe(&report.info));
    let offered = report.offered_rps.map(|o| format!(", offered {o:.1}/s")).unwrap_or_default();
    let _ = writeln!(
        out,
        "requests    {} sent, {} answered in {:.3} s{offered}",
        report.sent, report.answered, report.elapsed_s
    );
    let _ = writeln!(out, "codes       {}", codes(report));
    let _ = writeln!(out, "throughput  {:.1} answers/s", report.throughput_rps);
    let within = if report.info.deadline_ms.is_some() { " within the deadline" } else { "" };
    let _ = writeln!(out, "goodput     {:.1} OK/s{within}", report.goodput_rps);
    if let Some(line) = retry_line(report) {
        let _ = writeln!(out, "retries     {line}");
    }
    if let Some(line) = tls_line(report) {
        let _ = writeln!(out, "TLS         {line}");
    }
    let _ = writeln!(
        out,
        "\n{:<16}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>9}",
        "latency (ms)", "p50", "p90", "p99", "p99.9", "max", "mean", "count"
    );
    for (name, s) in rows(report) {
        let _ = writeln!(
            out,
            "  {name:<14}{:>10.3}{:>10.3}{:>10.3}{:>10.3}{:>10.3}{:>10.3}{:>9}",
            s.p50_ms, s.p90_ms, s.p99_ms, s.p999_ms, s.max_ms, s.mean_ms, s.count
        );
    }
    out
}

/// The same as Markdown.
pub fn markdown(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## teifleet-load: {}\n", report.info.target);
    let _ = writeln!(out, "{}\n", describe(&report.info));
    let _ = writeln!(out, "| sent | answered | seconds | throughput/s | goodput/s | codes |");
    let _ = writeln!(out, "| ---: | ---: | ---: | ---: | ---: | --- |");
    let _ = writeln!(
        out,
        "| {} | {} | {:.3} | {:.1} | {:.1} | {} |\n",
        report.sent,
        report.answered,
        report.elapsed_s,
        report.throughput_rps,
        report.goodput_rps,
        codes(report)
    );
    if let Some(line) = retry_line(report) {
        let _ = writeln!(out, "Retries: {line}.\n");
    }
    if let Some(line) = tls_line(report) {
        let _ = writeln!(out, "TLS: {line}.\n");
    }
    let _ = writeln!(out, "| latency (ms) | p50 | p90 | p99 | p99.9 | max | mean | count |");
    let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, s) in rows(report) {
        let _ = writeln!(
            out,
            "| {name} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
            s.p50_ms, s.p90_ms, s.p99_ms, s.p999_ms, s.max_ms, s.mean_ms, s.count
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_most_frequent_first_and_tables_mention_the_split() {
        let mut report = Report::default();
        report.codes.insert("OK".into(), 412);
        report.codes.insert("RESOURCE_EXHAUSTED".into(), 588);
        assert_eq!(codes(&report), "RESOURCE_EXHAUSTED 588 · OK 412");
        report.tei_queue = Some(Summary::default());
        report.info.mode = "closed".into();
        report.info.concurrency = Some(4);
        report.info.connections = 2;
        let text = human(&report);
        assert!(text.contains("closed loop, concurrency 4, 2 connections"), "{text}");
        assert!(text.contains("TEI queue"));
        assert!(markdown(&report).contains("| TEI queue |"));
        assert_eq!(codes(&Report::default()), "none");
        assert!(!text.contains("retries"));
        assert!(!text.contains("TLS"));
        report.info.connection_per_call = true;
        report.tls = Some(crate::report::Handshakes { full: 1, resumed: 99 });
        let text = human(&report);
        assert!(text.contains("closed loop, concurrency 4, a new connection per call"), "{text}");
        assert!(text.contains("TLS         handshakes 100: 1 full, 99 resumed"), "{text}");
    }

    #[test]
    fn retrying_runs_show_attempts_and_hints() {
        let report = Report {
            retries: Some(crate::report::Retries {
                attempts: 20,
                ok_by_attempt: vec![2, 0, 3],
                hint: Summary { count: 15, p50_ms: 61.0, p99_ms: 93.0, ..Summary::default() },
            }),
            ..Report::default()
        };
        let text = human(&report);
        assert!(
            text.contains("retries     attempts 20 · OK at attempt 1: 2, 2: 0, 3: 3 · hints 15 (p50 61 ms, p99 93 ms)"),
            "{text}"
        );
    }
}
