//! One line of an OpenAI batch input file, judged before anything is sent: a request to forward
//! (its `body` borrowed from the line, to go out byte for byte), or why it is refused. Only what
//! the contract names is looked at; everything else in `body` is the pool's to judge.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The one endpoint a line may name.
pub const ENDPOINT: &str = "/v1/embeddings";

/// A line malformed in any way the contract names.
pub const INVALID_REQUEST: &str = "invalid_request";
/// A line asking for a model other than the pool's.
pub const MODEL_NOT_FOUND: &str = "model_not_found";

/// A line to forward: its id (decoded: it may hold escapes) and its body, borrowed from the line.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub custom_id: String,
    pub body: &'a RawValue,
}

/// A line refused without a call: its error line's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Known when the line had a usable one.
    pub custom_id: Option<String>,
    pub code: &'static str,
    pub message: String,
}

/// The fields read, each left raw so nothing is copied or judged before its turn.
#[derive(Deserialize)]
struct LineView<'a> {
    #[serde(borrow, default)]
    custom_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    url: Option<&'a RawValue>,
    #[serde(borrow, default)]
    body: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct BodyView<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
}

/// Judges one non-blank line against `model`, the pool's model.
pub fn judge<'a>(line: &'a [u8], model: &str) -> Result<Request<'a>, Refused> {
    let refuse = |custom_id: Option<&str>, code, message: String| Refused {
        custom_id: custom_id.map(str::to_owned),
        code,
        message,
    };
    let invalid = |custom_id: Option<&str>, message: &str| refuse(custom_id, INVALID_REQUEST, message.to_owned());
    let text = std::str::from_utf8(line).map_err(|_| invalid(None, "the line is not UTF-8"))?;
    // serde's derived structs also take arrays, field by field: only an object is a request.
    if !text.trim_start().starts_with('{') {
        return Err(invalid(None, "the line is not a JSON object"));
    }
    let view: LineView<'_> = serde_json::from_str(text)
        .map_err(|error| refuse(None, INVALID_REQUEST, format!("the line is not a JSON object: {error}")))?;
    let custom_id = match view.custom_id.map(|raw| serde_json::from_str::<String>(raw.get())) {
        Some(Ok(id)) if !id.is_empty() => id,
        Some(Ok(_)) => return Err(invalid(None, "`custom_id` is empty")),
        Some(Err(_)) => return Err(invalid(None, "`custom_id` is not a string")),
        None => return Err(invalid(None, "no `custom_id`")),
    };
    let id = Some(custom_id.as_str());
    match string_of(view.method).as_deref() {
        Some("POST") => {}
        Some(other) => {
            return Err(refuse(id, INVALID_REQUEST, format!("`method` is {other:?}: only \"POST\" is taken")));
        }
        None => return Err(invalid(id, "no `method` (a string, \"POST\")")),
    }
    match string_of(view.url).as_deref() {
        Some(ENDPOINT) => {}
        Some(other) => {
            let message = format!("`url` is {other:?}: this batch takes {ENDPOINT:?} only");
            return Err(refuse(id, INVALID_REQUEST, message));
        }
        None => return Err(invalid(id, "no `url` (a string, \"/v1/embeddings\")")),
    }
    let body = view.body.filter(|body| body.get().starts_with('{')).ok_or_else(|| invalid(id, "no `body` object"))?;
    let body_view: BodyView<'_> = serde_json::from_str(body.get())
        .map_err(|error| refuse(id, INVALID_REQUEST, format!("`body` is not a JSON object: {error}")))?;
    match string_of(body_view.model) {
        Some(asked) if asked == model => {}
        Some(asked) => {
            let message = format!("the model `{asked}` does not exist here: this batch's pool serves `{model}`");
            return Err(refuse(id, MODEL_NOT_FOUND, message));
        }
        None => return Err(invalid(id, "no `body.model` (a string)")),
    }
    if let Some(problem) = input_problem(body_view.input) {
        return Err(refuse(id, INVALID_REQUEST, problem));
    }
    Ok(Request { custom_id, body })
}

/// A raw field's string value, if it is one.
fn string_of(raw: Option<&RawValue>) -> Option<String> {
    raw.and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
}

