//! One read of a batch's input file at creation: refuses duplicate `custom_id`s (the output is
//! matched to the input by them) and finds the model the batch is for, the most common
//! `body.model`. Everything else about a line is the worker's to judge: a line that does not
//! parse is an error line in the batch's error file, not a refused batch.

use std::collections::HashMap;

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::{Error, Result};

/// Longest line looked at, as the worker bounds it; a longer one is skipped here (the worker
/// makes it an error line).
pub const MAX_LINE_BYTES: usize = 16 << 20;
/// Distinct models counted; a file naming more is not one model's batch anyway.
const MAX_MODELS: usize = 1024;
/// Longest model name counted.
const MAX_MODEL_CHARS: usize = 256;

/// What the scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    /// The most common `body.model` (ties: the first in name order); none if no line names one.
    pub model: Option<String>,
    /// Non-blank lines.
    pub lines: u64,
}

#[derive(Deserialize)]
struct Line {
    custom_id: Option<String>,
    body: Option<Body>,
}

#[derive(Deserialize)]
struct Body {
    model: Option<String>,
}

/// Reads the file's bytes once. Only 32-byte digests of the custom ids are kept, so the memory it
/// takes is bounded by the number of lines (itself bounded at upload), not by their size.
pub async fn scan(bytes: impl Stream<Item = Result<Bytes>>) -> Result<Scan> {
    let mut bytes = std::pin::pin!(bytes);
    let mut state = State::default();
    let mut line = Vec::new();
    let mut skipping = false;
    while let Some(chunk) = bytes.next().await {
        let chunk = chunk?;
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let (piece, ended) = match rest.iter().position(|&b| b == b'\n') {
                Some(at) => (&rest[..at], true),
                None => (rest, false),
            };
            rest = &rest[piece.len() + usize::from(ended)..];
            if !skipping {
                if line.len() + piece.len() > MAX_LINE_BYTES {
                    // Too long to judge here; still a request line, counted below.
                    skipping = true;
                    line.clear();
                    line.push(b'x');
                } else {
                    line.extend_from_slice(piece);
                }
            }
            if ended {
                state.line(&line, skipping)?;
                line.clear();
                skipping = false;
            }
        }
    }
    state.line(&line, skipping)?;
    Ok(state.finish())
}

#[derive(Default)]
struct State {
    lines: u64,
    /// Digest of each custom id, and the line it was first on.
    ids: HashMap<[u8; 32], u64>,
    models: HashMap<String, u64>,
}

impl State {
    fn line(&mut self, text: &[u8], too_long: bool) -> Result<()> {
        if text.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
            return Ok(());
        }
        self.lines += 1;
        let number = self.lines;
        if too_long {
            return Ok(());
        }
        let Ok(line) = serde_json::from_slice::<Line>(text) else { return Ok(()) };
        if let Some(id) = line.custom_id.filter(|id| !id.is_empty()) {
            let digest: [u8; 32] = Sha256::digest(id.as_bytes()).into();
            if let Some(first) = self.ids.insert(digest, number) {
                let shown: String = id.chars().take(64).collect();
                return Err(Error::bad_request(
                    format!(
                        "The custom_id '{shown}' is used by more than one request (lines {first} and {number} of the \
                         input file). The custom_id of each request in a batch must be unique."
                    ),
                    Some("input_file_id"),
                    Some("duplicate_custom_id"),
                ));
            }
        }
        if let Some(model) = line.body.and_then(|body| body.model)
            && model.chars().count() <= MAX_MODEL_CHARS
            && (self.models.len() < MAX_MODELS || self.models.contains_key(&model))
        {
            *self.models.entry(model).or_default() += 1;
        }
        Ok(())
    }

    fn finish(self) -> Scan {
        let model = self
            .models
            .into_iter()
            .max_by(|(a, a_count), (b, b_count)| a_count.cmp(b_count).then_with(|| b.cmp(a)))
            .map(|(model, _)| model);
        Scan { model, lines: self.lines }
    }
}

#[cfg(test)]
mod tests {
    use futures::stream;

    use super::*;

    async fn scan_chunks(chunks: &[&str]) -> Result<Scan> {
        let chunks: Vec<Result<Bytes>> = chunks.iter().map(|c| Ok(Bytes::from(c.to_string()))).collect();
        scan(stream::iter(chunks)).await
    }

    fn request(id: &str, model: &str) -> String {
        format!(
            r#"{{"custom_id":"{id}","method":"POST","url":"/v1/embeddings","body":{{"model":"{model}","input":"x"}}}}"#
        )
    }

    #[tokio::test]
    async fn the_most_common_model_across_chunks_and_bad_lines() {
        let file = [
            request("a", "bge"),
            request("b", "e5"),
            "not json".into(),
            request("c", "bge"),
            String::new(),
            "{\"custom_id\":\"d\"}".into(),
        ]
        .join("\n");
        let (head, tail) = file.split_at(50);
        let scan = scan_chunks(&[head, tail]).await.unwrap();
        assert_eq!(scan, Scan { model: Some("bge".into()), lines: 5 });
        let tie = scan_chunks(&[&format!("{}\n{}\n", request("a", "zz"), request("b", "aa"))]).await.unwrap();
        assert_eq!(tie.model.as_deref(), Some("aa"), "ties break by name, the same every time");
        assert_eq!(scan_chunks(&["\n \n"]).await.unwrap(), Scan { model: None, lines: 0 });
    }

    #[tokio::test]
    async fn a_duplicate_custom_id_is_refused_naming_both_lines() {
        let file = [request("a", "bge"), request("b", "bge"), request("a", "bge")].join("\n");
        let error = scan_chunks(&[&file]).await.unwrap_err();
        let Error::Api { message, code, .. } = error else { panic!("{error}") };
        assert_eq!(code, Some("duplicate_custom_id"));
        assert!(message.contains("'a'") && message.contains("lines 1 and 3"), "{message}");
    }

    #[tokio::test]
    async fn an_overlong_line_is_counted_not_held() {
        let long = format!(r#"{{"custom_id":"a","body":{{"model":"bge","input":"{}"}}}}"#, "x".repeat(MAX_LINE_BYTES));
        let chunks: Vec<&str> = long.as_bytes().chunks(1 << 20).map(|c| std::str::from_utf8(c).unwrap()).collect();
        let mut all = chunks.clone();
        let next = format!("\n{}", request("a", "e5"));
        all.push(&next);
        let scan = scan_chunks(&all).await.unwrap();
        assert_eq!(scan, Scan { model: Some("e5".into()), lines: 2 }, "the long line's id is not seen, its line is");
    }
}
