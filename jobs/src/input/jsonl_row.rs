//! One JSONL line as a row: its id (a JSON string as is, a number as its text) and its text, or
//! what is wrong with it. Problems are described without saying where the line is; the caller
//! prefixes the file and line.

use serde_json::Value;

use crate::settings::Fields;

/// A parsed line: the id when the line has a usable one, and the text or the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedLine {
    pub id: Option<String>,
    pub text: Result<String, String>,
}

/// Parses one line (without its line ending). `None` for a blank line, which is no row.
pub fn parse_line(line: &[u8], fields: &Fields) -> Option<ParsedLine> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let failed = |problem: String| Some(ParsedLine { id: None, text: Err(problem) });
    let text = match std::str::from_utf8(line) {
        Ok(text) => text,
        Err(error) => return failed(format!("not valid UTF-8 (byte {} of the line)", error.valid_up_to() + 1)),
    };
    let object = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) => object,
        Ok(other) => return failed(format!("not a JSON object but {}", kind(&other))),
        Err(error) => return failed(format!("not JSON: {error}")),
    };
    let (id, id_problem) = match object.get(&fields.id) {
        None | Some(Value::Null) => (None, Some(format!("no `{}` field", fields.id))),
        Some(Value::String(id)) => (Some(id.clone()), None),
        Some(Value::Number(id)) => (Some(id.to_string()), None),
        // Kept as its JSON text so the row can still be found, but refused: ids should be scalars.
        Some(other) => {
            (Some(other.to_string()), Some(format!("`{}` is {}, not a string or number", fields.id, kind(other))))
        }
    };
    let text = match (id_problem, object.get(&fields.text)) {
        (Some(problem), _) => Err(problem),
        (None, None | Some(Value::Null)) => Err(format!("no `{}` field", fields.text)),
        (None, Some(Value::String(text))) if text.is_empty() => Err(format!("`{}` is empty", fields.text)),
        (None, Some(Value::String(text))) => Ok(text.clone()),
        (None, Some(other)) => Err(format!("`{}` is {}, not a string", fields.text, kind(other))),
    };
    Some(ParsedLine { id, text })
}

/// A JSON value's kind, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Option<ParsedLine> {
        parse_line(line.as_bytes(), &Fields::default())
    }

    fn row(id: Option<&str>, text: Result<&str, &str>) -> Option<ParsedLine> {
        Some(ParsedLine { id: id.map(str::to_owned), text: text.map(str::to_owned).map_err(str::to_owned) })
    }

    #[test]
    fn ids_and_texts() {
        assert_eq!(parse(r#"{"id": "a-1", "text": "hello", "other": [1]}"#), row(Some("a-1"), Ok("hello")));
        assert_eq!(parse(r#"{"id": 42, "text": "x"}"#), row(Some("42"), Ok("x")));
        assert_eq!(parse(r#"{"id": 1.5e3, "text": "x"}"#), row(Some("1500.0"), Ok("x")));
        let custom = Fields { id: "doc".into(), text: "body".into() };
        let parsed = parse_line(br#"{"doc": "d", "body": "b", "text": "not this"}"#, &custom);
        assert_eq!(parsed, row(Some("d"), Ok("b")));
    }

    #[test]
    fn blank_lines_are_no_rows() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("  \t"), None);
    }

    #[test]
    fn bad_rows_say_what_is_wrong() {
        let problem = |line: &str| parse(line).unwrap().text.unwrap_err();
        assert!(problem("{not json").starts_with("not JSON: "), "{}", problem("{not json"));
        assert_eq!(problem("[1, 2]"), "not a JSON object but an array");
        assert_eq!(problem(r#"{"text": "x"}"#), "no `id` field");
        assert_eq!(problem(r#"{"id": null, "text": "x"}"#), "no `id` field");
        assert_eq!(problem(r#"{"id": "a"}"#), "no `text` field");
        assert_eq!(problem(r#"{"id": "a", "text": ""}"#), "`text` is empty");
        assert_eq!(problem(r#"{"id": "a", "text": 7}"#), "`text` is a number, not a string");
        assert_eq!(problem(r#"{"id": true, "text": "x"}"#), "`id` is a boolean, not a string or number");
        // The id is kept where the line has one, so the failed row can be found.
        assert_eq!(parse(r#"{"id": "a", "text": ""}"#).unwrap().id.as_deref(), Some("a"));
        assert_eq!(parse(r#"{"id": [1], "text": "x"}"#).unwrap().id.as_deref(), Some("[1]"));
    }

    #[test]
    fn invalid_utf8_is_a_row_error() {
        let parsed = parse_line(b"{\"id\": \"a\", \"text\": \"\xff\xfe\"}", &Fields::default()).unwrap();
        assert_eq!(parsed.id, None);
        assert_eq!(parsed.text, Err("not valid UTF-8 (byte 22 of the line)".to_owned()));
    }
}
