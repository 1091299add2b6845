//! Property fuzzing of what the multiplexer reads from callers before anything else does: the
//! protobuf fields it reads without decoding (`wire`), the HTTP front's JSON bodies, and the
//! request metadata headers. Arbitrary input never panics and reads as the truth. Each property
//! runs proptest's 256 cases here (`make unit`); `make fuzz` runs many more (`PROPTEST_CASES`).

use proptest::test_runner::Config;

/// Proptest's defaults (256 cases, or `PROPTEST_CASES`), without regression files: a failure
/// prints its shrunk input, and nothing is written into the checkout.
fn config() -> Config {
    Config { failure_persistence: None, ..Config::default() }
}

/// `wire::request_size` and `wire::tei_timing` against hand-encoded fields, prost's own
/// encodings, and those cut short or followed by garbage.
mod protobuf {
    use std::time::Duration;

    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::Index;
    use prost::Message as _;
    use prost::encoding::encode_varint;
    use teifleet_multiplexer::vocab::rpc::{self, RPCS};
    use teifleet_multiplexer::vocab::wire::{RequestSize, TeiTiming, request_size, tei_timing};
    use teifleet_proto::v1;

    /// A field's value as an encoder writes it.
    #[derive(Clone, Debug)]
    enum Raw {
        Varint(u64),
        Fixed64(u64),
        Fixed32(u32),
        Bytes(Vec<u8>),
        /// Length-delimited, and itself a message (TEI's `Metadata` inside a response).
        Message(Vec<(u32, Raw)>),
    }

    fn encode(fields: &[(u32, Raw)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (number, value) in fields {
            let key = u64::from(*number) << 3;
            match value {
                Raw::Varint(v) => {
                    encode_varint(key, &mut out);
                    encode_varint(*v, &mut out);
                }
                Raw::Fixed64(v) => {
                    encode_varint(key | 1, &mut out);
                    out.extend(v.to_le_bytes());
                }
                Raw::Fixed32(v) => {
                    encode_varint(key | 5, &mut out);
                    out.extend(v.to_le_bytes());
                }
                Raw::Bytes(bytes) => {
                    encode_varint(key | 2, &mut out);
                    encode_varint(bytes.len() as u64, &mut out);
                    out.extend(bytes);
                }
                Raw::Message(inner) => {
                    let bytes = encode(inner);
                    encode_varint(key | 2, &mut out);
                    encode_varint(bytes.len() as u64, &mut out);
                    out.extend(bytes);
                }
            }
        }
        out
    }

    /// Mostly the few numbers the reader looks for, so fields collide with them often.
    fn field_number() -> impl Strategy<Value = u32> {
        prop_oneof![3 => 0u32..8, 1 => any::<u32>()]
    }

    fn flat_value() -> impl Strategy<Value = Raw> {
        prop_oneof![
            prop_oneof![0u64..300, any::<u64>()].prop_map(Raw::Varint),
            any::<u64>().prop_map(Raw::Fixed64),
            any::<u32>().prop_map(Raw::Fixed32),
            vec(any::<u8>(), 0..24).prop_map(Raw::Bytes),
        ]
    }

    fn raw_fields() -> impl Strategy<Value = Vec<(u32, Raw)>> {
        let value =
            prop_oneof![4 => flat_value(), 1 => vec((field_number(), flat_value()), 0..8).prop_map(Raw::Message)];
        vec((field_number(), value), 0..16)
    }

    fn size_of(fields: &[(u32, Raw)], inputs_field: Option<u32>, text_fields: &[u32]) -> RequestSize {
        let mut size = RequestSize { inputs: u32::from(inputs_field.is_none()), text_bytes: 0 };
        for (number, value) in fields {
            size.inputs += u32::from(Some(*number) == inputs_field);
            if text_fields.contains(number) {
                size.text_bytes += match value {
                    Raw::Bytes(bytes) => bytes.len(),
                    Raw::Message(inner) => encode(inner).len(),
                    Raw::Varint(_) | Raw::Fixed64(_) | Raw::Fixed32(_) => 0,
                };
            }
        }
        size
    }

    /// What `tei_timing` must find in a response's fields.
    #[derive(Debug, PartialEq)]
    enum Timing {
        Absent,
        /// Field 2 is there but holds arbitrary bytes: found, with whatever they read as.
        Opaque,
        Exactly(TeiTiming),
    }

    fn timing_of(fields: &[(u32, Raw)]) -> Timing {
        let metadata = fields.iter().find_map(|(number, value)| match (number, value) {
            (2, Raw::Message(inner)) => Some(Some(inner)),
            (2, Raw::Bytes(_)) => Some(None),
            _ => None,
        });
        let inner = match metadata {
            None => return Timing::Absent,
            Some(None) => return Timing::Opaque,
            Some(Some(inner)) => inner,
        };
        let mut timing = TeiTiming::default();
        for (number, value) in inner {
            let Raw::Varint(v) = value else { continue };
            match number {
                1 => timing.compute_chars = *v,
                2 => timing.compute_tokens = *v,
                5 => timing.queue = Duration::from_nanos(*v),
                6 => timing.inference = Duration::from_nanos(*v),
                _ => {}
            }
        }
        Timing::Exactly(timing)
    }

    /// A request's size as `charge::cost_of` reads it for the table's row of `path`.
    fn size_by_row(path: &str, message: &[u8]) -> RequestSize {
        let rpc = rpc::find(path).unwrap_or_else(|| panic!("{path} is a row of rpc::RPCS"));
        let per_field = match rpc.inputs {
            rpc::Inputs::PerField(field) => Some(field),
            rpc::Inputs::One | rpc::Inputs::None => None,
        };
        request_size(message, per_field, rpc.text_fields)
    }

    /// One request message, the rows whose requests it is, and what it truly carries.
    #[derive(Clone, Debug)]
    struct Case {
        rows: &'static [&'static str],
        message: Vec<u8>,
        truth: RequestSize,
    }

