//! The one place results become something to read: the Markdown results file (summary table,
//! what would fix each failure, one section per scenario with its tables) and the SVG plots.
//! Scenarios only measure; everything here is a pure function of [`Results`], except writing.

mod admission;
mod http;
pub mod plots;
mod pool;
mod sections;
mod tls;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::results::{self, Results, Section};
use crate::targets::{self, Target, Verdict};
use crate::{Error, Result};

/// A 1-minute load average from which the machine counts as busy before the run: half a core of
/// other work already moves a microsecond comparison.
const BUSY_LOAD: f64 = 0.5;

/// The summary table, as printed at the end of a run and at the top of the results file.
pub fn summary_table(targets: &[Target]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| scenario | target | measured | limit | verdict |");
    let _ = writeln!(out, "| --- | --- | ---: | ---: | --- |");
    for t in targets {
        let verdict = match t.verdict {
            Verdict::Info => "info".to_owned(),
            v => format!("**{v}**"),
        };
        let _ =
            writeln!(out, "| {} | {} | {} | {} | {verdict} |", t.scenario, t.name, t.measured_text(), t.rule_text());
    }
    out
}

/// The whole results file. `plots` are the chart files of each section, in section order.
pub fn markdown(results: &Results, plots: &[Vec<String>]) -> String {
    let all = results.targets();
    let (pass, fail, skip) = targets::tally(&all);
    let mut out = String::new();
    let _ = writeln!(out, "# teifleet benchmarks, {} ({} run)\n", results.date, results.mode);
    let _ = writeln!(out, "Machine: {}.  ", results.machine.describe());
    let _ = writeln!(out, "Commit: `{}`. Run time: {:.0} s.  ", results.commit, results.duration_s);
    let build = if results.build.is_empty() { "plain release build (not profile-guided)" } else { &results.build };
    let _ = writeln!(out, "Binaries: {build}.  ");
    if let Some(load) = results.load_before {
        let busy = if load >= BUSY_LOAD {
            " The machine was busy before the run started: other processes competed for the cores, so timings \
             (and the CPU-bound scenarios most) are noisier than on a quiet machine."
        } else {
            ""
        };
        let _ = writeln!(out, "Load average (1 min) when the run started: {load:.2}.{busy}  ");
    }
    let _ = writeln!(
        out,
        "Reproduce: `make bench` (full) or `make bench-quick`. Every number below was measured in this run, \
         direct to the backend and through the multiplexer, on this machine, over 127.0.0.1.\n"
    );
    let _ = writeln!(out, "**{pass} PASS, {fail} FAIL, {skip} SKIP.** Rows marked info have no limit.\n");
    out.push_str(&summary_table(&all));
    let notes: Vec<&Target> = all.iter().filter(|t| !t.note.is_empty()).collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n### What would fix the failures, and why targets were skipped\n");
        for t in notes {
            let _ = writeln!(out, "- **{} / {}** ({}): {}", t.scenario, t.name, t.verdict, t.note);
        }
    }
    for (i, section) in results.sections.iter().enumerate() {
        let _ = writeln!(out, "\n## {}\n", section.scenario.title());
        out.push_str(sections::body(section).trim_end());
        out.push('\n');
        for plot in plots.get(i).map_or(&[][..], Vec::as_slice) {
            let _ = writeln!(out, "\n![{plot}]({plot})");
        }
    }
    out
}

/// Writes `<stem>.md`, `<stem>.json` and the plots into `dir`.
pub fn write(results: &Results, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|source| Error::File { what: "creating", path: dir.into(), source })?;
    let plots = results
        .sections
        .iter()
        .map(|section: &Section| plots::for_section(section, dir, stem))
        .collect::<Result<Vec<_>>>()?;
    let md = dir.join(format!("{stem}.md"));
    std::fs::write(&md, markdown(results, &plots)).map_err(|source| Error::File {
        what: "writing",
        path: md.clone(),
        source,
    })?;
    let json = results::write_json(results, dir, stem)?;
    let mut written = vec![md, json];
    written.extend(plots.into_iter().flatten().map(|file| dir.join(file)));
    Ok(written)
}

#[cfg(test)]
mod tests;
