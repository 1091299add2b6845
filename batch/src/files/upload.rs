//! `POST /v1/files`: a multipart upload (`purpose=batch`, `file=@requests.jsonl`), streamed into
//! the store as it arrives (never held whole) while its bytes and requests are counted against
//! OpenAI's limits. At most `--max-uploads` run at once; one more is answered 429.

use axum::Json;
use axum::extract::State;
use axum::extract::multipart::{Field, Multipart, MultipartError, MultipartRejection};
use axum::http::{HeaderMap, StatusCode};

use super::{BATCH_PURPOSE, FileObject};
use crate::clock::now;
use crate::ids::FileId;
use crate::state::{AppState, Limits};
use crate::store::FileMeta;
use crate::{Error, Result};

/// Longest `purpose` read: every valid one is far shorter.
const MAX_PURPOSE_BYTES: usize = 64;
/// Longest filename kept (a longer one is cut).
const MAX_FILENAME_CHARS: usize = 255;

pub async fn upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<FileObject>> {
    let tenant = state.keys.tenant(&headers)?;
    let Ok(_place) = state.uploads.clone().try_acquire_owned() else {
        return Err(Error::Api {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "Too many uploads at once: this server streams {} at a time. Please retry after a second.",
                state.limits.max_uploads
            ),
            param: None,
            code: Some("rate_limit_exceeded"),
            retry_after: Some(1),
        });
    };
    let mut multipart = multipart.map_err(|rejection| invalid_form(&rejection.body_text()))?;
    let mut purpose_seen = false;
    let mut stored: Option<FileMeta> = None;
    let outcome: Result<()> = async {
        while let Some(field) = multipart.next_field().await.map_err(|e| form_error(&e, &state.limits))? {
            match field.name() {
                Some("purpose") => {
                    check_purpose(&read_small(field, &state.limits).await?)?;
                    purpose_seen = true;
                }
                Some("file") if stored.is_some() => {
                    return Err(Error::bad_request("Only one 'file' may be uploaded at a time.", Some("file"), None));
                }
                Some("file") => stored = Some(store_file(&state, &tenant, field).await?),
                // Other fields (an SDK's extras) are read past.
                _ => drain(field, &state.limits).await?,
            }
        }
        Ok(())
    }
    .await;
    // Whatever went wrong after the content was stored, it goes: no record was written for it.
    let refusal = match (outcome, purpose_seen, &stored) {
        (Err(error), _, _) => Some(error),
        (Ok(()), false, _) => Some(Error::missing("purpose")),
        (Ok(()), true, None) => Some(Error::missing("file")),
        (Ok(()), true, Some(_)) => None,
    };
    if let Some(refusal) = refusal {
        if let Some(meta) = &stored {
            state.store.delete(&meta.id).await?;
        }
        return Err(refusal);
    }
    let meta = stored.expect("checked above");
    state.store.put_meta(&meta).await?;
    tracing::info!(file = %meta.id, %tenant, bytes = meta.bytes, requests = meta.lines, "file uploaded");
    Ok(Json(FileObject::from(&meta)))
}

/// A body past the server's bound (the file's limit and the form around it) is a file too large,
/// said as OpenAI says it; anything else is a malformed form.
fn form_error(error: &MultipartError, limits: &Limits) -> Error {
    match error.status() {
        StatusCode::PAYLOAD_TOO_LARGE => too_large(limits),
        _ => invalid_form(&error.body_text()),
    }
}

fn too_large(limits: &Limits) -> Error {
    Error::bad_request(
        format!("File is too large. Batch input files can be at most {} bytes.", limits.max_file_bytes),
        Some("file"),
        None,
    )
}

fn invalid_form(reason: &str) -> Error {
    Error::bad_request(format!("Invalid multipart form: {reason}"), None, None)
}

fn stalled(limits: &Limits) -> Error {
    Error::api(
        StatusCode::REQUEST_TIMEOUT,
        format!("The upload stalled: nothing was received for {} seconds.", limits.upload_idle.as_secs_f64()),
        Some("file"),
        None,
    )
}

