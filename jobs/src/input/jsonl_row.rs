//! One JSONL line as a row: its id and its text, or what is wrong with it. Problems are described
//! without saying where the line is; the caller prefixes the file and line.
//!
//! The id is written exactly as the line has it: a JSON string as its text, anything else as its
//! JSON text byte for byte (`18446744073709551617`, `-0`, `1.5e3`). A number is never parsed,
//! so no two ids in the input become one in the output by rounding. The line is read without
//! building a tree of it: only the id and the text are taken, every other value is skipped
//! (serde_json skips with a stack of one byte per level, so deep nesting costs no recursion).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

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
    let trimmed = text.trim_start();
    if !trimmed.starts_with('{') {
        // Checked without building it (serde_json skips nested values iteratively).
        return failed(match (serde_json::from_str::<IgnoredAny>(trimmed), kind(trimmed)) {
            (Ok(_), Some(kind)) => format!("not a JSON object but {kind}"),
            (Ok(_), None) => "not a JSON object".to_owned(),
            (Err(error), _) => format!("not JSON: {error}"),
        });
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let found = match (TwoFields { fields }).deserialize(&mut deserializer).and_then(|found| {
        deserializer.end()?;
        Ok(found)
    }) {
        Ok(found) => found,
        Err(error) => return failed(format!("not JSON: {error}")),
    };
    let (id, id_problem) = match found.id.map(RawValue::get) {
        None => (None, Some(format!("no `{}` field", fields.id))),
        Some(raw) => match raw.as_bytes().first() {
            Some(b'n') => (None, Some(format!("no `{}` field", fields.id))),
            Some(b'"') => (serde_json::from_str::<String>(raw).ok(), None),
            Some(b'-' | b'0'..=b'9') => (Some(raw.to_owned()), None),
            // Kept as its JSON text so the row can still be found, but refused: ids should be
            // scalars.
            _ => {
                let problem = format!("`{}` is {}, not a string or number", fields.id, kind(raw).unwrap_or("unknown"));
                (Some(raw.to_owned()), Some(problem))
            }
        },
    };
    let text = match (id_problem, found.text.map(RawValue::get)) {
        (Some(problem), _) => Err(problem),
        (None, None) => Err(format!("no `{}` field", fields.text)),
        (None, Some(raw)) if raw.starts_with('"') => match serde_json::from_str::<String>(raw) {
            Ok(text) if text.is_empty() => Err(format!("`{}` is empty", fields.text)),
            Ok(text) => Ok(text),
            Err(error) => Err(format!("not JSON: {error}")),
        },
        (None, Some(raw)) if raw.starts_with('n') => Err(format!("no `{}` field", fields.text)),
        (None, Some(raw)) => Err(format!("`{}` is {}, not a string", fields.text, kind(raw).unwrap_or("unknown"))),
    };
    Some(ParsedLine { id, text })
}

/// The id's and the text's JSON text, where the object has them (the last of a repeated key, as
/// serde_json's own maps keep).
struct Found<'de> {
    id: Option<&'de RawValue>,
    text: Option<&'de RawValue>,
}

/// Reads an object, keeping the two fields' values as their JSON text and skipping the rest.
struct TwoFields<'a> {
    fields: &'a Fields,
}

impl<'de> DeserializeSeed<'de> for TwoFields<'_> {
    type Value = Found<'de>;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TwoFields<'_> {
    type Value = Found<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = Found { id: None, text: None };
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == self.fields.id.as_str() {
                found.id = Some(map.next_value()?);
            } else if key == self.fields.text.as_str() {
                found.text = Some(map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// A JSON value's kind from its first byte, for messages; `None` where no JSON value starts so.
fn kind(json: &str) -> Option<&'static str> {
    Some(match json.as_bytes().first()? {
        b'n' => "null",
        b't' | b'f' => "a boolean",
        b'-' | b'0'..=b'9' => "a number",
        b'"' => "a string",
        b'[' => "an array",
        b'{' => "an object",
        _ => return None,
    })
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
        assert_eq!(parse(r#"{"id": 1.5e3, "text": "x"}"#), row(Some("1.5e3"), Ok("x")), "as written");
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
        assert_eq!(problem(r#"{"id": "a", "text": null}"#), "no `text` field");
        assert_eq!(problem(r#"{"id": "a", "text": {"nested": "x"}}"#), "`text` is an object, not a string");
        assert!(problem(r#"{"id": "a", "text": "x"} trailing"#).starts_with("not JSON: "));
        assert!(problem(r#"{"id": "a", "text": "x""#).starts_with("not JSON: "));
        assert_eq!(problem(r#""just a string""#), "not a JSON object but a string");
    }

    #[test]
    fn ids_are_kept_exactly_as_written() {
        let ids = [
            "18446744073709551615",
            "18446744073709551616",
            "18446744073709551617",
            "-9223372036854775809",
            "123456789012345678901234567890",
            "-0",
            "0",
            "1e400",
            "1.0",
            "1",
            "0.30000000000000004",
        ];
        for id in ids {
            let parsed = parse(&format!(r#"{{"text": "x", "id": {id}}}"#)).unwrap();
            assert_eq!(Some(parsed), row(Some(id), Ok("x")));
        }
        assert_eq!(parse(r#"{"id": "a\"b\u00e9", "text": "x"}"#), row(Some("a\"b\u{e9}"), Ok("x")));
        assert_eq!(parse(r#"{"id": "1", "id": "2", "text": "x"}"#), row(Some("2"), Ok("x")), "the last, as serde_json");
    }

    #[test]
    fn deep_nesting_is_a_row_error_or_skipped_without_recursion() {
        let deep = "[".repeat(100_000);
        let unclosed = parse(&deep).unwrap().text.unwrap_err();
        assert!(unclosed.starts_with("not JSON: EOF while parsing a list"), "{unclosed}");
        let closed = format!("{deep}{}", "]".repeat(100_000));
        assert_eq!(parse(&closed).unwrap().text, Err("not a JSON object but an array".to_owned()));
        let inside = format!(r#"{{"id": "a", "text": "x", "other": {deep}}}"#);
        assert!(parse(&inside).unwrap().text.unwrap_err().starts_with("not JSON: "));
        let closed = format!(r#"{{"id": "a", "other": {deep}{}, "text": "x"}}"#, "]".repeat(100_000));
        assert_eq!(parse(&closed), row(Some("a"), Ok("x")), "skipped values may nest deep");
        let deep_text = format!(r#"{{"id": "a", "text": {deep}}}"#);
        assert!(parse(&deep_text).unwrap().text.unwrap_err().starts_with("not JSON: "));
    }

    #[test]
    fn invalid_utf8_is_a_row_error() {
        let parsed = parse_line(b"{\"id\": \"a\", \"text\": \"\xff\xfe\"}", &Fields::default()).unwrap();
        assert_eq!(parsed.id, None);
        assert_eq!(parsed.text, Err("not valid UTF-8 (byte 22 of the line)".to_owned()));
    }
}