    const EMBED: &[&str] = &["/tei.v1.Embed/Embed", "/tei.v1.Embed/EmbedStream"];
    const EMBED_SPARSE: &[&str] = &["/tei.v1.Embed/EmbedSparse", "/tei.v1.Embed/EmbedSparseStream"];
    const EMBED_ALL: &[&str] = &["/tei.v1.Embed/EmbedAll", "/tei.v1.Embed/EmbedAllStream"];
    const PREDICT: &[&str] = &["/tei.v1.Predict/Predict", "/tei.v1.Predict/PredictStream"];
    const PREDICT_PAIR: &[&str] = &["/tei.v1.Predict/PredictPair", "/tei.v1.Predict/PredictPairStream"];
    const RERANK: &[&str] = &["/tei.v1.Rerank/Rerank"];
    const RERANK_STREAM: &[&str] = &["/tei.v1.Rerank/RerankStream"];
    const TOKENIZE: &[&str] = &["/tei.v1.Tokenize/Tokenize", "/tei.v1.Tokenize/TokenizeStream"];
    const DECODE: &[&str] = &["/tei.v1.Tokenize/Decode", "/tei.v1.Tokenize/DecodeStream"];
    const INFO: &[&str] = &["/tei.v1.Info/Info"];
    const CASE_ROWS: [&[&str]; 10] =
        [EMBED, EMBED_SPARSE, EMBED_ALL, PREDICT, PREDICT_PAIR, RERANK, RERANK_STREAM, TOKENIZE, DECODE, INFO];

    fn text() -> impl Strategy<Value = String> + Clone {
        prop_oneof![any::<String>(), "[a-z ]{0,40}", Just(String::new())]
    }

    /// TEI's two directions, and values no enum has (prost keeps them as plain `i32`s).
    fn direction() -> impl Strategy<Value = i32> {
        prop_oneof![0..2, any::<i32>()]
    }

