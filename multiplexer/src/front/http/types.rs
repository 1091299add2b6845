//! The JSON of TEI's HTTP API and OpenAI's embeddings route, with TEI's defaults.

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use teifleet_proto::v1;

use super::capped::{self, OneOrList};

fn yes() -> bool {
    true
}

/// A string or a list of strings (a list kept within the request's input cap: `capped`).
#[derive(Debug)]
pub enum Inputs {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for Inputs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match OneOrList::<String>::deserialize(deserializer)? {
            OneOrList::One(text) => Self::One(text),
            OneOrList::List(texts) => Self::Many(texts),
        })
    }
}

impl Inputs {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(text) => vec![text],
            Self::Many(texts) => texts,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub enum TruncationDirection {
    #[serde(alias = "left", alias = "LEFT")]
    Left,
    #[default]
    #[serde(alias = "right", alias = "RIGHT")]
    Right,
}

impl From<TruncationDirection> for i32 {
    fn from(direction: TruncationDirection) -> i32 {
        match direction {
            TruncationDirection::Left => v1::TruncationDirection::Left as i32,
            TruncationDirection::Right => v1::TruncationDirection::Right as i32,
        }
    }
}

/// `/embed`, `/embed_all` and `/embed_sparse` (the latter two ignore `normalize` and
/// `dimensions`, as TEI does).
#[derive(Debug, Deserialize)]
pub struct EmbedRequest {
    pub inputs: Inputs,
    #[serde(default = "yes")]
    pub normalize: bool,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub prompt_name: Option<String>,
    #[serde(default)]
    pub dimensions: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct SparseValue {
    pub index: u32,
    pub value: f32,
}

/// One text or a pair of texts (sentence-pair classification).
#[derive(Debug)]
pub enum Sequence {
    Single(String),
    Pair(String, String),
}

impl<'de> Deserialize<'de> for Sequence {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match OneOrList::<String>::deserialize(deserializer)? {
            OneOrList::One(text) => Ok(Self::Single(text)),
            OneOrList::List(pair) => match <[String; 2]>::try_from(pair) {
                Ok([a, b]) => Ok(Self::Pair(a, b)),
                Err(list) => Err(de::Error::invalid_length(list.len(), &"a pair of two strings")),
            },
        }
    }
}

/// `["a", "b"]` is one pair, as TEI reads it; a list of anything else is a batch.
#[derive(Debug)]
pub enum PredictInputs {
    Single(Sequence),
    Batch(Vec<Sequence>),
}

impl<'de> Deserialize<'de> for PredictInputs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Inputs;
        impl<'de> Visitor<'de> for Inputs {
            type Value = PredictInputs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, a pair of strings, or a list of them")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<PredictInputs, E> {
                Ok(PredictInputs::Single(Sequence::Single(text.to_owned())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<PredictInputs, A::Error> {
                let mut batch: Vec<Sequence> = capped::capped_seq(seq)?;
                Ok(match batch.as_mut_slice() {
                    [Sequence::Single(a), Sequence::Single(b)] => {
                        PredictInputs::Single(Sequence::Pair(std::mem::take(a), std::mem::take(b)))
                    }
                    _ => PredictInputs::Batch(batch),
                })
            }
        }
        deserializer.deserialize_any(Inputs)
    }
}

#[derive(Debug, Deserialize)]
pub struct PredictRequest {
    pub inputs: PredictInputs,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub raw_scores: bool,
}

#[derive(Debug, Serialize)]
pub struct Prediction {
    pub score: f32,
    pub label: String,
}

impl From<v1::Prediction> for Prediction {
    fn from(p: v1::Prediction) -> Self {
        Self { score: p.score, label: p.label }
    }
}

#[derive(Debug, Deserialize)]
pub struct RerankRequest {
    pub query: String,
    #[serde(deserialize_with = "capped::vec")]
    pub texts: Vec<String>,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub raw_scores: bool,
    #[serde(default)]
    pub return_text: bool,
}

#[derive(Debug, Serialize)]
pub struct Rank {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub score: f32,
}

/// `/similarity`: one sentence against others, as TEI's sentence-similarity task takes them.
#[derive(Debug, Deserialize)]
pub struct SimilarityRequest {
    pub inputs: SimilarityInput,
    #[serde(default)]
    pub parameters: Option<SimilarityParameters>,
}

#[derive(Debug, Deserialize)]
pub struct SimilarityInput {
    pub source_sentence: String,
    #[serde(deserialize_with = "capped::vec")]
    pub sentences: Vec<String>,
}

/// TEI's defaults: not truncated, from the right, no prompt.
#[derive(Debug, Default, Deserialize)]
pub struct SimilarityParameters {
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub prompt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub inputs: Inputs,
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub prompt_name: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SimpleToken {
    pub id: u32,
    pub text: String,
    pub special: bool,
    pub start: Option<u32>,
    pub stop: Option<u32>,
}

impl From<v1::SimpleToken> for SimpleToken {
    fn from(t: v1::SimpleToken) -> Self {
        Self { id: t.id, text: t.text, special: t.special, start: t.start, stop: t.stop }
    }
}

/// `ids` as one sequence or a batch of them. A batch is kept within the request's input cap; one
/// sequence's ids are not inputs (4 bytes each, about what their JSON takes) and are not capped.
#[derive(Debug)]
pub enum Ids {
    One(Vec<u32>),
    Many(Vec<Vec<u32>>),
}

impl<'de> Deserialize<'de> for Ids {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IdsVisitor;
        impl<'de> Visitor<'de> for IdsVisitor {
            type Value = Ids;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of token ids, or a list of such lists")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ids, A::Error> {
                match seq.next_element::<OneOrList<u32>>()? {
                    None => Ok(Ids::One(Vec::new())),
                    Some(OneOrList::One(first)) => {
                        let mut ids = vec![first];
                        while let Some(id) = seq.next_element::<u32>()? {
                            ids.push(id);
                        }
                        Ok(Ids::One(ids))
                    }
                    Some(OneOrList::List(first)) => {
                        let rest: Vec<Vec<u32>> = capped::capped_seq(seq)?;
                        Ok(Ids::Many(std::iter::once(first).chain(rest).collect()))
                    }
                }
            }
        }
        deserializer.deserialize_seq(IdsVisitor)
    }
}

