//! The JSON bodies of each HTTP row, at each size an attack sends.

use serde_json::{Value, json};

use super::requests::{long_text, words};
use super::table::{Body, HttpRow, Size};

/// The most inputs one HTTP request may carry (`--max-request-inputs`' default).
const MOST_INPUTS: usize = teifleet_multiplexer::front::http::DEFAULT_MAX_REQUEST_INPUTS;

/// About `n` bytes of JSON string once the inputs' own bytes are taken off (`"a",` each).
fn filler(n: usize, inputs: usize) -> String {
    "p".repeat(n.saturating_sub(inputs * 4 + 200))
}

/// The row's body at `size` (empty for a GET, or a body of `n` bytes sent with it anyway).
pub fn body(row: &HttpRow, size: Size) -> Vec<u8> {
    let many = vec!["a"; MOST_INPUTS];
    let json = match (row.body, size) {
        (Body::None, Size::Long(n) | Size::Many(n)) => return vec![b' '; n],
        (Body::None, _) => return Vec::new(),
        (Body::Embed | Body::EmbedAll, Size::Cheapest) => json!({"inputs": "a"}),
        (Body::Embed | Body::EmbedAll, Size::Long(n)) => json!({"inputs": long_text(n - 100), "truncate": true}),
        (Body::Embed | Body::EmbedAll, Size::Many(n)) => json!({"inputs": many, "prompt_name": filler(n, MOST_INPUTS)}),
        (Body::Embed, Size::BigAnswer) => json!({"inputs": many}),
        (Body::EmbedAll, Size::BigAnswer) => json!({"inputs": words(12_000), "truncate": true}),
        (Body::OpenAi, Size::Cheapest) => json!({"input": "a"}),
        (Body::OpenAi, Size::Long(n)) => json!({"input": long_text(n - 100)}),
        (Body::OpenAi, Size::Many(n)) => json!({"input": many, "model": filler(n, MOST_INPUTS)}),
        (Body::OpenAi, Size::BigAnswer) => json!({"input": many}),
        (Body::Rerank, Size::Cheapest) => json!({"query": "q", "texts": ["a"]}),
        (Body::Rerank, Size::Long(n)) => json!({"query": long_text(n / 2 - 100), "texts": [long_text(n / 2 - 100)]}),
        (Body::Rerank, Size::Many(n)) => json!({"query": filler(n, MOST_INPUTS), "texts": many}),
        (Body::Rerank, Size::BigAnswer) => {
            json!({"query": "q", "texts": vec![words(400); MOST_INPUTS], "return_text": true})
        }
        (Body::Similarity, Size::Cheapest) => json!({"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
        (Body::Similarity, Size::Long(n)) => {
            json!({"inputs": {"source_sentence": long_text(n / 2 - 100), "sentences": [long_text(n / 2 - 100)]}})
        }
        (Body::Similarity, Size::Many(n)) => {
            let sentences = &many[1..];
            json!({"inputs": {"source_sentence": filler(n, MOST_INPUTS), "sentences": sentences},
                   "parameters": {"prompt_name": "p"}})
        }
        (Body::Similarity, Size::BigAnswer) => json!({"inputs": {"source_sentence": "a", "sentences": &many[1..]}}),
        (Body::Predict, Size::Cheapest) => json!({"inputs": "a"}),
        (Body::Predict, Size::Long(n)) => json!({"inputs": long_text(n - 100), "truncate": true}),
        (Body::Predict, Size::Many(_) | Size::BigAnswer) => json!({"inputs": many, "raw_scores": true}),
        (Body::Tokenize, Size::Cheapest) => json!({"inputs": "a"}),
        (Body::Tokenize, Size::Long(n)) => json!({"inputs": long_text(n - 100)}),
        (Body::Tokenize, Size::Many(n)) => json!({"inputs": many, "prompt_name": filler(n, MOST_INPUTS)}),
        (Body::Tokenize, Size::BigAnswer) => json!({"inputs": vec![words(300); MOST_INPUTS]}),
        (Body::Decode, Size::Cheapest) => json!({"ids": [1000]}),
        (Body::Decode, Size::Long(n)) => json!({"ids": vec![1000; n / 5 - 20]}),
        (Body::Decode, Size::Many(n)) => json!({"ids": vec![vec![1000; (n / 5 - 20) / MOST_INPUTS]; MOST_INPUTS]}),
        (Body::Decode, Size::BigAnswer) => json!({"ids": vec![vec![1000; 100]; MOST_INPUTS]}),
    };
    serde_json::to_vec(&json).expect("JSON encodes")
}

/// A JSON body of the row with `value` where its main input goes (for bodies broken on purpose).
pub fn with_input(row: &HttpRow, value: Value) -> Value {
    match row.body {
        Body::None | Body::Embed | Body::EmbedAll | Body::Predict | Body::Tokenize => json!({"inputs": value}),
        Body::OpenAi => json!({"input": value}),
        Body::Rerank => json!({"query": "q", "texts": value}),
        Body::Similarity => json!({"inputs": {"source_sentence": "a", "sentences": value}}),
        Body::Decode => json!({"ids": value}),
    }
}

/// As many inputs as `n` bytes of body hold, far past the most one request may carry.
pub fn most_inputs(row: &HttpRow, n: usize) -> Vec<u8> {
    let value = match row.body {
        Body::None => return vec![b' '; n],
        Body::Decode => json!(vec![[1000]; (n - 100) / 7]),
        _ => json!(vec!["a"; (n - 100) / 4]),
    };
    serde_json::to_vec(&with_input(row, value)).expect("JSON encodes")
}
