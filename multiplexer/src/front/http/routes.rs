//! The routes: each parses TEI's JSON, checks what TEI checks before its queue, and sends the
//! inputs as `tei.v1` calls through [`batch`](super::batch).

use axum::Extension;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::error::Category;
use teifleet_proto::v1;
use teifleet_runtime::http_server::ConnectionNumber;

use super::Shared;
use super::answer;
use super::error::{Flavor, HttpError};
use super::memory::AnswerCharge;
use super::request::{HttpCall, INFO, row};
use super::types::*;
use super::upstream::Each;
use crate::error::Error;

const EMBED: &str = "/tei.v1.Embed/Embed";
const EMBED_SPARSE: &str = "/tei.v1.Embed/EmbedSparse";
const EMBED_ALL: &str = "/tei.v1.Embed/EmbedAll";
const PREDICT: &str = "/tei.v1.Predict/Predict";
const PREDICT_PAIR: &str = "/tei.v1.Predict/PredictPair";
const RERANK: &str = "/tei.v1.Rerank/Rerank";
const TOKENIZE: &str = "/tei.v1.Tokenize/Tokenize";
const DECODE: &str = "/tei.v1.Tokenize/Decode";

type Body = Result<Bytes, BytesRejection>;
type Answer = Result<Response, HttpError>;

/// An axum handler around a route: the request routed and counted as one call (of `$rpc` until
/// the route says otherwise), its body read under the payload limit, the answer or the error in
/// the route's flavor.
macro_rules! handler {
    ($name:ident, $inner:ident, $rpc:expr, $flavor:expr) => {
        pub async fn $name(
            State(shared): State<Shared>,
            connection: Option<Extension<ConnectionNumber>>,
            headers: HeaderMap,
            body: Body,
        ) -> Response {
            let answer = match HttpCall::route(&shared, row($rpc), &headers) {
                Ok(mut call) => {
                    // A patient request waits its turn at the pool's door, as a gRPC call does;
                    // its pass is held until it is answered.
                    let (_inside, result) = match call.through_door(connection.map(|Extension(n)| n)).await {
                        Ok(inside) => {
                            let result = match read(&shared, body) {
                                Ok(body) => {
                                    call.read_body(body.len());
                                    $inner(&mut call, &body).await
                                }
                                Err(error) => Err(error),
                            };
                            (inside, result)
                        }
                        Err(error) => (None, Err(error)),
                    };
                    let cached = call.cache_header();
                    call.finish(result).map(|mut response| {
                        if let Some(value) = cached {
                            response.headers_mut().insert(crate::cache::HEADER, http::HeaderValue::from_static(value));
                        }
                        response
                    })
                }
                Err(error) => Err(error),
            };
            answer.unwrap_or_else(|error| error.into_response($flavor))
        }
    };
}

handler!(embed, embed_route, EMBED, Flavor::Tei);
handler!(embed_sparse, embed_sparse_route, EMBED_SPARSE, Flavor::Tei);
handler!(embed_all, embed_all_route, EMBED_ALL, Flavor::Tei);
handler!(predict, predict_route, PREDICT, Flavor::Tei);
handler!(rerank, rerank_route, RERANK, Flavor::Tei);
handler!(similarity, similarity_route, EMBED, Flavor::Tei);
handler!(tokenize, tokenize_route, TOKENIZE, Flavor::Tei);
handler!(decode, decode_route, DECODE, Flavor::Tei);
handler!(openai, openai_route, EMBED, Flavor::OpenAi);
handler!(dispatch, dispatch_route, EMBED, Flavor::Tei);

fn read(shared: &Shared, body: Body) -> Result<Bytes, HttpError> {
    body.map_err(|rejection| {
        if let Some(over) = super::memory::over_budget(&rejection) {
            shared.forwarder.metrics.refused_input("http", crate::front::grpc::server::REFUSED_MEMORY);
            HttpError::Call(Error::Memory(over))
        } else if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            HttpError::PayloadTooLarge { limit: shared.settings.payload_limit }
        } else if timed_out(&rejection) {
            shared.forwarder.metrics.refused_input("http", "body_timeout");
            HttpError::BodyTimeout
        } else {
            HttpError::Body(rejection.body_text())
        }
    })
}