    fn one_input(rows: &'static [&'static str], inputs: &str, message: Vec<u8>) -> Case {
        Case { rows, message, truth: RequestSize { inputs: 1, text_bytes: inputs.len() } }
    }

    fn request_case() -> impl Strategy<Value = Case> {
        prop_oneof![
            (text(), any::<bool>(), any::<Option<bool>>(), direction(), any::<Option<String>>(), any::<Option<u32>>())
                .prop_map(|(inputs, truncate, normalize, truncation_direction, prompt_name, dimensions)| {
                    let message = v1::EmbedRequest {
                        inputs: inputs.clone(),
                        truncate,
                        normalize,
                        truncation_direction,
                        prompt_name,
                        dimensions,
                    };
                    one_input(EMBED, &inputs, message.encode_to_vec())
                }),
            (text(), any::<bool>(), direction(), any::<Option<String>>()).prop_map(
                |(inputs, truncate, truncation_direction, prompt_name)| {
                    let message =
                        v1::EmbedSparseRequest { inputs: inputs.clone(), truncate, truncation_direction, prompt_name };
                    one_input(EMBED_SPARSE, &inputs, message.encode_to_vec())
                }
            ),
            (text(), any::<bool>(), direction(), any::<Option<String>>()).prop_map(
                |(inputs, truncate, truncation_direction, prompt_name)| {
                    let message =
                        v1::EmbedAllRequest { inputs: inputs.clone(), truncate, truncation_direction, prompt_name };
                    one_input(EMBED_ALL, &inputs, message.encode_to_vec())
                }
            ),
            (text(), any::<bool>(), any::<bool>(), direction()).prop_map(
                |(inputs, truncate, raw_scores, truncation_direction)| {
                    let message =
                        v1::PredictRequest { inputs: inputs.clone(), truncate, raw_scores, truncation_direction };
                    one_input(PREDICT, &inputs, message.encode_to_vec())
                }
            ),
            (vec(text(), 0..4), any::<bool>(), any::<bool>(), direction()).prop_map(
                |(inputs, truncate, raw_scores, truncation_direction)| {
                    let text_bytes = inputs.iter().map(String::len).sum();
                    let message = v1::PredictPairRequest { inputs, truncate, raw_scores, truncation_direction };
                    Case {
                        rows: PREDICT_PAIR,
                        message: message.encode_to_vec(),
                        truth: RequestSize { inputs: 1, text_bytes },
                    }
                }
            ),
            (text(), vec(text(), 0..200), any::<bool>(), any::<bool>(), any::<bool>(), direction()).prop_map(
                |(query, texts, truncate, raw_scores, return_text, truncation_direction)| {
                    // Every text is one input, the empty ones too: a repeated field writes each.
                    let truth = RequestSize {
                        inputs: texts.len() as u32,
                        text_bytes: query.len() + texts.iter().map(String::len).sum::<usize>(),
                    };
                    let message =
                        v1::RerankRequest { query, texts, truncate, raw_scores, return_text, truncation_direction };
                    Case { rows: RERANK, message: message.encode_to_vec(), truth }
                }
            ),
            (text(), text(), any::<bool>(), any::<bool>(), any::<bool>(), direction()).prop_map(
                |(query, text, truncate, raw_scores, return_text, truncation_direction)| {
                    let truth = RequestSize { inputs: 1, text_bytes: query.len() + text.len() };
                    let message = v1::RerankStreamRequest {
                        query,
                        text,
                        truncate,
                        raw_scores,
                        return_text,
                        truncation_direction,
                    };
                    Case { rows: RERANK_STREAM, message: message.encode_to_vec(), truth }
                }
            ),
            (text(), any::<bool>(), any::<Option<String>>()).prop_map(|(inputs, add_special_tokens, prompt_name)| {
                let message = v1::EncodeRequest { inputs: inputs.clone(), add_special_tokens, prompt_name };
                one_input(TOKENIZE, &inputs, message.encode_to_vec())
            }),
            (vec(any::<u32>(), 0..64), any::<bool>()).prop_map(|(ids, skip_special_tokens)| {
                let message = v1::DecodeRequest { ids, skip_special_tokens };
                Case { rows: DECODE, message: message.encode_to_vec(), truth: RequestSize { inputs: 1, text_bytes: 0 } }
            }),
            Just(Case {
                rows: INFO,
                message: v1::InfoRequest {}.encode_to_vec(),
                truth: RequestSize { inputs: 1, text_bytes: 0 }
            }),
        ]
    }

    fn metadata() -> impl Strategy<Value = v1::Metadata> + Clone {
        (any::<u32>(), any::<u32>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
            |(compute_chars, compute_tokens, total_time_ns, tokenization_time_ns, queue_time_ns, inference_time_ns)| {
                v1::Metadata {
                    compute_chars,
                    compute_tokens,
                    total_time_ns,
                    tokenization_time_ns,
                    queue_time_ns,
                    inference_time_ns,
                }
            },
        )
    }

    /// A timed response of one of TEI's shapes, encoded, and the `Metadata` it carries.
    fn response() -> impl Strategy<Value = (Vec<u8>, Option<v1::Metadata>)> {
        let metadata = prop::option::weighted(0.8, metadata());
        let rank = (any::<u32>(), any::<Option<String>>(), any::<f32>()).prop_map(|(index, text, score)| v1::Rank {
            index,
            text,
            score,
        });
        let prediction = (any::<f32>(), text()).prop_map(|(score, label)| v1::Prediction { score, label });
        prop_oneof![
            (vec(any::<f32>(), 0..64), metadata.clone()).prop_map(|(embeddings, metadata)| {
                (v1::EmbedResponse { embeddings, metadata }.encode_to_vec(), metadata)
            }),
            (vec(rank, 0..8), metadata.clone())
                .prop_map(|(ranks, metadata)| (v1::RerankResponse { ranks, metadata }.encode_to_vec(), metadata)),
            (vec(prediction, 0..8), metadata).prop_map(|(predictions, metadata)| {
                (v1::PredictResponse { predictions, metadata }.encode_to_vec(), metadata)
            }),
        ]
    }

    fn timing(metadata: &v1::Metadata) -> TeiTiming {
        TeiTiming {
            compute_chars: u64::from(metadata.compute_chars),
            compute_tokens: u64::from(metadata.compute_tokens),
            queue: Duration::from_nanos(metadata.queue_time_ns),
            inference: Duration::from_nanos(metadata.inference_time_ns),
        }
    }

    fn at_most(part: RequestSize, whole: RequestSize) -> bool {
        part.inputs <= whole.inputs && part.text_bytes <= whole.text_bytes
    }

    /// Every row's request message has a case, so a new RPC cannot go unfuzzed.
    #[test]
    fn every_row_has_a_request_case() {
        let mut covered: Vec<&str> = CASE_ROWS.iter().flat_map(|rows| rows.iter().copied()).collect();
        covered.sort_unstable();
        let mut rows: Vec<&str> = RPCS.iter().map(|rpc| rpc.path).collect();
        rows.sort_unstable();
        assert_eq!(covered, rows);
    }

    proptest! {
        #![proptest_config(super::config())]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
            let _ = tei_timing(&bytes);
            for rpc in &RPCS {
                let size = size_by_row(rpc.path, &bytes);
                // A field takes at least two bytes: its key and something.
                prop_assert!(size.text_bytes <= bytes.len() && size.inputs as usize <= bytes.len() / 2 + 1, "{size:?}");
            }
        }

        #[test]
        fn hand_encoded_fields_read_exactly(
            fields in raw_fields(),
            inputs_field in prop::option::of(0u32..8),
            text_fields in vec(0u32..8, 0..3),
        ) {
            let message = encode(&fields);
            let truth = size_of(&fields, inputs_field, &text_fields);
            prop_assert_eq!(request_size(&message, inputs_field, &text_fields), truth);
            match timing_of(&fields) {
                Timing::Absent => prop_assert_eq!(tei_timing(&message), None),
                Timing::Opaque => prop_assert!(tei_timing(&message).is_some()),
                Timing::Exactly(timing) => prop_assert_eq!(tei_timing(&message), Some(timing)),
            }
        }

        #[test]
        fn requests_read_as_what_they_carry(case in request_case()) {
            for path in case.rows {
                prop_assert_eq!(size_by_row(path, &case.message), case.truth, "{}", path);
            }
        }

        #[test]
        fn requests_cut_short_read_no_more_and_followed_by_garbage_no_less(
            case in request_case(),
            cut in any::<Index>(),
            garbage in vec(any::<u8>(), 1..64),
        ) {
            let path = case.rows[0];
            let prefix = &case.message[..cut.index(case.message.len() + 1)];
            prop_assert!(at_most(size_by_row(path, prefix), case.truth));
            let longer = [case.message.as_slice(), &garbage].concat();
            prop_assert!(at_most(case.truth, size_by_row(path, &longer)));
        }

        #[test]
        fn responses_give_their_metadata(response in response()) {
            let (message, metadata) = response;
            prop_assert_eq!(tei_timing(&message), metadata.as_ref().map(timing));
        }

        #[test]
        fn responses_cut_short_or_followed_by_garbage_never_mislead(
            response in response(),
            cut in any::<Index>(),
            garbage in vec(any::<u8>(), 1..64),
        ) {
            let (message, metadata) = response;
            let whole = tei_timing(&message);
            // Cut before the Metadata ends, it is not found at all, never read half.
            let prefix = tei_timing(&message[..cut.index(message.len() + 1)]);
            prop_assert!(prefix.is_none() || prefix == whole, "{prefix:?} vs {whole:?}");
            // The first Metadata counts; garbage after it changes nothing.
            let longer = tei_timing(&[message.as_slice(), &garbage].concat());
            if metadata.is_some() {
                prop_assert_eq!(longer, whole);
            }
        }
    }
}

/// The HTTP front's JSON bodies through `routes::parse`, as each route reads them.
mod http_bodies {
    use http::StatusCode;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::Index;
    use serde::Serialize;
    use serde_json::{Map, Value};
    use teifleet_multiplexer::ErrorKind;
    use teifleet_multiplexer::front::http::error::HttpError;
    use teifleet_multiplexer::front::http::routes::parse;
    use teifleet_multiplexer::front::http::types::{
        DecodeRequest, EmbedRequest, Ids, Inputs, OpenAiRequest, PredictInputs, PredictRequest, RerankRequest,
        Sequence, SimilarityRequest, TokenizeRequest,
    };

