//! The section of scenario 21, real TEI, from its typed result: one table per row.

use std::fmt::Write as _;

use super::Render;
use super::table::{Table, figure, text};
use super::words::{limits, us};
use crate::scenarios::real_tei::{self, HopCase, RealBulk, RealTei, Run};
use crate::targets::number;

fn rate(r: &Run) -> String {
    format!("{:.0}", r.ok_per_s)
}

fn ms(v: f64) -> String {
    format!("{} ms", number(v))
}

fn ratio(v: f64) -> String {
    format!("{}×", number(v))
}

/// One table of per-round runs, direct and through, with each round's ratio of texts/s.
fn rounds(out: &mut String, direct: &[Run], through: &[Run]) {
    let mut table = Table::new(
        out,
        &[
            figure("round"),
            text("side"),
            figure("sent"),
            figure("OK in time"),
            figure("texts/s"),
            figure("through ÷ direct"),
            figure("p50"),
            figure("p99"),
            text("codes"),
        ],
    );
    for (i, (d, t)) in direct.iter().zip(through).enumerate() {
        for (side, r) in [("direct", d), ("through the sidecar", t)] {
            let versus = if side == "direct" { "—".into() } else { ratio(t.ok_per_s / d.ok_per_s.max(1e-9)) };
            table.row(&[
                &(i + 1),
                &side,
                &r.sent,
                &r.ok_in_time,
                &rate(r),
                &versus,
                &ms(r.p50_ms),
                &ms(r.p99_ms),
                &r.codes_text(),
            ]);
        }
    }
}

fn hop_row(table: &mut Table<'_>, c: &HopCase) {
    table.row(&[
        &c.name,
        &c.calls_per_round,
        &ms(HopCase::p50_ms(&c.direct)),
        &ms(HopCase::p50_ms(&c.sidecar)),
        &c.haproxy_added_us().map_or("n/a".into(), |_| ms(HopCase::p50_ms(&c.haproxy_h2))),
        &us(c.sidecar_added_us()),
        &c.haproxy_added_us().map_or("n/a".into(), us),
        &c.vs_haproxy().filter(|r| r.is_finite()).map_or("n/a".into(), ratio),
    ]);
}

