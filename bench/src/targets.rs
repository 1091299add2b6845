//! Targets and verdicts. A target is a measured value against a stated limit; the verdict is
//! arithmetic, never judgement, and a FAIL carries a note saying what would fix it.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rule {
    AtMost,
    AtLeast,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    Pass,
    Fail,
    /// Not measured in this run (the note says why).
    Skip,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// Scenario number and name, e.g. `2 overload`.
    pub scenario: String,
    pub name: String,
    pub measured: Option<f64>,
    pub limit: f64,
    pub unit: String,
    pub rule: Rule,
    pub verdict: Verdict,
    pub note: String,
}

impl Target {
    pub fn new(scenario: &str, name: &str, measured: Option<f64>, rule: Rule, limit: f64, unit: &str) -> Self {
        Self {
            scenario: scenario.into(),
            name: name.into(),
            measured,
            limit,
            unit: unit.into(),
            rule,
            verdict: verdict(measured, rule, limit),
            note: String::new(),
        }
    }

    pub fn at_most(scenario: &str, name: &str, measured: f64, limit: f64, unit: &str) -> Self {
        Self::new(scenario, name, Some(measured), Rule::AtMost, limit, unit)
    }

    pub fn at_least(scenario: &str, name: &str, measured: f64, limit: f64, unit: &str) -> Self {
        Self::new(scenario, name, Some(measured), Rule::AtLeast, limit, unit)
    }

    /// A note shown only when the target failed or was skipped.
    pub fn note_if_not_passed(mut self, note: impl Into<String>) -> Self {
        if self.verdict != Verdict::Pass {
            self.note = note.into();
        }
        self
    }

    /// The stated rule, e.g. `≤ 5 %`.
    pub fn rule_text(&self) -> String {
        let sign = match self.rule {
            Rule::AtMost => "≤",
            Rule::AtLeast => "≥",
        };
        format!("{sign} {} {}", number(self.limit), self.unit).trim_end().to_owned()
    }

    pub fn measured_text(&self) -> String {
        match self.measured {
            Some(v) => format!("{} {}", number(v), self.unit).trim_end().to_owned(),
            None => "not measured".into(),
        }
    }
}

/// `None` (not measured) skips; NaN fails, since a broken measurement must not pass.
pub fn verdict(measured: Option<f64>, rule: Rule, limit: f64) -> Verdict {
    match measured {
        None => Verdict::Skip,
        Some(v) if v.is_nan() => Verdict::Fail,
        Some(v) => {
            let ok = match rule {
                Rule::AtMost => v <= limit,
                Rule::AtLeast => v >= limit,
            };
            if ok { Verdict::Pass } else { Verdict::Fail }
        }
    }
}

/// Three significant digits, without trailing noise.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Counts of (pass, fail, skip).
pub fn tally(targets: &[Target]) -> (usize, usize, usize) {
    let count = |v| targets.iter().filter(|t| t.verdict == v).count();
    (count(Verdict::Pass), count(Verdict::Fail), count(Verdict::Skip))
}

/// Percent added by `through` over `direct` (both in the same unit).
pub fn added_percent(direct: f64, through: f64) -> f64 {
    if direct <= 0.0 { f64::NAN } else { (through - direct) / direct * 100.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_the_rule_including_the_boundary() {
        assert_eq!(verdict(Some(5.0), Rule::AtMost, 5.0), Verdict::Pass);
        assert_eq!(verdict(Some(5.01), Rule::AtMost, 5.0), Verdict::Fail);
        assert_eq!(verdict(Some(0.97), Rule::AtLeast, 0.97), Verdict::Pass);
        assert_eq!(verdict(Some(0.96), Rule::AtLeast, 0.97), Verdict::Fail);
        assert_eq!(verdict(None, Rule::AtLeast, 1.0), Verdict::Skip);
        assert_eq!(verdict(Some(f64::NAN), Rule::AtMost, 1.0), Verdict::Fail);
    }

    #[test]
    fn notes_only_on_failures_and_texts() {
        let pass = Target::at_most("1 overhead", "added p50", 3.0, 5.0, "%").note_if_not_passed("x");
        assert!(pass.note.is_empty());
        let fail = Target::at_least("2 overload", "goodput", 0.5, 0.97, "× capacity").note_if_not_passed("fix");
        assert_eq!(fail.note, "fix");
        assert_eq!(fail.rule_text(), "≥ 0.970 × capacity");
        assert_eq!(pass.measured_text(), "3.00 %");
        assert_eq!(tally(&[pass, fail]), (1, 1, 0));
    }

    #[test]
    fn added_percent_and_numbers() {
        assert!((added_percent(1.0, 1.05) - 5.0).abs() < 1e-9);
        assert!(added_percent(0.0, 1.0).is_nan());
        assert_eq!(number(1234.5), "1234");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(0.01234), "0.012");
    }
}
