//! Scenario 18, bulk (issue 32: a bulk call uses the whole pool): a pool of 3 replicas as scenario
//! 15 starts them (each a GPU-like simulated TEI behind its own multiplexer in static mode with the
//! same share, naming the others with `--sibling`, and the same `--peer-key-file`), and three ways
//! of sending it texts, one after the other in one run:
//!
//! - **EmbedStream**: one `tei.v1.Embed/EmbedStream` call of N messages on one HTTP/2 connection to
//!   replica 1 (the sidecar spreads a stream's messages over the siblings as sub-batches);
//! - **EmbedArrow**: one `tei_multiplexer.v1.TeiMultiplexer/EmbedArrow` call, an Arrow IPC
//!   RecordBatch of N rows (a `text` column), on one connection to replica 1;
//! - **balanced unary** (the reference): closed-loop unary `Embed` calls spread over the three
//!   replicas, enough of them to keep every replica's share busy.
//!
//! Targets: each bulk call's texts/s ≥ 0.9 × the balanced unary texts/s, and every row answered
//! once, in order (each answer is checked against the simulator's deterministic vector of its
//! row's text). Each replica's completed count (the simulators' `/stats`) shows who served.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array as _, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Schema};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use teifleet_load::{LoadConfig, Report};
use teifleet_proto::tei_multiplexer::v1 as mux;
use teifleet_proto::tei_multiplexer::v1::tei_multiplexer_client::TeiMultiplexerClient;
use teifleet_proto::v1::EmbedRequest;
use teifleet_proto::v1::embed_client::EmbedClient;
use tokio::time::Instant;

use super::adaptive::require_flag;
use super::setup::sibling_pool;
use super::spillover::Spills;
use super::{Context, Measurement, Scenario, gpu_model, measure};
use crate::admin::{self, SimStats};
use crate::procs::{self, Device, MuxLimits, Proc, SimModel};
use crate::targets::{Rule, Target, ratio};
use crate::{Error, Result};

/// Replicas of the pool.
pub const REPLICAS: usize = 3;
/// Each bulk call's texts/s, at least this × the balanced unary load's.
pub const LIMIT: f64 = 0.9;
/// Words per text: short texts, scenario 15's size.
pub const TOKENS: usize = 16;
/// Length of the simulators' vectors (`tei-sim --dimensions`): MiniLM's, bge-small's and
/// e5-small's, so a 100,000-row Arrow answer is 153.6 MB of f32, streamed by the sidecar.
pub const DIMENSIONS: usize = 384;
/// The client's largest message, in and out: room for a 100,000-row answer at [`DIMENSIONS`]
/// (a client reading such an answer raises its own limit, as tei-manager's clients do). The
/// multiplexers run with their default `--max-message-bytes`.
pub const CLIENT_MAX_MESSAGE: usize = 256 << 20;
/// Closed-loop callers of the balanced unary load per replica: two shares each, so every TEI holds
/// its share and as many wait their turn at its multiplexer.
pub const UNARY_CALLERS_PER_REPLICA: usize = 32;
/// Connections of the balanced unary load per replica.
pub const UNARY_CONNECTIONS_PER_REPLICA: usize = 2;
/// The pool's name in static mode (`--pool`'s default): the EmbedArrow call's target.
const POOL: &str = "default";

/// Every replica's limits: scenario 15's (scenario 2's).
pub fn limits() -> MuxLimits {
    super::spillover::limits()
}

/// One way of sending texts to the pool, and what each replica's TEI did meanwhile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// Texts sent: rows, messages or unary calls.
    pub sent: u64,
    /// Answers received (rows, messages or calls), whatever they were.
    pub answered: u64,
    /// Texts answered OK once, in their place, with their own text's vector.
    pub in_order: u64,
    /// From the call's start to its last answer (the unary load: first send to last answer).
    pub seconds: f64,
    /// How the call ended: `OK`, or its gRPC code and message (the unary load: answers by code).
    pub outcome: String,
    /// Each replica's simulator over this side (counters reset before it), replica 1 first.
    pub sims: Vec<SimStats>,
    /// Replica 1's `teifleet_spills_total` over this side, by result (inputs).
    pub spills: Spills,
}

impl Side {
    pub fn texts_per_s(&self) -> f64 {
        ratio(self.in_order as f64, self.seconds)
    }

