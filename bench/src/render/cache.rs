//! Scenario 22's section: the embedding cache's four parts.

use std::fmt::Write as _;

use super::Render;
use super::table::{Table, figure, text};
use super::words::backend;
use crate::scenarios::cache::drive::Phase;
use crate::scenarios::cache::procs::PoolLimits;
use crate::scenarios::cache::{Cache, Part, hits, reindex, shared};
use crate::targets::{number, ratio};

fn limits(l: &PoolLimits) -> String {
    format!("maxInFlight {}, maxQueued {}, queueTimeout {} ms", l.max_in_flight, l.max_queued, l.queue_timeout_ms)
}

fn not_measured<T>(out: &mut String, part: &Part<T>) {
    if let Some(why) = part.why() {
        let _ = writeln!(out, "Not measured: {why}.\n");
    }
}

/// A table of phases: calls, codes, hits, goodput, latencies.
fn phases(out: &mut String, rows: &[(&str, &Phase)]) {
    let mut table = Table::new(
        out,
        &[
            text("phase"),
            figure("calls"),
            text("answers"),
            figure("hits"),
            figure("OK/s"),
            figure("p50 ms"),
            figure("p99 ms"),
            figure("hit p50 / p99 ms"),
            figure("miss p50 / p99 ms"),
            figure("vectors checked / wrong"),
        ],
    );
    for (name, p) in rows {
        table.row(&[
            name,
            &p.sent,
            &p.codes(),
            &p.hits,
            &format!("{:.0}", p.goodput_rps()),
            &number(p.p50_ms),
            &number(p.p99_ms),
            &format!("{} / {}", number(p.hit_p50_ms), number(p.hit_p99_ms)),
            &format!("{} / {}", number(p.miss_p50_ms), number(p.miss_p99_ms)),
            &format!("{} / {}", p.checked, p.wrong),
        ]);
    }
}

