//! A JSONL shard's rows: the lines of its byte range, parsed. A bad line's error says where it is
//! (`file:line`, or the byte offset in files too large to count lines in cheaply).

use std::ops::Range;
use std::sync::Arc;

use arrow_array::{ArrayRef, StringArray};

use super::jsonl_row::{ParsedLine, parse_line};
use super::lines::{MAX_LINE_BYTES, lines_before, read_lines};
use super::{RowPiece, RowText};
use crate::Result;
use crate::listing::InputObject;
use crate::settings::Fields;
use crate::store::Store;

/// A line that became a failed row, to be located once the shard's lines are all read.
struct BadLine {
    /// Its index among the range's lines (blank ones included, as editors count lines).
    line_index: usize,
    /// Its file offset, for files too large to count lines in.
    offset: u64,
    /// Its row.
    row: usize,
}

/// Reads and parses the lines starting in `range` of `object`.
pub async fn read_range(input: &Store, object: &InputObject, range: Range<u64>, fields: &Fields) -> Result<RowPiece> {
    let lines = read_lines(input, object, range).await?;
    let mut ids: Vec<Option<String>> = Vec::with_capacity(lines.len());
    let mut texts = Vec::with_capacity(lines.len());
    let mut bad_lines = Vec::new();
    for (line_index, (offset, line)) in lines.iter().enumerate() {
        let parsed = match line {
            Ok(line) => parse_line(line, fields),
            Err(bytes) => Some(ParsedLine {
                id: None,
                text: Err(format!("the line is {bytes} bytes, over the {MAX_LINE_BYTES} a line may have")),
            }),
        };
        let Some(parsed) = parsed else { continue };
        ids.push(parsed.id);
        match parsed.text {
            Ok(text) => texts.push(RowText::Embed(text)),
            Err(problem) => {
                bad_lines.push(BadLine { line_index, offset, row: texts.len() });
                texts.push(RowText::Failed(problem));
            }
        }
    }
    // Counting the lines before the range costs a read of all of them: done only when needed.
    if let Some((range_first_line, _)) = lines.iter().next().filter(|_| !bad_lines.is_empty()) {
        let url = input.url_of(&object.path);
        let lines_before_range = lines_before(input, object, range_first_line).await?;
        for bad in bad_lines {
            let place = match lines_before_range {
                Some(before) => format!("{url}:{}", before + bad.line_index as u64 + 1),
                None => format!("{url} at byte {}", bad.offset),
            };
            if let RowText::Failed(problem) = &mut texts[bad.row] {
                *problem = format!("{place}: {problem}");
            }
        }
    }
    let ids: ArrayRef = Arc::new(StringArray::from(ids));
    Ok(RowPiece { ids, texts })
}

#[cfg(test)]
mod tests {
    use arrow_array::Array as _;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{ObjectStore, ObjectStoreExt as _};

    use super::*;

    async fn store_with(content: &str) -> (Store, InputObject) {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("in/corpus.jsonl");
        objects.put(&path, content.as_bytes().to_vec().into()).await.unwrap();
        (Store::new(objects, path.clone(), false, "file:///"), InputObject { path, size: content.len() as u64 })
    }

    fn ids(piece: &RowPiece) -> Vec<Option<&str>> {
        let ids = piece.ids.as_any().downcast_ref::<StringArray>().unwrap();
        (0..ids.len()).map(|row| ids.is_valid(row).then(|| ids.value(row))).collect()
    }

    #[tokio::test]
    async fn bad_lines_become_row_errors_naming_file_and_line() {
        let content = "{\"id\": 1, \"text\": \"one\"}\n\nnot json\n{\"id\": \"b\", \"text\": \"\"}\r\n{\"id\": \"c\", \"text\": \"three\"}";
        let (store, object) = store_with(content).await;
        let piece = read_range(&store, &object, 0..content.len() as u64, &Fields::default()).await.unwrap();
        assert_eq!(ids(&piece), [Some("1"), None, Some("b"), Some("c")], "the blank line is no row");
        assert_eq!(piece.texts[0], RowText::Embed("one".into()));
        let RowText::Failed(not_json) = &piece.texts[1] else { panic!("{:?}", piece.texts[1]) };
        assert!(not_json.starts_with("file:///in/corpus.jsonl:3: not JSON: "), "{not_json}");
        assert_eq!(piece.texts[2], RowText::Failed("file:///in/corpus.jsonl:4: `text` is empty".into()));
        assert_eq!(piece.texts[3], RowText::Embed("three".into()));
    }

    #[tokio::test]
    async fn line_numbers_count_from_the_start_of_the_file_in_later_ranges() {
        let content = "{\"id\": 1, \"text\": \"a\"}\n{\"id\": 2, \"text\": \"b\"}\n{\"id\": 3}\n";
        let (store, object) = store_with(content).await;
        let second_line = content.find("{\"id\": 2").unwrap() as u64;
        let piece = read_range(&store, &object, second_line..content.len() as u64, &Fields::default()).await.unwrap();
        assert_eq!(ids(&piece), [Some("2"), Some("3")]);
        assert_eq!(piece.texts[1], RowText::Failed("file:///in/corpus.jsonl:3: no `text` field".into()));
    }
}
