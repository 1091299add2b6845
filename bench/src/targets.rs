//! Targets and verdicts. A target is a measured value against a stated limit; the verdict is
//! arithmetic, never judgement, and a FAIL carries a note saying what would fix it. Some figures
//! are worth tracking without a limit (an instruction count, the floor a machine allows): they
//! are reported as INFO rows, kept in the JSON so regressions show.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rule {
    AtMost,
    AtLeast,
    /// No limit: reported for the record.
    Report,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    Pass,
    Fail,
    /// Not measured in this run (the note says why).
    Skip,
    /// A figure reported without a limit.
    Info,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
            Self::Info => "INFO",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// Scenario number and name, e.g. `2 overload`.
    pub scenario: String,
    pub name: String,
    pub measured: Option<f64>,
    /// NaN for INFO rows and for limits that could not be computed.
    #[serde(with = "nan_as_null")]
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

    /// A figure without a limit.
    pub fn info(scenario: &str, name: &str, measured: Option<f64>, unit: &str) -> Self {
        Self::new(scenario, name, measured, Rule::Report, f64::NAN, unit)
    }

    /// Marks a measured target as not meaningful in this run (e.g. a simulator without the device
    /// model the target assumes): the number stays, the verdict becomes SKIP with `why`.
    pub fn skip_because(mut self, why: impl Into<String>) -> Self {
        self.verdict = Verdict::Skip;
        self.note = why.into();
        self
    }

    /// A note shown only when the target failed or was skipped.
    pub fn note_if_not_passed(mut self, note: impl Into<String>) -> Self {
        if matches!(self.verdict, Verdict::Fail | Verdict::Skip) && self.note.is_empty() {
            self.note = note.into();
        }
        self
    }

    /// The stated rule, e.g. `≤ 5 %`.
    pub fn rule_text(&self) -> String {
        let sign = match self.rule {
            Rule::AtMost => "≤",
            Rule::AtLeast => "≥",
            Rule::Report => return "—".into(),
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

/// JSON has no NaN: serde_json writes it as `null`; read `null` back as NaN.
pub mod nan_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(*v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// `None` (not measured) skips; NaN fails, since a broken measurement must not pass.
pub fn verdict(measured: Option<f64>, rule: Rule, limit: f64) -> Verdict {
    match measured {
        _ if rule == Rule::Report => Verdict::Info,
        None => Verdict::Skip,
        Some(v) if v.is_nan() => Verdict::Fail,
        Some(v) => {
            let ok = match rule {
                Rule::AtMost => v <= limit,
                Rule::AtLeast => v >= limit,
                Rule::Report => true,
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

/// `a / b`, NaN when `b` is not positive (a ratio that cannot be formed must not pass).
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

/// The median of `values` (NaN when empty): per-round figures are summarised by it, so one noisy
/// round on a shared machine cannot move the result.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 }
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
    fn info_rows_have_no_limit_and_do_not_count() {
        let info = Target::info("5 cost", "instructions per call", Some(123_456.0), "instructions");
        assert_eq!(info.verdict, Verdict::Info);
        assert_eq!(info.rule_text(), "—");
        assert_eq!(info.measured_text(), "123456 instructions");
        assert_eq!(Target::info("x", "y", None, "").verdict, Verdict::Info);
        assert_eq!(tally(&[info]), (0, 0, 0));
        let skipped = Target::at_least("7 storm", "goodput", 1.0, 0.9, "×").skip_because("needs spin");
        assert_eq!((skipped.verdict, skipped.note.as_str()), (Verdict::Skip, "needs spin"));
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 5.0]), 5.0);
        assert!(median(&[]).is_nan());
        assert_eq!(ratio(3.0, 2.0), 1.5);
        assert!(ratio(1.0, 0.0).is_nan());
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
