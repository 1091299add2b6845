//! One shard, start to finish: read its rows, send the embeddable ones in calls of at most
//! rows-per-call and at most the bytes a message to and from the pool may hold (a few in flight,
//! answers taken in order), write each answered run of rows into the part, and put the part. A
//! text too large for any call is its row's error; a call the pool refuses for its size is split
//! in halves until it passes or is one row, whose error that refusal becomes.

use std::ops::Range;

use arrow_array::Array as _;
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::embed::sizing::request_bytes;
use crate::embed::{Answer, CallSize, PoolClient, TooLarge};
use crate::input::{RowPiece, RowText, read_shard};
use crate::output::columns::assemble;
use crate::output::writer::{PartCounts, PartWriter};
use crate::output::{part_path, part_schema};
use crate::plan::Shard;
use crate::settings::{Dtype, Fields};
use crate::store::Store;
use crate::{Error, Result};

/// What every shard of a worker shares.
#[derive(Debug)]
pub struct ShardRunner<'a> {
    pub input: &'a Store,
    pub output: &'a Store,
    pub pool: &'a PoolClient,
    pub fields: &'a Fields,
    pub rows_per_call: usize,
    pub calls_in_flight: usize,
    /// The largest gRPC message the pool takes and sends.
    pub max_message_bytes: u64,
}

/// Consecutive rows of one piece that go out as one call: at most [`CallSize`]'s embeddable rows
/// and request bytes, with the failed rows among them riding along (they are written, not sent).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    piece: usize,
    rows: Range<usize>,
}

impl ShardRunner<'_> {
    /// Embeds the shard and writes its part, with vectors `dimensions` long.
    /// Stops with [`Error::Stopped`] when `stop` is cancelled while calls are out.
    pub async fn run(&self, shard: &Shard, dimensions: usize, stop: &CancellationToken) -> Result<PartCounts> {
        let mut rows = read_shard(self.input, shard, self.fields).await?;
        let dtype = self.pool.settings().options.dtype;
        let size = CallSize::new(self.rows_per_call, self.max_message_bytes, dimensions, dtype);
        refuse_oversized_texts(&mut rows.pieces, &size);
        let schema = part_schema(&rows.id_type, dtype, dimensions);
        let path = part_path(self.output.root(), shard.number);
        let mut writer = PartWriter::new(schema.clone(), self.output.url_of(&path))?;
        let pieces = &rows.pieces;
        let chunks = chunks(pieces, &size);
        // Chunks go in by value: a closure over `&Chunk` makes the future's Send-ness depend on
        // a higher-ranked lifetime the compiler cannot prove, and the worker could not be spawned.
        let mut answers = futures::stream::iter(chunks)
            .map(|chunk| async move { self.embed_chunk(&pieces[chunk.piece].texts, chunk, dimensions, dtype).await })
            .buffered(self.calls_in_flight.max(1));
        loop {
            let answered = tokio::select! {
                biased;
                () = stop.cancelled() => return Err(Error::Stopped { shard: shard.number }),
                answered = answers.next() => answered,
            };
            let Some(answered) = answered else { break };
            for (chunk, answer) in answered? {
                if let Some(answer) = &answer {
                    self.check_dimensions(answer, dimensions)?;
                }
                let piece = &pieces[chunk.piece];
                let ids = piece.ids.slice(chunk.rows.start, chunk.rows.len());
                let texts = &piece.texts[chunk.rows.clone()];
                let batch = assemble(&schema, dtype, dimensions, ids, texts, answer.as_ref())?;
                writer.write(&batch)?;
            }
        }
        writer.finish(self.output, &path, &shard.source(self.input)).await
    }

    /// The answers for a chunk's rows, in order: one, or (where the pool refused a call for its
    /// size) one per part it was split into. A single row refused so gets that refusal as its
    /// error. Halving makes at most 2 × rows − 1 calls of a chunk, each row in log2(rows) + 1.
    async fn embed_chunk(
        &self,
        texts: &[RowText],
        chunk: Chunk,
        dimensions: usize,
        dtype: Dtype,
    ) -> Result<Vec<(Chunk, Option<Answer>)>> {
        let mut answered = Vec::new();
        // A stack: the first half is taken next, so the answers come out in row order.
        let mut pending = vec![chunk];
        while let Some(chunk) = pending.pop() {
            let rows = &texts[chunk.rows.clone()];
            let embeddable = embeddable(rows);
            if embeddable.is_empty() {
                answered.push((chunk, None));
                continue;
            }
            match self.pool.embed_sized(&embeddable).await? {
                Ok(answer) => answered.push((chunk, Some(answer))),
                Err(refusal) if embeddable.len() == 1 => {
                    let answer = Answer::failed(1, dimensions, dtype, &row_refused(&refusal))?;
                    answered.push((chunk, Some(answer)));
                }
                Err(refusal) => {
                    let cut = chunk.rows.start + cut_after(rows, embeddable.len() / 2);
                    tracing::info!(
                        rows = embeddable.len() as u64,
                        code = ?refusal.code,
                        message = %refusal.message,
                        "the pool refused a call for its size; splitting it in halves"
                    );
                    pending.push(Chunk { piece: chunk.piece, rows: cut..chunk.rows.end });
                    pending.push(Chunk { piece: chunk.piece, rows: chunk.rows.start..cut });
                }
            }
        }
        Ok(answered)
    }

    /// Every part of a job has one vector size; an answer with another is refused rather than
    /// written (only an answer that carries a vector says anything about its size).
    fn check_dimensions(&self, answer: &Answer, dimensions: usize) -> Result<()> {
        let carries_vectors = answer.embeddings.null_count() < answer.embeddings.len();
        if carries_vectors && answer.dimensions() != dimensions {
            return Err(Error::MalformedAnswer {
                pool: self.pool.settings().pool.clone(),
                reason: format!("vectors of {} dimensions, where this job's have {dimensions}", answer.dimensions()),
            });
        }
        Ok(())
    }
}

