//! Lists of inputs read with the request's input cap in force while the JSON is parsed, not after.
//!
//! Why: a 2 MB body holds about 500,000 one-character inputs. Parsed whole and counted afterwards,
//! each became a `String` (and, through serde's untagged enums, a buffered `Content` value before
//! that): 30 to 60 MB held for a request refused anyway, 15 to 30 times its bytes. Here a list
//! keeps at most the cap's elements and only counts the rest (`IgnoredAny` allocates nothing),
//! so the refusal says how many there were and the parse holds what an accepted request would.
//!
//! The cap reaches the `Deserialize` impls through a thread-local that [`parse_within`] sets
//! around one synchronous `serde_json::from_slice`: serde gives no other way to hand a runtime
//! bound to a derived struct's field.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, IgnoredAny, SeqAccess, Visitor};

thread_local! {
    /// Elements a list may keep while [`parse_within`] runs on this thread.
    static CAP: Cell<usize> = const { Cell::new(usize::MAX) };
    /// The most elements a list had when it had more than [`CAP`].
    static OVER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// `serde_json::from_slice` with lists of inputs capped at `cap` elements. `Ok(Err(count))` when a
/// list had more (`count` of them): nothing past the cap was kept.
pub fn parse_within<T: DeserializeOwned>(body: &[u8], cap: usize) -> serde_json::Result<Result<T, usize>> {
    let previous = CAP.with(|c| c.replace(cap));
    OVER.with(|o| o.set(None));
    let parsed = serde_json::from_slice::<T>(body);
    CAP.with(|c| c.set(previous));
    let over = OVER.with(|o| o.take());
    Ok(match (parsed?, over) {
        (_, Some(count)) => Err(count),
        (value, None) => Ok(value),
    })
}

/// Reads a JSON list keeping at most the cap's elements, counting the rest.
pub fn capped_seq<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(mut seq: A) -> Result<Vec<T>, A::Error> {
    let cap = CAP.with(Cell::get);
    let mut kept = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(cap).min(4096));
    while kept.len() < cap {
        match seq.next_element()? {
            Some(element) => kept.push(element),
            None => return Ok(kept),
        }
    }
    let mut count = kept.len();
    while seq.next_element::<IgnoredAny>()?.is_some() {
        count += 1;
    }
    if count > cap {
        OVER.with(|o| o.set(Some(o.get().map_or(count, |seen| seen.max(count)))));
    }
    Ok(kept)
}

/// A field that is a capped list: `#[serde(deserialize_with = "capped::vec")]`.
pub fn vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Vec<T>, D::Error> {
    struct Capped<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Capped<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Vec<T>, A::Error> {
            capped_seq(seq)
        }
    }
    deserializer.deserialize_seq(Capped(PhantomData))
}

/// A list's element that is one thing or a list of them, told apart without buffering it.
pub enum OneOrList<T> {
    One(T),
    List(Vec<T>),
}

/// What a scalar of a [`OneOrList`] may be: a string or an integer.
pub trait Scalar: Sized {
    const EXPECTING: &'static str;
    fn from_str<E: de::Error>(_: &str) -> Result<Self, E> {
        Err(E::custom(format!("expected {}", Self::EXPECTING)))
    }
    fn from_u64<E: de::Error>(_: u64) -> Result<Self, E> {
        Err(E::custom(format!("expected {}", Self::EXPECTING)))
    }
}

impl Scalar for String {
    const EXPECTING: &'static str = "a string or a list of strings";
    fn from_str<E: de::Error>(text: &str) -> Result<Self, E> {
        Ok(text.to_owned())
    }
}

impl Scalar for u32 {
    const EXPECTING: &'static str = "a token id or a list of token ids";
    fn from_u64<E: de::Error>(id: u64) -> Result<Self, E> {
        u32::try_from(id).map_err(|_| E::custom(format!("token id {id} is out of range")))
    }
}

impl<'de, T: Scalar + Deserialize<'de>> Deserialize<'de> for OneOrList<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Either<T>(PhantomData<T>);
        impl<'de, T: Scalar + Deserialize<'de>> Visitor<'de> for Either<T> {
            type Value = OneOrList<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(T::EXPECTING)
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                T::from_str(text).map(OneOrList::One)
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
                T::from_u64(value).map(OneOrList::One)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                capped_seq(seq).map(OneOrList::List)
            }
        }
        deserializer.deserialize_any(Either(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Body {
        #[serde(deserialize_with = "vec")]
        texts: Vec<String>,
    }

    #[test]
    fn a_list_past_the_cap_keeps_the_cap_and_counts_the_rest() {
        let body = format!(r#"{{"texts":[{}]}}"#, ["\"a\""; 10].join(","));
        let over = parse_within::<Body>(body.as_bytes(), 4).unwrap();
        assert_eq!(over.err(), Some(10));
        let within = parse_within::<Body>(body.as_bytes(), 10).unwrap().ok().unwrap();
        assert_eq!(within.texts.len(), 10);
        // The cap is the call's alone: the thread's default is none.
        let body = format!(r#"{{"texts":[{}]}}"#, vec!["\"a\""; 5000].join(","));
        assert_eq!(serde_json::from_str::<Body>(&body).unwrap().texts.len(), 5000);
    }

    #[test]
    fn one_or_a_list_is_read_without_buffering() {
        let one: OneOrList<String> = serde_json::from_str(r#""a""#).unwrap();
        assert!(matches!(one, OneOrList::One(text) if text == "a"));
        let list: OneOrList<u32> = serde_json::from_str("[1, 2]").unwrap();
        assert!(matches!(list, OneOrList::List(ids) if ids == [1, 2]));
        assert!(serde_json::from_str::<OneOrList<String>>("1").is_err());
        assert!(serde_json::from_str::<OneOrList<u32>>("[4294967296]").is_err());
    }
}