impl Render for RealTei {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Hugging Face TEI 1.9.3 built for this CPU (candle, no MKL: at most {} requests per batch), model {} \
             (384 dimensions), from `{}`; TEI's `--max-concurrent-requests {}` on both its routers. Every Embed is \
             one text of {} words. Each row compares TEI direct with the sidecar in front of the same TEI, in the \
             same run. Sidecar of rows 1, 2 and 4: static mode, {}.\n",
            real_tei::TEI_BATCH,
            self.model,
            self.cache,
            real_tei::TEI_MAX_CONCURRENT,
            real_tei::TOKENS,
            limits(&self.limits)
        );
        let t = &self.throughput;
        let _ = writeln!(
            out,
            "**1. Throughput through a budget of TEI's batch.** {} closed-loop callers over 4 HTTP/2 connections, no \
             deadline, {} s per run, rounds alternating which side goes first. Texts/s through ÷ direct (median of \
             the rounds' ratios): **{}**.\n",
            t.callers,
            t.seconds_per_run,
            ratio(t.ratio())
        );
        rounds(out, &t.direct, &t.through);
        let p = &self.patient;
        let _ = writeln!(
            out,
            "\n**2. Patient callers.** {} calls from {} closed-loop callers, each with a {} s deadline. Served in \
             time through the sidecar (the worst round): **{:.3}** of the calls; texts/s through ÷ direct {}.\n",
            p.calls,
            p.callers,
            p.deadline_s,
            p.served(),
            ratio(p.ratio())
        );
        rounds(out, &p.direct, &p.through);
        let s = &self.storm;
        let _ = writeln!(
            out,
            "\n**3. A storm with deadlines.** TEI's capacity first, direct at each concurrency for {} s: \
             **{:.0} texts/s** at its best ({}). Then {} closed-loop callers with {} s deadlines for {} s, through \
             a sidecar with `--adaptive` ({}; its limit ended at {}), after a warm-up storm, and the same storm \
             direct. Goodput counts OK answers in time.\n",
            s.sweep_seconds,
            s.capacity_per_s(),
            s.best_concurrency().map_or("n/a".into(), |c| format!("{c} in flight")),
            real_tei::STORM_CALLERS,
            real_tei::STORM_DEADLINE.as_secs(),
            s.seconds,
            limits(&s.limits),
            s.limit_after.map_or("n/a".into(), |l| format!("{l:.0}"))
        );
        let mut table = Table::new(
            out,
            &[
                text("load"),
                figure("texts/s"),
                figure("goodput/s"),
                figure("÷ capacity"),
                figure("p50"),
                figure("p99"),
                text("codes"),
            ],
        );
        // The capacity sweep's share is its texts/s (nothing has a deadline), the storms' their goodput.
        let mut row = |name: &str, r: &Run, per_s: f64| {
            let share = ratio(per_s / s.capacity_per_s());
            let goodput = format!("{:.0}", r.goodput_per_s);
            table.row(&[&name, &rate(r), &goodput, &share, &ms(r.p50_ms), &ms(r.p99_ms), &r.codes_text()]);
        };
        for point in &s.sweep {
            row(&format!("direct, {} in flight", point.concurrency), &point.run, point.run.ok_per_s);
        }
        for (name, r) in [("storm direct", &s.direct), ("storm through the adaptive sidecar", &s.through)] {
            row(name, r, r.goodput_per_s);
        }
        let h = &self.hop;
        let _ = writeln!(
            out,
            "\n**4. The hop.** One call at a time, {} rounds, direct to TEI's gRPC router, through the sidecar, and \
             through HAProxy as an h2c proxy (`mode http`, `proto h2` both sides, one thread: scenario 1's L7 floor). \
             p50s are medians over rounds; *added* is the median of each round's difference over direct.\n",
            h.rounds
        );
        let mut table = Table::new(
            out,
            &[
                text("call"),
                figure("calls/round"),
                figure("direct p50"),
                figure("sidecar p50"),
                figure("HAProxy h2 p50"),
                figure("sidecar added"),
                figure("HAProxy h2 added"),
                figure("sidecar ÷ HAProxy"),
            ],
        );
        for c in &h.cases {
            hop_row(&mut table, c);
        }
        if let Some(why) = &h.haproxy_missing {
            let _ = writeln!(out, "\nNo HAProxy side: {why}.");
        }
        if let Some(info) = h.cases.iter().find(|c| c.name == "Info" && !c.floor_h2.is_empty()) {
            let _ = writeln!(
                out,
                "\nIn the same rounds the bare h2 floor proxy (the sidecar's HTTP/2 stack relaying frames, no check) \
                 added {} on Info ({} of HAProxy h2's): the sidecar's checks added {} on top.",
                info.floor_added_us().map_or("n/a".into(), us),
                info.floor_vs_haproxy().map_or("n/a".into(), ratio),
                info.checks_added_us().map_or("n/a".into(), us),
            );
        }
        match (&self.http, &self.http_missing) {
            (Some(x), _) => {
                let _ = writeln!(
                    out,
                    "\n**5. The auto-batching proxy's table.** {} calls per run (the auto-batching proxy's table has \
                     20,000; fewer when this CPU TEI would take over half a minute for them), each a single-input \
                     `POST /embed` of {} words, from {} closed-loop callers over HTTP/1.1, a connection each: TEI's \
                     HTTP router direct, and the sidecar's HTTP front ({}, `--max-connections {}`) in front of TEI's \
                     gRPC router. p99 through ÷ direct: **{}**; texts/s through ÷ direct: **{}**.\n",
                    x.calls_per_run,
                    real_tei::TOKENS,
                    x.callers,
                    limits(&x.limits),
                    2 * x.callers,
                    ratio(x.p99_ratio()),
                    ratio(x.throughput_ratio())
                );
                rounds(out, &x.direct, &x.through);
            }
            (None, why) => {
                let _ = writeln!(
                    out,
                    "\n**5. The auto-batching proxy's table.** Not measured: {}.",
                    why.as_deref().unwrap_or("no result")
                );
            }
        }
        match (&self.lanes, &self.lanes_missing) {
            (Some(l), _) => {
                let _ = writeln!(
                    out,
                    "\n**6. Lanes.** Queries: open-loop Poisson unary Embeds at {:.0}/s ({}× capacity), {} s deadline, \
                     {} s, no lane header; alone, then the same schedule beside {} closed-loop ingest callers \
                     (`x-teifleet-lane: ingest`, no deadline, from a second before to a second after), through a \
                     sidecar with {} and `--ingest-share {}`. Query p99 (every answer, refusals and deadlines included) beside ÷ alone: **{}**.\n",
                    l.rate,
                    real_tei::lanes::QUERY_FACTOR,
                    real_tei::lanes::QUERY_DEADLINE.as_secs(),
                    l.seconds,
                    real_tei::lanes::INGEST_CALLERS,
                    limits(&l.limits),
                    l.ingest_share_percent,
                    ratio(l.p99_ratio())
                );
                let mut table = Table::new(
                    out,
                    &[
                        text("load"),
                        figure("sent"),
                        figure("OK in time"),
                        figure("texts/s"),
                        figure("OK p50"),
                        figure("p99, all answers"),
                        text("codes"),
                    ],
                );
                for (name, r) in [
                    ("queries alone", &l.alone),
                    ("queries beside ingest", &l.beside),
                    ("ingest beside queries", &l.ingest),
                ] {
                    table.row(&[
                        &name,
                        &r.sent,
                        &r.ok_in_time,
                        &rate(r),
                        &ms(r.p50_ms),
                        &ms(r.p99_all_ms),
                        &r.codes_text(),
                    ]);
                }
            }
            (None, why) => {
                let _ = writeln!(out, "\n**6. Lanes.** Not measured: {}.", why.as_deref().unwrap_or("no result"));
            }
        }
        match (&self.bulk, &self.bulk_missing) {
            (Some(b), _) => bulk(out, b),
            (None, why) => {
                let _ = writeln!(
                    out,
                    "\n**7. Bulk at 384 dimensions.** Not measured: {}.",
                    why.as_deref().unwrap_or("no result")
                );
            }
        }
    }
}

