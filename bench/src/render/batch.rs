//! Scenario 23's section: an OpenAI batch file through a pool.

use std::fmt::Write as _;

use super::Render;
use super::table::{Table, figure, text};
use super::words::{backend, limits};
use crate::scenarios::batch::{self, Batch};
use crate::scenarios::job;
use crate::targets::{number, ratio};

impl Render for Batch {
    fn write(&self, out: &mut String) {
        let quick = if self.requests < batch::FULL_REQUESTS {
            " (quick mode: the issue's target is for 50,000; `make bench` sends that many)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "The pool of scenario 20: {} replicas, each {} answering {}-dimension vectors behind its own multiplexer \
             in static mode ({}) with `--sibling`s and its HTTP front on. The batch: **{} requests**{quick} in \
             OpenAI's batch format ({:.1} MB; `custom_id`, `POST /v1/embeddings`, a {}-word text each), run as \
             `teifleet-batch` runs one: {} `teifleet-job run` workers, `--input-format openai-batch`, worker w \
             sending each line's `body` to replica w's `/v1/embeddings` on the `ingest` lane, `--calls-in-flight` \
             at its default ({} lines), `--shard-bytes` as `teifleet-batch` sets it ({} bytes: about {} shards a \
             worker); the output and error files read back. Capacity: \
             closed-loop unary `Embed`s, {} callers spread over the replicas.\n",
            self.replicas,
            backend(&self.backend),
            job::DIMENSIONS,
            limits(&self.limits),
            self.requests,
            self.file_bytes as f64 / 1e6,
            job::TOKENS,
            self.workers,
            teifleet_job::cli::BATCH_LINES_IN_FLIGHT,
            teifleet_batch::batches::job::shard_bytes(self.file_bytes, self.workers as i32),
            teifleet_batch::batches::job::SHARDS_PER_WORKER,
            self.capacity_callers,
        );
        let capacity = self.capacity_rps();
        let mut table = Table::new(
            out,
            &[
                text("run"),
                figure("seconds"),
                figure("requests/s"),
                figure("÷ capacity"),
                figure("output files"),
                figure("answered once"),
                figure("missing / repeated / malformed / errors"),
                figure("texts embedded per replica"),
            ],
        );
        let o = &self.output;
        table.row(&[
            &"batch",
            &number(self.seconds),
            &format!("{:.0}", self.requests_per_s()),
            &number(ratio(self.requests_per_s(), capacity)),
            &o.parts,
            &o.once,
            &format!("{} / {} / {} / {}", o.missing, o.repeated, o.malformed, o.errors),
            &self.sims.iter().map(|s| s.completed.to_string()).collect::<Vec<_>>().join(" / "),
        ]);
        let _ = writeln!(out, "\nPool capacity {capacity:.0} texts/s.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_has_the_batchs_row() {
        let body = batch::example::result(13.0, 0).body();
        assert!(body.contains("**50000 requests**"), "{body}");
        assert!(body.contains("| batch |"), "{body}");
        assert!(body.contains("Pool capacity 4000 texts/s"), "{body}");
    }
}