    /// Texts sent that did not come back once, OK and in order, plus answers beyond those sent.
    pub fn wrong(&self) -> u64 {
        self.sent.saturating_sub(self.in_order) + self.answered.saturating_sub(self.sent)
    }

    /// The least-served replica's share of the texts its TEI completed, as a fraction of a third.
    pub fn least_share(&self) -> f64 {
        let done: Vec<f64> = self.sims.iter().map(|s| s.completed as f64).collect();
        let total: f64 = done.iter().sum();
        ratio(done.iter().copied().fold(f64::INFINITY, f64::min) * done.len() as f64, total)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bulk {
    pub backend: SimModel,
    pub limits: MuxLimits,
    pub replicas: usize,
    /// Texts in each bulk call.
    pub texts: usize,
    /// The balanced unary load's callers and connections, over every replica.
    pub unary_callers: usize,
    pub unary_connections: usize,
    pub stream: Side,
    pub arrow: Side,
    pub balanced: Side,
    /// Replica 1's multiplexer's peak resident memory (VmHWM) after the three, bytes (0 when
    /// unreadable).
    pub peak_rss_bytes: u64,
}

impl Bulk {
    pub fn stream_vs_balanced(&self) -> f64 {
        ratio(self.stream.texts_per_s(), self.balanced.texts_per_s())
    }

    pub fn arrow_vs_balanced(&self) -> f64 {
        ratio(self.arrow.texts_per_s(), self.balanced.texts_per_s())
    }

    pub fn sides(&self) -> [(&'static str, &Side); 3] {
        [
            ("EmbedStream, one call on one connection to replica 1", &self.stream),
            ("EmbedArrow, one call on one connection to replica 1", &self.arrow),
            ("balanced unary Embed over the 3 replicas (reference)", &self.balanced),
        ]
    }
}

const STREAM_NAME: &str = "EmbedStream on one connection to replica 1: texts/s ÷ balanced unary";
const ARROW_NAME: &str = "EmbedArrow on one connection to replica 1: texts/s ÷ balanced unary";
const STREAM_ORDER: &str = "EmbedStream: messages not answered once, in order";
const ARROW_ORDER: &str = "EmbedArrow: rows not answered once, in order (per-row errors included)";

impl Measurement for Bulk {
    const KEY: &'static str = "bulk";
    const TITLE: &'static str =
        "Bulk calls: one EmbedStream or EmbedArrow call through one replica gets the whole pool";

    async fn run(ctx: &Context) -> Result<Self> {
        require_flag(&ctx.bins, "--peer-key-file", " (no peer key for spills)")?;
        let backend = gpu_model(512, Device::Sleep);
        let limits = limits();
        let texts = ctx.pick(20_000, 100_000);
        let key = procs::write_peer_key(&ctx.bins, "bulk")?;
        let sim_extra = [format!("--dimensions={DIMENSIONS}")];
        let mux_extra = [format!("--peer-key-file={}", key.display())];
        ctx.say(&format!("bulk: starting {REPLICAS} replicas with siblings"));
        let (sims, muxes) = sibling_pool(ctx, "bulk", REPLICAS, &backend, &sim_extra, &limits, &mux_extra).await?;
        let url = muxes[0].url();
        let all: Arc<Vec<String>> = Arc::new((0..texts).map(|i| teifleet_load::inputs::query(i, TOKENS)).collect());
        // The spill path's connections open at the first spill, and each sibling's window grows
        // from its answers: one short call of each kind first.
        let warm = Arc::new(all[..ctx.pick(1_000, 2_000)].to_vec());
        ctx.say("bulk: warming up (a short stream and a short Arrow call)");
        embed_stream(&url, warm.clone(), first_two).await?;
        embed_arrow(&url, &warm, first_two).await?;

        ctx.say(&format!("bulk: one EmbedStream of {texts} messages to replica 1"));
        let stream = side(&sims, &muxes[0], || async {
            let got = embed_stream(&url, all.clone(), first_two).await?;
            Ok(got.judged(&all))
        })
        .await?;
        ctx.say(&format!("bulk: EmbedStream {:.0} texts/s, {} in order", stream.texts_per_s(), stream.in_order));
        tokio::time::sleep(Duration::from_secs(1)).await;

        ctx.say(&format!("bulk: one EmbedArrow of {texts} rows to replica 1"));
        let arrow = side(&sims, &muxes[0], || async {
            let got = embed_arrow(&url, &all, first_two).await?;
            Ok(got.judged(&all))
        })
        .await?;
        ctx.say(&format!("bulk: EmbedArrow {:.0} texts/s, {} in order", arrow.texts_per_s(), arrow.in_order));
        tokio::time::sleep(Duration::from_secs(1)).await;

        // Last: a full pool refuses spills, which shrinks replica 1's windows on its siblings.
        let unary_callers = UNARY_CALLERS_PER_REPLICA * REPLICAS;
        let unary_connections = UNARY_CONNECTIONS_PER_REPLICA * REPLICAS;
        let seconds = ctx.pick(8, 20);
        ctx.say(&format!(
            "bulk: balanced unary, {unary_callers} closed-loop callers over {unary_connections} connections, {seconds} s"
        ));
        let urls: Vec<String> = muxes.iter().map(Proc::url).collect();
        let config = LoadConfig {
            more_targets: urls[1..].to_vec(),
            connections: unary_connections,
            duration: Duration::from_secs(seconds),
            inputs: super::words(TOKENS),
            grace: Duration::from_secs(10),
            ..LoadConfig::closed(urls[0].clone(), unary_callers, 100_000_000)
        };
        let balanced = side(&sims, &muxes[0], || async {
            let report = measure(config).await?;
            Ok(unary_judged(&report))
        })
        .await?;
        ctx.say(&format!("bulk: balanced unary {:.0} texts/s", balanced.texts_per_s()));
        let peak_rss_bytes = peak_rss(muxes[0].pid()).unwrap_or(0);
        Ok(Bulk {
            backend,
            limits,
            replicas: REPLICAS,
            texts,
            unary_callers,
            unary_connections,
            stream,
            arrow,
            balanced,
            peak_rss_bytes,
        })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Bulk.label();
        let per_replica =
            |side: &Side| side.sims.iter().map(|s| s.completed.to_string()).collect::<Vec<_>>().join(" / ");
        let slow = |side: &Side, what: &str| {
            format!(
                "{what} got {:.0} texts/s against {:.0} from balanced unary calls; the replicas completed {} of its \
                 texts (replica 1 first); replica 1's spilled inputs: {:.0} served by a sibling, {:.0} refused, {:.0} \
                 unreachable. A bulk call must keep every replica's share full, with sub-batches in flight at each \
                 sibling while the last ones are answered (forward/bulk.rs's window and sub-batch size), and a \
                 sibling's window must reopen to a whole sub-batch after refusals (forward/siblings.rs)",
                side.texts_per_s(),
                self.balanced.texts_per_s(),
                per_replica(side),
                side.spills.served,
                side.spills.refused,
                side.spills.unreachable
            )
        };
        let lost = |side: &Side| {
            format!(
                "{} sent, {} answered, {} of them in place with their text's vector; the call ended {}",
                side.sent, side.answered, side.in_order, side.outcome
            )
        };
        vec![
            Target::at_least(&scenario, STREAM_NAME, self.stream_vs_balanced(), LIMIT, "×")
                .note_if_not_passed(slow(&self.stream, "the stream")),
            Target::at_least(&scenario, ARROW_NAME, self.arrow_vs_balanced(), LIMIT, "×")
                .note_if_not_passed(slow(&self.arrow, "the Arrow call")),
            Target::at_most(&scenario, STREAM_ORDER, self.stream.wrong() as f64, 0.0, "messages")
                .note_if_not_passed(lost(&self.stream)),
            Target::at_most(&scenario, ARROW_ORDER, self.arrow.wrong() as f64, 0.0, "rows")
                .note_if_not_passed(lost(&self.arrow)),
            Target::info(&scenario, "balanced unary over the 3 replicas", Some(self.balanced.texts_per_s()), "texts/s"),
            Target::info(
                &scenario,
                "EmbedStream: least-served replica's share ÷ an even third",
                Some(self.stream.least_share()),
                "×",
            ),
            Target::info(
                &scenario,
                "EmbedArrow: least-served replica's share ÷ an even third",
                Some(self.arrow.least_share()),
                "×",
            ),
            Target::info(
                &scenario,
                "replica 1's multiplexer, peak RSS",
                (self.peak_rss_bytes > 0).then(|| self.peak_rss_bytes as f64 / (1 << 20) as f64),
                "MiB",
            ),
        ]
    }

    fn planned_targets() -> Vec<Target> {
        let scenario = Scenario::Bulk.label();
        vec![
            Target::new(&scenario, STREAM_NAME, None, Rule::AtLeast, LIMIT, "×"),
            Target::new(&scenario, ARROW_NAME, None, Rule::AtLeast, LIMIT, "×"),
            Target::new(&scenario, STREAM_ORDER, None, Rule::AtMost, 0.0, "messages"),
            Target::new(&scenario, ARROW_ORDER, None, Rule::AtMost, 0.0, "rows"),
        ]
    }
}

/// What one side measured, before the simulators' counters are added.
struct Judged {
    sent: u64,
    answered: u64,
    in_order: u64,
    seconds: f64,
    outcome: String,
}

/// Runs `go` with every simulator's counters reset before and read after, and replica 1's spills.
async fn side<F, Fut>(sims: &[Proc], mux: &Proc, go: F) -> Result<Side>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Judged>>,
{
    for sim in sims {
        admin::reset_sim_stats(sim.admin_addr()).await;
    }
    let before = spills(mux).await;
    let judged = go().await?;
    let after = spills(mux).await;
    let mut stats = Vec::with_capacity(sims.len());
    for sim in sims {
        let read = admin::sim_stats(sim.admin_addr()).await;
        stats.push(read.ok_or_else(|| Error::Process("the simulator's /stats did not answer".into()))?);
    }
    let Judged { sent, answered, in_order, seconds, outcome } = judged;
    let spills = Spills {
        served: after.served - before.served,
        refused: after.refused - before.refused,
        unreachable: after.unreachable - before.unreachable,
    };
    Ok(Side { sent, answered, in_order, seconds, outcome, sims: stats, spills })
}

/// Replica 1's spills so far, by result.
async fn spills(mux: &Proc) -> Spills {
    let count = |result| async move {
        admin::metric_sum_matching(mux.admin_addr(), "teifleet_spills_total", &[("result", result)])
            .await
            .unwrap_or(0.0)
    };
    Spills { served: count("served").await, refused: count("refused").await, unreachable: count("unreachable").await }
}

fn unary_judged(report: &Report) -> Judged {
    let outcome = report.codes.iter().map(|(code, n)| format!("{code} {n}")).collect::<Vec<_>>().join(", ");
    Judged { sent: report.sent, answered: report.answered, in_order: report.ok, seconds: report.elapsed_s, outcome }
}

/// What a bulk call brought back: per answer in the order received, what the call's `keep` made
/// of its vector (here the first two components; `None` for a row that failed or a vector of the
/// wrong length).
pub(crate) struct Got<T = [f32; 2]> {
    pub(crate) answers: Vec<Option<T>>,
    pub(crate) seconds: f64,
    pub(crate) outcome: String,
}

impl Got {
    /// Judged after the clock stopped: answer k must be text k's vector (the simulator's is a
    /// function of the text alone).
    fn judged(&self, texts: &[String]) -> Judged {
        let in_order = texts
            .iter()
            .zip(&self.answers)
            .filter(|(text, got)| {
                got.is_some_and(|got| {
                    let want = teifleet_tei_sim::embedding_for(text, DIMENSIONS);
                    want[..2] == got
                })
            })
            .count();
        Judged {
            sent: texts.len() as u64,
            answered: self.answers.len() as u64,
            in_order: in_order as u64,
            seconds: self.seconds,
            outcome: self.outcome.clone(),
        }
    }
}

fn first_two(vector: &[f32]) -> Option<[f32; 2]> {
    (vector.len() == DIMENSIONS).then(|| [vector[0], vector[1]])
}

fn outcome(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// How long a bulk call of `n` texts may take: far beyond what the pool needs.
fn allowed(n: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(n as u64 * 5)
}

pub(crate) async fn channel(url: &str) -> Result<tonic::transport::Channel> {
    let channel = teifleet_load::connect(url, 1).await?.pop();
    channel.ok_or_else(|| Error::Process(format!("no connection to {url}")))
}

/// One EmbedStream call of every text in `texts`, on one new connection to `url`, sent as fast as
/// HTTP/2 flow control lets them go, its answers read as they come (each vector as `keep` makes it).
pub(crate) async fn embed_stream<T>(
    url: &str,
    texts: Arc<Vec<String>>,
    keep: impl Fn(&[f32]) -> Option<T>,
) -> Result<Got<T>> {
    let mut client = EmbedClient::new(channel(url).await?)
        .max_decoding_message_size(CLIENT_MAX_MESSAGE)
        .max_encoding_message_size(CLIENT_MAX_MESSAGE);
    let n = texts.len();
    let messages = futures::stream::iter(0..n).map(move |i| EmbedRequest {
        inputs: texts[i].clone(),
        truncate: true,
        ..EmbedRequest::default()
    });
    let mut answers = Vec::with_capacity(n);
    let started = Instant::now();
    let call = async {
        let mut stream = client.embed_stream(messages).await?.into_inner();
        while let Some(answer) = stream.message().await? {
            answers.push(keep(&answer.embeddings));
        }
        Ok::<_, tonic::Status>(())
    };
    let outcome = match tokio::time::timeout(allowed(n), call).await {
        Ok(Ok(())) => "OK".to_owned(),
        Ok(Err(status)) => outcome(&status),
        Err(_) => format!("cut off by the client after {} s", allowed(n).as_secs()),
    };
    Ok(Got { answers, seconds: started.elapsed().as_secs_f64(), outcome })
}

/// `texts` as an Arrow IPC stream of one RecordBatch with a `text` column, as tei-manager's
/// clients send it.
fn ipc(texts: &[String]) -> Result<Vec<u8>> {
    let broken = |e: arrow_schema::ArrowError| Error::Process(format!("writing the Arrow request: {e}"));
    let schema = Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, true)]));
    let column = StringArray::from_iter_values(texts.iter());
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(column)]).map_err(broken)?;
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &schema).map_err(broken)?;
    writer.write(&batch).map_err(broken)?;
    writer.finish().map_err(broken)?;
    drop(writer);
    Ok(out)
}