/// Whether the body stopped because it outlasted the body deadline (`http::router`).
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |error| error.source()).any(|e| e.is::<tower_http::timeout::TimeoutError>())
}

/// The route's JSON, refused as TEI's axum refuses it: 400 for what is not JSON at all, 422 for
/// JSON that is not what the route takes.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, HttpError> {
    serde_json::from_slice(body).map_err(refusal)
}

fn refusal(error: serde_json::Error) -> HttpError {
    match error.classify() {
        Category::Data => HttpError::Body(error.to_string()),
        Category::Syntax | Category::Eof | Category::Io => HttpError::NotJson(error.to_string()),
    }
}

/// [`parse`] with the route's lists of inputs read within the call's input cap (`super::capped`):
/// a list past it is refused as [`HttpCall::within_cap`] refuses it, without its elements kept.
fn parse_inputs<T: DeserializeOwned>(call: &HttpCall<'_>, body: &[u8]) -> Result<T, HttpError> {
    let limit = call.settings().max_request_inputs;
    super::capped::parse_within(body, limit)
        .map_err(refusal)?
        .map_err(|inputs| HttpError::TooManyInputs { inputs, limit })
}

/// TEI refuses an empty batch and an empty text before its queue.
fn texts(inputs: Inputs) -> Result<Vec<String>, HttpError> {
    let texts = inputs.into_vec();
    if texts.is_empty() || texts.iter().any(String::is_empty) { Err(HttpError::Empty("inputs")) } else { Ok(texts) }
}

/// TEI's gRPC Rerank refuses a model of another type in words of its own ("model is not a
/// classifier model" for an embedding model); its HTTP `/rerank` says what it means.
fn as_rerank_refusal(error: HttpError) -> HttpError {
    match &error {
        HttpError::Call(Error::Upstream { status, .. })
            if status.code() == tonic::Code::FailedPrecondition && status.message().starts_with("model is not a") =>
        {
            HttpError::WrongModelType("model is not a re-ranker model")
        }
        _ => error,
    }
}

/// The inputs of an `/embed` batch and the charge of its answer: a vector per input.
async fn embed_calls(
    call: &mut HttpCall<'_>,
    request: EmbedRequest,
) -> Result<(Vec<v1::EmbedResponse>, AnswerCharge), HttpError> {
    let truncate = request.truncate.unwrap_or(call.settings().auto_truncate);
    let texts = texts(request.inputs)?;
    call.within_cap(texts.len())?;
    let dimensions = request.dimensions.map_or_else(|| call.dimensions(), u64::from);
    let charge = call.answer_charge(texts.len() as u64 * dimensions, answer::NUMBER)?;
    let template = v1::EmbedRequest {
        inputs: String::new(),
        truncate,
        normalize: Some(request.normalize),
        truncation_direction: request.truncation_direction.into(),
        prompt_name: request.prompt_name,
        dimensions: request.dimensions,
    };
    let (inputs, batch) = (texts.len(), call.settings().max_client_batch_size);
    let each = Each { template, field: |m| &mut m.inputs, items: texts };
    let answers: Vec<v1::EmbedResponse> = call.send_each(row(EMBED), each, inputs, batch).await?;
    if request.dimensions.is_none()
        && let Some(first) = answers.first()
    {
        call.learn_dimensions(first.embeddings.len());
    }
    let numbers: usize = answers.iter().map(|a| a.embeddings.len()).sum();
    call.settle(&charge, numbers as u64, answer::NUMBER)?;
    Ok((answers, charge))
}

/// An answer assembled under `charge`, which lasts until it is sent (`super::memory`).
fn charged(mut response: Response, charge: AnswerCharge) -> Response {
    response.extensions_mut().insert(charge);
    response
}

