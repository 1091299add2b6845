//! The Embed service: dense, sparse and per-token embeddings.

use std::collections::BTreeMap;

use teifleet_proto::v1::embed_server::Embed;
use teifleet_proto::v1::{
    EmbedAllRequest, EmbedAllResponse, EmbedRequest, EmbedResponse, EmbedSparseRequest, EmbedSparseResponse,
    SparseValue, TokenEmbedding,
};
use tonic::{Request, Response, Status, Streaming};

use super::stream::ResponseStream;
use super::{Admitted, Sim};
use crate::embedding::{embedding_for, normalize, score};

async fn embed(admitted: Admitted, request: EmbedRequest) -> Result<EmbedResponse, Status> {
    let model_dimensions = admitted.dimensions();
    let dimensions = match request.dimensions {
        None => model_dimensions,
        Some(d) if d == 0 || d as usize > model_dimensions => {
            return Err(Status::invalid_argument(format!(
                "`dimensions` must be between 1 and the model's {model_dimensions}. Given: {d}"
            )));
        }
        Some(d) => d as usize,
    };
    let direction = request.truncation_direction();
    let inference = admitted.infer(&[&request.inputs], request.truncate, direction).await?;
    let text = inference.sequences.first().map(|s| s.text.as_str()).unwrap_or_default();
    // The model's vectors are already unit length, so `normalize = false` returns them as they are.
    let mut embeddings = embedding_for(text, model_dimensions);
    if dimensions < model_dimensions {
        embeddings.truncate(dimensions);
        normalize(&mut embeddings);
    }
    Ok(EmbedResponse { embeddings, metadata: Some(inference.metadata) })
}

async fn embed_sparse(admitted: Admitted, request: EmbedSparseRequest) -> Result<EmbedSparseResponse, Status> {
    let direction = request.truncation_direction();
    let inference = admitted.infer(&[&request.inputs], request.truncate, direction).await?;
    // One weight per distinct word, as a SPLADE model activates the vocabulary entries it saw.
    let mut weights = BTreeMap::new();
    for sequence in &inference.sequences {
        for word in &sequence.words {
            let text = &sequence.text[word.start..word.stop];
            weights.entry(word.id).or_insert_with(|| 0.05 + score("sparse", text));
        }
    }
    let sparse_embeddings = weights.into_iter().map(|(index, value)| SparseValue { index, value }).collect();
    Ok(EmbedSparseResponse { sparse_embeddings, metadata: Some(inference.metadata) })
}

async fn embed_all(admitted: Admitted, request: EmbedAllRequest) -> Result<EmbedAllResponse, Status> {
    let dimensions = admitted.dimensions();
    let direction = request.truncation_direction();
    let inference = admitted.infer(&[&request.inputs], request.truncate, direction).await?;
    let mut token_embeddings = Vec::new();
    for sequence in &inference.sequences {
        let words = sequence.words.iter().map(|w| &sequence.text[w.start..w.stop]);
        let tokens = std::iter::once("[CLS]").chain(words).chain(std::iter::once("[SEP]"));
        // The position is part of the seed so repeated words differ, as contextual embeddings do.
        for (position, token) in tokens.enumerate() {
            let embeddings = embedding_for(&format!("{position}\u{1f}{token}"), dimensions);
            token_embeddings.push(TokenEmbedding { embeddings });
        }
    }
    Ok(EmbedAllResponse { token_embeddings, metadata: Some(inference.metadata) })
}

#[tonic::async_trait]
impl Embed for Sim {
    async fn embed(&self, request: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        self.unary(request.into_inner(), embed).await
    }

    type EmbedStreamStream = ResponseStream<EmbedResponse>;

    async fn embed_stream(
        &self,
        request: Request<Streaming<EmbedRequest>>,
    ) -> Result<Response<Self::EmbedStreamStream>, Status> {
        Ok(Response::new(self.bidi(request.into_inner(), embed)))
    }

    async fn embed_sparse(
        &self,
        request: Request<EmbedSparseRequest>,
    ) -> Result<Response<EmbedSparseResponse>, Status> {
        self.unary(request.into_inner(), embed_sparse).await
    }

    type EmbedSparseStreamStream = ResponseStream<EmbedSparseResponse>;

    async fn embed_sparse_stream(
        &self,
        request: Request<Streaming<EmbedSparseRequest>>,
    ) -> Result<Response<Self::EmbedSparseStreamStream>, Status> {
        Ok(Response::new(self.bidi(request.into_inner(), embed_sparse)))
    }

    async fn embed_all(&self, request: Request<EmbedAllRequest>) -> Result<Response<EmbedAllResponse>, Status> {
        self.unary(request.into_inner(), embed_all).await
    }

    type EmbedAllStreamStream = ResponseStream<EmbedAllResponse>;

    async fn embed_all_stream(
        &self,
        request: Request<Streaming<EmbedAllRequest>>,
    ) -> Result<Response<Self::EmbedAllStreamStream>, Status> {
        Ok(Response::new(self.bidi(request.into_inner(), embed_all)))
    }
}
