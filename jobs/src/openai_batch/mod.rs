//! `--input-format=openai-batch` (issue 47): each JSONL line is one request of OpenAI's Batch API
//! for `/v1/embeddings`. Shards are byte ranges, as for JSONL; each line is judged ([`line`]), its
//! `body` sent verbatim to the pool's OpenAI route ([`call`]), a few lines at once, and each line
//! answered in input order into the shard's two files ([`output`]): the pool's answers in
//! `part-NNNNNN.jsonl`, every line refused or answered with an error in
//! `part-NNNNNN.errors.jsonl`. Every line is one row; a line in the errors file is a failed row.

pub mod call;
pub mod line;
pub mod output;

use bytes::Bytes;
use futures::StreamExt as _;
use object_store::ObjectStoreExt as _;
use tokio_util::sync::CancellationToken;

pub use call::{BatchClient, BatchSettings, Reply};

use crate::Result;
use crate::input::lines::{MAX_LINE_BYTES, read_lines};
use crate::output::writer::PartCounts;
use crate::plan::{Shard, ShardPart};
use crate::store::Store;
use output::{JsonlFile, answer_json, error_line, errors_path, json_string, line_id, output_path, response_line};

/// The code of a line whose answer was over `--max-answer-bytes`' bound.
pub const RESPONSE_TOO_LARGE: &str = "response_too_large";
/// The code of a line the pool answered 2xx with something other than JSON.
pub const INVALID_RESPONSE: &str = "invalid_response";

/// One line's outcome: its encoded output line, and whether it goes to the errors file.
struct Outcome {
    line: Vec<u8>,
    failed: bool,
}

/// Does one shard: reads its lines, answers each, and writes the errors file, then the output
/// file (whose existence marks the shard done).
pub async fn run_shard(
    input: &Store,
    output: &Store,
    shard: &Shard,
    client: &BatchClient,
    calls_in_flight: usize,
    stop: &CancellationToken,
) -> Result<PartCounts> {
    let ShardPart::ByteRange { start, end } = shard.part else {
        unreachable!("openai-batch input is planned in byte ranges");
    };
    let lines = read_lines(input, &shard.object, start..end).await?;
    let output_url = output.url_of(output.root());
    let (output_url, number) = (output_url.as_str(), shard.number);
    let input_url = input.url_of(&shard.object.path);
    let input_url = input_url.as_str();
    let rows: Vec<Row<'_>> = lines
        .iter()
        .enumerate()
        .map(|(index, (offset, line))| Row { index: index as u64, offset, line })
        .filter(|row| !is_blank(&row.line))
        .collect();
    let mut errors = JsonlFile::new(output, errors_path(output.root(), number));
    let mut answers = JsonlFile::new(output, output_path(output.root(), number));
    let rows = &rows;
    // Rows go in by position: a closure taking a borrowed line makes the future's Send-ness
    // depend on a higher-ranked lifetime the compiler cannot prove, and the worker could not be
    // spawned (as in `crate::shard`).
    let mut outcomes = futures::stream::iter(0..rows.len())
        .map(|row| async move {
            let Row { index, offset, line } = rows[row];
            let place = Place { url: input_url, offset };
            answer_line(client, &line_id(output_url, number, index), line, place).await
        })
        .buffered(calls_in_flight.max(1));
    loop {
        let outcome = tokio::select! {
            biased;
            () = stop.cancelled() => return Err(crate::Error::Stopped { shard: number }),
            outcome = outcomes.next() => outcome,
        };
        let Some(outcome) = outcome else { break };
        let outcome = outcome?;
        let file = if outcome.failed { &mut errors } else { &mut answers };
        file.write(&outcome.line).await?;
    }
    let failed = errors.finish().await?;
    let rows = failed + answers.finish().await?;
    Ok(PartCounts { rows, failed })
}

/// One line of a shard that is a row.
#[derive(Debug, Clone, Copy)]
struct Row<'a> {
    /// Its index among the shard's lines (blank ones included): with the shard, its id.
    index: u64,
    /// Its file offset.
    offset: u64,
    /// Its bytes, or the length of a line over the bound.
    line: Result<&'a [u8], u64>,
}