async fn embed_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    let request = parse_inputs(call, body)?;
    let (answers, charge) = embed_calls(call, request).await?;
    let vectors: Vec<Vec<f32>> = answers.into_iter().map(|a| a.embeddings).collect();
    Ok(charged(super::json_off_workers(vectors).await, charge))
}

/// What `/embed_sparse` and `/embed_all` read before their calls: answers that grow with each
/// input's tokens, bounded by the most tokens the texts can hold (`HttpCall::most_tokens`).
struct PerToken {
    texts: Vec<String>,
    truncate: bool,
    truncation_direction: i32,
    prompt_name: Option<String>,
    tokens: u64,
}

async fn per_token(call: &mut HttpCall<'_>, body: &[u8]) -> Result<PerToken, HttpError> {
    let request: EmbedRequest = parse_inputs(call, body)?;
    let truncate = request.truncate.unwrap_or(call.settings().auto_truncate);
    let texts = texts(request.inputs)?;
    call.within_cap(texts.len())?;
    let tokens = call.most_tokens(&texts, truncate, request.prompt_name.is_some()).await?;
    let truncation_direction = request.truncation_direction.into();
    Ok(PerToken { texts, truncate, truncation_direction, prompt_name: request.prompt_name, tokens })
}

async fn embed_sparse_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    let PerToken { texts, truncate, truncation_direction, prompt_name, tokens } = per_token(call, body).await?;
    let charge = call.answer_charge(tokens.saturating_mul(answer::SPARSE_VALUES_PER_TOKEN), answer::SPARSE_VALUE)?;
    let template = v1::EmbedSparseRequest { inputs: String::new(), truncate, truncation_direction, prompt_name };
    let (inputs, batch) = (texts.len(), call.settings().max_client_batch_size);
    let each = Each { template, field: |m| &mut m.inputs, items: texts };
    let answers: Vec<v1::EmbedSparseResponse> = call.send_each(row(EMBED_SPARSE), each, inputs, batch).await?;
    let values: usize = answers.iter().map(|a| a.sparse_embeddings.len()).sum();
    call.settle(&charge, values as u64, answer::SPARSE_VALUE)?;
    let sparse: Vec<Vec<SparseValue>> = answers
        .into_iter()
        .map(|a| a.sparse_embeddings.into_iter().map(|v| SparseValue { index: v.index, value: v.value }).collect())
        .collect();
    Ok(charged(super::json_off_workers(sparse).await, charge))
}

async fn embed_all_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    let PerToken { texts, truncate, truncation_direction, prompt_name, tokens } = per_token(call, body).await?;
    let charge = call.answer_charge(tokens.saturating_mul(call.dimensions()), answer::NUMBER)?;
    let template = v1::EmbedAllRequest { inputs: String::new(), truncate, truncation_direction, prompt_name };
    let (inputs, batch) = (texts.len(), call.settings().max_client_batch_size);
    let each = Each { template, field: |m| &mut m.inputs, items: texts };
    let answers: Vec<v1::EmbedAllResponse> = call.send_each(row(EMBED_ALL), each, inputs, batch).await?;
    if let Some(token) = answers.iter().find_map(|a| a.token_embeddings.first()) {
        call.learn_dimensions(token.embeddings.len());
    }
    let numbers: usize = answers.iter().flat_map(|a| &a.token_embeddings).map(|t| t.embeddings.len()).sum();
    call.settle(&charge, numbers as u64, answer::NUMBER)?;
    let tokens: Vec<Vec<Vec<f32>>> =
        answers.into_iter().map(|a| a.token_embeddings.into_iter().map(|t| t.embeddings).collect()).collect();
    Ok(charged(super::json_off_workers(tokens).await, charge))
}