    /// Each input rendered as JSON, in order: what a parsed body carries, compared with its JSON.
    type Rendered = Vec<String>;

    /// A route's body as its handler parses it, and the inputs its JSON carries when it parses.
    struct Route {
        path: &'static str,
        parse: fn(&[u8]) -> Result<Rendered, HttpError>,
        inputs_of_json: fn(&Value) -> Rendered,
    }

    /// Every request type of the HTTP front (`/embed_sparse`, `/embed_all` and `/` read
    /// `/embed`'s, `/embeddings` reads `/v1/embeddings`').
    const ROUTES: [Route; 7] = [
        Route { path: "/embed", parse: embed, inputs_of_json: |json| each(field(json, "inputs", 0)) },
        Route { path: "/v1/embeddings", parse: openai, inputs_of_json: |json| each(field(json, "input", 0)) },
        Route { path: "/tokenize", parse: tokenize, inputs_of_json: |json| each(field(json, "inputs", 0)) },
        Route { path: "/rerank", parse: rerank, inputs_of_json: |json| each(field(json, "texts", 1)) },
        Route { path: "/similarity", parse: similarity, inputs_of_json: similarity_inputs },
        Route { path: "/predict", parse: predict, inputs_of_json: predict_inputs },
        Route { path: "/decode", parse: decode, inputs_of_json: decode_inputs },
    ];

