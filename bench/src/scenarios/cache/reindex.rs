//! Part 2: a corpus re-indexed through EmbedArrow as the job worker sends it (512 rows a call, 4
//! calls in flight, one connection), then again with a tenth of its rows changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{RecordBatch, StringArray};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Schema};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use teifleet_proto::tei_multiplexer::v1 as mux;
use teifleet_proto::tei_multiplexer::v1::tei_multiplexer_client::TeiMultiplexerClient;
use tokio::time::Instant;

use super::drive::{self, HEADER, vector_hash};
use super::procs::{self, CacheConfig, POOL, PoolLimits, Server};
use super::texts::{Space, text};
use super::{Context, DIMENSIONS};
use crate::admin;
use crate::procs::{Device, Proc, SimModel};
use crate::targets::ratio;
use crate::{Error, Result};

/// The job worker's defaults (`--rows-per-call`, `--calls-in-flight`).
pub const ROWS_PER_CALL: usize = 512;
pub const CALLS_IN_FLIGHT: usize = 4;
/// One row in this many changes between the runs.
pub const CHANGE_EVERY: u64 = 10;
/// The second run's TEI work, at most this × the first's.
pub const WORK_LIMIT: f64 = 0.15;
/// The local tier that holds the whole corpus: 200,000 answers of 384 f32 are about 320 MB.
pub const LOCAL_SIZE: &str = "512Mi";
/// The sidecar's `--memory-limit`, so that its request budget (half of it) is untouched by a
/// local tier of [`LOCAL_SIZE`].
pub const MEMORY_LIMIT: &str = "2Gi";

/// A fast TEI (a big batch every millisecond): the corpus is about the cache, not the device.
pub fn backend() -> SimModel {
    SimModel {
        max_concurrent_requests: 1024,
        max_batch_requests: Some(256),
        fixed_latency: Duration::from_millis(1),
        per_token_latency: Duration::ZERO,
        device: Device::Sleep,
    }
}

pub fn limits() -> PoolLimits {
    PoolLimits { max_in_flight: 512, max_queued: 4096, queue_timeout_ms: 5000 }
}

/// One pass over the corpus.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Pass {
    pub seconds: f64,
    /// Inputs TEI embedded meanwhile (the simulator's admitted count).
    pub tei_inputs: u64,
    /// Rows answered with a vector, and those whose vector differs from a fresh embedding of
    /// their text.
    pub rows_ok: u64,
    pub wrong: u64,
    /// Rows that failed, calls that failed (with why, the first few).
    pub failed_rows: u64,
    pub failed_calls: Vec<String>,
    /// The calls' `x-teifleet-cache` headers.
    pub headers: BTreeMap<String, u64>,
    /// The local tier after the pass: entries, bytes, evictions so far, answers not kept
    /// (`teifleet_cache_stored_total{tier="local_skipped"}`: no room, or the memory budget).
    #[serde(default)]
    pub local: [f64; 4],
}