fn check_purpose(purpose: &str) -> Result<()> {
    if purpose == BATCH_PURPOSE {
        return Ok(());
    }
    Err(Error::bad_request(
        format!(
            "Invalid value for 'purpose': '{purpose}'. This deployment stores batch input files only: \
             the supported value is 'batch'."
        ),
        Some("purpose"),
        Some("invalid_value"),
    ))
}

/// A short text field, refused past [`MAX_PURPOSE_BYTES`] without reading the rest.
async fn read_small(mut field: Field<'_>, limits: &Limits) -> Result<String> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(|e| form_error(&e, limits))? {
        if bytes.len() + chunk.len() > MAX_PURPOSE_BYTES {
            return Err(check_purpose("(too long)").unwrap_err());
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes).map_err(|_| check_purpose("(not UTF-8)").unwrap_err())
}

async fn drain(mut field: Field<'_>, limits: &Limits) -> Result<()> {
    while field.chunk().await.map_err(|e| form_error(&e, limits))?.is_some() {}
    Ok(())
}

/// Streams the file field to `files/<new id>/content`, counting bytes and requests; past either
/// limit the upload is aborted (nothing stays in the store) and refused in OpenAI's words.
async fn store_file(state: &AppState, tenant: &str, mut field: Field<'_>) -> Result<FileMeta> {
    let filename: String = field.file_name().unwrap_or("file").chars().take(MAX_FILENAME_CHARS).collect();
    let id = FileId::new_upload();
    let path = state.store.content_path(&id);
    let mut writer = state.store.writer(&path).await?;
    let mut counter = LineCounter::default();
    let limits = state.limits;
    let written: Result<u64> = async {
        let mut bytes = 0u64;
        loop {
            let next = tokio::time::timeout(limits.upload_idle, field.chunk()).await.map_err(|_| stalled(&limits))?;
            let Some(chunk) = next.map_err(|e| form_error(&e, &limits))? else { break };
            bytes += chunk.len() as u64;
            if bytes > limits.max_file_bytes {
                return Err(too_large(&limits));
            }
            counter.feed(&chunk);
            if counter.lines() > limits.max_requests {
                return Err(Error::bad_request(
                    format!(
                        "The batch input file has more than {max} requests. A batch can contain at most {max} \
                         requests, one per line.",
                        max = limits.max_requests
                    ),
                    Some("file"),
                    None,
                ));
            }
            // Two parts in flight at most: the memory an upload takes stays bounded however fast
            // it comes.
            writer.wait_for_capacity(2).await.map_err(|e| Error::store(&path, e))?;
            writer.write(&chunk);
        }
        Ok(bytes)
    }
    .await;
    let bytes = match written {
        Ok(bytes) => bytes,
        Err(error) => {
            if let Err(abort) = writer.abort().await {
                tracing::warn!(error = %abort, "aborting a refused upload");
            }
            return Err(error);
        }
    };
    writer.finish().await.map_err(|e| Error::store(&path, e))?;
    Ok(FileMeta {
        id,
        bytes,
        created_at: now(),
        filename,
        purpose: BATCH_PURPOSE.to_owned(),
        tenant: tenant.to_owned(),
        lines: counter.lines(),
    })
}

/// Counts the lines that hold more than blanks (the requests), across chunk boundaries.
#[derive(Debug, Default)]
pub struct LineCounter {
    complete: u64,
    /// The line being read has a non-blank byte.
    open: bool,
}

impl LineCounter {
    pub fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            match byte {
                b'\n' => {
                    self.complete += u64::from(self.open);
                    self.open = false;
                }
                b' ' | b'\t' | b'\r' => {}
                _ => self.open = true,
            }
        }
    }

    /// Requests so far, the unfinished last line among them.
    pub fn lines(&self) -> u64 {
        self.complete + u64::from(self.open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_counted_across_chunks_and_blanks_are_not() {
        let mut counter = LineCounter::default();
        for chunk in [&b"{\"a\""[..], b":1}\n\n  \r\n{\"b\"", b":2}"] {
            counter.feed(chunk);
        }
        assert_eq!(counter.lines(), 2);
        counter.feed(b"\n");
        assert_eq!(counter.lines(), 2);
    }
}
