//! Scenario 20's section: an embedding job through a pool, alone, beside queries, and with a worker
//! killed.

use std::fmt::Write as _;

use super::Render;
use super::table::{Table, figure, text};
use super::words::{backend, limits, ms};
use crate::scenarios::job::{self, Job, JobRun};
use crate::targets::{number, ratio};

impl Render for Job {
    fn write(&self, out: &mut String) {
        let quick = if self.rows < 1_000_000 {
            " (quick mode: the issue's target is for 1,000,000; `make bench` sends that many)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "A pool of {} replicas as scenario 18 starts them: each {} answering {}-dimension vectors, behind its own \
             multiplexer in static mode ({}), started with `--sibling` naming the others and the same \
             `--peer-key-file`. The job: the real `teifleet-job run` binary, {} workers (`--worker w --workers {}`, \
             worker w dialing replica w's multiplexer as a Service spreads pods' connections), **{} rows**{quick} of \
             generated JSONL ({:.1} MB; distinct numeric ids, {}-word texts) read from a file, `--shard-bytes {}`, \
             `--rows-per-call {}`, `--calls-in-flight {}`, `--lane ingest`, Parquet parts written to a directory \
             and read back after each run (ids and errors). Capacity: closed-loop unary `Embed`s, {} callers spread \
             over the replicas. Queries: open-loop Poisson unary `Embed`s at {}× capacity over the replicas, 1 s \
             deadline, no lane header, alone and then (same schedule) beside the job, started {} s earlier and \
             killed once the queries are answered; the job's rows/s beside them is the simulators' completed count \
             over the schedule less the queries answered OK. Run 3 kills worker 0 (SIGKILL) at {}% of run 1's time \
             and restarts it at once with the same flags; rows embedded twice are the simulators' completed count \
             less the rows written and one probe text per worker start.\n",
            self.replicas,
            backend(&self.backend),
            job::DIMENSIONS,
            limits(&self.limits),
            self.workers,
            self.workers,
            self.rows,
            self.corpus_bytes as f64 / 1e6,
            job::TOKENS,
            self.shard_bytes,
            self.rows_per_call,
            self.calls_in_flight,
            self.capacity_callers,
            job::QUERY_FACTOR,
            job::JOB_MARGIN.as_secs(),
            job::KILL_AT * 100.0,
        );
        let capacity = self.capacity_rps();
        let mut table = Table::new(
            out,
            &[
                text("run"),
                figure("seconds"),
                figure("rows/s"),
                figure("÷ capacity"),
                figure("parts"),
                figure("ids once"),
                figure("missing / repeated / foreign / failed"),
                figure("rows embedded per replica"),
                figure("redone"),
            ],
        );
        let runs: [(&str, &JobRun); 2] = [("job alone", &self.alone), ("worker 0 killed and restarted", &self.killed)];
        for (name, run) in runs {
            let o = &run.output;
            table.row(&[
                &name,
                &number(run.seconds),
                &format!("{:.0}", run.rows_per_s()),
                &number(ratio(run.rows_per_s(), capacity)),
                &o.parts,
                &o.once,
                &format!("{} / {} / {} / {}", o.missing, o.repeated, o.foreign, o.failed),
                &run.sims.iter().map(|s| s.completed.to_string()).collect::<Vec<_>>().join(" / "),
                &run.redone(),
            ]);
        }
        let _ = writeln!(
            out,
            "\nPool capacity {capacity:.0} texts/s; one shard {} rows (the largest part).\n",
            self.shard_rows()
        );
        let mut table = Table::new(
            out,
            &[
                text("queries"),
                figure("sent"),
                figure("OK"),
                figure("goodput/s"),
                figure("p50 ms"),
                figure("p99 ms"),
                figure("job rows/s"),
            ],
        );
        table.row(&[
            &"alone",
            &self.queries_alone.sent,
            &self.queries_alone.ok,
            &format!("{:.0}", self.queries_alone.goodput_rps),
            &ms(self.queries_alone.latency.p50_ms),
            &ms(self.queries_alone.latency.p99_ms),
            &"—",
        ]);
        let q = &self.beside.queries;
        table.row(&[
            &"beside the job",
            &q.sent,
            &q.ok,
            &format!("{:.0}", q.goodput_rps),
            &ms(q.latency.p50_ms),
            &ms(q.latency.p99_ms),
            &format!("{:.0}", self.beside.job_rows_per_s()),
        ]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_has_a_row_per_run_and_per_query_load() {
        let body = job::example::result(26.0, 36.0, 2_500).body();
        assert!(body.contains("**100000 rows** (quick mode"), "{body}");
        assert!(body.contains("| job alone |"), "{body}");
        assert!(body.contains("| worker 0 killed and restarted |"), "{body}");
        assert!(body.contains("| beside the job |"), "{body}");
        assert!(body.contains("one shard 5000 rows"), "{body}");
    }
}
