//! What a sidecar learned of TEI's batches and how it let ingest in, read from its metrics while
//! queries run beside ingest (scenarios 19 and 20, the real-TEI lanes row): the batch-time line it
//! learned, the places of TEI's next batch that leaves ingest, and the rule that let each ingest
//! call in flight, so a row says why ingest got what it got.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use teifleet_testkit::{http, prom};

use crate::targets::Target;

const LET_IN: &str = "teifleet_ingest_let_in_total";
/// `teifleet_ingest_let_in_total`'s reasons (docs/metrics.md).
const LET_IN_REASONS: [&str; 6] = ["no_queries", "idle_tei", "stale_count", "empty_next_batch", "places", "floor_turn"];
/// How often the sidecar's metrics are read while the queries run beside ingest.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The sidecar's learned batch time and ingest's places while the queries ran beside ingest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Learned {
    /// TEI's batch time as the sidecar's line at the end, ms fixed and ms an input (absent: not
    /// learned, or a sidecar without those metrics).
    pub fixed_ms: Option<f64>,
    pub per_input_ms: Option<f64>,
    /// `teifleet_ingest_places` read every [`SAMPLE_EVERY`]: how many reads, its median, and the
    /// share of reads at 0 (ingest only into an idle TEI).
    pub samples: usize,
    pub places_p50: Option<f64>,
    pub places_zero_share: Option<f64>,
    /// Ingest calls let in flight while the queries ran, by the rule that let them
    /// (`teifleet_ingest_let_in_total`'s `reason`).
    #[serde(default)]
    pub let_in: std::collections::BTreeMap<String, f64>,
}

impl Learned {
    /// An info row: the median of ingest's places, this text as its note.
    pub fn places_row(&self, scenario: &str, name: &str) -> Target {
        Target { note: self.text(), ..Target::info(scenario, name, self.places_p50, "") }
    }

    /// The learned line in words.
    pub fn line_text(&self) -> String {
        match (self.fixed_ms, self.per_input_ms) {
            (Some(fixed), Some(per_input)) => format!("{fixed:.1} ms + {per_input:.2} ms an input"),
            _ => "none learned".to_owned(),
        }
    }

    /// All of it in words: the line, the places, and the rules that let ingest in.
    pub fn text(&self) -> String {
        let line = match (self.fixed_ms, self.per_input_ms) {
            (Some(_), Some(_)) => format!("TEI's batch time learned as {}", self.line_text()),
            _ => "no batch-time line learned".to_owned(),
        };
        let places = match (self.places_p50, self.places_zero_share) {
            (Some(p50), Some(zero)) => format!(
                "{line}; ingest's places in TEI's next batch: median {p50:.0}, 0 in {:.0}% of {} reads",
                zero * 100.0,
                self.samples
            ),
            _ => format!("{line}; ingest's places not read"),
        };
        let let_in: Vec<String> =
            self.let_in.iter().filter(|(_, n)| **n > 0.0).map(|(why, n)| format!("{why} {n:.0}")).collect();
        match let_in.is_empty() {
            true => places,
            false => format!("{places}; ingest let in by {}", let_in.join(", ")),
        }
    }
}

/// The first series of the gauge `name`, if the exposition has one.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && line.split(['{', ' ']).next() == Some(name))
        .find_map(|line| line.rsplit(' ').next()?.parse().ok())
}

/// Runs `work`, reading the sidecar at `admin` every [`SAMPLE_EVERY`] until it is done.
pub async fn during<T>(admin: std::net::SocketAddr, work: impl Future<Output = T>) -> (T, Learned) {
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let working = async {
        let done = work.await;
        let _ = stop.send(());
        done
    };
    tokio::join!(working, watch(admin, stopped))
}

/// Reads the sidecar at `admin` every [`SAMPLE_EVERY`] until `stop` fires.
async fn watch(admin: std::net::SocketAddr, stop: tokio::sync::oneshot::Receiver<()>) -> Learned {
    let mut places = Vec::new();
    let (mut first, mut last) = (None, None);
    let reading = async {
        loop {
            if let Some(text) = http::get(admin, "/metrics").await {
                places.extend(gauge(&text, "teifleet_ingest_places"));
                first.get_or_insert_with(|| text.clone());
                last = Some(text);
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    };
    tokio::select! {
        () = reading => {}
        _ = stop => {}
    }
    places.sort_by(f64::total_cmp);
    let ms = |name| last.as_deref().and_then(|text| gauge(text, name)).map(|s| s * 1e3);
    let let_in_by = |text: &Option<String>, why: &str| {
        text.as_deref().map_or(0.0, |text| prom::sum_matching(text, LET_IN, &[("reason", why)]))
    };
    let let_in =
        LET_IN_REASONS.iter().map(|why| ((*why).to_owned(), let_in_by(&last, why) - let_in_by(&first, why))).collect();
    Learned {
        fixed_ms: ms("teifleet_tei_batch_fixed_seconds"),
        per_input_ms: ms("teifleet_tei_batch_per_input_seconds"),
        samples: places.len(),
        places_p50: places.get(places.len() / 2).copied(),
        places_zero_share: (!places.is_empty())
            .then(|| places.iter().filter(|p| **p == 0.0).count() as f64 / places.len() as f64),
        let_in,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_is_its_own_first_series_not_a_longer_names() {
        let text = "# HELP teifleet_ingest_places x\n# TYPE teifleet_ingest_places gauge\n\
                    teifleet_ingest_places_total 9\nteifleet_ingest_places{pool=\"default\"} 13\n\
                    teifleet_ingest_places{pool=\"other\"} 2\n";
        assert_eq!(gauge(text, "teifleet_ingest_places"), Some(13.0));
        assert_eq!(gauge(text, "teifleet_tei_batch_fixed_seconds"), None);
    }

    #[test]
    fn the_text_names_the_line_the_places_and_only_the_rules_that_let_ingest_in() {
        let learned = Learned {
            fixed_ms: Some(11.1),
            per_input_ms: Some(0.36),
            samples: 150,
            places_p50: Some(13.0),
            places_zero_share: Some(0.0),
            let_in: [("places".to_owned(), 1750.0), ("idle_tei".to_owned(), 0.0)].into_iter().collect(),
        };
        assert_eq!(
            learned.text(),
            "TEI's batch time learned as 11.1 ms + 0.36 ms an input; ingest's places in TEI's next batch: \
             median 13, 0 in 0% of 150 reads; ingest let in by places 1750"
        );
        let row = learned.places_row("20 job", "places");
        assert_eq!((row.measured, row.note.as_str()), (Some(13.0), learned.text().as_str()));
        assert_eq!(Learned::default().text(), "no batch-time line learned; ingest's places not read");
    }
}