impl Pass {
    pub fn rows_per_s(&self) -> f64 {
        ratio(self.rows_ok as f64, self.seconds)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reindex {
    pub backend: SimModel,
    pub limits: PoolLimits,
    pub rows: u64,
    pub changed: u64,
    /// Which tier held the corpus, in words.
    pub tier: String,
    pub first: Pass,
    pub second: Pass,
}

impl Reindex {
    pub fn work_ratio(&self) -> f64 {
        ratio(self.second.tei_inputs as f64, self.first.tei_inputs as f64)
    }
}

/// Row `row`'s text in pass `pass` (1 or 2): every [`CHANGE_EVERY`]th row changes in pass 2.
fn space_of(row: u64, pass: u32) -> Space {
    if pass == 2 && row % CHANGE_EVERY == 3 { Space::Changed } else { Space::Corpus }
}

pub async fn run(ctx: &Context) -> Result<Reindex> {
    let rows = ctx.pick(50_000u64, 200_000);
    let sim = crate::procs::start_sim_with(
        &ctx.bins,
        "cache-reindex-sim",
        &backend(),
        &[format!("--dimensions={DIMENSIONS}")],
    )
    .await?;
    let config = CacheConfig { size: LOCAL_SIZE.into(), store: None };
    let limits = limits();
    let mux = procs::start_mux(
        &ctx.bins,
        "cache-reindex-mux",
        &sim,
        limits,
        Some(&config),
        &[format!("--memory-limit={MEMORY_LIMIT}")],
    )
    .await?;
    ctx.say(&format!("cache: re-index of {rows} rows through EmbedArrow, first pass"));
    let first = pass(&sim, &mux, rows, 1).await?;
    ctx.say(&format!(
        "cache: first pass {:.0} rows/s, TEI embedded {}; second pass",
        first.rows_per_s(),
        first.tei_inputs
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = pass(&sim, &mux, rows, 2).await?;
    ctx.say(&format!("cache: second pass {:.0} rows/s, TEI embedded {}", second.rows_per_s(), second.tei_inputs));
    Ok(Reindex {
        backend: backend(),
        limits,
        rows,
        changed: (0..rows).filter(|r| r % CHANGE_EVERY == 3).count() as u64,
        tier: format!("the local tier alone (size {LOCAL_SIZE}, --memory-limit {MEMORY_LIMIT}), no store"),
        first,
        second,
    })
}

/// One pass: every row once, [`ROWS_PER_CALL`] a call, [`CALLS_IN_FLIGHT`] calls at once on one
/// connection, every answer's rows checked.
async fn pass(sim: &Proc, mux: &Server, rows: u64, pass: u32) -> Result<Pass> {
    let channel = drive::channels(&mux.url(), 1).await?.remove(0);
    let _ = admin::reset_sim_stats(sim.admin_addr()).await;
    let started = Instant::now();
    let calls: Vec<(u64, u64)> =
        (0..rows).step_by(ROWS_PER_CALL).map(|from| (from, (from + ROWS_PER_CALL as u64).min(rows))).collect();
    let outcomes: Vec<Result<Call, String>> = futures::stream::iter(calls)
        .map(|(from, to)| {
            let channel = channel.clone();
            async move { embed_arrow(channel, from, to, pass).await }
        })
        .buffer_unordered(CALLS_IN_FLIGHT)
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stats = admin::sim_stats(sim.admin_addr()).await.ok_or_else(|| Error::Process("no simulator stats".into()))?;
    let mut local = [0.0; 4];
    for (slot, (name, labels)) in local.iter_mut().zip([
        ("teifleet_cache_local_entries", &[][..]),
        ("teifleet_cache_local_bytes", &[][..]),
        ("teifleet_cache_evictions_total", &[][..]),
        ("teifleet_cache_stored_total", &[("tier", "local_skipped")][..]),
    ]) {
        *slot = super::metric(mux, name, labels).await;
    }
    let mut out = Pass { seconds, tei_inputs: stats.requests_admitted, local, ..Pass::default() };
    for outcome in outcomes {
        match outcome {
            Ok(call) => {
                out.rows_ok += call.ok;
                out.wrong += call.wrong;
                out.failed_rows += call.failed;
                *out.headers.entry(call.header).or_default() += 1;
            }
            Err(why) => {
                if out.failed_calls.len() < 3 {
                    out.failed_calls.push(why);
                }
                out.failed_rows += ROWS_PER_CALL as u64;
            }
        }
    }
    Ok(out)
}

struct Call {
    ok: u64,
    wrong: u64,
    failed: u64,
    header: String,
}

/// Rows `from..to` of pass `pass` as one EmbedArrow call, its answer checked row by row.
async fn embed_arrow(channel: tonic::transport::Channel, from: u64, to: u64, pass: u32) -> Result<Call, String> {
    let spaces: Vec<Space> = (from..to).map(|row| space_of(row, pass)).collect();
    let texts: Vec<String> = (from..to).zip(&spaces).map(|(row, space)| text(*space, row)).collect();
    let request = mux::EmbedArrowRequest {
        target: Some(mux::Target { routing: Some(mux::target::Routing::InstanceName(POOL.into())) }),
        arrow_ipc: ipc(&texts)?.into(),
        truncate: true,
        ..mux::EmbedArrowRequest::default()
    };
    let mut client = TeiMultiplexerClient::new(channel).max_decoding_message_size(64 << 20);
    let answer = client.embed_arrow(request).await.map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    let header = answer.metadata().get(HEADER).and_then(|v| v.to_str().ok()).unwrap_or("absent").to_owned();
    let vectors = vectors(&answer.get_ref().arrow_ipc)?;
    if vectors.len() != texts.len() {
        return Err(format!("{} rows answered for {} sent", vectors.len(), texts.len()));
    }
    let mut call = Call { ok: 0, wrong: 0, failed: 0, header };
    for ((row, space), got) in (from..to).zip(&spaces).zip(vectors) {
        match got {
            Some(hash) => {
                call.ok += 1;
                call.wrong += u64::from(hash != drive::expected_hash(*space, row));
            }
            None => call.failed += 1,
        }
    }
    Ok(call)
}

/// `texts` as an Arrow IPC stream of one RecordBatch with a `text` column.
fn ipc(texts: &[String]) -> Result<Vec<u8>, String> {
    let schema = Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, true)]));
    let column = StringArray::from_iter_values(texts.iter());
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(column)]).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &schema).map_err(|e| e.to_string())?;
    writer.write(&batch).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    drop(writer);
    Ok(out)
}

/// Each row's vector hash, or `None` where the row failed.
fn vectors(ipc: &[u8]) -> Result<Vec<Option<u64>>, String> {
    crate::scenarios::bulk::arrow_rows(ipc, |values| Some(vector_hash(values)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenth_of_the_rows_change_in_the_second_pass() {
        let changed = (0..1000).filter(|r| space_of(*r, 2) == Space::Changed).count();
        assert_eq!(changed, 100);
        assert!((0..1000).all(|r| space_of(r, 1) == Space::Corpus));
    }
}
