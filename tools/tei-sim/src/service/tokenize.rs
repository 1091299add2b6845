//! The Tokenize service, answered straight from the fake tokenizer (no slot, no device), as TEI
//! answers it from its tokenizer workers.

use teifleet_proto::v1::tokenize_server::Tokenize;
use teifleet_proto::v1::{DecodeRequest, DecodeResponse, EncodeRequest, EncodeResponse, SimpleToken};
use tonic::{Request, Response, Status, Streaming};

use super::Sim;
use super::stream::ResponseStream;
use crate::tokenizer::{self, CLS_ID, SEP_ID};

fn special(id: u32) -> SimpleToken {
    let text = tokenizer::special_token_text(id).unwrap_or_default().to_owned();
    // TEI gives special tokens no offsets: they do not come from the input.
    SimpleToken { id, text, special: true, start: None, stop: None }
}

fn encode(request: EncodeRequest) -> Result<EncodeResponse, Status> {
    let words = tokenizer::words(&request.inputs);
    let mut tokens = Vec::with_capacity(words.len() + 2);
    if request.add_special_tokens {
        tokens.push(special(CLS_ID));
    }
    for word in words {
        tokens.push(SimpleToken {
            id: word.id,
            text: request.inputs[word.start..word.stop].to_owned(),
            special: false,
            start: u32::try_from(word.start).ok(),
            stop: u32::try_from(word.stop).ok(),
        });
    }
    if request.add_special_tokens {
        tokens.push(special(SEP_ID));
    }
    Ok(EncodeResponse { tokens })
}

fn decode(request: DecodeRequest) -> Result<DecodeResponse, Status> {
    Ok(DecodeResponse { text: tokenizer::decode(&request.ids, request.skip_special_tokens) })
}

#[tonic::async_trait]
impl Tokenize for Sim {
    async fn tokenize(&self, request: Request<EncodeRequest>) -> Result<Response<EncodeResponse>, Status> {
        self.direct(|| encode(request.into_inner()))
    }

    type TokenizeStreamStream = ResponseStream<EncodeResponse>;

    async fn tokenize_stream(
        &self,
        request: Request<Streaming<EncodeRequest>>,
    ) -> Result<Response<Self::TokenizeStreamStream>, Status> {
        Ok(Response::new(self.direct_stream(request.into_inner(), encode)))
    }

    async fn decode(&self, request: Request<DecodeRequest>) -> Result<Response<DecodeResponse>, Status> {
        self.direct(|| decode(request.into_inner()))
    }

    type DecodeStreamStream = ResponseStream<DecodeResponse>;

    async fn decode_stream(
        &self,
        request: Request<Streaming<DecodeRequest>>,
    ) -> Result<Response<Self::DecodeStreamStream>, Status> {
        Ok(Response::new(self.direct_stream(request.into_inner(), decode)))
    }
}