/// One EmbedArrow call of every text in `texts` on one new connection to `url` (the IPC written
/// before the clock starts, the answer read after it stops, each row's vector as `keep` makes it).
pub(crate) async fn embed_arrow<T>(url: &str, texts: &[String], keep: impl Fn(&[f32]) -> Option<T>) -> Result<Got<T>> {
    let mut client = TeiMultiplexerClient::new(channel(url).await?)
        .max_decoding_message_size(CLIENT_MAX_MESSAGE)
        .max_encoding_message_size(CLIENT_MAX_MESSAGE);
    let request = mux::EmbedArrowRequest {
        target: Some(mux::Target { routing: Some(mux::target::Routing::InstanceName(POOL.into())) }),
        arrow_ipc: ipc(texts)?.into(),
        truncate: true,
        ..mux::EmbedArrowRequest::default()
    };
    let started = Instant::now();
    let answer = tokio::time::timeout(allowed(texts.len()), client.embed_arrow(request)).await;
    let seconds = started.elapsed().as_secs_f64();
    let answer = match answer {
        Ok(Ok(answer)) => answer.into_inner(),
        Ok(Err(status)) => return Ok(Got { answers: Vec::new(), seconds, outcome: outcome(&status) }),
        Err(_) => {
            let outcome = format!("cut off by the client after {} s", allowed(texts.len()).as_secs());
            return Ok(Got { answers: Vec::new(), seconds, outcome });
        }
    };
    let answers = match arrow_rows(&answer.arrow_ipc, keep) {
        Ok(answers) => answers,
        Err(why) => return Ok(Got { answers: Vec::new(), seconds, outcome: format!("unreadable answer: {why}") }),
    };
    Ok(Got { answers, seconds, outcome: "OK".into() })
}

