//! OpenAI's list pages: `{"object":"list","data":[...],"first_id","last_id","has_more"}`, cut by an
//! `after` cursor (the id of the last item of the page before) and a `limit`.

use serde::Serialize;

use crate::{Error, Result};

/// One page of a list.
#[derive(Debug, Serialize)]
pub struct Page<T> {
    pub object: &'static str,
    pub data: Vec<T>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

/// The page of `items` (already in the list's order) after `after`, at most `limit` long. A
/// cursor naming no item gives an empty page, as a cursor past the end does.
pub fn page<T>(items: Vec<T>, id: impl Fn(&T) -> &str, after: Option<&str>, limit: usize) -> Page<T> {
    let start = match after {
        Some(after) => items.iter().position(|item| id(item) == after).map_or(items.len(), |at| at + 1),
        None => 0,
    };
    let has_more = items.len() > start + limit;
    let data: Vec<T> = items.into_iter().skip(start).take(limit).collect();
    Page {
        object: "list",
        first_id: data.first().map(|item| id(item).to_owned()),
        last_id: data.last().map(|item| id(item).to_owned()),
        has_more,
        data,
    }
}

/// `limit` checked against OpenAI's bounds for the list (1 to `max`), `default` when absent.
pub fn limit(asked: Option<i64>, default: usize, max: usize) -> Result<usize> {
    match asked {
        None => Ok(default),
        Some(n) if n >= 1 && n as u64 <= max as u64 => Ok(n as usize),
        Some(n) => Err(Error::bad_request(
            format!(
                "Invalid 'limit': integer out of range. Expected a value between 1 and {max}, but got {n} instead."
            ),
            Some("limit"),
            Some("integer_out_of_range"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_the_cursor() {
        let items: Vec<String> = (0..5).map(|n| format!("id{n}")).collect();
        let first = page(items.clone(), |s| s, None, 2);
        assert_eq!(
            (first.data.len(), first.first_id.as_deref(), first.last_id.as_deref(), first.has_more),
            (2, Some("id0"), Some("id1"), true)
        );
        let last = page(items.clone(), |s| s, Some("id3"), 2);
        assert_eq!((last.data, last.has_more), (vec!["id4".to_owned()], false));
        let unknown = page(items, |s| s, Some("nope"), 2);
        assert!(unknown.data.is_empty() && unknown.first_id.is_none() && !unknown.has_more);
        assert!(limit(Some(0), 20, 100).is_err() && limit(Some(101), 20, 100).is_err());
        assert_eq!(limit(None, 20, 100).unwrap(), 20);
    }
}
