//! The results of one `make bench` run: the machine, each scenario's section and every target's
//! verdict, written as `<date>.md` (for people, committed) and `<date>.json` (for tools).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::targets::{self, Target};
use crate::{Error, Result};

/// One scenario's outcome.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Section {
    pub key: String,
    pub title: String,
    /// How it was measured and its tables, as Markdown.
    pub markdown: String,
    pub data: serde_json::Value,
    pub targets: Vec<Target>,
    /// Plot files next to the results.
    pub plots: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub os: String,
}

impl Machine {
    pub fn this() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_owned()))
            .unwrap_or_else(|| "unknown".into());
        let memory_kb: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:")?.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let os = read("/etc/os-release")
            .lines()
            .find_map(|l| Some(l.strip_prefix("PRETTY_NAME=")?.trim_matches('"').to_owned()))
            .unwrap_or_default();
        Self {
            cpu_model,
            cpus: std::thread::available_parallelism().map(usize::from).unwrap_or(1),
            memory_gib: memory_kb / 1024.0 / 1024.0,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            os,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} × {} CPU, {:.0} GiB RAM, {}, Linux {}",
            self.cpus, self.cpu_model, self.memory_gib, self.os, self.kernel
        )
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub date: String,
    /// `full` or `quick`.
    pub mode: String,
    pub machine: Machine,
    pub commit: String,
    pub duration_s: f64,
    pub sections: Vec<Section>,
}

impl Results {
    pub fn targets(&self) -> Vec<Target> {
        self.sections.iter().flat_map(|s| s.targets.iter().cloned()).collect()
    }
}

/// The summary table, as printed at the end of a run and at the top of the results file.
pub fn summary_table(targets: &[Target]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| scenario | target | measured | limit | verdict |");
    let _ = writeln!(out, "| --- | --- | ---: | ---: | --- |");
    for t in targets {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | **{}** |",
            t.scenario,
            t.name,
            t.measured_text(),
            t.rule_text(),
            t.verdict
        );
    }
    out
}

pub fn markdown(results: &Results) -> String {
    let all = results.targets();
    let (pass, fail, skip) = targets::tally(&all);
    let mut out = String::new();
    let _ = writeln!(out, "# teifleet benchmarks, {} ({} run)\n", results.date, results.mode);
    let _ = writeln!(out, "Machine: {}.  ", results.machine.describe());
    let _ = writeln!(out, "Commit: `{}`. Run time: {:.0} s.  ", results.commit, results.duration_s);
    let _ = writeln!(
        out,
        "Reproduce: `make bench` (full) or `make bench-quick`. Every number below was measured in this run, \
         direct to the backend and through the multiplexer, on this machine, over 127.0.0.1.\n"
    );
    let _ = writeln!(out, "**{pass} PASS, {fail} FAIL, {skip} SKIP.**\n");
    out.push_str(&summary_table(&all));
    let notes: Vec<&Target> = all.iter().filter(|t| !t.note.is_empty()).collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n### What would fix the failures\n");
        for t in notes {
            let _ = writeln!(out, "- **{} / {}** ({}): {}", t.scenario, t.name, t.verdict, t.note);
        }
    }
    for section in &results.sections {
        let _ = writeln!(out, "\n## {}\n", section.title);
        out.push_str(section.markdown.trim_end());
        out.push('\n');
        for plot in &section.plots {
            let _ = writeln!(out, "\n![{plot}]({plot})");
        }
    }
    out
}

/// Writes `<stem>.md` and `<stem>.json` into `dir`.
pub fn write(results: &Results, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|source| Error::File { what: "creating", path: dir.into(), source })?;
    let md = dir.join(format!("{stem}.md"));
    let json = dir.join(format!("{stem}.json"));
    let write = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|source| Error::File { what: "writing", path: path.into(), source })
    };
    write(&md, markdown(results))?;
    write(&json, serde_json::to_string_pretty(results)? + "\n")?;
    Ok(vec![md, json])
}

/// `YYYY-MM-DD` (UTC) of a Unix time, by the civil-from-days algorithm (no calendar crate).
pub fn date(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

pub fn today() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    date(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(951_782_400), "2000-02-29");
        assert_eq!(date(1_700_000_000), "2023-11-14");
        assert_eq!(date(4_102_444_800), "2100-01-01");
    }

    #[test]
    fn markdown_has_the_summary_and_fix_notes() {
        let fail = Target::at_most("1 overhead", "added p50", 9.0, 5.0, "%").note_if_not_passed("cheaper hop");
        let pass = Target::at_least("2 overload", "goodput", 0.99, 0.97, "× capacity");
        let results = Results {
            date: "2026-01-01".into(),
            mode: "full".into(),
            sections: vec![Section {
                title: "1. Overhead".into(),
                targets: vec![fail, pass],
                plots: vec!["x.svg".into()],
                ..Section::default()
            }],
            ..Results::default()
        };
        let text = markdown(&results);
        assert!(text.contains("**1 PASS, 1 FAIL, 0 SKIP.**"), "{text}");
        assert!(text.contains("| 1 overhead | added p50 | 9.00 % | ≤ 5.00 % | **FAIL** |"), "{text}");
        assert!(text.contains("cheaper hop"));
        assert!(text.contains("![x.svg](x.svg)"));
    }
}