/// Each row of an EmbedArrow answer as `keep` makes it of its vector, or `None` where the row
/// failed (a null vector, or an `error`) or `keep` finds nothing to keep.
pub fn arrow_rows<T>(ipc: &[u8], keep: impl Fn(&[f32]) -> Option<T>) -> std::result::Result<Vec<Option<T>>, String> {
    let mut reader = StreamReader::try_new(std::io::Cursor::new(ipc), None).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for batch in reader.by_ref() {
        let batch = batch.map_err(|e| e.to_string())?;
        let vectors = batch
            .column_by_name("embeddings")
            .and_then(|c| c.as_any().downcast_ref::<FixedSizeListArray>())
            .ok_or("no FixedSizeList `embeddings` column")?;
        let errors = batch.column_by_name("error").and_then(|c| c.as_any().downcast_ref::<StringArray>());
        for row in 0..batch.num_rows() {
            let failed = vectors.is_null(row) || errors.is_some_and(|e| e.is_valid(row));
            let vector = vectors.value(row);
            let values = vector.as_any().downcast_ref::<Float32Array>();
            out.push(match (failed, values) {
                (false, Some(values)) => keep(values.values()),
                _ => None,
            });
        }
    }
    Ok(out)
}

/// A process's peak resident memory (`VmHWM`), bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Results for the tests of the targets and the renderer.
#[cfg(test)]
pub(crate) mod example {
    use super::*;

