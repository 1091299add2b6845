//! The one place results become something to read: the Markdown results file (summary table,
//! what would fix each failure, one section per scenario with its tables) and the SVG plots.
//! Scenarios only measure; everything here is a pure function of [`Results`], except writing.
//!
//! Each scenario's result type has its section as a [`Render`], in the file of its theme; they
//! share [`table`] (the one table writer), [`words`] (how a backend, limits and a latency are
//! written) and [`plots`] (charts), and none imports another.

mod admission;
mod batch;
mod cache;
mod colocation;
mod cost;
mod hop;
mod http;
mod job;
mod overload;
pub mod plots;
mod pool;
mod real_tei;
pub mod table;
mod tls;
pub mod words;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use self::plots::Plots;
use self::table::{Table, figure, text};
use crate::results::{self, Outcome, Results, Section};
use crate::scenarios::for_each_scenario;
use crate::targets::{self, Target, Verdict};
use crate::{Error, Result};

/// A 1-minute load average from which the machine counts as busy before the run: half a core of
/// other work already moves a microsecond comparison.
const BUSY_LOAD: f64 = 0.5;

/// A scenario's section of the results file, implemented by the type of its result (beside its
/// [`Measurement`](crate::scenarios::Measurement)).
pub trait Render {
    /// Writes how it was measured and its tables, in Markdown.
    fn write(&self, out: &mut String);

    /// The same, as a string.
    fn body(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    /// Draws its charts, if it has any.
    fn plots(&self, _plots: &mut Plots<'_>) -> Result<()> {
        Ok(())
    }
}

/// Each scenario's [`Render`], by its [`Outcome`].
macro_rules! define_rendering {
    ($($variant:ident => $result:ty,)*) => {
        fn render(outcome: &Outcome) -> &dyn Render {
            match outcome {
                $(Outcome::$variant(r) => &**r,)*
            }
        }
    };
}

for_each_scenario!(define_rendering);

/// How it was measured and its tables, or why it was not.
fn body(section: &Section) -> String {
    match (&section.outcome, &section.error) {
        (Some(outcome), _) => render(outcome).body(),
        (None, Some(error)) => format!("Not measured: {error}."),
        (None, None) => "Not measured.".into(),
    }
}

/// Draws the charts of `section` into `dir` as `<stem>-<name>.svg`; returns the file names.
pub fn plots_of(section: &Section, dir: &Path, stem: &str) -> Result<Vec<String>> {
    let mut plots = Plots::new(dir, stem);
    if let Some(outcome) = &section.outcome {
        render(outcome).plots(&mut plots)?;
    }
    Ok(plots.files)
}

/// The summary table, as printed at the end of a run and at the top of the results file.
pub fn summary_table(targets: &[Target]) -> String {
    let mut out = String::new();
    let mut table =
        Table::new(&mut out, &[text("scenario"), text("target"), figure("measured"), figure("limit"), text("verdict")]);
    for t in targets {
        let verdict = match t.verdict {
            Verdict::Info => "info".to_owned(),
            v => format!("**{v}**"),
        };
        table.row(&[&t.scenario, &t.name, &t.measured_text(), &t.rule_text(), &verdict]);
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
        out.push_str(body(section).trim_end());
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
    let plots =
        results.sections.iter().map(|section: &Section| plots_of(section, dir, stem)).collect::<Result<Vec<_>>>()?;
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
