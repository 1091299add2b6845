//! The results of one `make bench` run: the machine, and per scenario its typed result and its
//! targets' verdicts. Written as `<date>.json` (for tools and regressions); the renderer writes
//! the Markdown and the plots from the same value.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::procs::Features;
pub use crate::scenarios::Outcome;
use crate::scenarios::{Context, Scenario};
use crate::targets::Target;
use crate::{Error, Result};

/// One scenario's outcome, or why there is none, and its targets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Section {
    pub scenario: Scenario,
    pub outcome: Option<Outcome>,
    /// Why the scenario could not measure.
    pub error: Option<String>,
    pub targets: Vec<Target>,
}

impl Section {
    pub fn measured(scenario: Scenario, outcome: Outcome) -> Self {
        Self { scenario, targets: outcome.targets(), outcome: Some(outcome), error: None }
    }

    /// Runs one scenario; a scenario that could not measure still gets a section saying why.
    pub async fn run(ctx: &Context, scenario: Scenario) -> Self {
        match scenario.run(ctx).await {
            Ok(outcome) => Self::measured(scenario, outcome),
            Err(error) => {
                ctx.say(&format!("{}: not measured: {error}", scenario.key()));
                Self::not_measured(scenario, &error.to_string())
            }
        }
    }

    pub fn not_measured(scenario: Scenario, error: &str) -> Self {
        let note = format!("not measured: {error}");
        let targets = scenario.planned_targets().into_iter().map(|t| t.note_if_not_passed(note.clone())).collect();
        Self { scenario, outcome: None, error: Some(error.to_owned()), targets }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub os: String,
}

/// The 1-minute load average (`/proc/loadavg`).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
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
    /// Optional capabilities the build had (a scenario that needed one it lacked says so).
    #[serde(default)]
    pub features: Features,
    /// The 1-minute load average before the first scenario: other work competing for the cores,
    /// which makes every timing noisier (the run's own load is not in it yet).
    #[serde(default)]
    pub load_before: Option<f64>,
    /// How the measured binaries were built: the `BUILD` file `tools/pgo.sh` writes beside them
    /// (which ones are profile-guided, from which profile), or empty for a plain release build.
    #[serde(default)]
    pub build: String,
    pub sections: Vec<Section>,
}

impl Results {
    pub fn targets(&self) -> Vec<Target> {
        self.sections.iter().flat_map(|s| s.targets.iter().cloned()).collect()
    }
}

/// Writes `<stem>.json` into `dir`.
pub fn write_json(results: &Results, dir: &Path, stem: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|source| Error::File { what: "creating", path: dir.into(), source })?;
    let path = dir.join(format!("{stem}.json"));
    let text = serde_json::to_string_pretty(results)? + "\n";
    std::fs::write(&path, text).map_err(|source| Error::File { what: "writing", path: path.clone(), source })?;
    Ok(path)
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
    use crate::targets::Verdict;

    #[test]
    fn dates() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(951_782_400), "2000-02-29");
        assert_eq!(date(1_700_000_000), "2023-11-14");
        assert_eq!(date(4_102_444_800), "2100-01-01");
    }

    #[test]
    fn a_scenario_that_could_not_measure_skips_its_targets_with_the_reason() {
        let section = Section::not_measured(Scenario::Burst, "the simulator would not start");
        assert_eq!(section.targets.len(), 2);
        assert!(section.targets.iter().all(|t| t.verdict == Verdict::Skip));
        assert!(section.targets[0].note.contains("would not start"));
    }

    #[test]
    fn results_round_trip_through_json() {
        let results = Results {
            date: "2026-01-01".into(),
            sections: vec![Section::not_measured(Scenario::Cost, "x")],
            ..Results::default()
        };
        let text = serde_json::to_string(&results).unwrap();
        let back: Results = serde_json::from_str(&text).unwrap();
        assert_eq!(back.sections, results.sections);
    }
}
