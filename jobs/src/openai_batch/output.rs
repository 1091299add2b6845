//! A shard's two output files and their lines, in OpenAI's batch output shape:
//! `part-NNNNNN.errors.jsonl` (written first, possibly empty) and `part-NNNNNN.jsonl` (whose
//! existence marks the shard done). Each is put whole: one PUT while it is small, and past
//! [`SINGLE_PUT_BYTES`] a multipart upload, which object_store shows only once completed (S3
//! assembles it on completion; the local store writes a staging file and renames it). So a file
//! that exists is complete, and memory holds at most a chunk or two of it, whatever its size.

use object_store::path::Path;
use object_store::{ObjectStoreExt as _, WriteMultipart};
use serde::Serialize;
use serde_json::value::RawValue;
use sha2::{Digest as _, Sha256};

use crate::Result;
use crate::store::Store;

/// A file smaller than this goes in one PUT.
const SINGLE_PUT_BYTES: usize = 32 << 20;
/// The parts of a multipart upload (S3 takes parts of 5 MiB and up).
const UPLOAD_CHUNK_BYTES: usize = 16 << 20;
/// Parts uploading at once.
const UPLOADS_IN_FLIGHT: usize = 2;

/// Where shard `shard`'s output lines go.
pub fn output_path(prefix: &Path, shard: u32) -> Path {
    prefix.clone().join(format!("part-{shard:06}.jsonl"))
}

/// Where shard `shard`'s error lines go.
pub fn errors_path(prefix: &Path, shard: u32) -> Path {
    prefix.clone().join(format!("part-{shard:06}.errors.jsonl"))
}

/// The line's id, `batch_req_` and 24 hex digits: from the output's URL, the shard and the line's
/// index in it, so a redone shard writes the same ids and two batches never share one.
pub fn line_id(output_url: &str, shard: u32, line: u64) -> String {
    format!("batch_req_{}", hex_digest(&["line", output_url, &shard.to_string(), &line.to_string()], 12))
}

/// The `request_id` of an answered line, 32 hex digits, as deterministic as its id.
pub fn request_id(line_id: &str) -> String {
    hex_digest(&["request", line_id], 16)
}

/// The first `bytes` bytes of the SHA-256 of `parts` (each length-prefixed), in lowercase hex.
fn hex_digest(parts: &[&str], bytes: usize) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize()[..bytes].iter().map(|byte| format!("{byte:02x}")).collect()
}

#[derive(Serialize)]
struct Line<'a> {
    id: &'a str,
    custom_id: Option<&'a str>,
    response: Option<Response<'a>>,
    error: Option<ErrorBody<'a>>,
}

#[derive(Serialize)]
struct Response<'a> {
    status_code: u16,
    request_id: &'a str,
    body: &'a RawValue,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

/// A line carrying the pool's answer (a success, or an HTTP error the line keeps).
pub fn response_line(id: &str, custom_id: &str, status: u16, body: &RawValue) -> Vec<u8> {
    let request_id = request_id(id);
    let response = Response { status_code: status, request_id: &request_id, body };
    encode(&Line { id, custom_id: Some(custom_id), response: Some(response), error: None })
}

/// A line refused without an answer.
pub fn error_line(id: &str, custom_id: Option<&str>, code: &str, message: &str) -> Vec<u8> {
    encode(&Line { id, custom_id, response: None, error: Some(ErrorBody { code, message }) })
}

fn encode(line: &Line<'_>) -> Vec<u8> {
    // Serializing borrowed strings and raw JSON into a Vec cannot fail.
    serde_json::to_vec(line).unwrap_or_default()
}

/// The pool's answer as JSON for a line: verbatim when it is JSON on one line (the multiplexer's
/// always are), compacted when it spans lines, and as a JSON string when it is not JSON.
pub fn answer_json(body: &[u8]) -> Result<Box<RawValue>, String> {
    match serde_json::from_slice::<&RawValue>(body) {
        Ok(raw) if !raw.get().contains('\n') => Ok(raw.to_owned()),
        Ok(raw) => {
            let value: serde_json::Value = serde_json::from_str(raw.get()).map_err(|error| error.to_string())?;
            serde_json::value::to_raw_value(&value).map_err(|error| error.to_string())
        }
        Err(error) => Err(error.to_string()),
    }
}

/// A text as a JSON string value (for an error answer that is not JSON).
pub fn json_string(text: &str) -> Box<RawValue> {
    serde_json::value::to_raw_value(text).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// One JSONL file being written, put whole when finished.
pub struct JsonlFile<'a> {
    output: &'a Store,
    path: Path,
    buffer: Vec<u8>,
    upload: Option<WriteMultipart>,
    lines: u64,
}

