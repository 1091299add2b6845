//! Row 7 of the real-TEI scenario: the bulk path at 384 dimensions (scenario 18's calls, on a real
//! TEI). Through the shared static sidecar (default `--max-message-bytes`, default memory limit),
//! in one run: closed-loop unary Embeds from 64 callers (row 1's load) before and after, as the
//! reference (the bulk calls' texts, drawn uniformly); one `EmbedArrow` call of N rows; one `EmbedStream` call of N messages. Each bulk
//! call must keep up with the unary callers (≥ 0.9 ×, scenario 18's target) and answer every row
//! once, in its place, with the vector TEI itself gives that text: every answer must be 384 long,
//! and a sample of rows spread over the call is compared with TEI's unary Embed direct.
//!
//! N is far below scenario 18's 20,000: a CPU TEI serves about 40 texts a second, so 20,000 rows
//! would take 500 s or more per call; N is sized to about 20 s of it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use teifleet_load::inputs::{Inputs, QueryMix};
use teifleet_proto::v1::EmbedRequest;
use teifleet_proto::v1::embed_client::EmbedClient;

use super::throughput::CALLERS;
use super::{Run, Shared, TOKENS, closed};
use crate::Result;
use crate::scenarios::bulk::{self, Got, channel, embed_arrow, embed_stream};
use crate::scenarios::{Context, measure};
use crate::targets::{Rule, Target, ratio};

/// all-MiniLM-L6-v2's vector length.
pub const DIMENSIONS: usize = 384;
/// Each bulk call's texts/s, at least this × the balanced unary texts/s (scenario 18's target).
pub const LIMIT: f64 = bulk::LIMIT;
/// A sampled row's vector matches TEI direct's when their cosine is at least this: the same
/// model on the same CPU, batched differently, differs in float rounding only.
pub const COSINE_LIMIT: f64 = 0.9999;
/// Rows of each bulk call compared with TEI direct, spread evenly over the call.
pub const SAMPLE: usize = 20;
/// Texts of each bulk call and of each unary reference: about 20 s of a 40 texts/s TEI (full).
pub const FULL_TEXTS: usize = 800;
pub const QUICK_TEXTS: usize = 200;
/// Scenario 18's rows per call, beside which N is named.
pub const SIM_TEXTS: usize = 20_000;

pub const ARROW: &str = "EmbedArrow of N rows through the sidecar: texts/s ÷ balanced unary";
pub const STREAM: &str = "EmbedStream of N messages through the sidecar: texts/s ÷ balanced unary";
pub const ARROW_ROWS: &str = "EmbedArrow: rows not answered once, in place, with TEI's vector";
pub const STREAM_ROWS: &str = "EmbedStream: messages not answered once, in place, with TEI's vector";
const BALANCED: &str = "balanced unary through the sidecar, 64 callers";

/// One bulk call, judged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    /// Texts sent: rows or messages.
    pub sent: u64,
    /// Answers received, whatever they were.
    pub answered: u64,
    /// Answers OK with a vector of [`DIMENSIONS`], among the first `sent` (a row's place is its
    /// text's: the sample below checks that the vector there is that text's).
    pub full: u64,
    /// Rows compared with TEI direct, and how many of them matched ([`COSINE_LIMIT`]).
    pub sampled: u64,
    pub matched: u64,
    /// The least cosine among the sampled rows that had a vector.
    pub least_cosine: Option<f64>,
    /// From the call's start to its last answer.
    pub seconds: f64,
    /// `OK`, or how the call ended.
    pub outcome: String,
}

impl Call {
    pub fn texts_per_s(&self) -> f64 {
        ratio(self.full as f64, self.seconds)
    }

    /// Texts without a full vector, answers beyond those sent, and sampled rows whose vector is
    /// not their text's.
    pub fn wrong(&self) -> u64 {
        self.sent.saturating_sub(self.full)
            + self.answered.saturating_sub(self.sent)
            + self.sampled.saturating_sub(self.matched)
    }
}

/// Row 7's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RealBulk {
    /// Texts in each bulk call, and in each unary reference run.
    pub texts: usize,
    pub callers: usize,
    /// The unary reference, before the bulk calls and after them.
    pub balanced: Vec<Run>,
    pub arrow: Call,
    pub stream: Call,
}

