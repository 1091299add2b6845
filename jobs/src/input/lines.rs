//! The lines of a JSONL byte range, with ranged reads only. A line belongs to the range holding its
//! first byte: a range skips the partial line it starts inside (unless it starts at 0 or right
//! after a newline), and reads past its end to finish its last line. So every line of a file lands
//! in exactly one of its ranges, whatever their size.
//!
//! A line longer than [`MAX_LINE_BYTES`] is not held: its bytes past the range are read in pieces
//! and dropped until its newline, and it comes back as its length alone (its row's error). So a
//! range's reading holds at most the range, [`LOOKAHEAD`] and one line of [`MAX_LINE_BYTES`].

use std::ops::Range;

use bytes::Bytes;
use object_store::ObjectStoreExt as _;

use crate::Result;
use crate::listing::InputObject;
use crate::store::Store;

/// How far past a range's end the first read goes, so most ranges finish their last line in one
/// read. Lines longer than this take more reads, each as long as all before it.
const LOOKAHEAD: u64 = 64 * 1024;
/// The longest line read: four times the largest text a call to the pool carries at the default
/// `--max-message-bytes` (4 MiB), room for a text that fits a call with its JSON escapes.
pub const MAX_LINE_BYTES: u64 = 16 << 20;
/// The pieces a line over [`MAX_LINE_BYTES`] is read in while its end is looked for.
const SKIP_READ_BYTES: u64 = 4 << 20;
/// Counting the lines before a range reads everything before it: done only for a range with a
/// bad line (so its error can say which line), and only this far into a file.
const LINE_COUNT_LIMIT: u64 = 256 << 20;

/// A line's bytes in the buffer, or the length of one too long to hold.
#[derive(Debug, Clone)]
enum Span {
    Held(Range<usize>),
    TooLong(u64),
}

/// The lines that start in a range, each without its `\n` or `\r\n`.
#[derive(Debug)]
pub struct RangeLines {
    buffer: Vec<u8>,
    /// Each line's file offset and where its bytes are.
    spans: Vec<(u64, Span)>,
}