    fn stats(completed: u64) -> SimStats {
        SimStats { completed, ..SimStats::default() }
    }

    pub(crate) fn side(in_order: u64, seconds: f64, done: [u64; 3]) -> Side {
        Side {
            sent: 20_000,
            answered: in_order,
            in_order,
            seconds,
            outcome: "OK".into(),
            sims: done.iter().map(|&d| stats(d)).collect(),
            spills: Spills { served: 13_000.0, refused: 2.0, unreachable: 0.0 },
        }
    }

    /// The stream's and the Arrow call's seconds for 20,000 texts; the reference 1,000 texts/s.
    pub(crate) fn result(stream_s: f64, arrow_s: f64, arrow_in_order: u64) -> Bulk {
        Bulk {
            backend: gpu_model(512, Device::Sleep),
            limits: limits(),
            replicas: 3,
            texts: 20_000,
            unary_callers: 96,
            unary_connections: 6,
            stream: side(20_000, stream_s, [6_700, 6_650, 6_650]),
            arrow: side(arrow_in_order, arrow_s, [10_000, 5_000, 5_000]),
            balanced: Side { sent: 8_000, outcome: "OK 8000".into(), ..side(8_000, 8.0, [2_700, 2_650, 2_650]) },
            peak_rss_bytes: 80 << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::example::result;
    use super::*;
    use crate::targets::Verdict;

    #[test]
    fn each_bulk_call_is_judged_against_balanced_unary_and_on_its_rows() {
        let t = result(20.0, 21.0, 20_000).targets();
        assert_eq!(t.len(), 8);
        assert!((t[0].measured.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(t[0].verdict, Verdict::Pass);
        assert!((t[1].measured.unwrap() - 1000.0 / 21.0 * 20.0 / 1000.0).abs() < 1e-9);
        assert_eq!(t[1].verdict, Verdict::Pass);
        assert_eq!((t[2].measured, t[2].verdict), (Some(0.0), Verdict::Pass));
        assert_eq!((t[3].measured, t[3].verdict), (Some(0.0), Verdict::Pass));
        assert!((t[4].measured.unwrap() - 1000.0).abs() < 1e-9);
        assert!((t[6].measured.unwrap() - 0.75).abs() < 1e-9);
        assert_eq!(t[7].measured, Some(80.0));
        assert_eq!(Bulk::planned_targets().len(), 4);
    }

    #[test]
    fn a_slow_call_and_a_lost_row_fail() {
        let t = result(40.0, 21.0, 19_999).targets();
        assert_eq!(t[0].verdict, Verdict::Fail);
        assert!(t[0].note.contains("got 500 texts/s against 1000"), "{}", t[0].note);
        assert_eq!((t[3].measured, t[3].verdict), (Some(1.0), Verdict::Fail));
        assert!(t[3].note.contains("19999 of them in place"), "{}", t[3].note);
    }

    #[test]
    fn answers_are_judged_by_their_place() {
        let texts: Vec<String> = (0..3).map(|i| teifleet_load::inputs::query(i, TOKENS)).collect();
        let vector = |i: usize| first_two(&teifleet_tei_sim::embedding_for(&texts[i], DIMENSIONS));
        let got = Got { answers: vec![vector(0), vector(2), vector(1)], seconds: 1.0, outcome: "OK".into() };
        let judged = got.judged(&texts);
        assert_eq!((judged.sent, judged.answered, judged.in_order), (3, 3, 1));
    }

    #[test]
    fn the_arrow_request_and_answer_round_trip() {
        let texts = vec!["a".to_owned(), "b".to_owned()];
        let ipc = ipc(&texts).unwrap();
        let batch = StreamReader::try_new(std::io::Cursor::new(ipc), None).unwrap().next().unwrap().unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.schema().field(0).name(), "text");
    }
}