/// Row 7: the unary reference runs and the two bulk calls, one line each.
fn bulk(out: &mut String, b: &RealBulk) {
    let _ = writeln!(
        out,
        "\n**7. Bulk at {dims} dimensions.** Through row 1's sidecar (default `--max-message-bytes` and memory \
         limit): one `EmbedArrow` call of {n} rows and one `EmbedStream` call of {n} messages, each text `q<row>` \
         and {words} more words. {sim} rows, scenario 18's call, would take {sim_s:.0} s on this CPU TEI: {n} rows \
         instead. The reference: {n} unary Embeds of the same texts from {callers} closed-loop callers through the \
         same sidecar, before the bulk calls and after them (their mean). Every answer must be {dims} long; \
         {sample} rows spread over the call (first and last included) are compared with TEI's unary Embed direct \
         (cosine ≥ {cos}). EmbedArrow ÷ unary: **{arrow}**; EmbedStream ÷ unary: **{stream}**.\n",
        dims = real_tei::bulk::DIMENSIONS,
        n = b.texts,
        words = real_tei::TOKENS - 1,
        sim = real_tei::bulk::SIM_TEXTS,
        sim_s = real_tei::bulk::SIM_TEXTS as f64 / b.balanced_per_s().max(1e-9),
        callers = b.callers,
        sample = b.arrow.sampled,
        cos = real_tei::bulk::COSINE_LIMIT,
        arrow = ratio(b.arrow_ratio()),
        stream = ratio(b.stream_ratio()),
    );
    let mut table = Table::new(
        out,
        &[
            text("load"),
            figure("texts"),
            figure("answered"),
            figure("384-long"),
            figure("sampled = TEI direct"),
            figure("least cosine"),
            figure("seconds"),
            figure("texts/s"),
            figure("÷ unary"),
            text("outcome"),
        ],
    );
    for (i, r) in b.balanced.iter().enumerate() {
        let name = if i == 0 { "unary, before" } else { "unary, after" };
        let share = ratio(r.ok_per_s / b.balanced_per_s().max(1e-9));
        let per_s = format!("{:.1}", r.ok_per_s);
        let seconds = format!("{:.1}", r.elapsed_s);
        let none = "—";
        table.row(&[&name, &r.sent, &r.ok, &none, &none, &none, &seconds, &per_s, &share, &r.codes_text()]);
    }
    for (name, c) in [("EmbedArrow, one call", &b.arrow), ("EmbedStream, one call", &b.stream)] {
        let sampled = format!("{} of {}", c.matched, c.sampled);
        let least = c.least_cosine.map_or("n/a".into(), |v| format!("{v:.6}"));
        let seconds = format!("{:.1}", c.seconds);
        let per_s = format!("{:.1}", c.texts_per_s());
        let share = ratio(c.texts_per_s() / b.balanced_per_s().max(1e-9));
        table.row(&[&name, &c.sent, &c.answered, &c.full, &sampled, &least, &seconds, &per_s, &share, &c.outcome]);
    }
}