impl RealBulk {
    /// The reference: the mean of the unary runs' texts/s, so drift over the row favours neither
    /// bulk call.
    pub fn balanced_per_s(&self) -> f64 {
        ratio(self.balanced.iter().map(|r| r.ok_per_s).sum(), self.balanced.len() as f64)
    }

    pub fn arrow_ratio(&self) -> f64 {
        ratio(self.arrow.texts_per_s(), self.balanced_per_s())
    }

    pub fn stream_ratio(&self) -> f64 {
        ratio(self.stream.texts_per_s(), self.balanced_per_s())
    }

    pub fn targets(&self, scenario: &str) -> Vec<Target> {
        let unary = self.balanced.iter().map(|r| format!("{:.1}", r.ok_per_s)).collect::<Vec<_>>().join(" and ");
        let slow = |call: &Call, what: &str| {
            format!(
                "{what} of {} texts got {:.1} texts/s against {:.1} from {} unary callers (runs of {unary}): the \
                 sidecar must keep TEI's batch of 4 full through one bulk call as 64 callers do",
                self.texts,
                call.texts_per_s(),
                self.balanced_per_s(),
                self.callers
            )
        };
        let lost = |call: &Call| {
            format!(
                "{} sent, {} answered, {} with a {DIMENSIONS}-long vector; {} of {} sampled rows matched TEI direct \
                 (least cosine {}); the call ended {}",
                call.sent,
                call.answered,
                call.full,
                call.matched,
                call.sampled,
                call.least_cosine.map_or("n/a".into(), |c| format!("{c:.6}")),
                call.outcome
            )
        };
        vec![
            Target::at_least(scenario, ARROW, self.arrow_ratio(), LIMIT, "×")
                .note_if_not_passed(slow(&self.arrow, "the EmbedArrow call")),
            Target::at_least(scenario, STREAM, self.stream_ratio(), LIMIT, "×")
                .note_if_not_passed(slow(&self.stream, "the EmbedStream call")),
            Target::at_most(scenario, ARROW_ROWS, self.arrow.wrong() as f64, 0.0, "rows")
                .note_if_not_passed(lost(&self.arrow)),
            Target::at_most(scenario, STREAM_ROWS, self.stream.wrong() as f64, 0.0, "messages")
                .note_if_not_passed(lost(&self.stream)),
            Target::info(scenario, BALANCED, Some(self.balanced_per_s()), "texts/s"),
        ]
    }
}

/// Row 7's targets, unmeasured.
pub fn planned(scenario: &str) -> Vec<Target> {
    vec![
        Target::new(scenario, ARROW, None, Rule::AtLeast, LIMIT, "×"),
        Target::new(scenario, STREAM, None, Rule::AtLeast, LIMIT, "×"),
        Target::new(scenario, ARROW_ROWS, None, Rule::AtMost, 0.0, "rows"),
        Target::new(scenario, STREAM_ROWS, None, Rule::AtMost, 0.0, "messages"),
    ]
}

/// The rows compared with TEI direct: `sample` of `texts`, evenly spread, the first and the last
/// among them.
pub fn sampled_rows(texts: usize, sample: usize) -> Vec<usize> {
    if texts == 0 || sample == 0 {
        return Vec::new();
    }
    if sample >= texts {
        return (0..texts).collect();
    }
    let last = (texts - 1) as f64;
    let steps = (sample - 1).max(1) as f64;
    let mut rows: Vec<usize> = (0..sample).map(|k| (k as f64 * last / steps).round() as usize).collect();
    rows.dedup();
    rows
}

/// The cosine of two vectors (`None` when their lengths differ or one is all zeros).
pub fn cosine(a: &[f32], b: &[f32]) -> Option<f64> {
    if a.len() != b.len() {
        return None;
    }
    let (mut dot, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        aa += x * x;
        bb += y * y;
    }
    (aa > 0.0 && bb > 0.0).then(|| dot / (aa.sqrt() * bb.sqrt()))
}