/// The longest pool message kept in a row's error: a refusal's message is the pool's to choose.
const REFUSAL_MESSAGE_CHARS: usize = 300;

/// The error of a row the pool refused on its own for its size.
fn row_refused(refusal: &TooLarge) -> String {
    let message: String = refusal.message.chars().take(REFUSAL_MESSAGE_CHARS).collect();
    format!("the pool refused this row alone for its size ({:?}): {message}", refusal.code)
}

/// The texts to send among `rows`.
fn embeddable(rows: &[RowText]) -> Vec<&str> {
    rows.iter()
        .filter_map(|text| match text {
            RowText::Embed(text) => Some(text.as_str()),
            RowText::Failed(_) => None,
        })
        .collect()
}

/// How many of `rows` hold the first `embeddable` embeddable ones (at least one).
fn cut_after(rows: &[RowText], embeddable: usize) -> usize {
    let mut seen = 0;
    for (index, text) in rows.iter().enumerate() {
        if matches!(text, RowText::Embed(_)) {
            seen += 1;
            if seen >= embeddable.max(1) {
                return index + 1;
            }
        }
    }
    rows.len()
}

/// Makes each text no call could carry its row's error, before any call is cut.
fn refuse_oversized_texts(pieces: &mut [RowPiece], size: &CallSize) {
    for text in pieces.iter_mut().flat_map(|piece| piece.texts.iter_mut()) {
        if let RowText::Embed(embed) = text
            && let Some(reason) = size.refuse_text(embed.len())
        {
            *text = RowText::Failed(reason);
        }
    }
}

