//! Lookups in Prometheus' text exposition format, as `/metrics` serves it.

/// The value of the one series written exactly as `series` (name and labels, as the exposition
/// writes them), if present.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of every series of metric `name`, whatever its labels; 0 when there is none.
pub fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.split(['{', ' ']).next() == Some(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The sum of the series of metric `name` that carry every one of `labels` (others may differ).
pub fn sum_matching(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let wanted: Vec<String> = labels.iter().map(|(label, value)| format!("{label}=\"{value}\"")).collect();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.split(['{', ' ']).next() == Some(name))
        .filter(|line| {
            let labels = line.split_once('{').and_then(|(_, rest)| rest.split_once('}')).map_or("", |(l, _)| l);
            wanted.iter().all(|pair| labels.split(',').any(|label| label == pair))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP teifleet_queued x\n# TYPE teifleet_queued gauge\n\
                        teifleet_queued{pool=\"a\",priority=\"standard\"} 7\n\
                        teifleet_queued{pool=\"a\",priority=\"critical\"} 3\n\
                        teifleet_queued_total 100\nteifleet_leader 1\n";

    #[test]
    fn finds_one_series_exactly() {
        assert_eq!(value(TEXT, "teifleet_queued{pool=\"a\",priority=\"critical\"}"), Some(3.0));
        assert_eq!(value(TEXT, "teifleet_leader"), Some(1.0));
        // A prefix of another series' name is not that series.
        assert_eq!(value(TEXT, "teifleet_queued"), None);
        assert_eq!(value(TEXT, "missing"), None);
    }

    #[test]
    fn sums_a_metric_over_its_labels_only() {
        assert_eq!(sum(TEXT, "teifleet_queued"), 10.0);
        assert_eq!(sum(TEXT, "teifleet_queued_total"), 100.0);
        assert_eq!(sum(TEXT, "missing"), 0.0);
    }

    #[test]
    fn sums_the_series_with_given_labels() {
        assert_eq!(sum_matching(TEXT, "teifleet_queued", &[("pool", "a")]), 10.0);
        assert_eq!(sum_matching(TEXT, "teifleet_queued", &[("priority", "critical")]), 3.0);
        assert_eq!(sum_matching(TEXT, "teifleet_queued", &[("pool", "b")]), 0.0);
    }
}