/// A bulk call's answers judged: `reference` holds TEI direct's vector of each sampled row.
pub(crate) fn judge(got: &Got<Vec<f32>>, sent: usize, reference: &[(usize, Vec<f32>)]) -> Call {
    let full = got.answers.iter().take(sent).filter(|a| a.is_some()).count();
    let cosines: Vec<Option<f64>> = reference
        .iter()
        .map(|(row, want)| got.answers.get(*row).and_then(Option::as_ref).and_then(|v| cosine(v, want)))
        .collect();
    let matched = cosines.iter().filter(|c| c.is_some_and(|c| c >= COSINE_LIMIT)).count();
    let least_cosine = cosines.iter().flatten().copied().reduce(f64::min);
    Call {
        sent: sent as u64,
        answered: got.answers.len() as u64,
        full: full as u64,
        sampled: reference.len() as u64,
        matched: matched as u64,
        least_cosine,
        seconds: got.seconds,
        outcome: got.outcome.clone(),
    }
}

fn whole(vector: &[f32]) -> Option<Vec<f32>> {
    (vector.len() == DIMENSIONS).then(|| vector.to_vec())
}

/// TEI's own vector of each sampled row, from its unary Embed direct (the request the stream's
/// messages are: truncated, TEI's default normalisation; the cosine ignores the Arrow call's).
async fn reference(tei: &str, texts: &[String], rows: &[usize]) -> Result<Vec<(usize, Vec<f32>)>> {
    let mut client = EmbedClient::new(channel(tei).await?);
    let mut out = Vec::with_capacity(rows.len());
    for &row in rows {
        let request = EmbedRequest { inputs: texts[row].clone(), truncate: true, ..EmbedRequest::default() };
        let answer = client
            .embed(request)
            .await
            .map_err(|s| crate::Error::Process(format!("TEI direct refused the reference Embed of row {row}: {s}")))?;
        out.push((row, answer.into_inner().embeddings));
    }
    Ok(out)
}

/// Row 7: the unary reference, one EmbedArrow call, one EmbedStream call, the reference again.
pub async fn measure_row(ctx: &Context, shared: &Shared) -> Result<RealBulk> {
    let texts = ctx.pick(QUICK_TEXTS, FULL_TEXTS);
    let sidecar = shared.sidecar.url();
    let all: Arc<Vec<String>> = Arc::new((0..texts).map(|i| teifleet_load::inputs::query(i, TOKENS)).collect());
    let rows = sampled_rows(texts, SAMPLE);
    ctx.say(&format!("real tei 7: TEI direct's vectors of {} sampled rows", rows.len()));
    let reference = reference(&shared.tei.url(), &all, &rows).await?;
    // The bulk paths' first use on this sidecar: one short call of each kind.
    let warm = Arc::new(all[..8.min(texts)].to_vec());
    embed_arrow(&sidecar, &warm, whole).await?;
    embed_stream(&sidecar, warm, whole).await?;

    let unary = || async {
        // The bulk calls' texts, drawn uniformly, so both sides embed texts of the same length.
        let mut config = closed(&sidecar, CALLERS, texts as u64, std::time::Duration::from_secs(300));
        config.inputs = Inputs::Queries(QueryMix { exponent: 0.0, distinct: texts, tokens: TOKENS });
        measure(config).await.map(|r| Run::from(&r))
    };
    ctx.say(&format!("real tei 7: balanced unary, {texts} calls from {CALLERS} callers"));
    let before = unary().await?;
    ctx.say(&format!("real tei 7: one EmbedArrow of {texts} rows"));
    let arrow = judge(&embed_arrow(&sidecar, &all, whole).await?, texts, &reference);
    ctx.say(&format!("real tei 7: one EmbedStream of {texts} messages"));
    let stream = judge(&embed_stream(&sidecar, all.clone(), whole).await?, texts, &reference);
    ctx.say(&format!("real tei 7: balanced unary again, {texts} calls from {CALLERS} callers"));
    let after = unary().await?;
    let result = RealBulk { texts, callers: CALLERS, balanced: vec![before, after], arrow, stream };
    ctx.say(&format!(
        "real tei 7: balanced {:.1} texts/s; EmbedArrow {:.1} ({:.3}×, {} wrong); EmbedStream {:.1} ({:.3}×, {} wrong)",
        result.balanced_per_s(),
        result.arrow.texts_per_s(),
        result.arrow_ratio(),
        result.arrow.wrong(),
        result.stream.texts_per_s(),
        result.stream_ratio(),
        result.stream.wrong()
    ));
    Ok(result)
}