async fn predict_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    let request: PredictRequest = parse_inputs(call, body)?;
    let (sequences, single) = match request.inputs {
        PredictInputs::Single(sequence) => (vec![sequence], true),
        PredictInputs::Batch(sequences) => (sequences, false),
    };
    let (mut singles, mut pairs) = (Vec::new(), Vec::new());
    for sequence in sequences {
        match sequence {
            Sequence::Single(text) => singles.push(text),
            Sequence::Pair(a, b) => pairs.push(vec![a, b]),
        }
    }
    if singles.is_empty() == pairs.is_empty() {
        // Both empty: nothing to classify. Both non-empty: two RPCs for one batch, not supported.
        return Err(if singles.is_empty() {
            HttpError::Empty("inputs")
        } else {
            HttpError::Invalid("a batch must be all single texts or all pairs".into())
        });
    }
    if singles.iter().chain(pairs.iter().flatten()).any(String::is_empty) {
        return Err(HttpError::Empty("inputs"));
    }
    let (truncate, raw_scores) = (request.truncate.unwrap_or(call.settings().auto_truncate), request.raw_scores);
    let truncation_direction = request.truncation_direction.into();
    let batch = call.settings().max_client_batch_size;
    let answers: Vec<v1::PredictResponse> = if pairs.is_empty() {
        let template = v1::PredictRequest { inputs: String::new(), truncate, raw_scores, truncation_direction };
        let inputs = singles.len();
        let each = Each { template, field: |m| &mut m.inputs, items: singles };
        call.send_each(row(PREDICT), each, inputs, batch).await?
    } else {
        let template = v1::PredictPairRequest { inputs: Vec::new(), truncate, raw_scores, truncation_direction };
        let inputs = pairs.len();
        let each = Each { template, field: |m| &mut m.inputs, items: pairs };
        call.send_each(row(PREDICT_PAIR), each, inputs, batch).await?
    };
    let mut predictions: Vec<Vec<Prediction>> =
        answers.into_iter().map(|a| a.predictions.into_iter().map(Prediction::from).collect()).collect();
    if single { Ok(super::json(&predictions.pop().unwrap_or_default())) } else { Ok(super::json(&predictions)) }
}

async fn rerank_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    let request: RerankRequest = parse_inputs(call, body)?;
    if request.texts.is_empty() || request.texts.iter().any(String::is_empty) {
        return Err(HttpError::Empty("texts"));
    }
    // More texts than TEI takes in one call: one call per slice, each admitted for its texts,
    // the ranks put back on the caller's indices and sorted together.
    // The query goes into every slice: each slice is built only as it is sent (`super::upstream`).
    let inputs = request.texts.len();
    call.within_cap(inputs)?;
    let size = call.settings().max_client_batch_size.max(1);
    let truncate = request.truncate.unwrap_or(call.settings().auto_truncate);
    let mut texts = request.texts.into_iter();
    let slices: Vec<Vec<String>> =
        std::iter::from_fn(|| Some(texts.by_ref().take(size).collect::<Vec<_>>()).filter(|s| !s.is_empty())).collect();
    let template = v1::RerankRequest {
        query: request.query,
        texts: Vec::new(),
        truncate,
        raw_scores: request.raw_scores,
        return_text: request.return_text,
        truncation_direction: request.truncation_direction.into(),
    };
    let each = Each { template, field: |m| &mut m.texts, items: slices };
    let answers: Vec<v1::RerankResponse> =
        call.send_each(row(RERANK), each, inputs, 1).await.map_err(as_rerank_refusal)?;
    let mut ranks: Vec<Rank> = answers
        .into_iter()
        .enumerate()
        .flat_map(|(slice, answer)| {
            let offset = u32::try_from(slice * size).unwrap_or(u32::MAX);
            answer.ranks.into_iter().map(move |r| Rank { index: r.index + offset, text: r.text, score: r.score })
        })
        .collect();
    ranks.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(super::json(&ranks))
}

async fn similarity_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    let request = parse_inputs(call, body)?;
    similarity_of(call, request).await
}