/// What is wrong with `body.input`, if anything: it must be a non-empty string, or a non-empty
/// array of non-empty strings.
fn input_problem(input: Option<&RawValue>) -> Option<String> {
    let Some(input) = input else { return Some("no `body.input`".to_owned()) };
    let raw = input.get();
    if raw.starts_with('"') {
        return match serde_json::from_str::<String>(raw) {
            Ok(text) if text.is_empty() => Some("`body.input` is an empty string".to_owned()),
            Ok(_) => None,
            Err(error) => Some(format!("`body.input`: {error}")),
        };
    }
    if !raw.starts_with('[') {
        return Some("`body.input` is neither a string nor an array of strings".to_owned());
    }
    match serde_json::from_str::<Vec<&RawValue>>(raw) {
        Ok(items) if items.is_empty() => Some("`body.input` is an empty array".to_owned()),
        Ok(items) => items.iter().enumerate().find_map(|(index, item)| match string_of(Some(item)) {
            Some(text) if text.is_empty() => Some(format!("`body.input[{index}]` is an empty string")),
            Some(_) => None,
            None => Some(format!("`body.input[{index}]` is not a string")),
        }),
        Err(error) => Some(format!("`body.input`: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = "bge";

    fn refused(line: &str) -> Refused {
        judge(line.as_bytes(), MODEL).unwrap_err()
    }

    fn line(custom_id: &str, body: &str) -> String {
        format!(r#"{{"custom_id": {custom_id}, "method": "POST", "url": "/v1/embeddings", "body": {body}}}"#)
    }

    #[test]
    fn a_good_line_is_forwarded_with_its_body_verbatim() {
        let body = r#"{"model": "bge", "input": ["a", "b\n"], "encoding_format": "base64", "extra": {"x": 1}}"#;
        let text = line(r#""req-\u0031""#, body);
        let request = judge(text.as_bytes(), MODEL).unwrap();
        assert_eq!(request.custom_id, "req-1", "escapes in the id are decoded");
        assert_eq!(request.body.get(), body);
        assert!(judge(line(r#""s""#, r#"{"model": "bge", "input": "one"}"#).as_bytes(), MODEL).is_ok());
    }

    #[test]
    fn each_fault_is_named_and_coded() {
        let cases = [
            ("not json", None, INVALID_REQUEST, "not a JSON object"),
            ("[1, 2]", None, INVALID_REQUEST, "not a JSON object"),
            (r#"{"method": "POST"}"#, None, INVALID_REQUEST, "no `custom_id`"),
            (r#"{"custom_id": ""}"#, None, INVALID_REQUEST, "`custom_id` is empty"),
            (r#"{"custom_id": 7}"#, None, INVALID_REQUEST, "not a string"),
            (r#"{"custom_id": "a", "method": "GET", "url": "/v1/embeddings"}"#, Some("a"), INVALID_REQUEST, "\"GET\""),
            (
                r#"{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}"#,
                Some("a"),
                INVALID_REQUEST,
                "`url`",
            ),
            (
                r#"{"custom_id": "a", "method": "POST", "url": "/v1/embeddings"}"#,
                Some("a"),
                INVALID_REQUEST,
                "no `body` object",
            ),
        ];
        for (text, id, code, says) in cases {
            let refusal = refused(text);
            assert_eq!((refusal.custom_id.as_deref(), refusal.code), (id, code), "{text}");
            assert!(refusal.message.contains(says), "{text}: {}", refusal.message);
        }
        let bodies = [
            (r#"{"model": "other", "input": "x"}"#, MODEL_NOT_FOUND, "`other`"),
            (r#"{"input": "x"}"#, INVALID_REQUEST, "no `body.model`"),
            (r#"{"model": "bge"}"#, INVALID_REQUEST, "no `body.input`"),
            (r#"{"model": "bge", "input": ""}"#, INVALID_REQUEST, "empty string"),
            (r#"{"model": "bge", "input": []}"#, INVALID_REQUEST, "empty array"),
            (r#"{"model": "bge", "input": ["a", 3]}"#, INVALID_REQUEST, "`body.input[1]` is not a string"),
            (r#"{"model": "bge", "input": 3}"#, INVALID_REQUEST, "neither"),
            (r#""a string""#, INVALID_REQUEST, "no `body` object"),
            (r#"["bge", "x"]"#, INVALID_REQUEST, "no `body` object"),
        ];
        for (body, code, says) in bodies {
            let refusal = refused(&line(r#""b""#, body));
            assert_eq!((refusal.custom_id.as_deref(), refusal.code), (Some("b"), code), "{body}");
            assert!(refusal.message.contains(says), "{body}: {}", refusal.message);
        }
        assert!(judge(b"{\"custom_id\": \"\xff\"}", MODEL).unwrap_err().message.contains("UTF-8"));
    }
}
