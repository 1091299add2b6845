//! The HTTP front's bodies fuzzed through the whole front, in process: every route of
//! `front::http::ROUTES` that takes a body gets its own example mutated byte by byte, fields of
//! its JSON set to huge numbers, odd values and deep nesting, and arbitrary bytes. `fuzz.rs`
//! holds the JSON parsing to TEI's; this holds what follows it (every route, the checks after
//! parsing, the calls upstream, the answer) to: never a panic (a dropped connection) nor a 5xx,
//! and every refusal a 4xx in the route's own error shape. Proptest's default 256 cases
//! (`PROPTEST_CASES` for more), each sent to every route.

use std::net::SocketAddr;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use teifleet_multiplexer::front::http::error::Flavor;
use teifleet_multiplexer::front::http::{ROUTES, Route};

use super::client::{http_call, http_request};

/// Routes that take a body, with their example body.
fn with_bodies() -> Vec<(&'static Route, &'static str)> {
    ROUTES.iter().filter_map(|route| Some((route, route.example?))).collect()
}

/// Values that tend to break what reads them: huge, negative, fractional, not-a-number,
/// nested, empty, null.
fn odd_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(1e308)),
        Just(json!(-1)),
        Just(json!(0.5)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(4_294_967_296u64)),
        Just(json!(null)),
        Just(json!("")),
        Just(json!([])),
        Just(json!({})),
        Just(json!([[[[[[[[["deep"]]]]]]]]])),
        Just(json!(["", ""])),
        Just(json!([[]])),
        Just(json!("left")),
        any::<i64>().prop_map(Value::from),
        "[a-z ]{0,8}".prop_map(Value::from),
    ]
}

const FIELDS: &[&str] = &[
    "inputs",
    "input",
    "query",
    "texts",
    "ids",
    "dimensions",
    "truncate",
    "truncation_direction",
    "prompt_name",
    "normalize",
    "raw_scores",
    "return_text",
    "add_special_tokens",
    "skip_special_tokens",
    "encoding_format",
    "model",
    "parameters",
    "sentences",
    "source_sentence",
];

/// What is done to a route's example body.
#[derive(Clone, Debug)]
enum Mutation {
    /// A field of the example set to an odd value.
    Field(&'static str, Value),
    /// A field set to a number too large (or too small) for any type, as raw JSON text.
    Huge(&'static str, String),
    /// Bytes inserted, replaced or removed.
    Edits(Vec<(Index, u8, u8)>),
    /// An array nested this deep where the inputs go.
    Nested(usize),
    /// Bytes at random, the example dropped.
    Random(Vec<u8>),
}

impl Mutation {
    fn apply(&self, example: &str) -> Vec<u8> {
        match self {
            Self::Field(name, value) => {
                let mut json: Value = serde_json::from_str(example).unwrap_or_default();
                if let Some(object) = json.as_object_mut() {
                    object.insert((*name).to_owned(), value.clone());
                }
                serde_json::to_vec(&json).unwrap_or_default()
            }
            Self::Huge(name, number) => {
                let mut text = example.to_owned();
                text.insert_str(1, &format!("\"{name}\": {number}, "));
                text.into_bytes()
            }
            Self::Edits(edits) => {
                let mut bytes = example.as_bytes().to_vec();
                for (place, edit, byte) in edits {
                    let i = place.index(bytes.len() + 1);
                    match edit {
                        0 => bytes.insert(i, *byte),
                        1 if i < bytes.len() => bytes[i] = *byte,
                        _ if i < bytes.len() => drop(bytes.remove(i)),
                        _ => bytes.push(*byte),
                    }
                }
                bytes
            }
            Self::Nested(depth) => format!("{{\"inputs\": {}", "[".repeat(*depth)).into_bytes(),
            Self::Random(bytes) => bytes.clone(),
        }
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let field = (prop::sample::select(FIELDS), odd_value()).prop_map(|(name, value)| Mutation::Field(name, value));
    let numbers = vec!["1e400".to_owned(), "-1e400".to_owned(), "1".repeat(400), "-0.0e-99999".to_owned()];
    let huge = (prop::sample::select(FIELDS), prop::sample::select(numbers)).prop_map(|(n, v)| Mutation::Huge(n, v));
    let edits = vec((any::<Index>(), 0..3u8, any::<u8>()), 1..5).prop_map(Mutation::Edits);
    let nested = (1usize..200_000).prop_map(Mutation::Nested);
    let random = vec(any::<u8>(), 0..512).prop_map(Mutation::Random);
    prop_oneof![3 => field, 2 => huge, 3 => edits, 1 => nested, 1 => random]
}

/// Whether `answer` is what a route may answer any body: served, or a 4xx in its error shape.
fn acceptable(route: &Route, status: u16, json: &Value) -> bool {
    match (status, route.flavor) {
        (200, _) => true,
        // TEI's OpenAI-compatible error: `{"message", "code", "type"}`.
        (400..=499, Flavor::OpenAi) => json["message"].is_string() && json["type"].is_string(),
        (400..=499, _) => json["error"].is_string() && json["error_type"].is_string(),
        _ => false,
    }
}

async fn front() -> (teifleet_tei_sim::SimHandle, teifleet_multiplexer::run::server::Running, SocketAddr) {
    let sim = crate::support::sim(|_| {}).await;
    let running = crate::http_front::front(crate::support::limits(64, 256), &sim, Default::default()).await;
    let http = running.http_addr.expect("the HTTP front");
    (sim, running, http)
}

#[test]
fn arbitrary_bodies_to_every_route_are_served_or_refused_in_its_shape() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let (sim, running, http) = runtime.block_on(front());
    let routes = with_bodies();
    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::default() });
    let outcome = runner.run(&mutation(), |mutation| {
        for (route, example) in &routes {
            let bytes = mutation.apply(example);
            let answer = runtime.block_on(http_call(http, &http_request("POST", route.path, &[], &bytes)));
            let answer = answer.map_err(|why| TestCaseError::fail(format!("{}: no answer ({why})", route.path)))?;
            prop_assert!(
                acceptable(route, answer.status, &answer.json()),
                "{}: {} {} for {:?}",
                route.path,
                answer.status,
                String::from_utf8_lossy(&answer.body),
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            );
        }
        Ok(())
    });
    runtime.block_on(async {
        running.shutdown().await.expect("stops");
        sim.shutdown().await;
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