/// Cuts the pieces into calls' worth of rows, in order: a call closes when it holds `size.rows`
/// embeddable rows, or when the next text would take its request past `size.request_bytes`.
/// Every text fits a call on its own ([`refuse_oversized_texts`] ran first).
fn chunks(pieces: &[RowPiece], size: &CallSize) -> Vec<Chunk> {
    let rows_per_call = size.rows.max(1);
    let mut chunks = Vec::new();
    for (piece_index, piece) in pieces.iter().enumerate() {
        let mut start = 0;
        let (mut embeddable, mut bytes) = (0, 0);
        for (row, text) in piece.texts.iter().enumerate() {
            let RowText::Embed(text) = text else { continue };
            let row_bytes = request_bytes(text.len());
            if embeddable > 0 && bytes + row_bytes > size.request_bytes {
                chunks.push(Chunk { piece: piece_index, rows: start..row });
                (start, embeddable, bytes) = (row, 0, 0);
            }
            embeddable += 1;
            bytes += row_bytes;
            if embeddable == rows_per_call {
                chunks.push(Chunk { piece: piece_index, rows: start..row + 1 });
                (start, embeddable, bytes) = (row + 1, 0, 0);
            }
        }
        if start < piece.texts.len() {
            chunks.push(Chunk { piece: piece_index, rows: start..piece.texts.len() });
        }
    }
    chunks
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::StringArray;

    use super::*;

    fn piece(pattern: &str) -> RowPiece {
        let texts = pattern
            .chars()
            .map(|c| if c == 'e' { RowText::Embed("t".into()) } else { RowText::Failed("bad".into()) })
            .collect::<Vec<_>>();
        let ids = Arc::new(StringArray::from(vec![Some("id"); texts.len()]));
        RowPiece { ids, texts }
    }

    fn ranges(chunks: &[Chunk]) -> Vec<(usize, Range<usize>)> {
        chunks.iter().map(|chunk| (chunk.piece, chunk.rows.clone())).collect()
    }

    fn size(rows: usize, request_bytes: usize) -> CallSize {
        CallSize { rows, request_bytes, max_message_bytes: 4 << 20 }
    }

    #[test]
    fn calls_carry_at_most_rows_per_call_embeddable_rows_and_cover_every_row() {
        let pieces = [piece("eeFeeeFFe"), piece("FF"), piece("e")];
        let cut = |rows| ranges(&chunks(&pieces, &size(rows, 1 << 20)));
        assert_eq!(cut(2), [(0, 0..2), (0, 2..5), (0, 5..9), (1, 0..2), (2, 0..1)]);
        assert_eq!(cut(100), [(0, 0..9), (1, 0..2), (2, 0..1)]);
        assert_eq!(cut(1).len(), 6 + 1 + 1);
        assert!(chunks(&[piece("")], &size(4, 1 << 20)).is_empty());
    }

    #[test]
    fn calls_close_before_their_request_outgrows_the_byte_bound() {
        // Texts of 1 byte cost 9 request bytes each: 3 fit in 30, the 4th starts the next call.
        let pieces = [piece("eeeFeeeee")];
        assert_eq!(ranges(&chunks(&pieces, &size(100, 30))), [(0, 0..4), (0, 4..7), (0, 7..9)]);
        // Either bound closes a call, whichever comes first.
        assert_eq!(ranges(&chunks(&pieces, &size(2, 30))), [(0, 0..2), (0, 2..5), (0, 5..7), (0, 7..9)]);
    }

    #[test]
    fn a_text_no_call_can_carry_is_its_rows_error_and_the_rest_are_cut_around_it() {
        let big = |bytes: usize| RowText::Embed("x".repeat(bytes));
        let texts = vec![big(10), big(5_000), big(10), RowText::Failed("bad".into()), big(20)];
        let ids = Arc::new(StringArray::from(vec![Some("id"); texts.len()]));
        let mut pieces = [RowPiece { ids, texts }];
        let size = CallSize::new(512, 4096 + 64 * 1024, 4, Dtype::F32);
        refuse_oversized_texts(&mut pieces, &size);
        let RowText::Failed(reason) = &pieces[0].texts[1] else { panic!("{:?}", pieces[0].texts[1]) };
        assert!(reason.starts_with("the text is 5000 bytes: over the 4088 one call"), "{reason}");
        assert_eq!(pieces[0].texts[0], big(10));
        assert_eq!(ranges(&chunks(&pieces, &size)), [(0, 0..5)]);
    }

    #[test]
    fn halves_hold_half_the_embeddable_rows() {
        let rows = piece("FeFeeFe").texts;
        assert_eq!(cut_after(&rows, 2), 4);
        assert_eq!(cut_after(&rows, 0), 2, "at least one row");
        assert_eq!(embeddable(&rows[..cut_after(&rows, 2)]).len(), 2);
    }
}