impl Render for Cache {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "The multiplexer in `file` mode, one pool whose `cache:` block turns the cache on, in front of tei-sim \
             with `--dimensions 384` (its vectors are a function of the text). Texts: a million distinct ones of 20 \
             to 60 words (mean 40), each generated from its id (`bench/src/scenarios/cache/texts.rs`). Every answer \
             through a multiplexer is checked against the simulator's vector for its text, and that vector against \
             direct calls to the simulator.\n"
        );
        let _ = writeln!(out, "**Part 1: Zipf queries at twice the capacity.**\n");
        not_measured(out, &self.hits);
        if let Some(h) = self.hits.get() {
            let _ = writeln!(
                out,
                "{}, behind two multiplexers ({}): one with the cache off, one with `cache: {{size: {}}}`. Capacity: \
                 a closed loop of {} callers through the one with the cache off, {:.0} texts/s. Then open-loop \
                 Poisson unary `Embed`s (1 s deadline, 4 connections) at {}× that ({:.0}/s), ranks drawn by Zipf \
                 s = {} over {} texts, through the cache (cold at the start), and the same schedule's first seconds \
                 through the cache-off one; then only the {} hottest texts at the capacity's rate. Hits are the \
                 calls answered `x-teifleet-cache: hit`; the cache's own counts over the cached phase: {}. {} of \
                 {} direct calls to the simulator differed from the vector every answer was checked against.\n",
                backend(&h.backend),
                limits(&h.limits),
                h.local_size,
                h.capacity_callers,
                h.capacity_rps(),
                hits::OFFERED,
                h.offered_rps,
                hits::EXPONENT,
                hits::DISTINCT,
                hits::HOT,
                h.inputs.iter().map(|(k, v)| format!("{k} {v:.0}")).collect::<Vec<_>>().join(", "),
                h.direct_wrong,
                h.direct_checked,
            );
            let mut rows = vec![
                ("capacity: closed loop, cache off", &h.capacity),
                ("2× capacity, cache on", &h.on),
                ("the same, after its first 2 s", &h.warm),
                ("2× capacity, cache off", &h.off),
                ("the hottest texts at capacity, cache on", &h.hot),
            ];
            if let (Some(on), Some(hot)) = (&h.floor_on, &h.floor_hot) {
                let _ = writeln!(
                    out,
                    "The floor: after every {} calls of the cached and the hottest phases, one call of a hot text to \
                     a bare tonic server in front of the same simulator that answers a call it has seen from memory \
                     (`teifleet-floor-proxy --stack memo`: no admission, no key digest, no metrics), so the floor \
                     and the hits meet this machine in the same seconds.\n",
                    hits::FLOOR_EVERY
                );
                rows.push(("bare tonic memo, beside the 2× phase", on));
                rows.push(("bare tonic memo, beside the hottest texts", hot));
            }
            phases(out, &rows);
            let _ = writeln!(
                out,
                "\nGoodput ÷ capacity: {} with the cache on, {} with it off; {:.1}% of the cached phase's answers \
                 were hits.\n",
                number(h.goodput_ratio()),
                number(h.off_ratio()),
                h.on.hit_ratio() * 100.0
            );
        }
        let _ = writeln!(out, "**Part 2: re-index with a tenth of the rows changed.**\n");
        not_measured(out, &self.reindex);
        if let Some(r) = self.reindex.get() {
            let _ = writeln!(
                out,
                "{} behind one multiplexer ({}), the cache held by {}. {} rows through EmbedArrow as the job worker \
                 sends them ({} rows a call, {} calls in flight, one connection), then the same rows with every \
                 {}th changed ({} rows): TEI's work is the simulator's admitted inputs over each pass; every row's \
                 vector is checked against a fresh embedding of its text.\n",
                backend(&r.backend),
                limits(&r.limits),
                r.tier,
                r.rows,
                reindex::ROWS_PER_CALL,
                reindex::CALLS_IN_FLIGHT,
                reindex::CHANGE_EVERY,
                r.changed,
            );
            let mut table = Table::new(
                out,
                &[
                    text("pass"),
                    figure("seconds"),
                    figure("rows/s"),
                    figure("TEI inputs"),
                    figure("rows OK / wrong / failed"),
                    text("calls' cache headers"),
                    figure("local entries / MB / evictions / not kept"),
                ],
            );
            for (name, p) in [("first", &r.first), ("second, 10% changed", &r.second)] {
                table.row(&[
                    &name,
                    &number(p.seconds),
                    &format!("{:.0}", p.rows_per_s()),
                    &p.tei_inputs,
                    &format!("{} / {} / {}", p.rows_ok, p.wrong, p.failed_rows),
                    &format!("{:?}", p.headers),
                    &format!("{:.0} / {:.0} / {:.0} / {:.0}", p.local[0], p.local[1] / 1e6, p.local[2], p.local[3]),
                ]);
            }
            let _ = writeln!(out, "\nTEI's work, second ÷ first: {}.\n", number(r.work_ratio()));
        }
        let _ = writeln!(out, "**Part 3: two replicas sharing one Redis.**\n");
        not_measured(out, &self.shared);
        if let Some(t) = self.shared.get() {
            let _ = writeln!(
                out,
                "Two replicas (each a simulator as in part 2 behind its own multiplexer, `cache: {{size: {}, store: \
                 {{url: redis://…, timeout: {} ms}}}}`), one `redis-server`. {} texts once through replica 1 (16 \
                 callers), then the same through replica 2: {} hits, {} of them from the store by its metrics, {} of \
                 the texts.\n",
                hits::LOCAL_SIZE,
                shared::STORE_TIMEOUT_MS,
                t.texts,
                t.second.hits,
                t.second_store_hits,
                number(t.hit_ratio()),
            );
            phases(out, &[("replica 1", &t.first), ("replica 2", &t.second)]);
            out.push('\n');
        }
        let _ = writeln!(out, "**Part 4: Redis killed under load.**\n");
        not_measured(out, &self.outage);
        if let Some(o) = self.outage.get() {
            let _ = writeln!(
                out,
                "One replica as in part 1 with `cache: {{size: {}, store: {{timeout: {} ms}}}}` (a small local tier, \
                 so repeats past the hottest texts are the store's), open-loop Zipf queries at {:.0}/s ({}× part 1's \
                 capacity) for {} s: Redis killed (SIGKILL) at {} s, started again on its port (empty) at {} s. \
                 Store hits per third {:?}; the first after the restart {}; store errors over the load {}; \
                 `teifleet_cache_store_up` at the end {}.\n",
                o.local_size,
                o.store_timeout_ms,
                o.rate,
                shared::OUTAGE_LOAD,
                3.0 * o.phase_s,
                o.phase_s,
                2.0 * o.phase_s,
                o.store_hits,
                o.first_store_hit_after_s.map_or("never".into(), |s| format!("{s:.1} s after it")),
                o.store_errors,
                o.store_up_at_end,
            );
            phases(out, &[("store up", &o.up), ("store down", &o.down), ("store started again", &o.after)]);
            let _ = writeln!(
                out,
                "\np99 with the store down {} ms against {} ms up (+ {} ms timeout: {}).\n",
                number(o.down.p99_ms),
                number(o.up.p99_ms),
                o.store_timeout_ms,
                number(ratio(o.down.p99_ms, o.p99_allowed_ms()))
            );
        }
    }
}
