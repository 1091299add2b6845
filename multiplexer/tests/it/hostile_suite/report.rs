//! Each attack's verdicts, row by row: every row is attacked and reported, and the test fails at
//! the end naming each row that did not hold, with its figure.

use super::sidecar::{PEAK_BOUND_KIB, Sidecar};

/// Growth of the peak that is the allocator's and the runtime's, not the request's: below this
/// any request passes the amplification check.
pub const NOISE_KIB: u64 = 8 * 1024;
/// How many times its own bytes one request may grow the sidecar's peak (above [`NOISE_KIB`]):
/// a body is held once as it arrives and once more decoded; an answer as big again is fine. Per
/// input copies (a field repeated in every upstream message), or an inflated body, are far above.
pub const AMPLIFICATION: u64 = 8;

pub struct Report {
    attack: &'static str,
    lines: Vec<(String, bool, String)>,
}

impl Report {
    pub fn new(attack: &'static str) -> Self {
        Self { attack, lines: Vec::new() }
    }

    pub fn check(&mut self, row: &str, holds: bool, figure: String) {
        eprintln!("[hostile] {} | {row} | {} | {figure}", self.attack, if holds { "pass" } else { "FAIL" });
        self.lines.push((row.to_owned(), holds, figure));
    }

    /// The checks every attack on a sidecar ends a row with: alive, no panic logged (a dead
    /// sidecar is replaced so that the next row is attacked).
    pub async fn after_row(&mut self, row: &str, sidecar: &mut Sidecar) {
        let panics = sidecar.new_panics();
        if !panics.is_empty() {
            self.check(row, false, format!("panicked: {panics:?}"));
        }
        if !sidecar.alive() {
            self.check(row, false, "the sidecar died".to_owned());
        }
        sidecar.refresh().await;
    }

    pub fn finish(self) {
        let failed: Vec<String> = self
            .lines
            .iter()
            .filter(|(_, holds, _)| !holds)
            .map(|(row, _, figure)| format!("  {row}: {figure}"))
            .collect();
        let rows = self.lines.len();
        assert!(failed.is_empty(), "{}: {} of {rows} checks failed:\n{}", self.attack, failed.len(), failed.join("\n"));
    }
}

/// What the peak came to while a request of `bytes` was served: (holds, figure).
pub fn memory(baseline_kib: u64, peak_kib: u64, bytes: usize) -> (bool, String) {
    let growth = peak_kib.saturating_sub(baseline_kib);
    let allowed = NOISE_KIB + AMPLIFICATION * (bytes as u64).div_ceil(1024);
    let ratio = (growth * 1024) as f64 / bytes.max(1) as f64;
    let holds = peak_kib < PEAK_BOUND_KIB && growth <= allowed;
    let figure = format!(
        "{:.2} MB sent, peak {} MB (+{} MB, {ratio:.1}x the request)",
        bytes as f64 / 1e6,
        peak_kib / 1000,
        growth / 1000
    );
    (holds, figure)
}

/// What the peak came to while compressed requests of `bytes` on the wire were served: (holds,
/// figure). A body inflated and charged to the memory budget as it inflates is what the product
/// should do, and grows the peak far past its wire bytes; the amplification ratio, which holds
/// uncompressed bodies to their own size, says nothing of it. The peak bound does, with
/// the clear answer the caller checks.
pub fn compressed_memory(baseline_kib: u64, peak_kib: u64, bytes: usize) -> (bool, String) {
    let growth = peak_kib.saturating_sub(baseline_kib);
    let figure = format!(
        "{:.2} MB sent compressed, peak {} MB (+{} MB; bound {} MB)",
        bytes as f64 / 1e6,
        peak_kib / 1000,
        growth / 1000,
        PEAK_BOUND_KIB / 1000
    );
    (peak_kib < PEAK_BOUND_KIB, figure)
}