/// A line of only whitespace is no row (as for JSONL); a line over the bound is one.
fn is_blank(line: &Result<&[u8], u64>) -> bool {
    matches!(line, Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace))
}

/// Where a line is in the input: said in the error of a line without a usable custom_id, the
/// only way to find it (its id is a hash).
#[derive(Debug, Clone, Copy)]
struct Place<'a> {
    url: &'a str,
    offset: u64,
}

/// Judges one line, and sends it if it passes.
async fn answer_line(client: &BatchClient, id: &str, line: Result<&[u8], u64>, place: Place<'_>) -> Result<Outcome> {
    let refused = |custom_id: Option<&str>, code: &str, message: &str| {
        let line = match custom_id {
            Some(_) => error_line(id, custom_id, code, message),
            None => {
                let message = format!("{message} (the line at byte {} of {})", place.offset, place.url);
                error_line(id, None, code, &message)
            }
        };
        Outcome { line, failed: true }
    };
    let line = match line {
        Ok(line) => line,
        Err(bytes) => {
            let message = format!("the line is {bytes} bytes, over the {MAX_LINE_BYTES} a line may have");
            return Ok(refused(None, line::INVALID_REQUEST, &message));
        }
    };
    let request = match line::judge(line, &client.settings().model) {
        Ok(request) => request,
        Err(refusal) => return Ok(refused(refusal.custom_id.as_deref(), refusal.code, &refusal.message)),
    };
    let custom_id = request.custom_id.as_str();
    let body = Bytes::copy_from_slice(request.body.get().as_bytes());
    let (status, body) = match client.post(body).await? {
        Reply::Answered { status, body } => (status, body),
        Reply::TooLarge { bytes } => {
            let size = bytes.map_or_else(|| "larger".to_owned(), |bytes| format!("{bytes} bytes"));
            let limit = client.settings().max_answer_bytes;
            let message = format!("the pool's answer is {size}, over the {limit} bytes one line's answer may have");
            return Ok(refused(Some(custom_id), RESPONSE_TOO_LARGE, &message));
        }
    };
    let json = match (answer_json(&body), status.is_success()) {
        (Ok(json), _) => json,
        (Err(error), true) => {
            let message = format!("the pool answered {status} with something other than JSON: {error}");
            return Ok(refused(Some(custom_id), INVALID_RESPONSE, &message));
        }
        (Err(_), false) => json_string(&String::from_utf8_lossy(&body)),
    };
    let line = response_line(id, custom_id, status.as_u16(), &json);
    Ok(Outcome { line, failed: !status.is_success() })
}

/// The counts of a shard whose output file exists (the mark of a finished shard): its rows are
/// its input's lines (re-read: a shard's range, not its answers, which may be far larger), and
/// its failed rows the lines of its errors file. `None` when the shard is not done, or its errors
/// file is missing (it is then redone).
pub async fn finished_shard(input: &Store, output: &Store, shard: &Shard) -> Result<Option<PartCounts>> {
    let done = output_path(output.root(), shard.number);
    match output.objects().head(&done).await {
        Ok(_) => {}
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(error) => return Err(output.error(&done, error)),
    }
    let errors_at = errors_path(output.root(), shard.number);
    let errors = match output.objects().get(&errors_at).await {
        Ok(got) => got.bytes().await.map_err(|error| output.error(&errors_at, error))?,
        Err(object_store::Error::NotFound { .. }) => {
            tracing::warn!(url = %output.url_of(&errors_at), "a finished shard lacks its errors file; redoing it");
            return Ok(None);
        }
        Err(error) => return Err(output.error(&errors_at, error)),
    };
    let failed = errors.iter().filter(|byte| **byte == b'\n').count() as u64;
    let ShardPart::ByteRange { start, end } = shard.part else { return Ok(None) };
    let lines = read_lines(input, &shard.object, start..end).await?;
    let rows = lines.iter().filter(|(_, line)| !is_blank(line)).count() as u64;
    Ok(Some(PartCounts { rows, failed }))
}
