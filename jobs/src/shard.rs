//! One shard, start to finish: read its rows, send the embeddable ones in calls of at most
//! rows-per-call (a few in flight, answers taken in order), write each answered run of rows into
//! the part, and put the part.

use std::ops::Range;

use arrow_array::Array as _;
use futures::StreamExt as _;

use crate::embed::{Answer, PoolClient};
use crate::input::{RowPiece, RowText, read_shard};
use crate::output::columns::assemble;
use crate::output::writer::{PartCounts, PartWriter};
use crate::output::{part_path, part_schema};
use crate::plan::Shard;
use crate::settings::Fields;
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
}

/// Consecutive rows of one piece that go out as one call: at most rows-per-call embeddable rows,
/// with the failed rows among them riding along (they are written, not sent).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    piece: usize,
    rows: Range<usize>,
}

impl ShardRunner<'_> {
    /// Embeds the shard and writes its part, with vectors `dimensions` long.
    pub async fn run(&self, shard: &Shard, dimensions: usize) -> Result<PartCounts> {
        let rows = read_shard(self.input, shard, self.fields).await?;
        let dtype = self.pool.settings().options.dtype;
        let schema = part_schema(&rows.id_type, dtype, dimensions);
        let path = part_path(self.output.root(), shard.number);
        let mut writer = PartWriter::new(schema.clone(), self.output.url_of(&path))?;
        let pieces = &rows.pieces;
        let chunks = chunks(pieces, self.rows_per_call);
        // Chunks go in by value: a closure over `&Chunk` makes the future's Send-ness depend on
        // a higher-ranked lifetime the compiler cannot prove, and the worker could not be spawned.
        let mut answers = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let answer = self.embed(&pieces[chunk.piece].texts[chunk.rows.clone()]).await?;
                Ok::<_, Error>((chunk, answer))
            })
            .buffered(self.calls_in_flight.max(1));
        while let Some(answered) = answers.next().await {
            let (chunk, answer) = answered?;
            if let Some(answer) = &answer {
                self.check_dimensions(answer, dimensions)?;
            }
            let piece = &pieces[chunk.piece];
            let ids = piece.ids.slice(chunk.rows.start, chunk.rows.len());
            let batch = assemble(&schema, dtype, dimensions, ids, &piece.texts[chunk.rows.clone()], answer.as_ref())?;
            writer.write(&batch)?;
        }
        writer.finish(self.output, &path, &shard.source(self.input)).await
    }

    /// The pool's answer for the embeddable rows among `texts`; none if there are none.
    async fn embed(&self, texts: &[RowText]) -> Result<Option<Answer>> {
        let embeddable: Vec<&str> = texts
            .iter()
            .filter_map(|text| match text {
                RowText::Embed(text) => Some(text.as_str()),
                RowText::Failed(_) => None,
            })
            .collect();
        if embeddable.is_empty() {
            return Ok(None);
        }
        self.pool.embed(&embeddable).await.map(Some)
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

/// Cuts the pieces into calls' worth of rows, in order.
fn chunks(pieces: &[RowPiece], rows_per_call: usize) -> Vec<Chunk> {
    let rows_per_call = rows_per_call.max(1);
    let mut chunks = Vec::new();
    for (piece_index, piece) in pieces.iter().enumerate() {
        let mut start = 0;
        let mut embeddable = 0;
        for (row, text) in piece.texts.iter().enumerate() {
            if matches!(text, RowText::Embed(_)) {
                embeddable += 1;
            }
            if embeddable == rows_per_call {
                chunks.push(Chunk { piece: piece_index, rows: start..row + 1 });
                start = row + 1;
                embeddable = 0;
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

    #[test]
    fn calls_carry_at_most_rows_per_call_embeddable_rows_and_cover_every_row() {
        let pieces = [piece("eeFeeeFFe"), piece("FF"), piece("e")];
        assert_eq!(ranges(&chunks(&pieces, 2)), [(0, 0..2), (0, 2..5), (0, 5..9), (1, 0..2), (2, 0..1)]);
        assert_eq!(ranges(&chunks(&pieces, 100)), [(0, 0..9), (1, 0..2), (2, 0..1)]);
        assert_eq!(ranges(&chunks(&pieces, 1)).len(), 6 + 1 + 1);
        assert!(chunks(&[piece("")], 4).is_empty());
    }
}