#[derive(Debug, Deserialize)]
pub struct DecodeRequest {
    pub ids: Ids,
    #[serde(default = "yes")]
    pub skip_special_tokens: bool,
}

/// `GET /info`, from `tei.v1.Info` and the pool's `auto_truncate`. What neither carries (the
/// pooling, labels) is left out or empty.
#[derive(Debug, Serialize)]
pub struct Info {
    pub model_id: String,
    pub model_sha: Option<String>,
    pub model_dtype: String,
    pub model_type: serde_json::Value,
    pub max_concurrent_requests: u32,
    pub max_input_length: u32,
    pub max_batch_tokens: u32,
    pub max_batch_requests: Option<u32>,
    pub max_client_batch_size: u32,
    pub auto_truncate: bool,
    pub tokenization_workers: u32,
    pub version: String,
    pub sha: Option<String>,
    pub docker_label: Option<String>,
}

impl Info {
    pub fn new(info: v1::InfoResponse, auto_truncate: bool) -> Self {
        let model_type = match info.model_type() {
            v1::ModelType::Embedding => serde_json::json!({ "embedding": {} }),
            v1::ModelType::Classifier => serde_json::json!({ "classifier": { "id2label": {}, "label2id": {} } }),
            v1::ModelType::Reranker => serde_json::json!({ "reranker": { "id2label": {}, "label2id": {} } }),
        };
        Self {
            model_id: info.model_id,
            model_sha: info.model_sha,
            model_dtype: info.model_dtype,
            model_type,
            max_concurrent_requests: info.max_concurrent_requests,
            max_input_length: info.max_input_length,
            max_batch_tokens: info.max_batch_tokens,
            max_batch_requests: info.max_batch_requests,
            max_client_batch_size: info.max_client_batch_size,
            auto_truncate,
            tokenization_workers: info.tokenization_workers,
            version: info.version,
            sha: info.sha,
            docker_label: info.docker_label,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

/// OpenAI's `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
pub struct OpenAiRequest {
    pub input: Inputs,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    #[serde(default)]
    pub dimensions: Option<u32>,
    #[serde(default)]
    #[allow(dead_code)]
    pub user: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum OpenAiVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize)]
pub struct OpenAiEmbedding {
    pub object: &'static str,
    pub embedding: OpenAiVector,
    pub index: usize,
}

#[derive(Debug, Serialize)]
pub struct OpenAiUsage {
    pub prompt_tokens: u64,
    pub total_tokens: u64,
}

#[derive(Debug, Serialize)]
pub struct OpenAiResponse {
    pub object: &'static str,
    pub data: Vec<OpenAiEmbedding>,
    pub model: String,
    pub usage: OpenAiUsage,
}

/// OpenAI's base64 encoding: the little-endian `f32` bytes, standard alphabet, padded.
pub fn base64_f32(vector: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [group[0], *group.get(1).unwrap_or(&0), *group.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            out.push(if i <= group.len() { char::from(ALPHABET[(n >> shift) as usize & 63]) } else { '=' });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_encoding() {
        // 1.0f32 = 00 00 80 3f; 2.0f32 = 00 00 00 40
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(base64_f32(&[]), "");
    }

    #[test]
    fn a_list_of_two_texts_is_one_pair() {
        let single: PredictInputs = serde_json::from_str(r#"["a", "b"]"#).unwrap();
        assert!(matches!(single, PredictInputs::Single(Sequence::Pair(..))));
        let batch: PredictInputs = serde_json::from_str(r#"["a", "b", "c"]"#).unwrap();
        assert!(matches!(batch, PredictInputs::Batch(ref b) if b.len() == 3));
        let pairs: PredictInputs = serde_json::from_str(r#"[["a", "b"]]"#).unwrap();
        assert!(matches!(pairs, PredictInputs::Batch(ref b) if matches!(b[0], Sequence::Pair(..))));
    }
}