impl RangeLines {
    /// Each line's file offset and bytes, or (`Err`) the length of a line over
    /// [`MAX_LINE_BYTES`].
    pub fn iter(&self) -> impl Iterator<Item = (u64, Result<&[u8], u64>)> {
        self.spans.iter().map(|(offset, span)| match span {
            Span::Held(span) => (*offset, Ok(&self.buffer[span.clone()])),
            Span::TooLong(bytes) => (*offset, Err(*bytes)),
        })
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The bytes held for the range's lines (tests check the bound).
    pub fn held_bytes(&self) -> usize {
        self.buffer.capacity()
    }
}

/// Reads the lines of `object` that start in `range`.
pub async fn read_lines(input: &Store, object: &InputObject, range: Range<u64>) -> Result<RangeLines> {
    let size = object.size;
    // One byte before the range says whether a line starts right at it.
    let buffer_offset = range.start.saturating_sub(1);
    let mut fetched_to = range.end.saturating_add(LOOKAHEAD).min(size);
    let mut buffer = fetch(input, object, buffer_offset..fetched_to).await?.to_vec();
    let mut lines = RangeLines { buffer: Vec::new(), spans: Vec::new() };

    let first_line = if range.start == 0 {
        0
    } else {
        match buffer.iter().position(|byte| *byte == b'\n') {
            Some(newline) => buffer_offset + newline as u64 + 1,
            // No newline from the byte before the range to past its end: no line starts in it.
            None => return Ok(lines),
        }
    };
    let mut line_start = first_line;
    while line_start < range.end {
        // The buffer's tail holds the file up to `fetched_to` without a gap from the line's start
        // (a dropped long line is cut out before what follows it is appended).
        let from = buffer.len() - usize::try_from(fetched_to - line_start).unwrap_or(usize::MAX);
        match buffer[from..].iter().position(|byte| *byte == b'\n') {
            Some(length) => {
                lines.spans.push((line_start, held_or_too_long(&buffer, from..from + length)));
                line_start += length as u64 + 1;
            }
            None if fetched_to >= size => {
                // The file's last line, without a newline after it.
                lines.spans.push((line_start, held_or_too_long(&buffer, from..buffer.len())));
                break;
            }
            None if (buffer.len() - from) as u64 > MAX_LINE_BYTES => {
                buffer.truncate(from);
                let (length, rest) = skip_line(input, object, &mut fetched_to, line_start).await?;
                lines.spans.push((line_start, Span::TooLong(length)));
                buffer.extend_from_slice(&rest);
                line_start += length + 1;
            }
            None => {
                // Up to one byte past the longest line: enough to tell whether this one is.
                let growth = LOOKAHEAD.max((buffer.len() - from) as u64);
                let more_to = fetched_to.saturating_add(growth).min(size).min(line_start + MAX_LINE_BYTES + 1);
                let more = fetch(input, object, fetched_to..more_to).await?;
                buffer.reserve_exact(more.len());
                buffer.extend_from_slice(&more);
                fetched_to = more_to;
            }
        }
    }
    lines.buffer = buffer;
    Ok(lines)
}

/// Reads on from `fetched_to` to the end of the line starting at `line_start`, dropping its
/// bytes: its length, and what was read after its newline (the next lines' first bytes).
async fn skip_line(input: &Store, object: &InputObject, fetched_to: &mut u64, line_start: u64) -> Result<(u64, Bytes)> {
    loop {
        if *fetched_to >= object.size {
            return Ok((object.size - line_start, Bytes::new()));
        }
        let read_to = fetched_to.saturating_add(SKIP_READ_BYTES).min(object.size);
        let piece = fetch(input, object, *fetched_to..read_to).await?;
        let piece_start = *fetched_to;
        *fetched_to = read_to;
        if let Some(newline) = piece.iter().position(|byte| *byte == b'\n') {
            return Ok((piece_start + newline as u64 - line_start, piece.slice(newline + 1..)));
        }
    }
}

/// A line's span without its `\r`, or its length if it is too long to hand on.
fn held_or_too_long(buffer: &[u8], span: Range<usize>) -> Span {
    if span.len() as u64 > MAX_LINE_BYTES {
        return Span::TooLong(span.len() as u64);
    }
    Span::Held(without_carriage_return(buffer, span))
}

/// How many lines come before `offset` in the file (so the line at `offset` is that plus one);
/// `None` past [`LINE_COUNT_LIMIT`], where counting would cost more than the message is worth.
pub async fn lines_before(input: &Store, object: &InputObject, offset: u64) -> Result<Option<u64>> {
    if offset > LINE_COUNT_LIMIT {
        return Ok(None);
    }
    const CHUNK: u64 = 8 << 20;
    let mut newlines = 0u64;
    let mut from = 0;
    while from < offset {
        let to = (from + CHUNK).min(offset);
        let chunk = fetch(input, object, from..to).await?;
        newlines += chunk.iter().filter(|byte| **byte == b'\n').count() as u64;
        from = to;
    }
    Ok(Some(newlines))
}

fn without_carriage_return(buffer: &[u8], span: Range<usize>) -> Range<usize> {
    if span.end > span.start && buffer[span.end - 1] == b'\r' { span.start..span.end - 1 } else { span }
}

async fn fetch(input: &Store, object: &InputObject, range: Range<u64>) -> Result<Bytes> {
    if range.is_empty() {
        return Ok(Bytes::new());
    }
    input.objects().get_range(&object.path, range).await.map_err(|source| input.error(&object.path, source))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::ObjectStore;
    use object_store::memory::InMemory;
    use object_store::path::Path;

    use super::*;

    async fn store_with(content: &[u8]) -> (Store, InputObject) {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("corpus.jsonl");
        objects.put(&path, content.to_vec().into()).await.unwrap();
        let object = InputObject { path: path.clone(), size: content.len() as u64 };
        (Store::new(objects, path, false, "file:///"), object)
    }

    /// Every line of `content`, as splitting the whole file at once finds them.
    fn expected_lines(content: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let mut lines = Vec::new();
        let mut start = 0usize;
        for (index, byte) in content.iter().enumerate() {
            if *byte == b'\n' {
                lines.push((start as u64, content[start..index].strip_suffix(b"\r").unwrap_or(&content[start..index])));
                start = index + 1;
            }
        }
        if start < content.len() {
            lines.push((start as u64, content[start..].strip_suffix(b"\r").unwrap_or(&content[start..])));
        }
        lines.into_iter().map(|(offset, line)| (offset, line.to_vec())).collect()
    }

    async fn lines_over_ranges(content: &[u8], shard_bytes: u64) -> Vec<(u64, Vec<u8>)> {
        let (store, object) = store_with(content).await;
        let mut found = Vec::new();
        let mut start = 0;
        while start < object.size {
            let end = (start + shard_bytes).min(object.size);
            let lines = read_lines(&store, &object, start..end).await.unwrap();
            for (offset, line) in lines.iter() {
                assert!((start..end).contains(&offset), "a line starting at {offset} read by range {start}..{end}");
                found.push((offset, line.expect("no line over the bound").to_vec()));
            }
            start = end;
        }
        found
    }

    /// A small deterministic generator (xorshift), so a failure can be replayed from its seed.
    struct Random(u64);

    impl Random {
        fn below(&mut self, bound: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % bound
        }
    }

    /// A file of lines of random length, some empty, some CRLF, with or without a final newline;
    /// with `long_lines`, some lines longer than the first read's lookahead.
    fn random_file(random: &mut Random, long_lines: bool) -> Vec<u8> {
        let mut content = Vec::new();
        for line in 0..random.below(40) {
            let length = match random.below(10) {
                0 => 0,
                1 if long_lines => LOOKAHEAD as usize + random.below(2 * LOOKAHEAD) as usize,
                _ => random.below(60) as usize,
            };
            content.extend(std::iter::repeat_n(b'a' + (line % 26) as u8, length));
            content.extend_from_slice(if random.below(4) == 0 { b"\r\n" } else { b"\n" });
        }
        if random.below(2) == 0 {
            content.extend_from_slice(b"{\"last\": \"no newline\"}");
        }
        content
    }

    #[tokio::test]
    async fn every_line_lands_in_exactly_one_range_whatever_the_range_size() {
        let mut random = Random(0x5eed_1234_abcd_0001);
        for round in 0..60 {
            let content = random_file(&mut random, false);
            let expected = expected_lines(&content);
            let whole = content.len().max(1) as u64;
            for shard_bytes in [1, 2, 3, 7, 64, 1 + random.below(whole), whole, whole + 5] {
                let found = lines_over_ranges(&content, shard_bytes).await;
                assert_eq!(found, expected, "round {round}, {} bytes, ranges of {shard_bytes}", content.len());
            }
        }
    }

    #[tokio::test]
    async fn lines_longer_than_the_lookahead_are_read_to_their_end() {
        let mut random = Random(0x5eed_1234_abcd_0002);
        for round in 0..6 {
            let content = random_file(&mut random, true);
            let expected = expected_lines(&content);
            for shard_bytes in [4096, LOOKAHEAD - 1, LOOKAHEAD + 1, 1 + random.below(300_000)] {
                let found = lines_over_ranges(&content, shard_bytes).await;
                assert_eq!(found, expected, "round {round}, {} bytes, ranges of {shard_bytes}", content.len());
            }
        }
    }

    #[tokio::test]
    async fn edge_cases_split_as_a_whole_file_would() {
        let cases: [&[u8]; 8] =
            [b"", b"\n", b"\n\n\n", b"one", b"one\r\ntwo\r\n", b"a\n\nb\n\n", b"\r\n\r\n", b"{\"id\":1}\n{\"id\":2}"];
        for content in cases {
            for shard_bytes in 1..=content.len().max(1) as u64 + 1 {
                assert_eq!(
                    lines_over_ranges(content, shard_bytes).await,
                    expected_lines(content),
                    "{:?} in ranges of {shard_bytes}",
                    String::from_utf8_lossy(content)
                );
            }
        }
    }

    #[tokio::test]
    async fn a_line_over_the_bound_is_its_length_and_is_never_held() {
        let long = MAX_LINE_BYTES as usize + 3 * SKIP_READ_BYTES as usize + 12_345;
        let mut content = b"{\"id\": 1}\n".to_vec();
        content.extend(std::iter::repeat_n(b'x', long));
        content.extend_from_slice(b"\n{\"id\": 2}\n");
        let last_start = content.len() as u64;
        content.extend(std::iter::repeat_n(b'y', long));
        let (store, object) = store_with(&content).await;
        for shard_bytes in [1 << 20, 8 << 20] {
            let mut found = Vec::new();
            let mut start = 0;
            while start < object.size {
                let end = (start + shard_bytes).min(object.size);
                let lines = read_lines(&store, &object, start..end).await.unwrap();
                let bound = shard_bytes + LOOKAHEAD + MAX_LINE_BYTES + 1 + SKIP_READ_BYTES;
                assert!(lines.held_bytes() as u64 <= bound, "{} held for a range of {shard_bytes}", lines.held_bytes());
                found.extend(lines.iter().map(|(offset, line)| (offset, line.map(<[u8]>::to_vec))));
                start = end;
            }
            let expected = [
                (0, Ok(b"{\"id\": 1}".to_vec())),
                (10, Err(long as u64)),
                (10 + long as u64 + 1, Ok(b"{\"id\": 2}".to_vec())),
                (last_start, Err(long as u64)),
            ];
            assert_eq!(found, expected, "ranges of {shard_bytes}");
        }
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_bound_is_held() {
        let mut content = vec![b'z'; MAX_LINE_BYTES as usize];
        content.extend_from_slice(b"\nnext\n");
        let (store, object) = store_with(&content).await;
        let lines = read_lines(&store, &object, 0..1024).await.unwrap();
        let found: Vec<_> = lines.iter().map(|(offset, line)| (offset, line.map(<[u8]>::len))).collect();
        assert_eq!(found, [(0, Ok(MAX_LINE_BYTES as usize))]);
    }

    #[tokio::test]
    async fn lines_before_counts_newlines() {
        let (store, object) = store_with(b"a\nb\r\n\nc\n").await;
        assert_eq!(lines_before(&store, &object, 0).await.unwrap(), Some(0));
        assert_eq!(lines_before(&store, &object, 2).await.unwrap(), Some(1));
        assert_eq!(lines_before(&store, &object, 6).await.unwrap(), Some(3));
        assert_eq!(lines_before(&store, &object, LINE_COUNT_LIMIT + 1).await.unwrap(), None);
    }
}