/// TEI's `/similarity`: the source sentence and the others embedded as one `/embed` batch (split
/// and admitted like one), then each other sentence's cosine similarity to the source.
async fn similarity_of(call: &mut HttpCall<'_>, request: SimilarityRequest) -> Answer {
    let SimilarityInput { source_sentence, sentences } = request.inputs;
    if sentences.is_empty() {
        return Err(HttpError::Empty("inputs.sentences"));
    }
    let parameters = request.parameters.unwrap_or_default();
    let embed = EmbedRequest {
        inputs: Inputs::Many(std::iter::once(source_sentence).chain(sentences).collect()),
        // As TEI: cosine does not need unit vectors.
        normalize: false,
        truncate: parameters.truncate,
        truncation_direction: parameters.truncation_direction,
        prompt_name: parameters.prompt_name,
        dimensions: None,
    };
    let (answers, _charge) = embed_calls(call, embed).await?;
    let Some((source, others)) = answers.split_first() else {
        return Err(HttpError::Empty("inputs"));
    };
    let scores: Vec<f32> =
        others.iter().map(|other| cosine_similarity(&source.embeddings, &other.embeddings)).collect();
    Ok(super::json(&scores))
}

/// Cosine similarity as TEI computes it (one minus simsimd's cosine distance, accumulated in
/// f64): two zero vectors are alike (1), a zero vector and another are unrelated (0).
pub fn cosine_similarity(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut a2, mut b2) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        a2 += x * x;
        b2 += y * y;
    }
    if a2 == 0.0 && b2 == 0.0 {
        1.0
    } else if dot == 0.0 {
        0.0
    } else {
        (dot / (a2 * b2).sqrt()) as f32
    }
}

async fn tokenize_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    let request: TokenizeRequest = parse_inputs(call, body)?;
    let texts = texts(request.inputs)?;
    call.within_cap(texts.len())?;
    // TEI's /tokenize neither truncates nor refuses a long text.
    let tokens = call.most_tokens(&texts, false, request.prompt_name.is_some()).await?;
    let charge = call.answer_charge(tokens, answer::TOKEN)?;
    let template = v1::EncodeRequest {
        inputs: String::new(),
        add_special_tokens: request.add_special_tokens,
        prompt_name: request.prompt_name,
    };
    let (inputs, batch) = (texts.len(), call.settings().max_client_batch_size);
    let each = Each { template, field: |m| &mut m.inputs, items: texts };
    let answers: Vec<v1::EncodeResponse> = call.send_each(row(TOKENIZE), each, inputs, batch).await?;
    let count: usize = answers.iter().map(|a| a.tokens.len()).sum();
    call.settle(&charge, count as u64, answer::TOKEN)?;
    let tokens: Vec<Vec<SimpleToken>> =
        answers.into_iter().map(|a| a.tokens.into_iter().map(SimpleToken::from).collect()).collect();
    Ok(charged(super::json_off_workers(tokens).await, charge))
}

async fn decode_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    let request: DecodeRequest = parse_inputs(call, body)?;
    let ids = match request.ids {
        Ids::One(ids) => vec![ids],
        Ids::Many(ids) => ids,
    };
    if ids.is_empty() || ids.iter().any(Vec::is_empty) {
        return Err(HttpError::Empty("ids"));
    }
    let template = v1::DecodeRequest { ids: Vec::new(), skip_special_tokens: request.skip_special_tokens };
    let (inputs, batch) = (ids.len(), call.settings().max_client_batch_size);
    let each = Each { template, field: |m| &mut m.ids, items: ids };
    let answers: Vec<v1::DecodeResponse> = call.send_each(row(DECODE), each, inputs, batch).await?;
    Ok(super::json(&answers.into_iter().map(|a| a.text).collect::<Vec<_>>()))
}

/// `GET /info`: the pool's Info, counted as one Info call.
pub async fn info(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    let answer = match HttpCall::route(&shared, row(INFO), &headers) {
        Ok(call) => {
            let auto_truncate = call.settings().auto_truncate;
            let info = call.info().await.map(|info| super::json(&Info::new((*info).clone(), auto_truncate)));
            call.finish(info)
        }
        Err(error) => Err(error),
    };
    answer.unwrap_or_else(|error| error.into_response(Flavor::Tei))
}

/// 200 while this multiplexer would take calls for its own pool, as its readiness says.
pub async fn health(State(shared): State<Shared>) -> Response {
    match shared.readiness.ready() {
        Ok(()) => super::json_bytes(StatusCode::OK, Vec::new()),
        Err(_) => HttpError::Unhealthy.into_response(Flavor::Tei),
    }
}