    fn route(path: &str) -> &'static Route {
        ROUTES.iter().find(|route| route.path == path).unwrap_or_else(|| panic!("{path} is in ROUTES"))
    }

    fn rendered<T: Serialize + ?Sized>(value: &T) -> String {
        serde_json::to_string(value).expect("plain data encodes")
    }

    fn texts(inputs: Inputs) -> Rendered {
        inputs.into_vec().iter().map(rendered).collect()
    }

    fn embed(body: &[u8]) -> Result<Rendered, HttpError> {
        Ok(texts(parse::<EmbedRequest>(body)?.inputs))
    }

    fn openai(body: &[u8]) -> Result<Rendered, HttpError> {
        Ok(texts(parse::<OpenAiRequest>(body)?.input))
    }

    fn tokenize(body: &[u8]) -> Result<Rendered, HttpError> {
        Ok(texts(parse::<TokenizeRequest>(body)?.inputs))
    }

    fn rerank(body: &[u8]) -> Result<Rendered, HttpError> {
        Ok(parse::<RerankRequest>(body)?.texts.iter().map(rendered).collect())
    }

    /// The source sentence and the others: one `/embed` batch.
    fn similarity(body: &[u8]) -> Result<Rendered, HttpError> {
        let inputs = parse::<SimilarityRequest>(body)?.inputs;
        Ok(std::iter::once(&inputs.source_sentence).chain(&inputs.sentences).map(rendered).collect())
    }

    fn predict(body: &[u8]) -> Result<Rendered, HttpError> {
        let sequence = |sequence: &Sequence| match sequence {
            Sequence::Single(text) => rendered(text),
            Sequence::Pair(a, b) => rendered(&[a, b]),
        };
        Ok(match parse::<PredictRequest>(body)?.inputs {
            PredictInputs::Single(one) => vec![sequence(&one)],
            PredictInputs::Batch(batch) => batch.iter().map(sequence).collect(),
        })
    }

    fn decode(body: &[u8]) -> Result<Rendered, HttpError> {
        Ok(match parse::<DecodeRequest>(body)?.ids {
            Ids::One(ids) => vec![rendered(&ids)],
            Ids::Many(batch) => batch.iter().map(rendered).collect(),
        })
    }

    /// A struct's field in JSON: serde's derived structs take an object, or an array in field order.
    fn field<'a>(json: &'a Value, name: &str, position: usize) -> &'a Value {
        match json {
            Value::Array(items) => items.get(position),
            other => other.get(name),
        }
        .unwrap_or(&Value::Null)
    }

    fn each(json: &Value) -> Rendered {
        match json {
            Value::Array(items) => items.iter().map(rendered).collect(),
            one => vec![rendered(one)],
        }
    }

    fn similarity_inputs(json: &Value) -> Rendered {
        let inputs = field(json, "inputs", 0);
        let mut all = vec![rendered(field(inputs, "source_sentence", 0))];
        all.extend(each(field(inputs, "sentences", 1)));
        all
    }

    /// `["a", "b"]` is one pair, as TEI reads it; any other list is a batch.
    fn predict_inputs(json: &Value) -> Rendered {
        match field(json, "inputs", 0) {
            pair @ Value::Array(items) if items.len() == 2 && items.iter().all(Value::is_string) => {
                vec![rendered(pair)]
            }
            other => each(other),
        }
    }

    /// A list of numbers (the empty list included) is one sequence; a list of lists a batch.
    fn decode_inputs(json: &Value) -> Rendered {
        match field(json, "ids", 0) {
            one @ Value::Array(items) if items.iter().all(Value::is_number) => vec![rendered(one)],
            other => each(other),
        }
    }

    /// Whether the bytes could begin a JSON value at all.
    fn starts_json(body: &[u8]) -> bool {
        body.iter()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            .is_some_and(|b| matches!(b, b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'))
    }

    /// The only refusals parsing gives: TEI's 400 for what is not JSON, its 422 for the wrong JSON.
    fn check_refusal(route: &Route, error: &HttpError) -> Result<(), TestCaseError> {
        let status = match error {
            HttpError::NotJson(_) => StatusCode::BAD_REQUEST,
            HttpError::Body(_) => StatusCode::UNPROCESSABLE_ENTITY,
            other => return Err(TestCaseError::fail(format!("{}: {other:?} is not a parse error", route.path))),
        };
        prop_assert_eq!(error.answer().status, status, "{}: {:?}", route.path, error);
        prop_assert_eq!(error.kind(), ErrorKind::InvalidRequest);
        Ok(())
    }

    /// Valid JSON is never "not JSON" (400), but for two errors serde_json counts as syntax
    /// where the JSON is only the wrong shape, and so answers as TEI's axum does for the same
    /// body: a struct given as a list longer than the struct ("trailing characters"), and an enum
    /// (`truncation_direction`, `encoding_format`) given as neither a string nor an object
    /// ("expected value").
    fn check_valid_json(
        route: &Route,
        json: &Value,
        result: &Result<Rendered, HttpError>,
    ) -> Result<(), TestCaseError> {
        match result {
            Ok(inputs) => prop_assert_eq!(inputs, &(route.inputs_of_json)(json), "{}", route.path),
            Err(HttpError::NotJson(message)) => prop_assert!(
                message.starts_with("trailing characters") || message.starts_with("expected value"),
                "{}: {} for {}",
                route.path,
                message,
                json
            ),
            Err(error) => check_refusal(route, error)?,
        }
        Ok(())
    }

    /// Every field name of every route's body, so arbitrary JSON often reaches the fields.
    const FIELD_NAMES: &[&str] = &[
        "inputs",
        "input",
        "normalize",
        "truncate",
        "truncation_direction",
        "prompt_name",
        "dimensions",
        "raw_scores",
        "query",
        "texts",
        "return_text",
        "source_sentence",
        "sentences",
        "parameters",
        "add_special_tokens",
        "ids",
        "skip_special_tokens",
        "model",
        "encoding_format",
        "user",
    ];

    fn text() -> impl Strategy<Value = String> + Clone {
        prop_oneof![any::<String>(), "[a-z ]{0,12}", Just(String::new())]
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (0u32..70_000).prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            // Not-finite floats become null.
            any::<f64>().prop_map(Value::from),
            prop_oneof![text(), prop::sample::select(vec!["Left", "right", "float", "base64"]).prop_map(String::from)]
                .prop_map(Value::from),
        ];
        let key = prop_oneof![3 => prop::sample::select(FIELD_NAMES).prop_map(String::from), 1 => text()];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                vec(inner.clone(), 0..6).prop_map(Value::Array),
                vec((key.clone(), inner), 0..6).prop_map(|fields| Value::Object(fields.into_iter().collect())),
            ]
        })
    }

    /// Byte edits of valid JSON: near-misses that exercise every syntax error.
    fn mutated_json() -> impl Strategy<Value = Vec<u8>> {
        (json(), vec((any::<Index>(), 0..3u8, any::<u8>()), 1..4)).prop_map(|(json, edits)| {
            let mut bytes = serde_json::to_vec(&json).expect("a Value encodes");
            for (at, edit, byte) in edits {
                let at = at.index(bytes.len() + 1);
                match edit {
                    0 => bytes.insert(at, byte),
                    1 if at < bytes.len() => bytes[at] = byte,
                    _ if at < bytes.len() => drop(bytes.remove(at)),
                    _ => bytes.push(byte),
                }
            }
            bytes
        })
    }

    fn body_bytes() -> impl Strategy<Value = Vec<u8>> {
        let punctuation = prop::sample::select(b"{}[]\":,0123456789-+.eEtrufalsn \\u".to_vec());
        prop_oneof![vec(any::<u8>(), 0..256), mutated_json(), vec(punctuation, 0..64)]
    }

    fn object(fields: Vec<(&str, Option<Value>)>) -> Value {
        Value::Object(
            fields.into_iter().filter_map(|(name, value)| Some((name.to_owned(), value?))).collect::<Map<_, _>>(),
        )
    }

    fn maybe<S: Strategy<Value = Value>>(strategy: S) -> impl Strategy<Value = Option<Value>> {
        prop::option::of(strategy)
    }

    fn boolean() -> impl Strategy<Value = Value> {
        any::<bool>().prop_map(Value::from)
    }

    /// An `Option` field: a value or `null`.
    fn nullable<S: Strategy<Value = Value>>(strategy: S) -> impl Strategy<Value = Value> {
        prop_oneof![1 => Just(Value::Null), 3 => strategy]
    }

    fn direction() -> impl Strategy<Value = Value> {
        prop::sample::select(vec!["Left", "left", "LEFT", "Right", "right", "RIGHT"]).prop_map(Value::from)
    }

    fn string() -> impl Strategy<Value = Value> {
        text().prop_map(Value::from)
    }

    /// TEI's `inputs`: one text or a list, and each text rendered.
    fn one_or_many() -> impl Strategy<Value = (Value, Rendered)> {
        prop_oneof![
            text().prop_map(|text| (Value::from(text.as_str()), vec![rendered(&text)])),
            vec(text(), 0..40)
                .prop_map(|texts| (Value::from(texts.clone()), texts.iter().map(rendered).collect::<Rendered>())),
        ]
    }

    /// A body each route takes: its route, its JSON and the inputs it carries.
    fn valid_body() -> impl Strategy<Value = (&'static str, Value, Rendered)> {
        let embed = (
            one_or_many(),
            maybe(boolean()),
            maybe(nullable(boolean())),
            maybe(direction()),
            maybe(nullable(string())),
            maybe(nullable(any::<u32>().prop_map(Value::from))),
        )
            .prop_map(|((inputs, rendered), normalize, truncate, direction, prompt_name, dimensions)| {
                let body = object(vec![
                    ("inputs", Some(inputs)),
                    ("normalize", normalize),
                    ("truncate", truncate),
                    ("truncation_direction", direction),
                    ("prompt_name", prompt_name),
                    ("dimensions", dimensions),
                ]);
                ("/embed", body, rendered)
            });
        let openai = (
            one_or_many(),
            maybe(nullable(string())),
            maybe(prop::sample::select(vec!["float", "base64"]).prop_map(Value::from)),
            maybe(nullable(any::<u32>().prop_map(Value::from))),
            maybe(nullable(string())),
        )
            .prop_map(|((input, rendered), model, format, dimensions, user)| {
                let body = object(vec![
                    ("input", Some(input)),
                    ("model", model),
                    ("encoding_format", format),
                    ("dimensions", dimensions),
                    ("user", user),
                ]);
                ("/v1/embeddings", body, rendered)
            });
        let tokenize = (one_or_many(), maybe(boolean()), maybe(nullable(string()))).prop_map(
            |((inputs, rendered), add_special_tokens, prompt_name)| {
                let body = object(vec![
                    ("inputs", Some(inputs)),
                    ("add_special_tokens", add_special_tokens),
                    ("prompt_name", prompt_name),
                ]);
                ("/tokenize", body, rendered)
            },
        );
        let rerank = (
            text(),
            vec(text(), 0..60),
            maybe(nullable(boolean())),
            maybe(direction()),
            maybe(boolean()),
            maybe(boolean()),
        )
            .prop_map(|(query, texts, truncate, direction, raw_scores, return_text)| {
                let rendered: Rendered = texts.iter().map(rendered).collect();
                let body = object(vec![
                    ("query", Some(Value::from(query))),
                    ("texts", Some(Value::from(texts))),
                    ("truncate", truncate),
                    ("truncation_direction", direction),
                    ("raw_scores", raw_scores),
                    ("return_text", return_text),
                ]);
                ("/rerank", body, rendered)
            });
        let parameters =
            nullable((maybe(nullable(boolean())), maybe(direction()), maybe(nullable(string()))).prop_map(
                |(truncate, direction, prompt_name)| {
                    object(vec![
                        ("truncate", truncate),
                        ("truncation_direction", direction),
                        ("prompt_name", prompt_name),
                    ])
                },
            ));
        let similarity = (text(), vec(text(), 0..40), maybe(parameters)).prop_map(|(source, sentences, parameters)| {
            let rendered: Rendered = std::iter::once(&source).chain(&sentences).map(rendered).collect();
            let inputs = object(vec![
                ("source_sentence", Some(Value::from(source))),
                ("sentences", Some(Value::from(sentences))),
            ]);
            ("/similarity", object(vec![("inputs", Some(inputs)), ("parameters", parameters)]), rendered)
        });
        let sequence =
            prop_oneof![text().prop_map(Value::from), (text(), text()).prop_map(|(a, b)| Value::from(vec![a, b])),];
        let predict = (
            prop_oneof![sequence.clone(), vec(sequence, 0..20).prop_map(Value::from)],
            maybe(nullable(boolean())),
            maybe(direction()),
            maybe(boolean()),
        )
            .prop_map(|(inputs, truncate, direction, raw_scores)| {
                let body = object(vec![
                    ("inputs", Some(inputs)),
                    ("truncate", truncate),
                    ("truncation_direction", direction),
                    ("raw_scores", raw_scores),
                ]);
                let rendered = predict_inputs(&body);
                ("/predict", body, rendered)
            });
        let ids = prop_oneof![
            vec(any::<u32>(), 0..20).prop_map(|ids| (Value::from(ids.clone()), vec![rendered(&ids)])),
            vec(vec(any::<u32>(), 0..8), 1..8)
                .prop_map(|batch| (Value::from(batch.clone()), batch.iter().map(rendered).collect::<Rendered>())),
        ];
        let decode = (ids, maybe(boolean())).prop_map(|((ids, rendered), skip_special_tokens)| {
            ("/decode", object(vec![("ids", Some(ids)), ("skip_special_tokens", skip_special_tokens)]), rendered)
        });
        prop_oneof![embed, openai, tokenize, rerank, similarity, predict, decode]
    }

    /// Valid JSON where a string the route reads holds bytes that are not UTF-8.
    fn invalid_utf8() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            // A continuation byte with no lead, or a byte UTF-8 never uses.
            (0x80u8..=0xbf).prop_map(|b| vec![b]),
            (0xf5u8..=0xff).prop_map(|b| vec![b]),
            // An overlong encoding of ASCII, and a UTF-16 surrogate.
            (0xc0u8..=0xc1, 0x80u8..=0xbf).prop_map(|(a, b)| vec![a, b]),
            Just(vec![0xed, 0xa0, 0x80]),
            // A lead byte with its continuation missing (what follows is ASCII or a lead byte).
            (0xc2u8..=0xf4).prop_map(|b| vec![b]),
        ]
    }

    /// Where a route reads a string: the body around it.
    const STRING_FIELDS: [(&str, &str, &str); 9] = [
        ("/embed", r#"{"inputs": "#, "}"),
        ("/embed", r#"{"inputs": ["fine", "#, "]}"),
        ("/embed", r#"{"inputs": "fine", "prompt_name": "#, "}"),
        ("/v1/embeddings", r#"{"input": "#, "}"),
        ("/tokenize", r#"{"inputs": "#, "}"),
        ("/rerank", r#"{"texts": ["fine"], "query": "#, "}"),
        ("/rerank", r#"{"query": "q", "texts": ["#, "]}"),
        ("/similarity", r#"{"inputs": {"sentences": ["fine"], "source_sentence": "#, "}}"),
        ("/predict", r#"{"inputs": ["fine", "#, "]}"),
    ];

    /// What a JSON string of `text` holds between its quotes.
    fn escaped(text: &str) -> String {
        let quoted = rendered(text);
        quoted[1..quoted.len() - 1].to_owned()
    }

    #[test]
    fn deep_nesting_is_refused_without_overflowing_the_stack() {
        let deep = 100_000;
        let bodies = [
            "[".repeat(deep),
            format!("{{\"inputs\": {}", "[".repeat(deep)),
            "{\"a\": ".repeat(deep),
            format!("{}{}", "[".repeat(deep), "]".repeat(deep)),
        ];
        for route in &ROUTES {
            for body in &bodies {
                // Some routes find the wrong JSON (422) before the depth limit (400).
                let error = (route.parse)(body.as_bytes()).unwrap_err();
                assert!(matches!(error, HttpError::NotJson(_) | HttpError::Body(_)), "{}: {error:?}", route.path);
            }
        }
        // A field no route reads is skipped without building it, however deep (as in TEI).
        let unread = format!(r#"{{"unread": {}{}, "inputs": "a"}}"#, "[".repeat(deep), "]".repeat(deep));
        assert_eq!(embed(unread.as_bytes()).unwrap(), [r#""a""#]);
    }

    /// Where serde_json, and so TEI's axum, stops at the first error: pinned so that a change of
    /// answer is seen (these bodies get what TEI gives them, not "JSON or not").
    #[test]
    fn the_first_error_decides_as_in_tei() {
        // Wrong JSON before the syntax error: 422.
        assert!(matches!(embed(br#"{"inputs": 5 garbage"#), Err(HttpError::Body(_))));
        // A struct as a list, longer than the struct: serde_json's trailing characters, 400.
        assert!(matches!(embed(br#"["a", true, null, "Left", null, null, 7]"#), Err(HttpError::NotJson(_))));
        // An enum as neither a string nor an object: serde_json's "expected value", 400.
        assert!(matches!(embed(br#"{"inputs": "a", "truncation_direction": null}"#), Err(HttpError::NotJson(_))));
        assert_eq!(embed(br#"["a"]"#).unwrap(), [r#""a""#], "a struct as a list");
        // A string no route reads is skipped unread, invalid UTF-8 and all.
        assert_eq!(embed(b"{\"unread\": \"\xff\", \"inputs\": \"a\"}").unwrap(), [r#""a""#]);
    }

    proptest! {
        #![proptest_config(super::config())]

        #[test]
        fn arbitrary_bytes_are_400_or_422(body in body_bytes()) {
            let json = serde_json::from_slice::<Value>(&body).ok();
            for route in &ROUTES {
                let result = (route.parse)(&body);
                if let Some(json) = &json {
                    check_valid_json(route, json, &result)?;
                } else if let Err(error) = &result {
                    check_refusal(route, error)?;
                }
                if !starts_json(&body) {
                    prop_assert!(matches!(result, Err(HttpError::NotJson(_))), "{}: {:?}", route.path, result);
                }
            }
        }

        #[test]
        fn arbitrary_json_is_taken_whole_or_422(json in json()) {
            let body = serde_json::to_vec(&json).expect("a Value encodes");
            for route in &ROUTES {
                check_valid_json(route, &json, &(route.parse)(&body))?;
            }
        }

        #[test]
        fn valid_bodies_carry_their_inputs_and_cut_short_are_400(body in valid_body(), cut in any::<Index>()) {
            let (path, json, inputs) = body;
            let route = route(path);
            let bytes = serde_json::to_vec(&json).expect("a Value encodes");
            match (route.parse)(&bytes) {
                Ok(parsed) => prop_assert_eq!(&parsed, &inputs),
                Err(error) => return Err(TestCaseError::fail(format!("{path}: {error:?} for {json}"))),
            }
            prop_assert_eq!(&(route.inputs_of_json)(&json), &inputs);
            let prefix = &bytes[..cut.index(bytes.len())];
            let result = (route.parse)(prefix);
            let prefix = String::from_utf8_lossy(prefix);
            prop_assert!(matches!(result, Err(HttpError::NotJson(_))), "{:?}: {:?}", prefix, result);
        }

        #[test]
        fn invalid_utf8_in_a_string_a_route_reads_is_400(
            at in any::<Index>(),
            before in text(),
            invalid in invalid_utf8(),
            after in text(),
        ) {
            let (path, open, close) = STRING_FIELDS[at.index(STRING_FIELDS.len())];
            let string = [b"\"", escaped(&before).as_bytes(), &invalid, escaped(&after).as_bytes(), b"\""].concat();
            let body = [open.as_bytes(), &string, close.as_bytes()].concat();
            let result = (route(path).parse)(&body);
            prop_assert!(matches!(result, Err(HttpError::NotJson(_))), "{}: {:?}", path, result);
        }
    }
}

/// `request_meta::parse` over arbitrary metadata headers, and `parse_grpc_timeout` over
/// arbitrary strings, against what the gRPC spec and the headers' documentation say.
mod metadata {
    use std::time::Duration;

    use http::{HeaderMap, HeaderValue};
    use proptest::collection::vec;
    use proptest::prelude::*;
    use teifleet_multiplexer::ErrorKind;
    use teifleet_multiplexer::admission::Priority;
    use teifleet_multiplexer::gate::request_meta::{MAX_TENANT_LEN, Target, parse, parse_grpc_timeout};
    use teifleet_wire::headers::{FORWARDED_BY, GRPC_TIMEOUT, MODEL, POOL, PRIORITY, TENANT};
    use tokio::time::Instant;

    /// `<1 to 8 ASCII digits><H|M|S|m|u|n>`, exactly (the gRPC HTTP/2 spec's TimeoutValue and
    /// TimeoutUnit), computed wide so no value overflows.
    fn spec_timeout(value: &str) -> Option<Duration> {
        let unit = value.chars().last()?;
        let digits = &value[..value.len() - unit.len_utf8()];
        if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let nanos_per_unit: u128 = match unit {
            'H' => 3_600_000_000_000,
            'M' => 60_000_000_000,
            'S' => 1_000_000_000,
            'm' => 1_000_000,
            'u' => 1_000,
            'n' => 1,
            _ => return None,
        };
        let nanos = digits.parse::<u128>().ok()? * nanos_per_unit;
        Some(Duration::new(u64::try_from(nanos / 1_000_000_000).ok()?, (nanos % 1_000_000_000) as u32))
    }

    fn timeout_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[0-9]{1,8}[HMSmun]",
            // Near misses: signs, too many digits, other units, other digits, spaces.
            "[+-]?[0-9]{0,10}[HMSmunhsx ]?",
            "[0-9０-９٣]{1,4}[HMSmunµ]",
        ]
    }

    /// Headers as a caller may send them: any bytes a header value may hold, or near misses.
    #[derive(Debug)]
    struct Sent {
        priority: Option<Vec<u8>>,
        pool: Option<Vec<u8>>,
        model: Option<Vec<u8>>,
        tenant: Option<Vec<u8>>,
        forwarded_by: Option<Vec<u8>>,
        timeout: Option<Vec<u8>>,
    }

    impl Sent {
        fn headers(&self) -> HeaderMap {
            let mut headers = HeaderMap::new();
            let fields = [
                (PRIORITY, &self.priority),
                (POOL, &self.pool),
                (MODEL, &self.model),
                (TENANT, &self.tenant),
                (FORWARDED_BY, &self.forwarded_by),
                (GRPC_TIMEOUT, &self.timeout),
            ];
            for (name, value) in fields {
                if let Some(value) = value {
                    headers.insert(name, HeaderValue::from_bytes(value).expect("header_value makes valid values"));
                }
            }
            headers
        }
    }

    /// A header value: any bytes HTTP allows in one (not just printable ASCII), or a near miss.
    fn header_value(near: impl Strategy<Value = String>) -> impl Strategy<Value = Option<Vec<u8>>> {
        let allowed = prop_oneof![Just(b'\t'), 0x20u8..=0x7e, 0x80u8..=0xff];
        prop::option::of(prop_oneof![vec(allowed, 0..24), near.prop_map(String::into_bytes)])
    }

    fn sent() -> impl Strategy<Value = Sent> {
        (
            header_value("[ \t]?([cC]ritical|STANDARD|standard|sheddable|urgent)?[ \t]?"),
            header_value("[ ]?[a-z-]{0,8}[ ]?"),
            header_value("[ ]?[a-z-]{0,8}[ ]?"),
            header_value("[a-z]{0,3}|[a-z]{126,130}"),
            header_value("[a-z0-9.-]{0,12}"),
            header_value(prop_oneof!["[ \t]?[0-9]{1,8}[HMSmun][ \t]?", timeout_text()]),
        )
            .prop_map(|(priority, pool, model, tenant, forwarded_by, timeout)| Sent {
                priority,
                pool,
                model,
                tenant,
                forwarded_by,
                timeout,
            })
    }

    #[derive(Debug)]
    struct Expected {
        priority: Priority,
        target: Target,
        timeout: Option<Duration>,
        forwarded_by: Option<String>,
        tenant: Option<String>,
    }

    /// A header as the docs say it is read: absent, or printable ASCII, trimmed; `None` when
    /// the request must be refused for it.
    fn read(value: &Option<Vec<u8>>) -> Option<Option<&str>> {
        match value {
            None => Some(None),
            Some(bytes) if bytes.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)) => {
                Some(Some(std::str::from_utf8(bytes).ok()?.trim()))
            }
            Some(_) => None,
        }
    }

    /// A header that names something: refused when empty.
    fn named(value: &Option<Vec<u8>>) -> Option<Option<&str>> {
        match read(value)? {
            Some("") => None,
            other => Some(other),
        }
    }

    fn expected(sent: &Sent) -> Option<Expected> {
        let priority = match read(&sent.priority)?.map(str::to_ascii_lowercase).as_deref() {
            None => Priority::Standard,
            Some("critical") => Priority::Critical,
            Some("standard") => Priority::Standard,
            Some("sheddable") => Priority::Sheddable,
            Some(_) => return None,
        };
        let target = match (named(&sent.pool)?, named(&sent.model)?) {
            (Some(_), Some(_)) => return None,
            (Some(pool), None) => Target::Pool(pool.to_owned()),
            (None, Some(model)) => Target::Model(model.to_owned()),
            (None, None) => Target::Own,
        };
        let timeout = match read(&sent.timeout)? {
            Some(value) => Some(spec_timeout(value)?),
            None => None,
        };
        let tenant = named(&sent.tenant)?;
        if tenant.is_some_and(|tenant| tenant.len() > MAX_TENANT_LEN) {
            return None;
        }
        Some(Expected {
            priority,
            target,
            timeout,
            forwarded_by: read(&sent.forwarded_by)?.map(str::to_owned),
            tenant: tenant.map(str::to_owned),
        })
    }

    #[test]
    fn absurd_timeouts_are_taken_without_overflow() {
        let longest = Duration::from_secs(99_999_999 * 3600);
        assert_eq!(parse_grpc_timeout("99999999H").unwrap(), longest);
        let mut headers = HeaderMap::new();
        headers.insert(GRPC_TIMEOUT, HeaderValue::from_static("99999999H"));
        let arrived = Instant::now();
        let meta = parse(&headers, arrived).unwrap();
        assert_eq!(meta.caller_deadline, Some(arrived + longest));
        for refused in ["+5S", "-5S", "5", "S", "1٣S", "1é", "é", "5 S", "123456789S"] {
            assert!(parse_grpc_timeout(refused).is_err(), "{refused:?}");
        }
    }

    proptest! {
        #![proptest_config(super::config())]

        #[test]
        fn grpc_timeout_is_exactly_the_spec(value in timeout_text()) {
            match (parse_grpc_timeout(&value), spec_timeout(&value)) {
                (Ok(got), Some(want)) => prop_assert_eq!(got, want),
                (Err(error), None) => prop_assert_eq!(teifleet_multiplexer::Error::from(error).kind(), ErrorKind::InvalidRequest),
                (got, want) => {
                    return Err(TestCaseError::fail(format!("{value:?}: got {got:?}, the spec says {want:?}")));
                }
            }
        }

        #[test]
        fn headers_read_as_documented(sent in sent()) {
            let arrived = Instant::now();
            match (parse(&sent.headers(), arrived), expected(&sent)) {
                (Ok(meta), Some(want)) => {
                    prop_assert_eq!(meta.priority, want.priority);
                    prop_assert_eq!(meta.target, want.target);
                    prop_assert_eq!(meta.timeout, want.timeout);
                    prop_assert_eq!(meta.forwarded_by, want.forwarded_by);
                    prop_assert_eq!(meta.tenant, want.tenant);
                    prop_assert_eq!(meta.caller_deadline, want.timeout.map(|timeout| arrived + timeout));
                    if let (Some(deadline), Some(caller_deadline)) = (meta.deadline, meta.caller_deadline) {
                        prop_assert!(arrived <= deadline && deadline <= caller_deadline);
                    } else {
                        prop_assert_eq!(meta.deadline, None);
                    }
                }
                (Err(error), None) => prop_assert_eq!(teifleet_multiplexer::Error::from(error).kind(), ErrorKind::InvalidRequest),
                (got, want) => return Err(TestCaseError::fail(format!("got {got:?}, expected {want:?}"))),
            }
        }
    }
}
