//! The `tei.v1` services, each RPC handed to the [`Forwarder`] with the client call it makes
//! upstream. Inference RPCs wait for permits; Info and tokenization pass freely.

use std::sync::Arc;

use teifleet_proto::v1::{
    self, embed_client::EmbedClient, embed_server::Embed, info_client::InfoClient, info_server::Info,
    predict_client::PredictClient, predict_server::Predict, rerank_client::RerankClient, rerank_server::Rerank,
    tokenize_client::TokenizeClient, tokenize_server::Tokenize,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::forward::{Admit, Forwarder, ResponseStream};

/// The multiplexer's implementation of every `tei.v1` service.
#[derive(Clone)]
pub struct Multiplexer {
    forwarder: Arc<Forwarder>,
    max_message_bytes: usize,
}

impl Multiplexer {
    pub fn new(forwarder: Arc<Forwarder>, max_message_bytes: usize) -> Self {
        Self { forwarder, max_message_bytes }
    }

    pub fn forwarder(&self) -> &Arc<Forwarder> {
        &self.forwarder
    }
}

/// Builds an upstream client that accepts answers as large as the messages clients may send.
macro_rules! client {
    ($self:ident, $client:ident, $channel:expr) => {
        $client::new($channel)
            .max_decoding_message_size($self.max_message_bytes)
            .max_encoding_message_size($self.max_message_bytes)
    };
}

type Result<T> = std::result::Result<Response<T>, Status>;

#[tonic::async_trait]
impl Info for Multiplexer {
    async fn info(&self, request: Request<v1::InfoRequest>) -> Result<v1::InfoResponse> {
        let this = self.clone();
        self.forwarder
            .unary(
                "Info",
                Admit::Free,
                request,
                |ch: Channel, r| async move { client!(this, InfoClient, ch).info(r).await },
            )
            .await
    }
}

#[tonic::async_trait]
impl Embed for Multiplexer {
    async fn embed(&self, request: Request<v1::EmbedRequest>) -> Result<v1::EmbedResponse> {
        let this = self.clone();
        self.forwarder
            .unary(
                "Embed",
                Admit::Permit,
                request,
                |ch, r| async move { client!(this, EmbedClient, ch).embed(r).await },
            )
            .await
    }

    type EmbedStreamStream = ResponseStream<v1::EmbedResponse>;

    async fn embed_stream(&self, request: Request<Streaming<v1::EmbedRequest>>) -> Result<Self::EmbedStreamStream> {
        let this = self.clone();
        self.forwarder
            .bidi("EmbedStream", Admit::Permit, request, |ch, r| async move {
                client!(this, EmbedClient, ch).embed_stream(r).await
            })
            .await
    }

    async fn embed_sparse(&self, request: Request<v1::EmbedSparseRequest>) -> Result<v1::EmbedSparseResponse> {
        let this = self.clone();
        self.forwarder
            .unary("EmbedSparse", Admit::Permit, request, |ch, r| async move {
                client!(this, EmbedClient, ch).embed_sparse(r).await
            })
            .await
    }

    type EmbedSparseStreamStream = ResponseStream<v1::EmbedSparseResponse>;

    async fn embed_sparse_stream(
        &self,
        request: Request<Streaming<v1::EmbedSparseRequest>>,
    ) -> Result<Self::EmbedSparseStreamStream> {
        let this = self.clone();
        self.forwarder
            .bidi("EmbedSparseStream", Admit::Permit, request, |ch, r| async move {
                client!(this, EmbedClient, ch).embed_sparse_stream(r).await
            })
            .await
    }

    async fn embed_all(&self, request: Request<v1::EmbedAllRequest>) -> Result<v1::EmbedAllResponse> {
        let this = self.clone();
        self.forwarder
            .unary("EmbedAll", Admit::Permit, request, |ch, r| async move {
                client!(this, EmbedClient, ch).embed_all(r).await
            })
            .await
    }

    type EmbedAllStreamStream = ResponseStream<v1::EmbedAllResponse>;

    async fn embed_all_stream(
        &self,
        request: Request<Streaming<v1::EmbedAllRequest>>,
    ) -> Result<Self::EmbedAllStreamStream> {
        let this = self.clone();
        self.forwarder
            .bidi("EmbedAllStream", Admit::Permit, request, |ch, r| async move {
                client!(this, EmbedClient, ch).embed_all_stream(r).await
            })
            .await
    }
}

#[tonic::async_trait]
impl Predict for Multiplexer {
    async fn predict(&self, request: Request<v1::PredictRequest>) -> Result<v1::PredictResponse> {
        let this = self.clone();
        self.forwarder
            .unary("Predict", Admit::Permit, request, |ch, r| async move {
                client!(this, PredictClient, ch).predict(r).await
            })
            .await
    }

    async fn predict_pair(&self, request: Request<v1::PredictPairRequest>) -> Result<v1::PredictResponse> {
        let this = self.clone();
        self.forwarder
            .unary("PredictPair", Admit::Permit, request, |ch, r| async move {
                client!(this, PredictClient, ch).predict_pair(r).await
            })
            .await
    }

    type PredictStreamStream = ResponseStream<v1::PredictResponse>;

    async fn predict_stream(
        &self,
        request: Request<Streaming<v1::PredictRequest>>,
    ) -> Result<Self::PredictStreamStream> {
        let this = self.clone();
        self.forwarder
            .bidi("PredictStream", Admit::Permit, request, |ch, r| async move {
                client!(this, PredictClient, ch).predict_stream(r).await
            })
            .await
    }

    type PredictPairStreamStream = ResponseStream<v1::PredictResponse>;

    async fn predict_pair_stream(
        &self,
        request: Request<Streaming<v1::PredictPairRequest>>,
    ) -> Result<Self::PredictPairStreamStream> {
        let this = self.clone();
        self.forwarder
            .bidi("PredictPairStream", Admit::Permit, request, |ch, r| async move {
                client!(this, PredictClient, ch).predict_pair_stream(r).await
            })
            .await
    }
}

#[tonic::async_trait]
impl Rerank for Multiplexer {
    async fn rerank(&self, request: Request<v1::RerankRequest>) -> Result<v1::RerankResponse> {
        let this = self.clone();
        self.forwarder
            .unary(
                "Rerank",
                Admit::Permit,
                request,
                |ch, r| async move { client!(this, RerankClient, ch).rerank(r).await },
            )
            .await
    }

    async fn rerank_stream(&self, request: Request<Streaming<v1::RerankStreamRequest>>) -> Result<v1::RerankResponse> {
        let this = self.clone();
        self.forwarder
            .client_stream("RerankStream", request, |ch, r| async move {
                client!(this, RerankClient, ch).rerank_stream(r).await
            })
            .await
    }
}

#[tonic::async_trait]
impl Tokenize for Multiplexer {
    async fn tokenize(&self, request: Request<v1::EncodeRequest>) -> Result<v1::EncodeResponse> {
        let this = self.clone();
        self.forwarder
            .unary("Tokenize", Admit::Free, request, |ch, r| async move {
                client!(this, TokenizeClient, ch).tokenize(r).await
            })
            .await
    }

    type TokenizeStreamStream = ResponseStream<v1::EncodeResponse>;

    async fn tokenize_stream(
        &self,
        request: Request<Streaming<v1::EncodeRequest>>,
    ) -> Result<Self::TokenizeStreamStream> {
        let this = self.clone();
        self.forwarder
            .bidi("TokenizeStream", Admit::Free, request, |ch, r| async move {
                client!(this, TokenizeClient, ch).tokenize_stream(r).await
            })
            .await
    }

    async fn decode(&self, request: Request<v1::DecodeRequest>) -> Result<v1::DecodeResponse> {
        let this = self.clone();
        self.forwarder
            .unary(
                "Decode",
                Admit::Free,
                request,
                |ch, r| async move { client!(this, TokenizeClient, ch).decode(r).await },
            )
            .await
    }

    type DecodeStreamStream = ResponseStream<v1::DecodeResponse>;

    async fn decode_stream(&self, request: Request<Streaming<v1::DecodeRequest>>) -> Result<Self::DecodeStreamStream> {
        let this = self.clone();
        self.forwarder
            .bidi("DecodeStream", Admit::Free, request, |ch, r| async move {
                client!(this, TokenizeClient, ch).decode_stream(r).await
            })
            .await
    }
}
