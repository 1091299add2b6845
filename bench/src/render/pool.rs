//! The sections of the pool scenarios (15 spillover, 18 bulk), from their typed results.

use std::fmt::Write as _;

use teifleet_load::render::codes;

use super::Render;
use super::table::{Table, figure, text};
use super::words::{backend, limits, us};
use crate::scenarios::bulk::{self, Bulk};
use crate::scenarios::median_of;
use crate::scenarios::overload::DEADLINE;
use crate::scenarios::spillover::{BALANCED_CONNECTIONS, LOAD_FACTOR, Spillover};
use crate::targets::{number, ratio};

/// `a / b / c` of each replica's figure.
fn per_replica(values: impl Iterator<Item = String>) -> String {
    values.collect::<Vec<_>>().join(" / ")
}

impl Render for Spillover {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Each replica: {}, behind its own multiplexer in static mode ({}), started with `--sibling` naming the \
             other replicas' multiplexers (every gRPC port picked before any of them starts; a sibling is connected \
             to at its first spill). **Measured capacity of one replica: {:.1} req/s** (direct, closed loop, {} in \
             flight); batch time p50 {} ms.\n\n\
             Load: open loop, Poisson, {} s per run, 16-token inputs, every request with a {} s deadline, at {}× the \
             pool's capacity (the replicas × one replica's), the same schedule (seed) in the three runs of a pool: (a) \
             one client on one HTTP/2 connection to replica 1's multiplexer; (b) {BALANCED_CONNECTIONS} connections \
             spread over the replicas' multiplexers in turn, requests round robin over them (a balancing client: the \
             reference); (c) as (a), to a multiplexer of replica 1's TEI started without `--sibling` (the floor \
             without spillover). OK/s counts OK answers within the deadline. Device busy time, calls served and the \
             most requests in flight at once are each simulator's own counters (`/stats`), reset before each run; \
             spills are the client's multiplexer's `teifleet_spills_total` (served by the sibling / refused by it and \
             served here).\n",
            backend(&self.backend),
            limits(&self.limits),
            self.capacity.rps,
            self.capacity.concurrency,
            number(self.capacity.batch_ms),
            self.seconds,
            DEADLINE.as_secs(),
            LOAD_FACTOR
        );
        let mut table = Table::new(
            out,
            &[
                figure("replicas"),
                text("run"),
                figure("offered/s"),
                figure("OK/s"),
                figure("÷ (b)"),
                figure("refused"),
                figure("OK p50"),
                figure("OK p99"),
                figure("spills served / refused"),
                figure("device busy per replica"),
                figure("calls per replica"),
                figure("most in flight per TEI"),
                text("codes"),
            ],
        );
        for pool in &self.pools {
            for (name, run) in pool.runs() {
                let x = &run.report;
                table.row(&[
                    &pool.replicas,
                    &name,
                    &format!("{:.0}", x.offered_rps.unwrap_or(pool.offered_rps)),
                    &format!("{:.0}", run.ok_rps()),
                    &number(ratio(run.ok_rps(), pool.balanced.ok_rps())),
                    &run.refused(),
                    &format!("{} ms", number(x.latency_ok.p50_ms)),
                    &format!("{} ms", number(x.latency_ok.p99_ms)),
                    &format!("{:.0} / {:.0}", run.spills.served, run.spills.refused),
                    &format!(
                        "{} s",
                        per_replica(run.sims.iter().map(|s| format!("{:.2}", s.device_busy_us as f64 / 1e6)))
                    ),
                    &per_replica(run.sims.iter().map(|s| s.completed.to_string())),
                    &per_replica(run.sims.iter().map(|s| s.max_in_flight_observed.to_string())),
                    &codes(x),
                ]);
            }
        }
        let _ = writeln!(
            out,
            "\nOK p50 and p99 are queueing: at {LOAD_FACTOR}× capacity every admitted call waits. In (a) it waits in \
             replica 1's queue, which every replica drains (a call there takes room here or at a sibling, whichever \
             opens first); in (b) and (c), in the queue of the replica its connection reaches, which that replica \
             alone drains. So a pinned client's admitted calls wait less than a balancing client's, not more, and a \
             lower p50 in (a) says nothing of the hop; what the extra hop costs is measured alone below. Refusals are \
             what was offered beyond what the pool served: with spillover about as many as the balancing client's, \
             without it all but one replica's worth."
        );
        let h = &self.hop;
        let p50 = |side| format!("{} ms", number(median_of(side, |s| s.p50_ms)));
        let p99 = |side| format!("{} ms", number(median_of(side, |s| s.p99_ms)));
        let _ = writeln!(
            out,
            "\n**What a spilled call costs.** Two replicas A and B: {}; each multiplexer {}, A's started with \
             `--sibling` B. A's TEI is stalled (`POST /fault/stall`) with one call holding A's only permit, so every \
             call through A spills to B ({:.0}% did, from A's `teifleet_spills_total`). One {}-token Embed at a time, \
             closed loop, {} rounds of {} calls in rotating order: straight to B's TEI, through B's multiplexer (a \
             local call), through A's (spilled to B). p50 and p99 are medians over rounds; *added* is the median of \
             each round's difference.\n",
            backend(&h.backend),
            limits(&h.limits),
            h.spilled_share * 100.0,
            h.tokens,
            h.rounds,
            h.calls_per_round
        );
        Table::new(out, &[text("path"), figure("p50"), figure("p99"), figure("added p50")])
            .row(&[&"B's TEI directly", &p50(&h.direct), &p99(&h.direct), &"—"])
            .row(&[
                &"through B's multiplexer (local)",
                &p50(&h.local),
                &p99(&h.local),
                &format!("{} over TEI (one hop)", us(h.hop_added_us())),
            ])
            .row(&[
                &"through A's multiplexer, spilled to B",
                &p50(&h.spilled),
                &p99(&h.spilled),
                &format!("{} over local", us(h.spill_added_us())),
            ]);
        let _ = writeln!(
            out,
            "\nA spilled call adds {} over a local one, {}× what one multiplexer adds over TEI in the same run \
             (scenario 1 measures that hop on its own).",
            us(h.spill_added_us()),
            number(ratio(h.spill_added_us(), h.hop_added_us()))
        );
        if h.backend.device == crate::procs::Device::Sleep {
            let _ = writeln!(
                out,
                "\nThis run's simulator has no `--device spin`, so the device sleeps and rounds each batch up to a 1 ms \
                 timer tick, which can hide or inflate a hop's microseconds."
            );
        }
    }
}