async fn openai_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    let request: OpenAiRequest = parse_inputs(call, body)?;
    let format = request.encoding_format;
    let model = request.model.clone();
    let embed = EmbedRequest {
        inputs: request.input,
        normalize: true,
        // TEI's OpenAI route has no `truncate`: it always follows --auto-truncate.
        truncate: None,
        truncation_direction: TruncationDirection::Right,
        prompt_name: None,
        dimensions: request.dimensions,
    };
    let (answers, charge) = embed_calls(call, embed).await?;
    let tokens: u64 = answers.iter().filter_map(|a| a.metadata.as_ref()).map(|m| u64::from(m.compute_tokens)).sum();
    let data = answers
        .into_iter()
        .enumerate()
        .map(|(index, answer)| OpenAiEmbedding {
            object: "embedding",
            embedding: match format {
                EncodingFormat::Float => OpenAiVector::Float(answer.embeddings),
                EncodingFormat::Base64 => OpenAiVector::Base64(base64_f32(&answer.embeddings)),
            },
            index,
        })
        .collect();
    let model = match model {
        Some(model) if !model.is_empty() => model,
        _ => call.info().await?.model_id.clone(),
    };
    let usage = OpenAiUsage { prompt_tokens: tokens, total_tokens: tokens };
    let response = OpenAiResponse { object: "list", data, model, usage };
    Ok(charged(super::json_off_workers(response).await, charge))
}

/// `POST /` and `/invocations`: the route the model's type calls for, as TEI dispatches. For an
/// embedding model TEI serves either `/embed` or, with `TASK=sentence-similarity`, `/similarity`
/// there; the sidecar serves both, told apart by the body (`inputs` with a `source_sentence` is
/// a similarity request, as Hugging Face's `InferenceClient.sentence_similarity` sends it).
async fn dispatch_route(call: &mut HttpCall<'_>, body: &[u8]) -> Answer {
    match call.info().await?.model_type() {
        v1::ModelType::Embedding => match parse_inputs::<SimilarityRequest>(call, body) {
            Ok(similarity) => similarity_of(call, similarity).await,
            Err(too_many @ HttpError::TooManyInputs { .. }) => Err(too_many),
            Err(_) => embed_route(call, body).await,
        },
        v1::ModelType::Classifier => predict_route(call, body).await,
        v1::ModelType::Reranker => rerank_route(call, body).await,
    }
}

#[cfg(test)]
mod tests {
    use super::cosine_similarity;

    #[test]
    fn a_rerank_of_a_model_of_another_type_is_refused_in_teis_http_words() {
        let refused = |message: &str| {
            let status = tonic::Status::failed_precondition(message.to_owned());
            super::as_rerank_refusal(super::HttpError::Call(crate::error::Error::Upstream { pool: "p".into(), status }))
        };
        let answer = refused("model is not a classifier model");
        let answer = answer.answer();
        assert_eq!((answer.status.as_u16(), &*answer.message), (424, "Backend error: model is not a re-ranker model"));
        let other = refused("Backend error: Inference failed");
        assert_eq!(other.answer().message, "Backend error: Inference failed");
    }

    #[test]
    fn cosine_similarity_is_scale_free_and_handles_zero_vectors() {
        assert!((cosine_similarity(&[1.0, 0.0], &[3.0, 0.0]) - 1.0).abs() < 1e-6);
        assert!(cosine_similarity(&[1.0, 0.0], &[0.0, 2.0]).abs() < 1e-6);
        assert!((cosine_similarity(&[1.0, 1.0], &[-1.0, -1.0]) + 1.0).abs() < 1e-6);
        let half = cosine_similarity(&[1.0, 0.0], &[1.0, 3.0_f32.sqrt()]);
        assert!((half - 0.5).abs() < 1e-6, "{half}");
        assert_eq!(cosine_similarity(&[0.0, 0.0], &[0.0, 0.0]), 1.0);
        assert_eq!(cosine_similarity(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
