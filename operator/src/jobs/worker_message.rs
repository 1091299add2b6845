//! What a failed worker said, as the EmbeddingJob's status and Events quote it. The job's
//! creator reads both; what they quote is the worker's one error line (`teifleet-job: ...`, which
//! names the file or the pool that failed) or, without one, only what Kubernetes says of the exit
//! (code and reason). Never the rest of its log, and never as written: one line, no control or
//! bidirectional characters, nothing of a store's answer body (S3 quotes the access key id in
//! it), no access key id or other long secret-looking token, at most [`MAX_WORKER_MESSAGE`]
//! bytes.

use k8s_openapi::api::core::v1::ContainerStateTerminated;

/// Most of a worker's message kept, in bytes (an ellipsis marks a cut).
pub const MAX_WORKER_MESSAGE: usize = 256;
/// How `teifleet-job` starts the one line it prints on failure (jobs/src/main.rs).
pub const WORKER_ERROR_PREFIX: &str = "teifleet-job: ";
/// Most of Kubernetes' termination reason kept (`OOMKilled`, `Error`, `DeadlineExceeded`).
const MAX_REASON: usize = 32;
/// A token at least this long, of letters of both cases and digits, is taken for a secret (an S3
/// secret key is 40 such characters).
const SECRET_TOKEN: usize = 32;
/// The prefixes of AWS access key ids (`AKIA...` long-lived, `ASIA...` temporary, and the other
/// unique-id prefixes), 20 characters in all.
const ACCESS_KEY_PREFIXES: [&str; 11] =
    ["AKIA", "ASIA", "AROA", "AIDA", "AGPA", "ANPA", "ANVA", "AIPA", "APKA", "ABIA", "ACCA"];
const REDACTED: &str = "[redacted]";
const BODY_LEFT_OUT: &str = "[answer body left out]";

/// What a worker that exited non-zero said: its error line, sanitized; else its exit code and
/// Kubernetes' reason.
pub fn worker_message(terminated: &ContainerStateTerminated) -> String {
    let error_line = terminated.message.as_deref().and_then(|message| {
        message.lines().rev().map(str::trim).find_map(|line| line.strip_prefix(WORKER_ERROR_PREFIX.trim_end()))
    });
    if let Some(line) = error_line.map(sanitize).filter(|line| !line.is_empty()) {
        return line;
    }
    let reason: String = terminated
        .reason
        .as_deref()
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(MAX_REASON)
        .collect();
    match reason.is_empty() {
        true => format!("exited with code {}", terminated.exit_code),
        false => format!("exited with code {} ({reason})", terminated.exit_code),
    }
}

/// `text` made safe to quote: see the module's documentation.
pub fn sanitize(text: &str) -> String {
    let (text, body_cut) = match answer_body_start(text) {
        Some(start) => (&text[..start], true),
        None => (text, false),
    };
    let mut words: Vec<String> = text
        .split(|c: char| c.is_whitespace() || c.is_control() || is_bidi_control(c))
        .filter(|word| !word.is_empty())
        .map(redact_secrets)
        .collect();
    if body_cut {
        words.push(BODY_LEFT_OUT.into());
    }
    truncate(words.join(" "))
}

/// Where a quoted markup document (an S3 error's XML, an HTML error page) starts.
fn answer_body_start(text: &str) -> Option<usize> {
    text.char_indices()
        .find(|(at, c)| {
            *c == '<' && text[at + 1..].chars().next().is_some_and(|next| next.is_ascii_alphabetic() || next == '?')
        })
        .map(|(at, _)| at)
}

/// Explicit directional formatting, which can make a line read otherwise than it is.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `word` with each token (a run of letters, digits, `+`, `=`, `_` and `-`) that looks like a
/// credential replaced.
fn redact_secrets(word: &str) -> String {
    let is_token_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '=' | '_' | '-');
    let mut out = String::with_capacity(word.len());
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        out.push_str(if looks_secret(token) { REDACTED } else { token });
        token.clear();
    };
    for c in word.chars() {
        if is_token_char(c) {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out
}

fn looks_secret(token: &str) -> bool {
    let access_key_id = token.len() >= 16
        && ACCESS_KEY_PREFIXES.iter().any(|prefix| token.starts_with(prefix))
        && token.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
    let mixed = |token: &str| {
        token.chars().any(|c| c.is_ascii_uppercase())
            && token.chars().any(|c| c.is_ascii_lowercase())
            && token.chars().any(|c| c.is_ascii_digit())
    };
    access_key_id || (token.len() >= SECRET_TOKEN && mixed(token))
}

fn truncate(mut line: String) -> String {
    if line.len() <= MAX_WORKER_MESSAGE {
        return line;
    }
    let mut end = MAX_WORKER_MESSAGE;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line.truncate(end);
    line.push('…');
    line
}