impl Render for Bulk {
    fn write(&self, out: &mut String) {
        let quick = if self.texts < 100_000 {
            " (quick mode: the issue's target is for 100,000; `make bench` sends that many)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "A pool of {} replicas as scenario 15 starts them: each {} answering {}-dimension vectors \
             (`--dimensions {}`), behind its own multiplexer in static mode ({}), started with `--sibling` naming the \
             other replicas' multiplexers and the same `--peer-key-file` (a 43-character key), other flags their \
             defaults (the client reads messages up to {} MiB). **{} texts per bulk call**{quick}, each a distinct {}-word text; one after the other: (1) one \
             `tei.v1.Embed/EmbedStream` call of {} messages on one HTTP/2 connection to replica 1's multiplexer \
             (sent as fast as flow control lets them go; the sidecar spreads them over the pool as sub-batches, \
             `forward/bulk.rs`'s `Spread`); (2) one `tei_multiplexer.v1.TeiMultiplexer/EmbedArrow` call, an Arrow IPC \
             RecordBatch of {} rows (a `text` column, f32 answers), on one connection to replica 1 (sub-batches of at \
             most one replica's share, each admitted here or at a sibling); (3) the reference: unary `Embed` calls of \
             {}-word texts, closed loop, {} callers over {} connections spread over the 3 replicas in turn. Texts/s \
             counts texts answered OK, once, in their place: every answer is checked against the simulator's vector \
             of its own text (a function of the text alone), after the clock stops. Calls per replica are each \
             simulator's completed count (`/stats`, reset before each run); spills are replica 1's \
             `teifleet_spills_total`, in inputs: served by a sibling / refused by it / sibling unreachable.\n",
            self.replicas,
            backend(&self.backend),
            bulk::DIMENSIONS,
            bulk::DIMENSIONS,
            limits(&self.limits),
            bulk::CLIENT_MAX_MESSAGE >> 20,
            self.texts,
            bulk::TOKENS,
            self.texts,
            self.texts,
            bulk::TOKENS,
            self.unary_callers,
            self.unary_connections,
        );
        let mut table = Table::new(
            out,
            &[
                text("run"),
                figure("texts"),
                figure("answered"),
                figure("in order"),
                figure("seconds"),
                figure("texts/s"),
                figure("÷ balanced"),
                figure("calls per replica"),
                figure("spills served / refused / unreachable"),
                text("ended"),
            ],
        );
        for (name, side) in self.sides() {
            table.row(&[
                &name,
                &side.sent,
                &side.answered,
                &side.in_order,
                &number(side.seconds),
                &format!("{:.0}", side.texts_per_s()),
                &number(ratio(side.texts_per_s(), self.balanced.texts_per_s())),
                &per_replica(side.sims.iter().map(|s| s.completed.to_string())),
                &format!("{:.0} / {:.0} / {:.0}", side.spills.served, side.spills.refused, side.spills.unreachable),
                &side.outcome,
            ]);
        }
        if self.peak_rss_bytes > 0 {
            let _ = writeln!(
                out,
                "\nReplica 1's multiplexer peaked at {:.0} MiB resident over the run (VmHWM), the {}-row Arrow call \
                 and its answer included.",
                self.peak_rss_bytes as f64 / f64::from(1 << 20),
                self.texts
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::spillover::example::result;

    #[test]
    fn the_bulk_section_shows_each_call_beside_the_balanced_reference() {
        let text = crate::scenarios::bulk::example::result(20.0, 21.0, 20_000).body();
        assert!(text.contains("**20000 texts per bulk call** (quick mode"), "{text}");
        assert!(
            text.contains("| EmbedStream, one call on one connection to replica 1 | 20000 | 20000 | 20000 | 20.0 | 1000 | 1.00 | 6700 / 6650 / 6650 |"),
            "{text}"
        );
        assert!(text.contains("| 952 | 0.952 | 10000 / 5000 / 5000 | 13000 / 2 / 0 | OK |"), "{text}");
        assert!(text.contains("peaked at 80 MiB"), "{text}");
    }

    #[test]
    fn the_section_shows_each_run_per_replica_and_the_spill_beside_the_hop() {
        let text = result(680.0, [2900, 2800], 16).body();
        assert!(text.contains("**Measured capacity of one replica: 350.0 req/s**"), "{text}");
        assert!(text.contains("| 2 | (a) pinned, one connection to replica 1 | 1400 | 680 | 0.986 | 700 |"), "{text}");
        assert!(text.contains("| 2.90 / 2.80 s | 0 / 0 | 16 / 16 |"), "{text}");
        assert!(text.contains("| 2 | (c) pinned, replica 1 without --sibling | 1400 | 345 | 0.500 | 1050 |"), "{text}");
        assert!(text.contains("| through A's multiplexer, spilled to B | 1.11 ms |"), "{text}");
        assert!(text.contains("+55 µs over local"), "{text}");
        assert!(text.contains("1.00× what one multiplexer adds over TEI"), "{text}");
    }
}