impl<'a> JsonlFile<'a> {
    pub fn new(output: &'a Store, path: Path) -> Self {
        Self { output, path, buffer: Vec::new(), upload: None, lines: 0 }
    }

    /// Lines written so far.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Appends `line` (one JSON value, no newline in it) and its newline.
    pub async fn write(&mut self, line: &[u8]) -> Result<()> {
        self.buffer.extend_from_slice(line);
        self.buffer.push(b'\n');
        self.lines += 1;
        if self.upload.is_none() && self.buffer.len() > SINGLE_PUT_BYTES {
            let upload = self.output.objects().put_multipart(&self.path).await.map_err(|e| self.error(e))?;
            self.upload = Some(WriteMultipart::new_with_chunk_size(upload, UPLOAD_CHUNK_BYTES));
        }
        if let Some(upload) = &mut self.upload {
            upload.write(&self.buffer);
            self.buffer.clear();
            let waited = upload.wait_for_capacity(UPLOADS_IN_FLIGHT).await;
            waited.map_err(|e| self.output.error(&self.path, e))?;
        }
        Ok(())
    }

    /// Puts the file (or completes its upload); it exists from here on.
    pub async fn finish(self) -> Result<u64> {
        let Self { output, path, buffer, upload, lines } = self;
        match upload {
            Some(mut upload) => {
                upload.write(&buffer);
                upload.finish().await.map_err(|e| output.error(&path, e))?;
            }
            None => {
                output.objects().put(&path, buffer.into()).await.map_err(|e| output.error(&path, e))?;
            }
        }
        Ok(lines)
    }

    fn error(&self, source: object_store::Error) -> crate::Error {
        self.output.error(&self.path, source)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use super::*;

    #[test]
    fn ids_are_deterministic_and_distinct() {
        let id = line_id("s3://b/batches/batch_1/", 3, 17);
        assert_eq!(id, line_id("s3://b/batches/batch_1/", 3, 17));
        assert!(id.starts_with("batch_req_") && id.len() == "batch_req_".len() + 24, "{id}");
        assert!(id["batch_req_".len()..].chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(id, line_id("s3://b/batches/batch_1/", 3, 18));
        assert_ne!(id, line_id("s3://b/batches/batch_1/", 31, 7), "shard and line are kept apart");
        assert_ne!(id, line_id("s3://b/batches/batch_2/", 3, 17));
        assert_eq!(request_id(&id).len(), 32);
    }

    #[test]
    fn lines_have_the_batch_output_shape() {
        let body = RawValue::from_string(r#"{"object":"list"}"#.into()).unwrap();
        let line = String::from_utf8(response_line("batch_req_1", "a", 200, &body)).unwrap();
        let expected = format!(
            r#"{{"id":"batch_req_1","custom_id":"a","response":{{"status_code":200,"request_id":"{}","body":{{"object":"list"}}}},"error":null}}"#,
            request_id("batch_req_1")
        );
        assert_eq!(line, expected);
        let line = String::from_utf8(error_line("batch_req_2", None, "invalid_request", "no \"x\"")).unwrap();
        assert_eq!(
            line,
            r#"{"id":"batch_req_2","custom_id":null,"response":null,"error":{"code":"invalid_request","message":"no \"x\""}}"#
        );
    }

    #[test]
    fn answers_stay_on_one_line() {
        assert_eq!(answer_json(br#"{"a": [1, 2]}"#).unwrap().get(), r#"{"a": [1, 2]}"#);
        assert_eq!(answer_json(b"{\n  \"a\": 1\n}\n").unwrap().get(), r#"{"a":1}"#);
        assert!(answer_json(b"Bad Gateway").is_err());
        assert_eq!(json_string("a\nb").get(), r#""a\nb""#);
    }

    #[tokio::test]
    async fn a_large_file_goes_up_in_parts_and_appears_whole() {
        let output = Store::new(Arc::new(InMemory::new()), Path::from("out"), true, "s3://out/");
        let path = output_path(output.root(), 1);
        let mut file = JsonlFile::new(&output, path.clone());
        let line = vec![b'x'; 1 << 20];
        for _ in 0..40 {
            file.write(&line).await.unwrap();
        }
        assert!(file.upload.is_some() && file.buffer.is_empty(), "past the single-PUT size it streams");
        assert!(output.objects().head(&path).await.is_err(), "not there before it is finished");
        assert_eq!(file.finish().await.unwrap(), 40);
        let written = output.objects().get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(written.len(), 40 * ((1 << 20) + 1));

        let small = errors_path(output.root(), 1);
        assert_eq!(JsonlFile::new(&output, small.clone()).finish().await.unwrap(), 0);
        assert_eq!(output.objects().get(&small).await.unwrap().bytes().await.unwrap().len(), 0, "empty, but there");
    }
}
